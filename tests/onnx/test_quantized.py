"""The quantized operators: QuantizeLinear and DequantizeLinear (per tensor, per axis, in
blocks), MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv, and the dynamically quantized linear layer that
onnxruntime's ``quantize_dynamic`` writes (DynamicQuantizeLinear, an ONNX function, feeding
MatMulInteger).  Against onnxruntime, and against onnx's reference where its rounding is
the definition."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402


def model_of(nodes, inputs: dict, outputs, initializers=(), opset: int = 21):
    graph = helper.make_graph(
        nodes, "quantized",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, 0, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def all_three(model, feeds):
    ours = ponnx.InferenceSession(model).run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    reference = ReferenceEvaluator(model).run(None, feeds)
    return ours, theirs, reference


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_quantize_per_axis_saturates_and_rounds_halves_to_even(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 4)) * 300).astype(np.float32)
    x[0, 0, :4] = [0.5, 1.5, 2.5, -2.5]  # halves, at scale 1
    x[1, 2, :2] = [1e6, -1e6]  # beyond every type's range
    scale = np.array([1.0, 0.5, 2.0], np.float32)
    zero = np.array([3, 0, 1], dtype)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1)]
    model = model_of(nodes, {"x": x}, ["q", "y"], {"scale": scale, "zero": zero})
    ours, theirs, reference = all_three(model, {"x": x})
    for got, expected in zip(ours, reference):
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ours[0], theirs[0])
    assert ours[0].min() == np.iinfo(dtype).min and ours[0].max() == np.iinfo(dtype).max  # saturated
    assert list(ours[0][0, 0, :4].astype(int) - 3) == [0, 2, 2, -2]


def test_blocked_quantization_against_onnxruntime():
    # Scales per block of 4 along the last axis of 10 (the last block is 2 long).
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 10)).astype(np.float32)
    scale = rng.uniform(0.01, 0.05, (3, 3)).astype(np.float32)
    zero = rng.integers(-5, 5, (3, 3)).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1, block_size=4),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1, block_size=4)]
    model = model_of(nodes, {"x": x}, ["q", "y"], {"scale": scale, "zero": zero})
    ours, theirs, reference = all_three(model, {"x": x})
    for got, expected in zip(ours, theirs):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ours[0], reference[0])


def test_a_scale_that_fits_no_axis_is_named():
    x = np.zeros((2, 3), np.float32)
    model = model_of([helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], name="q", axis=1)], {"x": x}, ["q"],
                     {"scale": np.ones(2, np.float32)})
    with pytest.raises(polyc.PolycError, match=r"node 'q' \(QuantizeLinear\): a scale or zero point of shape"):
        ponnx.InferenceSession(model).run(None, {"x": x})


def test_matmul_integer_with_per_row_and_per_column_zero_points():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (2, 5, 7)).astype(np.uint8)
    w = rng.integers(-128, 128, (7, 6)).astype(np.int8)
    a_zero = np.array([128, 3, 0, 255, 9], np.uint8)   # one per row of A
    w_zero = rng.integers(-3, 3, 6).astype(np.int8)     # one per column of W
    model = model_of([helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["y"])], {"a": a}, ["y"],
                     {"w": w, "a_zero": a_zero, "w_zero": w_zero})
    # (onnxruntime and onnx's reference take one zero point for A only: numpy, exactly)
    (ours,) = ponnx.InferenceSession(model).run(None, {"a": a})
    expected = (a.astype(np.int64) - a_zero[:, None]) @ (w.astype(np.int64) - w_zero)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)


def test_qlinear_matmul_as_onnx_defines_it():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (4, 16)).astype(np.uint8)
    w = rng.integers(0, 256, (16, 5)).astype(np.uint8)
    params = {"a_scale": np.array(0.02, np.float32), "a_zero": np.array(120, np.uint8),
              "w": w, "w_scale": np.array(0.01, np.float32), "w_zero": np.array(130, np.uint8),
              "y_scale": np.array(0.05, np.float32), "y_zero": np.array(100, np.uint8)}
    node = helper.make_node("QLinearMatMul", ["a", "a_scale", "a_zero", "w", "w_scale", "w_zero", "y_scale",
                                              "y_zero"], ["y"])
    model = model_of([node], {"a": a}, ["y"], params)
    (ours,), (theirs,), (reference,) = all_three(model, {"a": a})
    np.testing.assert_array_equal(ours, reference)
    assert np.abs(ours.astype(int) - theirs).max() <= 1  # onnxruntime scales in float32


def test_a_dynamically_quantized_linear_layer_against_onnxruntime():
    # What onnxruntime.quantization.quantize_dynamic makes of x @ W + b.
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    weights = rng.standard_normal((32, 16)).astype(np.float32)
    w_scale = np.float32(np.abs(weights).max() / 127)
    w_q = np.clip(np.rint(weights / w_scale), -127, 127).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
             helper.make_node("MatMulInteger", ["xq", "w_q", "x_zero", "w_zero"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             helper.make_node("Mul", ["acc_f", "scale"], ["product"]),
             helper.make_node("Add", ["product", "bias"], ["y"])]
    model = model_of(nodes, {"x": x}, ["y"], {"w_q": w_q, "w_zero": np.array(0, np.int8),
                                             "w_scale": np.array(w_scale), "bias": np.ones(16, np.float32)})
    (ours,), (theirs,), _ = all_three(model, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, x @ weights + 1, rtol=0, atol=0.3)  # quantization's own error


@pytest.mark.parametrize("group", [1, 4])
def test_qlinear_conv_per_channel_strided_padded(group):
    # A strided, padded convolution (depthwise when group is 4) with a scale per output channel
    # and a bias: exactly onnx's reference, within one step of onnxruntime's float32 scaling.
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (2, 4, 9, 9)).astype(np.uint8)
    w = rng.integers(-127, 128, (8, 4 // group, 3, 3)).astype(np.int8)
    params = {"x_scale": np.array(0.05, np.float32), "x_zero": np.array(128, np.uint8), "w": w,
              "w_scale": rng.uniform(0.002, 0.01, 8).astype(np.float32), "w_zero": np.zeros(8, np.int8),
              "y_scale": np.array(0.2, np.float32), "y_zero": np.array(90, np.uint8),
              "bias": rng.integers(-500, 500, 8).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero",
                                            "bias"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1], group=group)
    model = model_of([node], {"x": x}, ["y"], params)
    (ours,), (theirs,), (reference,) = all_three(model, {"x": x})
    np.testing.assert_array_equal(ours, reference)
    assert np.abs(ours.astype(int) - theirs).max() <= 1


def test_conv_integer_of_weights_given_at_run_time():
    # Weights fed as an input are shifted by a kernel, not when the model is compiled.
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (5, 3, 3, 3)).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero", "w_zero"], ["y"], pads=[1, 1, 1, 1])
    model = model_of([node], {"x": x, "w": w}, ["y"], {"x_zero": np.array(7, np.uint8),
                                                       "w_zero": np.array(100, np.uint8)})
    (ours,), (theirs,), (reference,) = all_three(model, {"x": x, "w": w})
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(ours, theirs)
