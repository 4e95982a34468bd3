"""QDQ models: node units rewritten into integer operators (polyc/frontends/onnx/qdq.py), with
onnxruntime's results, as onnxruntime's graph optimiser rewrites them.

The models are small float networks built here and quantized by onnxruntime's own
``quantize_static`` (no torch).  onnxruntime computes them exactly where its u8 x s8 sums are
exact (VNNI, or weights in 7 bits: ``reduce_range``), and polyc then gives the same bits."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx.plan import Group  # noqa: E402
from polyc.frontends.onnx.qdq import integer_node_units  # noqa: E402
from tests.onnx.test_quantized import onnxruntime_multiplies_u8_by_s8_exactly  # noqa: E402

SHAPE = (1, 8, 12, 12)


def float_network(seed: int = 0):
    """Conv+Relu, Conv, a residual Add, MaxPool, GlobalAveragePool, Flatten and Gemm."""
    rng = np.random.default_rng(seed)

    def weight(name, shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    initializers = [
        weight("w1", (16, 8, 3, 3)),
        weight("b1", (16,)),
        weight("w2", (16, 16, 3, 3), 0.1),
        weight("b2", (16,)),
        weight("wf", (10, 16)),
        weight("bf", (10,)),
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def quantized(tmp_path, per_channel: bool, reduce_range: bool, seed: int = 0):
    source, target = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(float_network(seed), str(source))
    rng = np.random.default_rng(seed + 1)
    samples = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

    class Reader(quantization.CalibrationDataReader):
        def get_next(self):
            return next(samples, None)

    quantization.quantize_static(
        str(source),
        str(target),
        Reader(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=per_channel,
        reduce_range=reduce_range,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    return onnx.load(str(target))


def rewritten(model, supported=lambda op_type, domain: domain == ""):
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return integer_node_units(
        list(model.graph.node),
        {o.name for o in model.graph.output},
        constants.get,
        constants.__setitem__,
        supported,
        21,
    )


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("reduce_range", [True, False], ids=["7-bit-weights", "s8-weights"])
def test_qdq_network_gives_onnxruntimes_bits(tmp_path, per_channel, reduce_range):
    if not reduce_range and not onnxruntime_multiplies_u8_by_s8_exactly():
        pytest.skip("onnxruntime's u8 x s8 sums saturate on this processor (no VNNI): full-range weights differ")
    model = quantized(tmp_path, per_channel, reduce_range)
    rng = np.random.default_rng(7)
    theirs_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours_session = ponnx.InferenceSession(model)
    for _ in range(3):
        feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32)}
        (ours,), (theirs,) = ours_session.run(None, feeds), theirs_session.run(None, feeds)
        np.testing.assert_array_equal(ours, theirs)
    # The session computed the convolutions' units on the integers (named "Conv+Q").
    fused = [name for nodes in ours_session.groups for name in nodes if "+" in name]
    assert len({name for name in fused if name.startswith("Conv")}) == 2


def test_the_units_become_integer_operators(tmp_path):
    model = quantized(tmp_path, per_channel=True, reduce_range=True)
    nodes = rewritten(model)
    kinds = [node.op_type for node in nodes]
    assert kinds.count("QLinearConv") == 2
    assert "Conv" not in kinds
    # MaxPool and Flatten between DQ and Q of one quantization run on the integers.
    maxpool = next(node for node in nodes if node.op_type == "MaxPool")
    assert all(n.op_type != "DequantizeLinear" or n.output[0] != maxpool.input[0] for n in nodes)
    # No DQ of a weight is left: nothing reads it.
    dequantized = {node.input[0] for node in nodes if node.op_type == "DequantizeLinear"}
    assert not dequantized & {"w1_quantized", "w2_quantized"}
    # Without polyc's converters for com.microsoft operators the Add and Gemm stay in float.
    assert "Add" in kinds and "Gemm" in kinds
    everything = rewritten(model, supported=lambda op_type, domain: True)
    assert {"QLinearAdd", "QLinearGlobalAveragePool", "QGemm"} <= {node.op_type for node in everything}


def test_a_unit_whose_quantization_is_not_constant_stays_in_float(tmp_path):
    model = quantized(tmp_path, per_channel=False, reduce_range=True)
    # The second Conv's output scale becomes a graph input: its Q is not a constant quantization.
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c2")
    scale = q.input[1]
    model.graph.input.append(helper.make_tensor_value_info(scale, TensorProto.FLOAT, []))
    model.graph.initializer.remove(next(t for t in model.graph.initializer if t.name == scale))
    kinds = [node.op_type for node in rewritten(model)]
    assert kinds.count("QLinearConv") == 1 and kinds.count("Conv") == 1


def test_a_bias_of_another_scale_keeps_the_conv_in_float(tmp_path):
    model = quantized(tmp_path, per_channel=False, reduce_range=True)
    bias_scale = next(t for t in model.graph.initializer if t.name.startswith("b1") and t.name.endswith("scale"))
    bias_scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias_scale) * np.float32(1.5), bias_scale.name))
    kinds = [node.op_type for node in rewritten(model)]
    assert kinds.count("QLinearConv") == 1 and kinds.count("Conv") == 1


def test_graph_fusion_off_keeps_the_qdq_semantics(tmp_path):
    # Without the rewrite every operator runs in float between its DQs and its Q, as the
    # standard reads: onnx's reference evaluator computes it so.
    from onnx.reference import ReferenceEvaluator

    model = quantized(tmp_path, per_channel=True, reduce_range=True)
    feeds = {"x": np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)}
    (ours,) = ponnx.InferenceSession(model, graph_fusion=False).run(None, feeds)
    (reference,) = ReferenceEvaluator(model).run(None, feeds)
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "y_scale")))
    # float32 sums in another order can move a value across a rounding boundary: one step.
    assert np.abs(ours - reference).max() <= step * 1.0001


def test_a_batch_of_images_gives_onnxruntimes_bits(tmp_path):
    """Several images at once: each convolution's product takes the images and positions as its
    one column index (the im2col copy puts the image inside), then the product is transposed
    back to images first; the bits are onnxruntime's, as at batch 1."""
    model = quantized(tmp_path, per_channel=True, reduce_range=True)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    rng = np.random.default_rng(11)
    feeds = {"x": rng.standard_normal((3, *SHAPE[1:])).astype(np.float32)}
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_array_equal(session.run(None, feeds)[0], theirs)
    assert "integer_product" in {step.kind for plan in [session] for step in _steps(session, feeds)}


