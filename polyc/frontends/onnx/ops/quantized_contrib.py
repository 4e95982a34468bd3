"""onnxruntime's quantized contrib operators (domain ``com.microsoft``), as its quantizer emits
them (``quantize_static(..., quant_format=QuantFormat.QOperator)``, ``quantize_dynamic``) and
as its graph optimizer fuses them: QLinearAdd, QLinearMul, QLinearConcat, QLinearWhere,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax,
QGemm, DynamicQuantizeMatMul and MatMulIntegerToFloat; and, from the models its optimizer
saves, FusedMatMul (a float product), and QLinearConv and NhwcMaxPool on images in NHWC.

Each computes what onnxruntime's CPU kernels compute, in the same float32 operations in the
same order, so that the results agree bit for bit where onnxruntime's are exact:

- dequantized values are ``x_scale * (x - x_zero_point)`` in float32, requantized values
  ``saturate(rint(v / y_scale) + y_zero_point)``, rounding halves to even (QLinearLeakyRelu,
  QLinearConcat's and QLinearWhere's inputs of other scales: onnxruntime's 256-entry tables hold
  exactly these values, so computing them per element gives the same bytes);
- QLinearAdd: ``a * (a_scale / c_scale) + b * (b_scale / c_scale) + fixed``, two fused
  multiply-adds in float32 with the zero points folded into ``fixed``, as MLAS's AVX2 kernel;
- QLinearMul: the exact integer product of the shifted inputs, times
  ``a_scale * b_scale / c_scale``, plus the output zero point, in float32 (two roundings, as
  MLAS's SSE2 kernel);
- QLinearGlobalAveragePool: the int32 sum of each image less ``x_zero_point * size``, times
  ``x_scale / (y_scale * size)`` in float32;
- QGemm: the int32 product plus the int32 bias, times ``alpha * a_scale * b_scale / y_scale``
  (one per column for per-channel weights) in float32, as MLAS's requantizing output processor;
- QLinearSigmoid and QLinearSoftmax use tables built when the model is compiled (the scales must
  be constants then): the sigmoid's by MLAS's float32 rational polynomial with its fused
  multiply-adds (as onnxruntime computes it on x86 processors with FMA3; its portable kernel
  may round differently), QLinearSoftmax's ``exp`` table exactly as onnxruntime builds it, with
  its float32 sum and its ``floor(1 / y_scale)`` scaling.

A scale or zero point is one value (onnxruntime refuses others) except QGemm's, DynamicQuantizeMatMul's
and MatMulIntegerToFloat's ``b_scale`` and ``b_zero_point``, which may be one per column.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Value, broadcast_shape, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _axis, _float_only, _number
from polyc.frontends.onnx.ops.contractions import MatMul
from polyc.frontends.onnx.ops.convolutions import AveragePool, MaxPool
from polyc.frontends.onnx.ops.quantization import QLinearConv, _integer_product, _per_tensor_or_along
from polyc.frontends.onnx.ops.shapes import concatenated, transposed

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))

#: Step options for float sums added in onnxruntime's order, one after the other: SIMD
#: reduction pragmas would reassociate them.
_SUMS_IN_ORDER = {"vectorize": False}

#: onnxruntime's QLinearSoftmax keeps this many bits of float headroom below FLT_MAX for its sum.
_SOFTMAX_RESERVED_BITS = 5.0


# ---------------------------------------------------------------------------------- helpers
def _eight_bit(b, x: Value, what: str) -> None:
    if x.dtype not in _EIGHT_BIT:
        raise UnsupportedError(f"{b.where}: {what} is {x.dtype}; {b.op_type} takes uint8 or int8")


def _one_value(b, param: Value | None, what: str) -> Value | None:
    """``param`` checked to be one value (a scalar or a 1-element vector), as onnxruntime requires."""
    if param is not None and (param.size != 1 or param.rank > 1):
        raise UnsupportedError(f"{b.where}: {what} must be one value (a scalar or 1-element vector), not {param.shape}")
    return param


def _scalar(b, param: Value | None, default: str = "0") -> str:
    """A one-value scale or zero point in TC as a float: its literal when constant."""
    if param is None:
        return f"float({default})"
    if param.const is not None:
        value = param.const.reshape(-1)[0]
        return f"float({_number(float(value))})" if param.dtype.kind == "f" else f"float({int(value)})"
    return f"float({b.ref(param, ['0'] * param.rank)})"


def _constant(param: Value | None, default=0):
    """A one-value parameter's number when known at compile time (``default`` when absent), else None."""
    if param is None:
        return default
    return None if param.const is None else param.const.reshape(-1)[0]


def _f32(value) -> str:
    """A float32 number as a TC float (the literal alone would be a double)."""
    return f"float({_number(float(np.float32(value)))})"


