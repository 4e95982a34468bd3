"""Plans in stages (polyc/frontends/onnx/stages.py): values the plan must know that the model
computes from its data (a Reshape's shape, an If's condition, a NonZero's count), learned by
running the plan up to the node that needs them; and the operators whose output shapes come
from data (NonZero, Compress), against onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx import stages  # noqa: E402

_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def model_of(nodes, inputs: dict, outputs: dict, initializers=(), opset: int = 17):
    """``inputs``: name -> example array; ``outputs``: name -> (element type, rank), with
    symbolic sizes."""
    graph = helper.make_graph(
        nodes,
        "stages",
        [helper.make_tensor_value_info(name, _TYPES[a.dtype], list(a.shape)) for name, a in inputs.items()],
        [
            helper.make_tensor_value_info(name, element, [f"{name}_{d}" for d in range(rank)])
            for name, (element, rank) in outputs.items()
        ],
        [numpy_helper.from_array(np.asarray(array), name) for name, array in dict(initializers).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def same_as_onnxruntime(session, model, feeds):
    ours = session.run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, expected in zip(ours, theirs, strict=True):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    return ours


def _reshaped_by_data():
    """y = relu(x viewed as (max(x), -1)): a shape computed from the values of x."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["largest"], keepdims=1),
        helper.make_node("Cast", ["largest"], ["rows"], to=TensorProto.INT64),
        helper.make_node("Concat", ["rows", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["viewed"], name="reshape"),
        helper.make_node("Relu", ["viewed"], ["y"]),
    ]
    return model_of(
        nodes, {"x": np.zeros(12, np.float32)}, {"y": (TensorProto.FLOAT, 2)}, {"rest": np.array([-1], np.int64)}
    )


def test_a_shape_computed_from_data_is_learned_and_each_value_planned_once():
    model = _reshaped_by_data()
    session = ponnx.InferenceSession(model)
    assert "the rest is planned once 'shape' is known" in session.tc_source()  # before any run
    x = np.array([3, -1, 2, 0, 1, 2, -3, 0, 1, 1, 0, 2], np.float32)
    given = x.copy()
    assert same_as_onnxruntime(session, model, {"x": x})[0].shape == (3, 4)
    np.testing.assert_array_equal(x, given)  # the feed is not modified
    assert len(session.plans()) == 2  # the stage computing the shape, and the rest for (3, 4)
    x[0] = 6
    assert same_as_onnxruntime(session, model, {"x": x})[0].shape == (6, 2)
    x[0] = 3
    same_as_onnxruntime(session, model, {"x": x})
    assert len(session.plans()) == 3  # (3, 4) planned once
    # What it did: the stages the last run took, each its kernels.
    source = session.tc_source()
    assert "# ---- stage 2, planned once 'shape' was known" in source
    assert session.groups[-1] == ["y"] or session.groups[-1][-1].startswith("Relu")
    assert len(session.kernels()) == len(session.groups)


def test_a_bad_shape_computed_from_data_is_an_error_naming_the_node_and_the_session_goes_on():
    model = _reshaped_by_data()
    session = ponnx.InferenceSession(model)
    x = np.ones(12, np.float32)
    x[0] = 5  # 12 elements do not make 5 rows
    with pytest.raises(polyc.PolycError, match="reshape"):
        session.run(None, {"x": x})
    x[0] = 4
    assert same_as_onnxruntime(session, model, {"x": x})[0].shape == (4, 3)


def test_the_plans_kept_per_stage_are_bounded(monkeypatch):
    monkeypatch.setattr(stages, "MAX_PLANS_PER_STAGE", 2)
    model = _reshaped_by_data()
    session = ponnx.InferenceSession(model)
    for rows in (1, 2, 3, 4, 6, 2, 1):
        x = np.zeros(12, np.float32)
        x[0] = rows
        assert same_as_onnxruntime(session, model, {"x": x})[0].shape == (rows, 12 // rows)
    assert len(session.plans()) == 3


def test_a_stage_after_channels_last_convolutions():
    # The plan stops inside a run of NHWC convolutions: the values the rest reads go back to
    # NCHW, as the rest plans them.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    weights = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["features"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["features"], ["active"]),
        helper.make_node("ReduceMax", ["active"], ["peak"], keepdims=0),
        helper.make_node("Greater", ["peak", "threshold"], ["strong"]),
        helper.make_node(
            "If",
            ["strong"],
            ["pooled"],
            then_branch=helper.make_graph(
                [helper.make_node("GlobalMaxPool", ["active"], ["most"])],
                "then",
                [],
                [helper.make_tensor_value_info("most", TensorProto.FLOAT, None)],
            ),
            else_branch=helper.make_graph(
                [helper.make_node("GlobalAveragePool", ["active"], ["mean"])],
                "else",
                [],
                [helper.make_tensor_value_info("mean", TensorProto.FLOAT, None)],
            ),
        ),
    ]
    model = model_of(
        nodes, {"x": x}, {"pooled": (TensorProto.FLOAT, 4)}, {"w": weights, "threshold": np.array(2.0, np.float32)}
    )
    session = ponnx.InferenceSession(model)
    for scale in (1.0, 0.01):
        same_as_onnxruntime(session, model, {"x": x * np.float32(scale)})
    assert len(session.plans()) == 3


