"""ONNX models compiled by polyc: ``polyc.onnx.InferenceSession(model)`` as onnxruntime's.

- :mod:`.model`: loading (ModelProto, path, bytes), the checker, shape inference.
- :mod:`.ops`: one converter per operator, lowering it to TC statements (the registry).
- :mod:`.lowering`: the values, steps and TC text converters build.
- :mod:`.plan`: per input shapes, constant folding, fusion into multi-statement defs, compilation.
- :mod:`.session`: the session API; :mod:`.backend`: onnx's backend interface (for its test suite).
"""
from polyc.frontends.onnx.ops import CONVERTERS
from polyc.frontends.onnx.session import InferenceSession, KernelTime, NodeArg


def supported_operators() -> dict[str, list[int]]:
    """Operator -> the opsets at which polyc's converter changes (its ``_impl_vN`` versions)."""
    return {op: sorted(int(n[len("_impl_v"):]) for n in dir(c) if n.startswith("_impl_v"))
            for op, c in sorted(CONVERTERS.items())}


__all__ = ["InferenceSession", "KernelTime", "NodeArg", "supported_operators"]
