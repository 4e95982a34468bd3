"""Quantization: QuantizeLinear and DequantizeLinear; the integer products MatMulInteger and
ConvInteger and their requantized forms QLinearMatMul and QLinearConv, exact in int32.  The
matrix products are one statement over the 8-bit operands, which :mod:`polyc.paths.integer_gemm`
compiles; the convolutions shift their operands into int32 and are built on
:class:`~polyc.frontends.onnx.ops.convolutions.Conv`.
"""

from __future__ import annotations

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import KernelStep, Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _affine, _axis, _float_only, _number
from polyc.frontends.onnx.ops.contractions import product_layout
from polyc.frontends.onnx.ops.convolutions import Conv, _convolution_operands, _spatial, check_convolution_operands

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
            raise UnsupportedError(
                f"{b.where}: a scale or zero point of shape {param.shape} for blocks of "
                f"{block_size} along axis {axis} of {x.shape} (expected {tuple(blocks)})"
            )
        return [f"{i} / {block_size}" if d == axis else i for d, i in enumerate(idx)]
    if param.rank == 1 and param.shape[0] == x.shape[axis]:
        return [idx[axis]]
    raise UnsupportedError(
        f"{b.where}: a scale or zero point of shape {param.shape} fits neither the whole "
        f"tensor nor axis {axis} of {x.shape}"
    )


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
            raise UnsupportedError(
                f"{b.where}: output_dtype {numpy_dtype(requested)} is not the zero point's type {zero.dtype}"
            )
        if out_dtype not in _QUANTIZED:
            raise UnsupportedError(
                f"{b.where}: quantizing to {out_dtype or requested} is not supported (int8, uint8, int16, uint16)"
            )
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
        b.emit(
            [
                b.statement(
                    out,
                    idx,
                    "=",
                    f"{tc_type(out_dtype)}(fmin(fmax({quantized}, {_number(limits.min)}), {_number(limits.max)}))",
                )
            ],
            reads,
            [out],
            "elementwise",
        )
        return [out]


