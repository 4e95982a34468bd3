"""Gathers and scatters, elements read or written at the indices a tensor holds: Gather,
GatherElements, GatherND, ReverseSequence, ScatterElements (and Scatter, its older name),
ScatterND and TensorScatter.  A statement cannot write at data-dependent indices, so a scatter is
written as a gather: each output element looks for the update aimed at it.
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import SignatureError, UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _axis


class Gather(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        x, which = inputs[:2]
        axis = _axis(b, node.attr("axis", 0), x.rank)
        if which.const is not None:
            which = b.const(np.where(which.const < 0, which.const + x.shape[axis], which.const).astype(np.int64))
        if x.const is not None and which.const is not None:
            return [b.const(np.take(x.const, which.const, axis=axis))]
        shape = list(x.shape[:axis]) + list(which.shape) + list(x.shape[axis + 1 :])
        out = b.new(shape, x.dtype)
        idx = indices(len(shape))
        inner = idx[axis : axis + which.rank]
        position = b.ref(which, inner) if which.shape else b.ref(which, [])
        if which.const is None:  # negative indices count from the end
            position = f"({position} < 0 ? {position} + {x.shape[axis]} : {position})"
        subscripts = idx[:axis] + [position] + idx[axis + which.rank :]
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x, which], [out], "other")
        return [out]


def _wrapped(b: Builder, which: Value, subscripts, extent: int) -> str:
    """An index tensor's element at ``subscripts``, a negative index counted from ``extent``."""
    position = b.ref(which, subscripts)
    return f"({position} < 0 ? {position} + {extent} : {position})"


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
            raise UnsupportedError(
                f"{b.where}: batch_axis {batch_axis} and time_axis {time_axis} (0 and 1) with "
                f"{lengths.shape[0]} lengths for a batch of {x.shape[batch_axis]}"
            )
        idx = indices(x.rank)
        length = f"int64({b.ref(lengths, [idx[batch_axis]])})"
        reversed_at = list(idx)
        reversed_at[time_axis] = f"{length} - 1 - {idx[time_axis]}"
        out = b.new(x.shape, x.dtype)
        b.emit(
            [b.statement(out, idx, "=", f"({idx[time_axis]} < {length}) ? {b.ref(x, reversed_at)} : {b.ref(x, idx)}")],
            [x, lengths],
            [out],
            "other",
        )
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
        if (
            update.rank != cache.rank
            or any(u != c for d, (u, c) in enumerate(zip(update.shape, cache.shape)) if d != axis)
            or update.shape[axis] > cache.shape[axis]
        ):
            raise SignatureError(
                f"{b.where}: an update of shape {update.shape} for a cache of shape {cache.shape} along axis {axis}"
            )
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
        statements = [
            b.statement(
                out, idx, "=", f"({offset} >= 0 && {offset} < {length}) ? {b.ref(update, at)} : {b.ref(cache, idx)}"
            )
        ]
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
            raise UnsupportedError(
                f"{b.where}: GatherElements' indices have rank {which.rank}, "
                f"the data rank {x.rank} (they must be equal)"
            )
        axis = _axis(b, node.attr("axis", 0), x.rank)
        for d in range(x.rank):
            if d != axis and which.shape[d] > x.shape[d]:
                raise SignatureError(
                    f"{b.where}: GatherElements' indices have extent {which.shape[d]} "
                    f"along axis {d}, beyond the data's {x.shape[d]}"
                )
        if x.const is not None and which.const is not None:
            position = np.where(which.const < 0, which.const + x.shape[axis], which.const)
            return [b.const(np.take_along_axis(x.const, position.astype(np.int64), axis=axis))]
        out = b.new(which.shape, x.dtype)
        idx = indices(x.rank)
        subscripts = idx[:axis] + [_wrapped(b, which, idx, x.shape[axis])] + idx[axis + 1 :]
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
            raise UnsupportedError(
                f"{b.where}: GatherND with batch_dims {batch} and index tuples of {depth} into a rank-{x.rank} tensor"
            )
        if tuple(which.shape[:batch]) != tuple(x.shape[:batch]):
            raise SignatureError(
                f"{b.where}: GatherND's first {batch} axes differ: indices "
                f"{list(which.shape[:batch])}, data {list(x.shape[:batch])}"
            )
        shape = list(which.shape[:-1]) + list(x.shape[batch + depth :])
        out = b.new(shape, x.dtype)
        idx = indices(len(shape))
        points = idx[: which.rank - 1]  # batch axes, then the index tuples' own axes
        tail = idx[which.rank - 1 :]  # the slice's axes
        tuple_at = [_wrapped(b, which, points + [str(e)], x.shape[batch + e]) for e in range(depth)]
        subscripts = points[:batch] + tuple_at + tail
        b.emit([b.statement(out, idx, "=", b.ref(x, subscripts))], [x, which], [out], "other")
        return [out]


