"""polyc.onnx.InferenceSession: onnxruntime's API, its errors, fusion, and agreement with onnxruntime."""

from __future__ import annotations

import collections
import platform

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx import plan as plan_module  # noqa: E402


def small_cnn(opset: int = 17, image: int = 8) -> onnx.ModelProto:
    """Conv (padded, strided) + BatchNormalization + Relu, a Flatten, Gemm, Softmax; symbolic batch."""
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
        "B": rng.standard_normal(4).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 4).astype(np.float32),
        "shift": rng.standard_normal(4).astype(np.float32),
        "mean": rng.standard_normal(4).astype(np.float32),
        "var": rng.uniform(0.5, 2, 4).astype(np.float32),
        "Wf": rng.standard_normal((5, 4 * (image // 2) ** 2)).astype(np.float32) * 0.1,
        "Bf": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "Wf", "Bf"], ["g"], transB=1, name="fc"),
        helper.make_node("Softmax", ["g"], ["Y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, image, image])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.fixture(scope="module")
def model():
    return small_cnn()


@pytest.fixture(scope="module")
def session(model):
    return ponnx.InferenceSession(model)


def reference(model, x):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]


def test_matches_onnxruntime_and_the_batch_may_change(model, session):
    for batch in (2, 1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        (got,) = session.run(None, {"X": x})
        np.testing.assert_allclose(got, reference(model, x), rtol=1e-3, atol=1e-6)


def test_the_api_is_onnxruntimes(model, session):
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.shape, inp.type) == ("X", ["N", 3, 8, 8], "tensor(float)")
    assert (out.name, out.shape, out.type) == ("Y", ["N", 5], "tensor(float)")
    x = np.zeros((1, 3, 8, 8), np.float32)
    assert len(session.run(["Y"], {"X": x})) == 1 and len(session.run(None, {"X": x})) == 1
    # sess_options and providers are accepted, so switching from onnxruntime is one line
    ponnx.InferenceSession(model, None, providers=["CPUExecutionProvider"])


def test_profile_times_every_kernel_call_of_a_run(model, session):
    """profile() lists each kernel call of the plan for the feeds, in the run's order, with its
    nodes, its kernel and a median time taken inside runs; the runs' results stay right."""
    x = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32)
    times = session.profile({"X": x}, repeat=3)
    assert [t.nodes for t in times] == session.groups and len(times) >= 2
    assert [t.kernel for t in times] == session.kernels()
    assert all(t.seconds > 0 for t in times) and times[0].name in str(times[0])
    assert all(f"def {t.name}(" in session.tc_source() for t in times)
    (got,) = session.run(None, {"X": x})
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-3, atol=1e-6)
    with pytest.raises(polyc.PolycError, match="repeat must be a positive number of runs"):
        session.profile({"X": x}, repeat=0)
    with pytest.raises(polyc.SignatureError, match="Invalid rank for input: X Got: 5 Expected: 4"):
        session.profile({"X": x[..., None]})


def test_fusion_makes_fewer_kernels_with_the_same_results(model):
    # In ONNX's layout (the channels-last pass has tests of its own, test_channels_last.py).
    session = ponnx.InferenceSession(model, channels_last=False)
    x = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32)
    fused = session.run(None, {"X": x})[0]
    unfused_session = ponnx.InferenceSession(model, graph_fusion=False)
    unfused = unfused_session.run(None, {"X": x})[0]
    np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-6)
    assert len(session.groups) < len(unfused_session.groups)
    # BatchNormalization is folded into the convolution's weights ("conv+bn", a node of the
    # plan), Relu is an epilogue of its kernel; without graph fusion, three kernels.  At 4x4
    # outputs the convolution runs as a matrix product (polyc's gemm kernel) after an im2col
    # step of its own.
    assert ["bn"] in unfused_session.groups and ["conv"] in unfused_session.groups
    conv_group = next(g for g in session.groups if "relu" in g)
    assert conv_group == ["conv+bn", "relu"] and ["conv+bn"] in session.groups
    kernel = session.kernels()[session.groups.index(conv_group)]
    assert kernel_paths(kernel.stages({})) == {"contraction"}
    im2col = session.tc_source().split("# conv+bn\n")[1].split("\n}")[0]
    assert "?" in im2col and ">= 1" in im2col  # the window's reads of the padding are zeros
    source = session.tc_source()
    assert source.count("def group") == len(session.groups) and "view of" in source


def kernel_paths(stages) -> set[str]:
    parts = stages.segments or (stages,)
    return {
        "contraction" if p.contraction is not None else "convolution" if p.convolution is not None else "generic"
        for p in parts
    }


def test_larger_images_use_the_direct_convolution_kernel():
    # 16x16 outputs: more positions than MATRIX_PRODUCT_POSITIONS, so the direct kernel, with
    # the padding a kernel of its own before it and BatchNormalization and Relu as epilogues.
    from polyc.frontends.onnx.ops.convolutions import MATRIX_PRODUCT_POSITIONS

    assert all(16 * 16 > windows for windows, _ in MATRIX_PRODUCT_POSITIONS.values())
    model = small_cnn(image=32)
    session = ponnx.InferenceSession(model, channels_last=False)
    x = np.random.default_rng(3).standard_normal((2, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-3, atol=1e-6)
    conv_group = next(g for g in session.groups if "relu" in g)
    assert conv_group == ["conv+bn", "relu"]
    assert kernel_paths(session.kernels()[session.groups.index(conv_group)].stages({})) == {"convolution"}


def test_unsupported_operators_are_all_listed_at_once():
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="ok"),
        helper.make_node("Multinomial", ["a"], ["b"], name="draw"),
        helper.make_node("RandomNormalLike", ["b"], ["c"], name="normal"),
        helper.make_node("RandomUniformLike", ["c"], ["Y"], name="uniform"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
    )
    graph.output[0].type.tensor_type.shape.dim.add().dim_param = "M"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(polyc.UnsupportedError) as caught:
        ponnx.InferenceSession(model)
    message = str(caught.value)
    assert "3 node(s)" in message and "'draw'" in message and "'normal'" in message and "'uniform'" in message
    assert "Multinomial (opset 17)" in message


def test_bad_feeds_get_precise_errors(session):
    x = np.zeros((2, 3, 8, 8), np.float32)
    cases = [
        ({}, "Required inputs ('X') are missing"),
        ({"X": x, "Z": x}, "Invalid input name(s): 'Z'"),
        (
            {"X": x.astype(np.float64)},
            "Unexpected input data type for 'X'. Actual: tensor(float64), expected: tensor(float)",
        ),
        ({"X": x[0]}, "Invalid rank for input: X Got: 3 Expected: 4"),
        ({"X": np.zeros((2, 3, 9, 8), np.float32)}, "index: 2 Got: 9 Expected: 8"),
    ]
    for feed, message in cases:
        with pytest.raises(polyc.SignatureError) as caught:
            session.run(None, feed)
        assert message in str(caught.value)
    with pytest.raises(polyc.SignatureError, match="Invalid output name"):
        session.run(["nope"], {"X": x})


