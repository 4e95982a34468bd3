"""Integer depthwise convolutions (polyc/paths/integer_depthwise.py): QLinearConv with one filter
per channel, and QDQ depthwise Conv units quantized by onnxruntime's ``quantize_static`` (no
torch), bit for bit against onnxruntime, whose depthwise kernel sums u8 x s8 products exactly
in int32 and requantizes in float32 as polyc does."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from tests.onnx.test_quantized import model_of, one_step_off  # noqa: E402


def depthwise_qlinear_conv(
    channels=12,
    size=(11, 9),
    kernel=(3, 3),
    strides=(1, 1),
    pads=(1, 1, 1, 1),
    dilations=(1, 1),
    images=1,
    image_type=np.uint8,
    y_scale=0.2,
    bias=True,
    seed=3,
    x_zero=None,
):
    """A QLinearConv with one filter per channel, full-range s8 weights with a scale per
    channel, and its feed; a small ``y_scale`` saturates many outputs at both ends."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(image_type)
    x = rng.integers(info.min, info.max + 1, (images, channels, *size)).astype(image_type)
    w = rng.integers(-128, 128, (channels, 1, *kernel)).astype(np.int8)
    w.reshape(channels, -1)[0, :] = -128  # the most negative filter against the largest inputs
    x[:, 0] = info.max
    params = {
        "x_scale": np.array(0.05, np.float32),
        "x_zero": np.array(info.min + 1 + (info.max - info.min) // 2 if x_zero is None else x_zero, image_type),
        "w": w,
        "w_scale": rng.uniform(0.002, 0.01, channels).astype(np.float32),
        "w_zero": np.zeros(channels, np.int8),
        "y_scale": np.array(y_scale, np.float32),
        "y_zero": np.array(90 if image_type == np.uint8 else -7, image_type),
    }
    names = ["x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero"]
    if bias:
        params["bias"] = rng.integers(-2000, 2000, channels).astype(np.int32)
        names.append("bias")
    node = helper.make_node(
        "QLinearConv",
        names,
        ["y"],
        strides=list(strides),
        pads=list(pads),
        dilations=list(dilations),
        group=channels,
    )
    return model_of([node], {"x": x}, ["y"], params), x


def paths_of(session, feeds) -> set[str]:
    """The kernel paths of the session's kernels at these feeds (specialised: no sizes)."""
    plan, _ = session._plan_for_feeds(feeds)
    return {group.kernel.stages({}).path for stage in plan.stages() for group in stage.order if hasattr(group, "steps")}


def onnxruntime_and_polyc(model, x, **options):
    session = ponnx.InferenceSession(model, **options)
    (ours,) = session.run(None, {"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return ours, theirs.run(None, {"x": x})[0], session


CASES = {
    "3x3-stride-1": {},
    "3x3-stride-2": {"strides": (2, 2)},
    "3x3-stride-2-odd": {"strides": (2, 2), "size": (13, 12), "pads": (1, 0, 1, 1)},
    "5x5-stride-1": {"kernel": (5, 5), "pads": (2, 2, 2, 2)},
    "5x5-stride-2": {"kernel": (5, 5), "strides": (2, 2), "pads": (2, 2, 2, 2)},
    "3x5-valid": {"kernel": (3, 5), "pads": (0, 0, 0, 0)},
    "dilated": {"dilations": (2, 2), "pads": (2, 2, 2, 2)},
    "wide-row": {"size": (5, 71), "channels": 3},
    # rows long enough to go row by row rather than as one run through the plane
    "row-by-row-stride-1": {"size": (8, 60), "channels": 3},
    "row-by-row-stride-2": {"size": (6, 100), "channels": 3, "strides": (2, 2)},
    "row-by-row-5x5-stride-2": {
        "size": (7, 101),
        "channels": 2,
        "kernel": (5, 5),
        "strides": (2, 2),
        "pads": (2, 1, 2, 2),
    },
    "no-bias": {"bias": False},
    "saturating": {"y_scale": 0.004},
    "two-images": {"images": 2, "strides": (2, 2)},
    "int8-image": {"image_type": np.int8, "strides": (2, 2)},
    "int8-image-negative-zero": {"image_type": np.int8, "x_zero": -37},
}


@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_qlinear_conv_gives_onnxruntimes_bits(case):
    model, x = depthwise_qlinear_conv(**CASES[case])
    ours, theirs, session = onnxruntime_and_polyc(model, x)
    assert paths_of(session, {"x": x}) == {"integer_depthwise"}
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(AssertionError):  # negative control: one step off in one element fails
        np.testing.assert_array_equal(one_step_off(ours), theirs)


def test_the_integer_depthwise_path_computes_it():
    model, x = depthwise_qlinear_conv(strides=(2, 2))
    _, _, session = onnxruntime_and_polyc(model, x)
    assert paths_of(session, {"x": x}) == {"integer_depthwise"}


def test_without_direct_convolutions_the_loop_nest_gives_the_same_bits():
    model, x = depthwise_qlinear_conv(strides=(2, 2))
    ours, theirs, session = onnxruntime_and_polyc(model, x, direct_convolutions=False)
    assert "integer_depthwise" not in paths_of(session, {"x": x})
    np.testing.assert_array_equal(ours, theirs)


def test_a_channel_multiplier_is_no_depthwise_kernel():
    """Two filters per channel: the general integer convolution, still exact."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (1, 4, 7, 7)).astype(np.uint8)
    params = {
        "x_scale": np.array(0.05, np.float32),
        "x_zero": np.array(128, np.uint8),
        "w": rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int8),
        "w_scale": np.array(0.01, np.float32),
        "w_zero": np.array(0, np.int8),
        "y_scale": np.array(0.2, np.float32),
        "y_zero": np.array(100, np.uint8),
    }
    node = helper.make_node("QLinearConv", ["x", *params], ["y"], group=4, pads=[1, 1, 1, 1])
    model = model_of([node], {"x": x}, ["y"], params)
    ours, theirs, session = onnxruntime_and_polyc(model, x)
    np.testing.assert_array_equal(ours, theirs)
    assert "integer_depthwise" not in paths_of(session, {"x": x})


def mobile_block(channels=16, size=14, strides=1, seed=0):
    """An inverted-residual block as mobilenet_v2 has it: 1x1 expansion + Relu6 (Clip), a 3x3
    depthwise Conv + Relu6, a 1x1 projection."""
    rng = np.random.default_rng(seed)

    def weight(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    expanded = 2 * channels
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
        helper.make_node("Clip", ["c1", "zero", "six"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=expanded, pads=[1, 1, 1, 1], strides=[strides] * 2),
        helper.make_node("Clip", ["c2", "zero", "six"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"]),
    ]
    initializers = [
        weight("w1", (expanded, channels, 1, 1)),
        weight("b1", (expanded,)),
        weight("w2", (expanded, 1, 3, 3), 0.5),
        weight("b2", (expanded,)),
        weight("w3", (channels, expanded, 1, 1)),
        weight("b3", (channels,)),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
    ]
    shape = [1, channels, size, size]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), shape


@pytest.mark.parametrize("strides", [1, 2])
@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_a_quantized_mobile_block_gives_onnxruntimes_bits(tmp_path, strides, quant_format):
    """quantize_static with per-channel s8 weights and u8 activations (7-bit weights: exact in
    onnxruntime's 1x1 kernels without VNNI too); the depthwise unit runs on the integer path."""
    model, shape = mobile_block(strides=strides)
    source, target = tmp_path / "float.onnx", tmp_path / "quantized.onnx"
    onnx.save(model, str(source))
    rng = np.random.default_rng(1)
    samples = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    class Reader(quantization.CalibrationDataReader):
        def get_next(self):
            return next(samples, None)

    quantization.quantize_static(
        str(source),
        str(target),
        Reader(),
        quant_format=getattr(quantization.QuantFormat, quant_format),
        per_channel=True,
        reduce_range=True,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    quantized = onnx.load(str(target))
    theirs = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    session = ponnx.InferenceSession(quantized)
    for _ in range(3):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], theirs.run(None, feeds)[0])
    assert "integer_depthwise" in paths_of(session, feeds)


PARAMETRIC = """
def qdw(uint8(N, C, H, W) X, int16(C, KH, KW) F, int32(C) B, float(C) S) -> (Y) {
    P(n, c, h, w) +=! (int32(X(n, c, h + r_kh, w + r_kw)) - 7) * int32(F(c, r_kh, r_kw))
    Y(n, c, h, w) = uint8(fmin(fmax(rint(float(P(n, c, h, w) + B(c)) * S(c)) + float(3), float(10)), float(250)))
}
"""


@pytest.mark.parametrize("specialize", [True, False], ids=["specialised", "parametric"])
def test_the_tc_form_with_sizes_known_only_at_run_time(specialize):
    """The form written in TC (valid windows, a 3 x 4 filter, output bounds narrower than
    uint8's, as a folded Clip makes them), against numpy's int64 sums and float32 scaling."""
    import polyc

    kernel = polyc.define(PARAMETRIC, specialize=specialize).qdw
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (2, 5, 9, 40)).astype(np.uint8)
    f = rng.integers(-255, 256, (5, 3, 4)).astype(np.int16)
    bias = rng.integers(-3000, 3000, 5).astype(np.int32)
    scale = rng.uniform(0.001, 0.02, 5).astype(np.float32)
    y = kernel(x, f, bias, scale)
    shifted = x.astype(np.int64) - 7
    sums = np.zeros((2, 5, 7, 37), np.int64)
    for i in range(3):
        for j in range(4):
            sums += shifted[:, :, i : i + 7, j : j + 37] * f[None, :, i, j, None, None]
    scaled = (sums + bias[None, :, None, None]).astype(np.float32) * scale[None, :, None, None]
    expected = np.clip(np.rint(scaled) + 3, 10, 250).astype(np.uint8)
    np.testing.assert_array_equal(y, expected)
    sizes = {"N": 2, "C": 5, "H": 9, "W": 40, "KH": 3, "KW": 4}
    assert kernel.stages(sizes).path == "integer_depthwise"
