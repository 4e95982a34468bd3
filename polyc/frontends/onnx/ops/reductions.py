"""Reductions and what is built on them: ReduceSum and the other Reduce operators, ArgMax and
ArgMin, Softmax (and LogSoftmax), Hardmax, TopK, CumSum and CumProd; and the normalizations
along axes, LpNormalization, InstanceNormalization, LayerNormalization and LRN.
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _axis, _float_only, _number, _require_const


def _reduce_axes(b, node, x, axes_input=None):
    axes = node.attr("axes")
    if axes_input is not None:
        axes = _require_const(b, axes_input, "axes").tolist()
    if axes is None or len(axes) == 0:
        if node.attr("noop_with_empty_axes", 0):
            return []
        return list(range(x.rank))
    return sorted({_axis(b, int(a), x.rank) for a in axes})


def _finite_or_zero(value: str) -> str:
    """``value`` where it is finite, else 0 (``v - v`` is 0 only for a finite ``v``)."""
    return f"({value} - {value} == 0 ? {value} : 0)"


class _Reduce(Converter):
    """ONNX's Reduce operators; ``KIND`` says which (``sum``, ``mean``, ``max``, ``logsumexp``...)."""

    KIND = "sum"
    CONSTANT_INPUTS = (1,)

    @classmethod
    def _lower(cls, b, node, x, axes):
        keep = node.attr("keepdims", 1) == 1  # as onnxruntime reads it: any other value drops the axes
        if not axes:
            return [b.view(x, x.shape)]
        idx = indices(x.rank)
        out_shape = (
            [1 if d in axes else e for d, e in enumerate(x.shape)]
            if keep
            else [e for d, e in enumerate(x.shape) if d not in axes]
        )
        out_idx = (
            [f"z{d}" if d in axes else idx[d] for d in range(x.rank)]
            if keep
            else [idx[d] for d in range(x.rank) if d not in axes]
        )
        source = [f"r{d}" if d in axes else idx[d] for d in range(x.rank)]
        reductions = [(f"r{d}", x.shape[d]) for d in axes]
        out = b.new(out_shape, x.dtype)
        read = b.ref(x, source)
        # z0: the index Builder.statement gives a scalar, so that the statement reads its
        # target where it writes it
        lhs = f"{out.ident}({', '.join(out_idx) if out.shape else 'z0'})"
        statements, reads = [], [x]
        if cls.KIND == "logsumexp":  # log(sum(exp(x - max))) + max: no overflow in exp (see below)
            largest = b.new(out_shape, x.dtype)
            statements.append(b.statement(largest, out_idx, "max=!", read, reductions))
            largest_here = f"{largest.ident}({', '.join(out_idx) if out.shape else 'z0'})"
            read = f"{read} - {_finite_or_zero(largest_here)}"
        op = {
            "sum": "+=!",
            "mean": "+=!",
            "max": "max=!",
            "min": "min=!",
            "prod": "*=!",
            "sumsquare": "+=!",
            "l2": "+=!",
            "l1": "+=!",
            "logsum": "+=!",
            "logsumexp": "+=!",
        }[cls.KIND]
        value = {
            "sumsquare": f"{read} * {read}",
            "l2": f"{read} * {read}",
            "l1": f"abs({read})",
            "logsumexp": f"exp({read})",
        }.get(cls.KIND, read)
        # (an empty slice keeps the identity, -inf or inf, as ONNX says)
        all_nan_is_nan = cls.KIND in ("max", "min") and x.dtype.kind == "f" and math.prod(e for _, e in reductions) > 0
        if all_nan_is_nan:
            # TC's max= and min= skip a NaN as fmax and fmin do, as onnxruntime's kernels do
            # for most positions of a NaN in a slice (not all: its vector lanes decide).  A
            # slice of NaNs only would give the reduction's identity (-inf or inf) where
            # onnxruntime gives NaN: a bool max in the same loop notes a number.
            holds_number = b.new(out_shape, np.bool_)
            statements.append(b.statement(holds_number, out_idx, "max=!", f"{read} == {read}", reductions))
        statements.append(b.statement(out, out_idx, op, value, reductions))
        if all_nan_is_nan:
            where = f"{holds_number.ident}({', '.join(out_idx) if out.shape else 'z0'})"
            nan = f"{tc_type(x.dtype)}({_number(math.nan)})"
            statements.append(b.statement(out, out_idx, "=", f"{where} ? {lhs} : {nan}"))
        if cls.KIND == "mean":
            count = math.prod(x.shape[d] for d in axes)
            statements.append(b.statement(out, out_idx, "=", f"{lhs} / {count}"))
        if cls.KIND == "l2":
            statements.append(b.statement(out, out_idx, "=", f"sqrt({lhs})"))
        if cls.KIND == "logsum":
            statements.append(b.statement(out, out_idx, "=", f"log({lhs})"))
        if cls.KIND == "logsumexp":
            # log(sum(exp(x - s))) + s with s the max where it is finite and 0 where not (m - m
            # is 0 only for finite m), as onnxruntime shifts: an infinite max then gives its
            # infinity through exp, and a NaN anywhere in the slice gives NaN.
            statements.append(b.statement(out, out_idx, "=", f"log({lhs}) + {_finite_or_zero(largest_here)}"))
        b.emit(statements, reads, [out], "reduction")
        return [out]

    @classmethod
    def _impl_v1(cls, b, node, inputs):
        return cls._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0]))

    @classmethod
    def _impl_v18(cls, b, node, inputs):
        axes = inputs[1] if len(inputs) > 1 else None
        return cls._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0], axes))


