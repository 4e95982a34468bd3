"""Convolutions and pools: Conv (direct, as a matrix product or, depthwise, unrolled) and
ConvTranspose; MaxPool, AveragePool, LpPool, GlobalAveragePool and GlobalMaxPool; and
BatchNormalization.  The window arithmetic (:func:`_spatial`) and the image layouts
(:func:`image_indices`, NCHW or NHWC) are shared with :mod:`polyc.frontends.onnx.channels_last`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from polyc.errors import ModelError, SignatureError, UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _affine, _float_only, _number
from polyc.frontends.onnx.ops.shapes import Pad


def image_indices(channels_last: bool, batch, channel, spatial) -> list:
    """An image's subscripts (or extents) in its layout: NCHW, or NHWC when ``channels_last``."""
    return [batch, *spatial, channel] if channels_last else [batch, channel, *spatial]


def _spatial(b, node, x, kernel, strides_default=1, channels_last=False):
    """Output extents, pads (begin, end), strides and dilations of a window over x's spatial dims."""
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    k = len(spatial)
    _check_window(b, node, k, kernel)
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
                f"output would be empty; the model needs a larger input"
            )
        outs.append(max(out, 0))
    return outs, pads[:k], pads[k:], strides, dilations


def _check_window(b, node, k: int, kernel) -> None:
    """Refuses, as onnxruntime does, window attributes that break the specification for ``k``
    spatial dimensions: a count other than k (2k pads), strides or dilations below 1, negative
    pads, and kernel extents below 1."""
    for name, count, least in (("strides", k, 1), ("dilations", k, 1), ("pads", 2 * k, 0), ("kernel_shape", k, 1)):
        values = node.attr(name)
        if values is not None and (len(values) != count or any(v < least for v in values)):
            raise ModelError(
                f"{b.where}: {name} {list(values)} for {k} spatial dimensions: the specification "
                f"wants {count} values of at least {least}"
            )
    if len(kernel) != k or any(extent < 1 for extent in kernel):
        raise ModelError(f"{b.where}: a window of {list(kernel)} for {k} spatial dimensions")


def check_convolution_operands(b, node, x_shape, w: Value, bias: Value | None, transposed: bool = False) -> None:
    """Refuses, as onnxruntime does, a Conv (or ConvTranspose) whose weights do not fit its
    input (``x_shape``, NCHW) and ``group``, whose bias is not one value per output channel, or
    whose ``kernel_shape`` is not its weights' window."""
    groups = node.attr("group", 1)
    if w.rank != len(x_shape) or groups < 1 or x_shape[1] % groups:
        raise ModelError(
            f"{b.where}: weights of shape {w.shape} and group {groups} do not fit an input of shape {tuple(x_shape)}"
        )
    channels_read, filters = (w.shape[0], w.shape[1] * groups) if transposed else (w.shape[1] * groups, w.shape[0])
    if channels_read != x_shape[1]:
        raise ModelError(
            f"{b.where}: weights of shape {w.shape} with group {groups} read {channels_read} channels, "
            f"the input has {x_shape[1]}"
        )
    if bias is not None and bias.shape != (filters,):
        raise ModelError(
            f"{b.where}: the bias must be a 1-D tensor of {filters} values (one per output channel), not {bias.shape}"
        )
    kernel_shape = node.attr("kernel_shape")
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w.shape[2:]):
        raise ModelError(f"{b.where}: kernel_shape {list(kernel_shape)} is not the weights' window {w.shape[2:]}")