def test_the_users_model_is_not_modified_and_files_and_bytes_load(model, tmp_path):
    before = model.SerializeToString()
    ponnx.InferenceSession(model).run(None, {"X": np.ones((1, 3, 8, 8), np.float32)})
    assert model.SerializeToString() == before
    path = tmp_path / "model.onnx"
    path.write_bytes(before)
    x = np.ones((1, 3, 8, 8), np.float32)
    np.testing.assert_allclose(
        ponnx.InferenceSession(str(path)).run(None, {"X": x})[0], ponnx.InferenceSession(before).run(None, {"X": x})[0]
    )


def test_malformed_and_truncated_models_are_polyc_errors(model, tmp_path):
    data = model.SerializeToString()
    for bad in (data[: len(data) // 2], b"not a model at all", b""):
        with pytest.raises(polyc.PolycError):
            ponnx.InferenceSession(bad)
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:100])
    with pytest.raises(polyc.PolycError, match="truncated.onnx"):
        ponnx.InferenceSession(str(path))
    with pytest.raises(polyc.PolycError, match="no such file"):
        ponnx.InferenceSession(str(tmp_path / "missing.onnx"))
    # older than opset 7, brought there by onnx's version converter, which fails on this one (its
    # BatchNormalization adapter needs every dimension known, and the batch is symbolic)
    with pytest.raises(polyc.PolycError, match="opset 6 .*version converter could not bring it there"):
        ponnx.InferenceSession(small_cnn(opset=6))
    with pytest.raises(polyc.PolycError, match="unknown option"):
        ponnx.InferenceSession(model, tile_size=4)
    with pytest.raises(polyc.PolycError, match="loop_order is not an option of a session"):
        ponnx.InferenceSession(model, loop_order=("i", "j"))


def test_outputs_declared_without_a_shape_are_accepted_as_onnxruntime_does():
    # onnx's checker wants a shape on every graph output; exporters leave some out (the rank
    # unknown), and onnxruntime runs such models.  Shape inference fills them in.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("NonZero", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    session = ponnx.InferenceSession(model)
    assert [o.shape for o in session.get_outputs()][0] == [2, 3]
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    y, z = session.run(None, {"x": x})
    np.testing.assert_array_equal(z, np.array(np.nonzero(np.maximum(x, 0))))
    assert model.SerializeToString() == before


def test_shape_subgraphs_are_evaluated_when_compiling():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports a flatten."""
    nodes = [
        helper.make_node("Shape", ["X"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["X", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 6])],
        [
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    session = ponnx.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    x = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], np.maximum(x.reshape(4, 6), 0))
    assert session.groups == [["Relu_5"]]  # one kernel: the shape arithmetic was folded


def test_folds_are_remembered_by_their_def_and_the_values_they_fold(monkeypatch):
    """A detector folds the same shape arithmetic in every stage: a fold done before is taken
    from memory, but only for the same values (two models of one graph, other constants)."""
    from polyc.frontends.onnx import plan as plan_module

    monkeypatch.setattr(plan_module, "_FOLDED", type(plan_module._FOLDED)())
    defined = []
    real_define = polyc.api.define  # the planner's define (it imports polyc.api, a layer below it)
    monkeypatch.setattr(
        polyc.api, "define", lambda source, **kw: defined.append(kw.get("backend")) or real_define(source, **kw)
    )

    def model(constant):
        nodes = [
            helper.make_node("Mul", ["c", "two"], ["c2"]),
            helper.make_node("Exp", ["c2"], ["e"]),
            helper.make_node("Add", ["X", "e"], ["Y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])],
            [
                numpy_helper.from_array(np.asarray(constant, np.float32), "c"),
                numpy_helper.from_array(np.array(2, np.float32), "two"),
            ],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    x = np.array([0.5, -1.0, 2.0], np.float32)
    for constant, folds in (([1, 2, 3], 2), ([1, 2, 3], 0), ([0.5, 0, -1], 2)):
        defined.clear()
        (y,) = ponnx.InferenceSession(model(constant)).run(None, {"X": x})
        np.testing.assert_allclose(y, x + np.exp(2 * np.asarray(constant, np.float32)), rtol=1e-6)
        assert defined.count("interpreter") == folds


def test_cli_emits_tc_groups_and_checks_against_onnxruntime(model, tmp_path, capsys):
    from polyc.cli import main

    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["onnx", str(path), "--shape", "X=2,3,8,8", "--emit", "tc"]) == 0
    assert "def group0" in capsys.readouterr().out
    assert main(["onnx", str(path), "--shape", "X=2,3,8,8", "--emit", "groups"]) == 0
    assert "conv+bn, relu" in capsys.readouterr().out
    assert main(["onnx", str(path), "--shape", "X=2,3,8,8", "--run", "--check"]) == 0
    assert "match onnxruntime" in capsys.readouterr().out
    assert main(["onnx", str(path), "--shape", "X=2,3,8,8", "--run", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "kernels inside the runs (median of 5)" in out and "group0" in out and "conv+bn, relu" in out
    assert main(["onnx", str(tmp_path / "missing.onnx")]) == 1


def _default_build_builder():
    """A node builder for kernels built with the default flags, as a session's plan makes it."""
    from polyc.frontends.onnx.lowering import Builder
    from polyc.runtime.compiler import vector_bits

    return Builder("test", "MatMul", lambda: "t", vector_bits())