def _fma32(x, y, z) -> np.float32:
    """``x * y + z`` of float32 numbers rounded once to float32 (a fused multiply-add)."""
    exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
    near = np.float32(float(exact))
    candidates = [np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf))]
    # the nearest, a tie to the even significand
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact), int(c.view(np.uint32)) & 1))


def _fma32_array(x: np.ndarray, y, z) -> np.ndarray:
    """:func:`_fma32` of arrays: in double (the product of two floats is exact there), rounded
    to float32; a double sum that lands on a float32 halfway point may have been rounded
    there, and is computed exactly instead."""
    x, y, z = np.broadcast_arrays(*(np.asarray(v, np.float32) for v in (x, y, z)))
    total = x.astype(np.float64) * y.astype(np.float64) + z.astype(np.float64)
    result = total.astype(np.float32)
    significand, _ = np.frexp(total)
    halfway = np.mod(significand * 2.0**25, 2.0) == 1.0
    for k in np.flatnonzero(halfway):
        result.flat[k] = _fma32(x.flat[k], y.flat[k], z.flat[k])
    return result


#: MLAS's logistic (x86 with FMA3, ``LogisticKernelFma3``): a rational polynomial in float32
#: on x clamped to [-18, 18], the numerator's and denominator's coefficients from x^9 and x^10 down.
_LOGISTIC_NUMERATOR = (
    4.37031012579801e-11,
    1.15627324459942e-07,
    6.08574864600143e-05,
    8.51377133304701e-03,
    2.48287947061529e-01,
)
_LOGISTIC_DENOMINATOR = (
    6.10247389755681e-13,
    5.76102136993427e-09,
    6.29106785017040e-06,
    1.70198817374094e-03,
    1.16817656904453e-01,
    9.93151921023180e-01,
)


def _mlas_logistic(values: np.ndarray) -> np.ndarray:
    """MLAS's logistic of float32 ``values``, operation for operation (fused multiply-adds)."""
    x = np.clip(values.astype(np.float32), np.float32(-18), np.float32(18))
    square = x * x
    numerator = np.full_like(x, _LOGISTIC_NUMERATOR[0])
    for coefficient in _LOGISTIC_NUMERATOR[1:]:
        numerator = _fma32_array(square, numerator, np.float32(coefficient))
    denominator = np.full_like(x, _LOGISTIC_DENOMINATOR[0])
    for coefficient in _LOGISTIC_DENOMINATOR[1:]:
        denominator = _fma32_array(square, denominator, np.float32(coefficient))
    return np.maximum(np.float32(0), x * numerator / denominator + np.float32(0.5))


def _saturated(rounded: str, dtype) -> str:
    """``rounded`` (a float holding an integer) clamped into ``dtype`` and converted."""
    limits = np.iinfo(dtype)
    return f"{tc_type(dtype)}(fmin(fmax({rounded}, {_number(limits.min)}), {_number(limits.max)}))"


def _dequantized(b, x_ref: str, scale: Value, zero: Value | None) -> str:
    """``x_scale * (x - x_zero_point)`` in float32, as onnxruntime dequantizes one value."""
    return f"({_scalar(b, scale)} * float(int32({x_ref}) - int32({_scalar(b, zero)})))"


def _requantized(b, value: str, scale: Value, zero: Value | None, dtype) -> str:
    """``saturate(rint(value / y_scale) + y_zero_point)`` (MlasQuantizeLinear)."""
    return _saturated(f"(rint({value} / {_scalar(b, scale, '1')}) + {_scalar(b, zero)})", dtype)


def _params(inputs, count: int):
    return (list(inputs) + [None] * count)[:count]


def _reads(*values) -> list[Value]:
    return [v for v in values if v is not None]


def _elementwise(b, x: Value, rhs: str, dtype, reads) -> Value:
    """One statement ``out(i) = rhs`` over ``x``'s shape, ``{x}`` in ``rhs`` standing for x(i)."""
    out = b.new(x.shape, dtype)
    idx = indices(x.rank)
    b.emit([b.statement(out, idx, "=", rhs.format(x=b.ref(x, idx)))], [x] + reads, [out], "elementwise")
    return out


def _lookup(b, x: Value, table: np.ndarray) -> Value:
    """``table[x - lowest]``: a 256-entry table of ``x``'s 8-bit type, built when compiling."""
    lowest = int(np.iinfo(x.dtype).min)
    entries = b.const(np.ascontiguousarray(table))
    out = b.new(x.shape, table.dtype)
    idx = indices(x.rank)
    position = f"int32({b.ref(x, idx)}) + {-lowest}" if lowest else f"int32({b.ref(x, idx)})"
    b.emit([b.statement(out, idx, "=", b.ref(entries, [position]))], [x, entries], [out], "other")
    return out


def _all_constant(params) -> bool:
    return all(p is None or p.const is not None for p in params)