def _scatter(
    b: Builder,
    data: Value,
    which: Value,
    updates: Value,
    reduction: str,
    head: int,
    target,
    match,
    update_at,
    count: int,
    probe: tuple[Value, str],
) -> Value:
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
        b.emit(
            [
                probe[1],
                b.statement(last, idx[:head], "max=!", aimed(idx, "int64(r0)", "int64(-1)"), [("r0", count)]),
                b.statement(out, idx, "=", f"({at} >= 0) ? {update_at(idx, at)} : {b.ref(data, idx)}"),
            ],
            [data, which, updates],
            [out, probe[0]],
            "other",
        )
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
    b.emit(
        [
            probe[1],
            b.statement(out, idx, "=", b.ref(data, idx)),
            b.statement(out, idx, op, aimed(idx, update_at(idx, "r0"), neutral), [("r0", count)]),
        ],
        reads,
        [out, probe[0]],
        "other",
    )
    return out


class ScatterElements(Converter):
    """``out[i][index[i][j]] = updates[i][j]`` along ``axis`` (or combined by ``reduction``):
    torch's scatter_ export.  See :func:`_scatter` for the cost.

    Torch's ``index_put_`` of whole rows (torchvision's RoI pooling puts each level's rows in
    place so) exports as a ScatterElements whose index is the same along every other axis of a
    row.  A large one without a reduction is replaced by a kernel counting the indices that
    differ from their row's first or lie outside the data (``check``) and an If on that count:
    a kernel choosing each output row's last update (``rows``: |data| + rows^2 operations), or
    the general scatter (``general``).  The plan learns which in a stage."""

    #: A scatter of fewer (output elements x updates along the axis) is always the general one.
    ROWS_AT_LEAST = 1 << 20

    @staticmethod
    def replaced(flat, values: dict):
        from onnx import helper

        from polyc.frontends.onnx.ops.data_dependent import _Nodes

        proto = flat.proto
        attributes = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        data, which, updates = (values.get(name) for name in (list(proto.input) + ["", "", ""])[:3])
        if (
            "polyc_path" in attributes
            or attributes.get("reduction", b"none") not in (b"none", "none")
            or data is None
            or which is None
            or updates is None
            or which.const is not None
            or which.rank < 2
            or which.rank != data.rank
            or data.size * which.shape[attributes.get("axis", 0) % data.rank] < ScatterElements.ROWS_AT_LEAST
        ):
            return None
        n = _Nodes(flat.name, flat.origin)
        kept = {"axis": attributes.get("axis", 0)}
        mixed = n("ScatterElements", *proto.input[:3], polyc_path="check", **kept)
        fits = n("Equal", mixed, n.constant("none", np.array(0, np.int64)))

        def branch(path: str):
            return helper.make_graph(
                [
                    helper.make_node(
                        "ScatterElements",
                        list(proto.input[:3]),
                        [f"{flat.name}/{path}"],
                        name=path,
                        polyc_path=path,
                        **kept,
                    )
                ],
                f"{flat.name}/{path}",
                [],
                [helper.make_tensor_value_info(f"{flat.name}/{path}", 0, None)],
            )

        n("If", fits, output=proto.output[0], then_branch=branch("rows"), else_branch=branch("general"))
        return n.nodes

    @staticmethod
    def _impl_v11(b, node, inputs):
        data, which, updates = inputs[:3]
        path = node.attr("polyc_path")
        if path in ("check", "rows"):
            return [
                ScatterElements._by_rows(
                    b, data, which, updates, _axis(b, node.attr("axis", 0), data.rank), path == "check"
                )
            ]
        axis = _axis(b, node.attr("axis", 0), data.rank)
        if which.shape != updates.shape or which.rank != data.rank:
            raise SignatureError(
                f"{b.where}: {node.op_type}'s indices {list(which.shape)} and updates "
                f"{list(updates.shape)} must have one shape, of the data's rank {data.rank}"
            )
        for d in range(data.rank):
            if d != axis and which.shape[d] > data.shape[d]:
                raise SignatureError(
                    f"{b.where}: {node.op_type}'s indices have extent {which.shape[d]} along "
                    f"axis {d}, beyond the data's {data.shape[d]}"
                )
        at = lambda p, r: p[:axis] + [r] + p[axis + 1 :]  # noqa: E731
        target = lambda p: (  # noqa: E731
            " && ".join(
                f"{p[d]} < {which.shape[d]}"
                for d in range(data.rank)  # noqa: E731
                if d != axis and which.shape[d] < data.shape[d]
            )
            or None
        )
        match = lambda p, r: f"{_wrapped(b, which, at(p, r), data.shape[axis])} == {p[axis]}"  # noqa: E731
        probe, points = b.new(which.shape, data.dtype), indices(which.rank, "u")
        aim = at(points, _wrapped(b, which, points, data.shape[axis]))
        return [
            _scatter(
                b,
                data,
                which,
                updates,
                node.attr("reduction", "none"),
                data.rank,
                target,
                match,
                lambda p, r: b.ref(updates, at(p, r)),
                which.shape[axis],
                (probe, b.statement(probe, points, "=", b.ref(data, aim))),
            )
        ]

    @staticmethod
    def _by_rows(b, data: Value, which: Value, updates: Value, axis: int, check: bool) -> Value:
        """``check``: how many indices differ from their row's first (the element at 0 along
        every other axis) or lie outside the data.  Else the scatter of rows: each output row's
        last update, read where the updates cover it."""
        extent = data.shape[axis]
        first = lambda p: ["0"] * axis + [p] + ["0"] * (which.rank - axis - 1)  # noqa: E731
        if check:
            q = [f"r_q{d}" for d in range(which.rank)]
            aim = _wrapped(b, which, q, extent)
            mixed = b.new((), np.int64)
            b.emit(
                [
                    b.statement(
                        mixed,
                        [],
                        "+=!",
                        f"({aim} != {_wrapped(b, which, first(q[axis]), extent)} || "
                        f"{aim} < 0 || {aim} >= {extent}) ? int64(1) : int64(0)",
                        list(zip(q, which.shape)),
                    )
                ],
                [which],
                [mixed],
                "other",
            )
            return mixed
        last = b.new((extent,), np.int64)
        out = b.new(data.shape, data.dtype)
        idx = indices(data.rank)
        at = b.ref(last, [idx[axis]])
        covered = " && ".join(
            [f"{at} >= 0"]
            + [f"{idx[d]} < {which.shape[d]}" for d in range(data.rank) if d != axis and which.shape[d] < data.shape[d]]
        )
        b.emit(
            [
                b.statement(
                    last,
                    ["i0"],
                    "max=!",
                    f"({_wrapped(b, which, first('r_k'), extent)} == i0) ? int64(r_k) : int64(-1)",
                    [("r_k", which.shape[axis])],
                ),
                b.statement(
                    out,
                    idx,
                    "=",
                    f"({covered}) ? {b.ref(updates, idx[:axis] + [at] + idx[axis + 1 :])} : {b.ref(data, idx)}",
                ),
            ],
            [data, which, updates],
            [out],
            "other",
        )
        return out


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
            raise SignatureError(
                f"{b.where}: ScatterND's updates have shape {list(updates.shape)}, its indices and data need {expected}"
            )
        count = math.prod(which.shape[:-1])
        tuples = b.view(which, [count, length])  # the updates in one row each, in order
        rows = b.view(updates, [count] + list(data.shape[length:]))
        match = lambda p, r: " && ".join(  # noqa: E731
            f"{_wrapped(b, tuples, [r, str(e)], data.shape[e])} == {p[e]}" for e in range(length)
        )
        probe = b.new([count], data.dtype)
        aim = [_wrapped(b, tuples, ["u0", str(e)], data.shape[e]) for e in range(length)] + ["0"] * (data.rank - length)
        return [
            _scatter(
                b,
                data,
                tuples,
                rows,
                node.attr("reduction", "none"),
                length,
                lambda p: None,
                match,
                lambda p, r: b.ref(rows, [r] + p[length:]),
                count,
                (probe, b.statement(probe, ["u0"], "=", b.ref(data, aim))),
            )
        ]