def _fully_connected(rng, k: int, n: int, trans_a: int, trans_b: int, bias_shape, alpha: float, beta: float):
    """A model of one Gemm (named "fc") by constant K x N weights (N x K with transB) and an
    optional constant bias, of a symbolic number of rows N."""
    weights = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    initializers = [numpy_helper.from_array(weights, "W")]
    inputs = ["X", "W"]
    if bias_shape is not None:
        initializers.append(numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "C"))
        inputs.append("C")
    node = helper.make_node("Gemm", inputs, ["Y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta, name="fc")
    x_shape = [k, "N"] if trans_a else ["N", k]
    graph = helper.make_graph(
        [node],
        "fc",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", n])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "trans_b,bias_shape,alpha,beta",
    [(1, (6,), 1.0, 1.0), (0, (1, 6), 0.5, 2.0), (1, (), 1.0, 1.0), (0, None, 1.0, 1.0)],
)
def test_a_one_row_gemm_is_a_matrix_vector_product(trans_b, bias_shape, alpha, beta):
    rng = np.random.default_rng(5)
    model = _fully_connected(rng, 40, 6, 0, trans_b, bias_shape, alpha, beta)
    session = ponnx.InferenceSession(model)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 40)).astype(np.float32)
        (got,) = session.run(None, {"X": x})
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": x}
        )[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        (kernel,) = session.kernels()
        contraction = kernel.stages({}).contraction
        assert contraction is not None and contraction.is_matvec == (batch == 1)


@pytest.mark.parametrize(
    "trans_a,trans_b,bias_shape,alpha,beta",
    [
        (0, 1, (100,), 1.0, 1.0),
        (0, 0, (1, 100), 0.5, 2.0),
        (1, 1, (), 1.0, 1.0),
        (0, 1, None, 1.0, 1.0),
        (0, 0, None, 1.5, 1.0),
    ],
)
def test_a_gemm_by_constant_weights_reads_them_blocked_with_zero_columns(trans_a, trans_b, bias_shape, alpha, beta):
    # A fully connected layer of a few rows (a classifier at batch 8): its constant weights,
    # transposed when transB, become W'(N / NR, K, NR) at plan time with zero columns up to a
    # whole sliver (100 columns are not a multiple of NR), and alpha and the bias apply to the
    # product's first N columns.  Against onnxruntime, for each bias form and transposition.
    from polyc.frontends.onnx.lowering import Value
    from polyc.frontends.onnx.ops.contractions import _weight_sliver

    rng = np.random.default_rng(12)
    model = _fully_connected(rng, 48, 100, trans_a, trans_b, bias_shape, alpha, beta)
    session = ponnx.InferenceSession(model)
    for batch in (3, 8):
        x = rng.standard_normal((48, batch) if trans_a else (batch, 48)).astype(np.float32)
        (got,) = session.run(None, {"X": x})
        np.testing.assert_allclose(got, reference(model, x), rtol=1e-5, atol=1e-5)
        sliver = _weight_sliver(
            _default_build_builder(),
            Value("x", x.dtype, (batch, 48)),
            Value("w", x.dtype, (48, 100), np.zeros((48, 100))),
            padded=True,
        )
        weights_read = session.plan_for({"X": x.shape}).groups[0].inputs[1]
        assert (len(weights_read.shape) == 3) == (sliver > 0)
        assert sliver == 0 or weights_read.shape == (-(-100 // sliver), 48, sliver)


@pytest.mark.parametrize("group", [1, 2])
def test_conv_transpose_with_bias_and_relu_against_onnxruntime(group):
    # A decoder's upsampling step: stride 2, padding, output_padding, groups, then Relu.
    rng = np.random.default_rng(11)
    weights = rng.standard_normal((4, 6 // group, 3, 3)).astype(np.float32)  # (C, M / group, kH, kW)
    bias = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node(
            "ConvTranspose",
            ["X", "W", "B"],
            ["t"],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            output_padding=[1, 0],
            group=group,
            name="up",
        ),
        helper.make_node("Relu", ["t"], ["Y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4, 5, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 6, 10, 11])],
        [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(bias, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model)
    for batch in (1, 2):
        x = rng.standard_normal((batch, 4, 5, 6)).astype(np.float32)
        (got,) = session.run(None, {"X": x})
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": x}
        )[0]
        assert got.shape == expected.shape == (batch, 6, 10, 11)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # Relu joins the transposed convolution's kernel; with groups through the view of the
    # grouped layout, at that layout's indices.
    assert session.groups == [["up", "relu"]]


@pytest.mark.parametrize(
    "mode,transform", [("nearest", "asymmetric"), ("linear", "half_pixel"), ("cubic", "pytorch_half_pixel")]
)
def test_resize_against_onnxruntime(mode, transform):
    # A decoder's 2x upsampling of feature maps, as torch's F.interpolate exports it.
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node(
        "Resize", ["X", "", "scales"], ["Y"], mode=mode, coordinate_transformation_mode=transform, name="up"
    )
    graph = helper.make_graph(
        [node],
        "up",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 5, 7])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3, 10, 14])],
        [scales],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    session = ponnx.InferenceSession(model)
    rng = np.random.default_rng(2)
    for batch in (2, 1):
        x = rng.standard_normal((batch, 3, 5, 7)).astype(np.float32)
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"X": x}
        )[0]
        np.testing.assert_allclose(session.run(None, {"X": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_batch_norm_folds_into_a_grouped_conv_without_bias():
    rng = np.random.default_rng(4)
    weights = {
        "W": rng.standard_normal((6, 2, 3, 3)).astype(np.float32),
        "scale": rng.uniform(0.5, 1.5, 6).astype(np.float32),
        "shift": rng.standard_normal(6).astype(np.float32),
        "mean": rng.standard_normal(6).astype(np.float32),
        "var": rng.uniform(0.5, 2, 6).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], group=2, pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["Y"], epsilon=1e-3, name="bn"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 6, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    session = ponnx.InferenceSession(model)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-4, atol=1e-5)
    assert session.groups[-1] == ["conv+bn"] and "bn" not in {n for g in session.groups for n in g}
    assert model.SerializeToString() == before


@pytest.mark.parametrize(
    "attributes, shape",
    [
        (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), (2, 3, 12, 11)),  # resnet's stem
        (dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 2, 10, 9)),  # squeezenet's
        (dict(kernel_shape=[2, 3], strides=[1, 2], pads=[1, 2, 0, 2], dilations=[2, 1]), (1, 2, 7, 9)),
        (dict(kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]), (1, 1, 3, 4)),  # edges meet
        (dict(kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER"), (2, 3, 8)),
        (dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), (1, 2, 4, 6, 5)),
    ],
    ids=["stem", "ceil", "dilated", "small-image", "1d-same", "3d"],
)
def test_max_pool_is_separable_and_agrees_with_onnxruntime(attributes, shape):
    # One unrolled max per dimension, the interior without guards, each edge position with the
    # taps inside the input; NaN-free random data (fmax and onnxruntime differ only on NaN).
    node = helper.make_node("MaxPool", ["X"], ["Y"], name="pool", **attributes)
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [f"d{i}" for i in range(len(shape))])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    session = ponnx.InferenceSession(model)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[
        0
    ]
    np.testing.assert_array_equal(session.run(None, {"X": x})[0], expected)
    source = session.tc_source()
    assert "max=!" not in source and "fmax(" in source


def test_max_pool_with_a_long_window_stays_a_reduction():
    node = helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[12], name="pool")
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, (1, 2, 16))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", "C", "W"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(6).standard_normal((1, 2, 16)).astype(np.float32)
    session = ponnx.InferenceSession(model)
    np.testing.assert_array_equal(session.run(None, {"X": x})[0], reference(model, x))
    assert "max=!" in session.tc_source()