def _table_inputs(x: Value, x_scale, x_zero) -> np.ndarray:
    """The 256 dequantized inputs of a table, in float32, for x's values from the lowest up."""
    limits = np.iinfo(x.dtype)
    values = np.arange(limits.min, limits.max + 1, dtype=np.int32)
    return np.float32(x_scale) * (values - np.int32(x_zero)).astype(np.float32)


def _table_quantized(values: np.ndarray, y_scale, y_zero, dtype) -> np.ndarray:
    limits = np.iinfo(dtype)
    rounded = np.rint(values.astype(np.float32) / np.float32(y_scale)) + np.float32(y_zero)
    return np.clip(rounded, limits.min, limits.max).astype(dtype)


# ---------------------------------------------------------------------------------- binary
def _binary_operands(b, inputs):
    a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = _params(inputs, 8)
    for value, what in ((a, "A"), (c, "B")):
        _eight_bit(b, value, what)
    if a.dtype != c.dtype or (y_zero is not None and y_zero.dtype != a.dtype):
        raise UnsupportedError(f"{b.where}: A, B and C must have one type (got {a.dtype}, {c.dtype})")
    for param, what in (
        (a_scale, "A_scale"),
        (a_zero, "A_zero_point"),
        (c_scale, "B_scale"),
        (c_zero, "B_zero_point"),
        (y_scale, "C_scale"),
        (y_zero, "C_zero_point"),
    ):
        _one_value(b, param, what)
    return a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero


def _binary_out(b, a: Value, c: Value, make_rhs, reads) -> Value:
    shape = broadcast_shape(b.where, a.shape, c.shape)
    out = b.new(shape, a.dtype)
    idx = indices(len(shape))
    rhs = make_rhs(b.ref(a, b.broadcast_subscripts(a, shape, idx)), b.ref(c, b.broadcast_subscripts(c, shape, idx)))
    b.emit([b.statement(out, idx, "=", rhs)], [a, c] + reads, [out], "elementwise")
    return out


def _spans_over_first(a: Value, c: Value, shape) -> bool:
    """Whether onnxruntime's broadcasting hands MLAS ``a`` as the scalar of each span: ``a``
    is constant along the innermost axis where the output is not (``c`` varies there)."""
    for d in reversed(range(len(shape))):
        if shape[d] == 1:
            continue
        a_extent = a.shape[d - len(shape) + a.rank] if d - len(shape) + a.rank >= 0 else 1
        c_extent = c.shape[d - len(shape) + c.rank] if d - len(shape) + c.rank >= 0 else 1
        if a_extent == c_extent:
            return False
        return a_extent == 1
    return False


class QLinearAdd(Converter):
    """``(A - A_zero) * A_scale + (B - B_zero) * B_scale`` requantized to C's scale and zero
    point, as MLAS computes it: ``fma(a, A_scale / C_scale, fma(b, B_scale / C_scale, fixed))``
    with ``fixed = C_zero - (A_scale / C_scale * A_zero + B_scale / C_scale * B_zero)``, the
    input broadcast along a span taken first (MLAS folds it into ``fixed``)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = _binary_operands(b, inputs)
        known = [_constant(p, d) for p, d in ((a_scale, None), (c_scale, None), (y_scale, None))]
        zeros = [_constant(p) for p in (a_zero, c_zero, y_zero)]
        if all(v is not None for v in known + zeros):
            a_ratio = np.float32(known[0]) / np.float32(known[2])
            c_ratio = np.float32(known[1]) / np.float32(known[2])
            # The compiler of MLAS contracts ``ra * za + rb * zb`` into one fused multiply-add.
            folded = _fma32(a_ratio, np.float32(zeros[0]), c_ratio * np.float32(zeros[1]))
            fixed, ra, rc = _f32(np.float32(zeros[2]) - folded), _f32(a_ratio), _f32(c_ratio)
        else:
            ra = f"({_scalar(b, a_scale)} / {_scalar(b, y_scale)})"
            rc = f"({_scalar(b, c_scale)} / {_scalar(b, y_scale)})"
            fixed = f"({_scalar(b, y_zero)} - fma({ra}, {_scalar(b, a_zero)}, {rc} * {_scalar(b, c_zero)}))"
        shape = broadcast_shape(b.where, a.shape, c.shape)
        a_first = _spans_over_first(a, c, shape)

        def rhs(a_ref, c_ref):
            if a_first:
                value = f"fma(float({c_ref}), {rc}, fma(float({a_ref}), {ra}, {fixed}))"
            else:
                value = f"fma(float({a_ref}), {ra}, fma(float({c_ref}), {rc}, {fixed}))"
            return _saturated(f"rint({value})", a.dtype)

        reads = _reads(a_scale, a_zero, c_scale, c_zero, y_scale, y_zero)
        return [_binary_out(b, a, c, rhs, reads)]


class QLinearMul(Converter):
    """``(A - A_zero) * (B - B_zero)`` exactly in int32, times ``A_scale * B_scale / C_scale``
    plus ``C_zero`` in float32 (the product and the sum each rounded), rounded and saturated, as MLAS."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, a_scale, a_zero, c, c_scale, c_zero, y_scale, y_zero = _binary_operands(b, inputs)
        scales = [_constant(p, None) for p in (a_scale, c_scale, y_scale)]
        if all(s is not None for s in scales):
            ratio = _f32(np.float32(scales[0]) * np.float32(scales[1]) / np.float32(scales[2]))
        else:
            ratio = f"({_scalar(b, a_scale)} * {_scalar(b, c_scale)} / {_scalar(b, y_scale)})"
        a_shift, c_shift = _scalar(b, a_zero), _scalar(b, c_zero)

        def rhs(a_ref, c_ref):
            product = f"(int32({a_ref}) - int32({a_shift})) * (int32({c_ref}) - int32({c_shift}))"
            # the product rounded to float before the addition, never fused with it: the
            # double product of a 17-bit integer and a float is exact, so this rounds once
            scaled = f"float(double({product}) * double({ratio}))"
            return _saturated(f"rint({scaled} + {_scalar(b, y_zero)})", a.dtype)

        reads = _reads(a_scale, a_zero, c_scale, c_zero, y_scale, y_zero)
        return [_binary_out(b, a, c, rhs, reads)]