def _convolution_operands(b, node, inputs):
    """(input, weights, bias or None, groups, batch, channels) of a Conv or ConvTranspose, whose
    input must have a batch, channels and at least one spatial dimension."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    if x.rank < 3:
        raise UnsupportedError(f"{b.where}: {node.op_type} of a rank-{x.rank} input")
    check_convolution_operands(b, node, x.shape, w, bias, transposed=node.op_type == "ConvTranspose")
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
                statements.append(
                    b.statement(out, ["n", "f", *sp], "=", f"{out.ident}(n, f, {', '.join(sp)}) + {b.ref(bias, ['f'])}")
                )
            b.emit(statements, [x, w] + ([bias] if bias is not None else []), [out], "convolution")
            return [out]
        if per_group == 1 and per_filter_group == 1 and w.const is not None:
            w3 = b.const(w.const.reshape([filters] + kernel))
            out = b.new([n, filters, *outs], x.dtype)
            rhs = f"{b.ref(x, ['n', 'c', *window])} * {b.ref(w3, ['c', *taps])}"
            statements = [b.statement(out, ["n", "c", *sp], "+=!", rhs, tap_ranges)]
            if bias is not None:
                statements.append(
                    b.statement(out, ["n", "c", *sp], "=", f"{out.ident}(n, c, {', '.join(sp)}) + {b.ref(bias, ['c'])}")
                )
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
            statements.append(
                b.statement(
                    out5, ["n", "g", "f", *sp], "=", f"{out5.ident}(n, g, f, {', '.join(sp)}) + {b.ref(b2, ['g', 'f'])}"
                )
            )
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
            statements.append(
                b.statement(out, ["n", "f", *sp], "=", f"{out.ident}(n, f, {', '.join(sp)}) + {b.ref(bias, ['f'])}")
            )
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


#: Output positions per image up to which a convolution runs as a matrix product (polyc's gemm
#: kernel) rather than as polyc's direct convolution kernel, for (windows of more than one
#: tap, pointwise 1x1), by the host's vector width.  With very few positions the direct
#: kernel's vectors along the output row are mostly empty (a 3x3 window at 5x5 outputs fills
#: 25 of 48 lanes; the product's 8 x 16 or 8 x 32 blocks 25 of 32), and a 1x1 convolution of
#: one vector's positions or fewer (efficientnet's squeeze-and-excitation: one position) is a
#: matrix-vector product.  Above that the direct kernel: since it reads the weights in place
#: (no packing per call) it runs faster than the product at 7x7, 14x14 and beyond, where with
#: packed weights the product had been faster there.  Against the old limits (144, 196) these
#: made resnet18, mobilenet_v2 and efficientnet_b0 faster and squeezenet1_1 no slower, with
#: AVX-512 and with AVX2 code (measured with ``python -m benchmarks.onnx_bench``, batch 1 and 8).
MATRIX_PRODUCT_POSITIONS = {512: (36, 16), 256: (36, 8)}


def _as_matrix_product(b: Builder, kernel, outs, strides, dilations, begin, end) -> bool:
    positions = int(np.prod(outs)) if outs else 1
    pointwise = all(size == 1 for size in kernel) and all(s == 1 for s in strides) and not any(begin) and not any(end)
    windows, pointwise_limit = MATRIX_PRODUCT_POSITIONS.get(b.vector_bits, MATRIX_PRODUCT_POSITIONS[256])
    return positions <= (pointwise_limit if pointwise else windows)


class _Attributes:
    def __init__(self, **attributes):
        self.attributes = attributes

    def attr(self, name, default=None):
        return self.attributes.get(name, default)


def _pool_window(b, node, x, channels_last: bool):
    """A pool's kernel, its window's pads (begin, end), strides and dilations, and its output."""
    kernel = node.attr("kernel_shape")
    outs, begin, end, strides, dilations = _spatial(b, node, x, kernel, channels_last=channels_last)
    out = b.new(image_indices(channels_last, x.shape[0], x.shape[-1 if channels_last else 1], outs), x.dtype)
    return kernel, begin, end, strides, dilations, out


class MaxPool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return MaxPool.lower(b, node, inputs, channels_last=False)

    @staticmethod
    def lower(b, node, inputs, channels_last: bool):
        x = inputs[0]
        kernel, begin, end, strides, dilations, out = _pool_window(b, node, x, channels_last)
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
    strides_of_taps = [math.prod(kernel[d + 1 :]) for d in range(k)]
    tap_number = " + ".join(f"{t} * {m}" for t, m in zip(taps, strides_of_taps))
    idx = ["n", "c"] + sp
    first = b.new(best.shape, np.int64)
    read = b.ref(x, ["n", "c"] + window)
    at_first = f"{first.ident}({', '.join(idx)})"
    place = positions([f"(({at_first} / {m}) % {kernel[d]})" for d, m in enumerate(strides_of_taps)])
    flat = f"(n * {x.shape[1]} + c)"
    for d in reversed(range(k)) if column_major else range(k):
        flat = f"({flat}) * {spatial[d]} + {place[d]}"
    where = b.new(best.shape, np.int64)
    b.emit(
        [
            b.statement(
                first,
                idx,
                "min=!",
                f"({inside} && {read} == {b.ref(best, idx)}) ? int64({tap_number}) : int64({math.prod(kernel)})",
                [(t, kernel[d]) for d, t in enumerate(taps)],
            ),
            b.statement(where, idx, "=", f"int64({flat})"),
        ],
        [x, best],
        [where],
        "reduction",
    )
    return where


class AveragePool(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        return AveragePool.lower(b, node, inputs, channels_last=False)

    @staticmethod
    def lower(b, node, inputs, channels_last: bool):
        x = inputs[0]
        kernel, begin, end, strides, dilations, out = _pool_window(b, node, x, channels_last)
        return [
            _pool(
                b,
                x,
                out,
                kernel,
                begin,
                strides,
                dilations,
                "average",
                include_pad=node.attr("count_include_pad", 0),
                end=end,
                channels_last=channels_last,
            )
        ]


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
#: conditions inside the vector loop (far slower): they keep the convolution kernel.  (In NHWC
#: depthwise convolutions have a kernel of their own, :mod:`polyc.codegen.depthwise`.)
UNROLLED_DEPTHWISE_TAPS = 9


def unrolled_depthwise(b, x, w, bias, kernel, outs, begin, strides, dilations):
    """A depthwise convolution (one filter per channel) of an NCHW image as a sum of its taps written out,
    vectorised along the output row like an elementwise step, rather than through the
    convolution kernel, whose register blocks have one channel here and a reduction of a few
    taps, and whose padding needs a copy of the image first.  The output starts as the bias;
    its interior (every tap inside the image) adds the taps without guards; the slabs along
    each edge add the taps that fall inside.  Through the convolution kernel with its padding
    step, mobilenet_v2's 3 x 3 stride-2 layer on 96 x 112 x 112 took several times as long
    (``python -m benchmarks.onnx_segments mobilenet_v2``).  None when the window is
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
    interior = [
        _window_interior(x.shape[first + d], outs[d], kernel[d], strides[d], dilations[d], begin[d]) for d in range(k)
    ]
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
    statements = [
        f"{out.ident}({', '.join(idx)}) = {start} where "
        + ", ".join(f"{name} in 0:{extent}" for name, extent in zip(idx, out.shape))
    ]
    if all(high > low for low, high in interior):
        statements.append(add_taps(interior, guarded=False))
    for d in range(k):
        if any(high <= low for low, high in interior[:d]):
            break  # the slabs of the dimensions before cover the rest
        for edge in ((0, interior[d][0]), (interior[d][1], outs[d])):
            if edge[1] > edge[0]:
                statements.append(add_taps(interior[:d] + [edge] + full[d + 1 :], guarded=True))
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
    plans = [
        _window_regions(x.shape[1 + d], out.shape[1 + d], kernel[d], strides[d], dilations[d], begin[d])
        for d in range(k)
    ]
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
        statements.append(
            f"{out.ident}({', '.join(idx)}) = {combine(reads)} where "
            + ", ".join(f"{name} in {lo}:{hi}" for name, (lo, hi) in zip(idx, ranges))
        )
    return statements


