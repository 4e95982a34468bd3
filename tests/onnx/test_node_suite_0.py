"""Half 1 of onnx's backend node tests on polyc.onnx (see node_suite.py); two files, so
that pytest-xdist runs them on two workers."""

import pytest

from tests.onnx.node_suite import names, run_case


@pytest.mark.parametrize("name", names(0, 2))
def test_node(name):
    run_case(name)
