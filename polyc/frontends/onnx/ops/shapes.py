"""Shapes and views: Shape, Size, Constant, ConstantOfShape and Range; Reshape, Flatten, Squeeze,
Unsqueeze; Transpose, DepthToSpace and SpaceToDepth; Expand and Tile; Concat, Split and Slice;
OneHot, Trilu, EyeLike and Pad.  Also :func:`transposed` and :func:`concatenated`, which other
converters build with.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from polyc.errors import ModelError, SignatureError, UnsupportedError
from polyc.frontends.onnx.lowering import Value, broadcast_shape, check_size, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _affine, _axis, _elementwise, _require_const


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
        shape = tuple(int(d) for d in shape.reshape(-1))
        check_size(b.where, shape, fill.dtype)
        return [b.const(np.full(shape, fill[0], dtype=fill.dtype))]


class Range(Converter):
    CONSTANT_INPUTS = (0, 1, 2)

    @staticmethod
    def _impl_v11(b, node, inputs):
        start, limit, delta = (
            _require_const(b, v, name).reshape(()) for v, name in zip(inputs[:3], ("start", "limit", "delta"))
        )
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
        if not -x.rank <= axis <= x.rank:
            raise ModelError(f"{b.where}: axis {axis} out of range [{-x.rank}, {x.rank}] for a rank-{x.rank} input")
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
    source = [""] * x.rank
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
        raise UnsupportedError(
            f"{b.where}: needs a 4-D input and a blocksize of at least 1 (got shape {x.shape}, blocksize {size})"
        )
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
        b.emit(
            [b.statement(out, idx, "=", b.ref(x, b.broadcast_subscripts(x, out_shape, idx)))], [x], [out], "elementwise"
        )
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
            raise UnsupportedError(
                f"{b.where}: Tile repeats {repeats} for a rank-{x.rank} input (one count of at least 0 per axis)"
            )
        shape = [r * d for r, d in zip(repeats, x.shape)]
        if x.const is not None:
            return [b.const(np.tile(x.const, repeats))]
        if all(r == 1 for r in repeats):
            return [b.view(x, x.shape)]
        idx = indices(x.rank)
        copies = [f"t{d}" for d in range(x.rank)]
        interleaved = b.new([n for pair in zip(repeats, x.shape) for n in pair], x.dtype)
        b.emit(
            [b.statement(interleaved, [n for pair in zip(copies, idx) for n in pair], "=", b.ref(x, idx))],
            [x],
            [interleaved],
            "other",
        )
        return [b.view(interleaved, shape)]


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
        values = [
            _concatenate(b, values[k : k + CONCAT_FAN_IN], axis)
            if len(values[k : k + CONCAT_FAN_IN]) > 1
            else values[k]
            for k in range(0, len(values), CONCAT_FAN_IN)
        ]
    return _concatenate(b, values, axis) if len(values) > 1 else b.view(values[0], values[0].shape)


class Concat(Converter):
    @staticmethod
    def _impl_v4(b, node, inputs):
        given = [v for v in inputs if v is not None]
        axis = _axis(b, node.attr("axis"), given[0].rank)
        shape = list(given[0].shape)
        shape[axis] = sum(v.shape[axis] for v in given)
        if any(v.rank != len(shape) or any(e != shape[d] for d, e in enumerate(v.shape) if d != axis) for v in given):
            raise UnsupportedError(
                f"{b.where}: cannot concatenate shapes {', '.join(str(v.shape) for v in given)} along axis {axis}"
            )
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
                outputs.append(b.part(x, shape, start * math.prod(x.shape[axis + 1 :])))
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
        axes = (
            _require_const(b, inputs[3], "axes")
            if len(inputs) > 3 and inputs[3] is not None
            else np.arange(len(starts))
        )
        steps = (
            _require_const(b, inputs[4], "steps")
            if len(inputs) > 4 and inputs[4] is not None
            else np.ones(len(starts), np.int64)
        )
        first, step = [0] * x.rank, [1] * x.rank
        shape = list(x.shape)
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = _axis(b, int(a), x.rank)
            if int(st) == 0:
                raise UnsupportedError(f"{b.where}: a step of 0")
            big = np.iinfo(np.int64).max
            start, stop, stride = slice(int(max(min(s, big), -big)), int(max(min(e, big), -big)), int(st)).indices(
                x.shape[a]
            )
            first[a], step[a] = start, stride
            shape[a] = len(range(start, stop, stride))
        if x.const is not None:
            view = x.const[
                tuple(
                    slice(f, f + st * n if st > 0 else (f + st * n if f + st * n >= 0 else None), st)
                    for f, st, n in zip(first, step, shape)
                )
            ]
            return [b.const(np.ascontiguousarray(view))]
        out = b.new(shape, x.dtype)
        idx = indices(x.rank)
        subscripts = [_affine(st, i, f) for st, i, f in zip(step, idx, first)]
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x], [out], "other")
        return [out]


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
        source = idx[:axis] + idx[axis + 1 :]
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
        k = (
            int(_require_const(b, inputs[1], "Trilu's k").reshape(-1)[0])
            if len(inputs) > 1 and inputs[1] is not None
            else 0
        )
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
        begin, end = pads[: x.rank], pads[x.rank :]
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
        begin, end = pads[: x.rank], pads[x.rank :]
        idx = indices(x.rank)
        parts_per_axis = []
        for i, d, p, q in zip(idx, x.shape, begin, end):
            o = d + p + q
            longest = d - 1 if mode == "reflect" else d if mode == "wrap" else None
            if longest is not None and max(p, q) > longest:
                raise UnsupportedError(
                    f"{b.where}: Pad mode {mode!r} by {max(p, q)} along an axis of {d} (at most {longest})"
                )
            if d == 0 and (p > 0 or q > 0):
                raise UnsupportedError(f"{b.where}: Pad mode {mode!r} of an empty axis")
            parts = [(max(p, 0), min(p + d, o), f"{i} - {p}" if p >= 0 else f"{i} + {-p}")]
            if p > 0:
                parts.append((0, p, {"edge": "0", "reflect": f"{p} - {i}", "wrap": f"{i} + {d - p}"}[mode]))
            if q > 0:
                parts.append(
                    (
                        p + d,
                        o,
                        {"edge": str(d - 1), "reflect": f"{2 * d - 2 + p} - {i}", "wrap": f"{i} - {p + d}"}[mode],
                    )
                )
            # the last part first: a def's output takes its extents from its first statement
            parts_per_axis.append(sorted((part for part in parts if part[1] > part[0]), key=lambda part: -part[1]))
        out = b.new([d + p + q for d, p, q in zip(x.shape, begin, end)], x.dtype)
        statements = []
        for chosen in itertools.product(*parts_per_axis):
            where = ", ".join(f"{i} in {lo}:{hi}" for i, (lo, hi, _) in zip(idx, chosen))
            read = b.ref(x, [sub for _, _, sub in chosen])
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
