"""A real detector through polyc.onnx against onnxruntime: torchvision's Faster R-CNN
(MobileNetV3-Large 320 FPN, random weights rescaled so that its scores differ;
benchmarks/onnx_models/export.py), whose graph holds what planning in stages is for: NonZero
and TopK on counts from data, NonMaxSuppression (one per If branch), RoiAlign, and a
ScatterElements of whole rows.  Two images: their counts differ, so the session plans the
stages after them for each.  Tolerance: the backend tests' rtol 1e-3, atol 1e-4 (box corners
are pixels)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import polyc.onnx as ponnx  # noqa: E402
from benchmarks.onnx_models import load  # noqa: E402


def test_faster_rcnn_matches_onnxruntime_on_two_images():
    model = load("fasterrcnn")
    session = ponnx.InferenceSession(model)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (0, 1):
        image = np.random.default_rng(seed).random((3, 320, 320), dtype=np.float32)
        ours = session.run(None, {"images": image})
        theirs = reference.run(None, {"images": image})
        for name, got, expected in zip(("boxes", "labels", "scores"), ours, theirs, strict=True):
            assert got.shape == expected.shape and got.dtype == expected.dtype, name
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4, err_msg=name)
        assert len(ours[0]) > 0  # the rescaled weights give detections above the threshold
    assert len(session.plans()) > 2  # planned in stages
