"""onnxruntime's quantized contrib operators (domain ``com.microsoft``) against onnxruntime itself,
which defines them: each operator on its own (every pair of 8-bit inputs for QLinearAdd and
QLinearMul, saturation at both ends, per-channel weight scales, uint8 and int8), and whole
networks quantized by ``onnxruntime.quantization`` (QOperator and QDQ formats, per tensor and per
channel, uint8 and int8 activations; ``quantize_dynamic``).

The results must be the same bytes, except where onnxruntime's float arithmetic differs from
polyc's by design, each case saying why and how far:

- float outputs (QGemm without y_zero_point, DynamicQuantizeMatMul, MatMulIntegerToFloat): the
  int32 products are exact, the scaling is one or two float32 roundings: 2 ulps relative;
- whole networks: every operator's output feeds the next, and QLinearConv's requantization is
  another converter's (in double, as onnx's reference): the same top-1 class, and outputs within
  a few quantization steps.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from polyc.errors import UnsupportedError  # noqa: E402
from tests.onnx.test_quantized import onnxruntime_multiplies_u8_by_s8_exactly  # noqa: E402

MS = "com.microsoft"
TYPES = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8}


def contrib_model(nodes, inputs: dict, outputs: dict, initializers: dict, opset: int = 17):
    """A model of ``nodes`` (of the default domain or com.microsoft); ``outputs``: name -> element type."""
    graph = helper.make_graph(
        nodes,
        "contrib",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in inputs.items()
        ],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def both(model, feeds: dict):
    """(onnxruntime's outputs, polyc's outputs) of ``model`` for ``feeds``."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    theirs = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    ours = ponnx.InferenceSession(model.SerializeToString()).run(None, feeds)
    return theirs, ours


def steps_apart(theirs, ours) -> np.ndarray:
    assert theirs.dtype == ours.dtype and theirs.shape == ours.shape
    return np.abs(theirs.astype(np.int32) - ours.astype(np.int32))


def all_values(dtype) -> np.ndarray:
    limits = np.iinfo(dtype)
    return np.arange(limits.min, limits.max + 1).astype(dtype)


def one(value, dtype=np.float32):
    return np.array(value, dtype)


