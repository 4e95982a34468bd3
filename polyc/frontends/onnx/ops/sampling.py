"""Image sampling: reads of an image at computed, fractional or learned positions, interpolated:
Resize and Upsample, GridSample, RoiAlign and DeformConv (a convolution whose taps move); and
Col2Im, columns of image blocks summed back into the image.
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, Node, _affine, _float_only, _number, _require_const


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
            raise UnsupportedError(
                f"{b.where}: sampling_ratio {grid}: an adaptive count of samples (from each box's "
                f"size) is not supported; give a positive sampling_ratio"
            )
        if mode not in ("avg", "max") or transformation not in ("half_pixel", "output_half_pixel"):
            raise UnsupportedError(
                f"{b.where}: mode {mode!r} (avg or max) and coordinate_transformation_mode "
                f"{transformation!r} (half_pixel or output_half_pixel)"
            )
        if x.rank != 4 or boxes.rank != 2 or boxes.shape[1] != 4 or batch_of.shape != (boxes.shape[0],):
            raise UnsupportedError(
                f"{b.where}: an input of shape {x.shape}, boxes {boxes.shape} and batch indices "
                f"{batch_of.shape} (expected (N, C, H, W), (R, 4) and (R,))"
            )
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
            low, high, fraction, valid = (
                b.new([count, bins, grid], dtype) for dtype in (np.int64, np.int64, x.dtype, x.dtype)
            )
            statements += [
                b.statement(
                    low,
                    ["k", "p", "g"],
                    "=",
                    f"{on_map} ? ({last} ? int64({extent - 1}) : int64({clamped})) : int64(0)",
                ),
                b.statement(
                    high,
                    ["k", "p", "g"],
                    "=",
                    f"{on_map} ? ({last} ? int64({extent - 1}) : int64({clamped}) + 1) : int64(0)",
                ),
                b.statement(
                    fraction, ["k", "p", "g"], "=", f"{t}({on_map} && !({last}) ? {clamped} - floor({clamped}) : 0)"
                ),
                b.statement(valid, ["k", "p", "g"], "=", f"{t}({on_map} ? 1 : 0)"),
            ]
            tables.append((low, high, fraction, valid))
        b.emit(statements, [boxes], [v for table in tables for v in table], "other")
        (y_low, y_high, y_frac, y_valid), (x_low, x_high, x_frac, x_valid) = tables
        image = f"int64({b.ref(batch_of, ['k'])})"

        def at(table, bin_index, sample_index):
            return b.ref(table, ["k", bin_index, sample_index])

        ly, lx = at(y_frac, "i0", "r0"), at(x_frac, "i1", "r1")
        corners = [
            (f"(1 - {ly}) * (1 - {lx})", y_low, x_low),
            (f"(1 - {ly}) * {lx}", y_low, x_high),
            (f"{ly} * (1 - {lx})", y_high, x_low),
            (f"{ly} * {lx}", y_high, x_high),
        ]
        terms = [
            f"{weight} * {b.ref(x, [image, 'c', at(yi, 'i0', 'r0'), at(xi, 'i1', 'r1')])}" for weight, yi, xi in corners
        ]
        valid = f"{at(y_valid, 'i0', 'r0')} * {at(x_valid, 'i1', 'r1')}"
        out = b.new([count, x.shape[1], rows, columns], x.dtype)
        target = ["k", "c", "i0", "i1"]
        reductions = [("r0", grid), ("r1", grid)]
        if mode == "avg":
            statements = [
                b.statement(out, target, "+=!", f"{valid} * ({' + '.join(terms)})", reductions),
                b.statement(out, target, "=", f"{out.ident}(k, c, i0, i1) / {grid * grid}"),
            ]
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
        expected = tuple(
            (extent + pads[d] + pads[d + 2] - dilations[d] * (k - 1) - 1) // strides[d] + 1
            for d, (extent, k) in enumerate(((height, kh), (width, kw)))
        )
        if (
            channels != per_group * groups
            or filters % groups
            or channels % offset_groups
            or offsets.shape != (n, offset_groups * 2 * taps, *expected)
            or (mask is not None and mask.shape != (n, offset_groups * taps, *expected))
        ):
            raise UnsupportedError(
                f"{b.where}: input {x.shape}, weights {w.shape}, offsets {offsets.shape} and mask "
                f"{mask.shape if mask is not None else None} for {groups} group(s), {offset_groups} "
                f"offset group(s) and an output of {expected}"
            )
        place_idx = ["n", "g", "a", "c2", "i0", "i1"]  # batch, offset group, tap row and column, output point
        tap = f"(a * {kw} + c2)"
        statements, tables = [], []
        for axis, (stride, dilation, pad, extent) in enumerate(
            ((strides[0], dilations[0], pads[0], height), (strides[1], dilations[1], pads[1], width))
        ):
            moved = (
                f"{_affine(stride, f'i{axis}', 0)} - {pad} + {_affine(dilation, 'a' if axis == 0 else 'c2', 0)} + "
                f"{b.ref(offsets, ['n', f'g * {2 * taps} + 2 * {tap} + {axis}', 'i0', 'i1'])}"
            )
            low, fraction = (
                b.new([n, offset_groups, kh, kw, out_h, out_w], np.int64),
                b.new([n, offset_groups, kh, kw, out_h, out_w], x.dtype),
            )
            statements += [
                b.statement(low, place_idx, "=", f"int64(floor({moved}))"),
                b.statement(fraction, place_idx, "=", f"({moved}) - floor({moved})"),
            ]
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
            sample_rhs = (
                f"{b.ref(mask, ['n', f'(c / {per_offset_group}) * {taps} + {tap}', 'i0', 'i1'])} * ({sample_rhs})"
            )
            reads.append(mask)
        samples = b.new([n, channels, kh, kw, out_h, out_w], x.dtype)
        b.emit(
            [b.statement(samples, ["n", "c", "a", "c2", "i0", "i1"], "+=!", sample_rhs, [("u0", 2), ("u1", 2)])],
            reads,
            [samples],
            "other",
        )
        per_filter_group = filters // groups
        out = b.new([n, filters, out_h, out_w], x.dtype)
        product = (
            f"{b.ref(w, ['f', 'r_c', 'r_a', 'r_b'])} * "
            f"{b.ref(samples, ['n', f'(f / {per_filter_group}) * {per_group} + r_c', 'r_a', 'r_b', 'i0', 'i1'])}"
        )
        statements = [
            b.statement(out, ["n", "f", "i0", "i1"], "+=!", product, [("r_c", per_group), ("r_a", kh), ("r_b", kw)])
        ]
        if bias is not None:
            statements.append(
                b.statement(out, ["n", "f", "i0", "i1"], "=", f"{out.ident}(n, f, i0, i1) + {b.ref(bias, ['f'])}")
            )
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
        blocks = [
            (image[d] + pads[d] + pads[k + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(k)
        ]
        per_channel = math.prod(block)
        if x.shape[1] % per_channel or x.shape[2] != math.prod(blocks) or min(blocks) < 1:
            raise UnsupportedError(
                f"{b.where}: an input of shape {x.shape} is not the columns of {blocks} blocks of "
                f"{block} from an image of {image}"
            )
        pixel = indices(k, "y")
        offsets = [f"r{d}" for d in range(k)]
        # where block offset r_d covers pixel y_d: y_d + pad - r_d * dilation = l_d * stride
        reach = [f"({pixel[d]} + {pads[d]} - {dilations[d]} * {offsets[d]})" for d in range(k)]
        place = [f"{reach[d]} / {strides[d]}" for d in range(k)]
        covered = " && ".join(
            f"{reach[d]} >= 0 && {reach[d]} % {strides[d]} == 0 && {place[d]} < {blocks[d]}" for d in range(k)
        )

        def flat(terms, extents):
            text = terms[0]
            for term, extent in zip(terms[1:], extents[1:]):
                text = f"({text}) * {extent} + {term}"
            return text

        column = b.ref(x, ["n", f"c * {per_channel} + {flat(offsets, block)}", flat(place, blocks)])
        out = b.new([x.shape[0], x.shape[1] // per_channel, *image], x.dtype)
        b.emit(
            [
                b.statement(
                    out,
                    ["n", "c"] + pixel,
                    "+=!",
                    f"({covered}) ? {column} : {tc_type(x.dtype)}(0)",
                    [(offsets[d], block[d]) for d in range(k)],
                )
            ],
            [x],
            [out],
            "other",
        )
        return [out]


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

    return (
        f"({x} < {low_text} ? {folded(f'({low_text} - {x})', low_text, '+')} : "
        f"{x} > {high_text} ? {folded(f'({x} - {high_text})', high_text, '-')} : {x})"
    )


#: Keys' cubic convolution (a = -0.75, as PyTorch and onnx) for the taps at -1, 0, 1, 2 from
#: the floor of a coordinate, of the coordinate's fraction ``t``.
_CUBIC_TAPS = (
    "((-0.75 * ({t} + 1) + 3.75) * ({t} + 1) - 6.0) * ({t} + 1) + 3.0",
    "(1.25 * {t} - 2.25) * {t} * {t} + 1",
    "(1.25 * (1 - {t}) - 2.25) * (1 - {t}) * (1 - {t}) + 1",
    "((-0.75 * (2 - {t}) + 3.75) * (2 - {t}) - 6.0) * (2 - {t}) + 3.0",
)


class GridSample(Converter):
    """``Y[n, c, p] = X[n, c]`` sampled at ``grid[n, p]`` (coordinates in [-1, 1], the last
    spatial axis first), nearest, (multi)linear or (multi)cubic, the samples outside the image
    zeros, the border's or reflected, as onnx's reference (PyTorch's grid_sample).  One kernel
    finds each output point's taps along each axis (the index, -1 for a zero, and the weight);
    a second sums weight products times the pixels they gather."""

    @staticmethod
    def _impl_v16(b, node, inputs):
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(
            node.attr("mode", "bilinear"), node.attr("mode", "bilinear")
        )
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
            raise UnsupportedError(
                f"{b.where}: mode {mode!r} and padding_mode {padding!r} (nearest, linear or "
                f"cubic; zeros, border or reflection)"
            )
        _float_only(b, x)
        _float_only(b, grid)
        k = x.rank - 2
        if k < 1 or grid.rank != k + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != k:
            raise UnsupportedError(
                f"{b.where}: a grid of shape {grid.shape} for an input of shape {x.shape} "
                f"(expected (N, spatial..., {k}))"
            )
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
                place = (
                    f"(({place} < {_number(low)} || {place} > {_number(high)}) ? "
                    f"fmin(fmax({place}, 0.0), {_number(extent - 1)}) : {place})"
                )
            elif padding == "reflection":
                place = f"float({_reflected(f'double({place})', low, high)})"
            coordinate = b.new([n, *points], np.float32)
            statements.append(b.statement(coordinate, point, "=", place))
            at = b.ref(coordinate, point)
            first = {"nearest": f"int64({at})", "linear": f"int64(floor({at}))", "cubic": f"int64(floor({at})) - 1"}[
                mode
            ]
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
        b.emit(
            [b.statement(out, ["n", "c"] + o, "+=!", rhs, reductions)],
            [x] + [t for pair in tables for t in pair if t is not None],
            [out],
            "other",
        )
        return [out]


class Resize(Converter):
    """Resize as one gather-and-weigh pass per resized axis: output ``y`` along the axis is
    ``sum_j W[y, j] * X(..., I[y, j], ...)``.  The tables come from onnx's own reference
    implementation, run when the model is compiled on an identity matrix along each axis (a
    resize is linear and separable), so every mode, coordinate transformation, rounding rule,
    antialiasing and ``exclude_outside`` means exactly what onnx says; the pass keeps a row's
    nonzero weights only (one for nearest, two for linear, four for cubic).  With
    ``tf_crop_and_resize``, each axis samples its region of interest, and the rows the reference
    extrapolates (found by running it on zeros with an extrapolation value of 1) take
    ``extrapolation_value``; the axes' rows sum to one, so an extrapolated value stays itself
    through the passes along the other axes."""

    CONSTANT_INPUTS = (1, 2, 3)

    @staticmethod
    def _impl_v10(b, node, inputs):  # inputs (X, scales)
        raise AssertionError("Resize.convert passes the opset to _resize")

    _impl_v11 = _impl_v10  # inputs (X, roi, scales, sizes)

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
        if mode != "nearest" and x.dtype.kind != "f":
            raise UnsupportedError(f"{b.where}: Resize mode {mode!r} on {x.dtype}")
        axes = [a % x.rank for a in (node.attr("axes") or range(x.rank))]
        regions = {axis: (0.0, 1.0) for axis in axes}  # of interest, tf_crop_and_resize's
        cropping = node.attr("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"
        if cropping:
            if roi is None or roi.size == 0:
                raise UnsupportedError(f"{b.where}: Resize's tf_crop_and_resize needs its roi")
            bounds = _require_const(b, roi, "Resize's roi").reshape(-1).astype(np.float64)
            if bounds.size != 2 * len(axes):
                raise UnsupportedError(f"{b.where}: Resize's roi has {bounds.size} values for {len(axes)} axes")
            regions = {axis: (bounds[k], bounds[len(axes) + k]) for k, axis in enumerate(axes)}
        scales = (
            [float(v) for v in _require_const(b, scales, "Resize's scales")]
            if scales is not None and scales.size
            else None
        )
        sizes = (
            [int(v) for v in _require_const(b, sizes, "Resize's sizes")] if sizes is not None and sizes.size else None
        )
        if (scales is None) == (sizes is None):
            raise UnsupportedError(f"{b.where}: Resize needs exactly one of scales and sizes")
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
            if (
                out_shape[axis] == x.shape[axis]
                and per_axis[axis] in (("scales", 1.0), ("sizes", x.shape[axis]))
                and regions[axis] == (0.0, 1.0)
            ):
                continue
            weights = _resize_weights(node, opset, x.shape[axis], *per_axis[axis], regions[axis])
            outside = (
                _resize_weights(node, opset, x.shape[axis], *per_axis[axis], regions[axis], probe=True)[:, 0]
                if cropping
                else None
            )
            value = _weighted_gather(b, value, axis, weights, outside, node.attr("extrapolation_value", 0.0))
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


def _resize_weights(
    node, opset: int, length: int, kind: str, amount, region=(0.0, 1.0), probe: bool = False
) -> np.ndarray:
    """(output length x ``length``) weights of a one-axis Resize with ``node``'s attributes, by
    onnx's reference implementation applied to the identity; ``region``: the axis' region of
    interest (tf_crop_and_resize).  With ``probe``, the reference runs on zeros with an
    extrapolation value of 1 instead: the rows it extrapolates are ones."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    attributes = [
        a for a in node.proto.attribute if a.name not in ("axes", "keep_aspect_ratio_policy", "extrapolation_value")
    ]
    attributes.append(helper.make_attribute("extrapolation_value", 1.0 if probe else 0.0))
    resize = helper.make_node("Resize", [], ["Y"])
    if opset < 11:
        # onnx's reference has opset 11's Resize only.  Before, coordinates were asymmetric
        # (x_in = x_out / scale), and a nearest neighbour rounded down when upsampling, up when
        # downsampling, as onnxruntime's Resize-10 and Upsample do.
        attributes = [
            helper.make_attribute("mode", node.attr("mode", "nearest")),
            helper.make_attribute("coordinate_transformation_mode", "asymmetric"),
            helper.make_attribute("nearest_mode", "floor" if float(amount) >= 1 else "ceil"),
        ]
        opset = 11
    resize.attribute.extend(attributes)
    initializers = [helper.make_tensor("roi", TensorProto.DOUBLE, [4], [region[0], 0.0, region[1], 1.0])]
    if kind == "scales":
        resize.input.extend(["X", "roi", "scales"])
        initializers.append(helper.make_tensor("scales", TensorProto.FLOAT, [2], [float(amount), 1.0]))
    else:
        resize.input.extend(["X", "roi", "", "sizes"])
        initializers.append(helper.make_tensor("sizes", TensorProto.INT64, [2], [int(amount), length]))
    graph = helper.make_graph(
        [resize],
        "axis",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [length, length])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    (result,) = ReferenceEvaluator(model).run(None, {"X": np.zeros((length, length)) if probe else np.eye(length)})
    return np.asarray(result, dtype=np.float64)


