"""ONNX models compiled by polyc: ``polyc.onnx.InferenceSession(model)`` as onnxruntime's.

- :mod:`.model`: loading (ModelProto, path, bytes), the checker, shape inference.
- :mod:`.ops`: one converter per operator, lowering it to TC statements (the registry).
- :mod:`.functions`: operators ONNX defines as functions, expanded into their bodies.
- :mod:`.lowering`: the values, steps and TC text converters build.
- :mod:`.plan`: per input shapes, constant folding, fusion into multi-statement defs, compilation.
- :mod:`.session`: the session API; :mod:`.backend`: onnx's backend interface (for its test suite).
"""

from polyc.frontends.onnx.functions import function_bodies
from polyc.frontends.onnx.ops import CONVERTERS, DOMAIN_CONVERTERS
from polyc.frontends.onnx.session import InferenceSession, KernelTime, NodeArg


def supported_operators() -> dict[str, list[int]]:
    """Operator -> the opsets at which polyc's converter changes (its ``_impl_vN`` versions);
    the operators of other domains named with their domain (``com.microsoft.QGemm``)."""
    qualified = {f"{domain}.{op}": c for domain, ops in DOMAIN_CONVERTERS.items() for op, c in ops.items()}
    return {
        op: sorted(int(n[len("_impl_v") :]) for n in dir(c) if n.startswith("_impl_v"))
        for op, c in sorted({**CONVERTERS, **qualified}.items())
    }


def function_operators() -> dict[str, list[int]]:
    """Operator -> the opsets of the bodies ONNX defines it by, for the operators polyc runs as
    those bodies (it has no converter for them).  A body built for a node runs when polyc
    converts the operators in it; a session names the operator and what its body lacks otherwise."""
    return {op: versions for op, versions in sorted(function_bodies().items()) if op not in CONVERTERS}


__all__ = ["InferenceSession", "KernelTime", "NodeArg", "function_operators", "supported_operators"]