def _steps(session, feeds):
    plan, _ = session._plan_for_feeds(feeds)
    return [step for stage in plan.stages() for group in stage.order if hasattr(group, "steps") for step in group.steps]


@pytest.mark.parametrize("images", [1, 3])
def test_requantization_runs_in_the_integer_kernel(tmp_path, images):
    """Each integer product's requantization (and the Gemm's bias) is an epilogue of the integer
    kernel, applied to each block of its int32 sums: the int32 tensors never leave the kernel
    (no group writes one for another to read), there is one kernel per convolution besides its
    copies of the windows, and the bits stay onnxruntime's."""
    model = quantized(tmp_path, per_channel=True, reduce_range=True)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    feeds = {"x": np.random.default_rng(12).standard_normal((images, *SHAPE[1:])).astype(np.float32)}
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_array_equal(session.run(None, feeds)[0], theirs)
    plan, _ = session._plan_for_feeds(feeds)
    groups = [group for stage in plan.stages() for group in stage.order if isinstance(group, Group)]
    integer = [group for group in groups if "integer_product" in group.kinds]
    assert len(integer) == 3  # two convolutions and the Gemm
    for group in integer:
        assert group.kernel.stages({}).path == "integer_gemm"
        assert group.statement_count > 1, group.source
        assert all(value.dtype != np.int32 for value in group.outputs), group.source
    computed = [value for group in groups for value in group.inputs if value.const is None]
    assert not any(value.dtype == np.int32 for value in computed)
    assert sum("requantize" in group.kinds for group in groups) == 2
    # The residual Add (QLinearAdd) reads the second convolution's output alone: its epilogue too.
    assert any(node.startswith("Add") for group in integer for node in group.nodes)