def _reduce(kind: str) -> type[_Reduce]:
    """The converter of the Reduce operator of ``kind``."""
    return type(f"Reduce_{kind}", (_Reduce,), {"KIND": kind})


class ReduceSum(_Reduce):
    @staticmethod
    def _impl_v13(b, node, inputs):  # ReduceSum took axes as an input from opset 13
        axes = inputs[1] if len(inputs) > 1 else None
        return ReduceSum._lower(b, node, inputs[0], _reduce_axes(b, node, inputs[0], axes))


class ArgMax(Converter):
    @staticmethod
    def _arg(b, node, x, pick):
        axis = _axis(b, node.attr("axis", 0), x.rank)
        keep = node.attr("keepdims", 1) == 1  # as onnxruntime reads it
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
        first = b.ref(x, [("0" if d == axis else idx[d]) for d in range(x.rank)])
        # (z0: the index Builder.statement gives a scalar, so that the statement reads its target
        # where it writes it)
        so_far = f"{out.ident}({', '.join(out_idx) if out.shape else 'z0'})"
        b.emit(
            [
                b.statement(best, best_idx, f"{pick}=!", b.ref(x, source), [("r0", extent)]),
                b.statement(
                    out, out_idx, op, f"{b.ref(x, source)} == {best_at} ? int64(r0) : {none}", [("r0", extent)]
                ),
                # onnxruntime's ArgMax and ArgMin keep the first element until one compares above
                # (below) it: a NaN there is never passed (index 0), a NaN elsewhere never taken.
                # TC's max=/min= (fmax's) skip every NaN, so only a NaN first needs its own test,
                # once per output (in the reduction it kept gcc from vectorising the search).
                b.statement(out, out_idx, "=", f"{first} != {first} ? int64(0) : {so_far}"),
            ],
            [x],
            [out],
            "reduction",
        )
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
            # exp-sum's reduction outside a vector loop across rows, several times slower.
            rows = math.prod(x.shape[: x.rank - len(axes)])
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
        at_point = ", ".join(kept) or "0"  # in statements over every index of x
        statements = [b.statement(most, kept_idx, "max=!", b.ref(x, source), reduced)]
        if log:
            statements += [
                b.statement(total, kept_idx, "+=!", f"exp({b.ref(x, source)} - {most.ident}({at}))", reduced),
                b.statement(
                    out, idx, "=", f"{b.ref(x, idx)} - {most.ident}({at_point}) - log({total.ident}({at_point}))"
                ),
            ]
        else:  # each exp once: into the output, summed from there, then scaled in place
            # by the sum's reciprocal, as onnxruntime does: the reciprocal does not depend on
            # the row loop, so the C compiler takes it out, and a row costs one division, not one
            # an element (which took a quarter of the encoder's softmax, 1536 x 128).
            statements += [
                b.statement(out, idx, "=", f"exp({b.ref(x, idx)} - {most.ident}({at_point}))"),
                b.statement(total, kept_idx, "+=!", b.ref(out, source), reduced),
                b.statement(out, idx, "=", f"{b.ref(out, idx)} * (1 / {total.ident}({at_point}))"),
            ]
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
        b.emit(
            [
                b.statement(best, kept_idx, "max=!", b.ref(x, source), [("r0", extent)]),
                b.statement(
                    first,
                    kept_idx,
                    "min=!",
                    f"{b.ref(x, source)} == {b.ref(best, at)} ? int64(r0) : int64({extent})",
                    [("r0", extent)],
                ),
                b.statement(out, idx, "=", f"{idx[axis]} == {b.ref(first, at)} ? {t}(1) : {t}(0)"),
            ],
            [x],
            [out],
            "reduction",
        )
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
        b.emit(
            [
                b.statement(norm, kept_idx, "+=!", term, [("r0", x.shape[axis])]),
                # A zero vector stays zero (onnx's expectation), not 0 / 0: +0, as onnxruntime's.
                b.statement(
                    out, idx, "=", f"{b.ref(norm, at)} == 0 ? {tc_type(x.dtype)}(0) : {b.ref(x, idx)} / {total}"
                ),
            ],
            [x],
            [out],
            "reduction",
        )
        return [out]


