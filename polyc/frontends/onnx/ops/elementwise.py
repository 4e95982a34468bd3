"""Elementwise operators, each one statement over the broadcast shape of its inputs: the float
functions and arithmetic, comparisons and logic, the bitwise operators and BitShift, the
activations (LeakyRelu, Elu, Selu, Gelu, Swish, SwiGLU, ...), Clip, Pow, Sign, Mod, IsNaN, IsInf,
Where, Not, Cast, CastLike, Identity and Dropout.
"""

from __future__ import annotations

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, tc_type
from polyc.frontends.onnx.ops.base import Converter, _elementwise, _float_only, _number


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


def _nan_max_min(combine: str, a: str, c: str) -> str:
    """Max or Min of two floats as onnxruntime computes them: a NaN on either side is the
    result, and of equal operands (-0 and +0) the first.  Selects, which vectorise, where
    TC's max and min (fmax's, fmin's) would drop the NaN."""
    keeps_first = ">=" if combine == "max" else "<="
    return f"(({a} {keeps_first} {c} || {a} != {a}) ? {a} : {c})"


def _variadic(combine: str, mean: bool = False):
    class Variadic(Converter):
        @staticmethod
        def _impl_v1(b, node, inputs):
            values = [v for v in inputs if v is not None]
            floats = values[0].dtype.kind == "f"

            def rhs(refs):
                text = refs[0]
                for r in refs[1:]:
                    if combine.isalpha():
                        text = _nan_max_min(combine, text, r) if floats else f"{combine}({text}, {r})"
                    else:
                        text = f"({text} {combine} {r})"
                return f"({text}) / {len(refs)}" if mean else text

            return [_elementwise(b, values, values[0].dtype, rhs)]

    return Variadic


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
        return [
            _elementwise(
                b,
                [x],
                x.dtype,
                lambda r: f"({r[0]} < -{lambd} ? {r[0]} + {bias} : ({r[0]} > {lambd} ? {r[0]} - {bias} : 0))",
            )
        ]


