"""onnxruntime's session arguments as polyc takes them: ``sess_options``' threads and graph
optimisation level are honoured, other providers are warned about, bad arguments are refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402


def linear_relu_model():
    weights = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])],
        [numpy_helper.from_array(weights, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), weights


def kernels_of(session, x):
    return [timing.kernel for timing in session.profile({"x": x}, repeat=1)]


def test_intra_op_threads_become_the_kernels_threads():
    model, weights = linear_relu_model()
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ponnx.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x})[0], np.maximum(x @ weights, 0), rtol=1e-5, atol=1e-6)
    assert {kernel.options.threads for kernel in kernels_of(session, x)} == {1}
    # An explicit threads= wins; onnxruntime's default (0) leaves polyc's (all cores).
    explicit = ponnx.InferenceSession(model, sess_options=options, threads=2)
    assert {kernel.options.threads for kernel in kernels_of(explicit, x)} == {2}
    default = ponnx.InferenceSession(model, sess_options=ort.SessionOptions())
    assert {kernel.options.threads for kernel in kernels_of(default, x)} == {None}


def test_disabling_graph_optimisations_turns_fusion_off():
    model, _ = linear_relu_model()
    x = np.ones((3, 8), np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = ponnx.InferenceSession(model, sess_options=options)
    assert unfused.graph_fusion is False and len(kernels_of(unfused, x)) == 2
    fused = ponnx.InferenceSession(model, sess_options=ort.SessionOptions())
    assert fused.graph_fusion is True and len(kernels_of(fused, x)) == 1
    assert ponnx.InferenceSession(model, sess_options=options, graph_fusion=True).graph_fusion is True


def test_another_provider_is_warned_about_and_the_session_runs_on_the_cpu():
    model, weights = linear_relu_model()
    with pytest.warns(polyc.PolycWarning, match="'CUDAExecutionProvider' are not used"):
        session = ponnx.InferenceSession(
            model, providers=[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
        )
    assert session.get_providers() == ["CPUExecutionProvider"]
    x = np.ones((3, 8), np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], np.maximum(x @ weights, 0), rtol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CPU provider alone: no warning
        ponnx.InferenceSession(model, providers=["CPUExecutionProvider"])


def test_settings_without_a_counterpart_are_warned_about():
    model, _ = linear_relu_model()
    options = ort.SessionOptions()
    options.enable_profiling = True
    with pytest.warns(polyc.PolycWarning, match="profile"):
        ponnx.InferenceSession(model, sess_options=options)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"sess_options": {"intra_op_num_threads": 2}}, "sess_options must be an onnxruntime.SessionOptions"),
        ({"providers": "CPUExecutionProvider"}, "providers must be a list"),
        ({"providers": [3]}, "3 is neither"),
        ({"providers": ["CPUExecutionProvider"], "provider_options": [{}, {}]}, "one dict per provider"),
    ],
    ids=["options-as-dict", "providers-as-string", "provider-not-a-name", "options-per-provider"],
)
def test_bad_arguments_are_refused(arguments, message):
    model, _ = linear_relu_model()
    with pytest.raises(polyc.PolycError, match=message):
        ponnx.InferenceSession(model, **arguments)
