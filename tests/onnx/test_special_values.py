"""NaN, +-inf and -0 through the activations and clamps, as onnxruntime computes them: Relu,
Sign, HardSigmoid and Clip keep a NaN (fmin/fmax would drop it), Relu and Clip keep -0, Clip
without a bound clamps to the type's largest finite value, Selu(-0) is +0."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402

SPECIAL = [np.nan, 1.0, -np.inf, np.inf, -0.0, 0.0, -2.5, 3.0, 7.0]
TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}


def both(nodes, x: np.ndarray, initializers=()):
    element = TYPES[x.dtype.type]
    graph = helper.make_graph(
        nodes,
        "special",
        [helper.make_tensor_value_info("x", element, list(x.shape))],
        [helper.make_tensor_value_info("y", element, None)],
        [numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return ours, theirs


def assert_same_values(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal, NaN where NaN, and the same sign of every zero."""
    np.testing.assert_array_equal(ours, theirs)  # (NaN equals NaN here)
    finite = ~np.isnan(theirs)
    np.testing.assert_array_equal(np.signbit(ours[finite]), np.signbit(theirs[finite]))


@pytest.mark.parametrize("op", ["Relu", "HardSigmoid", "Selu", "Sign"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float", "double"])
def test_activations_keep_nan_and_signed_zeros(op, dtype):
    if op in ("HardSigmoid", "Selu") and dtype == np.float64:
        pytest.skip(f"onnxruntime has no double {op} on the CPU")
    x = np.array([SPECIAL], dtype)
    ours, theirs = both([helper.make_node(op, ["x"], ["y"])], x)
    assert_same_values(ours, theirs)


def test_relu_of_nan_is_nan_and_not_zero():
    # The negative control of the comparison above: the old rule (x > 0 ? x : 0) gives 0.
    x = np.array([[np.nan, -0.0]], np.float32)
    ours, _ = both([helper.make_node("Relu", ["x"], ["y"])], x)
    assert np.isnan(ours[0, 0]) and np.signbit(ours[0, 1])
    with pytest.raises(AssertionError):
        assert_same_values(np.array([[0.0, 0.0]], np.float32), ours)


@pytest.mark.parametrize("dtype", list(TYPES), ids=["float", "double", "float16"])
@pytest.mark.parametrize("given", [("lo", "hi"), (), ("lo",), ("", "hi")], ids=["both", "none", "min", "max"])
def test_clip_keeps_nan_and_clamps_to_the_largest_finite_value(dtype, given):
    x = np.array([SPECIAL], dtype)
    bounds = [("lo", np.array(0, dtype)), ("hi", np.array(6, dtype))]
    ours, theirs = both([helper.make_node("Clip", ["x", *given], ["y"])], x, [b for b in bounds if b[0] in given])
    assert_same_values(ours, theirs)


def test_clip_before_opset_11_keeps_nan():
    x = np.array([SPECIAL], np.float32)
    node = helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=1.0)
    graph = helper.make_graph(
        [node],
        "clip6",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert_same_values(ours, theirs)


@pytest.mark.parametrize(
    "channels, kernel, group", [(16, 1, 1), (32, 3, 32), (16, 3, 1)], ids=["pointwise", "depthwise", "3x3"]
)
def test_nan_and_inf_images_through_conv_and_relu(channels, kernel, group):
    # Fused into the convolution kernels' epilogues, Relu keeps each NaN of onnxruntime's result.
    # (Winograd off: its tile transforms subtract neighbouring inputs, so an inf in a tile makes
    # NaN where a direct convolution makes +-inf; see the ONNX guide.)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, 12, 12)).astype(np.float32)
    x[0, :, 5, 5] = np.nan
    x[0, 0, 9, 9], x[0, 1, 2, 2] = np.inf, -np.inf
    w = rng.standard_normal((channels, channels // group, kernel, kernel)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[kernel // 2] * 4, group=group),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model, winograd=False).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.isnan(theirs).sum() > 0
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-4, atol=1e-4)
