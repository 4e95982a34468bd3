"""Recognising integer depthwise convolutions with their requantization (QLinearConv with one
filter per channel, as quantized MobileNets have them).

The canonical form, NCHW, two statements (the first into an int32 temporary, which the
kernel never stores, the second into the 8-bit output)::

    P(n, c, h, w) +=! (box) ? (int32(X(n, c, sh*h + dh*r_kh + oh, sw*w + dw*r_kw + ow)) - ZX)
                              * int32(W(c, r_kh, r_kw)) : 0
    Y(n, c, h, w) = uint8(fmin(fmax(rint(float(P(n, c, h, w) + B(c)) * S(c)) + ZY, LO), HI))

- ``X`` is an int8 or uint8 input; ``ZX`` its zero point, an integer literal (optional);
- ``W`` holds the weights with their zero points already subtracted, one filter of
  ``KH x KW`` taps per channel (int8, uint8 or int16); ``B`` an int32 bias per channel
  (optional), ``S`` a float32 scale per channel (one value for every channel: ``S(0)``);
- the padding (``box``) is the condition of affine bounds on the windows, as in
  :mod:`polyc.schedule.convolution`; the strides, dilations and offsets are integer literals;
- ``Y`` is int8 or uint8, its zero point ``ZY`` and its bounds ``LO`` and ``HI`` literals
  (a Relu or Clip folded into the bounds narrows them); a cast of a literal counts as the literal.

This is what ONNX's QLinearConv computes for a depthwise convolution, as onnxruntime computes
it: the int32 sums, the bias added in int32, one float32 multiplication, rounding halves to
even, the zero point added and the value saturated.  :func:`recognise_integer_depthwise_def`
returns None for anything else.

    >>> from polyc.lang.sema import check_source
    >>> d = check_source('''def q(uint8(1, 8, 6, 6) X, int16(8, 3, 3) W, int32(8) B, float(8) S) -> (Y) {
    ...   P(n, c, h, w) +=! (h + r_kh >= 1 && h + r_kh < 7 && w + r_kw >= 1 && w + r_kw < 7)
    ...       ? (int32(X(n, c, h + r_kh - 1, w + r_kw - 1)) - 3) * int32(W(c, r_kh, r_kw)) : 0
    ...       where h in 0:6, w in 0:6, r_kh in 0:3, r_kw in 0:3
    ...   Y(n, c, h, w) = uint8(fmin(fmax(rint(float(P(n, c, h, w) + B(c)) * S(c)) + 5.0, 0.0), 255.0))
    ... }''')[0]
    >>> recognise_integer_depthwise_def(d).describe()
    'Y = requantize((X - 3) (*) W + B, S) + 5 in [0, 255]; 3 x 3 taps, strides (1, 1), padding h:[0, 6) w:[0, 6)'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.schedule.convolution import Bound, Window, _full_range_extents, _image_subscripts, _padding_box
from polyc.schedule.patterns import guarded_product

#: The types of the image and of the requantized output.
EIGHT_BITS = (np.dtype(np.int8), np.dtype(np.uint8))

#: The types the weights (zero points subtracted) may be held in.
WEIGHT_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16))


@dataclass(frozen=True)
class IntegerDepthwise:
    """A def recognised as an integer depthwise convolution and its requantization (see the
    module doc).  ``windows``: the image's two window dimensions (height, width); ``box``: the
    zero padding's bounds on them; ``extents``: every index of the first statement."""

    sums: str
    output: str
    image: str
    weights: str
    bias: str | None
    scale: str
    per_channel_scale: bool
    image_zero: int
    output_zero: int
    low: int
    high: int
    indices: tuple[str, str, str, str]  # n, c, h, w of the first statement
    windows: tuple[Window, Window]
    box: tuple[Bound, ...]
    extents: tuple[tuple[str, Affine], ...]
    image_dtype: np.dtype
    weight_dtype: np.dtype
    output_dtype: np.dtype

    def extent(self, index: str) -> Affine:
        return dict(self.extents)[index]

    @property
    def kernel(self) -> tuple[str, str]:
        (wh, ww) = self.windows
        assert wh.k is not None and ww.k is not None
        return wh.k, ww.k

    def describe(self) -> str:
        """One line: the computation, the window and the padding."""
        (wh, ww) = self.windows
        kh, kw = (self.extent(k) for k in self.kernel)
        image = f"({self.image} - {self.image_zero})" if self.image_zero else self.image
        bias = f" + {self.bias}" if self.bias else ""
        padding = " ".join(
            f"{self.indices[b.dim]}:[{'' if b.lo is None else b.lo}, {'' if b.hi is None else b.hi})" for b in self.box
        )
        return (
            f"{self.output} = requantize({image} (*) {self.weights}{bias}, {self.scale}) + {self.output_zero} "
            f"in [{self.low}, {self.high}]; {kh} x {kw} taps, strides ({wh.stride}, {ww.stride})"
            + (f", padding {padding}" if padding else "")
        )