def test_profile_and_kernel_inputs_cover_every_stage():
    model = _reshaped_by_data()
    session = ponnx.InferenceSession(model)
    x = np.arange(12, dtype=np.float32) % 4
    times = session.profile({"x": x}, repeat=2)
    assert [t.nodes for t in times] == session.groups
    calls = session.kernel_inputs({"x": x})
    assert [group.nodes for group, _ in calls] == session.groups


def _nonzero_model(example):
    nodes = [helper.make_node("NonZero", ["x"], ["found"], name="nz"), helper.make_node("Add", ["found", "one"], ["y"])]
    return model_of(nodes, {"x": example}, {"y": (TensorProto.INT64, 2)}, {"one": np.array(1, np.int64)})


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 5), (64, 91)])
def test_nonzero(shape):
    rng = np.random.default_rng(len(shape))
    model = _nonzero_model(np.zeros(shape, np.float32))
    session = ponnx.InferenceSession(model)
    for density in (0.0, 0.3, 1.0):
        x = np.where(rng.random(shape) < density, rng.standard_normal(shape), 0).astype(np.float32)
        if x.size > 2:
            x.reshape(-1)[1] = np.nan  # NaN is nonzero
        (y,) = same_as_onnxruntime(session, model, {"x": x})
        np.testing.assert_array_equal(y, np.array(np.nonzero(x)) + 1)


def test_nonzero_of_a_vector_shares_its_kernels_between_counts_of_one_padded_length():
    """A detector's count of scores above a threshold is new in most images: NonZero of a
    vector computes on a padded count (37 and 39 both on 40), and its output, a graph output
    here, is the prefix of the padded one."""
    model = model_of(
        [helper.make_node("NonZero", ["x"], ["found"], name="nz")],
        {"x": np.zeros(300, np.float32)},
        {"found": (TensorProto.INT64, 2)},
    )
    session = ponnx.InferenceSession(model)
    x = np.zeros(300, np.float32)

    def kernels():
        return {id(group.kernel) for plan in session.plans() for group in plan.groups}

    for count, new_kernels in ((37, None), (39, 0), (33, 0), (300, None), (9, None)):
        x[:] = 0
        x[np.random.default_rng(count).permutation(300)[:count]] = 1
        before = kernels()
        (found,) = same_as_onnxruntime(session, model, {"x": x})
        np.testing.assert_array_equal(found, np.array(np.nonzero(x)))
        if new_kernels is not None:
            assert len(kernels() - before) == new_kernels, count


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.int64])
def test_nonzero_of_integers_and_bools(dtype):
    x = (np.arange(12).reshape(3, 4) % 3 == 1) if dtype is np.bool_ else (np.arange(12).reshape(3, 4) % 3 - 1)
    x = x.astype(dtype)
    model = _nonzero_model(x)
    (y,) = same_as_onnxruntime(ponnx.InferenceSession(model), model, {"x": x})
    np.testing.assert_array_equal(y, np.array(np.nonzero(x)) + 1)


@pytest.mark.parametrize("axis, entries", [(0, 3), (1, 4), (None, 5), (-1, 2)])
def test_compress(axis, entries):
    rng = np.random.default_rng(entries)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    attributes = {} if axis is None else {"axis": axis}
    model = model_of(
        [helper.make_node("Compress", ["x", "condition"], ["y"], **attributes)],
        {"x": x, "condition": np.zeros(entries, np.bool_)},
        {"y": (TensorProto.FLOAT, 1 if axis is None else 2)},
    )
    session = ponnx.InferenceSession(model)
    for density in (0.0, 0.5, 1.0):
        condition = rng.random(entries) < density
        (y,) = same_as_onnxruntime(session, model, {"x": x, "condition": condition})
        np.testing.assert_array_equal(y, np.compress(condition, x, axis=axis))


