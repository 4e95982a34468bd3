"""ONNX operators as TC: one converter class per operator, one ``_impl_vN`` per opset change.

A converter's ``_impl_vN(b, node, inputs)`` gets a :class:`~polyc.frontends.onnx.lowering.Builder`,
the node's attributes (``node.attr(name, default)``) and its inputs as
:class:`~polyc.frontends.onnx.lowering.Value` s (None for an omitted optional input), and returns
its outputs as values.  The version used is the newest ``N`` not above the model's opset.
Adding an operator is adding a class and a line in :data:`CONVERTERS`.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from polyc.errors import SignatureError, UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, broadcast_shape, indices, tc_type


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
    def version_for(cls, opset: int) -> int | None:
        versions = [int(name[len("_impl_v"):]) for name in dir(cls) if name.startswith("_impl_v")]
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
        raise UnsupportedError(f"{b.where}: {what} must be known when the model is compiled "
                               "(a constant or computed from shapes), not computed at run time")
    return value.const


def _axis(b: Builder, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise UnsupportedError(f"{b.where}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


# ----------------------------------------------------------------------------- elementwise
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


def _unary(expression: str, floats_only: bool = True):
    class Unary(Converter):
        @staticmethod
        def _impl_v1(b, node, inputs):
            (x,) = inputs[:1]
            if floats_only:
                _float_only(b, x)
            return [_elementwise(b, [x], x.dtype, lambda r: expression.format(x=r[0]))]
    return Unary


def _binary(operator: str, result_bool: bool = False, function: bool = False):
    class Binary(Converter):
        @staticmethod
        def _impl_v1(b, node, inputs):
            a, c = inputs[:2]
            if a.dtype != c.dtype:
                raise UnsupportedError(f"{b.where}: operands of types {a.dtype} and {c.dtype}")
            dtype = np.bool_ if result_bool else a.dtype
            if function:
                return [_elementwise(b, [a, c], dtype, lambda r: f"{operator}({r[0]}, {r[1]})")]
            return [_elementwise(b, [a, c], dtype, lambda r: f"({r[0]} {operator} {r[1]})")]
    return Binary


def _integer_elementwise(b, inputs, function: str) -> Value:
    """``function`` (a builtin on integers) of the operands, numpy broadcasting."""
    operands = [v for v in inputs if v is not None]
    for value in operands:
        if value.dtype.kind not in "iu":
            raise UnsupportedError(f"{b.where}: {b.op_type} of {value.dtype} tensors (integers only)")
    if len({v.dtype for v in operands}) > 1:
        raise UnsupportedError(f"{b.where}: operands of types {' and '.join(str(v.dtype) for v in operands)}")
    return _elementwise(b, operands, operands[0].dtype, lambda r: f"{function}({', '.join(r)})")


def _bitwise(function: str):
    """BitwiseAnd, BitwiseOr, BitwiseXor and BitwiseNot."""
    class Bitwise(Converter):
        @staticmethod
        def _impl_v18(b, node, inputs):
            return [_integer_elementwise(b, inputs, function)]
    return Bitwise


class BitShift(Converter):
    """x shifted by y bits (unsigned types), LEFT or RIGHT as ``direction`` says; by a count at
    or beyond the width, 0."""

    @staticmethod
    def _impl_v11(b, node, inputs):
        direction = node.attr("direction", "")
        if direction not in ("LEFT", "RIGHT"):
            raise UnsupportedError(f"{b.where}: direction {direction!r} (LEFT or RIGHT)")
        return [_integer_elementwise(b, inputs, "shl" if direction == "LEFT" else "shr")]


def _variadic(combine: str, mean: bool = False):
    class Variadic(Converter):
        @staticmethod
        def _impl_v1(b, node, inputs):
            values = [v for v in inputs if v is not None]

            def rhs(refs):
                text = refs[0]
                for r in refs[1:]:
                    text = f"{combine}({text}, {r})" if combine.isalpha() else f"({text} {combine} {r})"
                return f"({text}) / {len(refs)}" if mean else text
            return [_elementwise(b, values, values[0].dtype, rhs)]
    return Variadic


def _number(value: float) -> str:
    text = repr(float(value))
    return f"({text})" if value < 0 else text


class LeakyRelu(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha = _number(node.attr("alpha", 0.01))
        return [_elementwise(b, inputs[:1], inputs[0].dtype, lambda r: f"({r[0]} >= 0 ? {r[0]} : {r[0]} * {alpha})")]


class Shrink(Converter):
    """x + bias below -lambd, x - bias above lambd, 0 between (soft shrinkage when bias is
    lambd, hard when it is 0)."""

    @staticmethod
    def _impl_v9(b, node, inputs):
        x = inputs[0]
        lambd, bias = _number(node.attr("lambd", 0.5)), _number(node.attr("bias", 0.0))
        return [_elementwise(b, [x], x.dtype, lambda r: f"({r[0]} < -{lambd} ? {r[0]} + {bias} : "
                                                        f"({r[0]} > {lambd} ? {r[0]} - {bias} : 0))")]


class Elu(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha = _number(node.attr("alpha", 1.0))
        return [_elementwise(b, inputs[:1], inputs[0].dtype,
                             lambda r: f"({r[0]} >= 0 ? {r[0]} : {alpha} * expm1({r[0]}))")]


class Selu(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha = _number(node.attr("alpha", 1.67326319217681884765625))
        gamma = _number(node.attr("gamma", 1.05070102214813232421875))
        return [_elementwise(b, inputs[:1], inputs[0].dtype,
                             lambda r: f"{gamma} * ({r[0]} > 0 ? {r[0]} : {alpha} * expm1({r[0]}))")]


class HardSigmoid(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha, beta = _number(node.attr("alpha", 0.2)), _number(node.attr("beta", 0.5))
        return [_elementwise(b, inputs[:1], inputs[0].dtype,
                             lambda r: f"fmax(0, fmin(1, {alpha} * {r[0]} + {beta}))")]


class Gelu(Converter):
    @staticmethod
    def _impl_v20(b, node, inputs):
        (x,) = inputs[:1]
        _float_only(b, x)
        if node.attr("approximate", "none") == "tanh":
            return [_elementwise(b, [x], x.dtype, lambda r: (
                f"0.5 * {r[0]} * (1 + tanh(0.7978845608028654 * ({r[0]} + 0.044715 * {r[0]} * {r[0]} * {r[0]})))"))]
        return [_elementwise(b, [x], x.dtype, lambda r: f"0.5 * {r[0]} * (1 + erf({r[0]} * 0.7071067811865476))")]


class PRelu(Converter):
    @staticmethod
    def _impl_v7(b, node, inputs):  # v7 brought numpy (unidirectional) broadcasting; v9 and v16 only types
        x, slope = inputs[:2]
        return [_elementwise(b, [x, slope], x.dtype, lambda r: f"({r[0]} >= 0 ? {r[0]} : {r[0]} * {r[1]})")]


class Clip(Converter):
    @staticmethod
    def _impl_v6(b, node, inputs):
        x = inputs[0]
        lo, hi = node.attr("min", -3.4028234663852886e38), node.attr("max", 3.4028234663852886e38)
        return [_elementwise(b, [x], x.dtype, lambda r: f"fmin(fmax({r[0]}, {_number(lo)}), {_number(hi)})")]

    @staticmethod
    def _impl_v11(b, node, inputs):
        x = inputs[0]
        bounds = [v for v in inputs[1:3]]
        values = [x] + [v for v in bounds if v is not None]

        def rhs(refs):
            text, k = refs[0], 1
            generic = "max" if x.dtype.kind in "iu" else "fmax"
            for position, bound in enumerate(bounds):
                if bound is None:
                    continue
                function = generic if position == 0 else generic.replace("max", "min")
                text = f"{function}({text}, {refs[k]})"
                k += 1
            return text
        return [_elementwise(b, values, x.dtype, rhs)]


class Pow(Converter):
    """x ** y; the exponent may have another type (converted); integers are powered in double."""

    @staticmethod
    def _impl_v7(b, node, inputs):
        x, y = inputs[:2]
        if x.dtype.kind == "f":
            exponent = (lambda r: r) if y.dtype == x.dtype else (lambda r: f"{tc_type(x.dtype)}({r})")
            return [_elementwise(b, [x, y], x.dtype, lambda r: f"pow({r[0]}, {exponent(r[1])})")]
        return [_elementwise(b, [x, y], x.dtype,
                             lambda r: f"{tc_type(x.dtype)}(pow(double({r[0]}), double({r[1]})))")]


class Sign(Converter):
    @staticmethod
    def _impl_v9(b, node, inputs):
        (x,) = inputs[:1]
        t = tc_type(x.dtype)
        return [_elementwise(b, [x], x.dtype, lambda r: f"({r[0]} > 0 ? {t}(1) : ({r[0]} < 0 ? {t}(-1) : {t}(0)))")]


class Mod(Converter):
    """Integers: the remainder with the divisor's sign (``fmod=0``, as Python's ``%``); floats
    (``fmod=1``): C's fmod, with the dividend's sign."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        a, c = inputs[:2]
        if node.attr("fmod", 0):
            if a.dtype.kind != "f":
                return [_elementwise(b, [a, c], a.dtype, lambda r: f"({r[0]} % {r[1]})")]
            return [_elementwise(b, [a, c], a.dtype, lambda r: f"fmod({r[0]}, {r[1]})")]
        if a.dtype.kind == "f":  # as numpy.mod: the divisor's sign, zeros included
            def float_mod(r):
                rem = f"fmod({r[0]}, {r[1]})"
                moved = f"(({rem} != 0 && ({rem} < 0) != ({r[1]} < 0)) ? {rem} + {r[1]} : {rem})"
                return f"({rem} == 0 ? copysign({rem}, {r[1]}) : {moved})"
            return [_elementwise(b, [a, c], a.dtype, float_mod)]

        def python_mod(r):
            rem = f"({r[0]} % {r[1]})"
            return f"(({rem} != 0 && ({rem} < 0) != ({r[1]} < 0)) ? {rem} + {r[1]} : {rem})"
        return [_elementwise(b, [a, c], a.dtype, python_mod)]


class IsNaN(Converter):
    @staticmethod
    def _impl_v9(b, node, inputs):
        (x,) = inputs[:1]
        _float_only(b, x)
        # Only a NaN differs from itself (polyc's C flags keep IEEE comparisons: no fast-math).
        return [_elementwise(b, [x], np.bool_, lambda r: f"({r[0]} != {r[0]})")]


class IsInf(Converter):
    @staticmethod
    def _impl_v10(b, node, inputs):
        (x,) = inputs[:1]
        _float_only(b, x)
        positive, negative = node.attr("detect_positive", 1), node.attr("detect_negative", 1)

        def rhs(r):
            # x - x is 0 for every finite x and NaN for an infinity (or a NaN, which x == x
            # excludes): no constant for the largest value of each float type is needed.
            infinite = f"({r[0]} == {r[0]} && {r[0]} - {r[0]} != {r[0]} - {r[0]})"
            if positive and negative:
                return infinite
            if positive:
                return f"({infinite} && {r[0]} > 0)"
            if negative:
                return f"({infinite} && {r[0]} < 0)"
            return f"({r[0]} != {r[0]} && {r[0]} == {r[0]})"  # neither: false everywhere
        return [_elementwise(b, [x], np.bool_, rhs)]


def _swish(x: str, alpha: float) -> str:
    """``x * sigmoid(alpha * x)`` as one quotient."""
    scaled = x if alpha == 1.0 else f"{_number(alpha)} * {x}"
    return f"{x} / (1 + exp(-({scaled})))"


class Swish(Converter):
    """``x * sigmoid(alpha * x)`` (opset 24; SiLU where alpha is 1)."""

    @staticmethod
    def _impl_v24(b, node, inputs):
        (x,) = inputs[:1]
        _float_only(b, x)
        alpha = float(node.attr("alpha", 1.0))
        return [_elementwise(b, [x], x.dtype, lambda r: _swish(r[0], alpha))]


class SwiGLU(Converter):
    """``Swish_alpha(A) * B`` of two inputs of one shape (opset 28): a gated projection's
    activation, as Llama-style feed-forward blocks use it."""

    @staticmethod
    def _impl_v28(b, node, inputs):
        gate, value = inputs[:2]
        _float_only(b, gate)
        if gate.shape != value.shape or gate.dtype != value.dtype:
            raise UnsupportedError(f"{b.where}: SwiGLU's inputs must have one shape and type (got "
                                   f"{list(gate.shape)} {gate.dtype} and {list(value.shape)} {value.dtype})")
        alpha = float(node.attr("alpha", 1.0))
        return [_elementwise(b, [gate, value], gate.dtype, lambda r: f"{_swish(r[0], alpha)} * {r[1]}")]


class Where(Converter):
    @staticmethod
    def _impl_v9(b, node, inputs):
        condition, x, y = inputs[:3]
        return [_elementwise(b, [condition, x, y], x.dtype, lambda r: f"({r[0]} ? {r[1]} : {r[2]})")]