def _unrolled_max_pool(b, x, out, kernel, begin, strides, dilations) -> bool:
    """A MaxPool of an NHWC image as one max of its taps written out per region of positions
    (:func:`_region_statements`): one pass over the image, where the separable form
    (:func:`_separable_max_pool`) makes two through a temporary (measured on resnet18's 3x3
    stride-2 pool at batch 8: ``python -m benchmarks.onnx_segments resnet18 --batch 8``).  False
    (nothing emitted) when the window does not suit regions."""
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
    resnet18's 3x3 stride-2 pool it is many times faster than a guarded reduction and as fast as
    onnxruntime's (``python -m benchmarks.onnx_segments resnet18``).  False (nothing emitted) for
    long windows or wide edges."""
    k = len(kernel)
    if any(size > SEPARABLE_POOL_TAPS for size in kernel):
        return False
    first = 1 if channels_last else 2  # the first spatial axis
    plans = [
        _window_regions(x.shape[first + d], out.shape[first + d], kernel[d], strides[d], dilations[d], begin[d])
        for d in range(k)
    ]
    if any(plan is None for plan in plans):
        return False
    statements, source = [], x
    maximum = "fmax" if x.dtype.kind == "f" else "max"  # fmax would make integers floats
    idx = image_indices(channels_last, "n", "c", [f"s{d}" for d in range(k)])
    # The outermost dimension first: its pass reads whole rows (vectors of consecutive
    # elements) and, with a stride, leaves fewer rows for the passes that read along them
    # (faster on resnet18's 3x3 stride-2 pool: ``python -m benchmarks.onnx_segments resnet18``).
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
                reads.append(b.ref(source, idx[:axis_d] + [at] + idx[axis_d + 1 :]))
            rhs = reads[0]
            for read in reads[1:]:
                rhs = f"{maximum}({rhs}, {read})"
            ranges = ", ".join(
                f"{name} in {low if axis == axis_d else 0}:{stop if axis == axis_d else extent}"
                for axis, (name, extent) in enumerate(zip(idx, shape))
            )
            statements.append(f"{target.ident}({', '.join(idx)}) = {rhs} where {ranges}")
        source = target
    b.emit(statements, [x], [out], "reduction")
    return True


def _pool(b, x, out, kernel, begin, strides, dilations, kind, include_pad=0, end=None, channels_last=False):
    k = len(kernel)
    first = 1 if channels_last else 2  # the first spatial axis
    sp = [f"s{d}" for d in range(k)]
    taps = [f"r_k{d}" for d in range(k)]
    positions = [
        f"{_affine(strides[d], sp[d], 0)} + {_affine(dilations[d], taps[d], 0)} - {begin[d]}"
        if begin[d]
        else f"{_affine(strides[d], sp[d], 0)} + {_affine(dilations[d], taps[d], 0)}"
        for d in range(k)
    ]
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
        b.emit(
            [
                b.statement(total, idx, "+=!", f"({guard}) ? {power} : 0" if guard else power, ranges),
                b.statement(out, idx, "=", root),
            ],
            [x],
            [out],
            "reduction",
        )
        return out
    rhs = f"({guard}) ? {read} : 0" if guard else read
    statements = [b.statement(total, idx, "+=!", rhs, ranges)]
    if include_pad:
        # Taps in the padding count, taps past it (ceil mode) do not: of the K taps at
        # s*o + d*t (padded coordinates), those below the padded extent P.
        divisor = (
            "("
            + " * ".join(
                f"min({kernel[d]}, ({x.shape[first + d] + end[d] + begin[d]} - "
                f"{_affine(strides[d], sp[d], 0)} + {dilations[d] - 1}) / {dilations[d]})"
                for d in range(k)
            )
            + ")"
        )
    else:
        count = b.new(out.shape[first : first + k], x.dtype)
        statements.append(
            b.statement(count, sp, "+=!", f"({guard}) ? 1 : 0", ranges)
            if guard
            else b.statement(count, sp, "+=!", "1", ranges)
        )
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
    if channels_last and kind != "max" and x.dtype.kind == "f" and math.prod(x.shape[first : first + k]):
        return _channels_last_global_average(b, x)  # (the mean of no positions is 0 / 0 below)
    out = b.new(image_indices(channels_last, x.shape[0], channels, [1] * k), x.dtype)
    idx = image_indices(channels_last, "n", "c", [f"z{d}" for d in range(k)])
    taps = [(f"r_s{d}", x.shape[first + d]) for d in range(k)]
    read = b.ref(x, image_indices(channels_last, "n", "c", [t for t, _ in taps]))
    if kind == "max" and x.dtype.kind == "f" and math.prod(e for _, e in taps) > 0:
        # max= skips a NaN (fmax), as onnxruntime does for most positions; a window of NaNs only
        # would give -inf where onnxruntime gives NaN (see the Reduce ops).
        holds_number = b.new(out.shape, np.bool_)
        at = f"{out.ident}({', '.join(idx)})"
        nan = f"{tc_type(x.dtype)}({_number(math.nan)})"
        statements = [
            b.statement(holds_number, idx, "max=!", f"{read} == {read}", taps),
            b.statement(out, idx, "max=!", read, taps),
            b.statement(out, idx, "=", f"{holds_number.ident}({', '.join(idx)}) ? {at} : {nan}"),
        ]
        b.emit(statements, [x], [out], "reduction")
    elif kind == "max":
        b.emit([b.statement(out, idx, "max=!", read, taps)], [x], [out], "reduction")
    else:
        count = math.prod(x.shape[first : first + k])
        b.emit(
            [
                b.statement(out, idx, "+=!", read, taps),
                b.statement(out, idx, "=", f"{out.ident}({', '.join(idx)}) / {count}"),
            ],
            [x],
            [out],
            "reduction",
        )
    return out


def _channels_last_global_average(b, x):
    """The mean over the positions of an NHWC image as a product of the image, viewed as
    ``(N, positions, C)``, with a vector of ``1 / positions``: at batch 1, polyc's
    matrix-vector kernel, which streams the image with the channels in vector registers; as a
    reduction over (h, w) per channel, polyc's loops read the image a channel apart, several
    times slower on efficientnet_b0's 112 x 112 x 32, and more so at batch 8, a 3-D reduction
    (``python -m benchmarks.onnx_segments efficientnet_b0``)."""
    n, channels = x.shape[0], x.shape[-1]
    positions = math.prod(x.shape[1:-1])
    weights = b.const(np.full(positions, 1 / positions, x.dtype))
    if n == 1:
        image, total, idx = b.view(x, [positions, channels]), b.new([channels], x.dtype), ["c"]
    else:
        image, total, idx = b.view(x, [n, positions, channels]), b.new([n, channels], x.dtype), ["n", "c"]
    read = b.ref(image, idx[:-1] + ["r_p", "c"])
    b.emit(
        [b.statement(total, idx, "+=!", f"{read} * {b.ref(weights, ['r_p'])}", [("r_p", positions)])],
        [image, weights],
        [total],
        "contraction",
    )
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
            return [
                _channelwise(
                    b,
                    x,
                    lambda ref: f"{ref} * {channel(factor_value)} + {channel(shift_value)}",
                    [factor_value, shift_value],
                )
            ]
        channel = lambda v: b.ref(v, ["i1"])  # noqa: E731
        return [
            _channelwise(
                b,
                x,
                lambda ref: (
                    f"({ref} - {channel(mean)}) / sqrt({channel(var)} + "
                    f"{_number(epsilon)}) * {channel(scale)} + {channel(bias)}"
                ),
                [scale, bias, mean, var],
            )
        ]


def _channelwise(b, x, make, extra):
    out = b.new(x.shape, x.dtype)
    idx = indices(x.rank)
    b.emit([b.statement(out, idx, "=", make(b.ref(x, idx)))], [x, *extra], [out], "elementwise")
    return out
