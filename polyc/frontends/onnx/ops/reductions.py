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
#: element (n^2 / 2 additions); longer ones go in blocks of about sqrt(n) elements, at most
#: this many, in levels (about n x 64 additions: see :func:`running_along`).
CUMSUM_DIRECT = 64


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
    in blocks of ``B`` elements (about sqrt(n), at most CUMSUM_DIRECT): each element's sum
    within its block, each block's total, the running sums of the totals (the same way, so
    levels of blocks: about n x B operations in all), and their combination."""
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
        return out
    block = min(math.isqrt(n - 1) + 1, CUMSUM_DIRECT)
    blocks = -(-n // block)
    outer, inner = idx[:axis], idx[axis + 1:]
    split_idx = outer + ["q0", "q1"] + inner
    split_shape = list(x.shape[:axis]) + [blocks, block] + list(x.shape[axis + 1:])
    total_idx = outer + ["q0"] + inner
    total_shape = list(x.shape[:axis]) + [blocks] + list(x.shape[axis + 1:])
    within, totals, sums = b.new(split_shape, x.dtype), b.new(total_shape, x.dtype), b.new(split_shape, x.dtype)
    element = f"{block} * q0 + r0"
    inside = f"{element} < {n}"
    read = b.ref(x, at(along(element)))
    b.emit([b.statement(within, split_idx, reduce, f"(r0 {before} q1 && {inside}) ? {read} : {identity}",
                        [("r0", block)]),
            b.statement(totals, total_idx, reduce, f"({inside}) ? {read} : {identity}", [("r0", block)])],
           [x], [within, totals], "reduction")
    offsets = running_along(b, totals, axis, exclusive=True, reverse=False, product=product)  # (in block order)
    b.emit([b.statement(sums, split_idx, "=", f"{b.ref(within, split_idx)} {combine} {b.ref(offsets, total_idx)}")],
           [within, offsets], [sums], "elementwise")
    flat = b.view(sums, list(x.shape[:axis]) + [blocks * block] + list(x.shape[axis + 1:]))
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