def test_compress_with_a_condition_longer_than_its_axis_is_an_error():
    x = np.zeros((3, 4), np.float32)
    model = model_of(
        [helper.make_node("Compress", ["x", "condition"], ["y"], name="pick", axis=0)],
        {"x": x, "condition": np.zeros(5, np.bool_)},
        {"y": (TensorProto.FLOAT, 2)},
    )
    with pytest.raises(polyc.PolycError, match=r"'pick' \(Compress\): the condition has 5 entries, more than the 3"):
        ponnx.InferenceSession(model).run(None, {"x": x, "condition": np.ones(5, np.bool_)})


def test_boxes_above_a_score_threshold():
    # A detection head's filtering: the boxes whose best class score passes a threshold, their
    # count known only from the scores.
    rng = np.random.default_rng(7)
    scores = rng.random((50, 6)).astype(np.float32)
    boxes = rng.random((50, 4)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMax", ["scores"], ["best"], axes=[1], keepdims=0),
        helper.make_node("Greater", ["best", "threshold"], ["kept"]),
        helper.make_node("Compress", ["boxes", "kept"], ["chosen"], axis=0),
        helper.make_node("Compress", ["best", "kept"], ["chosen_scores"], axis=0),
    ]
    model = model_of(
        nodes,
        {"scores": scores, "boxes": boxes},
        {"chosen": (TensorProto.FLOAT, 2), "chosen_scores": (TensorProto.FLOAT, 1)},
        {"threshold": np.array(0.8, np.float32)},
    )
    session = ponnx.InferenceSession(model)
    for shift in (0.0, 0.1, -0.5):
        feeds = {"scores": np.clip(scores + np.float32(shift), 0, 1), "boxes": boxes}
        chosen, _ = same_as_onnxruntime(session, model, feeds)
        assert chosen.shape[1] == 4


def _suppression_model(batches, classes, count, center_point_box=0, score_threshold=True, limit_input=False):
    inputs = ["boxes", "scores", "limit", "iou"] + (["least_score"] if score_threshold else [])
    feeds = {
        "boxes": np.zeros((batches, count, 4), np.float32),
        "scores": np.zeros((batches, classes, count), np.float32),
    }
    constants = {"iou": np.array([0.4], np.float32)}
    if score_threshold:
        constants["least_score"] = np.array([0.3], np.float32)
    if limit_input:
        feeds["limit"] = np.array([1], np.int64)
    else:
        constants["limit"] = np.array([7], np.int64)
    node = helper.make_node("NonMaxSuppression", inputs, ["selected"], name="nms", center_point_box=center_point_box)
    return model_of([node], feeds, {"selected": (TensorProto.INT64, 2)}, constants, opset=11)


@pytest.mark.parametrize(
    "batches, classes, count, center_point_box, score_threshold, limit_input",
    [(1, 1, 20, 0, True, False), (2, 3, 40, 1, False, False), (1, 2, 120, 0, True, True)],
)
def test_non_max_suppression(batches, classes, count, center_point_box, score_threshold, limit_input):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(count)
    model = _suppression_model(batches, classes, count, center_point_box, score_threshold, limit_input)
    session = ponnx.InferenceSession(model)
    for trial in range(2):
        corner = rng.random((batches, count, 2)).astype(np.float32) * 10
        size = rng.random((batches, count, 2)).astype(np.float32) * 3 + 0.5
        boxes = np.concatenate([corner, corner + size] if center_point_box == 0 else [corner, size], axis=-1)
        if center_point_box == 0:
            boxes[..., ::2] = boxes[..., ::2][..., ::-1]  # any two opposite corners
        feeds = {"boxes": boxes, "scores": rng.random((batches, classes, count)).astype(np.float32)}
        if limit_input:
            feeds["limit"] = np.array([4 + 100 * trial], np.int64)
        selected = same_as_onnxruntime(session, model, feeds)[0]
        np.testing.assert_array_equal(selected, ReferenceEvaluator(model).run(None, feeds)[0])
        assert len(selected) > 1