#: Along an axis of at least this many elements TopK selects (see :class:`TopK`) unless
#: ranking every element is cheaper (``k`` near the axis' length).
TOPK_SELECT_FROM = 1024
#: The bits of the k-th key one selection pass settles: 2^BITS - 1 counts per element a pass.
TOPK_BITS_PER_PASS = 2


class TopK(Converter):
    """The ``k`` largest (or smallest) elements along ``axis`` and their indices, in order, equal
    values by their index and NaN above every number, as onnx's reference orders them.

    Short axes are ranked directly: each element's rank is the count of elements that come
    before it (n^2 comparisons along an axis of n), and the j-th output is the one element of
    rank j.  Along longer axes (from TOPK_SELECT_FROM elements) the ``k`` elements are selected
    first, in about 50 n operations, and only they are ranked (k^2), as a detector's thousand
    best of 200,000 candidate scores are:

    1. each element gets an integer key in the same order (a float's bits, its sign's half
       reversed; NaN the largest key, -0 that of 0; reversed for the smallest);
    2. the k-th largest key per row is found TOPK_BITS_PER_PASS bits at a time, from the top:
       each pass counts the keys at least each of the 2^BITS - 1 thresholds it tries (one
       kernel, the same for every pass, so compiled once);
    3. the elements above that key, and the first of those equal to it (by index) that make up
       ``k``, are found by a running count, which is monotone: the j-th selected is at the
       number of running counts at most j (:func:`count_not_above`);
    4. the selected elements, in index order, are ranked directly, and their positions mapped
       back."""

    CONSTANT_INPUTS = (1,)

    @staticmethod
    def _lower(b, x, k: int, axis: int, largest: bool):
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise UnsupportedError(f"{b.where}: TopK's k is {k}, the axis has {n} elements")
        if x.dtype == np.bool_:
            raise UnsupportedError(f"{b.where}: TopK of bool tensors")
        shape = list(x.shape[:axis]) + [k] + list(x.shape[axis + 1 :])
        if k == 0 or x.size == 0:
            return [b.const(np.zeros(shape, x.dtype)), b.const(np.zeros(shape, np.int64))]
        # Selecting costs about 50 n per row plus ranking the k selected (2 k^2); ranking all,
        # n^2 + k n.
        selects = n >= TOPK_SELECT_FROM and _key_type(x.dtype) is not None and 50 * n + 2 * k * k < n * n + k * n
        return TopK._selected(b, x, k, axis, largest) if selects else TopK._ranked(b, x, k, axis, largest)

    @staticmethod
    def _ranked(b, x, k: int, axis: int, largest: bool):
        """Every element's rank along ``axis``; the j-th output is the element of rank j."""
        positions = TopK._positions_by_rank(b, x, k, axis, largest)
        idx = indices(x.rank)
        values = b.new(positions.shape, x.dtype)
        b.emit(
            [b.statement(values, idx, "=", b.ref(x, idx[:axis] + [b.ref(positions, idx)] + idx[axis + 1 :]))],
            [x, positions],
            [values],
            "other",
        )
        return [values, positions]

    @staticmethod
    def _positions_by_rank(b, x, k: int, axis: int, largest: bool) -> Value:
        """The positions along ``axis`` of the elements of rank 0 .. ``k`` - 1, each element's
        rank the count of elements that come before it."""
        n = x.shape[axis]
        shape = list(x.shape[:axis]) + [k] + list(x.shape[axis + 1 :])
        idx = indices(x.rank)
        mine = b.ref(x, idx)
        other = b.ref(x, idx[:axis] + ["r0"] + idx[axis + 1 :])

        def above(a, c):  # a after c in ascending order, NaN above every number
            return f"({a} > {c} || ({a} != {a} && {c} == {c}))" if x.dtype.kind == "f" else f"{a} > {c}"

        same = (
            f"({other} == {mine} || ({other} != {other} && {mine} != {mine}))"
            if x.dtype.kind == "f"
            else f"{other} == {mine}"
        )
        wins = above(other, mine) if largest else above(mine, other)
        rank_type = np.int32 if n < 2**31 else np.int64  # 32-bit counts: twice the lanes
        rank, positions = b.new(x.shape, rank_type), b.new(shape, np.int64)
        at_rank = f"{b.ref(rank, idx[:axis] + ['r0'] + idx[axis + 1 :])} == {idx[axis]}"
        one, zero = (f"{tc_type(rank_type)}({v})" for v in (1, 0))
        # Two kernels: as one, isl's scheduler took seconds over the ranks' all-to-all dependences
        # (1000 scores along the axis).
        b.emit(
            [b.statement(rank, idx, "+=!", f"({wins} || ({same} && r0 < {idx[axis]})) ? {one} : {zero}", [("r0", n)])],
            [x],
            [rank],
            "other",
        )
        b.emit(
            [b.statement(positions, idx, "+=!", f"({at_rank}) ? int64(r0) : int64(0)", [("r0", n)])],
            [rank],
            [positions],
            "other",
        )
        return positions

    @staticmethod
    def _selected(b, x, k: int, axis: int, largest: bool):
        """Selects the ``k`` elements per row by their k-th key, then ranks only them."""
        n = x.shape[axis]
        before, after = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1 :])
        rows = before * after
        if after == 1:
            matrix = b.view(x, [rows, n])
        else:  # the axis made the last, so that each row is contiguous
            matrix = b.new([before, after, n], x.dtype)
            source = b.view(x, [before, n, after])
            b.emit(
                [b.statement(matrix, ["i0", "i1", "i2"], "=", b.ref(source, ["i0", "i2", "i1"]))],
                [source],
                [matrix],
                "other",
            )
            matrix = b.view(matrix, [rows, n])
        # Past the keys, the row works on a padded length, so that the kernels of the selection
        # serve many lengths (a detector's count of scores above a threshold is new in most
        # images, and each new count compiled about fifteen kernels).
        length = padded_length(n)
        keys = order_keys(b, matrix, largest, length)
        threshold = _kth_largest_key(b, keys, k)
        # Running counts of the keys above the threshold (low 32 bits) and of those equal to
        # it (high bits), in one sum; the selected elements up to each are those above and as
        # many equal as k still needs.
        flags = b.new([rows, length], np.int64)
        key, kth = b.ref(keys, ["i0", "i1"]), b.ref(threshold, ["i0"])
        b.emit(
            [
                b.statement(
                    flags,
                    ["i0", "i1"],
                    "=",
                    f"(({key} > {kth}) ? int64(1) : int64(0)) + (({key} == {kth}) ? int64({2**32}) : int64(0))",
                )
            ],
            [keys, threshold],
            [flags],
            "elementwise",
        )
        counts = running_along(b, flags, 1, exclusive=False, reverse=False)
        selected = b.new([rows, length], np.int64)
        count, last = b.ref(counts, ["i0", "i1"]), b.ref(counts, ["i0", str(length - 1)])
        b.emit(
            [
                b.statement(
                    selected,
                    ["i0", "i1"],
                    "=",
                    f"{count} % int64({2**32}) + min({count} / int64({2**32}), int64({k}) - {last} % int64({2**32}))",
                )
            ],
            [counts],
            [selected],
            "other",
        )
        chosen = count_not_above(b, selected, k)  # (rows, k): the selected elements' indices, increasing
        # The selected elements' keys, in index order, ranked; then their positions and values.
        candidates = b.new([rows, k], keys.dtype)
        b.emit(
            [b.statement(candidates, ["i0", "i1"], "=", b.ref(keys, ["i0", b.ref(chosen, ["i0", "i1"])]))],
            [keys, chosen],
            [candidates],
            "other",
        )
        ranked = TopK._positions_by_rank(b, candidates, k, 1, largest=True)
        positions, values = b.new([rows, k], np.int64), b.new([rows, k], x.dtype)
        position = b.ref(chosen, ["i0", b.ref(ranked, ["i0", "i1"])])
        b.emit(
            [
                b.statement(positions, ["i0", "i1"], "=", position),
                b.statement(values, ["i0", "i1"], "=", b.ref(matrix, ["i0", position])),
            ],
            [matrix, chosen, ranked],
            [positions, values],
            "other",
        )
        if after == 1:
            shape = list(x.shape[:axis]) + [k] + list(x.shape[axis + 1 :])
            return [b.view(values, shape), b.view(positions, shape)]
        results = []
        for result in (values, positions):  # back to the axis' place
            source = b.view(result, [before, after, k])
            out = b.new([before, k, after], result.dtype)
            b.emit(
                [b.statement(out, ["i0", "i1", "i2"], "=", b.ref(source, ["i0", "i2", "i1"]))], [source], [out], "other"
            )
            results.append(b.view(out, list(x.shape[:axis]) + [k] + list(x.shape[axis + 1 :])))
        return results

    @staticmethod
    def _impl_v1(b, node, inputs):
        x = inputs[0]
        return TopK._lower(b, x, int(node.attr("k")), _axis(b, node.attr("axis", -1), x.rank), True)

    @staticmethod
    def _impl_v10(b, node, inputs):
        x = inputs[0]
        k = int(_require_const(b, inputs[1], "TopK's k").reshape(-1)[0])
        return TopK._lower(b, x, k, _axis(b, node.attr("axis", -1), x.rank), bool(node.attr("largest", 1)))