@pytest.mark.parametrize(
    "attributes, shape, kernel, bias",
    [
        (dict(pads=[1, 1, 1, 1]), (2, 4, 9, 7), (3, 3), True),  # mobilenet's
        (dict(pads=[1, 1, 1, 1], strides=[2, 2]), (1, 3, 10, 11), (3, 3), True),
        (dict(pads=[2, 0, 2, 1], dilations=[2, 1]), (1, 2, 8, 6), (3, 3), False),
        (dict(pads=[1, 1, 1, 1]), (1, 2, 2, 1), (3, 3), True),  # no interior
        (dict(pads=[1, 2], strides=[3]), (2, 5, 13), (4,), True),
        (dict(pads=[2, 2, 2, 2]), (1, 3, 9, 9), (5, 5), True),  # the conv kernel
    ],
    ids=["3x3", "stride-2", "dilated-asymmetric", "tiny-image", "1d", "5x5"],
)
def test_depthwise_convolutions_unrolled_against_onnxruntime(attributes, shape, kernel, bias):
    # One filter per channel, then relu6 (Clip): the taps written out with the edges guarded,
    # and the Clip fused into the same kernel.
    rng = np.random.default_rng(7)
    channels = shape[1]
    initializers = [
        numpy_helper.from_array(rng.standard_normal((channels, 1, *kernel)).astype(np.float32), "W"),
        numpy_helper.from_array(np.array(0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6, np.float32), "hi"),
    ]
    if bias:
        initializers.append(numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "B"))
    nodes = [
        helper.make_node("Conv", ["X", "W"] + (["B"] if bias else []), ["c"], group=channels, name="dw", **attributes),
        helper.make_node("Clip", ["c", "lo", "hi"], ["Y"], name="relu6"),
    ]
    rank = len(shape)
    graph = helper.make_graph(
        nodes,
        "dw",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [f"d{i}" for i in range(rank)])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal(shape).astype(np.float32)
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-5, atol=1e-5)
    unrolled = kernel != (5, 5)
    assert ("+=!" not in session.tc_source()) == unrolled
    # unrolled, the edges need no padding step before the kernel
    assert session.groups == [["dw", "relu6"]] if unrolled else session.groups == [["dw"], ["dw", "relu6"]]


@pytest.mark.parametrize("strides", [1, 2])
def test_channels_last_depthwise_is_one_kernel_with_its_padding_and_activation(strides):
    # Channels last (after a convolution that takes the image to NHWC), a padded 3x3 depthwise
    # convolution is one statement with the padding in its condition, computed with the 1 x 1
    # convolution before it by polyc's pointwise + depthwise kernel; its bias and the Clip
    # after it are the kernel's epilogue, with no padding step before it and no second pass
    # over the output.
    rng = np.random.default_rng(8)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((16, 3, 1, 1)).astype(np.float32), "P"),
        numpy_helper.from_array(rng.standard_normal((16, 1, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B"),
        numpy_helper.from_array(np.array(0, np.float32), "lo"),
        numpy_helper.from_array(np.array(0.5, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "P"], ["p"], name="pointwise"),
        helper.make_node("Conv", ["p", "W", "B"], ["c"], group=16, pads=[1, 1, 1, 1], strides=[strides] * 2, name="dw"),
        helper.make_node("Clip", ["c", "lo", "hi"], ["Y"], name="relu6"),
    ]
    graph = helper.make_graph(
        nodes,
        "dw",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 10, 9])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 16, "H", "W"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 3, 10, 9)).astype(np.float32)
    session = ponnx.InferenceSession(model, channels_last=True)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-5, atol=1e-5)
    position = session.groups.index(["pointwise", "dw", "relu6"])
    source = session.kernels({"X": x.shape})[position].c_source({})
    assert "polyc pointwise + depthwise conv kernel" in source and "zero padding outside" in source
    kernel = next(part for part in session.tc_source().split("def ")[1:] if part.startswith(f"group{position}("))
    statements = [line for line in kernel.split("}")[0].splitlines() if " = " in line or "+=!" in line]
    assert len(statements) == 4 and "+=!" in statements[1] and " ? " in statements[1]