# ---------------------------------------------------------------------------------- binary
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_binary_every_pair_of_inputs(op, dtype):
    """Every pair of 8-bit values, with scales that saturate both ends: bit-exact."""
    values = all_values(dtype)
    a = np.repeat(values, 256).reshape(256, 256)
    c = np.tile(values, 256).reshape(256, 256)
    rng = np.random.default_rng(3)
    limits = np.iinfo(dtype)
    nodes, initializers = [], {}
    for k, (a_scale, c_scale, y_scale) in enumerate(
        ((0.02, 0.03, 0.04), (0.5, 0.25, 0.01), rng.uniform(0.001, 0.1, 3))
    ):
        zeros = rng.integers(limits.min, limits.max + 1, 3).astype(dtype)
        names = [f"{n}{k}" for n in ("sa", "za", "sb", "zb", "sy", "zy")]
        initializers.update(zip(names, (one(a_scale), zeros[0], one(c_scale), zeros[1], one(y_scale), zeros[2])))
        nodes.append(helper.make_node(op, ["a", *names[:2], "b", *names[2:]], [f"y{k}"], domain=MS))
    outputs = {f"y{k}": TYPES[np.dtype(dtype)] for k in range(len(nodes))}
    model = contrib_model(nodes, {"a": a, "b": c}, outputs, initializers)
    theirs, ours = both(model, {"a": a, "b": c})
    for t, o in zip(theirs, ours):
        assert steps_apart(t, o).max() == 0
    assert {limits.min, limits.max} <= set(np.unique(np.stack(ours)).tolist())  # both ends saturated


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize(
    "shapes", [((2, 8, 5, 5), (1, 8, 1, 1)), ((1, 8, 1, 1), (2, 8, 5, 5)), ((3, 33), ()), ((), (3, 33))]
)
def test_binary_broadcast(op, shapes):
    """One input broadcast along the innermost axes (a per-channel bias, a scalar): MLAS takes
    it as the scalar of each span, in its own order of operations."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, shapes[0]).astype(np.uint8)
    c = rng.integers(0, 256, shapes[1]).astype(np.uint8)
    initializers = {
        "sa": one(0.037),
        "za": np.uint8(120),
        "sb": one(0.011),
        "zb": np.uint8(3),
        "sy": one(0.05),
        "zy": np.uint8(128),
    }
    node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain=MS)
    model = contrib_model([node], {"a": a, "b": c}, {"y": TensorProto.UINT8}, initializers)
    (theirs,), (ours,) = both(model, {"a": a, "b": c})
    assert steps_apart(theirs, ours).max() == 0


def test_binary_scales_at_run_time():
    """Scales and zero points that are graph inputs, not constants."""
    rng = np.random.default_rng(6)
    a, c = (rng.integers(-128, 128, (4, 40)).astype(np.int8) for _ in range(2))
    feeds = {"a": a, "b": c, "sa": one(0.02), "za": one(-3, np.int8), "sb": one(0.07), "zb": one(10, np.int8)}
    feeds.update(sy=one(0.09), zy=one(-1, np.int8))
    for op in ("QLinearAdd", "QLinearMul"):
        node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"], domain=MS)
        model = contrib_model([node], feeds, {"y": TensorProto.INT8}, {})
        (theirs,), (ours,) = both(model, feeds)
        assert steps_apart(theirs, ours).max() == 0


# ---------------------------------------------------------------------------------- requantizing
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_concat_requantizes_inputs_of_other_scales(dtype):
    rng = np.random.default_rng(7)
    limits = np.iinfo(dtype)
    x1 = np.broadcast_to(all_values(dtype).reshape(1, 1, 256), (1, 2, 256)).copy()
    x2 = rng.integers(limits.min, limits.max + 1, (1, 3, 256)).astype(dtype)
    z = dtype(limits.min + 100)
    initializers = {"sy": one(0.02), "zy": z, "s1": one(0.05), "z1": dtype(limits.min + 128), "s2": one(0.02), "z2": z}
    node = helper.make_node("QLinearConcat", ["sy", "zy", "x1", "s1", "z1", "x2", "s2", "z2"], ["y"], axis=1, domain=MS)
    model = contrib_model([node], {"x1": x1, "x2": x2}, {"y": TYPES[np.dtype(dtype)]}, initializers)
    (theirs,), (ours,) = both(model, {"x1": x1, "x2": x2})
    assert steps_apart(theirs, ours).max() == 0
    assert {limits.min, limits.max} <= set(np.unique(ours[:, :2]).tolist())


def test_where_requantizes_both_sides():
    rng = np.random.default_rng(8)
    x, y = (rng.integers(0, 256, (3, 64)).astype(np.uint8) for _ in range(2))
    condition = rng.random((3, 64)) < 0.5
    initializers = {
        "sx": one(0.1),
        "zx": np.uint8(30),
        "sy": one(0.02),
        "zy": np.uint8(200),
        "sz": one(0.05),
        "zz": np.uint8(128),
    }
    node = helper.make_node("QLinearWhere", ["c", "x", "sx", "zx", "y", "sy", "zy", "sz", "zz"], ["out"], domain=MS)
    feeds = {"c": condition, "x": x, "y": y}
    model = contrib_model([node], feeds, {"out": TensorProto.UINT8}, initializers)
    (theirs,), (ours,) = both(model, feeds)
    assert steps_apart(theirs, ours).max() == 0


# ---------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("op", ["QLinearLeakyRelu", "QLinearSigmoid"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_activation_tables(op, dtype):
    """Every 8-bit input, for several scales, bit-exact (the sigmoid by MLAS's polynomial)."""
    x = np.tile(all_values(dtype), 3).reshape(3, 256)
    limits = np.iinfo(dtype)
    middle = limits.min + 128
    nodes, initializers = [], {}
    attributes = {"alpha": 0.1} if op == "QLinearLeakyRelu" else {}
    cases = ((0.05, 10, 0.05, 0), (0.1, middle - 20, 1 / 256, limits.min), (0.003, middle, 0.002, 100))
    for k, (x_scale, x_zero, y_scale, y_zero) in enumerate(cases):
        names = [f"{n}{k}" for n in ("sx", "zx", "sy", "zy")]
        initializers.update(zip(names, (one(x_scale), dtype(x_zero), one(y_scale), dtype(y_zero))))
        nodes.append(helper.make_node(op, ["x", *names], [f"y{k}"], domain=MS, **attributes))
    outputs = {f"y{k}": TYPES[np.dtype(dtype)] for k in range(len(nodes))}
    theirs, ours = both(contrib_model(nodes, {"x": x}, outputs, initializers), {"x": x})
    for t, o in zip(theirs, ours):
        assert steps_apart(t, o).max() == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("opset, axis, shape", [(13, -1, (4, 37)), (13, 1, (2, 9, 5)), (12, 1, (2, 3, 7))])
def test_softmax(dtype, opset, axis, shape):
    """onnxruntime's exp table, float sum and floor(1 / y_scale) scaling: bit-exact, also where
    an output saturates (y_scale 1/256: a probability of 1 is 256 steps)."""
    rng = np.random.default_rng(9)
    limits = np.iinfo(dtype)
    x = rng.integers(limits.min, limits.max + 1, shape).astype(dtype)
    x[0, 0] = limits.max  # a row with one large value: its output is near 1
    x[0, 1:] = limits.min
    y_zero = limits.min
    initializers = {"sx": one(0.08), "zx": dtype(0), "sy": one(1 / 256), "zy": dtype(y_zero)}
    node = helper.make_node("QLinearSoftmax", ["x", "sx", "zx", "sy", "zy"], ["y"], axis=axis, opset=opset, domain=MS)
    model = contrib_model([node], {"x": x}, {"y": TYPES[np.dtype(dtype)]}, initializers)
    (theirs,), (ours,) = both(model, {"x": x})
    assert steps_apart(theirs, ours).max() == 0


# ---------------------------------------------------------------------------------- pools
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool(dtype, channels_last):
    rng = np.random.default_rng(10)
    limits = np.iinfo(dtype)
    shape = (2, 5, 7, 6) if channels_last else (2, 6, 5, 7)
    x = rng.integers(limits.min, limits.max + 1, shape).astype(dtype)
    x[0, 0] = limits.max  # saturates at the top
    x[1, 0] = limits.min
    initializers = {"sx": one(0.1), "zx": dtype(3), "sy": one(0.02), "zy": dtype(-5 if dtype == np.int8 else 120)}
    node = helper.make_node(
        "QLinearGlobalAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], channels_last=channels_last, domain=MS
    )
    model = contrib_model([node], {"x": x}, {"y": TYPES[np.dtype(dtype)]}, initializers)
    (theirs,), (ours,) = both(model, {"x": x})
    assert steps_apart(theirs, ours).max() == 0


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    "attributes",
    [
        {"kernel_shape": [3, 3]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0], "count_include_pad": 1},
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "channels_last": 1},
    ],
)
def test_average_pool(dtype, attributes):
    """Each window's dequantized values summed in float32 in onnxruntime's order: bit-exact."""
    rng = np.random.default_rng(11)
    limits = np.iinfo(dtype)
    shape = (2, 9, 9, 4) if attributes.get("channels_last") else (2, 4, 9, 9)
    x = rng.integers(limits.min, limits.max + 1, shape).astype(dtype)
    initializers = {"sx": one(0.03), "zx": dtype(1), "sy": one(0.025), "zy": dtype(limits.min + 128)}
    node = helper.make_node("QLinearAveragePool", ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attributes)
    model = contrib_model([node], {"x": x}, {"y": TYPES[np.dtype(dtype)]}, initializers)
    (theirs,), (ours,) = both(model, {"x": x})
    assert steps_apart(theirs, ours).max() == 0


