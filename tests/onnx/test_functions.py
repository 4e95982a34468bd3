"""Nodes that stand for other nodes (polyc/frontends/onnx/functions.py): operators ONNX defines
as functions, expanded into their bodies where polyc has no converter, and If, replaced by the
branch its condition (known when planning) selects; against onnxruntime, onnx's reference and
numpy.  And the operators converted alongside (ReduceLogSum, ReduceLogSumExp, DepthToSpace,
SpaceToDepth)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402

_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
}


def model_of(nodes, inputs: dict, outputs, initializers=(), opset: int = 23, ranks=None):
    """``nodes`` as a model with inputs of the arrays' types and shapes and float ``outputs``: their
    shapes as onnx infers them, or of the rank in ``ranks`` (name -> rank) with symbolic sizes."""
    graph = helper.make_graph(
        nodes,
        "functions",
        [helper.make_tensor_value_info(name, _TYPES[a.dtype], list(a.shape)) for name, a in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    for output in model.graph.output:
        if not output.type.tensor_type.HasField("shape"):
            for d in range((ranks or {})[output.name]):
                output.type.tensor_type.shape.dim.add().dim_param = f"{output.name}_{d}"
    return model


def onnxruntime_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_rms_normalization_is_expanded_and_fused():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    scale = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "scale")
    model = model_of(
        [helper.make_node("RMSNormalization", ["x", "scale"], ["y"], name="rms", axis=-1, epsilon=1e-5)],
        {"x": x},
        ["y"],
        [scale],
    )
    session = ponnx.InferenceSession(model)
    (ours,) = session.run(None, {"x": x})
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * numpy_helper.to_array(scale)
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, onnxruntime_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # The body's nodes carry the node's name, and graph fusion puts them back together.
    body = [name for group in session.groups for name in group]
    assert body and all(name.startswith("rms/") for name in body)
    assert len(session.groups) <= 2, session.groups


@pytest.mark.parametrize("causal", [0, 1])
def test_grouped_query_attention_against_onnxruntime(causal):
    # 4 query heads share 2 key/value heads; 3-D inputs (batch, sequence, heads x head size).
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 6, 4 * 8)).astype(np.float32)
    k = rng.standard_normal((2, 6, 2 * 8)).astype(np.float32)
    v = rng.standard_normal((2, 6, 2 * 8)).astype(np.float32)
    node = helper.make_node(
        "Attention", ["q", "k", "v"], ["y"], name="attention", q_num_heads=4, kv_num_heads=2, is_causal=causal
    )
    model = model_of([node], {"q": q, "k": k, "v": v}, ["y"])
    feeds = {"q": q, "k": k, "v": v}
    (ours,) = ponnx.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(ours, onnxruntime_run(model, feeds)[0], rtol=1e-3, atol=1e-6)


def test_a_converter_wins_over_the_function():
    # LayerNormalization has a function body in its schema, but polyc's converter handles it.
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    model = model_of(
        [helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="ln")], {"x": x}, ["y"], [scale], opset=17
    )
    session = ponnx.InferenceSession(model)
    assert session.groups == [["ln"]]


def test_a_function_whose_body_polyc_cannot_convert_is_named_with_the_reason():
    x = np.full((2, 3), 0.5, np.float32)
    nodes = [
        helper.make_node("Bernoulli", ["x"], ["coin"], name="coin"),
        helper.make_node("Multinomial", ["coin"], ["draw"], name="draw"),
    ]
    model = model_of(nodes, {"x": x}, ["draw"], opset=22, ranks={"draw": 2})
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32  # Multinomial's
    with pytest.raises(polyc.UnsupportedError) as caught:
        ponnx.InferenceSession(model)
    message = str(caught.value)
    assert "2 node(s)" in message
    assert "Bernoulli (opset 22) at node 'coin' (its ONNX function uses RandomUniformLike)" in message
    assert "[unsupported: Bernoulli, Multinomial]" in message


def test_affine_grid_whose_body_branches_on_an_attribute():
    # AffineGrid's body holds an If on align_corners (a constant once the body is built).
    theta = np.random.default_rng(5).standard_normal((2, 2, 3)).astype(np.float32)
    size = numpy_helper.from_array(np.array([2, 3, 4, 5], np.int64), "size")
    for align in (0, 1):
        model = model_of(
            [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)],
            {"theta": theta},
            ["grid"],
            [size],
            opset=20,
        )
        (ours,) = ponnx.InferenceSession(model).run(None, {"theta": theta})
        np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, {"theta": theta})[0], rtol=1e-5, atol=1e-6)


def _branching_model(condition_nodes, inputs):
    """y = x * 2 when the condition holds, else x - 1 (the else branch with an initializer)."""
    then_graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["twice"])],
        "then",
        [],
        [helper.make_tensor_value_info("twice", TensorProto.FLOAT, None)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["less"])],
        "else",
        [],
        [helper.make_tensor_value_info("less", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1, np.float32), "one")],
    )
    node = helper.make_node("If", ["condition"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)
    return model_of(condition_nodes + [node], inputs, ["y"], opset=17, ranks={"y": 2})


def test_if_on_a_shape_takes_the_branch_the_shape_selects():
    # condition: x has more than 3 rows.  Each shape is planned with its own branch.
    three = numpy_helper.from_array(np.array(3, np.int64), "three")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),
        helper.make_node("Greater", ["rows", "three"], ["condition"]),
    ]
    model = _branching_model(nodes, {"x": np.zeros((2, 2), np.float32)})
    model.graph.initializer.extend([three, zero])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "rows"
    session = ponnx.InferenceSession(model)
    for rows in (2, 5):
        x = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
        (ours,) = session.run(None, {"x": x})
        np.testing.assert_array_equal(ours, onnxruntime_run(model, {"x": x})[0])
        np.testing.assert_array_equal(ours, x * 2 if rows > 3 else x - 1)


def test_if_on_an_input_specialises_the_plan_and_on_data_is_learned_by_a_stage():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    model = _branching_model([], {"x": x, "condition": np.array(True)})
    session = ponnx.InferenceSession(model)
    for condition in (True, False):
        feeds = {"x": x, "condition": np.array(condition)}
        np.testing.assert_array_equal(session.run(None, feeds)[0], onnxruntime_run(model, feeds)[0])
    assert len(session._plans) == 2
    # A condition computed from a float tensor's values: the plan stops to learn it (stages.py).
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["condition"]),
    ]
    model = _branching_model(nodes, {"x": x})
    model.graph.initializer.append(numpy_helper.from_array(np.array(0, np.float32), "zero"))
    session = ponnx.InferenceSession(model)
    for sign in (1, -1, 1):
        feeds = {"x": sign * x}
        np.testing.assert_array_equal(session.run(None, feeds)[0], onnxruntime_run(model, feeds)[0])
    assert len(session._plans) == 1 and len(session.plans()) == 3  # the first stage, one rest per branch


def test_an_integer_input_computed_into_pads_specialises_the_plan():
    # CenterCropPad's body turns the target shape into Slice starts and Pad pads by arithmetic:
    # the session plans once per distinct target shape, and the user's feeds stay as given.
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(2, 5, 6)
    model = model_of(
        [helper.make_node("CenterCropPad", ["x", "shape"], ["y"], axes=[1, 2])],
        {"x": x, "shape": np.array([3, 8], np.int64)},
        ["y"],
        opset=18,
        ranks={"y": 3},
    )
    session = ponnx.InferenceSession(model)
    for shape in ([3, 8], [5, 4], [7, 6]):
        feeds = {"x": x, "shape": np.array(shape, np.int64)}
        before = {k: v.copy() for k, v in feeds.items()}
        (ours,) = session.run(None, feeds)
        np.testing.assert_array_equal(ours, onnxruntime_run(model, feeds)[0])
        assert all(np.array_equal(feeds[k], before[k]) for k in feeds)
    assert len(session._plans) == 3


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_log_sum_exp_does_not_overflow(keepdims):
    # exp(100) overflows float32; the converter subtracts the max first.  A slice of -inf
    # only gives -inf, as log(sum(exp)) does.
    x = np.random.default_rng(3).standard_normal((3, 4, 5)).astype(np.float32) * 3 + 100
    x[1, :, 2] = -np.inf
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=keepdims),
        helper.make_node("ReduceLogSum", ["e", "axes"], ["ls"], keepdims=keepdims),
        helper.make_node("Exp", ["small"], ["e"]),
        helper.make_node("Sub", ["x", "hundred"], ["small"]),
    ]
    hundred = numpy_helper.from_array(np.array(100, np.float32), "hundred")
    model = model_of([nodes[0], nodes[3], nodes[2], nodes[1]], {"x": x}, ["lse", "ls"], [axes, hundred], opset=18)
    lse, ls = ponnx.InferenceSession(model).run(None, {"x": x})
    with np.errstate(divide="ignore"):
        expected = np.log(np.sum(np.exp(x.astype(np.float64) - 100), axis=1, keepdims=bool(keepdims))) + 100
    np.testing.assert_allclose(lse, expected, rtol=1e-6)
    np.testing.assert_allclose(ls, expected - 100, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back_against_onnxruntime(mode):
    x = np.random.default_rng(4).standard_normal((2, 12, 3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("DepthToSpace", ["x"], ["up"], blocksize=2, mode=mode),
        helper.make_node("SpaceToDepth", ["up"], ["down"], blocksize=2),
    ]
    model = model_of(nodes, {"x": x}, ["up", "down"], opset=13)
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = onnxruntime_run(model, {"x": x})
    for got, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, expected)
    if mode == "DCR":
        np.testing.assert_array_equal(ours[1], x)  # SpaceToDepth (DCR before opset 28) inverts DCR
    # From opset 28 SpaceToDepth has modes too, each the inverse of DepthToSpace's.
    nodes[1] = helper.make_node("SpaceToDepth", ["up"], ["down"], blocksize=2, mode=mode)
    model = model_of(nodes, {"x": x}, ["up", "down"], opset=28)
    np.testing.assert_array_equal(ponnx.InferenceSession(model).run(None, {"x": x})[1], x)


def test_depth_to_space_names_a_bad_block_size():
    x = np.zeros((1, 6, 2, 2), np.float32)
    model = model_of(
        [helper.make_node("DepthToSpace", ["x"], ["y"], name="d2s", blocksize=2)], {"x": x}, ["y"], opset=13
    )
    with pytest.raises(polyc.PolycError, match=r"node 'd2s' \(DepthToSpace\): 6 channels are not a multiple"):
        ponnx.InferenceSession(model).run(None, {"x": x})


def _scan_model(steps: int = 5):
    """A Scan with two states (a running sum and a running max) and two scan inputs, one read
    backwards along its axis 1, whose body also reads a value of the graph around it; its
    scan outputs are stacked along axis 1, one of them backwards."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["sum_in", "a"], ["sum_out"]),
            helper.make_node("Mul", ["b", "outer_scale"], ["scaled"]),
            helper.make_node("Max", ["max_in", "scaled"], ["max_out"]),
            helper.make_node("Identity", ["sum_out"], ["sums"]),
            helper.make_node("Sub", ["max_out", "sum_out"], ["gaps"]),
        ],
        "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("sum_in", "max_in", "a", "b")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("sum_out", "max_out", "sums", "gaps")],
    )
    node = helper.make_node(
        "Scan",
        ["sum0", "max0", "xs", "ys"],
        ["sum", "max", "all_sums", "all_gaps"],
        name="scan",
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, 1],
        scan_input_directions=[0, 1],
        scan_output_axes=[1, 0],
        scan_output_directions=[0, 1],
    )
    rng = np.random.default_rng(17)
    feeds = {
        "sum0": np.zeros(3, np.float32),
        "max0": np.full(3, -5, np.float32),
        "xs": rng.standard_normal((steps, 3)).astype(np.float32),
        "ys": rng.standard_normal((3, steps)).astype(np.float32),
    }
    scale = numpy_helper.from_array(np.array([1, 2, 3], np.float32), "outer_scale")
    model = model_of(
        [node],
        feeds,
        ["sum", "max", "all_sums", "all_gaps"],
        [scale],
        opset=16,
        ranks={"sum": 1, "max": 1, "all_sums": 2, "all_gaps": 2},
    )
    return model, feeds