class Not(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [_elementwise(b, inputs[:1], np.bool_, lambda r: f"!{r[0]}")]


def _cast(b: Builder, x: Value, to) -> Value:
    if to == x.dtype:
        return b.view(x, x.shape)  # a value of its own: the node's output may be a graph output
    if x.const is not None:
        return b.const(x.const.astype(to))
    if to == np.bool_:
        return _elementwise(b, [x], to, lambda r: f"{r[0]} != 0")
    return _elementwise(b, [x], to, lambda r: f"{tc_type(to)}({r[0]})")


class Cast(Converter):
    @staticmethod
    def _impl_v6(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype
        to = numpy_dtype(node.attr("to"))
        if to is None:
            raise UnsupportedError(f"{b.where}: Cast to element type {node.attr('to')} is not supported")
        return [_cast(b, inputs[0], to)]


class CastLike(Converter):
    """Cast to the element type of the second input (whose values are not read); onnx's
    function bodies use it to make a constant the type of the operand, as in Relu's."""

    @staticmethod
    def _impl_v15(b, node, inputs):
        return [_cast(b, inputs[0], inputs[1].dtype)]


class Identity(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [b.view(inputs[0], inputs[0].shape)]


class Dropout(Converter):
    """Inference: the input unchanged, and a mask of ones when asked for."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        training = inputs[2] if len(inputs) > 2 else None
        if training is not None and (training.const is None or bool(training.const.reshape(-1)[0])):
            raise UnsupportedError(f"{b.where}: Dropout in training mode (polyc runs inference)")
        out = [b.view(inputs[0], inputs[0].shape)]
        if len(node.outputs) > 1 and node.outputs[1]:
            out.append(b.const(np.ones(inputs[0].shape, np.bool_)))
        return out


# ----------------------------------------------------------------------------- shapes and views
class Shape(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        shape = np.array(inputs[0].shape, np.int64)
        start, end = node.attr("start", 0), node.attr("end", None)
        return [b.const(shape[start:end])]


class Size(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [b.const(np.array(inputs[0].size, np.int64))]


class Constant(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        from onnx import numpy_helper
        for name, value in node.attributes.items():
            if name == "value":
                return [b.const(numpy_helper.to_array(value))]
            if name == "value_float":
                return [b.const(np.array(value, np.float32))]
            if name == "value_floats":
                return [b.const(np.array(value, np.float32))]
            if name == "value_int":
                return [b.const(np.array(value, np.int64))]
            if name == "value_ints":
                return [b.const(np.array(value, np.int64))]
        raise UnsupportedError(f"{b.where}: Constant with attribute {', '.join(node.attributes)}")


class ConstantOfShape(Converter):
    CONSTANT_INPUTS = (0,)

    @staticmethod
    def _impl_v9(b, node, inputs):
        from onnx import numpy_helper
        shape = _require_const(b, inputs[0], "the shape")
        value = node.attributes.get("value")
        fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
        return [b.const(np.full(tuple(int(d) for d in shape), fill[0], dtype=fill.dtype))]


class Range(Converter):
    CONSTANT_INPUTS = (0, 1, 2)

    @staticmethod
    def _impl_v11(b, node, inputs):
        start, limit, delta = (_require_const(b, v, name).reshape(()) for v, name in
                               zip(inputs[:3], ("start", "limit", "delta")))
        count = max(int(math.ceil((limit - start) / delta)), 0)
        return [b.const((start + np.arange(count) * delta).astype(start.dtype))]


class Reshape(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _shape(b, x, target, allowzero=0):
        target = [int(d) for d in target]
        shape = []
        for position, d in enumerate(target):
            shape.append(x.shape[position] if d == 0 and not allowzero else d)
        if shape.count(-1) > 1:
            raise UnsupportedError(f"{b.where}: more than one -1 in the target shape {target}")
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape[shape.index(-1)] = x.size // known if known else 0
        return shape

    @staticmethod
    def _impl_v5(b, node, inputs):
        x, target = inputs[:2]
        return [b.view(x, Reshape._shape(b, x, _require_const(b, target, "the shape"), node.attr("allowzero", 0)))]


class Flatten(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        axis = node.attr("axis", 1)
        axis = axis + x.rank if axis < 0 else axis
        return [b.view(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


class Squeeze(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _squeeze(b, x, axes):
        if axes is None:
            return [b.view(x, [d for d in x.shape if d != 1])]
        axes = {_axis(b, int(a), x.rank) for a in axes}
        return [b.view(x, [d for i, d in enumerate(x.shape) if i not in axes])]

    @staticmethod
    def _impl_v1(b, node, inputs):
        return Squeeze._squeeze(b, inputs[0], node.attr("axes"))

    @staticmethod
    def _impl_v13(b, node, inputs):
        axes = inputs[1] if len(inputs) > 1 else None
        return Squeeze._squeeze(b, inputs[0], None if axes is None else _require_const(b, axes, "axes"))


class Unsqueeze(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _unsqueeze(b, x, axes):
        axes = np.asarray(axes).reshape(-1)  # (onnx's AffineGrid body gives one axis as a scalar)
        rank = x.rank + len(axes)
        axes = sorted(a % rank for a in (int(a) for a in axes))
        shape = list(x.shape)
        for a in axes:
            shape.insert(a, 1)
        return [b.view(x, shape)]

    @staticmethod
    def _impl_v1(b, node, inputs):
        return Unsqueeze._unsqueeze(b, inputs[0], node.attr("axes"))

    @staticmethod
    def _impl_v13(b, node, inputs):
        return Unsqueeze._unsqueeze(b, inputs[0], _require_const(b, inputs[1], "axes"))


def transposed(b, x, perm) -> Value:
    """``x`` with its dimensions in ``perm``'s order (a copy)."""
    out = b.new([x.shape[p] for p in perm], x.dtype)
    idx = indices(x.rank)
    source = [None] * x.rank
    for position, p in enumerate(perm):
        source[p] = idx[position]
    b.emit([b.statement(out, idx, "=", b.ref(x, source))], [x], [out], "other")
    return out


class Transpose(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        return [transposed(b, x, node.attr("perm") or list(reversed(range(x.rank))))]


def _blocks(b, node, x, channels_divisible: bool) -> tuple[int, ...]:
    """(N, C, H, W, block size) of a DepthToSpace or SpaceToDepth, checked."""
    size = int(node.attr("blocksize", 0))
    if x.rank != 4 or size < 1:
        raise UnsupportedError(f"{b.where}: needs a 4-D input and a blocksize of at least 1 "
                               f"(got shape {x.shape}, blocksize {size})")
    n, c, h, w = x.shape
    if channels_divisible and c % (size * size):
        raise UnsupportedError(f"{b.where}: {c} channels are not a multiple of blocksize^2 = {size * size}")
    if not channels_divisible and (h % size or w % size):
        raise UnsupportedError(f"{b.where}: height and width {h} x {w} are not multiples of the blocksize {size}")
    return n, c, h, w, size


class DepthToSpace(Converter):
    """Channels into blocks of pixels: a view, a transposition and a view."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        n, c, h, w, size = _blocks(b, node, x, True)
        depth = c // (size * size)
        if node.attr("mode", "DCR") == "CRD":  # channel, then the block's row and column
            blocks = transposed(b, b.view(x, (n, depth, size, size, h, w)), [0, 1, 4, 2, 5, 3])
        else:  # DCR: the block's row and column, then the channel
            blocks = transposed(b, b.view(x, (n, size, size, depth, h, w)), [0, 3, 4, 1, 5, 2])
        return [b.view(blocks, (n, depth, h * size, w * size))]


class SpaceToDepth(Converter):
    """Blocks of pixels into channels: the inverse of DepthToSpace in the same mode (opset 28
    brought CRD to SpaceToDepth too)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        n, c, h, w, size = _blocks(b, node, x, False)
        crd = node.attr("mode", "DCR") == "CRD"  # channel, then the block's row and column
        perm = [0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4]
        blocks = transposed(b, b.view(x, (n, c, h // size, size, w // size, size)), perm)
        return [b.view(blocks, (n, c * size * size, h // size, w // size))]


class Expand(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v8(b, node, inputs):
        x, shape = inputs[:2]
        target = tuple(int(d) for d in _require_const(b, shape, "the shape"))
        out_shape = broadcast_shape(b.where, x.shape, target)
        out = b.new(out_shape, x.dtype)
        idx = indices(len(out_shape))
        b.emit([b.statement(out, idx, "=", b.ref(x, b.broadcast_subscripts(x, out_shape, idx)))], [x], [out],
               "elementwise")
        return [out]


#: The most values one statement of a concatenation reads (a tree of them for more: each
#: element tests which value it comes from).
CONCAT_FAN_IN = 8


def _concatenate(b, values: list, axis: int) -> Value:
    total = sum(v.shape[axis] for v in values)
    shape = list(values[0].shape)
    shape[axis] = total
    out = b.new(shape, values[0].dtype)
    idx = indices(len(shape))
    offsets, start = [], 0
    for v in values:
        offsets.append(start)
        start += v.shape[axis]

    def piece(k: int) -> str:
        subscripts = list(idx)
        if offsets[k]:
            subscripts[axis] = f"{idx[axis]} - {offsets[k]}"
        return b.ref(values[k], subscripts)
    rhs = piece(len(values) - 1)
    for k in range(len(values) - 2, -1, -1):
        rhs = f"({idx[axis]} < {offsets[k + 1]} ? {piece(k)} : {rhs})"
    b.emit([b.statement(out, idx, "=", rhs)], values, [out], "other")
    return out


def concatenated(b, values: list, axis: int) -> Value:
    """``values`` joined along ``axis``: by one statement, or for more than
    :data:`CONCAT_FAN_IN` a tree of them (a recurrent layer's time steps)."""
    while len(values) > CONCAT_FAN_IN:
        values = [_concatenate(b, values[k:k + CONCAT_FAN_IN], axis) if len(values[k:k + CONCAT_FAN_IN]) > 1
                  else values[k] for k in range(0, len(values), CONCAT_FAN_IN)]
    return _concatenate(b, values, axis) if len(values) > 1 else b.view(values[0], values[0].shape)


class Concat(Converter):
    @staticmethod
    def _impl_v4(b, node, inputs):
        given = [v for v in inputs if v is not None]
        axis = _axis(b, node.attr("axis"), given[0].rank)
        shape = list(given[0].shape)
        shape[axis] = sum(v.shape[axis] for v in given)
        if any(v.rank != len(shape) or any(e != shape[d] for d, e in enumerate(v.shape) if d != axis) for v in given):
            raise UnsupportedError(f"{b.where}: cannot concatenate shapes {', '.join(str(v.shape) for v in given)} "
                                   f"along axis {axis}")
        if math.prod(shape) == 0:  # (empty parts still count along the axis)
            return [b.const(np.zeros(shape, given[0].dtype))]
        return [concatenated(b, [v for v in given if v.size > 0], axis)]


class Split(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _split(b, node, x, sizes):
        axis = _axis(b, node.attr("axis", 0), x.rank)
        count = len(node.outputs)
        if sizes is None:
            extent = x.shape[axis]
            chunk = -(-extent // count)
            sizes = [min(chunk, extent - k * chunk) for k in range(count)]
        # Along the outermost axis of extent above one, each part is a contiguous run of x.
        contiguous = all(outer == 1 for outer in x.shape[:axis])
        outputs, start = [], 0
        for size in sizes:
            shape = list(x.shape)
            shape[axis] = int(size)
            if contiguous:
                outputs.append(b.part(x, shape, start * math.prod(x.shape[axis + 1:])))
                start += int(size)
                continue
            out = b.new(shape, x.dtype)
            idx = indices(x.rank)
            subscripts = list(idx)
            if start:
                subscripts[axis] = f"{idx[axis]} + {start}"
            b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x], [out], "other")
            outputs.append(out)
            start += int(size)
        return outputs

    @staticmethod
    def _impl_v2(b, node, inputs):
        return Split._split(b, node, inputs[0], node.attr("split"))

    @staticmethod
    def _impl_v13(b, node, inputs):
        sizes = inputs[1] if len(inputs) > 1 else None
        return Split._split(b, node, inputs[0], None if sizes is None else _require_const(b, sizes, "split"))


class Slice(Converter):
    CONSTANT_INPUTS = (1, 2, 3, 4)

    @staticmethod
    def _impl_v1(b, node, inputs):
        """Before opset 10, starts, ends and axes were attributes (and there were no steps)."""
        starts, ends = node.attr("starts"), node.attr("ends")
        if starts is None or ends is None:
            raise UnsupportedError(f"{b.where}: Slice without its starts or ends attribute")
        axes = node.attr("axes", list(range(len(starts))))
        return Slice._impl_v10(b, node, [inputs[0]] + [b.const(np.asarray(v, np.int64)) for v in (starts, ends, axes)])

    @staticmethod
    def _impl_v10(b, node, inputs):
        x = inputs[0]
        starts = _require_const(b, inputs[1], "starts")
        ends = _require_const(b, inputs[2], "ends")
        axes = _require_const(b, inputs[3], "axes") if len(inputs) > 3 and inputs[3] is not None \
            else np.arange(len(starts))
        steps = _require_const(b, inputs[4], "steps") if len(inputs) > 4 and inputs[4] is not None \
            else np.ones(len(starts), np.int64)
        first, step = [0] * x.rank, [1] * x.rank
        shape = list(x.shape)
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = _axis(b, int(a), x.rank)
            if int(st) == 0:
                raise UnsupportedError(f"{b.where}: a step of 0")
            big = np.iinfo(np.int64).max
            start, stop, stride = slice(int(max(min(s, big), -big)), int(max(min(e, big), -big)),
                                        int(st)).indices(x.shape[a])
            first[a], step[a] = start, stride
            shape[a] = len(range(start, stop, stride))
        if x.const is not None:
            view = x.const[tuple(slice(f, f + st * n if st > 0 else (f + st * n if f + st * n >= 0 else None), st)
                                 for f, st, n in zip(first, step, shape))]
            return [b.const(np.ascontiguousarray(view))]
        out = b.new(shape, x.dtype)
        idx = indices(x.rank)
        subscripts = [_affine(st, i, f) for st, i, f in zip(step, idx, first)]
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x], [out], "other")
        return [out]


def _affine(scale: int, index: str, offset: int) -> str:
    text = index if scale == 1 else f"{scale} * {index}" if scale > 0 else f"{offset} - {-scale} * {index}"
    if scale < 0:
        return text
    return f"{text} + {offset}" if offset > 0 else f"{text} - {-offset}" if offset else text


class Gather(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        x, which = inputs[:2]
        axis = _axis(b, node.attr("axis", 0), x.rank)
        if which.const is not None:
            which = b.const(np.where(which.const < 0, which.const + x.shape[axis], which.const).astype(np.int64))
        if x.const is not None and which.const is not None:
            return [b.const(np.take(x.const, which.const, axis=axis))]
        shape = list(x.shape[:axis]) + list(which.shape) + list(x.shape[axis + 1:])
        out = b.new(shape, x.dtype)
        idx = indices(len(shape))
        inner = idx[axis:axis + which.rank]
        position = b.ref(which, inner) if which.shape else b.ref(which, [])
        if which.const is None:  # negative indices count from the end
            position = f"({position} < 0 ? {position} + {x.shape[axis]} : {position})"
        subscripts = idx[:axis] + [position] + idx[axis + which.rank:]
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x, which], [out], "other")
        return [out]


def _wrapped(b: Builder, which: Value, subscripts, extent: int) -> str:
    """An index tensor's element at ``subscripts``, a negative index counted from ``extent``."""
    position = b.ref(which, subscripts)
    return f"({position} < 0 ? {position} + {extent} : {position})"


class RoiAlign(Converter):
    """Each box's feature map pooled to a fixed grid: every bin averages (or takes the largest
    of) ``sampling_ratio`` x ``sampling_ratio`` bilinear samples, as onnx's reference (Mask
    R-CNN's RoIAlign).  One kernel finds, per box, each sample row's and column's two pixels,
    its fraction and whether it falls on the map; a second gathers and weighs them from the
    box's image.  An adaptive ``sampling_ratio`` (0, a count from each box's size) is not
    supported: the number of samples would depend on the data."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        return RoiAlign._align(b, node, inputs, node.attr("coordinate_transformation_mode", "output_half_pixel"))

    @staticmethod
    def _impl_v16(b, node, inputs):
        return RoiAlign._align(b, node, inputs, node.attr("coordinate_transformation_mode", "half_pixel"))

    @staticmethod
    def _align(b, node, inputs, transformation: str):
        x, boxes, batch_of = inputs[:3]
        _float_only(b, x)
        grid = int(node.attr("sampling_ratio", 0))
        mode = node.attr("mode", "avg")
        if grid <= 0:
            raise UnsupportedError(f"{b.where}: sampling_ratio {grid}: an adaptive count of samples (from each box's "
                                   f"size) is not supported; give a positive sampling_ratio")
        if mode not in ("avg", "max") or transformation not in ("half_pixel", "output_half_pixel"):
            raise UnsupportedError(f"{b.where}: mode {mode!r} (avg or max) and coordinate_transformation_mode "
                                   f"{transformation!r} (half_pixel or output_half_pixel)")
        if x.rank != 4 or boxes.rank != 2 or boxes.shape[1] != 4 or batch_of.shape != (boxes.shape[0],):
            raise UnsupportedError(f"{b.where}: an input of shape {x.shape}, boxes {boxes.shape} and batch indices "
                                   f"{batch_of.shape} (expected (N, C, H, W), (R, 4) and (R,))")
        rows, columns = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
        scale = float(node.attr("spatial_scale", 1.0))
        shift = 0.5 if transformation == "half_pixel" else 0.0
        count = boxes.shape[0]
        t = tc_type(x.dtype)
        statements, tables = [], []
        for axis, bins, extent in ((1, rows, x.shape[2]), (0, columns, x.shape[3])):
            begin = f"({b.ref(boxes, ['k', str(axis)])} * {_number(scale)} - {_number(shift)})"
            size = f"({b.ref(boxes, ['k', str(axis + 2)])} * {_number(scale)} - {_number(shift)} - {begin})"
            if not shift:
                size = f"fmax({size}, 1)"  # a malformed box is 1 x 1
            step = f"({size} / {bins})"
            sample = f"({begin} + p * {step} + (g + 0.5) * {step} / {grid})"
            on_map = f"({sample} >= -1 && {sample} <= {extent})"
            clamped = f"fmax({sample}, 0)"
            last = f"int64({clamped}) >= {extent - 1}"
            low, high, fraction, valid = (b.new([count, bins, grid], dtype) for dtype in
                                          (np.int64, np.int64, x.dtype, x.dtype))
            statements += [
                b.statement(low, ["k", "p", "g"], "=", f"{on_map} ? ({last} ? int64({extent - 1}) : int64({clamped})) "
                                                       f": int64(0)"),
                b.statement(high, ["k", "p", "g"], "=", f"{on_map} ? ({last} ? int64({extent - 1}) : "
                                                        f"int64({clamped}) + 1) : int64(0)"),
                b.statement(fraction, ["k", "p", "g"], "=", f"{t}({on_map} && !({last}) ? {clamped} - "
                                                            f"floor({clamped}) : 0)"),
                b.statement(valid, ["k", "p", "g"], "=", f"{t}({on_map} ? 1 : 0)")]
            tables.append((low, high, fraction, valid))
        b.emit(statements, [boxes], [v for table in tables for v in table], "other")
        (y_low, y_high, y_frac, y_valid), (x_low, x_high, x_frac, x_valid) = tables
        image = f"int64({b.ref(batch_of, ['k'])})"

        def at(table, bin_index, sample_index):
            return b.ref(table, ["k", bin_index, sample_index])
        ly, lx = at(y_frac, "i0", "r0"), at(x_frac, "i1", "r1")
        corners = [(f"(1 - {ly}) * (1 - {lx})", y_low, x_low), (f"(1 - {ly}) * {lx}", y_low, x_high),
                   (f"{ly} * (1 - {lx})", y_high, x_low), (f"{ly} * {lx}", y_high, x_high)]
        terms = [f"{weight} * {b.ref(x, [image, 'c', at(yi, 'i0', 'r0'), at(xi, 'i1', 'r1')])}"
                 for weight, yi, xi in corners]
        valid = f"{at(y_valid, 'i0', 'r0')} * {at(x_valid, 'i1', 'r1')}"
        out = b.new([count, x.shape[1], rows, columns], x.dtype)
        target = ["k", "c", "i0", "i1"]
        reductions = [("r0", grid), ("r1", grid)]
        if mode == "avg":
            statements = [b.statement(out, target, "+=!", f"{valid} * ({' + '.join(terms)})", reductions),
                          b.statement(out, target, "=", f"{out.ident}(k, c, i0, i1) / {grid * grid}")]
        else:  # a sample off the map counts as 0, as in the reference
            largest = f"fmax(fmax({terms[0]}, {terms[1]}), fmax({terms[2]}, {terms[3]}))"
            statements = [b.statement(out, target, "max=!", f"({valid} != 0) ? {largest} : {t}(0)", reductions)]
        b.emit(statements, [x, batch_of] + [v for table in tables for v in table], [out], "other")
        return [out]


class DeformConv(Converter):
    """A 2-D convolution whose taps are moved, per output point, by learned offsets (and
    weighed by a mask): every tap is a bilinear sample of the input, 0 off the image, as
    onnx's reference (GridSample's).  Three kernels: the taps' places (per batch, offset
    group, tap and output point), the samples (the im2col of the moved taps), and their
    product by the weights, a contraction."""

    @staticmethod
    def _impl_v19(b, node, inputs):
        x, w, offsets = inputs[:3]
        bias = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        _float_only(b, x)
        if x.rank != 4 or w.rank != 4 or offsets.rank != 4:
            raise UnsupportedError(f"{b.where}: 2-D DeformConv only (input {x.shape}, weights {w.shape})")
        n, channels, height, width = x.shape
        filters, per_group, kh, kw = w.shape
        groups, offset_groups = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
        taps = kh * kw
        out_h, out_w = offsets.shape[2:]
        strides = list(node.attr("strides") or [1, 1])
        dilations = list(node.attr("dilations") or [1, 1])
        pads = list(node.attr("pads") or [0, 0, 0, 0])
        expected = tuple((extent + pads[d] + pads[d + 2] - dilations[d] * (k - 1) - 1) // strides[d] + 1
                         for d, (extent, k) in enumerate(((height, kh), (width, kw))))
        if channels != per_group * groups or filters % groups or channels % offset_groups \
                or offsets.shape != (n, offset_groups * 2 * taps, *expected) \
                or (mask is not None and mask.shape != (n, offset_groups * taps, *expected)):
            raise UnsupportedError(f"{b.where}: input {x.shape}, weights {w.shape}, offsets {offsets.shape} and mask "
                                   f"{mask.shape if mask is not None else None} for {groups} group(s), {offset_groups} "
                                   f"offset group(s) and an output of {expected}")
        place_idx = ["n", "g", "a", "c2", "i0", "i1"]  # batch, offset group, tap row and column, output point
        tap = f"(a * {kw} + c2)"
        statements, tables = [], []
        for axis, (stride, dilation, pad, extent) in enumerate(
                ((strides[0], dilations[0], pads[0], height), (strides[1], dilations[1], pads[1], width))):
            moved = (f"{_affine(stride, f'i{axis}', 0)} - {pad} + {_affine(dilation, 'a' if axis == 0 else 'c2', 0)} + "
                     f"{b.ref(offsets, ['n', f'g * {2 * taps} + 2 * {tap} + {axis}', 'i0', 'i1'])}")
            low, fraction = b.new([n, offset_groups, kh, kw, out_h, out_w], np.int64), \
                b.new([n, offset_groups, kh, kw, out_h, out_w], x.dtype)
            statements += [b.statement(low, place_idx, "=", f"int64(floor({moved}))"),
                           b.statement(fraction, place_idx, "=", f"({moved}) - floor({moved})")]
            tables.append((low, fraction, extent))
        b.emit(statements, [offsets], [t for low, fraction, _ in tables for t in (low, fraction)], "other")
        per_offset_group = channels // offset_groups
        at = ["n", f"c / {per_offset_group}", "a", "c2", "i0", "i1"]
        corner, weights = [], []
        for (low, fraction, extent), step in zip(tables, ("u0", "u1")):
            place = f"{b.ref(low, at)} + {step}"
            corner.append((place, extent))
            weights.append(f"({step} == 0 ? 1 - {b.ref(fraction, at)} : {b.ref(fraction, at)})")
        inside = " && ".join(f"{p} >= 0 && {p} < {e}" for p, e in corner)
        value = f"({inside}) ? {b.ref(x, ['n', 'c', corner[0][0], corner[1][0]])} : {tc_type(x.dtype)}(0)"
        sample_rhs = f"{weights[0]} * {weights[1]} * ({value})"
        reads = [x] + [t for low, fraction, _ in tables for t in (low, fraction)]
        if mask is not None:
            sample_rhs = f"{b.ref(mask, ['n', f'(c / {per_offset_group}) * {taps} + {tap}', 'i0', 'i1'])} * ({sample_rhs})"
            reads.append(mask)
        samples = b.new([n, channels, kh, kw, out_h, out_w], x.dtype)
        b.emit([b.statement(samples, ["n", "c", "a", "c2", "i0", "i1"], "+=!", sample_rhs, [("u0", 2), ("u1", 2)])],
               reads, [samples], "other")
        per_filter_group = filters // groups
        out = b.new([n, filters, out_h, out_w], x.dtype)
        product = (f"{b.ref(w, ['f', 'r_c', 'r_a', 'r_b'])} * "
                   f"{b.ref(samples, ['n', f'(f / {per_filter_group}) * {per_group} + r_c', 'r_a', 'r_b', 'i0', 'i1'])}")
        statements = [b.statement(out, ["n", "f", "i0", "i1"], "+=!", product,
                                  [("r_c", per_group), ("r_a", kh), ("r_b", kw)])]
        if bias is not None:
            statements.append(b.statement(out, ["n", "f", "i0", "i1"], "=",
                                          f"{out.ident}(n, f, i0, i1) + {b.ref(bias, ['f'])}"))
        b.emit(statements, [w, samples] + ([bias] if bias is not None else []), [out], "other")
        return [out]


class Col2Im(Converter):
    """Columns of image blocks (im2col's output) summed back into the image: each pixel adds
    the column entries of every block position that covers it, found by the stride's
    divisibility, as a reduction over the block's offsets."""

    CONSTANT_INPUTS = (1, 2)

    @staticmethod
    def _impl_v18(b, node, inputs):
        x = inputs[0]
        image = [int(v) for v in _require_const(b, inputs[1], "image_shape").reshape(-1)]
        block = [int(v) for v in _require_const(b, inputs[2], "block_shape").reshape(-1)]
        k = len(image)
        dilations = list(node.attr("dilations") or [1] * k)
        strides = list(node.attr("strides") or [1] * k)
        pads = list(node.attr("pads") or [0] * 2 * k)
        if x.rank != 3 or len(block) != k or len(dilations) != k or len(strides) != k or len(pads) != 2 * k:
            raise UnsupportedError(f"{b.where}: an input of shape {x.shape} for image {image} and block {block}")
        blocks = [(image[d] + pads[d] + pads[k + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1
                  for d in range(k)]
        per_channel = math.prod(block)
        if x.shape[1] % per_channel or x.shape[2] != math.prod(blocks) or min(blocks) < 1:
            raise UnsupportedError(f"{b.where}: an input of shape {x.shape} is not the columns of {blocks} blocks of "
                                   f"{block} from an image of {image}")
        pixel = indices(k, "y")
        offsets = [f"r{d}" for d in range(k)]
        # where block offset r_d covers pixel y_d: y_d + pad - r_d * dilation = l_d * stride
        reach = [f"({pixel[d]} + {pads[d]} - {dilations[d]} * {offsets[d]})" for d in range(k)]
        place = [f"{reach[d]} / {strides[d]}" for d in range(k)]
        covered = " && ".join(f"{reach[d]} >= 0 && {reach[d]} % {strides[d]} == 0 && {place[d]} < {blocks[d]}"
                              for d in range(k))

        def flat(terms, extents):
            text = terms[0]
            for term, extent in zip(terms[1:], extents[1:]):
                text = f"({text}) * {extent} + {term}"
            return text
        column = b.ref(x, ["n", f"c * {per_channel} + {flat(offsets, block)}", flat(place, blocks)])
        out = b.new([x.shape[0], x.shape[1] // per_channel, *image], x.dtype)
        b.emit([b.statement(out, ["n", "c"] + pixel, "+=!", f"({covered}) ? {column} : {tc_type(x.dtype)}(0)",
                            [(offsets[d], block[d]) for d in range(k)])], [x], [out], "other")
        return [out]


class ReverseSequence(Converter):
    """Each batch entry's first ``sequence_lens[b]`` steps along ``time_axis`` reversed, the
    rest kept: a gather by the data-dependent index ``length - 1 - t``."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        x, lengths = inputs[:2]
        if x.rank < 2 or lengths is None or lengths.rank != 1:
            raise UnsupportedError(f"{b.where}: an input of rank at least 2 and a 1-D sequence_lens")
        batch_axis = _axis(b, node.attr("batch_axis", 1), x.rank)
        time_axis = _axis(b, node.attr("time_axis", 0), x.rank)
        if {batch_axis, time_axis} != {0, 1} or lengths.shape[0] != x.shape[batch_axis]:
            raise UnsupportedError(f"{b.where}: batch_axis {batch_axis} and time_axis {time_axis} (0 and 1) with "
                                   f"{lengths.shape[0]} lengths for a batch of {x.shape[batch_axis]}")
        idx = indices(x.rank)
        length = f"int64({b.ref(lengths, [idx[batch_axis]])})"
        reversed_at = list(idx)
        reversed_at[time_axis] = f"{length} - 1 - {idx[time_axis]}"
        out = b.new(x.shape, x.dtype)
        b.emit([b.statement(out, idx, "=", f"({idx[time_axis]} < {length}) ? {b.ref(x, reversed_at)} : "
                                           f"{b.ref(x, idx)}")], [x, lengths], [out], "other")
        return [out]


class TensorScatter(Converter):
    """A cache with each batch entry's update written along ``axis`` from ``write_indices[b]``
    on (``circular``: wrapping around the cache's length), as LLMs' key and value caches are
    updated.  A gather: each cache position takes the update aimed at it, if any.  In linear
    mode the update's positions are also read from the cache, so that one beyond it stops the
    kernel with an error instead of being dropped."""

    @staticmethod
    def _impl_v24(b, node, inputs):
        cache, update = inputs[:2]
        where = inputs[2] if len(inputs) > 2 else None
        mode = node.attr("mode", "linear")
        axis = _axis(b, node.attr("axis", -2), cache.rank)
        if mode not in ("linear", "circular") or axis == 0:
            raise UnsupportedError(f"{b.where}: mode {mode!r} (linear or circular) along axis {axis} (not the batch)")
        if update.rank != cache.rank or any(u != c for d, (u, c) in enumerate(zip(update.shape, cache.shape))
                                            if d != axis) or update.shape[axis] > cache.shape[axis]:
            raise SignatureError(f"{b.where}: an update of shape {update.shape} for a cache of shape {cache.shape} "
                                 f"along axis {axis}")
        if update.dtype != cache.dtype:
            raise SignatureError(f"{b.where}: an update of {update.dtype} for a cache of {cache.dtype}")
        idx = indices(cache.rank)
        start = f"int64({b.ref(where, ['i0'])})" if where is not None else "int64(0)"
        length, extent = update.shape[axis], cache.shape[axis]
        offset = f"({idx[axis]} - {start})"
        if mode == "circular":
            offset = f"(({offset} % {extent} + {extent}) % {extent})"
        at = list(idx)
        at[axis] = offset
        out = b.new(cache.shape, cache.dtype)
        statements = [b.statement(out, idx, "=", f"({offset} >= 0 && {offset} < {length}) ? {b.ref(update, at)} : "
                                                 f"{b.ref(cache, idx)}")]
        writes = [out]
        if mode == "linear" and where is not None:
            probe = b.new([cache.shape[0], length], cache.dtype)
            aim = ["i0"] + ["0"] * (cache.rank - 1)
            aim[axis] = f"{start} + u0"
            statements.insert(0, b.statement(probe, ["i0", "u0"], "=", b.ref(cache, aim)))
            writes.append(probe)
        b.emit(statements, [cache, update] + ([where] if where is not None else []), writes, "other")
        return [out]


class GatherElements(Converter):
    """``out[i][j][k] = x[i][index[i][j][k]][k]`` along ``axis`` (torch.gather's export)."""

    @staticmethod
    def _impl_v11(b, node, inputs):
        x, which = inputs[:2]
        if which.rank != x.rank:
            raise UnsupportedError(f"{b.where}: GatherElements' indices have rank {which.rank}, "
                                   f"the data rank {x.rank} (they must be equal)")
        axis = _axis(b, node.attr("axis", 0), x.rank)
        for d in range(x.rank):
            if d != axis and which.shape[d] > x.shape[d]:
                raise SignatureError(f"{b.where}: GatherElements' indices have extent {which.shape[d]} "
                                     f"along axis {d}, beyond the data's {x.shape[d]}")
        if x.const is not None and which.const is not None:
            position = np.where(which.const < 0, which.const + x.shape[axis], which.const)
            return [b.const(np.take_along_axis(x.const, position.astype(np.int64), axis=axis))]
        out = b.new(which.shape, x.dtype)
        idx = indices(x.rank)
        subscripts = idx[:axis] + [_wrapped(b, which, idx, x.shape[axis])] + idx[axis + 1:]
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x, which], [out], "other")
        return [out]


class GatherND(Converter):
    """Slices of ``x`` addressed by the last axis of ``indices`` (its first ``batch_dims`` axes
    shared with ``x``): ``out[b.., i.., t..] = x[b.., indices[b.., i.., :], t..]``."""

    @staticmethod
    def _impl_v11(b, node, inputs):
        x, which = inputs[:2]
        batch = node.attr("batch_dims", 0)
        if which.rank < 1 or not which.shape or which.shape[-1] < 1:
            raise UnsupportedError(f"{b.where}: GatherND's indices need a last axis of at least one entry")
        depth = which.shape[-1]
        if not 0 <= batch < min(x.rank, which.rank) or batch + depth > x.rank:
            raise UnsupportedError(f"{b.where}: GatherND with batch_dims {batch} and index tuples of "
                                   f"{depth} into a rank-{x.rank} tensor")
        if tuple(which.shape[:batch]) != tuple(x.shape[:batch]):
            raise SignatureError(f"{b.where}: GatherND's first {batch} axes differ: indices "
                                 f"{list(which.shape[:batch])}, data {list(x.shape[:batch])}")
        shape = list(which.shape[:-1]) + list(x.shape[batch + depth:])
        out = b.new(shape, x.dtype)
        idx = indices(len(shape))
        points = idx[:which.rank - 1]   # batch axes, then the index tuples' own axes
        tail = idx[which.rank - 1:]     # the slice's axes
        tuple_at = [_wrapped(b, which, points + [str(e)], x.shape[batch + e]) for e in range(depth)]
        subscripts = points[:batch] + tuple_at + tail
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x, which], [out], "other")
        return [out]


def _scatter(b: Builder, data: Value, which: Value, updates: Value, reduction: str, head: int, target, match,
             update_at, count: int, probe: tuple[Value, str]) -> Value:
    """``data`` with ``updates`` written where their indices point, or combined there by
    ``reduction`` (add, mul, max, min).  A statement cannot write at data-dependent indices, so
    each output element looks for the updates aimed at it: ``match(p, r)`` is the condition, on
    the index tensor ``which``, that update ``r`` (a reduction index over ``count`` updates)
    aims at output element ``p``; it depends on ``p``'s first ``head`` indices only and may
    read the indices only where ``target(p)`` holds (a condition, or None for always).
    ``update_at(p, r)`` reads that update.  This takes
    |output| x ``count`` comparisons where a scatter proper takes ``count``: fine for the small
    updates exporters make of masks and caches, slow for large ones.  With ``none``, of several
    updates aimed at one element the last wins, as in onnx's reference.  ``probe``: a value and
    the statement that reads ``data`` where each update aims, so that an index outside the
    data stops the kernel with an error (a scatter by matching would drop that update
    silently)."""
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise UnsupportedError(f"{b.where}: {b.op_type} reduction {reduction!r}")
    if updates.dtype != data.dtype:
        raise SignatureError(f"{b.where}: {b.op_type}'s updates are {updates.dtype}, its data {data.dtype}")
    idx = indices(data.rank)
    out = b.new(data.shape, data.dtype)

    def aimed(p, value: str, otherwise: str) -> str:
        guard = target(p)
        inner = f"({match(p, 'r0')}) ? {value} : {otherwise}"
        return f"({guard}) ? ({inner}) : {otherwise}" if guard else inner
    if reduction == "none":  # the last update aimed at each element, then that update or the data
        last = b.new(list(data.shape[:head]), np.int64)
        at = b.ref(last, idx[:head])
        b.emit([probe[1], b.statement(last, idx[:head], "max=!", aimed(idx, "int64(r0)", "int64(-1)"), [("r0", count)]),
                b.statement(out, idx, "=", f"({at} >= 0) ? {update_at(idx, at)} : {b.ref(data, idx)}")],
               [data, which, updates], [out, probe[0]], "other")
        return out
    t = tc_type(data.dtype)
    reads = [data, which, updates]
    if reduction in ("add", "mul"):
        op, neutral = ("+=", f"{t}(0)") if reduction == "add" else ("*=", f"{t}(1)")
    else:
        op = f"{reduction}="
        if data.dtype.kind == "f":
            extreme = -np.inf if reduction == "max" else np.inf
        else:
            limits = np.iinfo(data.dtype)
            extreme = limits.min if reduction == "max" else limits.max
        bound = b.const(np.array(extreme, data.dtype))  # max='s and min='s neutral element
        neutral = b.ref(bound, [])
        reads.append(bound)
    b.emit([probe[1], b.statement(out, idx, "=", b.ref(data, idx)),
            b.statement(out, idx, op, aimed(idx, update_at(idx, "r0"), neutral), [("r0", count)])],
           reads, [out, probe[0]], "other")
    return out


class ScatterElements(Converter):
    """``out[i][index[i][j]] = updates[i][j]`` along ``axis`` (or combined by ``reduction``):
    torch's scatter_ export.  See :func:`_scatter` for the cost."""

    @staticmethod
    def _impl_v11(b, node, inputs):
        data, which, updates = inputs[:3]
        axis = _axis(b, node.attr("axis", 0), data.rank)
        if which.shape != updates.shape or which.rank != data.rank:
            raise SignatureError(f"{b.where}: {node.op_type}'s indices {list(which.shape)} and updates "
                                 f"{list(updates.shape)} must have one shape, of the data's rank {data.rank}")
        for d in range(data.rank):
            if d != axis and which.shape[d] > data.shape[d]:
                raise SignatureError(f"{b.where}: {node.op_type}'s indices have extent {which.shape[d]} along "
                                     f"axis {d}, beyond the data's {data.shape[d]}")
        at = lambda p, r: p[:axis] + [r] + p[axis + 1:]  # noqa: E731
        target = lambda p: " && ".join(f"{p[d]} < {which.shape[d]}" for d in range(data.rank)  # noqa: E731
                                       if d != axis and which.shape[d] < data.shape[d]) or None
        match = lambda p, r: f"{_wrapped(b, which, at(p, r), data.shape[axis])} == {p[axis]}"  # noqa: E731
        probe, points = b.new(which.shape, data.dtype), indices(which.rank, "u")
        aim = at(points, _wrapped(b, which, points, data.shape[axis]))
        return [_scatter(b, data, which, updates, node.attr("reduction", "none"), data.rank, target, match,
                         lambda p, r: b.ref(updates, at(p, r)), which.shape[axis],
                         (probe, b.statement(probe, points, "=", b.ref(data, aim))))]


class Scatter(Converter):
    """Opsets 9 and 10's name for ScatterElements (without reductions)."""

    @staticmethod
    def _impl_v9(b, node, inputs):
        return ScatterElements._impl_v11(b, node, inputs)


class ScatterND(Converter):
    """Slices of ``data`` at the index tuples of ``indices``' last axis replaced by (or combined
    with) ``updates``: torch's index_put_ export.  See :func:`_scatter` for the cost."""

    @staticmethod
    def _impl_v11(b, node, inputs):
        data, which, updates = inputs[:3]
        if which.rank < 1 or which.shape[-1] < 1 or which.shape[-1] > data.rank:
            raise UnsupportedError(f"{b.where}: ScatterND's index tuples must have 1 to {data.rank} entries")
        length = which.shape[-1]
        expected = list(which.shape[:-1]) + list(data.shape[length:])
        if list(updates.shape) != expected:
            raise SignatureError(f"{b.where}: ScatterND's updates have shape {list(updates.shape)}, "
                                 f"its indices and data need {expected}")
        count = math.prod(which.shape[:-1])
        tuples = b.view(which, [count, length])  # the updates in one row each, in order
        rows = b.view(updates, [count] + list(data.shape[length:]))
        match = lambda p, r: " && ".join(  # noqa: E731
            f"{_wrapped(b, tuples, [r, str(e)], data.shape[e])} == {p[e]}" for e in range(length))
        probe = b.new([count], data.dtype)
        aim = [_wrapped(b, tuples, ["u0", str(e)], data.shape[e]) for e in range(length)] + ["0"] * (data.rank - length)
        return [_scatter(b, data, tuples, rows, node.attr("reduction", "none"), length, lambda p: None, match,
                         lambda p, r: b.ref(rows, [r] + p[length:]), count,
                         (probe, b.statement(probe, ["u0"], "=", b.ref(data, aim))))]


class OneHot(Converter):
    """``values[1]`` where an index (negative ones counted from ``depth``) equals the position
    along the new axis, ``values[0]`` elsewhere; an index outside ``[-depth, depth)`` matches
    nowhere."""

    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v9(b, node, inputs):
        which, depth, values = inputs[:3]
        depth = int(_require_const(b, depth, "OneHot's depth").reshape(-1)[0])
        if depth < 1:
            raise UnsupportedError(f"{b.where}: OneHot's depth must be positive (got {depth})")
        if values.shape not in ((2,),):
            raise SignatureError(f"{b.where}: OneHot's values must be [off, on] (got shape {list(values.shape)})")
        axis = _axis(b, node.attr("axis", -1), which.rank + 1)
        shape = list(which.shape[:axis]) + [depth] + list(which.shape[axis:])
        out = b.new(shape, values.dtype)
        idx = indices(len(shape))
        source = idx[:axis] + idx[axis + 1:]
        index = b.ref(which, source)
        if which.dtype.kind == "f":  # onnx truncates a float index
            index = f"int64({index})"
        wrapped = f"({index} < 0 ? {index} + {depth} : {index})"
        rhs = f"({wrapped} == {idx[axis]}) ? {b.ref(values, ['1'])} : {b.ref(values, ['0'])}"
        b.emit([b.statement(out, idx, "=", rhs)], [which, values], [out], "other")
        return [out]


class Trilu(Converter):
    """The upper (``upper=1``) or lower triangle of the last two axes from diagonal ``k`` on,
    zeros elsewhere: a causal attention mask's shape."""

    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v14(b, node, inputs):
        x = inputs[0]
        k = int(_require_const(b, inputs[1], "Trilu's k").reshape(-1)[0]) \
            if len(inputs) > 1 and inputs[1] is not None else 0
        if x.rank < 2:
            raise UnsupportedError(f"{b.where}: Trilu of a rank-{x.rank} tensor (rank 2 or more)")
        upper = node.attr("upper", 1)
        if x.const is not None:
            return [b.const(np.triu(x.const, k) if upper else np.tril(x.const, k))]
        idx = indices(x.rank)
        row, column = idx[-2], idx[-1]
        keep = f"{column} - {row} >= {k}" if upper else f"{column} - {row} <= {k}"
        if k < 0:
            keep = f"{row} - {column} <= {-k}" if upper else f"{row} - {column} >= {-k}"
        return [_elementwise(b, [x], x.dtype, lambda r: f"({keep}) ? {r[0]} : {tc_type(x.dtype)}(0)")]


class EyeLike(Converter):
    """Ones on diagonal ``k`` of a matrix of the input's shape (its values are not read)."""

    @staticmethod
    def _impl_v9(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype
        x = inputs[0]
        if x.rank != 2:
            raise UnsupportedError(f"{b.where}: EyeLike of a rank-{x.rank} tensor (rank 2 only)")
        dtype = x.dtype
        if node.attr("dtype") is not None:
            dtype = numpy_dtype(node.attr("dtype"))
            if dtype is None:
                raise UnsupportedError(f"{b.where}: EyeLike of element type {node.attr('dtype')} is not supported")
        return [b.const(np.eye(x.shape[0], x.shape[1], k=node.attr("k", 0), dtype=dtype))]


class Pad(Converter):
    CONSTANT_INPUTS = (1, 3)

    @staticmethod
    def _pad(b, node, x, pads, value):
        mode = node.attr("mode", "constant")
        if mode in ("edge", "reflect", "wrap"):
            return [Pad._from_inside(b, x, [int(p) for p in pads], mode)]
        if mode != "constant":
            raise UnsupportedError(f"{b.where}: Pad mode {mode!r} (constant, edge, reflect and wrap are supported)")
        pads = [int(p) for p in pads]
        begin, end = pads[:x.rank], pads[x.rank:]
        shape = [d + p + q for d, p, q in zip(x.shape, begin, end)]
        out = b.new(shape, x.dtype)
        idx = indices(x.rank)
        guards = []
        subscripts = []
        for i, d, p, q in zip(idx, x.shape, begin, end):
            subscripts.append(f"{i} - {p}" if p > 0 else f"{i} + {-p}" if p < 0 else i)
            if p > 0:
                guards.append(f"{i} >= {p}")
            if q > 0:
                guards.append(f"{i} < {d + p}")
        fill = value if value is not None else b.const(np.zeros((), x.dtype))
        fill_ref = b.ref(fill, [])
        rhs = f"({' && '.join(guards)}) ? {b.ref(x, subscripts)} : {fill_ref}" if guards else b.ref(x, subscripts)
        b.emit([b.statement(out, idx, "=", rhs)], [x, fill], [out], "other")
        return [out]

    @staticmethod
    def _from_inside(b, x, pads, mode: str):
        """Padding by elements of ``x`` itself: the nearest one (edge), the mirror image without
        the border (reflect) or the other end (wrap).  Along each axis the output has up to
        three parts, each an affine read of ``x`` (the left part of reflect reads x(p - i)), so
        the result is one statement per combination of parts, without guards."""
        begin, end = pads[:x.rank], pads[x.rank:]
        idx = indices(x.rank)
        parts_per_axis = []
        for i, d, p, q in zip(idx, x.shape, begin, end):
            o = d + p + q
            longest = d - 1 if mode == "reflect" else d if mode == "wrap" else None
            if longest is not None and max(p, q) > longest:
                raise UnsupportedError(f"{b.where}: Pad mode {mode!r} by {max(p, q)} along an axis of {d} "
                                       f"(at most {longest})")
            if d == 0 and (p > 0 or q > 0):
                raise UnsupportedError(f"{b.where}: Pad mode {mode!r} of an empty axis")
            parts = [(max(p, 0), min(p + d, o), f"{i} - {p}" if p >= 0 else f"{i} + {-p}")]
            if p > 0:
                parts.append((0, p, {"edge": "0", "reflect": f"{p} - {i}", "wrap": f"{i} + {d - p}"}[mode]))
            if q > 0:
                parts.append((p + d, o, {"edge": str(d - 1), "reflect": f"{2 * d - 2 + p} - {i}",
                                         "wrap": f"{i} - {p + d}"}[mode]))
            # the last part first: a def's output takes its extents from its first statement
            parts_per_axis.append(sorted((part for part in parts if part[1] > part[0]), key=lambda part: -part[1]))
        out = b.new([d + p + q for d, p, q in zip(x.shape, begin, end)], x.dtype)
        statements = []
        for parts in itertools.product(*parts_per_axis):
            where = ", ".join(f"{i} in {lo}:{hi}" for i, (lo, hi, _) in zip(idx, parts))
            read = b.ref(x, [sub for _, _, sub in parts])
            statements.append(f"{out.ident}({', '.join(idx)}) = {read}" + (f" where {where}" if where else ""))
        b.emit(statements, [x], [out], "other")
        return out

    @staticmethod
    def _impl_v2(b, node, inputs):
        value = b.const(np.array(node.attr("value", 0.0), inputs[0].dtype))
        return Pad._pad(b, node, inputs[0], node.attr("pads"), value)

    @staticmethod
    def _impl_v11(b, node, inputs):
        x = inputs[0]
        pads = _require_const(b, inputs[1], "pads")
        value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
        if len(inputs) > 3 and inputs[3] is not None:
            axes = [_axis(b, int(a), x.rank) for a in _require_const(b, inputs[3], "axes")]
            full = [0] * (2 * x.rank)
            for k, a in enumerate(axes):
                full[a], full[x.rank + a] = int(pads[k]), int(pads[len(axes) + k])
            pads = full
        if value is not None and value.shape not in ((), (1,)):
            raise UnsupportedError(f"{b.where}: a constant_value of shape {value.shape}")
        if value is not None and value.shape == (1,):
            value = b.view(value, ())
        return Pad._pad(b, node, x, pads, value)


# ----------------------------------------------------------------------------- contractions
class MatMul(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        a, c = inputs[:2]
        if a.rank == 0 or c.rank == 0:
            raise UnsupportedError(f"{b.where}: MatMul of a scalar")
        a_shape = ((1,) + a.shape) if a.rank == 1 else a.shape
        c_shape = (c.shape + (1,)) if c.rank == 1 else c.shape
        if a_shape[-1] != c_shape[-2]:
            raise UnsupportedError(f"{b.where}: MatMul of {a.shape} and {c.shape}: inner extents differ")
        batch = broadcast_shape(b.where, a_shape[:-2], c_shape[:-2])
        full = batch + (a_shape[-2], c_shape[-1])
        shape = list(batch) + ([a.shape[-2]] if a.rank > 1 else []) + ([c.shape[-1]] if c.rank > 1 else [])
        idx = indices(len(full))
        out_idx = idx[:len(batch)] + ([idx[-2]] if a.rank > 1 else []) + ([idx[-1]] if c.rank > 1 else [])
        a_sub = b.broadcast_subscripts(Value("", a.dtype, a_shape[:-2]), batch, idx[:len(batch)]) \
            + ([idx[-2]] if a.rank > 1 else []) + ["r0"]
        c_sub = b.broadcast_subscripts(Value("", c.dtype, c_shape[:-2]), batch, idx[:len(batch)]) \
            + ["r0"] + ([idx[-1]] if c.rank > 1 else [])
        sliver = _weight_sliver(b, a, c)
        if sliver:
            return [_product_by_blocked_weights(b, a, c, sliver, shape, out_idx[:-1], a_sub)]
        out = b.new(shape, a.dtype)
        rhs = f"{b.ref(a, a_sub)} * {b.ref(c, c_sub)}"
        b.emit([b.statement(out, out_idx, "+=!", rhs, [("r0", a_shape[-1])])], [a, c], [out], "contraction")
        return [out]


#: A product by constant weights ``W(K, N)`` of at most this many rows reads them blocked, as
#: ``W'(N / NR, K, NR)`` made at plan time: each NR-wide sliver of N is then laid out as the gemm
#: kernel packs it, so the kernel reads it in place instead of packing all of W on every call
#: (as onnxruntime pre-packs its weights).  Few rows amortise that packing least: a BERT layer's
#: eight products at 128 rows took 9.5 ms packed and 8.7 ms blocked; at 1024 rows 1% apart.
#: Since a bias or activation fuses through the view of the blocked product, more rows read
#: blocked weights too: mobilenet_v2 at batch 8 (1x1 convolutions of 392 and 1568 pixels),
#: 23.4-24.0 ms with 256 rows at most, 22.5-23.4 with 4096, alternating processes; the encoder
#: at batch 8 (1024 rows) the same (AMD EPYC Zen 5).
BLOCKED_WEIGHT_ROWS = 4096


def _weight_sliver(b: Builder, a: Value, c: Value, padded: bool = False) -> int:
    """NR when ``a @ c`` should read ``c`` blocked (see :data:`BLOCKED_WEIGHT_ROWS`), else 0:
    the width of the widest register block of the gemm kernel the plan builds (``b.vector_bits``),
    which it picks for such N.  ``padded``: the caller pads ``c`` with zero columns up to a
    multiple of NR."""
    from polyc.codegen.gemm import micro_kernel_shapes
    if c.const is None or c.rank != 2 or a.rank < 2:
        return 0
    if a.dtype != c.dtype or a.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return 0
    isa = {512: "avx512", 256: "avx2"}.get(b.vector_bits)
    if isa is None or math.prod(a.shape[:-1]) > BLOCKED_WEIGHT_ROWS:
        return 0
    sliver = micro_kernel_shapes(isa, a.dtype)[0].nr
    return sliver if (padded or c.shape[1] % sliver == 0) and c.shape[1] > sliver else 0


def zero_padded_columns(matrix: np.ndarray, sliver: int) -> np.ndarray:
    """``matrix`` with zero columns up to a multiple of ``sliver``."""
    rows, columns = matrix.shape
    padded = np.zeros((rows, -(-columns // sliver) * sliver), matrix.dtype)
    padded[:, :columns] = matrix
    return padded


def _product_by_blocked_weights(b: Builder, a: Value, c: Value, sliver: int, shape, row_idx, a_sub) -> Value:
    """``a @ c`` with ``c`` blocked: ``O(.., nb, nr) +=! A(.., r0) * W'(nb, r0, nr)``, viewed as
    ``shape``."""
    k, n = c.shape
    blocked = b.const(np.ascontiguousarray(c.const.reshape(k, n // sliver, sliver).transpose(1, 0, 2)))
    target = b.new(list(shape[:-1]) + [n // sliver, sliver], a.dtype)
    rhs = f"{b.ref(a, a_sub)} * {b.ref(blocked, ['nb', 'r0', 'nr'])}"
    b.emit([b.statement(target, list(row_idx) + ["nb", "nr"], "+=!", rhs,
                        [("r0", k)])], [a, blocked], [target], "contraction")
    return b.view(target, shape)


class Gemm(Converter):
    @staticmethod
    def _impl_v7(b, node, inputs):
        a, c = inputs[:2]
        bias = inputs[2] if len(inputs) > 2 else None
        alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
        trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
        m = a.shape[1] if trans_a else a.shape[0]
        k = a.shape[0] if trans_a else a.shape[1]
        n = c.shape[0] if trans_b else c.shape[1]
        if m == 1 and (bias is None or beta == 0 or bias.size in (1, n)):
            return Gemm._as_matrix_vector(b, a, c, bias, k, n, alpha, beta, trans_b)
        a_sub = ["r0", "i0"] if trans_a else ["i0", "r0"]
        if c.const is not None and c.rank == 2:
            # Constant weights (a fully connected layer) read blocked, as MatMul's, with zero
            # columns up to a whole sliver: the gemm kernel packed all of them on every call,
            # from memory (mobilenet_v2's classifier at batch 8, 8 x 1280 by 1280 x 1000: 0.81
            # ms on one core, onnxruntime 0.42, AMD EPYC Zen 4).
            matrix = c.const.T if trans_b else c.const
            rows = Value("", a.dtype, (m, k))  # a's rows, also when transA
            sliver = _weight_sliver(b, rows, Value("", c.dtype, matrix.shape, const=matrix), padded=True)
            if sliver:
                padded = zero_padded_columns(matrix, sliver)
                product = _product_by_blocked_weights(b, a, b.const(padded), sliver, (m, padded.shape[1]), ["i0"], a_sub)
                return [Gemm._epilogue(b, product, bias, m, n, alpha, beta)]
        out = b.new((m, n), a.dtype)
        a_ref = b.ref(a, a_sub)
        c_ref = b.ref(c, ["i1", "r0"] if trans_b else ["r0", "i1"])
        statements = [b.statement(out, ["i0", "i1"], "+=!", f"{a_ref} * {c_ref}", [("r0", k)])]
        epilogue = f"{out.ident}(i0, i1)" if alpha == 1 else f"{_number(alpha)} * {out.ident}(i0, i1)"
        if bias is not None and beta != 0:
            bias_ref = b.ref(bias, b.broadcast_subscripts(bias, (m, n), ["i0", "i1"]))
            epilogue += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
        if epilogue != f"{out.ident}(i0, i1)":
            statements.append(b.statement(out, ["i0", "i1"], "=", epilogue))
        b.emit(statements, [a, c] + ([bias] if bias is not None else []), [out], "contraction")
        return [out]


    @staticmethod
    def _epilogue(b, product, bias, m, n, alpha, beta):
        """``alpha * product + beta * bias`` of the first ``n`` columns of ``product`` (its
        others are the blocked weights' zero columns) as an elementwise step, which the fusion
        rules make the epilogue of the product's kernel when there are no others; ``product``
        itself when that is all."""
        rhs = b.ref(product, ["i0", "i1"]) if alpha == 1 else f"{_number(alpha)} * {b.ref(product, ['i0', 'i1'])}"
        reads = [product]
        if bias is not None and beta != 0:
            bias_ref = b.ref(bias, b.broadcast_subscripts(bias, (m, n), ["i0", "i1"]))
            rhs += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
            reads.append(bias)
        if len(reads) == 1 and alpha == 1 and product.shape[-1] == n:
            return product
        out = b.new((m, n), product.dtype)
        b.emit([b.statement(out, ["i0", "i1"], "=", rhs)], reads, [out], "elementwise")
        return out

    @staticmethod
    def _as_matrix_vector(b, a, c, bias, k, n, alpha, beta, trans_b):
        """A one-row Gemm (a fully connected layer at batch 1) as a matrix-vector product, which
        polyc's matrix-vector kernel streams (the gemm kernel would pack all of the weights
        for one row: 6x slower than numpy for 1x1280 by 1280x1000, Intel Xeon)."""
        vector = b.view(a, [k])
        out = b.new((n,), a.dtype)
        matrix = b.ref(c, ["i0", "r0"] if trans_b else ["r0", "i0"])
        statements = [b.statement(out, ["i0"], "+=!", f"{matrix} * {b.ref(vector, ['r0'])}", [("r0", k)])]
        reads = [c, vector]
        epilogue = f"{out.ident}(i0)" if alpha == 1 else f"{_number(alpha)} * {out.ident}(i0)"
        if bias is not None and beta != 0:
            flat = b.view(bias, [bias.size])
            bias_ref = b.ref(flat, ["i0"] if bias.size == n else ["0"])
            epilogue += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
            reads.append(flat)
        if epilogue != f"{out.ident}(i0)":
            statements.append(b.statement(out, ["i0"], "=", epilogue))
        b.emit(statements, reads, [out], "contraction")
        return [b.view(out, [1, n])]


class Einsum(Converter):
    @staticmethod
    def _impl_v12(b, node, inputs):
        equation = node.attr("equation").replace(" ", "")
        if "..." in equation:
            raise UnsupportedError(f"{b.where}: Einsum with an ellipsis ({equation})")
        left, _, right = equation.partition("->")
        terms = left.split(",")
        if right == "" and "->" not in equation:
            letters = "".join(terms)
            right = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
        extents = {}
        for term, value in zip(terms, inputs):
            for letter, extent in zip(term, value.shape):
                extents[letter] = extent
        out = b.new([extents[c] for c in right], inputs[0].dtype)
        name = {c: (f"i{right.index(c)}" if c in right else f"r_{c}") for c in extents}
        rhs = " * ".join(b.ref(v, [name[c] for c in term]) for term, v in zip(terms, inputs))
        reductions = [(name[c], extents[c]) for c in extents if c not in right]
        op = "+=!" if reductions else "="
        b.emit([b.statement(out, [name[c] for c in right], op, rhs, reductions)], inputs, [out], "contraction")
        return [out]


# ----------------------------------------------------------------------------- convolutions and pools
def image_indices(channels_last: bool, batch, channel, spatial) -> list:
    """An image's subscripts (or extents) in its layout: NCHW, or NHWC when ``channels_last``."""
    return [batch, *spatial, channel] if channels_last else [batch, channel, *spatial]


def _spatial(b, node, x, kernel, strides_default=1, channels_last=False):
    """Output extents, pads (begin, end), strides and dilations of a window over x's spatial dims."""
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    k = len(spatial)
    strides = node.attr("strides") or [strides_default] * k
    dilations = node.attr("dilations") or [1] * k
    pads = list(node.attr("pads") or [0] * (2 * k))
    auto_pad = node.attr("auto_pad", "NOTSET")
    ceil = node.attr("ceil_mode", 0)
    outs = []
    for d in range(k):
        effective = (kernel[d] - 1) * dilations[d] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-spatial[d] // strides[d])
            total = max((out - 1) * strides[d] + effective - spatial[d], 0)
            small, large = total // 2, total - total // 2
            pads[d], pads[k + d] = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        elif auto_pad == "VALID":
            pads[d] = pads[k + d] = 0
        span = spatial[d] + pads[d] + pads[k + d] - effective
        out = (-(-span // strides[d]) if ceil else span // strides[d]) + 1
        if ceil and (out - 1) * strides[d] >= spatial[d] + pads[d]:
            out -= 1  # the last window would start in the end padding
        if out < 1 and spatial[d] > 0:
            # As PyTorch's "output size is too small": an image too small for the model (squeezenet
            # fed 16 x 16) would otherwise flow on empty and end in a mean of nothing.
            raise SignatureError(
                f"{b.where}: spatial dimension {d} of its input is {spatial[d]} (padded: "
                f"{spatial[d] + pads[d] + pads[k + d]}), less than its window of {effective}: the "
                f"output would be empty; the model needs a larger input")
        outs.append(max(out, 0))
    return outs, pads[:k], pads[k:], strides, dilations


def _convolution_operands(b, node, inputs):
    """(input, weights, bias or None, groups, batch, channels) of a Conv or ConvTranspose, whose
    input must have a batch, channels and at least one spatial dimension."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    if x.rank < 3:
        raise UnsupportedError(f"{b.where}: {node.op_type} of a rank-{x.rank} input")
    n, channels = x.shape[:2]
    return x, w, bias, node.attr("group", 1), n, channels


class Conv(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        x, w, bias, groups, n, channels = _convolution_operands(b, node, inputs)
        filters, per_group = w.shape[:2]
        kernel = list(w.shape[2:])
        outs, begin, end, strides, dilations = _spatial(b, node, x, kernel)
        k = len(kernel)
        if groups == 1 and _as_matrix_product(b, kernel, outs, strides, dilations, begin, end):
            return Conv._as_gemm(b, x, w, bias, kernel, outs, begin, end, strides, dilations)
        if groups == channels == filters and per_group == 1:
            unrolled = unrolled_depthwise(b, x, w, bias, kernel, outs, begin, strides, dilations)
            if unrolled is not None:
                return [unrolled]
        if any(begin) or any(end):
            x = Pad._pad(b, _Attributes(mode="constant"), x, [0, 0, *begin, 0, 0, *end], None)[0]
        sp = [f"s{d}" for d in range(k)]
        taps = [f"r_k{d}" for d in range(k)]
        window = [_affine(strides[d], sp[d], 0) + (f" + {_affine(dilations[d], taps[d], 0)}") for d in range(k)]
        tap_ranges = [(taps[d], kernel[d]) for d in range(k)]
        per_filter_group = filters // groups
        if groups == 1:
            out = b.new([n, filters, *outs], x.dtype)
            rhs = f"{b.ref(x, ['n', 'r_c', *window])} * {b.ref(w, ['f', 'r_c', *taps])}"
            statements = [b.statement(out, ["n", "f", *sp], "+=!", rhs, [("r_c", per_group)] + tap_ranges)]
            if bias is not None:
                statements.append(b.statement(out, ["n", "f", *sp], "=",
                                              f"{out.ident}(n, f, {', '.join(sp)}) + {b.ref(bias, ['f'])}"))
            b.emit(statements, [x, w] + ([bias] if bias is not None else []), [out], "convolution")
            return [out]
        if per_group == 1 and per_filter_group == 1 and w.const is not None:
            w3 = b.const(w.const.reshape([filters] + kernel))
            out = b.new([n, filters, *outs], x.dtype)
            rhs = f"{b.ref(x, ['n', 'c', *window])} * {b.ref(w3, ['c', *taps])}"
            statements = [b.statement(out, ["n", "c", *sp], "+=!", rhs, tap_ranges)]
            if bias is not None:
                statements.append(b.statement(out, ["n", "c", *sp], "=",
                                              f"{out.ident}(n, c, {', '.join(sp)}) + {b.ref(bias, ['c'])}"))
            b.emit(statements, [x, w3] + ([bias] if bias is not None else []), [out], "convolution")
            return [out]
        # Grouped: channels as (group, channel in group), the layout polyc's convolution kernel reads.
        x5 = b.view(x, [n, groups, per_group, *x.shape[2:]])
        w5 = b.view(w, [groups, per_filter_group, per_group, *kernel])
        out5 = b.new([n, groups, per_filter_group, *outs], x.dtype)
        rhs = f"{b.ref(x5, ['n', 'g', 'r_c', *window])} * {b.ref(w5, ['g', 'f', 'r_c', *taps])}"
        statements = [b.statement(out5, ["n", "g", "f", *sp], "+=!", rhs, [("r_c", per_group)] + tap_ranges)]
        reads = [x5, w5]
        if bias is not None:
            b2 = b.view(bias, [groups, per_filter_group])
            statements.append(b.statement(out5, ["n", "g", "f", *sp], "=",
                                          f"{out5.ident}(n, g, f, {', '.join(sp)}) + {b.ref(b2, ['g', 'f'])}"))
            reads.append(b2)
        b.emit(statements, reads, [out5], "convolution")
        return [b.view(out5, [n, filters, *outs])]


    @staticmethod
    def _as_gemm(b, x, w, bias, kernel, outs, begin, end, strides, dilations):
        """The convolution as a matrix product per image: filters x (channels * taps) times
        (channels * taps) x positions.  A 1x1 stride-1 convolution already is one; otherwise
        an im2col step first copies each window's inputs (zero where it reads padding) into a
        (channels, taps..., positions...) buffer, whose contiguous index groups polyc's
        contraction kernel reads as the product's K and N dimensions."""
        n, channels = x.shape[:2]
        filters = w.shape[0]
        k = len(kernel)
        sp, taps = [f"s{d}" for d in range(k)], [f"r_k{d}" for d in range(k)]
        out = b.new([n, filters, *outs], x.dtype)
        reductions = [("r_c", channels)]
        if all(size == 1 for size in kernel) and all(s == 1 for s in strides) and not any(begin) and not any(end):
            w2 = b.view(w, [filters, channels])
            rhs = f"{b.ref(w2, ['f', 'r_c'])} * {b.ref(x, ['n', 'r_c', *sp])}"
            reads = [x, w2]
        else:
            col = b.new([n, channels, *kernel, *outs], x.dtype)
            positions = [f"k{d}" for d in range(k)]
            subscripts, guards = [], []
            for d in range(k):
                at = _affine(strides[d], sp[d], 0) + f" + {_affine(dilations[d], positions[d], 0)}"
                subscripts.append(f"{at} - {begin[d]}" if begin[d] else at)
                if begin[d]:
                    guards.append(f"{at} >= {begin[d]}")
                guards.append(f"{at} < {x.shape[2 + d] + begin[d]}")
            read = b.ref(x, ["n", "c", *subscripts])
            zero = b.ref(b.const(np.zeros((), x.dtype)), [])
            rhs_col = f"({' && '.join(guards)}) ? {read} : {zero}"
            b.emit([b.statement(col, ["n", "c", *positions, *sp], "=", rhs_col)], [x], [col], "other")
            rhs = f"{b.ref(w, ['f', 'r_c', *taps])} * {b.ref(col, ['n', 'r_c', *taps, *sp])}"
            reductions += [(taps[d], kernel[d]) for d in range(k)]
            reads = [col, w]
        statements = [b.statement(out, ["n", "f", *sp], "+=!", rhs, reductions)]
        if bias is not None:
            statements.append(b.statement(out, ["n", "f", *sp], "=",
                                          f"{out.ident}(n, f, {', '.join(sp)}) + {b.ref(bias, ['f'])}"))
            reads.append(bias)
        b.emit(statements, reads, [out], "contraction")
        return [out]


class ConvTranspose(Converter):
    """The transpose of a convolution, gathered: output position ``o`` sums the inputs ``i`` and
    taps ``t`` with ``i * stride + t * dilation - pad_begin == o``, i.e. ``i = (o + pad_begin -
    t * dilation) / stride`` where that divides exactly and falls inside the input (the guard
    of each term).  Output shape and padding as onnx's reference computes them (``pads``,
    ``output_shape``, ``output_padding``, ``auto_pad``)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, w, bias, groups, n, channels = _convolution_operands(b, node, inputs)
        k = x.rank - 2
        per_group, kernel = w.shape[1], list(w.shape[2:])
        strides = list(node.attr("strides") or [1] * k)
        dilations = list(node.attr("dilations") or [1] * k)
        extra = list(node.attr("output_padding") or [0] * k)
        outs, begin = ConvTranspose._geometry(node, x.shape[2:], kernel, strides, dilations, extra)
        sp, taps = [f"s{d}" for d in range(k)], [f"r_k{d}" for d in range(k)]
        guards, subscripts = [], []
        for d in range(k):
            at = f"{sp[d]} + {begin[d]}" if begin[d] >= 0 else f"{sp[d]} - {-begin[d]}"
            at += f" - {_affine(dilations[d], taps[d], 0)}"
            guards += [f"{at} >= 0", f"{at} < {strides[d] * x.shape[2 + d]}"]
            if strides[d] > 1:
                guards.append(f"({at}) % {strides[d]} == 0")
                subscripts.append(f"({at}) / {strides[d]}")
            else:
                subscripts.append(at)
        zero = b.ref(b.const(np.zeros((), x.dtype)), [])
        ranges = [("r_c", channels // groups)] + [(taps[d], kernel[d]) for d in range(k)]
        if groups == 1:
            out = b.new([n, per_group, *outs], x.dtype)
            product = f"{b.ref(x, ['n', 'r_c', *subscripts])} * {b.ref(w, ['r_c', 'f', *taps])}"
            indices, reads, result = ["n", "f", *sp], [x, w], out
            bias_ref = b.ref(bias, ["f"]) if bias is not None else None
        else:
            x5 = b.view(x, [n, groups, channels // groups, *x.shape[2:]])
            w5 = b.view(w, [groups, channels // groups, per_group, *kernel])
            out = b.new([n, groups, per_group, *outs], x.dtype)
            product = f"{b.ref(x5, ['n', 'g', 'r_c', *subscripts])} * {b.ref(w5, ['g', 'r_c', 'f', *taps])}"
            indices, reads, result = ["n", "g", "f", *sp], [x5, w5], out
            if bias is not None:
                bias = b.view(bias, [groups, per_group])
            bias_ref = b.ref(bias, ["g", "f"]) if bias is not None else None
        statements = [b.statement(out, indices, "+=!", f"({' && '.join(guards)}) ? {product} : {zero}", ranges)]
        if bias is not None:
            statements.append(b.statement(out, indices, "=", f"{b.ref(out, indices)} + {bias_ref}"))
            reads.append(bias)
        b.emit(statements, reads, [out], "other")
        return [result if groups == 1 else b.view(out, [n, groups * per_group, *outs])]

    @staticmethod
    def _geometry(node, spatial, kernel, strides, dilations, extra):
        """(output extents, padding at the beginning of each dimension)."""
        k = len(spatial)
        pads, shape = node.attr("pads"), node.attr("output_shape")
        auto_pad = node.attr("auto_pad", "NOTSET")
        if shape is not None:
            shape = list(shape)[-k:]
        span = [strides[d] * (spatial[d] - 1) + extra[d] + (kernel[d] - 1) * dilations[d] + 1 for d in range(k)]
        if pads is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            shape = shape or [spatial[d] * strides[d] for d in range(k)]
            total = [span[d] - shape[d] for d in range(k)]
            begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
            return shape, begin
        pads = list(pads or [0] * (2 * k))
        if auto_pad == "VALID":
            pads = [0] * (2 * k)
        if shape is None:
            shape = [span[d] - pads[d] - pads[k + d] for d in range(k)]
        return shape, pads[:k]


def _reflected(x: str, low: float, high: float) -> str:
    """``x`` (a double) reflected at ``low`` and ``high`` until it lies between them, as onnx's
    GridSample reflects coordinates and indices outside the image."""
    span = _number(high - low)
    low_text, high_text = _number(low), _number(high)

    def folded(distance: str, inward: str, sign: str) -> str:
        """An even number of spans past the edge lands ``rest`` inside it (``inward``, moving
        by ``sign``), an odd number ``rest`` inside the other edge."""
        times = f"trunc({distance} / {span})"
        rest = f"({distance} - {times} * {span})"
        other = "-" if sign == "+" else "+"
        outward = high_text if inward == low_text else low_text
        return f"(fmod({times}, 2.0) == 0 ? {inward} {sign} {rest} : {outward} {other} {rest})"
    return (f"({x} < {low_text} ? {folded(f'({low_text} - {x})', low_text, '+')} : "
            f"{x} > {high_text} ? {folded(f'({x} - {high_text})', high_text, '-')} : {x})")


#: Keys' cubic convolution (a = -0.75, as PyTorch and onnx) for the taps at -1, 0, 1, 2 from
#: the floor of a coordinate, of the coordinate's fraction ``t``.
_CUBIC_TAPS = ("((-0.75 * ({t} + 1) + 3.75) * ({t} + 1) - 6.0) * ({t} + 1) + 3.0",
               "(1.25 * {t} - 2.25) * {t} * {t} + 1",
               "(1.25 * (1 - {t}) - 2.25) * (1 - {t}) * (1 - {t}) + 1",
               "((-0.75 * (2 - {t}) + 3.75) * (2 - {t}) - 6.0) * (2 - {t}) + 3.0")


class GridSample(Converter):
    """``Y[n, c, p] = X[n, c]`` sampled at ``grid[n, p]`` (coordinates in [-1, 1], the last
    spatial axis first), nearest, (multi)linear or (multi)cubic, the samples outside the image
    zeros, the border's or reflected, as onnx's reference (PyTorch's grid_sample).  One kernel
    finds each output point's taps along each axis (the index, -1 for a zero, and the weight);
    a second sums weight products times the pixels they gather."""

    @staticmethod
    def _impl_v16(b, node, inputs):
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "bilinear"),
                                                              node.attr("mode", "bilinear"))
        return GridSample._sample(b, node, inputs, mode)

    @staticmethod
    def _impl_v20(b, node, inputs):
        return GridSample._sample(b, node, inputs, node.attr("mode", "linear"))

    @staticmethod
    def _sample(b, node, inputs, mode: str):
        x, grid = inputs[:2]
        padding = node.attr("padding_mode", "zeros")
        align = bool(node.attr("align_corners", 0))
        if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
            raise UnsupportedError(f"{b.where}: mode {mode!r} and padding_mode {padding!r} (nearest, linear or "
                                   f"cubic; zeros, border or reflection)")
        _float_only(b, x)
        _float_only(b, grid)
        k = x.rank - 2
        if k < 1 or grid.rank != k + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != k:
            raise UnsupportedError(f"{b.where}: a grid of shape {grid.shape} for an input of shape {x.shape} "
                                   f"(expected (N, spatial..., {k}))")
        n, channels, spatial = x.shape[0], x.shape[1], x.shape[2:]
        points = grid.shape[1:-1]
        taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
        o = indices(k, "o")
        point = ["n"] + o
        statements, tables = [], []
        for d, extent in enumerate(spatial):
            low, high = (0.0, extent - 1.0) if align else (-0.5, extent - 0.5)
            g = f"double({b.ref(grid, point + [str(k - 1 - d)])})"
            # onnx's reference keeps coordinates in float32 whatever the grid's type
            place = f"float(({g} + 1) / 2 * {extent - 1})" if align else f"float((({g} + 1) * {extent} - 1) / 2)"
            if mode == "nearest":
                place = f"rint({place})"
            if padding == "border":
                place = f"(({place} < {_number(low)} || {place} > {_number(high)}) ? " \
                        f"fmin(fmax({place}, 0.0), {_number(extent - 1)}) : {place})"
            elif padding == "reflection":
                place = f"float({_reflected(f'double({place})', low, high)})"
            coordinate = b.new([n, *points], np.float32)
            statements.append(b.statement(coordinate, point, "=", place))
            at = b.ref(coordinate, point)
            first = {"nearest": f"int64({at})", "linear": f"int64(floor({at}))",
                     "cubic": f"int64(floor({at})) - 1"}[mode]
            tap = f"({first} + r)"
            if padding == "zeros":
                index_rhs = f"({tap} >= 0 && {tap} < {extent}) ? {tap} : int64(-1)"
            elif padding == "border":
                index_rhs = f"max(min({tap}, int64({extent - 1})), int64(0))"
            else:
                index_rhs = f"int64({_reflected(f'double({tap})', low, high)})"
            index = b.new([n, *points, taps], np.int64)
            statements.append(b.statement(index, point + ["r"], "=", index_rhs))
            weight = None
            if mode != "nearest":
                fraction = f"{tc_type(x.dtype)}({at} - floor({at}))"
                formulas = ["1 - {t}", "{t}"] if mode == "linear" else list(_CUBIC_TAPS)
                chosen = formulas[-1].format(t=fraction)
                for position in range(len(formulas) - 2, -1, -1):
                    chosen = f"r == {position} ? {formulas[position].format(t=fraction)} : {chosen}"
                weight = b.new([n, *points, taps], x.dtype)
                statements.append(b.statement(weight, point + ["r"], "=", f"{tc_type(x.dtype)}({chosen})"))
            tables.append((index, weight))
        b.emit(statements, [grid], [t for pair in tables for t in pair if t is not None], "other")
        reductions = [(f"r{d}", taps) for d in range(k)]
        gathered = [b.ref(index, point + [f"r{d}"]) for d, (index, _) in enumerate(tables)]
        pixel = b.ref(x, ["n", "c"] + gathered)
        if padding == "zeros":
            pixel = f"({' && '.join(f'{i} >= 0' for i in gathered)}) ? {pixel} : {tc_type(x.dtype)}(0)"
        factors = [b.ref(weight, point + [f"r{d}"]) for d, (_, weight) in enumerate(tables) if weight is not None]
        out = b.new([n, channels, *points], x.dtype)
        rhs = " * ".join(factors + [f"({pixel})"])
        b.emit([b.statement(out, ["n", "c"] + o, "+=!", rhs, reductions)],
               [x] + [t for pair in tables for t in pair if t is not None], [out], "other")
        return [out]


class Resize(Converter):
    """Resize as one gather-and-weigh pass per resized axis: output ``y`` along the axis is
    ``sum_j W[y, j] * X(..., I[y, j], ...)``.  The tables come from onnx's own reference
    implementation, run when the model is compiled on an identity matrix along each axis (a
    resize is linear and separable), so every mode, coordinate transformation, rounding rule,
    antialiasing and ``exclude_outside`` means exactly what onnx says; the pass keeps a row's
    nonzero weights only (one for nearest, two for linear, four for cubic)."""

    CONSTANT_INPUTS = (1, 2, 3)

    @staticmethod
    def _impl_v10(b, node, inputs):   # inputs (X, scales)
        raise AssertionError("Resize.convert passes the opset to _resize")

    _impl_v11 = _impl_v10              # inputs (X, roi, scales, sizes)

    @classmethod
    def convert(cls, b, node, inputs, opset):
        # The weights are computed by onnx's reference at the model's own opset.
        return cls._resize(b, node, inputs, opset)

    @staticmethod
    def _resize(b, node, inputs, opset):
        x = inputs[0]
        given = lambda i: inputs[i] if len(inputs) > i and inputs[i] is not None else None  # noqa: E731
        if opset < 11:
            roi, scales, sizes = None, given(1), None
        else:
            roi, scales, sizes = given(1), given(2), given(3)
        mode = node.attr("mode", "nearest")
        if node.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
            raise UnsupportedError(f"{b.where}: Resize with coordinate_transformation_mode "
                                   "'tf_crop_and_resize'")
        if mode != "nearest" and x.dtype.kind != "f":
            raise UnsupportedError(f"{b.where}: Resize mode {mode!r} on {x.dtype}")
        axes = [a % x.rank for a in (node.attr("axes") or range(x.rank))]
        scales = [float(v) for v in _require_const(b, scales, "Resize's scales")] if scales is not None and \
            scales.size else None
        sizes = [int(v) for v in _require_const(b, sizes, "Resize's sizes")] if sizes is not None and \
            sizes.size else None
        if (scales is None) == (sizes is None):
            raise UnsupportedError(f"{b.where}: Resize needs exactly one of scales and sizes")
        del roi
        out_shape = list(x.shape)
        per_axis = {}
        if scales is not None:
            for axis, scale in zip(axes, scales):
                out_shape[axis] = int(np.floor(x.shape[axis] * scale))
                per_axis[axis] = ("scales", scale)
        else:
            policy = node.attr("keep_aspect_ratio_policy", "stretch")
            if policy == "stretch":
                wanted = dict(zip(axes, sizes))
            else:
                ratios = [size / x.shape[axis] for axis, size in zip(axes, sizes)]
                common = min(ratios) if policy == "not_larger" else max(ratios)
                wanted = {axis: int(np.floor(x.shape[axis] * common + 0.5)) for axis in axes}
            for axis, size in wanted.items():
                out_shape[axis] = size
                per_axis[axis] = ("sizes", size)
        value = x
        for axis in sorted(per_axis):
            if out_shape[axis] == x.shape[axis] and per_axis[axis] in (("scales", 1.0), ("sizes", x.shape[axis])):
                continue
            weights = _resize_weights(node, opset, x.shape[axis], *per_axis[axis])
            value = _weighted_gather(b, value, axis, weights)
        if value is x:
            value = b.new(list(x.shape), x.dtype)
            idx = indices(x.rank)
            b.emit([b.statement(value, idx, "=", b.ref(x, idx))], [x], [value], "elementwise")
        return [value]


class Upsample(Converter):
    """Opsets 7 to 9's Upsample: Resize of opset 10 (asymmetric coordinates; nearest rounds
    down), its scales an attribute (7) or an input (9)."""

    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _resize(b, node, x, scales):
        from onnx import helper
        mode = node.attr("mode", "nearest")
        if mode not in ("nearest", "linear"):
            raise UnsupportedError(f"{b.where}: Upsample mode {mode!r} (nearest or linear)")
        resize = Node(helper.make_node("Resize", ["X", "scales"], node.outputs, mode=mode), node.name)
        return Resize._resize(b, resize, [x, scales], 10)

    @staticmethod
    def _impl_v7(b, node, inputs):
        scales = node.attr("scales")
        if scales is None:
            raise UnsupportedError(f"{b.where}: Upsample needs its scales attribute")
        return Upsample._resize(b, node, inputs[0], b.const(np.asarray(scales, np.float32)))

    @staticmethod
    def _impl_v9(b, node, inputs):
        return Upsample._resize(b, node, inputs[0], inputs[1] if len(inputs) > 1 else None)


def _by_reference(op_type: str, inputs: list, opset: int, **attributes) -> list[np.ndarray]:
    """The outputs of one ``op_type`` node on constant ``inputs`` (None for an omitted optional
    one), by onnx's reference implementation at ``opset``: for operators that only make
    constants (window functions, filter banks) and for the matrices of linear ones."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator
    names = [f"in{k}" if value is not None else "" for k, value in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["out"], **attributes)
    given = [numpy_helper.from_array(np.asarray(value), name) for name, value in zip(names, inputs) if name]
    graph = helper.make_graph([node], op_type, [], [helper.make_empty_tensor_value_info("out")], given)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return [np.asarray(output) for output in ReferenceEvaluator(model).run(None, {})]


class _Constant(Converter):
    """An operator whose inputs are all known when the model is compiled and whose output is a
    table (HannWindow, MelWeightMatrix, ...): computed then by onnx's reference.  ``SINCE``:
    the first opset that has it."""

    SINCE = 17

    @classmethod
    def version_for(cls, opset: int) -> int | None:
        return cls.SINCE if opset >= cls.SINCE else None

    @classmethod
    def convert(cls, b, node, inputs, opset):
        values = [_require_const(b, value, f"{node.op_type}'s input {k}") if value is not None else None
                  for k, value in enumerate(inputs)]
        attributes = {name: value for name, value in node.attributes.items()}
        return [b.const(out) for out in _by_reference(node.op_type, values, opset, **attributes)]


class HannWindow(_Constant):
    CONSTANT_INPUTS = (0,)


class HammingWindow(HannWindow):
    pass


class BlackmanWindow(HannWindow):
    pass


class MelWeightMatrix(_Constant):
    CONSTANT_INPUTS = (0, 1, 2, 3, 4)


def _fourier(b: Builder, x: Value, axis: int, length: int | None, inverse: bool, onesided: bool,
             signal, out_shape) -> Value:
    """The DFT of ``x`` along ``axis`` (its last axis the real, or real and imaginary, parts) as a
    product by its matrix, which onnx's reference gives applied to each basis signal: every
    mode (inverse, one-sided, a DFT length that pads or cuts) means what onnx says.  n x K
    multiply-adds a signal of n samples and K bins: fine for the frames of audio features.
    ``signal(n, c)``: the subscripts of ``x`` for sample ``n``'s part ``c`` at the output's
    indices; ``out_shape``: the output's shape, its axis of bins at ``axis``."""
    _float_only(b, x)
    n, parts = x.shape[axis], x.shape[-1]
    if parts not in (1, 2):
        raise UnsupportedError(f"{b.where}: {b.op_type}'s last axis must hold 1 (real) or 2 (complex) parts, "
                               f"not {parts}")
    basis = np.eye(n * parts, dtype=np.float64).reshape(n * parts, n, parts)
    attributes = {"inverse": int(inverse), "onesided": int(onesided)}
    (transformed,) = _by_reference("DFT", [basis, None if length is None else np.array(length, np.int64),
                                           np.array(1, np.int64)], 20, **attributes)
    bins, outputs = transformed.shape[1], transformed.shape[2]
    # In double, as onnx's reference computes: a part whose exact value is 0 (the imaginary
    # part of a symmetric signal's transform) then comes out near 1e-16, not at the rounding
    # of a float sum of terms of the signal's size, which the suite's atol of 1e-7 can reject.
    matrix = b.const(transformed.reshape(n, parts, bins, outputs))
    shape = list(out_shape(bins, outputs))
    sums, out = b.new(shape, np.float64), b.new(shape, x.dtype)
    idx = indices(len(shape))
    product = f"{b.ref(matrix, ['r0', 'r1', idx[axis], idx[-1]])} * double({b.ref(x, signal(idx, 'r0', 'r1'))})"
    b.emit([b.statement(sums, idx, "+=!", product, [("r0", n), ("r1", parts)]),
            b.statement(out, idx, "=", f"{tc_type(x.dtype)}({b.ref(sums, idx)})")], [x, matrix], [out], "reduction")
    return out


class DFT(Converter):
    CONSTANT_INPUTS = (1, 2)

    @staticmethod
    def _lower(b, node, x, length, axis):
        if x.rank < 2:
            raise UnsupportedError(f"{b.where}: DFT of a rank-{x.rank} tensor (a signal axis and a last axis of parts)")
        axis = _axis(b, axis, x.rank)
        if axis == x.rank - 1:
            raise UnsupportedError(f"{b.where}: DFT along the last axis, which holds the real and imaginary parts")
        length = None if length is None else int(_require_const(b, length, "DFT's dft_length").reshape(-1)[0])
        return [_fourier(b, x, axis, length, bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0)),
                         lambda p, n, c: p[:axis] + [n] + p[axis + 1:-1] + [c],
                         lambda bins, parts: list(x.shape[:axis]) + [bins] + list(x.shape[axis + 1:-1]) + [parts])]

    @staticmethod
    def _impl_v17(b, node, inputs):
        length = inputs[1] if len(inputs) > 1 else None
        return DFT._lower(b, node, inputs[0], length, node.attr("axis", 1))

    @staticmethod
    def _impl_v20(b, node, inputs):
        length = inputs[1] if len(inputs) > 1 else None
        axis = int(_require_const(b, inputs[2], "DFT's axis").reshape(-1)[0]) \
            if len(inputs) > 2 and inputs[2] is not None else -2
        return DFT._lower(b, node, inputs[0], length, axis)


class STFT(Converter):
    """Frames of ``frame_length`` samples every ``frame_step``, each weighed by the window and
    transformed: ``(batch, frames, bins, 2)``."""

    CONSTANT_INPUTS = (1, 3)

    @staticmethod
    def _impl_v17(b, node, inputs):
        signal, step = inputs[:2]
        window = inputs[2] if len(inputs) > 2 else None
        length = inputs[3] if len(inputs) > 3 else None
        step = int(_require_const(b, step, "STFT's frame_step").reshape(-1)[0])
        if length is not None:
            length = int(_require_const(b, length, "STFT's frame_length").reshape(-1)[0])
        elif window is not None:
            length = window.shape[0]
        else:
            raise UnsupportedError(f"{b.where}: STFT needs a window or a frame_length")
        if signal.rank != 3 or step < 1 or not 1 <= length <= signal.shape[1]:
            raise UnsupportedError(f"{b.where}: STFT of a {list(signal.shape)} signal with frames of {length} "
                                   f"every {step} (a (batch, samples, 1 or 2) signal)")
        frames = (signal.shape[1] - length) // step + 1
        # The frames as a view of the signal would overlap; the window multiplies them first.
        framed = b.new([signal.shape[0], frames, length, signal.shape[2]], signal.dtype)
        idx = indices(4)
        sample = [idx[0], f"{step} * {idx[1]} + {idx[2]}", idx[3]]
        weighed = b.ref(signal, sample) if window is None else f"{b.ref(signal, sample)} * {b.ref(window, [idx[2]])}"
        b.emit([b.statement(framed, idx, "=", weighed)], [signal] + ([window] if window is not None else []),
               [framed], "other")
        return [_fourier(b, framed, 2, None, False, bool(node.attr("onesided", 1)),
                         lambda p, n, c: p[:2] + [n, c], lambda bins, parts: [signal.shape[0], frames, bins, parts])]


def _resize_weights(node, opset: int, length: int, kind: str, amount) -> np.ndarray:
    """(output length x ``length``) weights of a one-axis Resize with ``node``'s attributes, by
    onnx's reference implementation applied to the identity."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
    attributes = [a for a in node.proto.attribute if a.name not in ("axes", "keep_aspect_ratio_policy")]
    resize = helper.make_node("Resize", [], ["Y"])
    if opset < 11:
        # onnx's reference has opset 11's Resize only.  Before, coordinates were asymmetric
        # (x_in = x_out / scale), and a nearest neighbour rounded down when upsampling, up when
        # downsampling, as onnxruntime's Resize-10 and Upsample do.
        attributes = [helper.make_attribute("mode", node.attr("mode", "nearest")),
                      helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
                      helper.make_attribute("nearest_mode", "floor" if float(amount) >= 1 else "ceil")]
        opset = 11
    resize.attribute.extend(attributes)
    if kind == "scales":
        resize.input.extend(["X", "", "scales"])
        initializers = [helper.make_tensor("scales", TensorProto.FLOAT, [2], [float(amount), 1.0])]
    else:
        resize.input.extend(["X", "", "", "sizes"])
        initializers = [helper.make_tensor("sizes", TensorProto.INT64, [2], [int(amount), length])]
    graph = helper.make_graph([resize], "axis", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [length, length])],
                              [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    (result,) = ReferenceEvaluator(model).run(None, {"X": np.eye(length)})
    return np.asarray(result, dtype=np.float64)


def _weighted_gather(b, x, axis: int, weights: np.ndarray):
    """``x`` resampled along ``axis``: output ``y`` is ``sum_j W[y, j] * x(.., I[y, j], ..)`` over
    the nonzero weights of row ``y`` of ``weights``."""
    rows = weights.shape[0]
    terms = max(1, int((weights != 0).sum(axis=1).max()))
    table = np.zeros((rows, terms), np.int64)
    factor = np.zeros((rows, terms), np.float64)
    for y in range(rows):
        nonzero = np.flatnonzero(weights[y])
        table[y, :len(nonzero)] = nonzero
        factor[y, :len(nonzero)] = weights[y, nonzero]
    shape = list(x.shape)
    shape[axis] = rows
    out = b.new(shape, x.dtype)
    idx = indices(x.rank)
    where = b.const(table if terms > 1 else table[:, 0])
    pick = lambda j: [idx[axis], str(j)] if terms > 1 else [idx[axis]]  # noqa: E731
    reads = [x, where]
    if terms == 1 and np.all(factor[:, 0] == 1):      # nearest: a gather
        rhs = b.ref(x, idx[:axis] + [b.ref(where, pick(0))] + idx[axis + 1:])
    else:
        scale = b.const(factor.astype(x.dtype) if terms > 1 else factor[:, 0].astype(x.dtype))
        reads.append(scale)
        rhs = " + ".join(f"{b.ref(scale, pick(j))} * {b.ref(x, idx[:axis] + [b.ref(where, pick(j))] + idx[axis + 1:])}"
                         for j in range(terms))
    b.emit([b.statement(out, idx, "=", rhs)], reads, [out], "other")
    return out


#: Output positions per image up to which a convolution runs as a matrix product (polyc's gemm
#: kernel) rather than as polyc's direct convolution kernel, for (windows of more than one
#: tap, pointwise 1x1), by the host's vector width.  With very few positions the direct
#: kernel's vectors along the output row are mostly empty (a 3x3 window at 5x5 outputs fills
#: 25 of 48 lanes; the product's 8 x 16 or 8 x 32 blocks 25 of 32), and a 1x1 convolution of
#: one vector's positions or fewer (efficientnet's squeeze-and-excitation: one position) is a
#: matrix-vector product.  Above that the direct kernel: since it reads the weights in place
#: (no packing per call) it runs faster than the product at 7x7, 14x14 and beyond, where with
#: packed weights the product had been 2.6x faster at 7x7 (3x3, an Intel Xeon) and 1.5x (1x1,
#: an AMD EPYC Zen 3).  Measured on an AMD EPYC Zen 5, 2 threads, batch 1, old limits
#: (144, 196) against these: resnet18 11.74 -> 11.33 ms (batch 8: 90.3 -> 86.3),
#: mobilenet_v2 7.60 -> 7.01, efficientnet_b0 14.95 -> 13.86, squeezenet1_1 the same (4.74 and
#: 4.85); AVX2 code on the same machine: resnet18 21.7 -> 20.4, mobilenet_v2 7.71 -> 7.02.
MATRIX_PRODUCT_POSITIONS = {512: (36, 16), 256: (36, 8)}


def _as_matrix_product(b: Builder, kernel, outs, strides, dilations, begin, end) -> bool:
    positions = int(np.prod(outs)) if outs else 1
    pointwise = all(size == 1 for size in kernel) and all(s == 1 for s in strides) and not any(begin) \
        and not any(end)
    windows, pointwise_limit = MATRIX_PRODUCT_POSITIONS.get(b.vector_bits,
                                                            MATRIX_PRODUCT_POSITIONS[256])
    return positions <= (pointwise_limit if pointwise else windows)


class _Attributes:
    def __init__(self, **attributes):
        self.attributes = attributes

    def attr(self, name, default=None):
        return self.attributes.get(name, default)


class MaxPool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return MaxPool.lower(b, node, inputs, channels_last=False)

    @staticmethod
    def lower(b, node, inputs, channels_last: bool):
        x = inputs[0]
        kernel = node.attr("kernel_shape")
        outs, begin, end, strides, dilations = _spatial(b, node, x, kernel, channels_last=channels_last)
        out = b.new(image_indices(channels_last, x.shape[0], x.shape[-1 if channels_last else 1], outs), x.dtype)
        if len(node.outputs) > 1 and node.outputs[1]:  # (the channels-last layout leaves these to ONNX's)
            best = _pool(b, x, out, kernel, begin, strides, dilations, "max")
            return [best, _max_pool_indices(b, node, x, best, kernel, begin, strides, dilations)]
        if channels_last and _unrolled_max_pool(b, x, out, kernel, begin, strides, dilations):
            return [out]
        if _separable_max_pool(b, x, out, kernel, begin, strides, dilations, channels_last):
            return [out]
        return [_pool(b, x, out, kernel, begin, strides, dilations, "max", channels_last=channels_last)]


def _max_pool_indices(b, node, x, best, kernel, begin, strides, dilations) -> Value:
    """MaxPool's Indices: where in ``x`` (flattened, row-major; ``storage_order`` 1: each
    image column-major) each window's maximum ``best`` is, its first place in the window's
    row-major order, as onnx's reference and onnxruntime: the first tap that holds the
    maximum, then its place."""
    k = len(kernel)
    spatial = list(x.shape[2:])
    column_major = node.attr("storage_order", 0)
    if column_major and k != 2:
        raise UnsupportedError(f"{b.where}: storage_order 1 of a {k}-D MaxPool (2-D only)")
    sp, taps = [f"s{d}" for d in range(k)], [f"r_k{d}" for d in range(k)]

    def positions(tap):
        return [f"({_affine(strides[d], sp[d], 0)} + {dilations[d]} * {tap[d]} - {begin[d]})" for d in range(k)]
    window = positions(taps)
    inside = " && ".join(f"{p} >= 0 && {p} < {e}" for p, e in zip(window, spatial))
    strides_of_taps = [math.prod(kernel[d + 1:]) for d in range(k)]
    tap_number = " + ".join(f"{t} * {m}" for t, m in zip(taps, strides_of_taps))
    idx = ["n", "c"] + sp
    first = b.new(best.shape, np.int64)
    read = b.ref(x, ["n", "c"] + window)
    at_first = f"{first.ident}({', '.join(idx)})"
    place = positions([f"(({at_first} / {m}) % {kernel[d]})" for d, m in enumerate(strides_of_taps)])
    flat = f"(n * {x.shape[1]} + c)"
    for d in (reversed(range(k)) if column_major else range(k)):
        flat = f"({flat}) * {spatial[d]} + {place[d]}"
    where = b.new(best.shape, np.int64)
    b.emit([b.statement(first, idx, "min=!", f"({inside} && {read} == {b.ref(best, idx)}) ? int64({tap_number}) : "
                                             f"int64({math.prod(kernel)})", [(t, kernel[d]) for d, t in enumerate(taps)]),
            b.statement(where, idx, "=", f"int64({flat})")], [x, best], [where], "reduction")
    return where


class AveragePool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return AveragePool.lower(b, node, inputs, channels_last=False)

    @staticmethod
    def lower(b, node, inputs, channels_last: bool):
        x = inputs[0]
        kernel = node.attr("kernel_shape")
        outs, begin, end, strides, dilations = _spatial(b, node, x, kernel, channels_last=channels_last)
        out = b.new(image_indices(channels_last, x.shape[0], x.shape[-1 if channels_last else 1], outs), x.dtype)
        return [_pool(b, x, out, kernel, begin, strides, dilations, "average",
                      include_pad=node.attr("count_include_pad", 0), end=end, channels_last=channels_last)]


class LpPool(Converter):
    """``(sum of |x|^p over the window) ^ (1 / p)``, the padding counting as zeros."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        _float_only(b, x)
        p = node.attr("p", 2)
        if isinstance(p, float):  # LpPool-1's p was a float
            p = int(p) if float(p).is_integer() else p
        if not p or p <= 0:
            raise UnsupportedError(f"{b.where}: LpPool with p={p} (a positive number)")
        kernel = node.attr("kernel_shape")
        outs, begin, end, strides, dilations = _spatial(b, node, x, kernel)
        out = b.new(image_indices(False, x.shape[0], x.shape[1], outs), x.dtype)
        return [_pool(b, x, out, kernel, begin, strides, dilations, ("lp", p))]


#: Windows of at most this many taps along one dimension are unrolled by the separable max pool.
SEPARABLE_POOL_TAPS = 8
#: Output positions per dimension, at each end, whose windows may hang over the input's edge.
_SEPARABLE_POOL_EDGES = 4


def _window_interior(extent: int, outputs: int, size: int, stride: int, dilation: int, pad: int) -> tuple[int, int]:
    """``(low, high)``: the output positions ``low <= o < high`` along one dimension whose
    window (``size`` taps ``stride * o + dilation * t - pad``) lies inside the input's
    ``extent``; the positions before and after are edges that read padding."""
    low = min(outputs, -(-pad // stride))
    return low, max(low, min(outputs, (extent - 1 - dilation * (size - 1) + pad) // stride + 1))


def _window_regions(extent: int, outputs: int, size: int, stride: int, dilation: int, pad: int):
    """The output positions of a window along one dimension as ``(first, last + 1, taps)``
    regions: the interior, where all ``size`` taps fall inside the input of ``extent``, and
    one region per edge position with the taps that do.  None when an edge is too wide to
    list or a position has no tap inside (then the guarded reduction is used)."""
    def taps(o):
        return tuple(t for t in range(size) if 0 <= stride * o + dilation * t - pad < extent)

    low, high = _window_interior(extent, outputs, size, stride, dilation, pad)
    edges = list(range(low)) + list(range(high, outputs))
    if len(edges) > 2 * _SEPARABLE_POOL_EDGES or any(not taps(o) for o in edges):
        return None
    regions = [(o, o + 1, taps(o)) for o in range(low)]
    if high > low:
        regions.append((low, high, tuple(range(size))))
    return regions + [(o, o + 1, taps(o)) for o in range(high, outputs)]


#: NCHW depthwise convolutions with windows of at most this many taps are unrolled per region.
#: With 5 x 5 windows polyc's scheduler fused the regions into one loop nest with their
#: conditions inside the vector loop (10x slower): they keep the convolution kernel.  (In NHWC
#: depthwise convolutions have a kernel of their own, :mod:`polyc.codegen.depthwise`.)
UNROLLED_DEPTHWISE_TAPS = 9


def unrolled_depthwise(b, x, w, bias, kernel, outs, begin, strides, dilations):
    """A depthwise convolution (one filter per channel) of an NCHW image as a sum of its taps written out,
    vectorised along the output row like an elementwise step, rather than through the
    convolution kernel, whose register blocks have one channel here and a reduction of a few
    taps, and whose padding needs a copy of the image first.  The output starts as the bias;
    its interior (every tap inside the image) adds the taps without guards; the slabs along
    each edge add the taps that fall inside.  mobilenet_v2's 3 x 3 stride-2 layer on 96 x 112 x
    112: 1.75 ms with its padding step, 0.28 ms so (AMD EPYC Zen 3).  None when the window is
    too large (see UNROLLED_DEPTHWISE_TAPS), or for float16, whose taps would be added with a
    rounding each: as a reduction they are summed in float32 (polyc.lang.float16_sums)."""
    k = len(kernel)
    if math.prod(kernel) > UNROLLED_DEPTHWISE_TAPS or x.dtype == np.float16:
        return None
    first = 2  # the first spatial axis
    n, channels = x.shape[0], x.shape[1]
    weights = b.view(w, [channels, *kernel])
    out = b.new(image_indices(False, n, channels, outs), x.dtype)
    sp = [f"s{d}" for d in range(k)]
    idx = image_indices(False, "n", "c", sp)
    full = [(0, extent) for extent in outs]
    interior = [_window_interior(x.shape[first + d], outs[d], kernel[d], strides[d], dilations[d], begin[d])
                for d in range(k)]
    zero = b.ref(b.const(np.zeros((), x.dtype)), [])

    def add_taps(ranges, guarded: bool) -> str:
        terms = []
        for taps in np.ndindex(*kernel):
            at = [_affine(strides[d], sp[d], dilations[d] * t - begin[d]) for d, t in enumerate(taps)]
            read = b.ref(x, image_indices(False, "n", "c", at))
            if guarded:
                inside = " && ".join(f"{a} >= 0 && {a} < {x.shape[first + d]}" for d, a in enumerate(at))
                read = f"(({inside}) ? {read} : {zero})"
            tap = list(map(str, taps))
            terms.append(f"{b.ref(weights, ['c', *tap])} * {read}")
        ranges = image_indices(False, (0, n), (0, channels), ranges)
        where = ", ".join(f"{name} in {lo}:{hi}" for name, (lo, hi) in zip(idx, ranges))
        return f"{out.ident}({', '.join(idx)}) += {' + '.join(terms)} where {where}"

    start = b.ref(bias, ["c"]) if bias is not None else zero
    statements = [f"{out.ident}({', '.join(idx)}) = {start} where "
                  + ", ".join(f"{name} in 0:{extent}" for name, extent in zip(idx, out.shape))]
    if all(high > low for low, high in interior):
        statements.append(add_taps(interior, guarded=False))
    for d in range(k):
        if any(high <= low for low, high in interior[:d]):
            break  # the slabs of the dimensions before cover the rest
        for edge in ((0, interior[d][0]), (interior[d][1], outs[d])):
            if edge[1] > edge[0]:
                statements.append(add_taps(interior[:d] + [edge] + full[d + 1:], guarded=True))
    b.emit(statements, [x, weights] + ([bias] if bias is not None else []), [out], "other")
    return out


def _region_statements(b, x, out, kernel, begin, strides, dilations, combine) -> list[str] | None:
    """For an NHWC image ``x`` and a window over its spatial dimensions, one statement per
    region of output positions (the interior, where every tap is inside the image, and each
    edge, with the taps inside; :func:`_window_regions` along each dimension), each
    ``out(n, s.., c) = combine([(taps, read of x at them), ...])``, with no guards, vectorised
    along the channels, the region with the last positions first (TC takes a temporary's
    extent from its first write).  None for windows of more than UNROLLED_DEPTHWISE_TAPS taps
    or wide edges."""
    k = len(kernel)
    if math.prod(kernel) > UNROLLED_DEPTHWISE_TAPS:
        return None
    plans = [_window_regions(x.shape[1 + d], out.shape[1 + d], kernel[d], strides[d], dilations[d], begin[d])
             for d in range(k)]
    if any(plan is None for plan in plans):
        return None
    sp = [f"s{d}" for d in range(k)]
    idx = image_indices(True, "n", "c", sp)
    statements = []
    for regions in sorted(itertools.product(*plans), key=lambda rs: [-hi for _, hi, _ in rs]):
        reads = []
        for taps in itertools.product(*(taps for _, _, taps in regions)):
            at = [_affine(strides[d], sp[d], dilations[d] * t - begin[d]) for d, t in enumerate(taps)]
            reads.append((taps, b.ref(x, image_indices(True, "n", "c", at))))
        ranges = image_indices(True, (0, x.shape[0]), (0, x.shape[-1]), [(lo, hi) for lo, hi, _ in regions])
        statements.append(f"{out.ident}({', '.join(idx)}) = {combine(reads)} where "
                          + ", ".join(f"{name} in {lo}:{hi}" for name, (lo, hi) in zip(idx, ranges)))
    return statements


def _unrolled_max_pool(b, x, out, kernel, begin, strides, dilations) -> bool:
    """A MaxPool of an NHWC image as one max of its taps written out per region of positions
    (:func:`_region_statements`): one pass over the image, where the separable form
    (:func:`_separable_max_pool`) makes two through a temporary.  resnet18's 3x3 stride-2 pool
    on 112 x 112 x 64 at batch 8: 1.6 ms separable (AMD EPYC Zen 5).  False (nothing emitted)
    when the window does not suit regions."""
    maximum = "fmax" if x.dtype.kind == "f" else "max"

    def combine(reads):
        rhs = reads[0][1]
        for _, read in reads[1:]:
            rhs = f"{maximum}({rhs}, {read})"
        return rhs
    statements = _region_statements(b, x, out, kernel, begin, strides, dilations, combine)
    if statements is None:
        return False
    # fusion="min": isl would otherwise fuse the regions' nests into one, their conditions
    # inside the vectorised channel loop.
    b.emit(statements, [x], [out], "reduction", dict(fusion="min"))
    return True


def _separable_max_pool(b, x, out, kernel, begin, strides, dilations, channels_last=False) -> bool:
    """MaxPool as one max per spatial dimension, outermost first (a max over a box is the max
    along its rows of the max over its rows), with the taps unrolled into ``fmax`` and the
    output positions split into an interior, which reads without guards, and the few edge
    positions, which read only their taps inside the input (max ignores the padding).  For
    resnet18's 3x3 stride-2 pool on 64 x 112 x 112: 2.0 ms as a guarded reduction, 0.2 ms so
    (AMD EPYC Zen 3, 2 threads), as fast as onnxruntime's.  False (nothing emitted) for long
    windows or wide edges."""
    k = len(kernel)
    if any(size > SEPARABLE_POOL_TAPS for size in kernel):
        return False
    first = 1 if channels_last else 2  # the first spatial axis
    plans = [_window_regions(x.shape[first + d], out.shape[first + d], kernel[d], strides[d], dilations[d],
                             begin[d]) for d in range(k)]
    if any(plan is None for plan in plans):
        return False
    statements, source = [], x
    maximum = "fmax" if x.dtype.kind == "f" else "max"  # fmax would make integers floats
    idx = image_indices(channels_last, "n", "c", [f"s{d}" for d in range(k)])
    # The outermost dimension first: its pass reads whole rows (vectors of consecutive
    # elements) and, with a stride, leaves fewer rows for the passes that read along them
    # (resnet18's 3x3 stride-2 pool on 64 x 112 x 112: 0.24 -> 0.11 ms alone, AMD EPYC Zen 5).
    for d in range(k):
        axis_d = first + d
        shape = list(source.shape)
        shape[axis_d] = out.shape[axis_d]
        target = out if d == k - 1 else b.new(shape, x.dtype)
        # The last positions first: TC takes a temporary's extent from its first write.
        for low, stop, taps in sorted(plans[d], key=lambda region: -region[1]):
            reads = []
            for t in taps:
                at = _affine(strides[d], idx[axis_d], dilations[d] * t - begin[d])
                reads.append(b.ref(source, idx[:axis_d] + [at] + idx[axis_d + 1:]))
            rhs = reads[0]
            for read in reads[1:]:
                rhs = f"{maximum}({rhs}, {read})"
            ranges = ", ".join(f"{name} in {low if axis == axis_d else 0}:{stop if axis == axis_d else extent}"
                               for axis, (name, extent) in enumerate(zip(idx, shape)))
            statements.append(f"{target.ident}({', '.join(idx)}) = {rhs} where {ranges}")
        source = target
    b.emit(statements, [x], [out], "reduction")
    return True


def _pool(b, x, out, kernel, begin, strides, dilations, kind, include_pad=0, end=None, channels_last=False):
    k = len(kernel)
    first = 1 if channels_last else 2  # the first spatial axis
    sp = [f"s{d}" for d in range(k)]
    taps = [f"r_k{d}" for d in range(k)]
    positions = [f"{_affine(strides[d], sp[d], 0)} + {_affine(dilations[d], taps[d], 0)} - {begin[d]}"
                 if begin[d] else f"{_affine(strides[d], sp[d], 0)} + {_affine(dilations[d], taps[d], 0)}"
                 for d in range(k)]
    inside = []
    for d in range(k):
        if begin[d]:
            inside.append(f"{positions[d]} >= 0")
        inside.append(f"{positions[d]} < {x.shape[first + d]}")
    guard = " && ".join(inside)
    read = b.ref(x, image_indices(channels_last, "n", "c", positions))
    idx = image_indices(channels_last, "n", "c", sp)
    ranges = [(taps[d], kernel[d]) for d in range(k)]
    if kind == "max":
        lowest = b.const(np.array(-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min, x.dtype))
        rhs = f"({guard}) ? {read} : {b.ref(lowest, [])}" if guard else read
        b.emit([b.statement(out, idx, "max=!", rhs, ranges)], [x, lowest], [out], "reduction")
        return out
    total = b.new(out.shape, x.dtype)
    if isinstance(kind, tuple):  # ("lp", p): the p-norm of the window
        p = kind[1]
        power = f"{read} * {read}" if p == 2 else f"abs({read})" if p == 1 else f"pow(abs({read}), {_number(p)})"
        total_at = f"{total.ident}({', '.join(idx)})"
        root = f"sqrt({total_at})" if p == 2 else total_at if p == 1 else f"pow({total_at}, {_number(1 / p)})"
        b.emit([b.statement(total, idx, "+=!", f"({guard}) ? {power} : 0" if guard else power, ranges),
                b.statement(out, idx, "=", root)], [x], [out], "reduction")
        return out
    rhs = f"({guard}) ? {read} : 0" if guard else read
    statements = [b.statement(total, idx, "+=!", rhs, ranges)]
    if include_pad:
        # Taps in the padding count, taps past it (ceil mode) do not: of the K taps at
        # s*o + d*t (padded coordinates), those below the padded extent P.
        divisor = "(" + " * ".join(f"min({kernel[d]}, ({x.shape[first + d] + end[d] + begin[d]} - "
                                   f"{_affine(strides[d], sp[d], 0)} + {dilations[d] - 1}) / {dilations[d]})"
                                   for d in range(k)) + ")"
    else:
        count = b.new(out.shape[first:first + k], x.dtype)
        statements.append(b.statement(count, sp, "+=!", f"({guard}) ? 1 : 0", ranges) if guard else
                          b.statement(count, sp, "+=!", "1", ranges))
        divisor = f"{count.ident}({', '.join(sp)})"
    statements.append(b.statement(out, idx, "=", f"{total.ident}({', '.join(idx)}) / {divisor}"))
    b.emit(statements, [x], [out], "reduction")
    return out


class GlobalAveragePool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [global_pool(b, inputs[0], "average")]


class GlobalMaxPool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [global_pool(b, inputs[0], "max")]


def global_pool(b, x, kind, channels_last=False):
    k = x.rank - 2
    first = 1 if channels_last else 2  # the first spatial axis
    channels = x.shape[-1] if channels_last else x.shape[1]
    if channels_last and kind != "max" and x.dtype.kind == "f" and math.prod(x.shape[first:first + k]):
        return _channels_last_global_average(b, x)  # (the mean of no positions is 0 / 0 below)
    out = b.new(image_indices(channels_last, x.shape[0], channels, [1] * k), x.dtype)
    idx = image_indices(channels_last, "n", "c", [f"z{d}" for d in range(k)])
    taps = [(f"r_s{d}", x.shape[first + d]) for d in range(k)]
    read = b.ref(x, image_indices(channels_last, "n", "c", [t for t, _ in taps]))
    if kind == "max":
        b.emit([b.statement(out, idx, "max=!", read, taps)], [x], [out], "reduction")
    else:
        count = math.prod(x.shape[first:first + k])
        b.emit([b.statement(out, idx, "+=!", read, taps),
                b.statement(out, idx, "=", f"{out.ident}({', '.join(idx)}) / {count}")],
               [x], [out], "reduction")
    return out


def _channels_last_global_average(b, x):
    """The mean over the positions of an NHWC image as a product of the image, viewed as
    ``(N, positions, C)``, with a vector of ``1 / positions``: at batch 1, polyc's
    matrix-vector kernel, which streams the image with the channels in vector registers; as a
    reduction over (h, w) per channel, polyc's loops read the image a channel apart (for
    efficientnet_b0's 112 x 112 x 32: 136 us against 35 us; at batch 8, a 3-D reduction, 1.0
    ms against 0.08 ms; AMD EPYC Zen 5)."""
    n, channels = x.shape[0], x.shape[-1]
    positions = math.prod(x.shape[1:-1])
    weights = b.const(np.full(positions, 1 / positions, x.dtype))
    if n == 1:
        image, total, idx = b.view(x, [positions, channels]), b.new([channels], x.dtype), ["c"]
    else:
        image, total, idx = b.view(x, [n, positions, channels]), b.new([n, channels], x.dtype), ["n", "c"]
    read = b.ref(image, idx[:-1] + ["r_p", "c"])
    b.emit([b.statement(total, idx, "+=!", f"{read} * {b.ref(weights, ['r_p'])}", [("r_p", positions)])],
           [image, weights], [total], "contraction")
    return b.view(total, [n] + [1] * (x.rank - 2) + [channels])


class BatchNormalization(Converter):
    """Inference mode: (x - mean) / sqrt(var + epsilon) * scale + bias, per channel."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, scale, bias, mean, var = inputs[:5]
        if node.attr("training_mode", 0):
            raise UnsupportedError(f"{b.where}: BatchNormalization in training mode")
        epsilon = node.attr("epsilon", 1e-5)
        if all(v.const is not None for v in (scale, bias, mean, var)):
            # Folded to one multiply-add per element.
            factor = (scale.const / np.sqrt(var.const.astype(np.float64) + epsilon)).astype(x.dtype)
            shift = (bias.const - mean.const * factor).astype(x.dtype)
            factor_value, shift_value = b.const(factor), b.const(shift)
            channel = lambda v: b.ref(v, ["i1"])  # noqa: E731
            return [_channelwise(b, x, lambda ref: f"{ref} * {channel(factor_value)} + {channel(shift_value)}",
                                 [factor_value, shift_value])]
        channel = lambda v: b.ref(v, ["i1"])  # noqa: E731
        return [_channelwise(b, x, lambda ref: (f"({ref} - {channel(mean)}) / sqrt({channel(var)} + "
                                                f"{_number(epsilon)}) * {channel(scale)} + {channel(bias)}"),
                             [scale, bias, mean, var])]


def _channelwise(b, x, make, extra):
    out = b.new(x.shape, x.dtype)
    idx = indices(x.rank)
    b.emit([b.statement(out, idx, "=", make(b.ref(x, idx)))], [x, *extra], [out], "elementwise")
    return out


# ----------------------------------------------------------------------------- quantization
#: The integer types QuantizeLinear makes (DequantizeLinear also reads int32).  The float8, 4-bit
#: and 2-bit types are not element types polyc computes in.
_QUANTIZED = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


def _quantization_subscripts(b, param: Value, x: Value, axis: int, block_size: int, idx) -> list[str]:
    """Where a scale or zero point applies to ``x(idx)``: one for the whole tensor, one per
    index along ``axis``, or (``block_size``) one per block of that many along it."""
    if param.size == 1 and param.rank <= 1 and not block_size:
        return ["0"] * param.rank
    axis = _axis(b, axis, x.rank)
    if block_size:
        blocks = [-(-e // block_size) if d == axis else e for d, e in enumerate(x.shape)]
        if list(param.shape) != blocks:
            raise UnsupportedError(f"{b.where}: a scale or zero point of shape {param.shape} for blocks of "
                                   f"{block_size} along axis {axis} of {x.shape} (expected {tuple(blocks)})")
        return [f"{i} / {block_size}" if d == axis else i for d, i in enumerate(idx)]
    if param.rank == 1 and param.shape[0] == x.shape[axis]:
        return [idx[axis]]
    raise UnsupportedError(f"{b.where}: a scale or zero point of shape {param.shape} fits neither the whole "
                           f"tensor nor axis {axis} of {x.shape}")


def _quantization_inputs(b, node, x):
    """(axis, block size, subscripts of x's elements) of a QuantizeLinear or DequantizeLinear."""
    axis = node.attr("axis", 1)  # (checked where a scale per index along it needs it)
    return axis, int(node.attr("block_size", 0)), indices(x.rank)


class QuantizeLinear(Converter):
    """saturate(round(x / scale) + zero point), rounding halves to even, into int8, uint8,
    int16 or uint16: the zero point's type, else ``output_dtype``, else uint8."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype
        x, scale = inputs[:2]
        zero = inputs[2] if len(inputs) > 2 else None
        _float_only(b, x)
        requested = node.attr("output_dtype", 0)
        out_dtype = zero.dtype if zero is not None else (numpy_dtype(requested) if requested else np.dtype(np.uint8))
        if requested and zero is not None and numpy_dtype(requested) != zero.dtype:
            raise UnsupportedError(f"{b.where}: output_dtype {numpy_dtype(requested)} is not the zero point's "
                                   f"type {zero.dtype}")
        if out_dtype not in _QUANTIZED:
            raise UnsupportedError(f"{b.where}: quantizing to {out_dtype or requested} is not supported "
                                   f"(int8, uint8, int16, uint16)")
        axis, block_size, idx = _quantization_inputs(b, node, x)
        x_ref = b.ref(x, idx)
        scale_ref = b.ref(scale, _quantization_subscripts(b, scale, x, axis, block_size, idx))
        precision = node.attr("precision", 0)
        if precision:  # the division in a wider type (float16 inputs divided in float)
            wide = tc_type(numpy_dtype(precision))
            x_ref, scale_ref = f"{wide}({x_ref})", f"{wide}({scale_ref})"
        quantized = f"rint({x_ref} / {scale_ref})"
        reads = [x, scale]
        if zero is not None:
            zero_ref = b.ref(zero, _quantization_subscripts(b, zero, x, axis, block_size, idx))
            quantized = f"{quantized} + {zero_ref}"
            reads.append(zero)
        limits = np.iinfo(out_dtype)
        out = b.new(x.shape, out_dtype)
        # Clamped as floats, before the conversion (out of range, it would be undefined in C).
        b.emit([b.statement(out, idx, "=", f"{tc_type(out_dtype)}(fmin(fmax({quantized}, "
                                           f"{_number(limits.min)}), {_number(limits.max)}))")],
               reads, [out], "elementwise")
        return [out]


class DequantizeLinear(Converter):
    """(x - zero point) * scale, in float, of the scale's type (or ``output_dtype``)."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype
        x, scale = inputs[:2]
        zero = inputs[2] if len(inputs) > 2 else None
        if x.dtype not in _QUANTIZED + (np.dtype(np.int32),):
            raise UnsupportedError(f"{b.where}: dequantizing {x.dtype} is not supported "
                                   f"(int8, uint8, int16, uint16, int32)")
        requested = node.attr("output_dtype", 0)
        out_dtype = numpy_dtype(requested) if requested else scale.dtype
        axis, block_size, idx = _quantization_inputs(b, node, x)
        shifted = f"float({b.ref(x, idx)})"
        reads = [x, scale]
        if zero is not None:
            shifted = f"({shifted} - float({b.ref(zero, _quantization_subscripts(b, zero, x, axis, block_size, idx))}))"
            reads.append(zero)
        scale_ref = b.ref(scale, _quantization_subscripts(b, scale, x, axis, block_size, idx))
        out = b.new(x.shape, out_dtype)
        b.emit([b.statement(out, idx, "=", f"{tc_type(out_dtype)}({shifted} * float({scale_ref}))")],
               reads, [out], "elementwise")
        return [out]


def _per_tensor_or_along(b, param: Value, shape, axis: int, idx, what: str) -> list[str]:
    """Subscripts of a scale or zero point of the integer products: one value, or one per index
    along ``axis`` (a row of A, a column of B, a row or column of the product)."""
    if param.size == 1 and param.rank <= 1:
        return ["0"] * param.rank
    if param.rank == 1 and param.shape[0] == shape[axis]:
        return [idx[axis]]
    raise UnsupportedError(f"{b.where}: {what} of shape {param.shape} is neither one value nor one per index "
                           f"along axis {axis} of {tuple(shape)}")


def _shifted_int32(b, x: Value, zero, axis: int, what: str) -> Value:
    """``x - zero`` in int32, the zero point one value or one per index along ``axis``
    (computed when the model is compiled for constant weights)."""
    if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise UnsupportedError(f"{b.where}: integer products of {x.dtype} are not supported (int8, uint8)")
    idx = indices(x.rank)
    zero_subscripts = _per_tensor_or_along(b, zero, x.shape, axis, idx, what) if zero is not None else None
    if x.const is not None and (zero is None or zero.const is not None):
        shifted = x.const.astype(np.int32)
        if zero is not None:
            shape = [x.shape[axis] if d == axis else 1 for d in range(x.rank)] if zero.size > 1 else []
            shifted = shifted - zero.const.astype(np.int32).reshape(shape)
        return b.const(shifted)
    rhs = f"int32({b.ref(x, idx)})"
    reads = [x]
    if zero is not None:
        rhs = f"{rhs} - int32({b.ref(zero, zero_subscripts)})"
        reads.append(zero)
    out = b.new(x.shape, np.int32)
    b.emit([b.statement(out, idx, "=", rhs)], reads, [out], "elementwise")
    return out


def _integer_product(b, node, a: Value, a_zero, c: Value, c_zero) -> Value:
    """``(a - a_zero) @ (c - c_zero)`` in int32, exactly: the zero points one value, one per row
    of ``a`` or one per column of ``c``."""
    return MatMul._impl_v1(b, node, [_shifted_int32(b, a, a_zero, a.rank - 2, "A's zero point"),
                                     _shifted_int32(b, c, c_zero, c.rank - 1, "B's zero point")])[0]


def _requantized(b, product: Value, factor: str, zero, out_dtype, zero_axis: int, reads) -> Value:
    """``saturate(rint(product * factor) + zero)`` into ``out_dtype``, in double, as onnx's
    reference scales its int32 results (a float32 factor times an int32 is a double in numpy)."""
    idx = indices(product.rank)
    value = f"double({b.ref(product, idx)}) * double({factor})"
    if zero is not None:
        zero_subscripts = _per_tensor_or_along(b, zero, product.shape, zero_axis, idx, "y_zero_point")
        value = f"{value} + double({b.ref(zero, zero_subscripts)})"
        reads = reads + [zero]
    limits = np.iinfo(out_dtype)
    out = b.new(product.shape, out_dtype)
    b.emit([b.statement(out, idx, "=", f"{tc_type(out_dtype)}(fmin(fmax(rint({value}), "
                                       f"{_number(limits.min)}), {_number(limits.max)}))")],
           [product] + reads, [out], "elementwise")
    return out


class MatMulInteger(Converter):
    @staticmethod
    def _impl_v10(b, node, inputs):
        a, c = inputs[:2]
        a_zero = inputs[2] if len(inputs) > 2 else None
        c_zero = inputs[3] if len(inputs) > 3 else None
        return [_integer_product(b, node, a, a_zero, c, c_zero)]


class QLinearMatMul(Converter):
    """The int32 product of the shifted operands, scaled by a_scale * b_scale / y_scale (float),
    in double, rounded (halves to even) and saturated into y's type, as onnx's reference."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = (inputs + [None] * 8)[:8]
        product = _integer_product(b, node, a, a_zero, c, c_zero)
        idx = indices(product.rank)
        rows, columns = max(product.rank - 2, 0), product.rank - 1

        def ref(param, axis, what):
            return b.ref(param, _per_tensor_or_along(b, param, product.shape, axis, idx, what))

        factor = (f"{ref(a_scale, rows, 'a_scale')} * {ref(c_scale, columns, 'b_scale')} / "
                  f"{ref(y_scale, columns, 'y_scale')}")
        out_dtype = y_zero.dtype if y_zero is not None else a.dtype
        return [_requantized(b, product, factor, y_zero, out_dtype, columns, [a_scale, c_scale, y_scale])]


class ConvInteger(Converter):
    """A convolution of the shifted operands in int32, exactly; padding is 0 after the shift
    (the input's zero point before it), as onnx's reference pads."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        x, w, x_zero, w_zero = (inputs + [None] * 4)[:4]
        return [_integer_convolution(b, node, x, x_zero, w, w_zero, None)]


def _integer_convolution(b, node, x, x_zero, w, w_zero, bias) -> Value:
    if x_zero is not None and x_zero.size != 1:
        raise UnsupportedError(f"{b.where}: the input's zero point must be one value (it has shape {x_zero.shape})")
    if bias is not None and bias.dtype != np.int32:
        raise UnsupportedError(f"{b.where}: the bias must be int32, not {bias.dtype}")
    operands = [_shifted_int32(b, x, x_zero, 0, "the input's zero point"),
                _shifted_int32(b, w, w_zero, 0, "the weights' zero point")]
    return Conv._impl_v1(b, node, operands + ([bias] if bias is not None else []))[0]


class QLinearConv(Converter):
    """ConvInteger plus an int32 bias, scaled by x_scale * w_scale / y_scale (w_scale one value
    or one per output channel) in double, rounded and saturated into y's type."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = (inputs + [None] * 9)[:9]
        product = _integer_convolution(b, node, x, x_zero, w, w_zero, bias)
        idx = indices(product.rank)

        def ref(param, what):
            return b.ref(param, _per_tensor_or_along(b, param, product.shape, 1, idx, what))

        factor = f"{ref(x_scale, 'x_scale')} * {ref(w_scale, 'w_scale')} / {ref(y_scale, 'y_scale')}"
        out_dtype = y_zero.dtype if y_zero is not None else x.dtype
        return [_requantized(b, product, factor, y_zero, out_dtype, 1, [x_scale, w_scale, y_scale])]


# ----------------------------------------------------------------------------- reductions
def _reduce_axes(b, node, x, axes_input=None):
    axes = node.attr("axes")
    if axes_input is not None:
        axes = _require_const(b, axes_input, "axes").tolist()
    if axes is None or len(axes) == 0:
        if node.attr("noop_with_empty_axes", 0):
            return []
        return list(range(x.rank))
    return sorted({_axis(b, int(a), x.rank) for a in axes})


def _reduce(kind: str):
    class Reduce(Converter):
        CONSTANT_INPUTS = (1,)
        @staticmethod
        def _lower(b, node, x, axes):
            keep = node.attr("keepdims", 1)
            if not axes:
                return [b.view(x, x.shape)]
            idx = indices(x.rank)
            out_shape = [1 if d in axes else e for d, e in enumerate(x.shape)] if keep else \
                [e for d, e in enumerate(x.shape) if d not in axes]
            out_idx = [f"z{d}" if d in axes else idx[d] for d in range(x.rank)] if keep else \
                [idx[d] for d in range(x.rank) if d not in axes]
            source = [f"r{d}" if d in axes else idx[d] for d in range(x.rank)]
            reductions = [(f"r{d}", x.shape[d]) for d in axes]
            out = b.new(out_shape, x.dtype)
            read = b.ref(x, source)
            # z0: the index Builder.statement gives a scalar, so that the statement reads its
            # target where it writes it
            lhs = f"{out.ident}({', '.join(out_idx) if out.shape else 'z0'})"
            statements, reads = [], [x]
            if kind == "logsumexp":  # log(sum(exp(x - max))) + max: no overflow in exp
                largest = b.new(out_shape, x.dtype)
                statements.append(b.statement(largest, out_idx, "max=!", read, reductions))
                largest_here = f"{largest.ident}({', '.join(out_idx) if out.shape else 'z0'})"
                read = f"{read} - {largest_here}"
            op = {"sum": "+=!", "mean": "+=!", "max": "max=!", "min": "min=!", "prod": "*=!",
                  "sumsquare": "+=!", "l2": "+=!", "l1": "+=!", "logsum": "+=!", "logsumexp": "+=!"}[kind]
            value = {"sumsquare": f"{read} * {read}", "l2": f"{read} * {read}", "l1": f"abs({read})",
                     "logsumexp": f"exp({read})"}.get(kind, read)
            statements.append(b.statement(out, out_idx, op, value, reductions))
            if kind == "mean":
                count = math.prod(x.shape[d] for d in axes)
                statements.append(b.statement(out, out_idx, "=", f"{lhs} / {count}"))
            if kind == "l2":
                statements.append(b.statement(out, out_idx, "=", f"sqrt({lhs})"))
            if kind == "logsum":
                statements.append(b.statement(out, out_idx, "=", f"log({lhs})"))
            if kind == "logsumexp":
                # An infinite (or NaN) max is the answer (an all -inf or empty slice is -inf),
                # and the sum of exp(x - max) then holds NaN.  m - m is 0 only for finite m.
                statements.append(b.statement(out, out_idx, "=", f"{largest_here} - {largest_here} != 0 ? "
                                                                 f"{largest_here} : log({lhs}) + {largest_here}"))
            b.emit(statements, reads, [out], "reduction")
            return [out]

        @staticmethod
        def _impl_v1(b, node, inputs):
            return Reduce._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0]))

        @staticmethod
        def _impl_v18(b, node, inputs):
            axes = inputs[1] if len(inputs) > 1 else None
            return Reduce._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0], axes))
    return Reduce


class ReduceSum(_reduce("sum")):
    @staticmethod
    def _impl_v13(b, node, inputs):  # ReduceSum took axes as an input from opset 13
        axes = inputs[1] if len(inputs) > 1 else None
        return ReduceSum._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0], axes))


class ArgMax(Converter):
    @staticmethod
    def _arg(b, node, x, pick):
        axis = _axis(b, node.attr("axis", 0), x.rank)
        keep = node.attr("keepdims", 1)
        last = node.attr("select_last_index", 0)
        idx = indices(x.rank)
        best_shape = [1 if d == axis else e for d, e in enumerate(x.shape)]
        best_idx = [("z0" if d == axis else idx[d]) for d in range(x.rank)]
        source = [("r0" if d == axis else idx[d]) for d in range(x.rank)]
        best = b.new(best_shape, x.dtype)
        out_shape = best_shape if keep else [e for d, e in enumerate(x.shape) if d != axis]
        out_idx = best_idx if keep else [idx[d] for d in range(x.rank) if d != axis]
        out = b.new(out_shape, np.int64)
        best_at = b.ref(best, [("0" if d == axis else idx[d]) for d in range(x.rank)])
        extent = x.shape[axis]
        op, none = ("max=!", "int64(-1)") if last else ("min=!", f"int64({extent})")
        b.emit([b.statement(best, best_idx, f"{pick}=!", b.ref(x, source), [("r0", extent)]),
                b.statement(out, out_idx, op, f"{b.ref(x, source)} == {best_at} ? int64(r0) : {none}",
                            [("r0", extent)])], [x], [out], "reduction")
        return [out]

    @staticmethod
    def _impl_v1(b, node, inputs):
        return ArgMax._arg(b, node, inputs[0], "max")


class ArgMin(ArgMax):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return ArgMax._arg(b, node, inputs[0], "min")


class Softmax(Converter):
    @staticmethod
    def _lower(b, node, x, axes, log: bool):
        trailing = sorted(axes) == list(range(x.rank - len(axes), x.rank))
        if trailing and x.rank > 2:
            # Over the last axes: as rows of a matrix, which polyc schedules as one parallel loop
            # of vectorised row loops; over (1, 12, 128, 128) attention scores it had put the
            # exp-sum's reduction outside a vector loop across rows, 5.8x slower (AMD EPYC Zen 3).
            rows = math.prod(x.shape[:x.rank - len(axes)])
            matrix = b.view(x, [rows, x.size // rows if rows else 0])
            return [b.view(Softmax._lower(b, node, matrix, [1], log)[0], x.shape)]
        idx = indices(x.rank)
        rest = [d for d in range(x.rank) if d not in axes]
        kept = [idx[d] for d in rest]
        kept_shape = [x.shape[d] for d in rest] or [1]
        kept_idx = kept or ["z0"]
        reduced = [("r" + str(d), x.shape[d]) for d in axes]
        source = [f"r{d}" if d in axes else idx[d] for d in range(x.rank)]
        most = b.new(kept_shape, x.dtype)
        total = b.new(kept_shape, x.dtype)
        out = b.new(x.shape, x.dtype)
        at = ", ".join(kept_idx)
        at_point = ", ".join(kept) or "0"   # in statements over every index of x
        statements = [b.statement(most, kept_idx, "max=!", b.ref(x, source), reduced)]
        if log:
            statements += [
                b.statement(total, kept_idx, "+=!", f"exp({b.ref(x, source)} - {most.ident}({at}))", reduced),
                b.statement(out, idx, "=", f"{b.ref(x, idx)} - {most.ident}({at_point}) - "
                                           f"log({total.ident}({at_point}))")]
        else:  # each exp once: into the output, summed from there, then scaled in place
            # by the sum's reciprocal, as onnxruntime does: the reciprocal does not depend on
            # the row loop, so the C compiler takes it out, and a row costs one division, not one
            # an element (which took a quarter of the encoder's softmax, 1536 x 128).
            statements += [
                b.statement(out, idx, "=", f"exp({b.ref(x, idx)} - {most.ident}({at_point}))"),
                b.statement(total, kept_idx, "+=!", b.ref(out, source), reduced),
                b.statement(out, idx, "=", f"{b.ref(out, idx)} * (1 / {total.ident}({at_point}))")]
        b.emit(statements, [x], [out], "reduction")
        return [out]

    @staticmethod
    def _impl_v1(b, node, inputs):  # before opset 13: over all axes from `axis` on (a 2-D view)
        x = inputs[0]
        axis = _axis(b, node.attr("axis", 1), x.rank)
        return Softmax._lower(b, node, x, list(range(axis, x.rank)), node.op_type == "LogSoftmax")

    @staticmethod
    def _impl_v13(b, node, inputs):
        x = inputs[0]
        axis = _axis(b, node.attr("axis", -1), x.rank)
        return Softmax._lower(b, node, x, [axis], node.op_type == "LogSoftmax")


class Hardmax(Converter):
    """1 at the first largest element along the axis, 0 elsewhere (before opset 13: along the
    axes from ``axis`` on, as one row)."""

    @staticmethod
    def _lower(b, x, axis: int):
        _float_only(b, x)
        idx = indices(x.rank)
        kept_shape = [1 if d == axis else e for d, e in enumerate(x.shape)]
        kept_idx = ["z0" if d == axis else idx[d] for d in range(x.rank)]
        at = ["0" if d == axis else idx[d] for d in range(x.rank)]
        source = ["r0" if d == axis else idx[d] for d in range(x.rank)]
        extent = x.shape[axis]
        best, first, out = b.new(kept_shape, x.dtype), b.new(kept_shape, np.int64), b.new(x.shape, x.dtype)
        t = tc_type(x.dtype)
        b.emit([b.statement(best, kept_idx, "max=!", b.ref(x, source), [("r0", extent)]),
                b.statement(first, kept_idx, "min=!", f"{b.ref(x, source)} == {b.ref(best, at)} ? int64(r0) : "
                                                      f"int64({extent})", [("r0", extent)]),
                b.statement(out, idx, "=", f"{idx[axis]} == {b.ref(first, at)} ? {t}(1) : {t}(0)")],
               [x], [out], "reduction")
        return out

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        axis = _axis(b, node.attr("axis", 1), x.rank)
        rows = math.prod(x.shape[:axis])
        matrix = b.view(x, [rows, x.size // rows if rows else 0])
        return [b.view(Hardmax._lower(b, matrix, 1), x.shape)]

    @staticmethod
    def _impl_v13(b, node, inputs):
        x = inputs[0]
        return [Hardmax._lower(b, x, _axis(b, node.attr("axis", -1), x.rank))]


class LpNormalization(Converter):
    """Each vector along ``axis`` over its L1 (``p=1``) or L2 (``p=2``) norm (a zero vector as it is)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        _float_only(b, x)
        p = node.attr("p", 2)
        if p not in (1, 2):
            raise UnsupportedError(f"{b.where}: LpNormalization with p={p} (1 or 2)")
        axis = _axis(b, node.attr("axis", -1), x.rank)
        idx = indices(x.rank)
        kept_idx = ["z0" if d == axis else idx[d] for d in range(x.rank)]
        at = ["0" if d == axis else idx[d] for d in range(x.rank)]
        read = b.ref(x, ["r0" if d == axis else idx[d] for d in range(x.rank)])
        norm = b.new([1 if d == axis else e for d, e in enumerate(x.shape)], x.dtype)
        out = b.new(x.shape, x.dtype)
        term, total = (f"abs({read})", b.ref(norm, at)) if p == 1 else (f"{read} * {read}", f"sqrt({b.ref(norm, at)})")
        b.emit([b.statement(norm, kept_idx, "+=!", term, [("r0", x.shape[axis])]),
                # A zero vector stays zero (onnx's expectation), not 0 / 0.
                b.statement(out, idx, "=", f"{b.ref(norm, at)} == 0 ? {b.ref(x, idx)} : {b.ref(x, idx)} / {total}")],
               [x], [out], "reduction")
        return [out]


class TopK(Converter):
    """The ``k`` largest (or smallest) elements along ``axis`` and their indices, in order, equal
    values by their index and NaN above every number, as onnx's reference orders them.

    Each element's rank is the count of elements that come before it (n^2 comparisons along an
    axis of n: fine for class scores, slow for tens of thousands of candidates); the j-th output
    is the one element of rank j.  Ranks are distinct, so that sum has one nonzero term."""

    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _lower(b, x, k: int, axis: int, largest: bool):
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise UnsupportedError(f"{b.where}: TopK's k is {k}, the axis has {n} elements")
        if x.dtype == np.bool_:
            raise UnsupportedError(f"{b.where}: TopK of bool tensors")
        shape = list(x.shape[:axis]) + [k] + list(x.shape[axis + 1:])
        if k == 0 or x.size == 0:
            return [b.const(np.zeros(shape, x.dtype)), b.const(np.zeros(shape, np.int64))]
        idx = indices(x.rank)
        mine = b.ref(x, idx)
        other = b.ref(x, idx[:axis] + ["r0"] + idx[axis + 1:])

        def above(a, c):  # a after c in ascending order, NaN above every number
            return f"({a} > {c} || ({a} != {a} && {c} == {c}))"
        same = f"({other} == {mine} || ({other} != {other} && {mine} != {mine}))"
        wins = above(other, mine) if largest else above(mine, other)
        rank = b.new(x.shape, np.int64)
        values, positions = b.new(shape, x.dtype), b.new(shape, np.int64)
        at_rank = f"{b.ref(rank, idx[:axis] + ['r0'] + idx[axis + 1:])} == {idx[axis]}"
        # Two kernels: as one, isl's scheduler took 10 s over the ranks' all-to-all dependences
        # (1000 scores along the axis).
        b.emit([b.statement(rank, idx, "+=!", f"({wins} || ({same} && r0 < {idx[axis]})) ? int64(1) : int64(0)",
                            [("r0", n)])], [x], [rank], "other")
        b.emit([b.statement(values, idx, "+=!", f"({at_rank}) ? {other} : {tc_type(x.dtype)}(0)", [("r0", n)]),
                b.statement(positions, idx, "+=!", f"({at_rank}) ? int64(r0) : int64(0)", [("r0", n)])],
               [x, rank], [values, positions], "other")
        return [values, positions]

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        return TopK._lower(b, x, int(node.attr("k")), _axis(b, node.attr("axis", -1), x.rank), True)

    @staticmethod
    def _impl_v10(b, node, inputs):
        x = inputs[0]
        k = int(_require_const(b, inputs[1], "TopK's k").reshape(-1)[0])
        return TopK._lower(b, x, k, _axis(b, node.attr("axis", -1), x.rank), bool(node.attr("largest", 1)))


#: Along an axis of at most this many elements a running sum is one triangular sum per
#: element (n^2 / 2 additions); longer ones go in blocks of about sqrt(n) (n^1.5).
CUMSUM_DIRECT = 64


def _running(b, node, inputs, product: bool) -> list[Value]:
    """Running sums (``product``: products) along ``axis`` (``exclusive``: each without its own
    element; ``reverse``: from the end).  TC statements cannot read what they write at another
    index, so each is a reduction over the elements before it: directly for short axes, and for
    longer ones in blocks of ``B`` elements: each element's sum within its block, each block's
    total, the totals before each block, and their sum."""
    x = inputs[0]
    axis = _axis(b, int(_require_const(b, inputs[1], f"{b.op_type}'s axis").reshape(-1)[0]), x.rank)
    if x.dtype == np.bool_:
        raise UnsupportedError(f"{b.where}: {b.op_type} of bool tensors")
    exclusive, reverse = node.attr("exclusive", 0), node.attr("reverse", 0)
    n = x.shape[axis]
    before = "<" if exclusive else "<="
    idx = indices(x.rank)
    reduce, combine = ("*=!", "*") if product else ("+=!", "+")
    identity = f"{tc_type(x.dtype)}({1 if product else 0})"
    # Positions along the axis count from the end when reversed: element p is x[n - 1 - p].
    along = (lambda p: f"{n - 1} - ({p})") if reverse else (lambda p: p)  # noqa: E731
    out = b.new(x.shape, x.dtype)
    at = lambda p: idx[:axis] + [p] + idx[axis + 1:]  # noqa: E731
    position = idx[axis] if not reverse else f"{n - 1} - {idx[axis]}"  # the output's place, so counted
    if n <= CUMSUM_DIRECT:
        b.emit([b.statement(out, idx, reduce, f"(r0 {before} {position}) ? {b.ref(x, at(along('r0')))} : {identity}",
                            [("r0", n)])], [x], [out], "reduction")
        return [out]
    block = math.isqrt(n - 1) + 1
    blocks = -(-n // block)
    outer, inner = idx[:axis], idx[axis + 1:]
    split_idx = outer + ["q0", "q1"] + inner
    split_shape = list(x.shape[:axis]) + [blocks, block] + list(x.shape[axis + 1:])
    total_idx = outer + ["q0"] + inner
    total_shape = list(x.shape[:axis]) + [blocks] + list(x.shape[axis + 1:])
    within, totals, offsets, sums = (b.new(split_shape, x.dtype), b.new(total_shape, x.dtype),
                                     b.new(total_shape, x.dtype), b.new(split_shape, x.dtype))
    element = f"{block} * q0 + r0"
    inside = f"{element} < {n}"
    read = b.ref(x, at(along(element)))
    statements = [
        b.statement(within, split_idx, reduce, f"(r0 {before} q1 && {inside}) ? {read} : {identity}", [("r0", block)]),
        b.statement(totals, total_idx, reduce, f"({inside}) ? {read} : {identity}", [("r0", block)]),
        b.statement(offsets, total_idx, reduce, f"(r1 < q0) ? {b.ref(totals, outer + ['r1'] + inner)} : {identity}",
                    [("r1", blocks)]),
        b.statement(sums, split_idx, "=", f"{b.ref(within, split_idx)} {combine} {b.ref(offsets, total_idx)}")]
    b.emit(statements, [x], [sums], "reduction")
    flat = b.view(sums, list(x.shape[:axis]) + [blocks * block] + list(x.shape[axis + 1:]))
    b.emit([b.statement(out, idx, "=", b.ref(flat, at(position)))], [flat], [out], "other")
    return [out]


class CumSum(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v11(b, node, inputs):
        return _running(b, node, inputs, product=False)


class CumProd(Converter):
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v26(b, node, inputs):
        return _running(b, node, inputs, product=True)


def _mean_and_variance(b, x, axis: int):
    """The mean and the (biased) variance of ``x`` over its axes from ``axis`` on, one value per
    index of the axes before (one value when there are none): the two tensors, of the kept
    axes' shape (or ``[1]``), and the statements computing them."""
    idx = indices(x.rank)
    kept_idx = idx[:axis] or ["z0"]
    kept_shape = list(x.shape[:axis]) or [1]
    reduced = [(f"r{d}", x.shape[d]) for d in range(axis, x.rank)]
    source = idx[:axis] + [r for r, _ in reduced]
    count = math.prod(x.shape[axis:])
    mean, var = b.new(kept_shape, x.dtype), b.new(kept_shape, x.dtype)
    at = ", ".join(kept_idx)
    deviation = f"({b.ref(x, source)} - {mean.ident}({at}))"
    return mean, var, [
        b.statement(mean, kept_idx, "+=!", b.ref(x, source), reduced),
        b.statement(mean, kept_idx, "=", f"{mean.ident}({at}) / {count}"),
        b.statement(var, kept_idx, "+=!", f"{deviation} * {deviation}", reduced),
        b.statement(var, kept_idx, "=", f"{var.ident}({at}) / {count}")]


class InstanceNormalization(Converter):
    """Each image's channel normalised over its spatial positions, then scaled and shifted per
    channel (style transfer networks, GANs)."""

    @staticmethod
    def _impl_v6(b, node, inputs):
        x, scale, bias = inputs[:3]
        if x.rank < 3:
            raise UnsupportedError(f"{b.where}: InstanceNormalization of a rank-{x.rank} input (N, C and "
                                   f"at least one spatial axis are needed)")
        mean, var, statements = _mean_and_variance(b, x, 2)
        out = b.new(x.shape, x.dtype)
        idx = indices(x.rank)
        epsilon = _number(node.attr("epsilon", 1e-5))
        statements.append(b.statement(
            out, idx, "=", f"({b.ref(x, idx)} - {mean.ident}({idx[0]}, {idx[1]})) / sqrt({var.ident}({idx[0]}, "
                           f"{idx[1]}) + {epsilon}) * {b.ref(scale, [idx[1]])} + {b.ref(bias, [idx[1]])}"))
        b.emit(statements, [x, scale, bias], [out], "reduction")
        return [out]


class Tile(Converter):
    """``x`` repeated along each axis: written as a broadcast into the interleaved shape
    (repeats[0], d0, repeats[1], d1, ...), whose memory is the tiled tensor's."""
    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _impl_v6(b, node, inputs):
        x = inputs[0]
        repeats = [int(r) for r in _require_const(b, inputs[1], "repeats").reshape(-1)]
        if len(repeats) != x.rank or any(r < 0 for r in repeats):
            raise UnsupportedError(f"{b.where}: Tile repeats {repeats} for a rank-{x.rank} input "
                                   f"(one count of at least 0 per axis)")
        shape = [r * d for r, d in zip(repeats, x.shape)]
        if x.const is not None:
            return [b.const(np.tile(x.const, repeats))]
        if all(r == 1 for r in repeats):
            return [b.view(x, x.shape)]
        idx = indices(x.rank)
        copies = [f"t{d}" for d in range(x.rank)]
        interleaved = b.new([n for pair in zip(repeats, x.shape) for n in pair], x.dtype)
        b.emit([b.statement(interleaved, [n for pair in zip(copies, idx) for n in pair], "=", b.ref(x, idx))],
               [x], [interleaved], "other")
        return [b.view(interleaved, shape)]


class LayerNormalization(Converter):
    @staticmethod
    def _impl_v17(b, node, inputs):
        x, scale = inputs[:2]
        bias = inputs[2] if len(inputs) > 2 else None
        axis = _axis(b, node.attr("axis", -1), x.rank)
        epsilon = node.attr("epsilon", 1e-5)
        idx = indices(x.rank)
        kept, norm = idx[:axis], idx[axis:]
        kept_idx = kept or ["z0"]
        mean, var, statements = _mean_and_variance(b, x, axis)
        out = b.new(x.shape, x.dtype)
        at = ", ".join(kept_idx)
        shape_norm = x.shape[axis:]
        scale_ref = b.ref(scale, b.broadcast_subscripts(scale, shape_norm, norm))
        at_point = ", ".join(kept) or "0"
        rhs = (f"({b.ref(x, idx)} - {mean.ident}({at_point})) / sqrt({var.ident}({at_point}) + {_number(epsilon)})"
               f" * {scale_ref}")
        if bias is not None:
            rhs += f" + {b.ref(bias, b.broadcast_subscripts(bias, shape_norm, norm))}"
        statements.append(b.statement(out, idx, "=", rhs))
        outputs = [out]
        if len(node.outputs) > 1:  # Mean and InvStdDev, with the normalised axes kept as 1
            stat_shape = list(x.shape[:axis]) + [1] * (x.rank - axis)
            stat_idx = kept + [f"z{d}" for d in range(axis, x.rank)]
            mean_out, inv_out = b.new(stat_shape, x.dtype), b.new(stat_shape, x.dtype)
            statements.append(b.statement(mean_out, stat_idx, "=", f"{mean.ident}({at})"))
            statements.append(b.statement(inv_out, stat_idx, "=", f"1 / sqrt({var.ident}({at}) + {_number(epsilon)})"))
            outputs += [mean_out, inv_out]
        b.emit(statements, [x, scale] + ([bias] if bias is not None else []), outputs, "reduction")
        return outputs


class LRN(Converter):
    """Local response normalisation across channels (AlexNet's, GoogLeNet's): each element over
    ``(bias + alpha / size * sum of the squares of its channel window) ** beta``, the window the
    ``size`` channels from ``floor((size - 1) / 2)`` below to ``ceil((size - 1) / 2)`` above,
    cut at the first and last channels."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        _float_only(b, x)
        size = node.attr("size")
        if size is None or size < 1:
            raise UnsupportedError(f"{b.where}: LRN needs a size of at least 1 (got {size})")
        if x.rank < 3:
            raise UnsupportedError(f"{b.where}: LRN of a rank-{x.rank} tensor (rank 3 or more: N, C, ...)")
        alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
        idx = indices(x.rank)
        below = (size - 1) // 2
        channel = f"{idx[1]} + r_k - {below}" if below else f"{idx[1]} + r_k"
        window = [idx[0], channel, *idx[2:]]
        squares, out = b.new(x.shape, x.dtype), b.new(x.shape, x.dtype)
        read = b.ref(x, window)
        statements = [
            b.statement(squares, idx, "+=!", f"({channel} >= 0 && {channel} < {x.shape[1]}) ? {read} * {read} : 0",
                        [("r_k", size)]),
            b.statement(out, idx, "=", f"{b.ref(x, idx)} / pow({_number(bias)} + {_number(alpha / size)} * "
                                       f"{squares.ident}({', '.join(idx)}), {_number(beta)})")]
        b.emit(statements, [x], [out], "reduction")
        return [out]


# ----------------------------------------------------------------------------- the registry
_FLOAT_FUNCTIONS = {"Exp": "exp({x})", "Log": "log({x})", "Sqrt": "sqrt({x})", "Tanh": "tanh({x})",
                    "Erf": "erf({x})", "Sin": "sin({x})", "Cos": "cos({x})", "Tan": "tan({x})",
                    "Asin": "asin({x})", "Acos": "acos({x})", "Atan": "atan({x})", "Sinh": "sinh({x})",
                    "Cosh": "cosh({x})", "Asinh": "asinh({x})", "Acosh": "acosh({x})", "Atanh": "atanh({x})",
                    "Floor": "floor({x})", "Ceil": "ceil({x})", "Reciprocal": "1 / {x}",
                    "Sigmoid": "1 / (1 + exp(-{x}))", "Softplus": "log1p(exp({x}))",
                    "Softsign": "{x} / (1 + fabs({x}))", "HardSwish": "{x} * fmax(0, fmin(1, {x} / 6 + 0.5))",
                    "Mish": "{x} * tanh(log1p(exp({x})))"}

CONVERTERS: dict[str, type[Converter]] = {
    "ConvTranspose": ConvTranspose,
    "Resize": Resize,
    **{op: _unary(expression) for op, expression in _FLOAT_FUNCTIONS.items()},
    "Relu": _unary("({x} > 0 ? {x} : 0)", floats_only=False),
    "Neg": _unary("-{x}", floats_only=False),
    "Abs": _unary("abs({x})", floats_only=False),
    "Sign": Sign,
    "Add": _binary("+"), "Sub": _binary("-"), "Mul": _binary("*"), "Div": _binary("/"),
    "Pow": Pow,
    "Equal": _binary("==", True), "Less": _binary("<", True), "Greater": _binary(">", True),
    "LessOrEqual": _binary("<=", True), "GreaterOrEqual": _binary(">=", True),
    "And": _binary("&&", True), "Or": _binary("||", True), "Xor": _binary("!=", True),
    "Max": _variadic("max"), "Min": _variadic("min"), "Sum": _variadic("+"), "Mean": _variadic("+", mean=True),
    "Mod": Mod, "Not": Not, "Where": Where, "Cast": Cast, "CastLike": CastLike, "Clip": Clip,
    "LeakyRelu": LeakyRelu, "Elu": Elu, "Selu": Selu, "HardSigmoid": HardSigmoid, "Gelu": Gelu, "PRelu": PRelu,
    "Identity": Identity, "Dropout": Dropout,
    "Shape": Shape, "Size": Size, "Constant": Constant, "ConstantOfShape": ConstantOfShape, "Range": Range,
    "Reshape": Reshape, "Flatten": Flatten, "Squeeze": Squeeze, "Unsqueeze": Unsqueeze,
    "Transpose": Transpose, "Expand": Expand, "Concat": Concat, "Split": Split, "Slice": Slice,
    "Gather": Gather, "Pad": Pad,
    "MatMul": MatMul, "Gemm": Gemm, "Einsum": Einsum,
    "Conv": Conv, "MaxPool": MaxPool, "AveragePool": AveragePool,
    "GlobalAveragePool": GlobalAveragePool, "GlobalMaxPool": GlobalMaxPool,
    "BatchNormalization": BatchNormalization, "LayerNormalization": LayerNormalization, "LRN": LRN,
    "InstanceNormalization": InstanceNormalization, "Tile": Tile, "Shrink": Shrink,
    "ReduceSum": ReduceSum, "ReduceMean": _reduce("mean"), "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"), "ReduceProd": _reduce("prod"), "ReduceSumSquare": _reduce("sumsquare"),
    "ReduceL1": _reduce("l1"), "ReduceL2": _reduce("l2"), "ReduceLogSum": _reduce("logsum"),
    "ReduceLogSumExp": _reduce("logsumexp"), "DepthToSpace": DepthToSpace, "SpaceToDepth": SpaceToDepth,
    "QuantizeLinear": QuantizeLinear, "DequantizeLinear": DequantizeLinear, "MatMulInteger": MatMulInteger,
    "QLinearMatMul": QLinearMatMul, "ConvInteger": ConvInteger, "QLinearConv": QLinearConv,
    "ArgMax": ArgMax, "ArgMin": ArgMin, "Softmax": Softmax, "LogSoftmax": Softmax,
    "Round": _unary("rint({x})"), "IsNaN": IsNaN, "IsInf": IsInf, "Swish": Swish, "SwiGLU": SwiGLU,
    "Trilu": Trilu, "EyeLike": EyeLike, "OneHot": OneHot, "GatherElements": GatherElements, "GatherND": GatherND,
    "Hardmax": Hardmax, "LpNormalization": LpNormalization, "CumSum": CumSum, "CumProd": CumProd,
    "BitwiseAnd": _bitwise("bitand"), "BitwiseOr": _bitwise("bitor"), "BitwiseXor": _bitwise("bitxor"),
    "BitwiseNot": _bitwise("bitnot"), "BitShift": BitShift, "GridSample": GridSample, "ReverseSequence": ReverseSequence, "Col2Im": Col2Im, "RoiAlign": RoiAlign, "DeformConv": DeformConv,
    "TensorScatter": TensorScatter, "LpPool": LpPool,
    "Upsample": Upsample, "TopK": TopK, "ScatterElements": ScatterElements, "Scatter": Scatter,
    "ScatterND": ScatterND, "DFT": DFT, "STFT": STFT, "HannWindow": HannWindow, "HammingWindow": HammingWindow,
    "BlackmanWindow": BlackmanWindow, "MelWeightMatrix": MelWeightMatrix,
}


# The recurrent layers live in a module of their own (built from this module's helpers).
from polyc.frontends.onnx.recurrent import RECURRENT  # noqa: E402

CONVERTERS.update(RECURRENT)

# Operators whose output shapes come from data, planned in two stages (data_dependent.py).
from polyc.frontends.onnx.data_dependent import DATA_DEPENDENT  # noqa: E402

CONVERTERS.update(DATA_DEPENDENT)
