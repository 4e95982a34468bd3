"""The quantized operators: QuantizeLinear and DequantizeLinear (per tensor, per axis, in
blocks), MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv, and the dynamically quantized linear layer that
onnxruntime's ``quantize_dynamic`` writes (DynamicQuantizeLinear, an ONNX function, feeding
MatMulInteger).

Every result is checked against an exact reference: integer arithmetic in numpy, onnx's
``ReferenceEvaluator`` (integer arithmetic and ONNX's rounding are its definition) and, for the
requantizing operators, onnxruntime, whose float32 scaling polyc follows (onnx's reference
scales in double and is then one step away in rare elements).  onnxruntime is a witness only
where it computes its int32 sums exactly.  Its u8 x s8 kernels on x86 processors without
VNNI multiply pairs with ``vpmaddubsw``, whose 16-bit sums saturate (onnxruntime's quantization
guide recommends ``reduce_range`` for them), so full-range s8 weights are compared with
onnxruntime only where :func:`onnxruntime_multiplies_u8_by_s8_exactly` finds it exact; weights in
7 bits, as ``reduce_range`` makes them, cannot saturate (2 x 255 x 64 < 2^15) and are compared
everywhere."""

from __future__ import annotations

import functools

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
        nodes,
        "quantized",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in inputs.items()
        ],
        [helper.make_tensor_value_info(n, 0, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in dict(initializers).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


@functools.cache
def onnxruntime_multiplies_u8_by_s8_exactly() -> bool:
    """Whether this machine's onnxruntime computes u8 x s8 products exactly.  Measured, not guessed
    from the processor's name: a product in which every pair of terms is 255 x -128 saturates
    wherever onnxruntime sums pairs in 16 bits, and is exact on VNNI (``vpdpbusd``) and AMX."""
    a = np.full((2, 64), 255, np.uint8)
    w = np.full((64, 4), -128, np.int8)
    model = model_of([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], {"a": a}, ["y"], {"w": w})
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    return bool(np.array_equal(theirs, a.astype(np.int64) @ w.astype(np.int64)))


def needs_exact_u8s8_in_onnxruntime():
    if not onnxruntime_multiplies_u8_by_s8_exactly():
        pytest.skip(
            "onnxruntime's u8 x s8 kernels saturate on this processor (16-bit pair sums, no VNNI): "
            "full-range s8 weights are checked against onnx's reference only"
        )


def one_step_off(result: np.ndarray) -> np.ndarray:
    """``result`` with one element moved by one quantization step (the negative control)."""
    perturbed = result.copy()
    flat = perturbed.reshape(-1)
    flat[flat.size // 2] += 1 if flat[flat.size // 2] < np.iinfo(flat.dtype).max else -1
    return perturbed


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
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1),
    ]
    model = model_of(nodes, {"x": x}, ["q", "y"], {"scale": scale, "zero": zero})
    ours, theirs, reference = all_three(model, {"x": x})
    for got, expected in zip(ours, reference, strict=True):
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
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], axis=1, block_size=4),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], axis=1, block_size=4),
    ]
    model = model_of(nodes, {"x": x}, ["q", "y"], {"scale": scale, "zero": zero})
    ours, theirs, reference = all_three(model, {"x": x})
    for got, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ours[0], reference[0])


def test_a_scale_that_fits_no_axis_is_named():
    x = np.zeros((2, 3), np.float32)
    model = model_of(
        [helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], name="q", axis=1)],
        {"x": x},
        ["q"],
        {"scale": np.ones(2, np.float32)},
    )
    with pytest.raises(polyc.PolycError, match=r"node 'q' \(QuantizeLinear\): a scale or zero point of shape"):
        ponnx.InferenceSession(model).run(None, {"x": x})


def test_matmul_integer_with_per_row_and_per_column_zero_points():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (2, 5, 7)).astype(np.uint8)
    w = rng.integers(-128, 128, (7, 6)).astype(np.int8)
    a_zero = np.array([128, 3, 0, 255, 9], np.uint8)  # one per row of A
    w_zero = rng.integers(-3, 3, 6).astype(np.int8)  # one per column of W
    model = model_of(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["y"])],
        {"a": a},
        ["y"],
        {"w": w, "a_zero": a_zero, "w_zero": w_zero},
    )
    # (onnxruntime and onnx's reference take one zero point for A only: numpy, exactly)
    (ours,) = ponnx.InferenceSession(model).run(None, {"a": a})
    expected = (a.astype(np.int64) - a_zero[:, None]) @ (w.astype(np.int64) - w_zero)
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, expected)