def test_scan_is_unrolled_over_its_sequence():
    model, feeds = _scan_model()
    ours = ponnx.InferenceSession(model).run(None, feeds)
    theirs = onnxruntime_run(model, feeds)
    for got, expected in zip(ours, theirs, strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(ours[0], feeds["xs"].sum(axis=0), rtol=1e-6)


def test_scan_inputs_of_different_lengths_are_named():
    model, feeds = _scan_model()
    feeds["ys"] = feeds["ys"][:, :4]
    model.graph.input[3].type.tensor_type.shape.dim[1].dim_value = 4
    with pytest.raises(polyc.UnsupportedError, match=r"node 'scan' \(Scan\): scan inputs of lengths \[4, 5\]"):
        ponnx.InferenceSession(model).run(None, feeds)


def _loop_model(stop_after=None):
    """A Loop of trip count x's row count (from its shape), carrying a running product and
    stacking each iteration's row times the product; with ``stop_after``, its condition turns
    false once the iteration number reaches it (known while planning)."""
    nodes = [
        helper.make_node("Gather", ["x", "iteration"], ["row"], axis=0),
        helper.make_node("Mul", ["product_in", "row"], ["product_out"]),
        helper.make_node("Add", ["product_out", "row"], ["stacked"]),
    ]
    if stop_after is None:
        nodes.append(helper.make_node("Identity", ["condition_in"], ["condition_out"]))
    else:
        nodes.append(helper.make_node("Less", ["iteration", "last"], ["condition_out"]))
    body = helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("condition_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("product_in", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("condition_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("product_out", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("stacked", TensorProto.FLOAT, [3]),
        ],
    )
    outer = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"]),
        helper.make_node("Loop", ["rows", "true", "start"], ["product", "all"], name="loop", body=body),
    ]
    x = np.random.default_rng(18).uniform(0.5, 1.5, (4, 3)).astype(np.float32)
    constants = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(True), "true"),
        numpy_helper.from_array(np.ones(3, np.float32), "start"),
        numpy_helper.from_array(np.array(stop_after or 0, np.int64), "last"),
    ]
    return model_of(outer, {"x": x}, ["product", "all"], constants, opset=16, ranks={"product": 1, "all": 2}), x


