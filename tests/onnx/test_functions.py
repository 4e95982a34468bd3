"""Operators ONNX defines as functions (polyc/frontends/onnx/functions.py): expanded into their
bodies where polyc has no converter, against onnxruntime and numpy; and the operators
converted alongside (ReduceLogSum, ReduceLogSumExp, DepthToSpace, SpaceToDepth)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def model_of(nodes, inputs: dict, outputs, initializers=(), opset: int = 23, ranks=None):
    """``nodes`` as a model with inputs of the arrays' types and shapes and float ``outputs``: their
    shapes as onnx infers them, or of the rank in ``ranks`` (name -> rank) with symbolic sizes."""
    graph = helper.make_graph(
        nodes, "functions",
        [helper.make_tensor_value_info(name, _TYPES[a.dtype], list(a.shape)) for name, a in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    for output in model.graph.output:
        if not output.type.tensor_type.HasField("shape"):
            for d in range((ranks or {})[output.name]):
                output.type.tensor_type.shape.dim.add().dim_param = f"{output.name}_{d}"
    return model


def onnxruntime_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_rms_normalization_is_expanded_and_fused():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    scale = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "scale")
    model = model_of([helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=-1,
                                       epsilon=1e-5)], {"x": x}, ["y"], [scale])
    session = ponnx.InferenceSession(model)
    (ours,) = session.run(None, {"x": x})
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * numpy_helper.to_array(scale)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, onnxruntime_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # The body's nodes carry the node's name, and graph fusion puts them back together.
    body = [name for group in session.groups for name in group]
    assert body and all(name.startswith("rms/") for name in body)
    assert len(session.groups) <= 2, session.groups


@pytest.mark.parametrize("causal", [0, 1])
def test_grouped_query_attention_against_onnxruntime(causal):
    # 4 query heads share 2 key/value heads; 3-D inputs (batch, sequence, heads x head size).
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 6, 4 * 8)).astype(np.float32)
    k = rng.standard_normal((2, 6, 2 * 8)).astype(np.float32)
    v = rng.standard_normal((2, 6, 2 * 8)).astype(np.float32)
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attention", q_num_heads=4,
                            kv_num_heads=2, is_causal=causal)
    model = model_of([node], {"q": q, "k": k, "v": v}, ["y"])
    feeds = {"q": q, "k": k, "v": v}
    (ours,) = ponnx.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(ours, onnxruntime_run(model, feeds)[0], rtol=1e-3, atol=1e-6)


def test_a_converter_wins_over_the_function():
    # LayerNormalization has a function body in its schema, but polyc's converter handles it.
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    model = model_of([helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="ln")], {"x": x},
                     ["y"], [scale], opset=17)
    session = ponnx.InferenceSession(model)
    assert session.groups == [["ln"]]


def test_a_function_whose_body_polyc_cannot_convert_is_named_with_the_reason():
    theta = np.zeros((1, 2, 3), np.float32)
    size = numpy_helper.from_array(np.array([1, 1, 4, 4], np.int64), "size")
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="grid"),
             helper.make_node("NonZero", ["grid"], ["where"], name="nz")]
    model = model_of(nodes, {"theta": theta}, ["where"], [size], opset=20, ranks={"where": 2})
    with pytest.raises(polyc.UnsupportedError) as caught:
        ponnx.InferenceSession(model)
    message = str(caught.value)
    assert "2 node(s)" in message
    assert "AffineGrid (opset 20) at node 'grid' (its ONNX function uses If)" in message
    assert "[unsupported: AffineGrid, NonZero]" in message


def test_an_integer_input_computed_into_pads_specialises_the_plan():
    # CenterCropPad's body turns the target shape into Slice starts and Pad pads by arithmetic:
    # the session plans once per distinct target shape, and the user's feeds stay as given.
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    model = model_of([helper.make_node("CenterCropPad", ["x", "shape"], ["y"], axes=[1, 2])],
                     {"x": x, "shape": np.array([3, 8], np.int64)}, ["y"], opset=18, ranks={"y": 3})
    session = ponnx.InferenceSession(model)
    for shape in ([3, 8], [5, 4], [7, 6]):
        feeds = {"x": x, "shape": np.array(shape, np.int64)}
        before = {k: v.copy() for k, v in feeds.items()}
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, onnxruntime_run(model, feeds)[0])
        assert all(np.array_equal(feeds[k], before[k]) for k in feeds)
    assert len(session._plans) == 3


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_log_sum_exp_does_not_overflow(keepdims):
    # exp(100) overflows float32; the converter subtracts the max first.  A slice of -inf
    # only gives -inf, as log(sum(exp)) does.
    x = np.random.default_rng(3).standard_normal((3, 4, 5)).astype(np.float32) * 3 + 100
    x[1, :, 2] = -np.inf
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=keepdims),
             helper.make_node("ReduceLogSum", ["e", "axes"], ["ls"], keepdims=keepdims),
             helper.make_node("Exp", ["small"], ["e"]),
             helper.make_node("Sub", ["x", "hundred"], ["small"])]
    hundred = numpy_helper.from_array(np.array(100, np.float32), "hundred")
    model = model_of([nodes[0], nodes[3], nodes[2], nodes[1]], {"x": x}, ["lse", "ls"], [axes, hundred], opset=18)
    lse, ls = ponnx.InferenceSession(model).run(None, {"x": x})
    with np.errstate(divide="ignore"):
        expected = np.log(np.sum(np.exp(x.astype(np.float64) - 100), axis=1, keepdims=bool(keepdims))) + 100
    np.testing.assert_allclose(lse, expected, rtol=1e-6)
    np.testing.assert_allclose(ls, expected - 100, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back_against_onnxruntime(mode):
    x = np.random.default_rng(4).standard_normal((2, 12, 3, 4)).astype(np.float32)
    nodes = [helper.make_node("DepthToSpace", ["x"], ["up"], blocksize=2, mode=mode),
             helper.make_node("SpaceToDepth", ["up"], ["down"], blocksize=2)]
    model = model_of(nodes, {"x": x}, ["up", "down"], opset=13)
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = onnxruntime_run(model, {"x": x})
    for got, expected in zip(ours, theirs):
        np.testing.assert_array_equal(got, expected)
    if mode == "DCR":
        np.testing.assert_array_equal(ours[1], x)  # SpaceToDepth (DCR before opset 28) inverts DCR
    # From opset 28 SpaceToDepth has modes too, each the inverse of DepthToSpace's.
    nodes[1] = helper.make_node("SpaceToDepth", ["up"], ["down"], blocksize=2, mode=mode)
    model = model_of(nodes, {"x": x}, ["up", "down"], opset=28)
    np.testing.assert_array_equal(ponnx.InferenceSession(model).run(None, {"x": x})[1], x)


def test_depth_to_space_names_a_bad_block_size():
    x = np.zeros((1, 6, 2, 2), np.float32)
    model = model_of([helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=2)], {"x": x}, ["y"],
                     opset=13)
    with pytest.raises(polyc.PolycError, match=r"node 'd2s' \(DepthToSpace\): 6 channels are not a multiple"):
        ponnx.InferenceSession(model).run(None, {"x": x})