# ---------------------------------------------------------------------------------- requantizing
def _requantize_to(b, x: Value, x_scale, x_zero, y_scale, y_zero, dtype) -> Value:
    """``x`` in ``y_scale`` and ``y_zero``'s terms; ``x`` itself where its own are the same
    constants (onnxruntime copies those bytes)."""
    same = [_constant(p, None) for p in (x_scale, y_scale)] + [_constant(x_zero), _constant(y_zero)]
    if same[0] is not None and same[0] == same[1] and same[2] is not None and same[2] == same[3]:
        return x
    value = _dequantized(b, "{x}", x_scale, x_zero)
    return _elementwise(
        b, x, _requantized(b, value, y_scale, y_zero, dtype), dtype, _reads(x_scale, x_zero, y_scale, y_zero)
    )


class QLinearConcat(Converter):
    """Inputs ``(Y_scale, Y_zero, X1, X1_scale, X1_zero, X2, ...)``: each X requantized to Y's
    scale and zero point (where its own differ), then joined along ``axis``."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        if len(inputs) < 5 or (len(inputs) - 2) % 3:
            raise UnsupportedError(
                f"{b.where}: inputs must be Y_scale, Y_zero_point and triples of (X, X_scale, X_zero_point); "
                f"got {len(inputs)} inputs"
            )
        y_scale, y_zero = _one_value(b, inputs[0], "Y_scale"), _one_value(b, inputs[1], "Y_zero_point")
        dtype = y_zero.dtype if y_zero is not None else inputs[2].dtype
        parts = []
        for k in range(2, len(inputs), 3):
            x, x_scale, x_zero = inputs[k : k + 3]
            _eight_bit(b, x, f"input {k}")
            if x.dtype != dtype:
                raise UnsupportedError(f"{b.where}: input {k} is {x.dtype}, the output {dtype}")
            _one_value(b, x_scale, f"the scale of input {k}")
            _one_value(b, x_zero, f"the zero point of input {k}")
            parts.append(_requantize_to(b, x, x_scale, x_zero, y_scale, y_zero, dtype))
        axis = _axis(b, node.attr("axis"), parts[0].rank)
        if len(parts) == 1:
            return [parts[0]]
        return [concatenated(b, [p for p in parts if p.size > 0], axis)]


class QLinearWhere(Converter):
    """``condition ? X : Y``, X and Y requantized to Z's scale and zero point."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        condition, x, x_scale, x_zero, y, y_scale, y_zero, z_scale, z_zero = _params(inputs, 9)
        _eight_bit(b, x, "X")
        _eight_bit(b, y, "Y")
        for param, what in (
            (x_scale, "x_scale"),
            (x_zero, "x_zero_point"),
            (y_scale, "y_scale"),
            (y_zero, "y_zero_point"),
            (z_scale, "z_scale"),
            (z_zero, "z_zero_point"),
        ):
            _one_value(b, param, what)
        dtype = z_zero.dtype if z_zero is not None else x.dtype
        x = _requantize_to(b, x, x_scale, x_zero, z_scale, z_zero, dtype)
        y = _requantize_to(b, y, y_scale, y_zero, z_scale, z_zero, dtype)
        shape = broadcast_shape(b.where, condition.shape, x.shape, y.shape)
        out = b.new(shape, dtype)
        idx = indices(len(shape))
        refs = [b.ref(v, b.broadcast_subscripts(v, shape, idx)) for v in (condition, x, y)]
        b.emit(
            [b.statement(out, idx, "=", f"{refs[0]} ? {refs[1]} : {refs[2]}")], [condition, x, y], [out], "elementwise"
        )
        return [out]


