"""The per-operator tally of onnx's node tests (tests/onnx/node_table.py)."""

import pytest

pytest.importorskip("onnx")

from tests.onnx import node_suite, node_table  # noqa: E402


def test_cases_are_counted_under_the_operator_they_test():
    assert node_suite.operator_under_test("test_conv_with_strides_padding") == "Conv"
    # an expanded case runs the operator's function body (Relu's: Max and CastLike), yet tests Relu
    assert node_suite.operator_under_test("test_relu_expanded_ver18") == "Relu"
    assert node_suite.operator_under_test("test_softmax_axis_0_expanded") == "Softmax"
    results = [
        ("test_relu", "passed", ""),
        ("test_relu_expanded_ver18", "skipped", "why"),
        ("test_conv_with_strides_padding", "failed", "AssertionError: x"),
        ("test_abs", "passed", ""),
    ]
    table = node_table.tally(results, ("Relu", "Conv"))
    assert (table["Relu"]["passed"], table["Relu"]["skipped"], dict(table["Relu"]["reasons"])) == (1, 1, {"why": 1})
    assert table["Conv"]["failed"] == 1 and table["Conv"]["failures"] == [
        "test_conv_with_strides_padding: AssertionError: x"
    ]
    assert set(table) == {"Relu", "Conv"}
    assert set(node_table.ISSUE_OPS) <= {node_suite.operator_under_test(n) for n in node_suite.cases()}