def _taps(at: np.ndarray, weights: np.ndarray, terms: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's taps (indices ``at``, nonzero ``weights``) as exactly ``terms`` taps, none of
    weight 0: a 0 times an infinite or NaN element would make NaN of an element the row does
    not read.  The first tap is read again with its weight split in halves, w/2^k, w/2^k,
    w/2^(k-1), ..., w/2, whose products sum left to right to w times the element exactly."""
    if len(at) == 0:
        return np.zeros(terms, np.int64), np.zeros(terms)
    extra = terms - len(at)
    parts = [weights[0] / 2.0**extra] + [weights[0] / 2.0**k for k in range(extra, 0, -1)] if extra else [weights[0]]
    return np.concatenate([np.full(extra + 1, at[0]), at[1:]]), np.concatenate([parts, weights[1:]])


def _weighted_gather(b, x, axis: int, weights: np.ndarray, outside=None, fill: float = 0.0):
    """``x`` resampled along ``axis``: output ``y`` is ``sum_j W[y, j] * x(.., I[y, j], ..)`` over
    the nonzero weights of row ``y`` of ``weights``, or ``fill`` where ``outside[y]``."""
    rows = weights.shape[0]
    terms = max(1, int((weights != 0).sum(axis=1).max()))
    table = np.zeros((rows, terms), np.int64)
    factor = np.zeros((rows, terms), np.float64)
    for y in range(rows):
        nonzero = np.flatnonzero(weights[y])
        table[y], factor[y] = _taps(nonzero, weights[y, nonzero], terms)
    shape = list(x.shape)
    shape[axis] = rows
    out = b.new(shape, x.dtype)
    idx = indices(x.rank)
    where = b.const(table if terms > 1 else table[:, 0])
    pick = lambda j: [idx[axis], str(j)] if terms > 1 else [idx[axis]]  # noqa: E731
    reads = [x, where]
    if terms == 1 and np.all(factor[:, 0] == 1):  # nearest: a gather
        rhs = b.ref(x, idx[:axis] + [b.ref(where, pick(0))] + idx[axis + 1 :])
    else:
        scale = b.const(factor.astype(x.dtype) if terms > 1 else factor[:, 0].astype(x.dtype))
        reads.append(scale)
        rhs = " + ".join(
            f"{b.ref(scale, pick(j))} * {b.ref(x, idx[:axis] + [b.ref(where, pick(j))] + idx[axis + 1 :])}"
            for j in range(terms)
        )
    if outside is not None and np.any(outside != 0):
        mask = b.const(np.asarray(outside != 0))
        reads.append(mask)
        rhs = f"({b.ref(mask, [idx[axis]])}) ? {b.ref(b.const(np.array(fill, x.dtype)), [])} : ({rhs})"
    b.emit([b.statement(out, idx, "=", rhs)], reads, [out], "other")
    return out
