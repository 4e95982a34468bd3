"""What the converter modules share: :class:`Node` (a node's identity and attributes),
:class:`Converter` (the base class, which picks a converter's ``_impl_vN`` for an opset), and the
small helpers several families use: an input that must be known when the model is compiled
(:func:`_require_const`), an axis checked (:func:`_axis`), one statement over broadcast inputs
(:func:`_elementwise`), the check for float tensors (:func:`_float_only`), and a number
(:func:`_number`) or an affine subscript (:func:`_affine`) in TC text.
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, broadcast_shape, indices


class Node:
    """An ONNX node's identity and attributes, as converters read them."""

    def __init__(self, proto, name: str):
        from onnx import helper

        self.proto = proto
        self.name = name
        self.op_type = proto.op_type
        self.attributes = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        self.outputs = list(proto.output)

    def attr(self, name: str, default=None):
        value = self.attributes.get(name, default)
        if isinstance(value, bytes):
            return value.decode()
        return value


class Converter:
    """Base class: finds the ``_impl_vN`` for an opset.  ``CONSTANT_INPUTS``: the input
    positions that must be known when the model is compiled (shapes, axes, pads, ...); a graph
    input feeding one is specialised on: its values, like the shapes, select the compiled plan."""

    CONSTANT_INPUTS: tuple[int, ...] = ()

    @classmethod
    def constant_inputs(cls, proto) -> tuple[int, ...]:
        """``CONSTANT_INPUTS`` for the node ``proto``; a converter whose replacement nodes take
        other inputs (their ``polyc_path``) says which of theirs must be known."""
        return cls.CONSTANT_INPUTS

    @classmethod
    def version_for(cls, opset: int) -> int | None:
        versions = [int(name[len("_impl_v") :]) for name in dir(cls) if name.startswith("_impl_v")]
        usable = [v for v in versions if v <= opset]
        return max(usable) if usable else None

    @classmethod
    def convert(cls, b: Builder, node: Node, inputs: list, opset: int) -> list[Value]:
        version = cls.version_for(opset)
        return getattr(cls, f"_impl_v{version}")(b, node, inputs)


def _require_const(b: Builder, value: Value | None, what: str) -> np.ndarray:
    if value is None:
        raise UnsupportedError(f"{b.where}: {what} is required")
    if value.const is None:
        raise UnsupportedError(
            f"{b.where}: {what} must be known when the model is compiled "
            "(a constant or computed from shapes), not computed at run time"
        )
    return value.const


def _axis(b: Builder, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise UnsupportedError(f"{b.where}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def _elementwise(b: Builder, inputs: list[Value], dtype, make_rhs) -> Value:
    """One output over the broadcast shape of ``inputs``; ``make_rhs(refs)`` gives the expression."""
    shape = broadcast_shape(b.where, *[v.shape for v in inputs])
    out = b.new(shape, dtype)
    idx = indices(len(shape))
    refs = [b.ref(v, b.broadcast_subscripts(v, shape, idx)) for v in inputs]
    b.emit([b.statement(out, idx, "=", make_rhs(refs))], inputs, [out], "elementwise")
    return out


def _float_only(b: Builder, value: Value) -> None:
    if value.dtype.kind != "f":
        raise UnsupportedError(f"{b.where}: {b.op_type} of {value.dtype} tensors is not supported (floats only)")


def _number(value: float) -> str:
    """``value`` as a TC literal; an attribute may hold an infinity or a NaN, which TC spells as
    divisions by zero (C computes them so: polyc never compiles with -ffast-math)."""
    value = float(value)
    if math.isnan(value):
        return "(0.0 / 0.0)"
    if math.isinf(value):
        return "(1.0 / 0.0)" if value > 0 else "(-1.0 / 0.0)"
    text = repr(value)
    return f"({text})" if value < 0 else text


def _affine(scale: int, index: str, offset: int) -> str:
    text = index if scale == 1 else f"{scale} * {index}" if scale > 0 else f"{offset} - {-scale} * {index}"
    if scale < 0:
        return text
    return f"{text} + {offset}" if offset > 0 else f"{text} - {-offset}" if offset else text
