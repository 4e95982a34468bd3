"""onnx's BackendTest on polyc.onnx.backend: the model groups whose data ships with the onnx wheel
(onnx/backend/test/data): PyTorchConverted (82 models exported by PyTorch, most of them at
opset 6, which polyc brings to opset 7 with onnx's version converter), PyTorchOperator (35) and
Simple (23), each compared with its stored outputs at the runner's tolerances.  The node tests
run from onnx's generators instead (node_suite.py: the wheel has no node data), the real models
in test_light_models.py.

A model is skipped only when it uses an operator of DECLINED, for the reason given there.
"""

from __future__ import annotations

import unittest

import pytest

onnx = pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402, F811

from polyc.frontends.onnx import backend  # noqa: E402

#: Operators polyc declines on purpose, with why (the models of the Simple group that use them).
DECLINED = {
    **dict.fromkeys(
        [
            "SequenceEmpty",
            "SequenceInsert",
            "SequenceAt",
            "SequenceConstruct",
            "SequenceErase",
            "SequenceLength",
            "SplitToSequence",
            "ConcatFromSequence",
        ],
        "a sequence of tensors: polyc compiles tensors only",
    ),
    "StringNormalizer": "strings: polyc computes numbers and booleans",
    "Gradient": "a training operator (ai.onnx.preview.training): polyc compiles models for inference",
}

GROUPS = ("OnnxBackendPyTorchConvertedModelTest", "OnnxBackendPyTorchOperatorModelTest", "OnnxBackendSimpleModelTest")


class _Backend(backend.PolycBackend):
    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        declined = sorted({node.op_type for node in model.graph.node if node.op_type in DECLINED})
        if declined:
            raise unittest.SkipTest(f"operator {', '.join(declined)}: {DECLINED[declined[0]]}")
        return super().prepare(model, device, **kwargs)


_tests = onnx.backend.test.BackendTest(_Backend, __name__)
_tests.include(r"_cpu$")
globals().update({name: case for name, case in _tests.test_cases.items() if name in GROUPS})