def test_qlinear_matmul_requantizes_as_onnxruntime():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (4, 16)).astype(np.uint8)
    w = rng.integers(0, 256, (16, 5)).astype(np.uint8)
    params = {
        "a_scale": np.array(0.02, np.float32),
        "a_zero": np.array(120, np.uint8),
        "w": w,
        "w_scale": np.array(0.01, np.float32),
        "w_zero": np.array(130, np.uint8),
        "y_scale": np.array(0.05, np.float32),
        "y_zero": np.array(100, np.uint8),
    }
    node = helper.make_node(
        "QLinearMatMul", ["a", "a_scale", "a_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero"], ["y"]
    )
    model = model_of([node], {"a": a}, ["y"], params)
    (ours,), (theirs,), (reference,) = all_three(model, {"a": a})
    np.testing.assert_array_equal(ours, requantized_in_float32(a, params))
    np.testing.assert_array_equal(ours, theirs)  # u8 x u8: exact in onnxruntime on every x86 kernel
    within_one_step_of_the_double_reference(ours, reference)


def requantized_in_float32(a: np.ndarray, params: dict) -> np.ndarray:
    """QLinearMatMul in numpy as polyc documents it: the int32 product, times the float32
    factor a_scale * w_scale / y_scale in float32, rounded half to even, plus the zero point."""
    product = (a.astype(np.int64) - params["a_zero"]) @ (params["w"].astype(np.int64) - params["w_zero"])
    factor = params["a_scale"] * params["w_scale"] / params["y_scale"]
    scaled = np.rint(product.astype(np.float32) * factor) + np.float32(params["y_zero"])
    limits = np.iinfo(params["y_zero"].dtype)
    return np.clip(scaled, limits.min, limits.max).astype(params["y_zero"].dtype)