class Elu(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha = _number(node.attr("alpha", 1.0))
        return [
            _elementwise(b, inputs[:1], inputs[0].dtype, lambda r: f"({r[0]} >= 0 ? {r[0]} : {alpha} * expm1({r[0]}))")
        ]


class Selu(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha = _number(node.attr("alpha", 1.67326319217681884765625))
        gamma = _number(node.attr("gamma", 1.05070102214813232421875))
        return [
            _elementwise(
                # (+ 0: Selu(-0) is +0, as onnxruntime computes it)
                b,
                inputs[:1],
                inputs[0].dtype,
                lambda r: f"{gamma} * ({r[0]} > 0 ? {r[0]} : {alpha} * expm1({r[0]}) + 0)",
            )
        ]


class HardSigmoid(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        alpha, beta = _number(node.attr("alpha", 0.2)), _number(node.attr("beta", 0.5))
        # Comparisons, not fmin/fmax: a NaN stays NaN, as in onnxruntime.
        return [
            _elementwise(
                b,
                inputs[:1],
                inputs[0].dtype,
                lambda r: _clamped(f"({alpha} * {r[0]} + {beta})", "0", "1"),
            )
        ]


class Gelu(Converter):
    @staticmethod
    def _impl_v20(b, node, inputs):
        (x,) = inputs[:1]
        _float_only(b, x)
        if node.attr("approximate", "none") == "tanh":
            return [
                _elementwise(
                    b,
                    [x],
                    x.dtype,
                    lambda r: (
                        f"0.5 * {r[0]} * (1 + tanh(0.7978845608028654 * ({r[0]} + 0.044715 * {r[0]} * {r[0]} * {r[0]})))"
                    ),
                )
            ]
        return [_elementwise(b, [x], x.dtype, lambda r: f"0.5 * {r[0]} * (1 + erf({r[0]} * 0.7071067811865476))")]


class PRelu(Converter):
    @staticmethod
    def _impl_v7(b, node, inputs):  # v7 brought numpy (unidirectional) broadcasting; v9 and v16 only types
        x, slope = inputs[:2]
        return [_elementwise(b, [x, slope], x.dtype, lambda r: f"({r[0]} >= 0 ? {r[0]} : {r[0]} * {r[1]})")]


def _clamped(x: str, lo: str | None, hi: str | None) -> str:
    """``x`` clamped to ``[lo, hi]`` by comparisons: a NaN stays NaN and -0 stays -0 (fmin and
    fmax would return the bound for a NaN), as onnxruntime clamps."""
    if lo is not None:
        x = f"({x} < {lo} ? {lo} : {x})"
    if hi is not None:
        x = f"({x} > {hi} ? {hi} : {x})"
    return x


class Clip(Converter):
    """x clamped to [min, max] by comparisons (a NaN stays NaN).  A float bound left out is the
    type's largest finite value, as onnxruntime clamps (so +-inf become +-that value); before
    opset 11 the attributes' defaults are float32's."""

    @staticmethod
    def _impl_v6(b, node, inputs):
        x = inputs[0]
        lo, hi = node.attr("min", -3.4028234663852886e38), node.attr("max", 3.4028234663852886e38)
        return [_elementwise(b, [x], x.dtype, lambda r: _clamped(r[0], _number(lo), _number(hi)))]

    @staticmethod
    def _impl_v11(b, node, inputs):
        x = inputs[0]
        bounds = (list(inputs[1:3]) + [None, None])[:2]
        values = [x] + [v for v in bounds if v is not None]
        largest = _number(float(np.finfo(x.dtype).max)) if x.dtype.kind == "f" else None

        def rhs(refs):
            given = iter(refs[1:])
            lo, hi = (next(given) if bound is not None else None for bound in bounds)
            if largest is not None:
                lo = f"-{largest}" if lo is None else lo
                hi = largest if hi is None else hi
            return _clamped(refs[0], lo, hi)

        return [_elementwise(b, values, x.dtype, rhs)]


class Pow(Converter):
    """x ** y; the exponent may have another type (converted); integers are powered in double."""

    @staticmethod
    def _impl_v7(b, node, inputs):
        x, y = inputs[:2]
        if x.dtype.kind == "f":
            exponent = (lambda r: r) if y.dtype == x.dtype else (lambda r: f"{tc_type(x.dtype)}({r})")
            return [_elementwise(b, [x, y], x.dtype, lambda r: f"pow({r[0]}, {exponent(r[1])})")]
        return [_elementwise(b, [x, y], x.dtype, lambda r: f"{tc_type(x.dtype)}(pow(double({r[0]}), double({r[1]})))")]


class Sign(Converter):
    @staticmethod
    def _impl_v9(b, node, inputs):
        (x,) = inputs[:1]
        t = tc_type(x.dtype)
        # A NaN's sign is NaN (onnxruntime's, for float and double).
        zero = (lambda r: f"({r} == {r} ? {t}(0) : {r})") if x.dtype.kind == "f" else (lambda r: f"{t}(0)")
        return [
            _elementwise(b, [x], x.dtype, lambda r: f"({r[0]} > 0 ? {t}(1) : ({r[0]} < 0 ? {t}(-1) : {zero(r[0])}))")
        ]


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
            raise UnsupportedError(
                f"{b.where}: SwiGLU's inputs must have one shape and type (got "
                f"{list(gate.shape)} {gate.dtype} and {list(value.shape)} {value.dtype})"
            )
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


class BitCast(Converter):
    """The input's bits read as another element type of the same width (little endian, as the
    machines polyc targets are): a view, no copy."""

    @staticmethod
    def _impl_v26(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype

        to = numpy_dtype(node.attr("to"))
        if to is None:
            raise UnsupportedError(f"{b.where}: BitCast to element type {node.attr('to')} is not supported")
        return [b.part(inputs[0], inputs[0].shape, 0, to)]


class Identity(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return [b.view(inputs[0], inputs[0].shape)]


class OptionalHasElement(Converter):
    """Of a tensor: true when the input is given (polyc compiles tensors; optionals and
    sequences are refused where the model declares them)."""

    @staticmethod
    def _impl_v18(b, node, inputs):
        return [b.const(np.array(bool(inputs and inputs[0] is not None)))]


class OptionalGetElement(Converter):
    """Of a tensor: the tensor."""

    @staticmethod
    def _impl_v18(b, node, inputs):
        if not inputs or inputs[0] is None:
            raise UnsupportedError(f"{b.where}: OptionalGetElement of no input")
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