# ---------------------------------------------------------------------------------- products
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("output", ["quantized", "float"])
def test_qgemm(dtype, per_channel, output):
    """Weights in 7 bits (as ``reduce_range`` makes them), which no onnxruntime kernel saturates
    (u8 x s8 pairs summed in 16 bits on processors without VNNI)."""
    rng = np.random.default_rng(12)
    limits = np.iinfo(dtype)
    a = rng.integers(limits.min, limits.max + 1, (5, 48)).astype(dtype)
    w = rng.integers(-64, 64, (10, 48)).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, 10).astype(np.float32) if per_channel else one(0.004)
    w_zero = np.zeros(10, np.int8) if per_channel else np.int8(0)
    initializers = {"w": w, "sa": one(0.05), "za": dtype(limits.min + 120), "sw": w_scale, "zw": w_zero}
    initializers["c"] = rng.integers(-20000, 20000, 10).astype(np.int32)
    inputs = ["a", "sa", "za", "w", "sw", "zw", "c"]
    if output == "quantized":
        initializers.update(sy=one(0.02), zy=dtype(limits.min + 128))
        inputs += ["sy", "zy"]
    node = helper.make_node("QGemm", inputs, ["y"], transB=1, alpha=1.0, domain=MS)
    out_type = TYPES[np.dtype(dtype)] if output == "quantized" else TensorProto.FLOAT
    model = contrib_model([node], {"a": a}, {"y": out_type}, initializers)
    (theirs,), (ours,) = both(model, {"a": a})
    if output == "quantized":
        assert steps_apart(theirs, ours).max() == 0
        assert {limits.min, limits.max} <= set(np.unique(ours).tolist())
    else:
        np.testing.assert_allclose(ours, theirs, rtol=2 * np.finfo(np.float32).eps, atol=0)