# ---------------------------------------------------------------------------------- activations
class QLinearLeakyRelu(Converter):
    """``v >= 0 ? v : alpha * v`` of the dequantized input, requantized (float32)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, x_scale, x_zero, y_scale, y_zero = _params(inputs, 5)
        _eight_bit(b, x, "X")
        for param, what in (
            (x_scale, "X_scale"),
            (x_zero, "X_zero_point"),
            (y_scale, "Y_scale"),
            (y_zero, "Y_zero_point"),
        ):
            _one_value(b, param, what)
        dtype = y_zero.dtype if y_zero is not None else x.dtype
        alpha = _f32(node.attr("alpha", 0.01))
        value = _dequantized(b, "{x}", x_scale, x_zero)
        leaky = f"({value} >= 0 ? {value} : {alpha} * {value})"
        return [
            _elementwise(
                b, x, _requantized(b, leaky, y_scale, y_zero, dtype), dtype, _reads(x_scale, x_zero, y_scale, y_zero)
            )
        ]


class QLinearSigmoid(Converter):
    """The sigmoid of the dequantized input, requantized, by a 256-entry table built when the
    model is compiled (the scales and zero points must be constants), the sigmoid computed as
    MLAS computes it on x86 processors with FMA3 (:func:`_mlas_logistic`)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, x_scale, x_zero, y_scale, y_zero = _params(inputs, 5)
        _eight_bit(b, x, "X")
        params = [(x_scale, "X_scale"), (x_zero, "X_zero_point"), (y_scale, "Y_scale"), (y_zero, "Y_zero_point")]
        for param, what in params:
            _one_value(b, param, what)
        if not _all_constant([p for p, _ in params]):
            raise UnsupportedError(
                f"{b.where}: the scales and zero points must be constants (its table is built when compiling)"
            )
        dtype = y_zero.dtype if y_zero is not None else x.dtype
        values = _table_inputs(x, _constant(x_scale), _constant(x_zero))
        return [_lookup(b, x, _table_quantized(_mlas_logistic(values), _constant(y_scale), _constant(y_zero), dtype))]


class QLinearSoftmax(Converter):
    """Softmax of 8-bit values as onnxruntime computes it: ``e = table[x - max + 255]`` with
    ``table[k] = float(exp((k - 255 + shift) * x_scale))`` (``shift`` keeps the float sum
    below FLT_MAX), the float32 sum ``s`` of ``e`` along the axis (opset < 13: over all axes
    from ``axis`` on, added in order), ``y = saturate(rint(e * floor(1 / y_scale) / s) + y_zero)``."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, x_scale, _x_zero, y_scale, y_zero = _params(inputs, 5)
        _eight_bit(b, x, "X")
        _one_value(b, x_scale, "X_scale")
        _one_value(b, y_scale, "Y_scale")
        _one_value(b, y_zero, "Y_zero_point")
        if x_scale.const is None or y_scale.const is None:
            raise UnsupportedError(
                f"{b.where}: X_scale and Y_scale must be constants (its table is built when compiling)"
            )
        opset = node.attr("opset")
        if opset is None:
            raise UnsupportedError(f"{b.where}: the attribute opset is required")
        axis = _axis(b, node.attr("axis", 1 if opset < 13 else -1), x.rank)
        reduced = list(range(axis, x.rank)) if opset < 13 else [axis]
        length = int(np.prod([x.shape[d] for d in reduced]))
        scale = float(np.float32(_constant(x_scale)))
        headroom = float(np.log(np.float32(np.finfo(np.float32).max) / np.float32(length)))
        shift = max(0.0, headroom - _SOFTMAX_RESERVED_BITS) / scale
        table = b.const(np.exp((np.arange(256, dtype=np.float64) - 255 + shift) * scale).astype(np.float32))
        multiplier = _f32(np.floor(np.float32(1.0) / np.float32(_constant(y_scale))))

        idx = indices(x.rank)
        kept = [i for d, i in enumerate(idx) if d not in reduced]
        kept_shape = [e for d, e in enumerate(x.shape) if d not in reduced]
        names = [f"r_{i}" for i in idx]
        over = [names[d] if d in reduced else i for d, i in enumerate(idx)]
        reductions = [(names[d], x.shape[d]) for d in reduced]
        largest = b.new(kept_shape, np.int32)
        total = b.new(kept_shape, np.float32)
        exps = b.new(x.shape, np.float32)
        out = b.new(x.shape, x.dtype)
        kept_at = [i for d, i in enumerate(idx) if d not in reduced]
        zero = _scalar(b, y_zero)
        quotient = f"int32(rint({b.ref(exps, idx)} * {multiplier} / {b.ref(total, kept_at)})) + int32({zero})"
        limits = np.iinfo(x.dtype)
        result = f"{tc_type(x.dtype)}(max(min({quotient}, {int(limits.max)}), {int(limits.min)}))"
        statements = [
            b.statement(largest, kept, "max=!", f"int32({b.ref(x, over)})", reductions),
            b.statement(
                exps,
                idx,
                "=",
                b.ref(table, [f"int32({b.ref(x, idx)}) - {b.ref(largest, kept_at)} + 255"]),
            ),
            b.statement(total, kept, "+=!", b.ref(exps, over), reductions),
            b.statement(out, idx, "=", result),
        ]
        b.emit(statements, _reads(x, table, y_zero), [out], "reduction", _SUMS_IN_ORDER)
        return [out]


# ---------------------------------------------------------------------------------- pools
class QLinearGlobalAveragePool(Converter):
    """The int32 sum of each image less ``x_zero * size``, times ``x_scale / (y_scale * size)``
    in float32, rounded and saturated; ``channels_last``: images of shape (N, ..., C)."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, x_scale, x_zero, y_scale, y_zero = _params(inputs, 5)
        _eight_bit(b, x, "X")
        for param, what in (
            (x_scale, "x_scale"),
            (x_zero, "x_zero_point"),
            (y_scale, "y_scale"),
            (y_zero, "y_zero_point"),
        ):
            _one_value(b, param, what)
        if x.rank < 3:
            raise UnsupportedError(f"{b.where}: the input must have rank 3 or more, not {x.rank}")
        channels_last = bool(node.attr("channels_last", 0))
        spatial = list(range(1, x.rank - 1)) if channels_last else list(range(2, x.rank))
        size = int(np.prod([x.shape[d] for d in spatial]))
        out_shape = [1 if d in spatial else e for d, e in enumerate(x.shape)]
        idx = indices(x.rank)
        over = [f"r_{i}" if d in spatial else i for d, i in enumerate(idx)]
        sums = b.new(out_shape, np.int32)
        out = b.new(out_shape, x.dtype)
        if _constant(x_scale, None) is not None and _constant(y_scale, None) is not None:
            factor = _f32(np.float32(_constant(x_scale)) / (np.float32(_constant(y_scale)) * np.float32(size)))
        else:
            factor = f"({_scalar(b, x_scale)} / ({_scalar(b, y_scale)} * float({size})))"
        biased = f"({b.ref(sums, idx)} - int32({_scalar(b, x_zero)}) * {size})"
        statements = [
            b.statement(sums, idx, "+=!", f"int32({b.ref(x, over)})", [(f"r_{idx[d]}", x.shape[d]) for d in spatial]),
            b.statement(
                out, idx, "=", _saturated(f"(rint(float({biased}) * {factor}) + {_scalar(b, y_zero)})", x.dtype)
            ),
        ]
        b.emit(statements, _reads(x, x_scale, x_zero, y_scale, y_zero), [out], "reduction")
        return [out]


