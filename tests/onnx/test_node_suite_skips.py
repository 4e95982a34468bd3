"""The pinned skip set of onnx's node cases (node_suite_skips.txt) fails the suite when it changes."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from polyc.frontends.onnx.ops import CONVERTERS  # noqa: E402
from tests.onnx import node_suite  # noqa: E402


def test_every_pinned_skip_is_a_case_of_the_installed_onnx():
    assert set(node_suite.expected_skips()) <= set(node_suite.cases())


def test_a_dropped_converter_fails_its_cases_instead_of_skipping_them(monkeypatch):
    node_suite.run_case("test_matmul_2d")  # runs and passes
    monkeypatch.delitem(CONVERTERS, "MatMul")
    with pytest.raises(pytest.fail.Exception, match="test_matmul_2d skips \\(operator MatMul.*does not list it"):
        node_suite.run_case("test_matmul_2d")


def test_a_pinned_skip_for_another_reason_fails():
    name = next(name for name, key in node_suite.expected_skips().items() if key.startswith("dtype"))
    with pytest.raises(pytest.skip.Exception):
        node_suite.run_case(name)
    pinned = dict(node_suite.expected_skips())
    pinned[name] = "operator Nothing"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_suite, "expected_skips", lambda: pinned)
        with pytest.raises(pytest.fail.Exception, match="expects 'operator Nothing'"):
            node_suite.run_case(name)


def test_a_pinned_case_that_passes_now_fails(monkeypatch):
    monkeypatch.setattr(node_suite, "expected_skips", lambda: {"test_matmul_2d": "dtype string"})
    with pytest.raises(pytest.fail.Exception, match="passes now"):
        node_suite.run_case("test_matmul_2d")