@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer_to_float_and_dynamic_quantize_matmul(per_column):
    rng = np.random.default_rng(13)
    a8 = rng.integers(0, 256, (2, 3, 32)).astype(np.uint8)
    a = rng.standard_normal((2, 3, 32)).astype(np.float32)
    w = rng.integers(-64, 64, (32, 16)).astype(np.int8)
    bias = rng.standard_normal(16).astype(np.float32)
    initializers = {"w": w, "sa": one(0.02), "za": np.uint8(128), "bias": bias}
    if per_column:
        initializers.update(
            sw=rng.uniform(0.001, 0.01, 16).astype(np.float32), zw=rng.integers(-3, 3, 16).astype(np.int8)
        )
    else:
        initializers.update(sw=one(0.003), zw=np.int8(0))
    nodes = [
        helper.make_node("MatMulIntegerToFloat", ["a8", "w", "sa", "sw", "za", "zw", "bias"], ["y1"], domain=MS),
        helper.make_node("DynamicQuantizeMatMul", ["a", "w", "sw", "zw", "bias"], ["y2"], domain=MS),
    ]
    feeds = {"a8": a8, "a": a}
    model = contrib_model(nodes, feeds, {"y1": TensorProto.FLOAT, "y2": TensorProto.FLOAT}, initializers)
    theirs, ours = both(model, feeds)
    for t, o in zip(theirs, ours):
        np.testing.assert_allclose(o, t, rtol=1e-6, atol=1e-6 * np.abs(t).max())


