"""onnx's own real models ("light": their weights made by ConstantOfShape nodes) through
polyc.onnx, against onnxruntime on the same input.

Only squeezenet runs in the suite: each model compiles one kernel per fused group, and the
others (alexnet, densenet121, inception v1/v2, resnet50, shufflenet, vgg19, zfnet512) at their
224x224 inputs would take the suite's budget several times over.  Run them by hand with
``POLYC_ONNX_LIGHT_MODELS=all``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import polyc.onnx as ponnx  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
ALL = (
    sorted(name[len("light_") : -len(".onnx")] for name in os.listdir(DATA) if name.endswith(".onnx"))
    if os.path.isdir(DATA)
    else []
)
IN_SUITE = {"squeezenet"}


@pytest.mark.parametrize("name", ALL)
def test_light_model_matches_onnxruntime(name):
    if name not in IN_SUITE and os.environ.get("POLYC_ONNX_LIGHT_MODELS") != "all":
        pytest.skip("compile time: set POLYC_ONNX_LIGHT_MODELS=all to run it (see the module docstring)")
    model = onnx.load(os.path.join(DATA, f"light_{name}.onnx"))
    session = ponnx.InferenceSession(model)
    (arg,) = session.get_inputs()
    x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in arg.shape]).astype(np.float32)
    got = session.run(None, {arg.name: x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {arg.name: x}
    )
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-7)
