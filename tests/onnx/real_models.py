"""The real models (benchmarks/onnx_models: torchvision CNNs and a BERT-style encoder with random
weights, exported once by hand with torch) through polyc.onnx against onnxruntime, at small
sizes (32x32 images, 8-token sequences), on the same session as the batch size changes.
Tolerance: onnx's backend test default, rtol 1e-3, with atol 1e-5 (outputs near zero)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import polyc.onnx as ponnx  # noqa: E402
from benchmarks.onnx_models import load  # noqa: E402

#: Feeds per model, in the order a session sees them (the batch changes between calls).
SHAPES = {
    "resnet18": [(2, 3, 32, 32), (1, 3, 32, 32)],
    "squeezenet1_1": [(1, 3, 32, 32)],
    "mobilenet_v2": [(1, 3, 32, 32)],
    "efficientnet_b0": [(2, 3, 32, 32), (1, 3, 32, 32)],
    "encoder": [(2, 8, 768), (1, 4, 768)],
}
#: Models whose compile time at two sizes exceeds the suite's budget (efficientnet_b0: 109 kernels
#: at each size, about 90 s on two cores, Intel Xeon): the suite runs them at their first size
#: only; POLYC_ONNX_ALL_MODELS=1 runs every size.
SLOW = {"efficientnet_b0"}


def shapes(name: str) -> list[tuple[int, ...]]:
    """The feeds ``check_model`` gives ``name``: all of SHAPES', or a slow model's first."""
    if name in SLOW and not os.environ.get("POLYC_ONNX_ALL_MODELS"):
        return SHAPES[name][:1]
    return SHAPES[name]


def check_model(name: str) -> None:
    model = load(name)
    session = ponnx.InferenceSession(model)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for number, shape in enumerate(shapes(name)):
        x = np.random.default_rng(number).standard_normal(shape).astype(np.float32)
        (got,) = session.run(None, {"input": x})
        (expected,) = reference.run(None, {"input": x})
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)