class DequantizeLinear(Converter):
    """(x - zero point) * scale, in float, of the scale's type (or ``output_dtype``)."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        from polyc.frontends.onnx.model import numpy_dtype

        x, scale = inputs[:2]
        zero = inputs[2] if len(inputs) > 2 else None
        if x.dtype not in _QUANTIZED + (np.dtype(np.int32),):
            raise UnsupportedError(
                f"{b.where}: dequantizing {x.dtype} is not supported (int8, uint8, int16, uint16, int32)"
            )
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
        b.emit(
            [b.statement(out, idx, "=", f"{tc_type(out_dtype)}({shifted} * float({scale_ref}))")],
            reads,
            [out],
            "elementwise",
        )
        return [out]


def _per_tensor_or_along(b, param: Value, shape, axis: int, idx, what: str) -> list[str]:
    """Subscripts of a scale or zero point of the integer products: one value, or one per index
    along ``axis`` (a row of A, a column of B, a row or column of the product)."""
    if param.size == 1 and param.rank <= 1:
        return ["0"] * param.rank
    if param.rank == 1 and param.shape[0] == shape[axis]:
        return [idx[axis]]
    raise UnsupportedError(
        f"{b.where}: {what} of shape {param.shape} is neither one value nor one per index "
        f"along axis {axis} of {tuple(shape)}"
    )


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


def _integer_operand(b, x: Value, what: str) -> None:
    if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise UnsupportedError(f"{b.where}: integer products of {x.dtype} ({what}) are not supported (int8, uint8)")


def _integer_product(b, node, a: Value, a_zero, c: Value, c_zero) -> Value:
    """``(a - a_zero) @ (c - c_zero)`` in int32, exactly, as one statement over the 8-bit tensors
    (``Y(.., m, n) +=! (int32(A(.., m, r0)) - int32(ZA(..))) * (int32(B(.., r0, n)) - int32(ZB(..)))``,
    the form of :mod:`polyc.paths.integer_gemm`): the zero points one value, one per row of ``a``
    or one per column of ``c``; batch dimensions broadcast as MatMul's.  Its own kind of step, so
    that no elementwise step fuses into it: the integer kernel takes the product alone."""
    _integer_operand(b, a, "A")
    _integer_operand(b, c, "B")
    layout = product_layout(b, a, c, "MatMulInteger")
    full, idx = layout.full, layout.indices
    reads = [a, c]

    def shifted(x: Value, subscripts, zero, axis: int, what: str) -> str:
        term = f"int32({b.ref(x, subscripts)})"
        if zero is None:
            return term
        if zero.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise UnsupportedError(f"{b.where}: {what} of type {zero.dtype} (int8 or uint8 expected)")
        zero_subscripts = _per_tensor_or_along(b, zero, full, axis, idx, what)
        reads.append(zero)
        return f"({term} - int32({b.ref(zero, zero_subscripts)}))"

    a_term = shifted(a, layout.a, a_zero, len(full) - 2, "A's zero point")
    c_term = shifted(c, layout.c, c_zero, len(full) - 1, "B's zero point")
    out = b.new(layout.shape, np.int32)
    b.emit(
        [b.statement(out, layout.out, "+=!", f"{a_term} * {c_term}", [("r0", layout.inner)])],
        reads,
        [out],
        "integer_product",
    )
    return out


def _requantized(
    b, product: Value, factor: str, zero, out_dtype, zero_axis: int, reads, bias=None, order=None
) -> Value:
    """``saturate(rint(float(product + bias) * factor) + zero)`` into ``out_dtype`` (the int32
    bias one per index along axis 1, or none), in float32; ``order``: where the result's axes are
    ``product``'s in another order (the result's axis d is the product's ``order[d]``: an integer
    convolution's filters x images x positions made NCHW), else None.  As
    onnxruntime requantizes its int32 sums (the factor ``a_scale * b_scale / y_scale`` in float32,
    rounding halves to even).  onnx's reference computes the product in double: the two differ
    by one step where the product lies within float32's rounding of a half, and a network
    compounds such steps layer after layer, so the runtime users compare with decides."""
    idx = indices(product.rank)
    order = list(order) if order is not None else list(range(product.rank))
    shape = [product.shape[d] for d in order]
    total = b.ref(product, [idx[order.index(d)] for d in range(product.rank)])
    if bias is not None:
        total = f"{total} + {b.ref(bias, [idx[1]])}"
        reads = reads + [bias]
    value = f"rint(float({total}) * float({factor}))"
    if zero is not None:
        zero_subscripts = _per_tensor_or_along(b, zero, shape, zero_axis, idx, "y_zero_point")
        value = f"{value} + float({b.ref(zero, zero_subscripts)})"
        reads = reads + [zero]
    limits = np.iinfo(out_dtype)
    out = b.new(shape, out_dtype)
    b.emit(
        [
            b.statement(
                out,
                idx,
                "=",
                f"{tc_type(out_dtype)}(fmin(fmax({value}, {_number(limits.min)}), {_number(limits.max)}))",
            )
        ],
        [product] + reads,
        [out],
        # The integer kernel applies it to each block of its sums (plan.py fuses "requantize"
        # into "integer_product" only): the float kernels take epilogues that update their
        # output in place, not ones that write another tensor of another type.
        "requantize",
    )
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

        factor = (
            f"{ref(a_scale, rows, 'a_scale')} * {ref(c_scale, columns, 'b_scale')} / {ref(y_scale, columns, 'y_scale')}"
        )
        out_dtype = y_zero.dtype if y_zero is not None else a.dtype
        return [_requantized(b, product, factor, y_zero, out_dtype, columns, [a_scale, c_scale, y_scale])]


class ConvInteger(Converter):
    """A convolution of the shifted operands in int32, exactly; padding is 0 after the shift
    (the input's zero point before it), as onnx's reference pads."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        x, w, x_zero, w_zero = (inputs + [None] * 4)[:4]
        product, _, _ = _integer_convolution(b, node, x, x_zero, w, w_zero, None)
        if product.dtype == np.int32:
            return [product]
        idx = indices(product.rank)
        out = b.new(product.shape, np.int32)
        b.emit([b.statement(out, idx, "=", f"int32({b.ref(product, idx)})")], [product], [out], "elementwise")
        return [out]


def _integer_convolution(b, node, x, x_zero, w, w_zero, bias, as_product=False) -> tuple[Value, Value | None, bool]:
    """``conv(x - x_zero, w - w_zero) + bias``, exactly, the bias still to add (None: added),
    and whether the first is the integer product's own tensor (filters x images x positions...,
    see :func:`_as_integer_product`), which ``as_product`` asks for instead of the NCHW result.

    One group: an integer matrix product of the 8-bit weights and the windows of the 8-bit
    input (:func:`_as_integer_product`), summed in int32 by :mod:`polyc.paths.integer_gemm`, the
    bias left to the requantization.  Groups: with constant weights a float tensor holding the
    same integers (:func:`_exact_float_type`), else int32 loop nests."""
    if x_zero is not None and x_zero.size != 1:
        raise UnsupportedError(f"{b.where}: the input's zero point must be one value (it has shape {x_zero.shape})")
    if bias is not None and bias.dtype != np.int32:
        raise UnsupportedError(f"{b.where}: the bias must be int32, not {bias.dtype}")
    x, w, _, groups, _, _ = _convolution_operands(b, node, [x, w])
    eight_bits = (np.dtype(np.int8), np.dtype(np.uint8))
    if groups == 1 and x.dtype in eight_bits and w.dtype in eight_bits:
        product = _as_integer_product(b, node, x, x_zero, w, w_zero)
        if as_product:
            return product, bias, True
        return _images_first(b, product), bias, False
    exact = _exact_float_type(b, x, x_zero, w, w_zero, bias)
    if exact is not None:
        shifted_w = w.const.astype(np.int64) - _zero_points(w_zero, w.rank, 0)
        operands = [
            _shifted_float(b, x, x_zero, exact),
            b.const(shifted_w.astype(exact)),
        ] + ([b.const(bias.const.astype(exact))] if bias is not None else [])
        first = len(b.steps)
        (out,) = Conv._impl_v1(b, node, operands)
        # Winograd's transformed weights carry halves and quarters, which the bound on the
        # integer sums does not count: the direct kernels keep them exact integers.
        for step in b.steps[first:]:
            if isinstance(step, KernelStep):
                step.options["winograd"] = False
        return out, None, False
    operands = [
        _shifted_int32(b, x, x_zero, 0, "the input's zero point"),
        _shifted_int32(b, w, w_zero, 0, "the weights' zero point"),
    ]
    return Conv._impl_v1(b, node, operands + ([bias] if bias is not None else []))[0], None, False


def _as_integer_product(b, node, x: Value, x_zero, w: Value, w_zero) -> Value:
    """A convolution of one group as ``(W - w_zero) @ (windows of x - x_zero)``, in int32: the
    weights viewed as filters x (channels * taps), the input (one image, a 1x1 stride-1
    convolution) or an im2col copy of its windows (x's zero point where a window reads padding,
    so that the shifted value is 0, as the operator pads) viewed as (channels * taps) x
    (images * positions): the form of :mod:`polyc.paths.integer_gemm`.  Returns the product,
    filters x images x output positions (its columns the image and position indices, which the
    integer kernel finds to step evenly, as one run); the copy puts the image inside the channels
    and taps, so that the windows of all images are one matrix.  :func:`_images_first` makes it
    the convolution's NCHW result; a requantization reads it as it is."""
    n, channels = x.shape[:2]
    filters, kernel = w.shape[0], list(w.shape[2:])
    outs, begin, end, strides, dilations = _spatial(b, node, x, kernel)
    k = len(kernel)
    taps = int(np.prod(kernel, dtype=np.int64))
    sp = [f"s{d}" for d in range(k)]
    pointwise = all(size == 1 for size in kernel) and all(s == 1 for s in strides)
    if n == 1 and pointwise and not any(begin) and not any(end):
        columns = b.view(x, [channels, 1, *outs])
    else:
        padding = b.ref(x_zero, ["0"] * x_zero.rank) if x_zero is not None else f"{tc_type(x.dtype)}(0)"
        source = x
        if any(begin) or any(end):  # padded first, so that the copy of the windows needs no guards
            source = b.new([n, channels, *(x.shape[2 + d] + begin[d] + end[d] for d in range(k))], x.dtype)
            inside = [f"h{d} >= {begin[d]} && h{d} < {x.shape[2 + d] + begin[d]}" for d in range(k)]
            read = b.ref(x, ["n", "c", *(f"h{d} - {begin[d]}" if begin[d] else f"h{d}" for d in range(k))])
            b.emit(
                [
                    b.statement(
                        source,
                        ["n", "c", *(f"h{d}" for d in range(k))],
                        "=",
                        f"({' && '.join(inside)}) ? {read} : {padding}",
                    )
                ],
                [x] + ([x_zero] if x_zero is not None else []),
                [source],
                "other",
            )
        col = b.new([channels, *kernel, n, *outs], x.dtype)
        window = [f"k{d}" for d in range(k)]
        at = [_affine(strides[d], sp[d], 0) + f" + {_affine(dilations[d], window[d], 0)}" for d in range(k)]
        b.emit(
            [b.statement(col, ["c", *window, "n", *sp], "=", b.ref(source, ["n", "c", *at]))], [source], [col], "other"
        )
        columns = b.view(col, [channels * taps, n, *outs])
    matrix = b.view(w, [filters, channels * taps])
    product = b.new([filters, n, *outs], np.int32)
    a_term, reads = f"int32({b.ref(matrix, ['f', 'r_k'])})", [matrix, columns]
    if w_zero is not None:
        a_term = f"({a_term} - int32({b.ref(w_zero, ['f'] if w_zero.size > 1 else ['0'] * w_zero.rank)}))"
        reads.append(w_zero)
    b_term = f"int32({b.ref(columns, ['r_k', 'n', *sp])})"
    if x_zero is not None:
        b_term = f"({b_term} - int32({b.ref(x_zero, ['0'] * x_zero.rank)}))"
        reads.append(x_zero)
    b.emit(
        [b.statement(product, ["f", "n", *sp], "+=!", f"{a_term} * {b_term}", [("r_k", channels * taps)])],
        reads,
        [product],
        "integer_product",
    )
    return product


def _images_first(b, product: Value) -> Value:
    """The integer convolution's ``product`` (filters x images x output positions) as its NCHW
    result: a view for one image, else a transposed copy."""
    filters, n, *outs = product.shape
    if n == 1:
        return b.view(product, [n, filters, *outs])
    sp = [f"s{d}" for d in range(len(outs))]
    out = b.new([n, filters, *outs], np.int32)
    b.emit([b.statement(out, ["n", "f", *sp], "=", b.ref(product, ["f", "n", *sp]))], [product], [out], "other")
    return out


def _zero_points(zero, rank: int, axis: int) -> np.ndarray | int:
    """A constant zero point as an int64 array broadcasting along ``axis`` (0 where absent)."""
    if zero is None:
        return 0
    shape = [zero.size if d == axis else 1 for d in range(rank)] if zero.size > 1 else []
    return zero.const.astype(np.int64).reshape(shape)


#: Integers a float type holds exactly: every integer of magnitude up to 2^mantissa bits.
_EXACT_INTEGERS = ((np.dtype(np.float32), 2**24), (np.dtype(np.float64), 2**53))


def _exact_float_type(b, x, x_zero, w, w_zero, bias) -> np.dtype | None:
    """float32 (else float64) where a convolution of ``x - x_zero`` by the constant ``w - w_zero``
    plus ``bias`` is computed exactly in it, in any order of the sums: every product and partial
    sum is an integer no larger than the largest input shifted, times the largest sum of one
    filter's shifted weights' magnitudes, plus the largest bias.  None: weights or zero points
    known only when the model runs (the int32 path)."""
    if w.const is None or any(v is not None and v.const is None for v in (x_zero, w_zero, bias)):
        return None
    limits = np.iinfo(x.dtype)
    zero = int(x_zero.const.reshape(-1)[0]) if x_zero is not None else 0
    largest_input = max(zero - int(limits.min), int(limits.max) - zero)
    filters = np.abs(w.const.astype(np.int64) - _zero_points(w_zero, w.rank, 0)).reshape(w.shape[0], -1)
    bound = largest_input * int(filters.sum(axis=1).max(initial=0))
    if bias is not None:
        bound += int(np.abs(bias.const.astype(np.int64)).max(initial=0))
    return next((dtype for dtype, exact in _EXACT_INTEGERS if bound <= exact), None)


def _shifted_float(b, x: Value, zero, dtype: np.dtype) -> Value:
    """``x - zero`` as ``dtype`` (an integer it holds exactly), the zero point one value."""
    idx = indices(x.rank)
    rhs = f"{tc_type(dtype)}({b.ref(x, idx)})"
    reads = [x]
    if zero is not None:
        rhs = f"{rhs} - {tc_type(dtype)}({b.ref(zero, ['0'] * zero.rank)})"
        reads.append(zero)
    out = b.new(x.shape, dtype)
    b.emit([b.statement(out, idx, "=", rhs)], reads, [out], "elementwise")
    return out


class QLinearConv(Converter):
    """ConvInteger plus an int32 bias, scaled by x_scale * w_scale / y_scale (w_scale one value
    or one per output channel) in double, rounded and saturated into y's type."""

    @staticmethod
    def _impl_v10(b, node, inputs):
        x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = (inputs + [None] * 9)[:9]
        depthwise = _integer_depthwise(b, node, inputs)
        if depthwise is not None:
            return [depthwise]
        product, bias, as_product = _integer_convolution(b, node, x, x_zero, w, w_zero, bias, as_product=True)
        out_dtype = y_zero.dtype if y_zero is not None else x.dtype
        # The integer product (filters x images x output positions) requantized into NCHW as it
        # is read: one kernel with the product (its epilogue), no int32 NCHW copy, and no view
        # between it and what reads it (a residual Add then joins the kernel too).
        order = (1, 0, *range(2, product.rank)) if as_product else None
        shape = [product.shape[d] for d in order] if order else product.shape
        idx = indices(len(shape))

        def ref(param, what):
            return b.ref(param, _per_tensor_or_along(b, param, shape, 1, idx, what))

        factor = f"{ref(x_scale, 'x_scale')} * {ref(w_scale, 'w_scale')} / {ref(y_scale, 'y_scale')}"
        return [_requantized(b, product, factor, y_zero, out_dtype, 1, [x_scale, w_scale, y_scale], bias, order)]


def _constant_values(*values) -> bool:
    """Whether every value given is a constant (None: an omitted input, which counts)."""
    return all(v is None or v.const is not None for v in values)


def _integer_depthwise(b, node, inputs) -> Value | None:
    """A 2-D QLinearConv with one filter per channel, as the two statements of
    :mod:`polyc.schedule.integer_depthwise` (the int32 sums of the image shifted by its zero
    point and the constant weights shifted by theirs, zero padding as the statement's condition;
    then the bias, the scale per channel and the saturation into y's type), one step that
    nothing fuses into, for :mod:`polyc.paths.integer_depthwise`.  None where the convolution
    is not one (grouped otherwise, not 2-D, scales or zero points known only at run time): the
    general integer convolution computes it."""
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = (inputs + [None] * 9)[:9]
    eight_bits = (np.dtype(np.int8), np.dtype(np.uint8))
    if x.rank != 4 or w.rank != 4 or x.dtype not in eight_bits or w.dtype not in eight_bits:
        return None
    channels = x.shape[1]
    if node.attr("group", 1) != channels or w.shape[0] != channels or w.shape[1] != 1 or channels == 1:
        return None
    if not _constant_values(w, x_scale, x_zero, w_scale, w_zero, y_scale, y_zero, bias):
        return None
    if (x_zero is not None and x_zero.size != 1) or (y_zero is not None and y_zero.size != 1):
        return None
    if bias is not None and (bias.dtype != np.dtype(np.int32) or bias.size != channels):
        return None
    scales = [x_scale.const, w_scale.const, y_scale.const]
    if any(s.dtype != np.dtype(np.float32) for s in scales) or x_scale.size != 1 or y_scale.size != 1:
        return None
    if w_scale.size not in (1, channels) or (w_zero is not None and w_zero.size not in (1, channels)):
        return None
    check_convolution_operands(b, node, x.shape, w, bias)
    kh, kw = w.shape[2:]
    outs, begin, end, strides, dilations = _spatial(b, node, x, [kh, kw])
    out_dtype = y_zero.dtype if y_zero is not None else x.dtype
    if out_dtype not in eight_bits:
        return None
    # As onnxruntime: the factor x_scale * w_scale / y_scale in float32, per channel.
    factor = (np.float32(x_scale.const.reshape(-1)[0]) * w_scale.const.reshape(-1).astype(np.float32)) / np.float32(
        y_scale.const.reshape(-1)[0]
    )
    scale = b.const(np.ascontiguousarray(np.broadcast_to(factor, (channels,)), dtype=np.float32))
    taps = (w.const.astype(np.int16).reshape(channels, kh, kw) - _zero_points(w_zero, 3, 0)).astype(np.int16)
    weights = b.const(np.ascontiguousarray(taps))
    image_zero = int(x_zero.const.reshape(-1)[0]) if x_zero is not None else 0
    output_zero = int(y_zero.const.reshape(-1)[0]) if y_zero is not None else 0
    window = [f"{_affine(strides[d], f's{d}', 0)} + {_affine(dilations[d], f'r_k{d}', -begin[d])}" for d in range(2)]
    inside = [f"{window[d]} >= 0" for d in range(2) if begin[d] > 0]
    inside += [f"{window[d]} < {x.shape[2 + d]}" for d in range(2) if end[d] > 0]
    image = f"int32({b.ref(x, ['n', 'c', *window])})"
    if image_zero:
        image = f"({image} - {image_zero})"
    rhs = f"{image} * int32({b.ref(weights, ['c', 'r_k0', 'r_k1'])})"
    if inside:
        rhs = f"({' && '.join(inside)}) ? {rhs} : 0"
    idx = ["n", "c", "s0", "s1"]
    sums = b.new([x.shape[0], channels, *outs], np.int32)
    total = f"{sums.ident}(n, c, s0, s1)"
    reads = [x, weights, scale]
    if bias is not None:
        total = f"{total} + {b.ref(bias, ['c'])}"
        reads.append(bias)
    limits = np.iinfo(out_dtype)
    value = f"rint(float({total}) * {b.ref(scale, ['c'])}) + float({output_zero})"
    out = b.new(sums.shape, out_dtype)
    b.emit(
        [
            b.statement(sums, idx, "+=!", rhs, [("r_k0", kh), ("r_k1", kw)]),
            b.statement(
                out,
                idx,
                "=",
                f"{tc_type(out_dtype)}(fmin(fmax({value}, float({int(limits.min)})), float({int(limits.max)})))",
            ),
        ],
        reads,
        [sums, out],
        "integer_convolution",
    )
    return out