@pytest.mark.parametrize("stop_after", [None, 2])
def test_loop_is_unrolled_while_its_condition_is_known(stop_after):
    model, x = _loop_model(stop_after)
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = onnxruntime_run(model, {"x": x})
    for got, expected in zip(ours, theirs, strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert ours[1].shape[0] == (4 if stop_after is None else stop_after + 1)


def test_a_loop_condition_from_tensor_data_is_learned_at_every_iteration():
    # The loop runs while every element of the running product is below 1.5 (from the data):
    # each iteration is a stage of its own, planned once its condition is known.
    model, x = _loop_model(2)
    body = model.graph.node[2].attribute[0].g
    body.node[3].CopyFrom(helper.make_node("Less", ["product_out", "limit"], ["product_small"]))
    body.node.append(helper.make_node("Cast", ["product_small"], ["small_number"], to=TensorProto.INT32))
    body.node.append(helper.make_node("ReduceMin", ["small_number"], ["smallest"], keepdims=0))
    body.node.append(helper.make_node("Cast", ["smallest"], ["condition_out"], to=TensorProto.BOOL))
    model.graph.initializer.append(numpy_helper.from_array(np.full(3, 1.5, np.float32), "limit"))
    session = ponnx.InferenceSession(model)
    counts = set()
    for scale in (0.6, 1.0, 1.4):
        feeds = {"x": x * np.float32(scale)}
        ours, theirs = session.run(None, feeds), onnxruntime_run(model, feeds)
        for got, expected in zip(ours, theirs, strict=True):
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-6)
        counts.add(ours[1].shape[0])
    assert len(counts) > 1, counts  # the data decided how many iterations ran