@pytest.mark.parametrize(
    "batches, classes, count, grouped, bits",
    [
        (1, 1, 2500, True, True),
        (2, 2, 2100, True, True),
        (1, 1, 2200, False, True),
        (1, 1, 2500, True, False),
        (1, 1, 2200, False, False),
    ],
)
def test_non_max_suppression_compares_boxes_of_blocks_that_meet(batches, classes, count, grouped, bits, monkeypatch):
    """From CULL_FROM_BOXES boxes on, a box is compared only with the boxes of the blocks
    whose extents meet its block's: boxes given group by group, moved apart by group (as
    torchvision's batched NMS gives them), take that way; boxes spread in no order compare every
    pair.  Which boxes could suppress which is decided once, as bits, unless the bits would be
    too many (``bits`` False: every step compares the boxes).  Tied scores (taken by index), a
    NaN box and boxes of no area included."""
    from onnx.reference import ReferenceEvaluator

    from polyc.frontends.onnx.ops import data_dependent

    assert count >= data_dependent.CULL_FROM_BOXES
    if not bits:
        monkeypatch.setattr(data_dependent, "MAX_SUPPRESSOR_BYTES", 0)
    rng = np.random.default_rng(count)
    model = _suppression_model(batches, classes, count)
    limit = next(i for i in model.graph.initializer if i.name == "limit")
    limit.CopyFrom(numpy_helper.from_array(np.array([count], np.int64), "limit"))
    session = ponnx.InferenceSession(model)
    corner = rng.random((batches, count, 2)).astype(np.float32) * 10
    if grouped:
        corner += (np.arange(count) * 40 // count * 15).astype(np.float32)[None, :, None]
    size = rng.random((batches, count, 2)).astype(np.float32) * 3 + 0.5
    boxes = np.concatenate([corner, corner + size], axis=-1)
    boxes[0, 5] = np.nan
    boxes[0, 7, 2:] = boxes[0, 7, :2]  # no area
    feeds = {"boxes": boxes, "scores": rng.integers(0, 40, (batches, classes, count)).astype(np.float32) / 40}
    selected = same_as_onnxruntime(session, model, feeds)[0]
    np.testing.assert_array_equal(selected, ReferenceEvaluator(model).run(None, feeds)[0])
    assert len(selected) > 100
    source = session.tc_source()
    if bits:  # the bits over the partner slots of each box of each block, or over every box
        culled = re.search(r"\(i0, i1, k, l, w\) \+=! ", source)
        assert bool(culled) == grouped and re.search(r"max=! \(?bitand\(", source)
    else:  # each step's comparisons, over the partners' boxes
        culled = re.search(r"max=! .* where .*\br in 0:\d+$", source, re.MULTILINE)
        assert bool(culled) == grouped and not re.search(r"max=! \(?bitand\(", source)


def test_non_max_suppression_selecting_nothing_and_bad_boxes():
    model = _suppression_model(1, 1, 5)
    feeds = {"boxes": np.ones((1, 5, 4), np.float32), "scores": np.full((1, 1, 5), 0.1, np.float32)}
    (selected,) = same_as_onnxruntime(ponnx.InferenceSession(model), model, feeds)
    assert selected.shape == (0, 3)  # every score under the threshold
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 3
    with pytest.raises(polyc.PolycError, match=r"'nms' \(NonMaxSuppression\): boxes must have shape"):
        ponnx.InferenceSession(model).run(None, {**feeds, "boxes": np.ones((1, 5, 3), np.float32)})


@pytest.mark.parametrize(
    "shape, axis, sort, dtype",
    [
        ((30,), None, 1, np.int64),
        ((30,), None, 0, np.int64),
        ((4, 6), None, 1, np.float32),
        ((8, 3), 0, 1, np.float32),
        ((3, 8), 1, 0, np.int64),
        ((2, 6, 2), -2, 1, np.int8),
    ],
)
def test_unique(shape, axis, sort, dtype):
    rng = np.random.default_rng(len(shape) + sort)
    attributes = {"sorted": sort} if axis is None else {"sorted": sort, "axis": axis}
    node = helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attributes)
    rank = 1 if axis is None else len(shape)
    model = model_of(
        [node],
        {"x": np.zeros(shape, dtype)},
        {
            "y": (_TYPES[np.dtype(dtype)], rank),
            "first": (TensorProto.INT64, 1),
            "inverse": (TensorProto.INT64, 1),
            "counts": (TensorProto.INT64, 1),
        },
    )
    session = ponnx.InferenceSession(model)
    for trial in range(2):
        x = rng.integers(0, 3 + 3 * trial, shape).astype(dtype)
        y, first, inverse, counts = same_as_onnxruntime(session, model, {"x": x})
        if sort:  # numpy's unique sorts; onnxruntime's agrees
            expected = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
            for got, want in zip((y, first, inverse, counts), expected, strict=True):
                np.testing.assert_array_equal(got, want.reshape(got.shape))


