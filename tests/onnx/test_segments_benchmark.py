"""``benchmarks.onnx_segments`` cuts a model only where one computed tensor crosses the cut."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from benchmarks.onnx_segments import cut_points, segments  # noqa: E402


def _residual_chain():
    # x -> a = Relu(x) -> b = Clip(a, lo, hi) -> c = Add(a, b) [a and b both live: no cut after b]
    #   -> d = Relu(c) -> y = Mul(d, w); lo and hi come from Constant nodes, w is an initializer.
    weight = numpy_helper.from_array(np.ones(4, np.float32), "w")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="n0"),
        helper.make_node("Constant", [], ["lo"], value=numpy_helper.from_array(np.float32(0), "lo_v"), name="n1"),
        helper.make_node("Constant", [], ["hi"], value=numpy_helper.from_array(np.float32(6), "hi_v"), name="n2"),
        helper.make_node("Clip", ["a", "lo", "hi"], ["b"], name="n3"),
        helper.make_node("Add", ["a", "b"], ["c"], name="n4"),
        helper.make_node("Relu", ["c"], ["d"], name="n5"),
        helper.make_node("Mul", ["d", "w"], ["y"], name="n6"),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cuts_fall_where_one_computed_tensor_crosses_and_constants_do_not_count():
    model = _residual_chain()
    # After n0 only a is live (the Constants' outputs are constants); after n3 both a and b.
    assert cut_points(model.graph) == [(0, "a"), (1, "a"), (2, "a"), (4, "c"), (5, "d")]
    parts = segments(model, 2)
    assert [(start, end, [n.name for n in nodes]) for start, end, nodes in parts] == [
        ("x", "a", ["n0", "n1"]),
        ("a", "c", ["n2", "n3", "n4"]),
        ("c", "y", ["n5", "n6"]),
    ]
    # Every node is in exactly one segment, in order.
    assert [n.name for _, _, nodes in parts for n in nodes] == [n.name for n in model.graph.node]