def _key_type(dtype):
    """The integer type of :func:`order_keys` for elements of ``dtype`` (None: none here)."""
    dtype = np.dtype(dtype)
    if dtype in (np.dtype(np.float64), np.dtype(np.int64), np.dtype(np.uint32)):
        return np.dtype(np.int64)
    if dtype.kind == "f" or (dtype.kind in "iu" and dtype.itemsize <= 4 and dtype != np.dtype(np.uint32)):
        return np.dtype(np.int32)
    return None  # uint64: beyond int64


def order_keys(b, x: Value, largest: bool, length: int) -> Value:
    """Integer keys in the order TopK takes ``x``'s elements (descending keys for ``largest``):
    equal keys for equal elements, NaN above every number.  A float's key is its bits as an
    integer, with the order of the negative half reversed (their magnitude bits flipped), -0
    that of 0 and every NaN the largest integer.  The last axis padded to ``length`` with the
    least key (which, later in the row, comes after every element)."""
    key_type = _key_type(x.dtype)
    name = tc_type(key_type)
    lowest, highest = np.iinfo(key_type).min, np.iinfo(key_type).max
    idx = indices(x.rank)
    if x.dtype.kind == "f":
        if x.dtype.itemsize < 4:  # float16: as float32, which keeps the order
            wide = b.new(x.shape, np.float32)
            b.emit([b.statement(wide, idx, "=", f"float({b.ref(x, idx)})")], [x], [wide], "elementwise")
            x = wide
        bits = b.part(x, x.shape, 0, key_type)
        value, raw = b.ref(x, idx), b.ref(bits, idx)
        # -1 - bits maps the negative half [lowest, -1] onto [highest, 0] reversed, then back down.
        key = (
            f"({value} == {tc_type(x.dtype)}(0)) ? {name}(0) : (({value} != {value}) ? {name}({highest}) : "
            f"(({raw} >= {name}(0)) ? {raw} : ({name}(-1) - {raw}) + ({name}({lowest + 1}) - {name}(1))))"
        )
        reads = [x, bits]
    else:
        key, reads = f"{name}({b.ref(x, idx)})", [x]
    keys = b.new(list(x.shape[:-1]) + [length], key_type)
    key = key if largest else f"{name}(-1) - ({key})"
    if length > x.shape[-1]:
        key = f"({idx[-1]} < {x.shape[-1]}) ? ({key}) : ({name}({lowest + 1}) - {name}(1))"
    b.emit([b.statement(keys, idx, "=", key)], reads, [keys], "other")
    return keys


