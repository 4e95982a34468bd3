"""``polyc.onnx``: ONNX models compiled by polyc (see :mod:`polyc.frontends.onnx`).

Importing polyc does not import onnx; importing this module does.
"""

from polyc.frontends.onnx import InferenceSession, NodeArg, function_operators, supported_operators  # noqa: F401

__all__ = ["InferenceSession", "NodeArg", "function_operators", "supported_operators"]
