"""Operators planned in stages (:mod:`polyc.frontends.onnx.stages`): NonZero, Compress, Unique
and NonMaxSuppression, whose output shapes come from their inputs' data, and MaxUnpool, whose
fast kernel holds only for indices a MaxPool made.

A plan knows every shape, so each of these is replaced (``replaced``, before conversion) by
nodes of other operators (:class:`_Nodes`) that compute, as kernels, what the rest needs to
know (how many elements are kept, how many are distinct, whether an iteration changed
anything, whether every index lies in its window), and the plan stops to learn it; the rest of
the graph is planned for that value.  A NonZero's k-th kept element, for instance, is at the
number of running counts not above k (the running count is monotone): |output| x |input|
comparisons, fine for the masks, thresholds and class scores models meet, slow for millions
of elements.
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import PolycError, UnsupportedError
from polyc.frontends.onnx.functions import FlatNode
from polyc.frontends.onnx.lowering import indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _require_const
from polyc.frontends.onnx.ops.reductions import count_not_above, order_keys, padded_length, sort_by_key


class NonZero(Converter):
    """The indices of the nonzero elements, one row per axis, in row-major order (NaN counts
    as nonzero).  Replaced by the nodes computing the running count over the flattened input
    and the total, then NonZero(x, running, total) with the total known (input 2)."""

    CONSTANT_INPUTS = (2,)

    @staticmethod
    def replaced(flat: FlatNode, values: dict) -> list[FlatNode] | None:
        from onnx import TensorProto

        proto = flat.proto
        if len(proto.input) != 1 or not proto.output or not proto.output[0]:
            return None  # (NonZero(x, running, total): converted)
        n = _Nodes(flat.name, flat.origin)
        found = n("Cast", n("Cast", proto.input[0], to=TensorProto.BOOL), to=TensorProto.INT64)
        ones = n("Reshape", found, n.constant("flat_shape", np.array([-1], np.int64)))
        running = n("CumSum", ones, n.constant("axis", np.array(0, np.int64)))
        n("NonZero", proto.input[0], running, n("ReduceSum", ones, keepdims=1), output=proto.output[0])
        return n.nodes

    @staticmethod
    def _impl_v9(b, node, inputs):
        if len(inputs) != 3:
            raise UnsupportedError(f"{b.where}: NonZero reached its converter unplanned (a polyc bug)")
        x, running, total = inputs
        count = int(_require_const(b, total, "NonZero's count").reshape(-1)[0])
        shape = x.shape or (1,)  # a scalar is one element, as onnxruntime takes it
        rank = len(shape)
        if count == 0:
            return [b.const(np.zeros((rank, 0), np.int64))]
        # The count is new in most images of a detector; its kernels work on a padded count
        # that many counts share (the entries past the count are computed and not read), so
        # only the first image of each padded count compiles them.  Of a vector's, the output
        # itself is a prefix of the padded one.
        padded = padded_length(count)
        out = b.new((rank, padded if rank == 1 else count), np.int64)
        # The k-th nonzero element is at flat position p where running(p) == k + 1 first:
        # the number of positions whose running count is at most k.
        position = count_not_above(b, running, padded)
        strides = [int(np.prod(shape[d + 1 :], dtype=np.int64)) for d in range(rank)]
        coordinate = "int64(0)"
        for d in reversed(range(rank)):
            along = f"({b.ref(position, ['k'])} / int64({strides[d]})) % int64({shape[d]})"
            coordinate = along if d == rank - 1 else f"(d == {d}) ? {along} : {coordinate}"
        b.emit([b.statement(out, ["d", "k"], "=", coordinate)], [position], [out], "elementwise")
        return [b.part(out, (rank, count), 0) if out.shape[1] != count else out]


class Compress(Converter):
    """The slices of ``input`` along ``axis`` (of the flattened input, without an axis) whose
    ``condition`` entry is true; a shorter condition leaves the rest out.  Replaced by a
    NonZero of the condition and a Gather of the slices it finds."""

    @staticmethod
    def replaced(flat: FlatNode, values: dict) -> list[FlatNode] | None:
        proto = flat.proto
        where = f"node {flat.name!r} (Compress)"
        if len(proto.input) != 2 or proto.input[0] not in values or proto.input[1] not in values:
            raise PolycError(f"{where}: Compress takes an input and a condition")
        x, condition = values[proto.input[0]], values[proto.input[1]]
        attributes = {a.name: a.i for a in proto.attribute}
        n = _Nodes(flat.name, flat.origin)
        source = proto.input[0]
        if "axis" in attributes:
            if not -x.rank <= attributes["axis"] < x.rank:
                raise PolycError(f"{where}: axis {attributes['axis']} out of range for rank {x.rank}")
            axis = attributes["axis"] % x.rank
            extent = x.shape[axis]
        else:  # the flattened input
            axis, extent = 0, x.size
            source = n("Reshape", source, n.constant("flat_shape", np.array([-1], np.int64)))
        if condition.rank != 1:
            raise PolycError(f"{where}: the condition must have rank 1, not shape {condition.shape}")
        if condition.shape[0] > extent:
            raise PolycError(
                f"{where}: the condition has {condition.shape[0]} entries, more than the "
                f"{extent} slices it selects from"
            )
        kept = n("Reshape", n("NonZero", proto.input[1]), n.constant("kept_shape", np.array([-1], np.int64)))
        n("Gather", source, kept, output=proto.output[0], axis=axis)
        return n.nodes

    @staticmethod
    def _impl_v9(b, node, inputs):
        raise UnsupportedError(f"{b.where}: Compress reached its converter unplanned (a polyc bug)")


class _Nodes:
    """Nodes of a replacement, named under ``prefix``, at opset :data:`_REPLACEMENT_OPSET`."""

    def __init__(self, prefix: str, origin: str):
        self.prefix, self.origin, self._count = prefix, origin, 0
        self.nodes: list[FlatNode] = []

    def __call__(self, op_type: str, *inputs: str, output: str = "", label: str = "", **attributes) -> str:
        """A node of ``op_type`` on ``inputs``, named by ``label`` (default: the op type) under the
        prefix; returns its output's name (``output``, or the node's name)."""
        from onnx import helper

        self._count += 1
        name = f"{self.prefix}/{label or op_type}_{self._count}"
        output = output or name
        self.nodes.append(
            FlatNode(
                helper.make_node(op_type, list(inputs), [output], name=name, **attributes),
                _REPLACEMENT_OPSET,
                name,
                self.origin,
            )
        )
        return output

    def constant(self, label: str, array, output: str = "") -> str:
        """A Constant node of ``array``, its value named ``output`` or ``label`` under the prefix."""
        from onnx import numpy_helper

        output = output or f"{self.prefix}/{label}"
        return self("Constant", output=output, label=label, value=numpy_helper.from_array(np.asarray(array), output))


#: The opset replacements are written in (reductions' axes as attributes, Unsqueeze's as input).
_REPLACEMENT_OPSET = 17

#: NonMaxSuppression culls pairs of boxes by blocks of this many boxes, from this many boxes on,
#: when the partner blocks' gathered boxes have at most this many elements.
CULL_BLOCK = 64
CULL_FROM_BOXES = 32 * CULL_BLOCK
MAX_GATHERED_PARTNERS = 1 << 24
#: Which boxes could suppress each box (before it, overlapping it) is decided once, as bits,
#: when the bits take at most this many bytes; otherwise each iteration compares the boxes.
MAX_SUPPRESSOR_BYTES = 64 << 20
_WORD = 32  # bits of a word of suppressor bits (uint32: as many vector lanes as floats)


def _bit_values(b):
    """The value of bit t of a word of suppressor bits, for t = 0 .. _WORD - 1."""
    return b.const(np.array([1 << t for t in range(_WORD)], np.uint32))


class NonMaxSuppression(Converter):
    """Greedy non-maximum suppression per batch entry and class, as onnx's reference: the
    boxes above the score threshold by decreasing score (ties by index), each kept unless it
    overlaps a kept one by an IoU above the threshold, at most ``max_output_boxes_per_class``;
    rows (batch, class, box) by batch, class and that order.

    The greedy choice is a recurrence along the score order, ``keep[i] = candidate[i] and no
    j before i with keep[j] overlaps i``, whose unique solution is reached by iterating it from
    the candidates: after t iterations the first t boxes are right, so it is a Loop that runs
    until nothing changes (a stage per iteration, learning whether it changed).  Which boxes
    could suppress each box (before it, overlapping it by the IoU computed from the corners) is
    decided once, as bits (``suppressors``): every pair, or, from CULL_FROM_BOXES boxes on,
    the pairs of boxes in blocks whose extents meet (:meth:`_culling`); an iteration
    (``step``) then meets those bits with the kept boxes'.  Where the bits would take more
    than MAX_SUPPRESSOR_BYTES, each iteration compares the boxes again, nothing of boxes^2
    size stored.  Then each class's boxes are sorted, the kept first in the score order
    (``order``), and the output's rows read from them once their count is known (``rows``)."""

    CONSTANT_INPUTS = (2,)  # the limit per class (``rows``: the count of rows)

    @classmethod
    def constant_inputs(cls, proto) -> tuple[int, ...]:
        path = next((a.s.decode() for a in proto.attribute if a.name == "polyc_path"), None)
        if path is None:
            return cls.CONSTANT_INPUTS
        return {"rows": (3,), "partners": (2,)}.get(path, ())

    @staticmethod
    def replaced(flat: FlatNode, values: dict) -> list[FlatNode] | None:
        from onnx import TensorProto, helper

        proto, name = flat.proto, flat.name
        if any(a.name == "polyc_path" for a in proto.attribute):
            return None
        where = f"node {name!r} (NonMaxSuppression)"
        boxes_name, scores_name, most_name, iou_name, score_name = (list(proto.input) + [""] * 5)[:5]
        boxes, scores = values.get(boxes_name), values.get(scores_name)
        if boxes is None or scores is None:
            raise PolycError(f"{where}: boxes and scores are required")
        if boxes.rank != 3 or boxes.shape[2] != 4:
            raise PolycError(f"{where}: boxes must have shape (batches, boxes, 4), not {boxes.shape}")
        if scores.rank != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise PolycError(
                f"{where}: scores must have shape (batches, classes, boxes) = ({boxes.shape[0]}, C, "
                f"{boxes.shape[1]}), not {scores.shape}"
            )
        count = boxes.shape[1]
        most = values.get(most_name) if most_name else None
        limit = 0 if most is None or most.size == 0 else max(int(most.const.reshape(-1)[0]), 0)
        n = _Nodes(name, flat.origin)
        if limit == 0 or count == 0 or scores.shape[1] == 0:
            n.constant("nothing", np.zeros((0, 3), np.int64), output=proto.output[0])
            return n.nodes

        def corner(k):
            return n("Gather", boxes_name, n.constant(f"coordinate{k}", np.array(k, np.int64)), axis=2)

        c = [corner(k) for k in range(4)]
        if any(a.i for a in proto.attribute if a.name == "center_point_box"):  # (x centre, y centre, w, h)
            two = n.constant("two", np.array(2, boxes.dtype))
            half_width, half_height = n("Div", c[2], two), n("Div", c[3], two)
            x_min, x_max = n("Sub", c[0], half_width), n("Add", c[0], half_width)
            y_min, y_max = n("Sub", c[1], half_height), n("Add", c[1], half_height)
        else:  # any two opposite corners (y, x)
            y_min, y_max, x_min, x_max = (
                n("Min", c[0], c[2]),
                n("Max", c[0], c[2]),
                n("Min", c[1], c[3]),
                n("Max", c[1], c[3]),
            )
        area = n("Mul", n("Sub", x_max, x_min), n("Sub", y_max, y_min))
        threshold = iou_name or n.constant("iou_threshold", np.array(0, boxes.dtype))
        if score_name:
            candidates = n("Greater", scores_name, score_name)
        else:
            candidates = n.constant("candidates", np.ones(scores.shape, np.bool_))
        geometry = [scores_name, x_min, x_max, y_min, y_max, area, threshold]
        if count >= CULL_FROM_BOXES:
            geometry += NonMaxSuppression._culling(n, scores_name, x_min, x_max, y_min, y_max, area)
        geometry.append(n("NonMaxSuppression", *geometry, polyc_path="suppressors"))
        # The loop's body: one iteration of the recurrence, and whether it changed anything.
        body = helper.make_graph(
            [
                helper.make_node(
                    "NonMaxSuppression", ["keep_in", candidates, *geometry], ["keep_out"], polyc_path="step"
                ),
                helper.make_node("Xor", ["keep_out", "keep_in"], [f"{name}/flipped"]),
                helper.make_node("Cast", [f"{name}/flipped"], [f"{name}/flipped_number"], to=TensorProto.INT32),
                helper.make_node("ReduceMax", [f"{name}/flipped_number"], [f"{name}/changed_number"], keepdims=0),
                helper.make_node("Cast", [f"{name}/changed_number"], ["changed"], to=TensorProto.BOOL),
            ],
            f"{name}/body",
            [
                helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
                helper.make_tensor_value_info("going", TensorProto.BOOL, []),
                helper.make_tensor_value_info("keep_in", TensorProto.BOOL, list(scores.shape)),
            ],
            [
                helper.make_tensor_value_info("changed", TensorProto.BOOL, []),
                helper.make_tensor_value_info("keep_out", TensorProto.BOOL, list(scores.shape)),
            ],
        )
        keep = n(
            "Loop",
            n.constant("iterations", np.array(count + 1, np.int64)),
            n.constant("true", np.array(True)),
            candidates,
            body=body,
        )
        # Each (batch, class) pair's boxes, the kept first in the score order; the first
        # min(kept, limit) of them are its rows, after the rows of the pairs before it.
        order = n("NonMaxSuppression", keep, scores_name, polyc_path="order")
        kept_number = n("Cast", keep, to=TensorProto.INT64)
        per_pair = n(
            "Reshape",
            n("ReduceSum", kept_number, n.constant("boxes_axis", np.array([2], np.int64)), keepdims=0),
            n.constant("pairs", np.array([-1], np.int64)),
        )
        if limit < count:
            per_pair = n("Min", per_pair, n.constant("limit", np.array(limit, np.int64)))
        starts = n("CumSum", per_pair, n.constant("axis", np.array(0, np.int64)), exclusive=1)
        total = n("ReduceSum", per_pair, keepdims=1)
        n("NonMaxSuppression", order, starts, per_pair, total, output=proto.output[0], polyc_path="rows")
        return n.nodes

    @staticmethod
    def _culling(n: _Nodes, scores: str, x_min: str, x_max: str, y_min: str, y_max: str, area: str) -> list[str]:
        """The boxes in blocks of :data:`CULL_BLOCK` in their order, and for each block the blocks
        whose extents meet its own (``partners``), with their boxes' corners, areas and scores
        gathered: a step then compares each box with the boxes of those blocks only.  Detectors
        give NonMaxSuppression their boxes class by class, moved apart by class (torchvision's
        batched NMS), so each block meets a few: SSDlite's 27,000 boxes in 422 blocks meet at
        most ~10.  The most partners a block has is learned in a stage; when culling would not
        save half the pairs (boxes spread over the image in no order), the partner table is
        empty and the step compares every pair."""
        extents = n("NonMaxSuppression", x_min, x_max, y_min, y_max, area, polyc_path="extents")
        live = n("NonMaxSuppression", extents, polyc_path="live")
        from onnx import TensorProto

        live_number = n("Cast", live, to=TensorProto.INT32)
        most = n(
            "ReduceMax",
            n("ReduceSum", live_number, n.constant("partner_axis", np.array([2], np.int64)), keepdims=0),
            keepdims=0,
        )
        rank = n("CumSum", live_number, n.constant("block_axis", np.array(2, np.int64)), exclusive=1)
        # Learned rounded up (:meth:`_width`), so that images of similar boxes share a plan
        # and kernels (a partner slot past a block's own points at block 0, which either meets
        # the block, and is compared twice, or has no box that overlaps any of it).
        width = n("NonMaxSuppression", most, polyc_path="width")
        partners = n("NonMaxSuppression", live, rank, width, polyc_path="partners")
        boxes = n("NonMaxSuppression", partners, polyc_path="indices")
        geometry = (x_min, x_max, y_min, y_max, area, scores)
        return (
            [boxes]
            + [n("NonMaxSuppression", value, boxes, polyc_path="gather") for value in geometry]
            + [n("NonMaxSuppression", value, polyc_path="blocks") for value in geometry]
        )

    @staticmethod
    def _impl_v10(b, node, inputs):
        path = node.attr("polyc_path")
        if path == "step":
            *inputs, suppressors = inputs
            culled = len(inputs) > 9 and inputs[9].shape[1] > 0
            if suppressors.size > 0:
                return [
                    NonMaxSuppression._step_by_bits(b, inputs[0], inputs[1], suppressors, inputs[9] if culled else None)
                ]
            if culled:
                return [NonMaxSuppression._culled_step(b, *inputs)]
            return [NonMaxSuppression._step(b, *inputs[:9])]
        if path == "suppressors":
            return [NonMaxSuppression._suppressors(b, *inputs)]
        lower = {
            "extents": NonMaxSuppression._extents,
            "live": NonMaxSuppression._live,
            "width": NonMaxSuppression._width,
            "partners": NonMaxSuppression._partners,
            "indices": NonMaxSuppression._indices,
            "gather": NonMaxSuppression._gather,
            "blocks": NonMaxSuppression._blocks,
            "order": NonMaxSuppression._order,
            "rows": NonMaxSuppression._rows,
        }.get(path)
        if lower is not None:
            return [lower(b, *inputs)]
        raise UnsupportedError(f"{b.where}: NonMaxSuppression reached its converter unplanned (a polyc bug)")

    @staticmethod
    def _overlaps(b, mine: list[str], other: list[str], threshold) -> str:
        """Whether two boxes, each given by the TC reads of its x_min, x_max, y_min, y_max and
        area, overlap by an IoU above the threshold, as onnxruntime decides it."""
        (x_min, x_max, y_min, y_max, area), (x_min_o, x_max_o, y_min_o, y_max_o, area_o) = mine, other
        left, right = f"fmax({x_min}, {x_min_o})", f"fmin({x_max}, {x_max_o})"
        bottom, top = f"fmax({y_min}, {y_min_o})", f"fmin({y_max}, {y_max_o})"
        intersection = f"(({right}) - ({left})) * (({top}) - ({bottom}))"
        union = f"({area} + {area_o} - {intersection})"
        limit = b.ref(threshold, ["0"] * threshold.rank)
        return " && ".join(
            [
                f"{right} > {left}",
                f"{top} > {bottom}",
                f"{intersection} > 0",
                f"{area} > 0",
                f"{area_o} > 0",
                f"{union} > 0",
                f"{intersection} / {union} > {limit}",
            ]
        )

    @staticmethod
    def _before(b, scores, mine: str, other: str) -> str:
        """Whether box ``other`` comes before box ``mine`` in the score order (ties by index)."""
        own, theirs = b.ref(scores, ["i0", "i1", mine]), b.ref(scores, ["i0", "i1", other])
        return f"({theirs} > {own} || ({theirs} == {own} && {other} < {mine}))"

    @staticmethod
    def _step(b, keep, candidates, scores, x_min, x_max, y_min, y_max, area, threshold):
        """One iteration: each candidate kept unless a kept box before it overlaps it."""
        count = scores.shape[2]

        overlaps = NonMaxSuppression._overlaps(
            b,
            [b.ref(v, ["i0", "i2"]) for v in (x_min, x_max, y_min, y_max, area)],
            [b.ref(v, ["i0", "r_j"]) for v in (x_min, x_max, y_min, y_max, area)],
            threshold,
        )
        blocking = f"({NonMaxSuppression._before(b, scores, 'i2', 'r_j')} && {b.ref(keep, ['i0', 'i1', 'r_j'])})"
        blocked = b.new(scores.shape, np.int32)
        kept = b.new(scores.shape, np.bool_)
        idx = ["i0", "i1", "i2"]
        # Two kernels: as one, isl's schedule put the second statement in the pairs' inner loop
        # (at the reduction's last step), which gcc did not vectorize: an order of magnitude slower.
        b.emit(
            [b.statement(blocked, idx, "max=!", f"({blocking} && {overlaps}) ? int32(1) : int32(0)", [("r_j", count)])],
            [keep, scores, x_min, x_max, y_min, y_max, area, threshold],
            [blocked],
            "other",
        )
        b.emit(
            [b.statement(kept, idx, "=", f"{b.ref(candidates, idx)} && {b.ref(blocked, idx)} == 0")],
            [candidates, blocked],
            [kept],
            "other",
        )
        return kept

    @staticmethod
    def _suppressors(b, scores, x_min, x_max, y_min, y_max, area, threshold, boxes=None, *blocked_geometry):
        """Which boxes could suppress each box, decided once for every iteration: bit t of word
        w is set when box 32 w + t (or, culled, the box of partner slot 32 w + t) comes before
        the box and overlaps it.  (batches, classes, boxes, words), or culled (batches, classes,
        blocks, CULL_BLOCK, words); an empty array when the bits would take more than
        MAX_SUPPRESSOR_BYTES."""
        batches, classes, count = scores.shape
        culled = boxes is not None and boxes.shape[1] > 0
        slots = boxes.shape[2] if culled else count  # the boxes each box is compared with
        words = -(-slots // _WORD)
        shape = (batches, classes, boxes.shape[1], CULL_BLOCK, words) if culled else (batches, classes, count, words)
        if math.prod(shape) * 4 > MAX_SUPPRESSOR_BYTES:
            return b.const(np.zeros((batches, classes, 0), np.uint32))
        bit = _bit_values(b)
        slot = f"{_WORD} * w + r_t"
        if culled:
            x_min_p, x_max_p, y_min_p, y_max_p, area_p, scores_p = blocked_geometry[:6]
            x_min_o, x_max_o, y_min_o, y_max_o, area_o, scores_o = blocked_geometry[6:]
            overlaps = NonMaxSuppression._overlaps(
                b,
                [b.ref(v, ["i0", "k", "l"]) for v in (x_min_o, x_max_o, y_min_o, y_max_o, area_o)],
                [b.ref(v, ["i0", "k", slot]) for v in (x_min_p, x_max_p, y_min_p, y_max_p, area_p)],
                threshold,
            )
            mine, other = b.ref(scores_o, ["i0", "i1", "k", "l"]), b.ref(scores_p, ["i0", "i1", "k", slot])
            box = b.ref(boxes, ["i0", "k", slot])
            # A slot past the partners' boxes has no area (the gather's 0): it overlaps nothing.
            before = f"({other} > {mine} || ({other} == {mine} && {box} < {CULL_BLOCK} * k + l))"
            idx, reads = ["i0", "i1", "k", "l", "w"], [threshold, boxes, *blocked_geometry]
        else:
            # The other boxes' geometry padded to whole words with boxes of no area, which
            # overlap nothing: no bound to test in the pairs' loop, which gcc then vectorizes.
            padded = [NonMaxSuppression._padded(b, v, words * _WORD) for v in (x_min, x_max, y_min, y_max, area)]
            overlaps = NonMaxSuppression._overlaps(
                b,
                [b.ref(v, ["i0", "i2"]) for v in (x_min, x_max, y_min, y_max, area)],
                [b.ref(v, ["i0", slot]) for v in padded],
                threshold,
            )
            scores_padded = NonMaxSuppression._padded(b, scores, words * _WORD)
            mine, other = b.ref(scores, ["i0", "i1", "i2"]), b.ref(scores_padded, ["i0", "i1", slot])
            before = f"({other} > {mine} || ({other} == {mine} && {slot} < i2))"
            idx, reads = (
                ["i0", "i1", "i2", "w"],
                [scores, scores_padded, x_min, x_max, y_min, y_max, area, threshold, *padded],
            )
        out = b.new(shape, np.uint32)
        b.emit(
            [
                b.statement(
                    out, idx, "+=!", f"({before} && {overlaps}) ? {b.ref(bit, ['r_t'])} : uint32(0)", [("r_t", _WORD)]
                )
            ],
            reads + [bit],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _padded(b, value, length: int):
        """``value`` (..., boxes) with 0 past its last box up to ``length``."""
        count = value.shape[-1]
        lead = [f"c{k}" for k in range(value.rank - 1)]
        out = b.new((*value.shape[:-1], length), value.dtype)
        b.emit(
            [
                b.statement(
                    out, lead + ["j"], "=", f"(j < {count}) ? {b.ref(value, lead + ['j'])} : {tc_type(value.dtype)}(0)"
                )
            ],
            [value],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _step_by_bits(b, keep, candidates, suppressors, boxes):
        """:meth:`_step` (``boxes``: :meth:`_culled_step`) on :meth:`_suppressors`' bits: the
        kept boxes as bits in the same words, and a box is blocked when a word of its
        suppressors meets them."""
        batches, classes, count = keep.shape
        words = suppressors.shape[-1]
        bit = _bit_values(b)
        slot = f"{_WORD} * w + r_t"
        if boxes is not None:
            blocks = boxes.shape[1]
            box = b.ref(boxes, ["i0", "k", slot])
            flags = b.new((batches, classes, blocks, words), np.uint32)
            kept_bit = f"({box} < {count} && {b.ref(keep, ['i0', 'i1', box])})"
            flag_idx, own = ["i0", "i1", "k", "w"], ["i0", "i1", "k", "l"]
            reads = [keep, boxes]
        else:
            flags = b.new((batches, classes, words), np.uint32)
            kept_bit = f"({slot} < {count} && {b.ref(keep, ['i0', 'i1', slot])})"
            flag_idx, own = ["i0", "i1", "w"], ["i0", "i1", "i2"]
            reads = [keep]
        b.emit(
            [b.statement(flags, flag_idx, "+=!", f"{kept_bit} ? {b.ref(bit, ['r_t'])} : uint32(0)", [("r_t", _WORD)])],
            reads + [bit],
            [flags],
            "other",
        )
        blocked = b.new(suppressors.shape[:-1], np.int32)
        meets = f"bitand({b.ref(suppressors, own + ['r_w'])}, {b.ref(flags, flag_idx[:-1] + ['r_w'])})"
        b.emit(
            [b.statement(blocked, own, "max=!", f"({meets} != uint32(0)) ? int32(1) : int32(0)", [("r_w", words)])],
            [suppressors, flags],
            [blocked],
            "other",
        )
        kept = b.new(keep.shape, np.bool_)
        idx = ["i0", "i1", "i2"]
        at = ['i0', 'i1', f'i2 / {CULL_BLOCK}', f'i2 % {CULL_BLOCK}'] if boxes is not None else idx
        b.emit(
            [b.statement(kept, idx, "=", f"{b.ref(candidates, idx)} && {b.ref(blocked, at)} <= 0")],
            [candidates, blocked],
            [kept],
            "other",
        )
        return kept

    @staticmethod
    def _extents(b, x_min, x_max, y_min, y_max, area):
        """(batches, 4, blocks): each block's least x_min, -(greatest x_max), least y_min,
        -(greatest y_max) over its boxes of positive area (the others overlap nothing; a NaN
        corner makes a NaN area), all as minima."""
        batches, count = area.shape
        blocks = -(-count // CULL_BLOCK)
        # In float64, which holds every box's corners exactly, so no rounding culls a pair.
        wide = tc_type(np.float64)
        out = b.new((batches, 4, blocks), np.float64)
        box = f"r_m + {CULL_BLOCK} * k"

        def at(value):
            return f"{wide}({b.ref(value, ['b', box])})"

        corner = f"((c == 0) ? {at(x_min)} : ((c == 1) ? -{at(x_max)} : ((c == 2) ? {at(y_min)} : -{at(y_max)})))"
        nothing = f"{wide}({float(np.finfo(np.float64).max)!r})"
        b.emit(
            [
                b.statement(
                    out,
                    ["b", "c", "k"],
                    "min=!",
                    f"({box} < {count}) ? (({b.ref(area, ['b', box])} > 0) ? {corner} : {nothing}) : {nothing}",
                    [("r_m", CULL_BLOCK)],
                )
            ],
            [x_min, x_max, y_min, y_max, area],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _live(b, extents):
        """(batches, blocks, blocks): whether two blocks' extents meet (a box of one can
        overlap a box of the other only then)."""
        batches, _, blocks = extents.shape
        live = b.new((batches, blocks, blocks), np.bool_)

        def e(c, k):
            return b.ref(extents, ["b", str(c), k])

        meet = " && ".join(
            [
                f"{e(0, 'j')} < -{e(1, 'i')}",
                f"{e(0, 'i')} < -{e(1, 'j')}",
                f"{e(2, 'j')} < -{e(3, 'i')}",
                f"{e(2, 'i')} < -{e(3, 'j')}",
            ]
        )
        b.emit([b.statement(live, ["b", "i", "j"], "=", meet)], [extents], [live], "other")
        return live

    @staticmethod
    def _width(b, most):
        """The least of 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and 1.5 times them) at least
        ``most``: at most a third more partner slots than needed, and few distinct widths."""
        steps = sorted({2**p for p in range(31)} | {3 * 2**p for p in range(30)})
        widths = b.const(np.array(steps, np.int32))
        width = b.new((1,), np.int32)
        at = b.ref(widths, ["r_w"])
        b.emit(
            [
                b.statement(
                    width,
                    ["k"],
                    "min=!",
                    f"({at} >= {b.ref(most, [])}) ? {at} : int32({steps[-1]})",
                    [("r_w", len(steps))],
                )
            ],
            [most, widths],
            [width],
            "other",
        )
        return width

    @staticmethod
    def _partners(b, live, rank, most):
        """(batches, blocks, most): the blocks each block meets, in order, then block 0 (which
        either meets the block too or has no box that overlaps any of its own); or (batches, 0,
        0) when culling does not pay.  ``most`` is :meth:`_width`'s, at least 1."""
        batches, blocks, _ = live.shape
        widest = int(_require_const(b, most, "the most partners of a block").reshape(-1)[0])
        gathered = batches * blocks * widest * CULL_BLOCK
        if 2 * widest > blocks or gathered > MAX_GATHERED_PARTNERS:
            return b.const(np.zeros((batches, 0, 0), np.int64))
        table = b.new((batches, blocks, widest), np.int64)
        b.emit(
            [
                b.statement(
                    table,
                    ["b", "i", "d"],
                    "+=!",
                    f"({b.ref(live, ['b', 'i', 'r_j'])} && {b.ref(rank, ['b', 'i', 'r_j'])} == d) ? "
                    f"int64(r_j) : int64(0)",
                    [("r_j", blocks)],
                )
            ],
            [live, rank],
            [table],
            "other",
        )
        return table

    @staticmethod
    def _indices(b, partners):
        """(batches, blocks, partners x CULL_BLOCK): the index of each partner block's boxes, in
        32 bits (gcc vectorizes a loop of 32-bit integers and floats, not one that mixes in
        64-bit integers or bools); (batches, 0, 0) when culling does not pay."""
        batches, blocks, widest = partners.shape
        if blocks == 0:
            return b.const(np.zeros((batches, blocks, 0), np.int32))
        out = b.new((batches, blocks, widest * CULL_BLOCK), np.int32)
        b.emit(
            [
                b.statement(
                    out,
                    ["b", "k", "r"],
                    "=",
                    f"int32({b.ref(partners, ['b', 'k', f'r / {CULL_BLOCK}'])} * {CULL_BLOCK} + r % {CULL_BLOCK})",
                )
            ],
            [partners],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _gather(b, value, boxes):
        """``value`` (batches, [classes,] boxes) of each block's partner boxes (:meth:`_indices`):
        (batches, [classes,] blocks, partners x CULL_BLOCK); 0 past the last box (whose kept
        flag the step gathers as false)."""
        batches, blocks, width = boxes.shape
        count = value.shape[-1]
        middle = list(value.shape[1:-1])
        shape = (batches, *middle, blocks, width)
        if 0 in shape:
            return b.const(np.zeros(shape, value.dtype))
        out = b.new(shape, value.dtype)
        lead = ["b"] + [f"c{k}" for k in range(len(middle))]
        box = b.ref(boxes, ["b", "k", "r"])
        b.emit(
            [
                b.statement(
                    out,
                    lead + ["k", "r"],
                    "=",
                    f"({box} < {count}) ? {b.ref(value, lead + [box])} : {tc_type(value.dtype)}(0)",
                )
            ],
            [value, boxes],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _blocks(b, value):
        """``value`` (batches, [classes,] boxes) in blocks: (batches, [classes,] blocks,
        CULL_BLOCK), 0 past the last box (an area of 0 overlaps nothing)."""
        count = value.shape[-1]
        lead = ["b"] + [f"c{k}" for k in range(value.rank - 2)]
        out = b.new((*value.shape[:-1], -(-count // CULL_BLOCK), CULL_BLOCK), value.dtype)
        box = f"k * {CULL_BLOCK} + m"
        b.emit(
            [
                b.statement(
                    out,
                    lead + ["k", "m"],
                    "=",
                    f"({box} < {count}) ? {b.ref(value, lead + [box])} : {tc_type(value.dtype)}(0)",
                )
            ],
            [value],
            [out],
            "other",
        )
        return out

    @staticmethod
    def _culled_step(
        b, keep, candidates, scores, x_min, x_max, y_min, y_max, area, threshold, boxes, *blocked_geometry
    ):
        """:meth:`_step` over each box's partner blocks' boxes only, everything in blocks, so
        that every read in the pairs' loop is affine and of 32 bits (which gcc vectorizes)."""
        x_min_p, x_max_p, y_min_p, y_max_p, area_p, scores_p = blocked_geometry[:6]
        x_min_o, x_max_o, y_min_o, y_max_o, area_o, scores_o = blocked_geometry[6:]
        batches, blocks, width = boxes.shape
        classes, count = scores.shape[1], scores.shape[2]
        kept = b.new(scores.shape, np.bool_)
        idx = ["i0", "i1", "i2"]
        # The kept flags of the partner blocks' boxes, for this iteration, as 0 or 1.
        keep_p = b.new((batches, classes, blocks, width), np.int32)
        box = b.ref(boxes, ["i0", "k", "r"])
        b.emit(
            [
                b.statement(
                    keep_p,
                    ["i0", "i1", "k", "r"],
                    "=",
                    f"(({box} < {count}) && {b.ref(keep, ['i0', 'i1', box])}) ? int32(1) : int32(0)",
                )
            ],
            [keep, boxes],
            [keep_p],
            "other",
        )
        overlaps = NonMaxSuppression._overlaps(
            b,
            [b.ref(v, ["i0", "k", "l"]) for v in (x_min_o, x_max_o, y_min_o, y_max_o, area_o)],
            [b.ref(v, ["i0", "k", "r"]) for v in (x_min_p, x_max_p, y_min_p, y_max_p, area_p)],
            threshold,
        )
        mine = b.ref(scores_o, ["i0", "i1", "k", "l"])
        other = b.ref(scores_p, ["i0", "i1", "k", "r"])
        own_index = b.const(np.arange(blocks * CULL_BLOCK, dtype=np.int32).reshape(blocks, CULL_BLOCK))
        before = f"({other} > {mine} || ({other} == {mine} && {box} < {b.ref(own_index, ['k', 'l'])}))"
        blocking = f"({b.ref(keep_p, ['i0', 'i1', 'k', 'r'])} > 0 && {before})"
        blocked = b.new((batches, classes, blocks, CULL_BLOCK), np.int32)
        b.emit(
            [
                b.statement(
                    blocked,
                    ["i0", "i1", "k", "l"],
                    "max=!",
                    f"({blocking} && {overlaps}) ? int32(1) : int32(0)",
                    [("r", width)],
                )
            ],
            [keep_p, threshold, boxes, own_index, *blocked_geometry],
            [blocked],
            "other",
        )
        b.emit(
            [
                b.statement(
                    kept,
                    idx,
                    "=",
                    f"{b.ref(candidates, idx)} && "
                    f"{b.ref(blocked, ['i0', 'i1', f'i2 / {CULL_BLOCK}', f'i2 % {CULL_BLOCK}'])} <= 0",
                )
            ],
            [candidates, blocked],
            [kept],
            "other",
        )
        return kept

    @staticmethod
    def _order(b, keep, scores):
        """(batches, classes, boxes): each pair's box indices, the kept boxes first in the
        score order (equal scores by index; NaN first, as TopK orders it), then the others; by
        a sort (:func:`sort_by_key`), several times faster than counting each kept box's place
        among the kept boxes before it or finding each row's box (the NonMaxSuppression case of
        ``python -m benchmarks.onnx_ops``: ``benchmarks/results/zen4_onnx_ops.json``)."""
        batches, classes, count = scores.shape
        pairs = batches * classes
        keys = order_keys(b, b.view(scores, (pairs, count)), True, count)
        flags = b.view(keep, (pairs, count))
        ranked = b.new((pairs, count), np.int64)
        # -1 - key reverses the order; no float's key is the least integer, so no kept box's
        # is the greatest, which the others take.
        b.emit(
            [
                b.statement(
                    ranked,
                    ["p", "i"],
                    "=",
                    f"{b.ref(flags, ['p', 'i'])} ? int64(-1) - int64("
                    f"{b.ref(keys, ['p', 'i'])}) : int64({np.iinfo(np.int64).max})",
                )
            ],
            [keys, flags],
            [ranked],
            "other",
        )
        return b.view(sort_by_key(b, ranked), (batches, classes, count))

    @staticmethod
    def _rows(b, order, starts, per_pair, total):
        """The output: row k is (batch, class, box) of the pair whose rows hold k (those before
        it: ``starts``, exclusive running counts), its box at ``order`` place k - start."""
        rows = int(_require_const(b, total, "the count of selected boxes").reshape(-1)[0])
        if rows == 0:
            return b.const(np.zeros((0, 3), np.int64))
        batches, classes, count = order.shape
        pairs = batches * classes
        order = b.view(order, (pairs, count))
        ends = b.new((pairs,), np.int64)
        b.emit(
            [b.statement(ends, ["p"], "=", f"{b.ref(starts, ['p'])} + {b.ref(per_pair, ['p'])}")],
            [starts, per_pair],
            [ends],
            "other",
        )
        pair = count_not_above(b, ends, rows)  # the pairs whose rows all come before row k
        at = b.ref(pair, ["k"])
        box = b.ref(order, [at, f"int64(k) - {b.ref(starts, [at])}"])
        out = b.new((rows, 3), np.int64)
        b.emit(
            [b.statement(out, ["k", "c"], "=", f"(c == 0) ? {at} / {classes} : ((c == 1) ? {at} % {classes} : {box})")],
            [pair, starts, order],
            [out],
            "other",
        )
        return out


class Unique(Converter):
    """The distinct elements (or slices along ``axis``) of the input, sorted ascending
    (lexicographically for slices) or in order of first occurrence, with the index of each
    one's first occurrence, each element's place among them, and their counts; as numpy's
    ``unique`` gives them (NaNs are each distinct, as no NaN equals another).

    Replaced by nodes comparing every pair of elements (|input|^2 comparisons, times the slice
    size: fine for token ids and labels, slow for millions of elements): which elements occur
    first, each one's place, and the count of distinct ones, whose Range the rest of the graph
    is planned on (:mod:`polyc.frontends.onnx.stages`)."""

    @staticmethod
    def replaced(flat: FlatNode, values: dict) -> list[FlatNode] | None:
        from onnx import TensorProto

        proto, name = flat.proto, flat.name
        where = f"node {name!r} (Unique)"
        x = values.get(proto.input[0]) if proto.input else None
        if x is None:
            raise PolycError(f"{where}: its input is required")
        attributes = {a.name: a.i for a in proto.attribute}
        n = _Nodes(name, flat.origin)
        outputs = list(proto.output) + [""] * (4 - len(proto.output))
        if "axis" in attributes:
            if not -x.rank <= attributes["axis"] < max(x.rank, 1):
                raise PolycError(f"{where}: axis {attributes['axis']} out of range for rank {x.rank}")
            axis = attributes["axis"] % x.rank
            order = [axis] + [d for d in range(x.rank) if d != axis]
            rows = n(
                "Reshape",
                n("Transpose", proto.input[0], perm=order) if axis else proto.input[0],
                n.constant("rows_shape", np.array([x.shape[axis], -1], np.int64)),
            )
            count, length = x.shape[axis], x.size // max(x.shape[axis], 1)
        else:
            axis, count, length = None, x.size, 1
            rows = n("Reshape", proto.input[0], n.constant("rows_shape", np.array([-1, 1], np.int64)))
        if count == 0:
            raise PolycError(f"{where}: its input has no elements to find distinct ones among")
        mine, other = (
            n("Unsqueeze", rows, n.constant("axis1", np.array([1], np.int64))),
            n("Unsqueeze", rows, n.constant("axis0", np.array([0], np.int64))),
        )
        axis0, axis1 = n.constant("axes0", np.array([0], np.int64)), n.constant("axes1", np.array([1], np.int64))

        def flag(op_type, value, axes):  # a reduction of a bool tensor
            return n(
                "Cast", n(op_type, n("Cast", value, to=TensorProto.INT32), axes=axes, keepdims=0), to=TensorProto.BOOL
            )

        same = flag("ReduceMin", n("Equal", mine, other), [2])  # [i, j]: slice j equals slice i
        earlier = n.constant("earlier", np.tril(np.ones((count, count), np.bool_), -1))  # [i, j]: j < i
        first = n("Not", flag("ReduceMax", n("And", same, earlier), [1]))
        first_other = n("Unsqueeze", first, axis0)
        numbers = n.constant("numbers", np.arange(count, dtype=np.int64).reshape(1, count))
        if attributes.get("sorted", 1):
            # Slice j is below slice i where they first differ (in row-major order).
            positions = n.constant("positions", np.arange(length, dtype=np.int64))
            differs = n("Not", n("Equal", mine, other))
            first_difference = n(
                "ReduceMin",
                n("Where", differs, positions, n.constant("length", np.array(length))),
                axes=[2],
                keepdims=0,
            )
            below = flag(
                "ReduceMax",
                n(
                    "And",
                    n("Equal", positions, n("Unsqueeze", first_difference, n.constant("axis2", np.array([2])))),
                    n("Less", other, mine),
                ),
                [2],
            )
            ahead = n("And", below, first_other)
        else:  # in order of first occurrence: the distinct slices first met before this one's first
            first_met = n(
                "ReduceMin", n("Where", same, numbers, n.constant("count", np.array(count))), axes=[1], keepdims=0
            )
            ahead = n("And", first_other, n("Less", numbers, n("Unsqueeze", first_met, axis1)))
        place = n("ReduceSum", n("Cast", ahead, to=TensorProto.INT64), axis1, keepdims=0)
        distinct = n("ReduceSum", n("Cast", first, to=TensorProto.INT64), keepdims=0)
        places = n(
            "Range", n.constant("zero", np.array(0, np.int64)), distinct, n.constant("one", np.array(1, np.int64))
        )
        at_place = n("Equal", n("Unsqueeze", places, axis1), n("Unsqueeze", place, axis0))  # [k, i]
        if outputs[0] or outputs[1]:
            chosen = n(
                "ReduceSum",
                n("Mul", n("Cast", n("And", at_place, first_other), to=TensorProto.INT64), numbers),
                axis1,
                keepdims=0,
                output=outputs[1],
            )
            if outputs[0]:
                if axis is None:
                    flat_input = n("Reshape", proto.input[0], n.constant("flat_shape", np.array([-1], np.int64)))
                    n("Gather", flat_input, chosen, output=outputs[0])
                else:
                    n("Gather", proto.input[0], chosen, output=outputs[0], axis=axis)
        if outputs[2]:
            n("Identity", place, output=outputs[2])
        if outputs[3]:
            n("ReduceSum", n("Cast", at_place, to=TensorProto.INT64), axis1, keepdims=0, output=outputs[3])
        return n.nodes

    @staticmethod
    def _impl_v11(b, node, inputs):
        raise UnsupportedError(f"{b.where}: Unique reached its converter unplanned (a polyc bug)")


class MaxUnpool(Converter):
    """The inverse of a MaxPool with indices: zeros of the unpooled shape, with each value
    written where its index points (of several aimed at one element, the last wins, as in
    onnx's reference).  An index outside the output is an error.  Given an ``output_shape``,
    the indices still point into the shape the geometry gives, and the result is padded with
    zeros at the end of each axis to the shape given, as onnx's reference does.

    Indices a MaxPool of the same geometry made lie in their own value's window, and then each
    output element needs to look only at the few windows that cover it.  The node is replaced
    by a kernel counting the indices that do not (``check``), and an If on that count: the fast
    kernel reading only the covering windows (``windows``), or a ScatterND of every value,
    |output| x |input| comparisons, for indices from anywhere.  The plan learns which in a
    stage (:mod:`polyc.frontends.onnx.stages`)."""

    CONSTANT_INPUTS = (2,)  # the output shape

    @staticmethod
    def _geometry(where: str, x_shape, attributes: dict):
        """(kernel, strides, pads at the beginning, the unpooled shape) of the unpooling."""
        spatial = list(x_shape[2:])
        kernel = list(attributes.get("kernel_shape") or [])
        if len(x_shape) < 3 or len(kernel) != len(spatial):
            raise UnsupportedError(f"{where}: its kernel_shape {kernel} does not fit an input of shape {list(x_shape)}")
        strides = list(attributes.get("strides") or [1] * len(spatial))
        pads = list(attributes.get("pads") or [0] * (2 * len(spatial)))
        unpooled = list(x_shape[:2]) + [
            (extent - 1) * strides[d] + kernel[d] - pads[d] - pads[len(spatial) + d] for d, extent in enumerate(spatial)
        ]
        if min(unpooled) < 0:
            raise UnsupportedError(f"{where}: the unpooled shape {unpooled} of an input of shape {list(x_shape)}")
        return kernel, strides, pads[: len(spatial)], unpooled

    @staticmethod
    def replaced(flat: FlatNode, values: dict) -> list[FlatNode] | None:
        from onnx import TensorProto, helper

        proto, name = flat.proto, flat.name
        attributes = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
        if "polyc_path" in attributes:
            return None
        where = f"node {name!r} (MaxUnpool)"
        x, which = (values.get(n) if n else None for n in (list(proto.input) + ["", ""])[:2])
        if x is None or which is None:
            raise PolycError(f"{where}: its input and indices are required")
        if which.shape != x.shape or which.dtype != np.int64:
            raise PolycError(
                f"{where}: its indices must be int64 of the input's shape {list(x.shape)}, not "
                f"{which.dtype} of shape {list(which.shape)}"
            )
        _, _, _, shape = MaxUnpool._geometry(where, x.shape, attributes)
        given = values.get(proto.input[2]) if len(proto.input) > 2 and proto.input[2] else None
        wanted = shape if given is None else [int(e) for e in given.const.reshape(-1)]
        if len(wanted) != len(shape) or wanted[:2] != shape[:2] or any(w < e for w, e in zip(wanted, shape)):
            raise PolycError(f"{where}: its output shape {wanted} must hold the unpooled shape {shape}")
        n = _Nodes(name, flat.origin)
        shape_name = n.constant("unpooled_shape", np.array(shape, np.int64))
        kept = {k: v for k, v in attributes.items() if k in ("kernel_shape", "strides", "pads")}
        unpooled = proto.output[0] if wanted == shape else f"{name}/unpooled"
        outside = n("MaxUnpool", proto.input[0], proto.input[1], polyc_path="check", **kept)
        fits = n("Equal", outside, n.constant("none", np.array(0, np.int64)))
        windows = helper.make_graph(
            [
                helper.make_node(
                    "MaxUnpool",
                    [proto.input[0], proto.input[1]],
                    [f"{name}/from_windows"],
                    polyc_path="windows",
                    **kept,
                )
            ],
            f"{name}/windows",
            [],
            [helper.make_tensor_value_info(f"{name}/from_windows", TensorProto.UNDEFINED, None)],
        )
        count = x.size
        anywhere = helper.make_graph(
            [
                helper.make_node(
                    "Reshape", [proto.input[0], n.constant("flat", np.array([-1], np.int64))], [f"{name}/values"]
                ),
                helper.make_node(
                    "Reshape", [proto.input[1], n.constant("rows", np.array([count, 1], np.int64))], [f"{name}/aims"]
                ),
                helper.make_node(
                    "ScatterND",
                    [n.constant("zeros", np.zeros(math.prod(shape), x.dtype)), f"{name}/aims", f"{name}/values"],
                    [f"{name}/scattered"],
                ),
                helper.make_node("Reshape", [f"{name}/scattered", shape_name], [f"{name}/from_anywhere"]),
            ],
            f"{name}/anywhere",
            [],
            [helper.make_tensor_value_info(f"{name}/from_anywhere", TensorProto.UNDEFINED, None)],
        )
        n("If", fits, output=unpooled, then_branch=windows, else_branch=anywhere)
        if wanted != shape:
            widths = [0] * len(shape) + [w - e for w, e in zip(wanted, shape)]
            n("Pad", unpooled, n.constant("pads", np.array(widths, np.int64)), output=proto.output[0])
        return n.nodes

    @staticmethod
    def _impl_v9(b, node, inputs):
        x, which = inputs[:2]
        if node.attr("polyc_path") not in ("check", "windows"):
            raise UnsupportedError(f"{b.where}: MaxUnpool reached its converter unplanned (a polyc bug)")
        kernel, strides, begin, out_shape = MaxUnpool._geometry(b.where, x.shape, node.attributes)
        k = len(kernel)
        out_strides = [math.prod(out_shape[d + 1 :]) for d in range(len(out_shape))]
        in_strides = [math.prod(x.shape[d + 1 :]) for d in range(x.rank)]
        if node.attr("polyc_path") == "check":  # how many indices lie outside their own window
            q = [f"r_q{d}" for d in range(x.rank)]
            aim = b.ref(which, q)
            tests = [
                f"{aim} >= int64(0)",
                f"{aim} < int64({math.prod(out_shape)})",
                f"{aim} / int64({out_strides[0]}) == {q[0]}",
                f"({aim} / int64({out_strides[1]})) % int64({out_shape[1]}) == {q[1]}",
            ]
            for d in range(k):
                at = f"({aim} / int64({out_strides[2 + d]})) % int64({out_shape[2 + d]})"
                low = f"{q[2 + d]} * {strides[d]} - {begin[d]}"
                tests += [f"{at} >= {low}", f"{at} < {low} + {kernel[d]}"]
            outside = b.new((), np.int64)
            b.emit(
                [
                    b.statement(
                        outside,
                        [],
                        "+=!",
                        f"({' && '.join(tests)}) ? int64(0) : int64(1)",
                        [(r, e) for r, e in zip(q, x.shape)],
                    )
                ],
                [which],
                [outside],
                "other",
            )
            return [outside]
        o = indices(len(out_shape))
        here = " + ".join(f"int64({o[d]}) * int64({out_strides[d]})" for d in range(len(o)))
        zero = f"{tc_type(x.dtype)}(0)"
        out = b.new(out_shape, x.dtype)
        if all(kernel[d] <= strides[d] for d in range(k)):  # windows that do not overlap: one covers o
            covered = " && ".join(
                f"({o[2 + d]} + {begin[d]}) % {strides[d]} < {kernel[d]} && "
                f"({o[2 + d]} + {begin[d]}) / {strides[d]} < {x.shape[2 + d]}"
                for d in range(k)
            )
            q = o[:2] + [f"({o[2 + d]} + {begin[d]}) / {strides[d]}" for d in range(k)]
            b.emit(
                [
                    b.statement(
                        out, o, "=", f"({covered}) ? (({b.ref(which, q)} == {here}) ? {b.ref(x, q)} : {zero}) : {zero}"
                    )
                ],
                [x, which],
                [out],
                "other",
            )
            return [out]
        # The taps r_t of each spatial axis: the windows covering output pixel o start at
        # o + begin - r_t, which must be a multiple of the stride inside the input.
        taps = [f"r_t{d}" for d in range(k)]
        reach = [f"{o[2 + d]} + {begin[d]} - {taps[d]}" for d in range(k)]
        covered = " && ".join(
            f"{reach[d]} >= 0 && ({reach[d]}) % {strides[d]} == 0 && ({reach[d]}) / {strides[d]} < {x.shape[2 + d]}"
            for d in range(k)
        )
        q = o[:2] + [f"({reach[d]}) / {strides[d]}" for d in range(k)]
        position = " + ".join(f"int64({q[d]}) * int64({in_strides[d]})" for d in range(len(q)))
        last = b.new(out_shape, np.int64)
        reductions = list(zip(taps, kernel))
        b.emit(
            [
                b.statement(
                    last,
                    o,
                    "max=!",
                    f"({covered}) ? (({b.ref(which, q)} == {here}) ? {position} : int64(-1)) : int64(-1)",
                    reductions,
                ),
                b.statement(
                    out,
                    o,
                    "+=!",
                    f"({covered}) ? (({position} == {b.ref(last, o)}) ? {b.ref(x, q)} : {zero}) : {zero}",
                    reductions,
                ),
            ],
            [x, which],
            [out],
            "other",
        )
        return [out]

    @staticmethod
    def _impl_v11(b, node, inputs):
        return MaxUnpool._impl_v9(b, node, inputs)


DATA_DEPENDENT = {
    "NonZero": NonZero,
    "Compress": Compress,
    "NonMaxSuppression": NonMaxSuppression,
    "Unique": Unique,
    "MaxUnpool": MaxUnpool,
}