def test_three_by_three_convolutions_run_by_winograd_unless_turned_off():
    # A residual block's 3x3 convolutions (channels last, padded, with bias, the residual and
    # Relu as epilogues) take the Winograd kernel by default in a session; winograd=False
    # keeps the direct kernel.  Both agree with onnxruntime.
    rng = np.random.default_rng(9)
    weights = {
        name: (rng.standard_normal(shape) * scale).astype(np.float32)
        for name, shape, scale in [
            ("P", (32, 3, 1, 1), 0.5),
            ("W1", (32, 32, 3, 3), 0.1),
            ("B1", (32,), 1),
            ("W2", (32, 32, 3, 3), 0.1),
        ]
    }
    nodes = [
        helper.make_node("Conv", ["X", "P"], ["p"], name="stem"),
        helper.make_node("Conv", ["p", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "p"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["Y"], name="relu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 15, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 32, 15, 16])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((2, 3, 15, 16)).astype(np.float32)
    want = reference(model, x)
    for options, winograd in (({}, True), ({"winograd": False}, False)):
        session = ponnx.InferenceSession(model, **options)
        np.testing.assert_allclose(session.run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-5)
        for group in (["conv1", "relu1"], ["conv2", "add", "relu2"]):
            source = session.kernels({"X": x.shape})[session.groups.index(group)].c_source({})
            assert ("Winograd F(2x2, 3x3)" in source) == winograd, (group, options)


@pytest.mark.parametrize("channels_last", [False, True])
def test_silu_and_gelu_chains_are_epilogues_of_the_kernel_computing_their_input(channels_last):
    # SiLU (x * sigmoid(x)) after a convolution and GELU (x * (1 + erf(x / sqrt 2)) / 2) after
    # a product read x twice; the elementwise statements are substituted into each other
    # until x has one reader, which joins the kernel computing x.  Sigmoid's output is also a
    # graph output in the third chain, so it stays a tensor there.
    rng = np.random.default_rng(11)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "B"),
        numpy_helper.from_array(rng.standard_normal((10, 7)).astype(np.float32), "M"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "C"),
        numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W", "B"], ["x"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Sigmoid", ["x"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["x", "s"], ["Y"], name="silu"),
        helper.make_node("MatMul", ["Z", "M"], ["p"], name="matmul"),
        helper.make_node("Add", ["p", "C"], ["q"], name="bias"),
        helper.make_node("Div", ["q", "sqrt2"], ["d"], name="div"),
        helper.make_node("Erf", ["d"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["a"], name="plus_one"),
        helper.make_node("Mul", ["q", "a"], ["m"], name="times_x"),
        helper.make_node("Mul", ["m", "half"], ["G"], name="gelu"),
        helper.make_node("Conv", ["X", "W"], ["x2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Sigmoid", ["x2"], ["S"], name="sigmoid2"),
        helper.make_node("Mul", ["x2", "S"], ["Y2"], name="silu2"),
    ]
    graph = helper.make_graph(
        nodes,
        "chains",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4, 9, 9]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 5, 10]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 6, 9, 9]),
            helper.make_tensor_value_info("G", TensorProto.FLOAT, ["N", 5, 7]),
            helper.make_tensor_value_info("S", TensorProto.FLOAT, ["N", 6, 9, 9]),
            helper.make_tensor_value_info("Y2", TensorProto.FLOAT, ["N", 6, 9, 9]),
        ],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {
        "X": rng.standard_normal((2, 4, 9, 9)).astype(np.float32),
        "Z": rng.standard_normal((2, 5, 10)).astype(np.float32),
    }
    session = ponnx.InferenceSession(model, channels_last=channels_last)
    import onnxruntime

    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for got, want in zip(session.run(None, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    groups = session.groups
    assert any(g[0] == "conv" and g[-1] == "silu" for g in groups)
    assert any(g[0] in ("matmul", "bias") and g[-1] == "gelu" for g in groups)
    nodes = {n for g in groups for n in g}
    assert "sigmoid" not in nodes and "erf" not in nodes and "sigmoid2" in nodes


@pytest.mark.parametrize("image", [2, 7, 14])
def test_pointwise_convolutions_take_the_path_measured_faster_on_this_machine(image):
    # A 1x1 convolution is a matrix product; which kernel computes it faster depends on the
    # positions per image and on the vector width (MATRIX_PRODUCT_POSITIONS).
    from polyc.frontends.onnx.ops.convolutions import MATRIX_PRODUCT_POSITIONS
    from polyc.runtime.compiler import vector_bits

    rng = np.random.default_rng(8)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], name="pw")
    graph = helper.make_graph(
        [node],
        "pw",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8, image, image])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 16, image, image])],
        [numpy_helper.from_array(rng.standard_normal((16, 8, 1, 1)).astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model, channels_last=False)  # (in NHWC: always the gemm kernel)
    x = rng.standard_normal((1, 8, image, image)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-4, atol=1e-5)
    limit = MATRIX_PRODUCT_POSITIONS.get(vector_bits(), MATRIX_PRODUCT_POSITIONS[256])[1]
    expected = "contraction" if image * image <= limit else "convolution"
    assert kernel_paths(session.kernels()[0].stages({})) == {expected}


def test_large_initializers_are_checked_and_inferred_without_their_data():
    # onnx's checker and shape inference see the large weights as typed inputs (a skeleton),
    # so they are not serialised twice; the loaded model keeps them, and the inferred shapes.
    from polyc.frontends.onnx.model import _SKELETON_ELEMENTS, load_model

    rng = np.random.default_rng(9)
    weights = rng.standard_normal((128, _SKELETON_ELEMENTS // 64)).astype(np.float32)  # > the limit
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["Y"], name="r")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 128])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", weights.shape[1]])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded, _ = load_model(model)
    assert [t.name for t in loaded.graph.initializer] == ["W"] and [i.name for i in loaded.graph.input] == ["X"]
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), weights)
    inferred = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in loaded.graph.value_info
    }
    assert inferred["h"] == ["N", weights.shape[1]]
    x = rng.standard_normal((3, 128)).astype(np.float32)
    np.testing.assert_allclose(
        ponnx.InferenceSession(model).run(None, {"X": x})[0], reference(model, x), rtol=1e-4, atol=1e-4
    )
    bad = helper.make_model(
        helper.make_graph(
            [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm", bogus=1)],
            "g",
            graph.input,
            graph.output,
            graph.initializer,
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    with pytest.raises(polyc.PolycError, match="checker"):
        load_model(bad)


@pytest.mark.parametrize("rows", [3, 5000])
def test_products_by_constant_weights_of_few_rows_read_them_blocked(rows):
    # Up to BLOCKED_WEIGHT_ROWS rows, W(K, N) becomes W'(N / NR, K, NR) at plan time, whose
    # slivers the gemm kernel reads in place; above, the plain product packs W.  The bias and
    # the activation are epilogues either way: through the view of the blocked product as
    # (.., N), they update the product's (.., N / NR, NR) tensor at its own indices.
    from polyc.frontends.onnx.lowering import Value
    from polyc.frontends.onnx.ops.contractions import BLOCKED_WEIGHT_ROWS, _weight_sliver

    rng = np.random.default_rng(9)
    weights = rng.standard_normal((24, 128)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["P"], name="mm"),
        helper.make_node("Add", ["P", "B"], ["Q"], name="bias"),
        helper.make_node("Relu", ["Q"], ["Y"], name="act"),
    ]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, "T", 24])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "T", 128])],
        [
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model)
    x = rng.standard_normal((1, rows, 24)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-4, atol=1e-5)
    sliver = _weight_sliver(
        _default_build_builder(), Value("x", x.dtype, x.shape), Value("w", weights.dtype, weights.shape, weights)
    )
    contraction = session.kernels()[0].stages({}).contraction
    blocked = len(session.plan_for({"X": x.shape}).groups[0].inputs[1].shape) == 3
    assert blocked == (rows <= BLOCKED_WEIGHT_ROWS and sliver > 0)
    assert contraction is not None and contraction.n == (("nb", "nr") if blocked else ("i2",))
    assert session.groups == [["mm", "bias", "act"]]