def recognise_integer_depthwise_def(definition: ir.CheckedDef) -> IntegerDepthwise | None:
    """The def as an :class:`IntegerDepthwise` (see the module doc), or None."""
    if len(definition.statements) != 2:
        return None
    sums, requantization = definition.statements
    found = _sums(sums, definition)
    if found is None:
        return None
    image, image_zero, weights, windows, box, extents = found
    found_requantization = _requantization(requantization, sums, definition)
    if found_requantization is None:
        return None
    bias, scale, per_channel, output_zero, low, high = found_requantization
    output = definition.tensor(requantization.target)
    info = np.iinfo(output.dtype)
    if not info.min <= low <= high <= info.max or not info.min <= output_zero <= info.max:
        return None
    return IntegerDepthwise(
        sums=sums.target,
        output=requantization.target,
        image=image,
        weights=weights,
        bias=bias,
        scale=scale,
        per_channel_scale=per_channel,
        image_zero=image_zero,
        output_zero=output_zero,
        low=low,
        high=high,
        indices=tuple(sums.indices),  # type: ignore[arg-type]
        windows=windows,
        box=box,
        extents=tuple(extents.items()),
        image_dtype=definition.tensor(image).dtype,
        weight_dtype=definition.tensor(weights).dtype,
        output_dtype=output.dtype,
    )


def _sums(statement: ir.CheckedStatement, definition: ir.CheckedDef):
    """The first statement's (image, its zero point, weights, windows, box, extents), or None."""
    target = definition.tensor(statement.target)
    if statement.op != "+" or not statement.init or target.dtype != np.dtype(np.int32) or target.rank != 4:
        return None
    if target.role is not ir.Role.TEMPORARY or len(set(statement.indices)) != 4:
        return None
    guarded = guarded_product(statement.rhs)
    if guarded is None:
        return None
    product, guard = guarded
    if not (isinstance(product, ir.Binary) and product.op == "*" and product.dtype == np.dtype(np.int32)):
        return None
    shifted = _shifted_image(product.lhs)
    weight_read = _cast_read(product.rhs, np.dtype(np.int32))
    if shifted is None or weight_read is None:
        return None
    image_read, image_zero = shifted
    if definition.tensor(image_read.tensor).dtype not in EIGHT_BITS:
        return None
    if definition.tensor(weight_read.tensor).dtype not in WEIGHT_DTYPES:
        return None
    if definition.tensor(image_read.tensor).role is not ir.Role.INPUT:
        return None
    if definition.tensor(weight_read.tensor).role is not ir.Role.INPUT or len(weight_read.subscripts) != 3:
        return None
    n, c, h, w = statement.indices
    parts = _image_subscripts(image_read.subscripts, statement.indices)
    if parts is None or len(parts) != 4 or parts[0] != n or parts[1] != c:
        return None
    windows = parts[2:]
    if not all(isinstance(p, Window) and p.k is not None for p in windows):
        return None
    wh, ww = windows
    assert isinstance(wh, Window) and isinstance(ww, Window) and wh.k is not None and ww.k is not None
    if (wh.x, ww.x) != (h, w) or wh.k == ww.k:
        return None
    if tuple(weight_read.subscripts) != (Affine.var(c), Affine.var(wh.k), Affine.var(ww.k)):
        return None
    if set(statement.reduction_indices) != {wh.k, ww.k}:
        return None
    extents = _full_range_extents(
        statement,
        definition,
        [
            (statement.target, tuple(statement.indices)),
            (weight_read.tensor, (c, wh.k, ww.k)),
            (image_read.tensor, (n, c, None, None)),
        ],
    )
    if extents is None:
        return None
    box: tuple[Bound, ...] = ()
    if guard:
        found = _padding_box(guard, image_read.subscripts, [wh, ww], statement.all_indices)
        if found is None:
            return None
        box = found
    return image_read.tensor, image_zero, weight_read.tensor, (wh, ww), box, extents