def test_unsupported_contrib_operator_is_named():
    x = np.zeros((1, 4), np.float32)
    node = helper.make_node("QAttention", ["x"], ["y"], domain=MS)
    model = contrib_model([node], {"x": x}, {"y": TensorProto.FLOAT}, {})
    with pytest.raises(UnsupportedError, match=r"com\.microsoft\.QAttention"):
        ponnx.InferenceSession(model.SerializeToString()).run(None, {"x": x})


# ---------------------------------------------------------------------------------- networks
def small_network():
    """A small float network of the operators onnxruntime's quantizer rewrites: Conv, Relu, Add,
    MaxPool, Sigmoid, Mul, LeakyRelu, Concat, AveragePool, GlobalAveragePool, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(0)

    def weights(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    initializers = {"w1": weights(8, 3, 3, 3), "b1": weights(8), "w2": weights(8, 8, 3, 3), "b2": weights(8)}
    initializers.update(w3=weights(8, 8, 1, 1), b3=weights(8), wg=weights(10, 32), bg=weights(10))
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Add", ["r1", "r2"], ["a1"]),
        helper.make_node("MaxPool", ["a1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w3", "b3"], ["c3"]),
        helper.make_node("Sigmoid", ["c3"], ["s3"]),
        helper.make_node("Mul", ["c3", "s3"], ["m3"]),
        helper.make_node("LeakyRelu", ["p1"], ["l1"], alpha=0.1),
        helper.make_node("Concat", ["m3", "l1"], ["cat"], axis=1),
        helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["ap"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Concat", ["f", "f"], ["f2"], axis=1),
        helper.make_node("Gemm", ["f2", "wg", "bg"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


class RandomImages(quantization.CalibrationDataReader):
    """A few random inputs for onnxruntime's calibration."""

    def __init__(self, name: str, shape, count: int = 4):
        rng = np.random.default_rng(1)
        self.feeds = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.feeds, None)


def output_step(model, output: str) -> float:
    """The scale of the DequantizeLinear that gives the graph's output ``output``."""
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = next(n for n in model.graph.node if output in n.output)
    return float(constants[producer.input[1]])