@pytest.mark.parametrize("axis,views", [(1, True), (2, False)])
def test_splits_along_the_outermost_axis_are_views(axis, views):
    # (1, 6, 4) split along axis 1: each part is a contiguous run of X, a view; along axis 2
    # the parts interleave and are copied by kernels.  Each part then feeds a kernel of its own.
    rng = np.random.default_rng(10)
    nodes = [
        helper.make_node("Exp", ["X"], ["E"], name="exp"),
        helper.make_node("Split", ["E", "sizes"], ["A", "B"], axis=axis, name="split"),
        helper.make_node("Neg", ["A"], ["Y"], name="neg"),
        helper.make_node("Abs", ["B"], ["Z"], name="abs"),
    ]
    parts = [2, 4] if axis == 1 else [1, 3]
    shapes = [[1, p, 4] if axis == 1 else [1, 6, p] for p in parts]
    graph = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 6, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip("YZ", shapes)],
        [numpy_helper.from_array(np.array(parts, np.int64), "sizes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model)
    x = rng.standard_normal((1, 6, 4)).astype(np.float32)
    got = session.run(None, {"X": x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    split_kernels = [g for g in session.groups if "split" in g]
    assert (split_kernels == []) == views, session.groups
    assert ("from element 8" in session.tc_source()) == views


def residual_model() -> onnx.ModelProto:
    """Relu -> Conv -> Add(relu, conv) -> Sigmoid -> Mul(relu, sigmoid) -> Flatten -> Y, and the
    relu's output returned too: values that die at different steps, one that lives to the end."""
    rng = np.random.default_rng(12)
    nodes = [
        helper.make_node("Relu", ["X"], ["a"], name="relu"),
        helper.make_node("Conv", ["a", "W"], ["b"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Add", ["a", "b"], ["c"], name="add"),
        helper.make_node("Sigmoid", ["c"], ["d"], name="sigmoid"),
        helper.make_node("Mul", ["a", "d"], ["e"], name="mul"),
        helper.make_node("Exp", ["e"], ["f"], name="exp"),
        helper.make_node("Flatten", ["f"], ["Y"], name="flatten"),
        helper.make_node("Identity", ["a"], ["R"], name="identity"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 144]),
            helper.make_tensor_value_info("R", TensorProto.FLOAT, ["N", 4, 6, 6]),
        ],
        [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("graph_fusion", [False, True])
def test_intermediate_tensors_share_an_arena_by_their_lifetimes(graph_fusion):
    from polyc.frontends.onnx.lowering import ViewStep

    model = residual_model()
    session = ponnx.InferenceSession(model, graph_fusion=graph_fusion)
    x = np.random.default_rng(13).standard_normal((2, 4, 6, 6)).astype(np.float32)
    plan = session.plan_for({"X": x.shape})
    # Lifetimes as the plan's steps read them, views counted as reads of their source.
    root, born, last = {}, {}, {}
    for position, item in enumerate(plan.order):
        if isinstance(item, ViewStep):
            root[item.target.ident] = root.get(item.source.ident, item.source.ident)
            last[root[item.target.ident]] = position
            continue
        for value in item.inputs:
            last[root.get(value.ident, value.ident)] = position
        for value in item.outputs:
            born[value.ident] = position
    returned = {root.get(v.ident, v.ident) for v in plan.outputs}
    placed = {v.ident: v for v in plan._arena_values}
    assert placed and not returned & set(placed)
    spans = {
        ident: (plan.memory.offsets[ident], plan.memory.offsets[ident] + v.size * 4) for ident, v in placed.items()
    }
    for one in placed:
        for other in placed:
            alive_together = (
                one != other and born[one] <= last.get(other, born[other]) and born[other] <= last.get(one, born[one])
            )
            if alive_together:
                assert spans[one][1] <= spans[other][0] or spans[other][1] <= spans[one][0], (one, other)
    if not graph_fusion:  # six kernels' outputs in the arena, which reuses the memory of dead ones
        assert len(placed) >= 4 and plan.memory.size < sum(v.size * 4 for v in placed.values())
    # Right answers, and what a run returned stays the user's: the next run does not overwrite it.
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    first = session.run(None, {"X": x})
    kept = [a.copy() for a in first]
    session.run(None, {"X": -x})
    for got, want, copy in zip(first, expected, kept, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got, copy)


def test_runs_in_threads_at_the_same_time_take_arenas_of_their_own():
    import threading

    model = residual_model()
    session = ponnx.InferenceSession(model, graph_fusion=False)
    reference_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(20 + i).standard_normal((3, 4, 6, 6)).astype(np.float32) for i in range(4)]
    session.run(None, {"X": inputs[0]})  # compiled before the threads start
    failures = []

    def work(x):
        want = reference_session.run(None, {"X": x})
        for _ in range(30):
            for got, expected in zip(session.run(None, {"X": x}), want, strict=True):
                if not np.allclose(got, expected, rtol=1e-5, atol=1e-6):
                    failures.append(float(np.abs(got - expected).max()))

    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.mark.parametrize("graph_fusion", [False, True])
def test_runs_after_the_first_call_the_kernels_by_their_resolved_pointers(graph_fusion, monkeypatch):
    """From an arena's second run on, the plan calls the kernels' C functions with the pointers
    read in the first (polyc.frontends.onnx.plan._ResolvedRun), not through Kernel.__call__;
    answers stay onnxruntime's run after run, for feeds that are not C-contiguous too, and
    returned arrays stay the user's."""
    model = residual_model()
    session = ponnx.InferenceSession(model, graph_fusion=graph_fusion)
    reference_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(21).standard_normal((2, 4, 6, 6)).astype(np.float32)
    first = session.run(None, {"X": x})
    kept = [a.copy() for a in first]
    plan = session.plan_for({"X": x.shape})
    (arena,) = plan._idle_arenas
    steps = [step for step in arena.resolved.steps if isinstance(step, tuple)]
    assert len(steps) == len(plan.groups) and all(repeat is not None for _, repeat, _, _ in steps)
    checked_calls = []
    original = polyc.Kernel.__call__
    monkeypatch.setattr(
        polyc.Kernel, "__call__", lambda self, *a, **k: checked_calls.append(self) or original(self, *a, **k)
    )
    for scale in (-1.0, 2.5, 0.5):
        for got, want in zip(
            session.run(None, {"X": scale * x}), reference_session.run(None, {"X": scale * x}), strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not checked_calls
    strided = np.repeat(3 * x, 2, axis=3)[..., ::2]  # a feed that is not C-contiguous: copied first
    for got, want in zip(session.run(None, {"X": strided}), reference_session.run(None, {"X": 3 * x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not checked_calls
    for got, copy in zip(first, kept, strict=True):
        np.testing.assert_array_equal(got, copy)


def test_resolved_calls_are_one_c_call_per_stretch_and_a_kernels_error_still_stops_the_run():
    """The resolved calls up to a checked call run as one call of the sequence runner
    (polyc.runtime.sequence), with the same answers as calls made one by one (a run timed per
    kernel); a kernel's status still raises its error: an index out of range."""
    model = residual_model()
    session = ponnx.InferenceSession(model)
    x = np.random.default_rng(22).standard_normal((2, 4, 6, 6)).astype(np.float32)
    session.run(None, {"X": x})
    plan = session.plan_for({"X": x.shape})
    (arena,) = plan._idle_arenas
    sequence = arena.resolved._sequence
    runner_calls = []
    runner = sequence.runner
    sequence.runner = lambda *arguments: runner_calls.append(arguments[3]) or runner(*arguments)
    stretches = [op[2] for op in sequence.ops if op[0] == sequence.FLUSH]
    kernels = sum(isinstance(s, tuple) for s in arena.resolved.steps)
    assert sum(stretches) == kernels
    for scale in (1.0, -2.0):
        runner_calls.clear()
        one_call = session.run(None, {"X": scale * x})
        assert runner_calls == stretches
        runner_calls.clear()
        timed = plan.run({"X": scale * x}, seconds=[])
        assert runner_calls == [1] * kernels
        for output, got in zip(session.get_outputs(), one_call, strict=True):
            np.testing.assert_array_equal(got, timed[output.name])
    # a call through the checked path in the middle: two stretches around it, the same answers
    from polyc.frontends.onnx.plan import _CallSequence

    steps = list(arena.resolved.steps)
    calls = [position for position, step in enumerate(steps) if isinstance(step, tuple)]
    middle = calls[len(calls) // 2]
    steps[middle] = (steps[middle][0], None, None, steps[middle][3])
    arena.resolved._sequence = split = _CallSequence(steps)
    assert [op[2] for op in split.ops if op[0] == split.FLUSH] == [len(calls) // 2, len(calls) - len(calls) // 2 - 1]
    for output, got in zip(session.get_outputs(), session.run(None, {"X": 3 * x}), strict=True):
        np.testing.assert_array_equal(got, plan.run({"X": 3 * x}, seconds=[])[output.name])
    nodes = [helper.make_node("Gather", ["D", "I"], ["G"], axis=0), helper.make_node("Relu", ["G"], ["Y"])]
    graph = helper.make_graph(
        nodes,
        "gather",
        [
            helper.make_tensor_value_info("D", TensorProto.FLOAT, [5, 3]),
            helper.make_tensor_value_info("I", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    gather = ponnx.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    d = np.arange(15, dtype=np.float32).reshape(5, 3) - 7
    for indices in ([4, -5], [1, 2]):
        np.testing.assert_array_equal(gather.run(None, {"D": d, "I": np.array(indices)})[0], np.maximum(d[indices], 0))
    with pytest.raises(polyc.PolycError, match="outside"):
        gather.run(None, {"D": d, "I": np.array([1, 7])})


def test_an_image_too_small_for_the_windows_is_a_signature_error():
    # squeezenet fed 16 x 16: its third MaxPool would get a 1 x 1 image (onnxruntime stops with
    # SIGFPE on such inputs); the error names the node, and the session still runs larger images.
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], strides=[2, 2], name="conv"),
        helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, name="pool"),
        helper.make_node("GlobalAveragePool", ["p"], ["Y"], name="mean"),
    ]
    graph = helper.make_graph(
        nodes,
        "too_small",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 1, 1])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model)
    with pytest.raises(
        polyc.SignatureError,
        match=r"node 'pool' \(MaxPool\): spatial dimension 0 of its input is 1 "
        r"\(padded: 1\), less than its window of 3",
    ):
        session.run(None, {"X": rng.standard_normal((1, 3, 4, 9)).astype(np.float32)})
    x = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[
        0
    ]
    np.testing.assert_allclose(session.run(None, {"X": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_tuning_a_session_tunes_its_costliest_kernels_and_runs_use_the_results(model, tmp_path, monkeypatch, capsys):
    from polyc.runtime.tuning_records import read_records

    records = tmp_path / "records.jsonl"
    monkeypatch.setenv("POLYC_TUNING_FILE", str(records))
    session = ponnx.InferenceSession(model)
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    result = polyc.tune(session, {"X": x}, trials=9, progress=False)
    kernels = result.kernels
    assert sorted(sum((k.groups for k in kernels), [])) == sorted(f"group{i}" for i in range(len(session.groups)))
    assert [k.seconds for k in kernels] == sorted((k.seconds for k in kernels), reverse=True)
    tuned = [k for k in kernels if k.result is not None]
    assert tuned and tuned[0] is kernels[0] and all(k.budget is None for k in kernels if k.result is None)
    assert all(k.result.trials == k.budget for k in tuned)
    assert len([r for r in read_records(records) if not r.confirmed]) == sum(k.budget for k in tuned)
    assert result.tuned_seconds <= result.default_seconds and "distinct kernels tuned" in repr(result)
    # The resolved calls were dropped, so the next run compiles with the records.
    plan = session.plans()[-1]
    assert all(arena.resolved is None for arena in plan._idle_arenas)
    (got,) = session.run(None, {"X": x})
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-3, atol=1e-6)
    # The command line's --tune: the same, on random inputs, then the run.
    from polyc.cli import main

    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["onnx", str(path), "--shape", "X=2,3,8,8", "--tune", "5", "--run"]) == 0
    printed = capsys.readouterr().out
    assert "per run; best" in printed and "tuned (as the searches measured them)" in printed
    assert len([r for r in read_records(records) if not r.confirmed]) == sum(k.budget for k in tuned) + 5
    with pytest.raises(polyc.PolycError, match="feeds"):
        polyc.tune(session, x, trials=4, progress=False)
    with pytest.raises(polyc.PolycError, match="tuning=False"):
        polyc.tune(ponnx.InferenceSession(model, tuning=False), {"X": x}, trials=4, progress=False)


def test_a_session_budget_is_shared_by_the_kernels_times():
    from polyc.tuning.session import MIN_SECONDS, KernelTuning, _share

    def shares(budget):
        entries = [
            (KernelTuning([name], seconds, None), None, []) for name, seconds in (("a", 10.0), ("b", 5.0), ("c", 0.1))
        ]
        _share(entries, budget)
        return [entry.budget for entry, _, _ in entries]

    assert shares(30.0) == [20.0, 10.0, None]  # c's 0.2 s went to a and b
    assert shares(40) == [26, 13, None]  # trials
    assert MIN_SECONDS > 2.0 and shares(2.0) == [2.0, None, None]  # too little to share: the costliest
    assert shares(2) == [2, None, None]


def attention_heads_model() -> onnx.ModelProto:
    """Scores Q K^T of K given as (batch, heads, tokens, width), transposed by a node (as
    PyTorch exports attention), softmax, then the heads of softmax(..) V put back side by side
    by another Transpose (the graph's output); and a Transpose of a transpose before a product."""
    nodes = [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2], name="kt"),
        helper.make_node("MatMul", ["Q", "Kt"], ["S"], name="scores"),
        helper.make_node("Softmax", ["S"], ["P"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["P", "V"], ["O"], name="pv"),
        helper.make_node("Transpose", ["O"], ["Y"], perm=[0, 2, 1, 3], name="heads"),
        helper.make_node("Transpose", ["V"], ["Vt"], perm=[1, 0, 3, 2], name="vt"),
        helper.make_node("Transpose", ["Vt"], ["Vtt"], perm=[1, 0, 2, 3], name="vtt"),
        helper.make_node("MatMul", ["Q", "Vtt"], ["Z"], name="qv"),
    ]
    four = ["N", 2, 5, 3]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, four) for n in "QKV"],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 5, 2, 3]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 2, 5, 5]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_transposes_beside_products_fold_into_them():
    # Kt is read through (the scores read K(n, h, j, r)), the heads' Transpose is written
    # through (the product assigns Y(n, i, h, j)), Vt and Vtt fold one after the other into
    # a product reading V with its first two axes swapped: no Transpose keeps a kernel, every
    # product stays a gemm kernel, and unfused the results are the same.
    model = attention_heads_model()
    rng = np.random.default_rng(11)
    fused, unfused = ponnx.InferenceSession(model), ponnx.InferenceSession(model, graph_fusion=False)
    for batch in (2, 1):
        feeds = {n: rng.standard_normal((batch, 2, 5, 3)).astype(np.float32) for n in "QKV"}
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for session in (fused, unfused):
            for got, want in zip(session.run(None, feeds), expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not any(name in group for group in fused.groups for name in ("kt", "heads", "vt", "vtt")), fused.groups
    assert sum("kt" in group or "heads" in group for group in unfused.groups) == 2
    products = [k for k in fused.kernels() if k.stages({}).contraction is not None]
    assert len(products) == 3
    source = fused.tc_source()
    k, v, y = (session_value(fused, name) for name in "KVY")
    assert f"* {k}(i0, i1, i3, r0)" in source and f"{y}(i0, i2, i1, i3) +=!" in source, source
    assert f"* {v}(i0, i1, i3, r0)" in source, source


def session_value(session, onnx_name: str) -> str:
    """The TC name of a graph input or output in the session's last plan."""
    import re

    match = re.search(rf"(v\d+) = '{onnx_name}'", session.tc_source())
    return match.group(1) if match else onnx_name


def test_the_first_run_builds_the_kernels_on_several_threads_at_once(model, tmp_path, monkeypatch, watched_builds):
    """A cold first run generates each kernel's C in turn while the C compiler builds those
    before it, one thread per processor (polyc.driver.build_ahead); the run's results are
    onnxruntime's, and a second session in the same cache builds nothing."""
    from polyc.schedule import tiling

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiling, "usable_cores", lambda: 2)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (got,) = ponnx.InferenceSession(model).run(None, {"X": x})
    np.testing.assert_allclose(got, reference(model, x), rtol=1e-3, atol=1e-6)
    assert watched_builds.most == 2, f"{watched_builds.count} builds, at most {watched_builds.most} at once"
    built = watched_builds.count
    (again,) = ponnx.InferenceSession(model).run(None, {"X": x})
    np.testing.assert_array_equal(again, got)
    assert watched_builds.count == built


def test_a_kernel_that_fails_to_build_ahead_fails_at_its_call(model, tmp_path, monkeypatch):
    from polyc.errors import CompilationError
    from polyc.runtime import cache as cache_module

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))

    def failing_compile(*args, **kwargs):
        raise CompilationError("the C compiler failed (as this test makes it)")

    monkeypatch.setattr(cache_module, "compile_shared_library", failing_compile)
    x = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(CompilationError, match="as this test makes it"):
        ponnx.InferenceSession(model).run(None, {"X": x})


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction-set flags")
@pytest.mark.parametrize(
    "cflags,sliver",
    [("-O2 -mavx2 -mfma", 16), ("-O2 -mavx512f -mavx512vl -mfma", 64), ("-O2", 0)],
    ids=["avx2", "avx512", "portable"],
)
def test_constant_weights_are_blocked_for_the_instruction_set_the_kernels_are_built_for(cflags, sliver):
    # The cflags option (or $POLYC_CFLAGS) may build the kernels for another instruction set
    # than the processor's: AVX2 code on an AVX-512 machine, as for a fleet of AVX2 servers.
    # Weights are blocked for the register block of the kernels built, whatever this machine
    # has: 16-wide slivers for AVX2's 6 x 16 block (64-wide ones it would pack on every call),
    # 64-wide for AVX-512's 6 x 64, none for portable C.  The build runs where this machine can.
    from polyc.target import get_target

    rng = np.random.default_rng(21)
    weights = rng.standard_normal((24, 128)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["P"], name="mm"),
        helper.make_node("Add", ["P", "B"], ["Y"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, "T", 24])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "T", 128])],
        [
            numpy_helper.from_array(weights, "W"),
            numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "B"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model, cflags=cflags)
    x = rng.standard_normal((1, 8, 24)).astype(np.float32)
    weights_read = session.plan_for({"X": x.shape}).groups[0].inputs[1]
    assert weights_read.shape == ((128 // sliver, 24, sliver) if sliver else (24, 128))
    if get_target("host").vector_bits >= (512 if sliver == 64 else 256 if sliver == 16 else 0):
        np.testing.assert_allclose(session.run(None, {"X": x})[0], reference(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_a_cast_to_the_type_it_has_may_be_a_graph_output(op):
    # The cast changes nothing, and its output is the model's: before, the output had no
    # value of its own and run() failed with a KeyError.
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    node = (
        helper.make_node("Cast", ["s"], ["Y"], to=TensorProto.FLOAT)
        if op == "Cast"
        else helper.make_node("CastLike", ["s", "X"], ["Y"])
    )
    graph = helper.make_graph(
        [helper.make_node("Sqrt", ["X"], ["s"]), node],
        "cast",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    np.testing.assert_allclose(ponnx.InferenceSession(model).run(None, {"X": x})[0], np.sqrt(x), rtol=1e-6)


def float16_taps_error(got, x, w) -> np.ndarray:
    """How far ``got`` is from the float16 depthwise convolution (4 channels, 3 taps) computed as
    polyc must: float16 products are exact in float32 (11 x 11 significand bits), the three
    taps are summed in float32 (two roundings of 2^-24 relative to the sum of |terms| each) and
    the sum rounded to float16 once (half a float16 spacing).  Returns, per element, the error
    beyond that budget over a float16 spacing; summing in float16 (a rounding per tap) gives a
    neighbouring float16 where the exact value is not close to a rounding midpoint: about 0.5."""
    terms = [w[:, 0, t].astype(np.float64)[None, :, None] * x[:, :, t : t + 7].astype(np.float64) for t in range(3)]
    exact = sum(terms)
    spacing = np.spacing(np.abs(got)).astype(np.float64)
    budget = spacing / 2 + 2 * 2.0**-24 * sum(np.abs(term) for term in terms)
    return (np.abs(got.astype(np.float64) - exact) - budget) / spacing


def test_a_float16_depthwise_convolution_sums_its_taps_in_float32(monkeypatch, tmp_path):
    # Its output starts from zero (before, a float16 zero constant the kernel did not receive:
    # the group failed to compile), and its taps are summed in float32, rounded once, as
    # numpy's float16 matmul does (polyc.lang.float16_sums).
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 1, 3)).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["Y"], group=4, name="dw")],
        "dw16",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [1, 4, 9])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [1, 4, 7])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((1, 4, 9)).astype(np.float16)
    got = ponnx.InferenceSession(model).run(None, {"X": x})[0]  # computed in float32 (onnx/float16.py)
    assert got.dtype == np.float16
    assert float16_taps_error(got, x, w).max() <= 0
    # The float16 definitions themselves, without the model's float32 rewrite: the same.
    from polyc.frontends.onnx import session as session_module

    monkeypatch.setattr(session_module, "computed_in_float32", lambda model: model)
    got = ponnx.InferenceSession(model).run(None, {"X": x})[0]
    assert float16_taps_error(got, x, w).max() <= 0
    # the control: taps summed in float16 (polyc.lang.float16_sums's rewrite left out) fail it
    monkeypatch.setattr(polyc.api, "accumulate_float16_in_float32", lambda definition: definition)
    monkeypatch.setattr(plan_module, "_SHARED_KERNELS", collections.OrderedDict())  # not the kernel made above
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))  # nor its build (the request key is the TC text)
    summed_in_float16 = ponnx.InferenceSession(model).run(None, {"X": x})[0]
    assert float16_taps_error(summed_in_float16, x, w).max() > 0.25