def padded_length(n: int) -> int:
    """The least of 2^p x (1, 1.25, 1.5, 1.75) at least ``n``: a length that many lengths share
    (so the kernels made for it, at most a quarter longer)."""
    if n <= 4:
        return n
    power = 1 << ((n - 1).bit_length() - 1)
    return next(power * step // 4 for step in (4, 5, 6, 7, 8) if power * step // 4 >= n)


def _kth_largest_key(b, keys: Value, k: int) -> Value:
    """Per row of ``keys`` (rows, n), the k-th largest key: the largest threshold that at least
    ``k`` keys reach, found TOPK_BITS_PER_PASS bits a pass from the top.  A pass's state per
    row is [threshold so far, the unit of the bits it settles, the thresholds it tries (so far
    plus 1, 2, ... units)]: each pass counts the keys at least each, keeps the highest reached
    by ``k`` keys, and makes the next pass's state.  Every pass is the same kernel."""
    rows, n = keys.shape
    key_type = keys.dtype
    name = tc_type(key_type)
    width, bits = 8 * key_type.itemsize, TOPK_BITS_PER_PASS
    tries = 2**bits - 1
    lowest = int(np.iinfo(key_type).min)
    unit = 2 ** (width - bits)
    first = np.array([lowest, unit] + [lowest + t * unit for t in range(1, tries + 1)], key_type)
    state = b.const(np.tile(first, (rows, 1)))
    count_type = np.int32 if n < 2**31 else np.int64
    count_name = tc_type(count_type)
    for _ in range(width // bits):
        # One reduction per threshold, each along the row (which gcc vectorizes; as one
        # statement over (threshold, element), isl put the thresholds innermost).
        reached = [b.new([rows], count_type) for _ in range(tries)]
        kept, following = b.new([rows], key_type), b.new(state.shape, key_type)
        at = lambda column: b.ref(state, ["i0", column])  # noqa: E731
        counts = [
            b.statement(
                reached[t],
                ["i0"],
                "+=!",
                f"({b.ref(keys, ['i0', 'r_i'])} >= {at(str(t + 2))}) ? {count_name}(1) : {count_name}(0)",
                [("r_i", n)],
            )
            for t in range(tries)
        ]
        highest = at("0")  # the thresholds increase: the last one k keys reach
        for t in range(tries):
            highest = f"({b.ref(reached[t], ['i0'])} >= {count_name}({k})) ? {at(str(t + 2))} : {highest}"
        next_unit = f"{at('1')} / {name}({2**bits})"
        b.emit(
            counts
            + [
                b.statement(kept, ["i0"], "=", highest),
                b.statement(
                    following,
                    ["i0", "c"],
                    "=",
                    f"(c == 0) ? {b.ref(kept, ['i0'])} : ((c == 1) ? {next_unit} : "
                    f"{b.ref(kept, ['i0'])} + {next_unit} * {name}(c - 1))",
                ),
            ],
            [keys, state],
            [*reached, kept, following],
            "other",
        )
        state = following
    threshold = b.new([rows], key_type)
    b.emit([b.statement(threshold, ["i0"], "=", b.ref(state, ["i0", "0"]))], [state], [threshold], "other")
    return threshold


def sort_by_key(b, keys: Value) -> Value:
    """The positions of each row's ``keys`` (rows, n; int64) in ascending order, equal keys by
    position: (rows, n) int64.  A bitonic sorting network over the row padded to a power of
    two N (with the largest key, at positions past n: last): log2(N) (log2(N) + 1) / 2 steps
    of N compare-exchanges, each pairing element i with element i xor j.  A step's (k, j) is
    data, carried from step to step, so that every step is the same kernel, compiled once."""
    rows, n = keys.shape
    size = 1 << max(1, (n - 1).bit_length())
    key, position = b.new((rows, size), np.int64), b.new((rows, size), np.int64)
    highest = int(np.iinfo(np.int64).max)
    b.emit(
        [
            b.statement(key, ["r", "i"], "=", f"(i < {n}) ? {b.ref(keys, ['r', 'i'])} : int64({highest})"),
            b.statement(position, ["r", "i"], "=", "int64(i)"),
        ],
        [keys],
        [key, position],
        "other",
    )
    # (k, j): the blocks of k elements, sorted up and down by turns, merged by exchanges at
    # distance j; then (k, j / 2), ... (k, 1), (2 k, k), ...
    state = b.const(np.tile(np.array([2, 1], np.int64), (rows, 1)))
    levels = size.bit_length() - 1
    for _ in range(levels * (levels + 1) // 2):
        k, j = b.ref(state, ["r", "0"]), b.ref(state, ["r", "1"])
        partner = f"bitxor(int64(i), {j})"
        mine, theirs = b.ref(key, ["r", "i"]), b.ref(key, ["r", partner])
        my_place, their_place = b.ref(position, ["r", "i"]), b.ref(position, ["r", partner])
        below = f"({mine} < {theirs} || ({mine} == {theirs} && {my_place} < {their_place}))"
        # The lesser of the two stays below when the block is sorted up (bit k of i clear).
        keep_mine = f"(((bitand(int64(i), {k}) == int64(0)) == ({partner} > int64(i))) == {below})"
        next_key, next_position = b.new((rows, size), np.int64), b.new((rows, size), np.int64)
        following = b.new((rows, 2), np.int64)
        b.emit(
            [
                b.statement(next_key, ["r", "i"], "=", f"{keep_mine} ? {mine} : {theirs}"),
                b.statement(next_position, ["r", "i"], "=", f"{keep_mine} ? {my_place} : {their_place}"),
                b.statement(
                    following,
                    ["r", "c"],
                    "=",
                    f"(c == 0) ? (({j} > int64(1)) ? {k} : int64(2) * {k}) : (({j} > int64(1)) ? {j} / int64(2) : {k})",
                ),
            ],
            [key, position, state],
            [next_key, next_position, following],
            "other",
        )
        key, position, state = next_key, next_position, following
    out = b.new((rows, n), np.int64)
    b.emit([b.statement(out, ["r", "i"], "=", b.ref(position, ["r", "i"]))], [position], [out], "other")
    return out


#: A search along at most this many sorted counts compares with each; a longer one first finds
#: the block of SEARCH_BLOCK counts that holds the answer (see :func:`count_not_above`).
SEARCH_DIRECT = 64
SEARCH_BLOCK = 16


def count_not_above(b, sorted_counts: Value, count: int) -> Value:
    """For k = 0 .. ``count`` - 1, how many of ``sorted_counts`` (int64, non-decreasing along
    the last axis, of length n; leading axes are rows) are at most k (numpy's
    ``searchsorted(..., side="right")``).  Directly along at most SEARCH_DIRECT counts
    (``count`` x n comparisons); along more, in blocks: how many whole blocks end at most at k
    (the same search over the blocks' last counts, so in levels), then the counts of the next
    block, read at a position computed from data: about ``count`` x SEARCH_BLOCK x levels
    comparisons."""
    *rows, n = sorted_counts.shape
    row = indices(len(rows))
    found = b.new((*rows, count), np.int64)
    at = lambda position: b.ref(sorted_counts, row + [position])  # noqa: E731
    if n <= SEARCH_DIRECT:
        b.emit(
            [b.statement(found, row + ["k"], "+=!", f"({at('r_p')} <= k) ? int64(1) : int64(0)", [("r_p", n)])],
            [sorted_counts],
            [found],
            "other",
        )
        return found
    block = SEARCH_BLOCK
    blocks = -(-n // block)
    ends = b.new((*rows, blocks), np.int64)  # each block's last count (the last block may be short)
    b.emit(
        [
            b.statement(
                ends,
                row + ["t"],
                "=",
                f"({block} * t + {block - 1} < {n}) ? {at(f'{block} * t + {block - 1}')} : {at(str(n - 1))}",
            )
        ],
        [sorted_counts],
        [ends],
        "other",
    )
    whole = count_not_above(b, ends, count)  # the blocks wholly at most k
    start = f"{block} * {b.ref(whole, row + ['k'])}"
    b.emit(
        [
            b.statement(
                found,
                row + ["k"],
                "+=!",
                f"({start} + r_j < {n}) ? (({at(f'{start} + r_j')} <= k) ? int64(1) : int64(0)) : int64(0)",
                [("r_j", block)],
            ),
            b.statement(found, row + ["k"], "+=", start),
        ],
        [sorted_counts, whole],
        [found],
        "other",
    )
    return found


#: Along an axis of at most this many elements a running sum is one triangular sum per
#: element (n^2 / 2 additions); longer ones go in blocks of CUMSUM_BLOCK elements, in levels
#: (about n x CUMSUM_BLOCK additions: see :func:`running_along`).
CUMSUM_DIRECT = 64
#: Smaller blocks mean more levels but less work in each: along 200,000 floats blocks of 8 ran
#: fastest, ahead of onnxruntime (the CumSum case of ``python -m benchmarks.onnx_ops``:
#: ``benchmarks/results/zen4_onnx_ops.json``).
CUMSUM_BLOCK = 8


def _running(b, node, inputs, product: bool) -> list[Value]:
    """CumSum's and CumProd's running sums (``product``: products) along ``axis``
    (``exclusive``: each without its own element; ``reverse``: from the end)."""
    x = inputs[0]
    axis = _axis(b, int(_require_const(b, inputs[1], f"{b.op_type}'s axis").reshape(-1)[0]), x.rank)
    if x.dtype == np.bool_:
        raise UnsupportedError(f"{b.where}: {b.op_type} of bool tensors")
    return [running_along(b, x, axis, bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0)), product)]


def running_along(b, x: Value, axis: int, exclusive: bool, reverse: bool, product: bool = False) -> Value:
    """Running sums (``product``: products) of ``x`` along ``axis``.  TC statements cannot read
    what they write at another index, so each is a reduction over the elements before it:
    directly along at most CUMSUM_DIRECT elements (n^2 / 2 operations), and along longer axes
    in blocks of ``B`` = CUMSUM_BLOCK elements: each element's sum within its block, each
    block's total, the running sums of the totals (the same way, so levels of blocks: about
    n x B operations in all), and their combination."""
    n = x.shape[axis]
    before = "<" if exclusive else "<="
    idx = indices(x.rank)
    reduce, combine = ("*=!", "*") if product else ("+=!", "+")
    # -0 for a float sum: adding it leaves every value as it is, a running sum of -0s too
    identity = f"{tc_type(x.dtype)}({1 if product else '-0.0' if x.dtype.kind == 'f' else 0})"
    # Positions along the axis count from the end when reversed: element p is x[n - 1 - p].
    along = (lambda p: f"{n - 1} - ({p})") if reverse else (lambda p: p)  # noqa: E731
    out = b.new(x.shape, x.dtype)
    at = lambda p: idx[:axis] + [p] + idx[axis + 1 :]  # noqa: E731
    position = idx[axis] if not reverse else f"{n - 1} - {idx[axis]}"  # the output's place, so counted
    if n <= CUMSUM_DIRECT:
        b.emit(
            [
                b.statement(
                    out,
                    idx,
                    reduce,
                    f"(r0 {before} {position}) ? {b.ref(x, at(along('r0')))} : {identity}",
                    [("r0", n)],
                )
            ],
            [x],
            [out],
            "reduction",
        )
        return out
    block = CUMSUM_BLOCK
    blocks = -(-n // block)
    outer, inner = idx[:axis], idx[axis + 1 :]
    split_idx = outer + ["q0", "q1"] + inner
    split_shape = list(x.shape[:axis]) + [blocks, block] + list(x.shape[axis + 1 :])
    total_idx = outer + ["q0"] + inner
    total_shape = list(x.shape[:axis]) + [blocks] + list(x.shape[axis + 1 :])
    within, totals, sums = b.new(split_shape, x.dtype), b.new(total_shape, x.dtype), b.new(split_shape, x.dtype)
    element = f"{block} * q0 + r0"
    inside = f"{element} < {n}"
    read = b.ref(x, at(along(element)))
    b.emit(
        [
            b.statement(
                within, split_idx, reduce, f"(r0 {before} q1 && {inside}) ? {read} : {identity}", [("r0", block)]
            ),
            b.statement(totals, total_idx, reduce, f"({inside}) ? {read} : {identity}", [("r0", block)]),
        ],
        [x],
        [within, totals],
        "reduction",
    )
    offsets = running_along(b, totals, axis, exclusive=True, reverse=False, product=product)  # (in block order)
    b.emit(
        [b.statement(sums, split_idx, "=", f"{b.ref(within, split_idx)} {combine} {b.ref(offsets, total_idx)}")],
        [within, offsets],
        [sums],
        "elementwise",
    )
    flat = b.view(sums, list(x.shape[:axis]) + [blocks * block] + list(x.shape[axis + 1 :]))
    b.emit([b.statement(out, idx, "=", b.ref(flat, at(position)))], [flat], [out], "other")
    return out


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
    return (
        mean,
        var,
        [
            b.statement(mean, kept_idx, "+=!", b.ref(x, source), reduced),
            b.statement(mean, kept_idx, "=", f"{mean.ident}({at}) / {count}"),
            b.statement(var, kept_idx, "+=!", f"{deviation} * {deviation}", reduced),
            b.statement(var, kept_idx, "=", f"{var.ident}({at}) / {count}"),
        ],
    )


class InstanceNormalization(Converter):
    """Each image's channel normalised over its spatial positions, then scaled and shifted per
    channel (style transfer networks, GANs)."""

    @staticmethod
    def _impl_v6(b, node, inputs):
        x, scale, bias = inputs[:3]
        if x.rank < 3:
            raise UnsupportedError(
                f"{b.where}: InstanceNormalization of a rank-{x.rank} input (N, C and "
                f"at least one spatial axis are needed)"
            )
        mean, var, statements = _mean_and_variance(b, x, 2)
        out = b.new(x.shape, x.dtype)
        idx = indices(x.rank)
        epsilon = _number(node.attr("epsilon", 1e-5))
        statements.append(
            b.statement(
                out,
                idx,
                "=",
                f"({b.ref(x, idx)} - {mean.ident}({idx[0]}, {idx[1]})) / sqrt({var.ident}({idx[0]}, "
                f"{idx[1]}) + {epsilon}) * {b.ref(scale, [idx[1]])} + {b.ref(bias, [idx[1]])}",
            )
        )
        b.emit(statements, [x, scale, bias], [out], "reduction")
        return [out]


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
        rhs = (
            f"({b.ref(x, idx)} - {mean.ident}({at_point})) / sqrt({var.ident}({at_point}) + {_number(epsilon)})"
            f" * {scale_ref}"
        )
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
            b.statement(
                squares,
                idx,
                "+=!",
                f"({channel} >= 0 && {channel} < {x.shape[1]}) ? {read} * {read} : 0",
                [("r_k", size)],
            ),
            b.statement(
                out,
                idx,
                "=",
                f"{b.ref(x, idx)} / pow({_number(bias)} + {_number(alpha / size)} * "
                f"{squares.ident}({', '.join(idx)}), {_number(beta)})",
            ),
        ]
        b.emit(statements, [x], [out], "reduction")
        return [out]