class QLinearAveragePool(Converter):
    """AveragePool (its attributes, and ``channels_last``) of the dequantized input in float32,
    each window summed in order, then ``saturate(rint(y / y_scale + y_zero))`` as onnxruntime quantizes the average."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        x, x_scale, x_zero, y_scale, y_zero = _params(inputs, 5)
        _eight_bit(b, x, "X")
        for param, what in (
            (x_scale, "x_scale"),
            (x_zero, "x_zero_point"),
            (y_scale, "y_scale"),
            (y_zero, "y_zero_point"),
        ):
            _one_value(b, param, what)
        dequantized = _elementwise(b, x, _dequantized(b, "{x}", x_scale, x_zero), np.float32, _reads(x_scale, x_zero))
        emitted = len(b.steps)
        average = AveragePool.lower(b, node, [dequantized], channels_last=bool(node.attr("channels_last", 0)))[0]
        for step in b.steps[emitted:]:
            step.options.update(_SUMS_IN_ORDER)
        quantized = _saturated(f"rint({{x}} / {_scalar(b, y_scale, '1')} + {_scalar(b, y_zero)})", x.dtype)
        return [_elementwise(b, average, quantized, x.dtype, _reads(y_scale, y_zero))]


class NhwcMaxPool(Converter):
    """MaxPool (its attributes) of an 8-bit image in NHWC, as onnxruntime's layout optimizer
    writes it."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        _eight_bit(b, inputs[0], "x")
        return MaxPool.lower(b, node, inputs[:1], channels_last=True)