def test_repeated_blocks_share_one_kernel():
    # Three identical layers (MatMul, Add, Relu) with different weights, as a network repeats
    # its blocks: their groups compile one kernel between them, and each reads its own weights.
    rng = np.random.default_rng(9)
    weights = [rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3)]
    biases = [rng.standard_normal(16).astype(np.float32) for _ in range(3)]
    nodes, initializers, previous = [], [], "x"
    for layer, (w, bias) in enumerate(zip(weights, biases, strict=True)):
        nodes += [
            helper.make_node("MatMul", [previous, f"w{layer}"], [f"p{layer}"]),
            helper.make_node("Add", [f"p{layer}", f"b{layer}"], [f"s{layer}"]),
            helper.make_node("Relu", [f"s{layer}"], [f"h{layer}"]),
        ]
        initializers += [numpy_helper.from_array(w, f"w{layer}"), numpy_helper.from_array(bias, f"b{layer}")]
        previous = f"h{layer}"
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info(previous, TensorProto.FLOAT, [4, 16])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ponnx.InferenceSession(model)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (ours,) = session.run(None, {"x": x})
    expected = x
    for w, bias in zip(weights, biases, strict=True):
        expected = np.maximum(expected @ w + bias, 0)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5)
    kernels = session.kernels()
    assert len(kernels) == 3 and len({id(k) for k in kernels}) == 1
    assert "def group0" in session.tc_source() and "def group2" in session.tc_source()  # as the user reads it