def within_one_step_of_the_double_reference(ours: np.ndarray, reference: np.ndarray) -> None:
    """onnx's reference scales in double: it differs from float32 scaling by one step where a
    product lies within float32's rounding of a half, about one element in 10^5 for 8-bit
    results (a float32 product's relative error is 2^-24, a result's magnitude below 2^8)."""
    steps = np.abs(ours.astype(np.int64) - reference.astype(np.int64))
    assert steps.max() <= 1
    assert np.count_nonzero(steps) <= max(1, steps.size // 1000)


WEIGHT_BITS = pytest.mark.parametrize("weight_bits", [8, 7], ids=["s8-weights", "7-bit-weights"])


def dynamically_quantized_linear_layer(weight_bits: int):
    """What onnxruntime.quantization.quantize_dynamic makes of x @ W + b (with
    ``reduce_range=True`` when ``weight_bits`` is 7), its feed and its float weights."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    weights = rng.standard_normal((32, 16)).astype(np.float32)
    largest = 2 ** (weight_bits - 1) - 1
    w_scale = np.float32(np.abs(weights).max() / largest)
    w_q = np.clip(np.rint(weights / w_scale), -largest, largest).astype(np.int8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero"]),
        helper.make_node("MatMulInteger", ["xq", "w_q", "x_zero", "w_zero"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
        helper.make_node("Mul", ["acc_f", "scale"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["y"]),
    ]
    model = model_of(
        nodes,
        {"x": x},
        ["y"],
        {"w_q": w_q, "w_zero": np.array(0, np.int8), "w_scale": np.array(w_scale), "bias": np.ones(16, np.float32)},
    )
    return model, x, weights, w_scale


def float_epilogue_tolerance(reference: np.ndarray, bias: float = 1.0) -> float:
    """How far two correct evaluations of ``float(acc) * scale + bias`` may differ: each of its two
    float32 roundings (or one, where it is fused into an fma) is within half an ulp of the largest
    product.  One quantization step of the product is some thousand times more."""
    return float(2 * np.finfo(np.float32).eps * np.abs(reference - bias).max())


@WEIGHT_BITS
def test_a_dynamically_quantized_linear_layer_against_onnx_reference(weight_bits):
    model, x, weights, w_scale = dynamically_quantized_linear_layer(weight_bits)
    ours, _, reference = all_three(model, {"x": x})
    (ours,), (reference,) = ours, reference
    tolerance = float_epilogue_tolerance(reference)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=tolerance)
    # Negative control: one step of the integer product (x_scale * w_scale) more in one element fails.
    x_scale = np.float32((max(x.max(), 0) - min(x.min(), 0)) / 255)
    moved = ours.copy()
    moved[3, 5] += x_scale * w_scale
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(moved, reference, rtol=0, atol=tolerance)
    # Quantization's own error: each term of x @ W is off by at most half a step of x times |W|,
    # half a step of W times |x|, and the product of the two half steps.
    bound = (
        np.abs(x) @ np.full_like(weights, w_scale / 2)
        + x_scale / 2 * np.abs(weights).sum(axis=0)
        + x.shape[1] * x_scale * w_scale / 4
    )
    assert np.all(np.abs(ours - (x @ weights + 1)) <= bound + tolerance)


@WEIGHT_BITS
def test_a_dynamically_quantized_linear_layer_against_onnxruntime(weight_bits):
    if weight_bits == 8:
        needs_exact_u8s8_in_onnxruntime()
    model, x, _, _ = dynamically_quantized_linear_layer(weight_bits)
    (ours,), (theirs,), (reference,) = all_three(model, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=float_epilogue_tolerance(reference))


def strided_padded_qlinear_conv(group: int, weight_bits: int):
    """A strided, padded convolution (depthwise when group is 4) with a scale per output channel
    and a bias, its weights full-range s8 or in 7 bits, and its feed."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (2, 4, 9, 9)).astype(np.uint8)
    largest = 2 ** (weight_bits - 1) - 1
    w = rng.integers(-largest - (weight_bits == 7), largest + 1, (8, 4 // group, 3, 3)).astype(np.int8)
    params = {
        "x_scale": np.array(0.05, np.float32),
        "x_zero": np.array(128, np.uint8),
        "w": w,
        "w_scale": rng.uniform(0.002, 0.01, 8).astype(np.float32),
        "w_zero": np.zeros(8, np.int8),
        "y_scale": np.array(0.2, np.float32),
        "y_zero": np.array(90, np.uint8),
        "bias": rng.integers(-500, 500, 8).astype(np.int32),
    }
    node = helper.make_node(
        "QLinearConv",
        ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias"],
        ["y"],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        group=group,
    )
    return model_of([node], {"x": x}, ["y"], params), x


@WEIGHT_BITS
@pytest.mark.parametrize("group", [1, 4])
def test_qlinear_conv_per_channel_strided_padded_against_onnx_reference(group, weight_bits):
    model, x = strided_padded_qlinear_conv(group, weight_bits)
    (ours,), _, (reference,) = all_three(model, {"x": x})
    within_one_step_of_the_double_reference(ours, reference)


@WEIGHT_BITS
@pytest.mark.parametrize("group", [1, 4])
def test_qlinear_conv_per_channel_strided_padded_against_onnxruntime(group, weight_bits):
    # Exactly onnxruntime's results: both scale the int32 sums in float32.
    if weight_bits == 8:
        needs_exact_u8s8_in_onnxruntime()
    model, x = strided_padded_qlinear_conv(group, weight_bits)
    (ours,), (theirs,), _ = all_three(model, {"x": x})
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(AssertionError):  # negative control: one step off in one element fails
        np.testing.assert_array_equal(one_step_off(ours), theirs)


def test_conv_integer_of_weights_given_at_run_time():
    # Weights fed as an input are shifted by a kernel, not when the model is compiled.
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (5, 3, 3, 3)).astype(np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero", "w_zero"], ["y"], pads=[1, 1, 1, 1])
    model = model_of(
        [node], {"x": x, "w": w}, ["y"], {"x_zero": np.array(7, np.uint8), "w_zero": np.array(100, np.uint8)}
    )
    (ours,), (theirs,), (reference,) = all_three(model, {"x": x, "w": w})
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(ours, theirs)


def conv_integer_in_numpy(x: np.ndarray, w: np.ndarray, x_zero: int, w_zero: int, pad: int) -> np.ndarray:
    """ConvInteger (stride 1, one group) in int64, the definition."""
    shifted = np.pad(x.astype(np.int64) - x_zero, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    filters = w.astype(np.int64) - w_zero
    k = w.shape[2]
    rows, columns = shifted.shape[2] - k + 1, shifted.shape[3] - k + 1
    out = np.zeros((x.shape[0], w.shape[0], rows, columns), np.int64)
    for i in range(k):
        for j in range(k):
            out += np.einsum("nchw,fc->nfhw", shifted[:, :, i : i + rows, j : j + columns], filters[:, :, i, j])
    return out


@pytest.mark.parametrize(
    "channels, filters, size, low, high",
    [(64, 64, 16, -128, 128), (1024, 4, 6, -128, -126)],
    ids=["sums-exact-in-float32", "sums-beyond-float32"],
)
@pytest.mark.parametrize("images", [1, 2], ids=["integer-product", "float-kernels"])
def test_conv_integer_of_constant_weights_is_exact(channels, filters, size, low, high, images):
    # One image: an integer matrix product of the weights and the windows (im2col).  Two: with
    # constant weights bounding every partial sum, below 2^24 the convolution runs on float32
    # kernels (Winograd off), beyond it on float64 ones.  Weights of -128 and -127 with inputs
    # of 255 make odd sums near 255 * 127.5 * 9216 (> 2^28), which float32 would round.
    rng = np.random.default_rng(8)
    x = np.where(rng.random((images, channels, size, size)) < 0.9, 255, 0).astype(np.uint8)
    w = rng.integers(low, high, (filters, channels, 3, 3)).astype(np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "x_zero"], ["y"], pads=[1, 1, 1, 1])
    model = model_of([node], {"x": x}, ["y"], {"w": w, "x_zero": np.array(0, np.uint8)})
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    expected = conv_integer_in_numpy(x, w, 0, 0, 1)
    assert (np.abs(expected).max() > 2**24) == (channels == 1024)
    np.testing.assert_array_equal(ours, expected)
    with pytest.raises(AssertionError):  # negative control: one step off in one element fails
        np.testing.assert_array_equal(one_step_off(ours), expected)


@pytest.mark.parametrize(
    "a_type, w_type", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)], ids=["u8s8", "s8s8", "u8u8"]
)
def test_matmul_integer_is_one_integer_product_of_the_8_bit_tensors(a_type, w_type):
    """Batched A times constant weights, zero points of both: one kernel on the integer gemm path,
    which reads the 8-bit tensors themselves (no int32 copy of the weights), exact against
    onnx's reference."""
    rng = np.random.default_rng(11)
    a_info, w_info = np.iinfo(a_type), np.iinfo(w_type)
    a = rng.integers(a_info.min, a_info.max + 1, (3, 17, 70)).astype(a_type)
    w = rng.integers(w_info.min, w_info.max + 1, (70, 33)).astype(w_type)
    a_zero = np.array(a_info.max // 3, a_type)
    w_zero = np.array(w_info.min + 5, w_type)
    model = model_of(
        [helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["y"])],
        {"a": a},
        ["y"],
        {"w": w, "a_zero": a_zero, "w_zero": w_zero},
    )
    session = ponnx.InferenceSession(model)
    (ours,) = session.run(None, {"a": a})
    (reference,) = ReferenceEvaluator(model).run(None, {"a": a})
    np.testing.assert_array_equal(ours, reference)
    np.testing.assert_array_equal(
        ours, (a.astype(np.int64) - a_zero.astype(np.int64)) @ (w.astype(np.int64) - w_zero.astype(np.int64))
    )
    (kernel,) = session.kernels()
    assert kernel.stages({}).path == "integer_gemm"
    assert {t.dtype for t in kernel.definition.tensors if t.role.name == "INPUT"} <= {
        np.dtype(a_type),
        np.dtype(w_type),
    }


def test_a_dynamically_quantized_layer_multiplies_on_the_integer_path():
    model, x, _, _ = dynamically_quantized_linear_layer(8)
    session = ponnx.InferenceSession(model)
    session.run(None, {"x": x})
    paths = [kernel.stages({}).path for kernel in session.kernels()]
    assert paths.count("integer_gemm") == 1, paths


@pytest.mark.parametrize("images", [1, 2], ids=["integer-product", "int32-or-float"])
def test_conv_integer_dilated_asymmetric_padding_and_zero_points(images):
    # The windows' copy pads with x's zero point (0 after the shift), strides and dilations
    # differ per axis; u8 weights with a zero point of their own.
    rng = np.random.default_rng(9)
    x = rng.integers(0, 256, (images, 5, 9, 11)).astype(np.uint8)
    w = rng.integers(0, 256, (6, 5, 3, 2)).astype(np.uint8)
    node = helper.make_node(
        "ConvInteger", ["x", "w", "x_zero", "w_zero"], ["y"], pads=[2, 0, 1, 1], strides=[1, 2], dilations=[2, 1]
    )
    params = {"w": w, "x_zero": np.array(7, np.uint8), "w_zero": np.array(100, np.uint8)}
    model = model_of([node], {"x": x}, ["y"], params)
    (ours,), _, (reference,) = all_three(model, {"x": x})
    assert ours.dtype == np.int32
    np.testing.assert_array_equal(ours, reference)
    with pytest.raises(AssertionError):  # negative control: one step off in one element fails
        np.testing.assert_array_equal(one_step_off(ours), reference)