def _requantization(statement: ir.CheckedStatement, sums: ir.CheckedStatement, definition: ir.CheckedDef):
    """The second statement's (bias, scale, per-channel scale, output zero point, low, high), or None."""
    output = definition.tensor(statement.target)
    if statement.op != "=" or statement.reduction_indices or output.dtype not in EIGHT_BITS:
        return None
    if output.role is not ir.Role.OUTPUT or output.shape != definition.tensor(sums.target).shape:
        return None
    if len(statement.indices) != 4 or len(set(statement.indices)) != 4:
        return None
    n, c, h, w = statement.indices
    for index, extent in zip(statement.indices, output.shape):
        r = dict(statement.ranges)[index]
        if r.lo != Affine.const(0) or r.hi != extent:
            return None
    rhs = statement.rhs
    if not (isinstance(rhs, ir.Cast) and rhs.dtype == output.dtype):
        return None
    high_call = rhs.operand
    if not (isinstance(high_call, ir.Call) and high_call.func == "fmin" and len(high_call.args) == 2):
        return None
    low_call, high = high_call.args[0], _integer_literal(high_call.args[1])
    if not (isinstance(low_call, ir.Call) and low_call.func == "fmax" and len(low_call.args) == 2):
        return None
    shifted, low = low_call.args[0], _integer_literal(low_call.args[1])
    if low is None or high is None:
        return None
    if not (isinstance(shifted, ir.Binary) and shifted.op == "+" and shifted.dtype == np.dtype(np.float32)):
        return None
    rounded, output_zero = shifted.lhs, _integer_literal(shifted.rhs)
    if output_zero is None or not (isinstance(rounded, ir.Call) and rounded.func == "rint" and len(rounded.args) == 1):
        return None
    scaled = rounded.args[0]
    if not (isinstance(scaled, ir.Binary) and scaled.op == "*" and scaled.dtype == np.dtype(np.float32)):
        return None
    total = scaled.lhs.operand if isinstance(scaled.lhs, ir.Cast) and scaled.lhs.dtype == scaled.dtype else None
    scale = scaled.rhs
    if total is None or not isinstance(scale, ir.Read) or definition.tensor(scale.tensor).dtype != scaled.dtype:
        return None
    per_channel = _channel_read(scale, c, definition)
    if per_channel is None:
        return None
    position = (Affine.var(n), Affine.var(c), Affine.var(h), Affine.var(w))
    bias = None
    if isinstance(total, ir.Binary) and total.op == "+" and total.dtype == np.dtype(np.int32):
        bias_read = total.rhs
        total = total.lhs
        if not isinstance(bias_read, ir.Read) or definition.tensor(bias_read.tensor).dtype != np.dtype(np.int32):
            return None
        if _channel_read(bias_read, c, definition) is not True:
            return None
        bias = bias_read.tensor
    if not (isinstance(total, ir.Read) and total.tensor == sums.target and tuple(total.subscripts) == position):
        return None
    return bias, scale.tensor, per_channel, output_zero, low, high


def _channel_read(read: ir.Read, channel: str, definition: ir.CheckedDef) -> bool | None:
    """Whether ``read`` is one value per channel (True), one for all (False), or neither (None)."""
    tensor = definition.tensor(read.tensor)
    if tensor.role is not ir.Role.INPUT:
        return None
    if tuple(read.subscripts) == (Affine.var(channel),):
        return True
    if all(isinstance(s, Affine) and s == Affine.const(0) for s in read.subscripts):
        return False
    return None


def _integer_literal(expr: ir.TExpr) -> int | None:
    """The value of an integer literal (possibly under casts), or None."""
    while isinstance(expr, ir.Cast):
        expr = expr.operand
    if isinstance(expr, ir.Unary) and expr.op == "-":
        value = _integer_literal(expr.operand)
        return None if value is None else -value
    if not isinstance(expr, ir.Const) or isinstance(expr.value, (bool, np.bool_)):
        return None
    return int(expr.value) if float(expr.value).is_integer() else None


def _cast_read(expr: ir.TExpr, dtype: np.dtype) -> ir.Read | None:
    """The read under ``dtype(..)``, or None."""
    if isinstance(expr, ir.Cast) and expr.dtype == dtype and isinstance(expr.operand, ir.Read):
        return expr.operand
    return None


def _shifted_image(expr: ir.TExpr) -> tuple[ir.Read, int] | None:
    """``int32(X(..))`` or ``int32(X(..)) - literal``: the read and the literal (0 when absent)."""
    if isinstance(expr, ir.Binary) and expr.op == "-" and expr.dtype == np.dtype(np.int32):
        zero = _integer_literal(expr.rhs)
        read = _cast_read(expr.lhs, np.dtype(np.int32))
        return None if zero is None or read is None else (read, zero)
    read = _cast_read(expr, np.dtype(np.int32))
    return None if read is None else (read, 0)


__all__ = ["IntegerDepthwise", "recognise_integer_depthwise_def"]