# ---------------------------------------------------------------------------------- products
class QLinearConvChannelsLast(Converter):
    """The domain's QLinearConv: ONNX's QLinearConv (the default domain's converter), on an
    image in NHWC where ``channels_last`` is 1 (onnxruntime's layout optimizer writes it so; the
    weights keep ONNX's layout), the result in NHWC too."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        if not node.attr("channels_last", 0):
            return QLinearConv._impl_v10(b, node, inputs)
        x = inputs[0]
        if x.rank < 3:
            raise UnsupportedError(f"{b.where}: the input must have rank 3 or more, not {x.rank}")
        to_channels_first = [0, x.rank - 1, *range(1, x.rank - 1)]
        to_channels_last = [0, *range(2, x.rank), 1]
        product = QLinearConv._impl_v10(b, node, [transposed(b, x, to_channels_first), *inputs[1:]])[0]
        return [transposed(b, product, to_channels_last)]


def _transposed_2d(b, value: Value) -> Value:
    if value.const is not None:
        return b.const(np.ascontiguousarray(value.const.T))
    return transposed(b, value, [1, 0])


def _column_subscripts(b, param: Value, shape, idx, what: str) -> list[str]:
    return _per_tensor_or_along(b, param, shape, len(shape) - 1, idx, what)


def _scaled_to_float(b, product: Value, multiplier: str, bias: Value | None, reads) -> Value:
    """``float(product) * multiplier + bias`` in float32 (MLAS's scale-and-bias output)."""
    idx = indices(product.rank)
    value = f"float({b.ref(product, idx)}) * {multiplier.format(n=idx[-1])}"
    if bias is not None:
        if bias.rank != 1 or bias.shape[0] != product.shape[-1]:
            raise UnsupportedError(
                f"{b.where}: the bias must be one value per column ({product.shape[-1]}), not {bias.shape}"
            )
        value = f"{value} + {b.ref(bias, [idx[-1]])}"
    out = b.new(product.shape, np.float32)
    b.emit([b.statement(out, idx, "=", value)], [product] + reads + _reads(bias), [out], "elementwise")
    return out


class QGemm(Converter):
    """``alpha * (A - A_zero) @ (B - B_zero) + C`` in int32 (A and B transposed by ``transA`` and
    ``transB``, C an int32 bias), then with ``y_zero_point``: times ``alpha * a_scale * b_scale /
    y_scale`` in float32 (b_scale one per column for per-channel weights), rounded and
    saturated into y_zero_point's type; without: that float32 product itself."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, a_scale, a_zero, w, w_scale, w_zero, bias, y_scale, y_zero = _params(inputs, 9)
        _eight_bit(b, a, "A")
        _eight_bit(b, w, "B")
        if a.rank != 2 or w.rank != 2:
            raise UnsupportedError(f"{b.where}: A and B must be matrices, not {a.shape} and {w.shape}")
        _one_value(b, a_scale, "a_scale")
        _one_value(b, a_zero, "a_zero_point")
        _one_value(b, y_scale, "y_scale")
        _one_value(b, y_zero, "y_zero_point")
        if node.attr("transA", 0):
            a = _transposed_2d(b, a)
        if node.attr("transB", 0):
            w = _transposed_2d(b, w)
        product = _integer_product(b, node, a, a_zero, w, w_zero)
        if bias is not None:
            if bias.dtype != np.int32:
                raise UnsupportedError(f"{b.where}: C must be int32, not {bias.dtype}")
            idx = indices(2)
            biased = b.new(product.shape, np.int32)
            rhs = f"{b.ref(product, idx)} + {b.ref(bias, b.broadcast_subscripts(bias, product.shape, idx))}"
            b.emit([b.statement(biased, idx, "=", rhs)], [product, bias], [biased], "elementwise")
            product = biased
        idx = indices(2)
        alpha = np.float32(node.attr("alpha", 1.0))
        w_ref = b.ref(w_scale, _column_subscripts(b, w_scale, product.shape, idx, "b_scale"))
        factor = f"({_f32(alpha)} * {_scalar(b, a_scale)} * float({w_ref}))"
        if y_scale is not None:
            factor = f"({factor} / {_scalar(b, y_scale)})"
        reads = _reads(a_scale, w_scale, y_scale)
        if y_zero is None:
            out = b.new(product.shape, np.float32)
            b.emit(
                [b.statement(out, idx, "=", f"float({b.ref(product, idx)}) * {factor}")],
                [product] + reads,
                [out],
                "elementwise",
            )
            return [out]
        out = b.new(product.shape, y_zero.dtype)
        rhs = _saturated(f"(rint(float({b.ref(product, idx)}) * {factor}) + {_scalar(b, y_zero)})", y_zero.dtype)
        b.emit([b.statement(out, idx, "=", rhs)], [product] + reads + [y_zero], [out], "elementwise")
        return [out]


def _dynamically_quantized(b, x: Value):
    """``x`` quantized to uint8 by its own range, as onnxruntime's DynamicQuantizeMatMul:
    ``scale = (max(x, 0) - min(x, 0)) / 255`` (1 for an all-zero x), ``zero =
    rint(clamp(-min / scale, 0, 255))``; returns (quantized x, scale, zero point)."""
    if x.dtype != np.float32:
        raise UnsupportedError(f"{b.where}: A must be float32, not {x.dtype}")
    idx = indices(x.rank)
    over = [f"r_{i}" for i in idx]
    reductions = list(zip(over, x.shape))
    low, high = b.new((), np.float32), b.new((), np.float32)
    scale, zero = b.new((), np.float32), b.new((), np.uint8)
    quantized = b.new(x.shape, np.uint8)
    low_at, high_at, scale_at, zero_at = (b.ref(v, []) for v in (low, high, scale, zero))
    statements = [
        b.statement(low, [], "min=!", f"fmin({b.ref(x, over)}, float(0))", reductions),
        b.statement(high, [], "max=!", f"fmax({b.ref(x, over)}, float(0))", reductions),
        b.statement(scale, [], "=", f"{high_at} == {low_at} ? float(1) : ({high_at} - {low_at}) / float(255)"),
        b.statement(zero, [], "=", f"uint8(rint(fmax(float(0), fmin(float(255), float(0) - {low_at} / {scale_at}))))"),
        b.statement(
            quantized, idx, "=", _saturated(f"(rint({b.ref(x, idx)} / {scale_at}) + float({zero_at}))", np.uint8)
        ),
    ]
    b.emit(statements, [x], [quantized, scale, zero], "reduction")
    return quantized, scale, zero


def _integer_to_float(b, node, a, a_scale, a_zero, w, w_scale, w_zero, bias):
    product = _integer_product(b, node, a, a_zero, w, w_zero)
    idx = indices(product.rank)
    w_ref = b.ref(w_scale, _column_subscripts(b, w_scale, product.shape, idx, "b_scale")).replace(idx[-1], "{n}")
    multiplier = f"({_scalar(b, a_scale)} * float({w_ref}))"
    return _scaled_to_float(b, product, multiplier, bias, _reads(a_scale, w_scale))


class DynamicQuantizeMatMul(Converter):
    """A (float32) quantized to uint8 by its own range, times (B - b_zero_point) in int32, times
    ``a_scale * b_scale`` plus the bias in float32."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, w, w_scale, w_zero, bias = _params(inputs, 5)
        _eight_bit(b, w, "B")
        quantized, scale, zero = _dynamically_quantized(b, a)
        return [_integer_to_float(b, node, quantized, scale, zero, w, w_scale, w_zero, bias)]


class MatMulIntegerToFloat(Converter):
    """(A - a_zero_point) @ (B - b_zero_point) in int32, times ``a_scale * b_scale`` plus the
    bias in float32."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, w, a_scale, w_scale, a_zero, w_zero, bias = _params(inputs, 7)
        _eight_bit(b, a, "A")
        _eight_bit(b, w, "B")
        _one_value(b, a_scale, "a_scale")
        _one_value(b, a_zero, "a_zero_point")
        return [_integer_to_float(b, node, a, a_scale, a_zero, w, w_scale, w_zero, bias)]


class FusedMatMul(Converter):
    """``alpha * op(A) @ op(B)``, ``op`` transposing the last two axes where ``transA`` or
    ``transB`` says: the float product onnxruntime's optimizer fuses from a MatMul and the
    Transpose or Mul around it (as in the quantized models it saves).  ``transBatchA`` and
    ``transBatchB`` are not supported."""

    @staticmethod
    def _impl_v1(b, node, inputs):
        a, c = inputs[:2]
        _float_only(b, a)
        if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
            raise UnsupportedError(f"{b.where}: transBatchA and transBatchB are not supported")
        operands = []
        for value, flag in ((a, "transA"), (c, "transB")):
            if node.attr(flag, 0) and value.rank >= 2:
                perm = list(range(value.rank - 2)) + [value.rank - 1, value.rank - 2]
                value = (
                    b.const(np.ascontiguousarray(value.const.transpose(perm)))
                    if value.const is not None
                    else transposed(b, value, perm)
                )
            operands.append(value)
        product = MatMul._impl_v1(b, node, operands)[0]
        alpha = float(node.attr("alpha", 1.0))
        if alpha == 1.0:
            return [product]
        return [_elementwise(b, product, f"{{x}} * {tc_type(product.dtype)}({_number(alpha)})", product.dtype, [])]


#: The converters of this module, by operator of the domain ``com.microsoft``.
CONTRIB_QUANTIZED: dict[str, type[Converter]] = {
    "QLinearAdd": QLinearAdd,
    "QLinearMul": QLinearMul,
    "QLinearConcat": QLinearConcat,
    "QLinearWhere": QLinearWhere,
    "QLinearLeakyRelu": QLinearLeakyRelu,
    "QLinearSigmoid": QLinearSigmoid,
    "QLinearSoftmax": QLinearSoftmax,
    "QLinearGlobalAveragePool": QLinearGlobalAveragePool,
    "QLinearAveragePool": QLinearAveragePool,
    "QGemm": QGemm,
    "DynamicQuantizeMatMul": DynamicQuantizeMatMul,
    "MatMulIntegerToFloat": MatMulIntegerToFloat,
    "FusedMatMul": FusedMatMul,
    "QLinearConv": QLinearConvChannelsLast,
    "NhwcMaxPool": NhwcMaxPool,
}