@pytest.mark.parametrize("quant_format", ["QOperator", "QDQ", "QDQ-unfused"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_quantize_static_network(tmp_path, quant_format, per_channel, activation):
    """The network quantized by ``quantize_static``, compared with onnxruntime as it runs it.
    QOperator: onnxruntime's contrib operators and QLinearConv.  QDQ: the float operators between
    QuantizeLinear and DequantizeLinear, which both rewrite into those integer operators (the
    node units of polyc/frontends/onnx/qdq.py).  QDQ-unfused: neither rewrites (polyc's
    ``graph_fusion=False``, onnxruntime's ORT_DISABLE_ALL): the float operators run as the QDQ
    semantics read, and polyc's exp and sums in another order may move a value inside the network
    by one step, the output by a few: the same top-1 class and at most 4 steps of the output's
    scale.  The rewritten forms give onnxruntime's bits where its u8 x s8 sums are exact."""
    fused = quant_format != "QDQ-unfused"
    if fused and not onnxruntime_multiplies_u8_by_s8_exactly():
        pytest.skip("onnxruntime's u8 x s8 sums saturate on this processor (no VNNI): its results are not exact")
    float_path, quantized_path = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(small_network(), float_path)
    quantization.quantize_static(
        str(float_path),
        str(quantized_path),
        RandomImages("x", (2, 3, 16, 16)),
        quant_format=quantization.QuantFormat.QOperator
        if quant_format == "QOperator"
        else quantization.QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=getattr(quantization.QuantType, activation),
        weight_type=quantization.QuantType.QInt8,
    )
    model = onnx.load(quantized_path)
    domains = {node.domain for node in model.graph.node}
    assert (MS in domains) == (quant_format == "QOperator")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not fused:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    theirs_session = ort.InferenceSession(str(quantized_path), options, providers=["CPUExecutionProvider"])
    ours_session = ponnx.InferenceSession(str(quantized_path), graph_fusion=fused)
    step = output_step(model, "y")
    for seed in range(2):
        x = (np.random.default_rng(10 + seed).standard_normal((2, 3, 16, 16)) * (1 + seed)).astype(np.float32)
        (theirs,) = theirs_session.run(None, {"x": x})
        (ours,) = ours_session.run(None, {"x": x})
        if fused:
            np.testing.assert_array_equal(ours, theirs)
        else:
            assert np.array_equal(theirs.argmax(1), ours.argmax(1))
            assert np.abs(theirs - ours).max() <= 4 * step * (1 + 1e-6)


def small_attention():
    """Projections, a scaled-free attention product and an output projection: the MatMul, Add,
    Transpose and Softmax of a transformer layer."""
    rng = np.random.default_rng(2)
    initializers = {n: (rng.standard_normal((16, 16)) * 0.2).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    initializers.update(bq=(rng.standard_normal(16) * 0.2).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]),
        helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
        helper.make_node("MatMul", ["o", "wo"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 16])],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_quantize_dynamic_attention(tmp_path, weight_type):
    """``quantize_dynamic`` writes DynamicQuantizeLinear, MatMulInteger, Cast and Mul; onnxruntime's
    optimizer fuses them into DynamicQuantizeMatMul and MatMulIntegerToFloat (and a MatMul with
    its Transpose into FusedMatMul), the model it saves.  Both run, and agree with onnxruntime
    within float roundings of the scaling (the integer products are exact)."""
    float_path, quantized_path, optimized_path = (tmp_path / n for n in ("float.onnx", "q.onnx", "opt.onnx"))
    onnx.save(small_attention(), float_path)
    quantization.quantize_dynamic(
        str(float_path), str(quantized_path), weight_type=getattr(quantization.QuantType, weight_type)
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(optimized_path)
    x = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)
    (theirs,) = ort.InferenceSession(str(quantized_path), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    fused = {node.op_type for node in onnx.load(optimized_path).graph.node if node.domain == MS}
    assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"} <= fused
    for path in (quantized_path, optimized_path):
        (ours,) = ponnx.InferenceSession(str(path)).run(None, {"x": x})
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6 * np.abs(theirs).max())


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_channels_last_convolution_and_max_pool(dtype):
    """The NHWC QLinearConv and NhwcMaxPool of onnxruntime's layout optimizer.  polyc's
    QLinearConv scales in double, onnxruntime's in float32: the two factors differ by a few
    float32 ulps, which moves a rounding only for a value within ~1e-4 of a half (at most one
    step, on at most 0.1% of the elements)."""
    rng = np.random.default_rng(14)
    limits = np.iinfo(dtype)
    x = rng.integers(limits.min, limits.max + 1, (2, 9, 9, 4)).astype(dtype)
    w = rng.integers(-64, 64, (6, 4, 3, 3)).astype(np.int8)
    initializers = {
        "sx": one(0.02),
        "zx": dtype(limits.min + 128),
        "w": w,
        "sw": rng.uniform(0.001, 0.01, 6).astype(np.float32),
    }
    initializers.update(zw=np.zeros(6, np.int8), sy=one(0.05), zy=dtype(limits.min + 100))
    initializers["bias"] = rng.integers(-5000, 5000, 6).astype(np.int32)
    conv = helper.make_node(
        "QLinearConv",
        ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"],
        ["c"],
        domain=MS,
        channels_last=1,
        pads=[1, 1, 1, 1],
    )
    pool = helper.make_node("NhwcMaxPool", ["c"], ["y"], domain=MS, kernel_shape=[2, 2], strides=[2, 2])
    model = contrib_model([conv, pool], {"x": x}, {"y": TYPES[np.dtype(dtype)]}, initializers)
    (theirs,), (ours,) = both(model, {"x": x})
    assert ours.shape == (2, 4, 4, 6)
    apart = steps_apart(theirs, ours)
    assert apart.max() <= 1 and (apart > 0).mean() <= 0.001