def _pool_and_unpool(shape, kernel, strides, pads):
    window = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    nodes = [
        helper.make_node("MaxPool", ["x"], ["pooled", "where"], **window),
        helper.make_node("Relu", ["pooled"], ["active"]),
        helper.make_node("MaxUnpool", ["active", "where"], ["y"], name="unpool", **window),
    ]
    return model_of(nodes, {"x": np.zeros(shape, np.float32)}, {"y": (TensorProto.FLOAT, len(shape))}, opset=12)


@pytest.mark.parametrize(
    "shape, kernel, strides, pads",
    [
        ((2, 3, 16, 16), [2, 2], [2, 2], [0, 0, 0, 0]),
        ((1, 2, 9, 11), [3, 3], [2, 2], [1, 1, 1, 1]),
        ((1, 2, 12), [3], [1], [0, 0]),
    ],
)
def test_max_unpool_of_a_max_pool_reads_only_the_windows(shape, kernel, strides, pads):
    # Overlapping windows (kernel 3, stride 2 or 1) may pick one element twice: the last wins.
    model = _pool_and_unpool(shape, kernel, strides, pads)
    session = ponnx.InferenceSession(model)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    same_as_onnxruntime(session, model, {"x": x})
    assert not any("ScatterND" in name for group in session.groups for name in group)  # the fast kernel


def test_max_unpool_of_indices_from_anywhere_and_out_of_range():
    from onnx.reference import ReferenceEvaluator

    x = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2)
    window = {"kernel_shape": [2, 2], "strides": [2, 2]}
    node = helper.make_node("MaxUnpool", ["x", "where", "shape"], ["y"], name="unpool", **window)
    model = model_of(
        [node],
        {"x": x, "where": np.zeros((1, 2, 2, 2), np.int64)},
        {"y": (TensorProto.FLOAT, 4)},
        {"shape": np.array([1, 2, 5, 4], np.int64)},
    )
    session = ponnx.InferenceSession(model)
    scattered = np.array([31, 0, 5, 5, 17, 2, 30, 16], np.int64).reshape(1, 2, 2, 2)  # across channels, repeated
    for where in (scattered, np.array([0, 3, 9, 15, 16, 18, 25, 31], np.int64).reshape(1, 2, 2, 2)):
        (y,) = session.run(None, {"x": x, "where": where})
        np.testing.assert_array_equal(y, ReferenceEvaluator(model).run(None, {"x": x, "where": where})[0])
    with pytest.raises(polyc.PolycError, match=r"\(nodes unpool/.*ScatterND.*\): .* out of range"):
        session.run(None, {"x": x, "where": np.where(scattered == 31, 32, scattered)})
    with pytest.raises(polyc.PolycError, match=r"'unpool' \(MaxUnpool\): its output shape \[1, 2, 3, 4\] must hold"):
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([1, 2, 3, 4], np.int64), "shape"))
        ponnx.InferenceSession(model).run(None, {"x": x, "where": scattered})


def test_values_passing_through_stages_reach_the_user_as_copies():
    # x goes through the first stage to the second uncopied; the user's outputs never share
    # memory with the feeds.
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["largest"], keepdims=1),
        helper.make_node("Cast", ["largest"], ["rows"], to=TensorProto.INT64),
        helper.make_node("Concat", ["rows", "rest"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["viewed"]),
        helper.make_node("Identity", ["x"], ["same"]),
    ]
    model = model_of(
        nodes,
        {"x": np.zeros(12, np.float32)},
        {"viewed": (TensorProto.FLOAT, 2), "same": (TensorProto.FLOAT, 1)},
        {"rest": np.array([-1], np.int64)},
    )
    x = np.arange(12, dtype=np.float32) % 4
    viewed, same = same_as_onnxruntime(ponnx.InferenceSession(model), model, {"x": x})
    assert viewed.shape == (3, 4)
    viewed[...] = -1
    same[...] = -1
    np.testing.assert_array_equal(x, np.arange(12, dtype=np.float32) % 4)
