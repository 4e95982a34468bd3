"""Malformed ONNX models are a :class:`polyc.errors.ModelError` naming the node (or initializer,
or field) and the problem, never a raw Python exception, and polyc refuses what onnxruntime
refuses: every case found by mutating models (issue 81), each built here with onnx.helper."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx  # noqa: E402
from polyc.errors import ModelError, PolycError  # noqa: E402

FLOAT = TensorProto.FLOAT


def model(nodes, inputs, initializers=(), opset=17, output_type=FLOAT):
    """A model of ``nodes`` reading float ``inputs`` (name, shape) and giving ``y``."""
    graph = helper.make_graph(
        nodes,
        "malformed",
        [helper.make_tensor_value_info(name, FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info("y", output_type, None)],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model_or_bytes, feeds):
    return polyc.onnx.InferenceSession(model_or_bytes).run(None, feeds)


X23 = {"x": np.ones((2, 3), np.float32)}
IMAGE = {"x": np.ones((1, 4, 5, 5), np.float32)}


def test_initializer_whose_data_do_not_fill_its_dims():
    weights = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weights.dims[:] = [2, 2]  # 6 values for 4 places: onnx's checker lets it pass
    broken = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [2, 2])], [weights])
    with pytest.raises(ModelError, match=r"initializer 'w'.*dims \[2, 2\]"):
        run(broken, {"x": np.ones((2, 2), np.float32)})


def test_large_initializer_whose_data_do_not_fill_its_dims():
    """Above 4096 elements the checker never sees an initializer's data (model.py's skeleton)."""
    weights = numpy_helper.from_array(np.ones((100, 100), np.float32), "w")
    weights.dims[:] = [100, 101]
    broken = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [100, 101])], [weights])
    with pytest.raises(ModelError, match=r"initializer 'w'.*dims \[100, 101\]"):
        run(broken, {"x": np.ones((100, 101), np.float32)})


@pytest.mark.parametrize(("perm", "problem"), [([0, 7], "Invalid attribute perm"), ([0, 0], "repeated value")])
def test_transpose_perm_that_is_no_permutation(perm, problem):
    broken = model([helper.make_node("Transpose", ["x"], ["y"], perm=perm)], [("x", [2, 3])])
    with pytest.raises(ModelError, match=rf"node 'Transpose_0' \(Transpose\).*{problem}"):
        run(broken, X23)


def test_gemm_of_a_one_dimensional_matrix():
    b = numpy_helper.from_array(np.ones(3, np.float32), "b")
    broken = model([helper.make_node("Gemm", ["x", "b"], ["y"], name="fc")], [("x", [2, 3])], [b])
    with pytest.raises(ModelError, match=r"node 'fc' \(Gemm\).*rank 2 but has rank 1"):
        run(broken, X23)


def test_reshape_to_a_float_shape():
    shape = numpy_helper.from_array(np.array([3.0, 2.0], np.float32), "s")
    broken = model([helper.make_node("Reshape", ["x", "s"], ["y"])], [("x", [2, 3])], [shape])
    with pytest.raises(ModelError, match=r"node 'Reshape_0' \(Reshape\).*Expected:int64 Actual:float"):
        run(broken, X23)


def conv(bias_length=None, **attributes):
    inputs = ["x", "w"] + (["b"] if bias_length is not None else [])
    weights = [numpy_helper.from_array(np.ones((4, 4, 3, 3), np.float32), "w")]
    if bias_length is not None:
        weights.append(numpy_helper.from_array(np.ones(bias_length, np.float32), "b"))
    return model([helper.make_node("Conv", inputs, ["y"], **attributes)], [("x", [1, 4, 5, 5])], weights)


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        ({"strides": [0, 1]}, "strides must only contain positive values"),
        ({"strides": [1]}, "strides has incorrect size"),
        ({"pads": [-1, -1, -1, -1]}, "pads must not contain negative values"),  # onnxruntime refuses it too
    ],
)
def test_conv_window_attributes_that_break_the_specification(attributes, problem):
    with pytest.raises(ModelError, match=rf"node 'Conv_0' \(Conv\).*{problem}"):
        run(conv(**attributes), IMAGE)


def test_conv_window_attributes_checked_where_shapes_are_only_known_at_run_time():
    """A graph input of unknown rank leaves onnx's inference nothing to check: the converter does."""
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[0, 1])],
        "malformed",
        [helper.make_tensor_value_info("x", FLOAT, None), helper.make_tensor_value_info("w", FLOAT, None)],
        [helper.make_tensor_value_info("y", FLOAT, None)],
    )
    broken = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=r"node 'Conv_0' \(Conv\): strides \[0, 1\] for 2 spatial dimensions"):
        run(broken, {**IMAGE, "w": np.ones((4, 4, 3, 3), np.float32)})


def test_conv_pads_larger_than_any_memory():
    with pytest.raises(
        ModelError, match=r"node 'Conv_0' \(Conv\): a value of shape .* more than this machine's memory"
    ):
        run(conv(pads=[10**9] * 4), IMAGE)


@pytest.mark.parametrize("bias_length", [1, 2, 6])
def test_conv_bias_of_another_length_than_the_filters(bias_length):
    """onnxruntime: "bias must be a 1D tensor of size output_channels (4)" (a bias of 1 was
    broadcast and one of 6 cut to 4 before)."""
    with pytest.raises(ModelError, match=rf"node 'Conv_0' \(Conv\): the bias must be .* 4 values .*\({bias_length},\)"):
        run(conv(bias_length), IMAGE)


@pytest.mark.parametrize("where", ["node name", "node output", "graph input"])
def test_names_that_are_not_utf8(where):
    names = {"node name": "conv", "node output": "y", "graph input": "x"}
    marked = {**names, where: "QQ"}
    graph = helper.make_graph(
        [helper.make_node("Relu", [marked["graph input"]], [marked["node output"]], name=marked["node name"])],
        "g",
        [helper.make_tensor_value_info(marked["graph input"], FLOAT, [2])],
        [helper.make_tensor_value_info(marked["node output"], FLOAT, [2])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    data = data.replace(b"QQ", b"\xc3\x28")  # as long, not UTF-8
    with pytest.raises(ModelError, match=r"model\.graph\..* is not UTF-8 text"):
        run(data, {"x": np.ones(2, np.float32)})


@pytest.mark.parametrize(
    ("shape", "problem"), [([-3, 4], "non-negative"), ([2**62, 4], "more than this machine's memory")]
)
def test_constant_of_shape_negative_or_huge(shape, problem):
    broken = model(
        [helper.make_node("ConstantOfShape", ["s"], ["y"], value=helper.make_tensor("v", FLOAT, [1], [1.0]))],
        [],
        [numpy_helper.from_array(np.array(shape, np.int64), "s")],
    )
    with pytest.raises(ModelError, match=rf"node 'ConstantOfShape_0' \(ConstantOfShape\).*{problem}"):
        run(broken, {})


def test_constant_of_shape_computed_negative_at_plan_time():
    """A shape computed by other nodes (here a Sub of constants) is known only when planned."""
    nodes = [
        helper.make_node("Sub", ["a", "b"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["y"]),
    ]
    constants = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("a", [1, 4]), ("b", [4, 0]))]
    with pytest.raises(ModelError, match=r"node 'ConstantOfShape_1' \(ConstantOfShape\).*negative"):
        run(model(nodes, [], constants), {})


def test_external_data_outside_the_model_directory(tmp_path):
    """onnx's loader raises its ValidationError; polyc names the file and the problem."""
    weights = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    weights.external_data.add(key="location", value="../../etc/passwd")
    path = tmp_path / "model.onnx"
    path.write_bytes(
        model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [2, 3])], [weights]).SerializeToString()
    )
    with pytest.raises(PolycError, match=rf"{path}: not a readable ONNX model \(ValidationError: .*outside"):
        run(path, X23)


@pytest.mark.parametrize(
    ("op_type", "opset", "attributes"),
    [
        ("ReduceSum", 11, {"axes": [1]}),
        ("ReduceMax", 13, {"axes": [1]}),
        ("ReduceMean", 18, {}),
        ("ArgMax", 13, {"axis": 1}),
    ],
)
def test_keepdims_other_than_0_or_1_drops_the_axes_as_onnxruntime_does(op_type, opset, attributes):
    ort = pytest.importorskip("onnxruntime")
    output_type = TensorProto.INT64 if op_type == "ArgMax" else FLOAT
    reduction = model(
        [helper.make_node(op_type, ["x"], ["y"], keepdims=7, **attributes)],
        [("x", [2, 3])],
        opset=opset,
        output_type=output_type,
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (expected,) = ort.InferenceSession(reduction.SerializeToString()).run(None, {"x": x})
    (got,) = run(reduction, {"x": x})
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# ----------------------------------------------------------------------------- found by the mutation fuzzer
# (tests/onnx/mutation_fuzz.py; each named by the run's seed and mutant)


@pytest.mark.parametrize("where", ["initializer", "graph input", "graph output", "attribute tensor"])
def test_element_type_that_is_no_onnx_data_type(where):
    """Seed 0, mutants 170, 259 and 802: onnx's readers raised a raw ValueError or KeyError."""
    weights = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    if where == "initializer":
        weights.data_type = 999
    if where == "attribute tensor":
        value = helper.make_tensor("value", FLOAT, [1], [1.0])
        value.data_type = 999
        nodes = [helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill", value=value)]
        weights = numpy_helper.from_array(np.array([2, 3], np.int64), "s")
    broken = model(nodes, [("x", [2, 3])], [weights])
    if where == "graph input":
        broken.graph.input[0].type.tensor_type.elem_type = 999
    if where == "graph output":
        broken.graph.output[0].type.tensor_type.elem_type = 0  # onnxruntime: "Invalid tensor data type 0"
    with pytest.raises(ModelError, match=r"model\.graph\..* element type (999|0), no ONNX data type"):
        run(broken, X23)


def test_float16_initializer_whose_data_do_not_fill_its_dims():
    """Seed 0, mutant 462: float32 bytes marked float16 failed in the float32 rewrite (ValueError)."""
    weights = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    weights.data_type = TensorProto.FLOAT16
    broken = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", [2, 3])], [weights])
    broken.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    broken.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(ModelError, match=r"initializer 'w': its data do not match its dims \[2, 3\] and type FLOAT16"):
        run(broken, {"x": np.ones((2, 3), np.float16)})


@pytest.mark.parametrize(
    ("op_type", "weights", "problem"),
    [
        (
            "Gemm",
            np.ones((3, 4), np.int32),
            r"input 1 'w' is tensor\(int32\), but input 0 bound .* T to tensor\(float\)",
        ),
        (
            "Add",
            np.ones((2, 3), np.int64),
            r"input 1 'w' is tensor\(int64\), but input 0 bound .* T to tensor\(float\)",
        ),
    ],
)
def test_inputs_of_types_their_type_parameter_does_not_allow(op_type, weights, problem):
    """Seed 0, mutants 396 and 439: an int32 Gemm weight beside float data ran (onnxruntime:
    "Type parameter (T) of Optype (Gemm) bound to different types")."""
    broken = model(
        [helper.make_node(op_type, ["x", "w"], ["y"], name="op")],
        [("x", [2, 3])],
        [numpy_helper.from_array(weights, "w")],
    )
    with pytest.raises(ModelError, match=rf"node 'op' \({op_type}\): {problem}"):
        run(broken, X23)


def test_layer_normalization_scale_of_a_type_it_does_not_allow():
    scale = numpy_helper.from_array(np.ones(3, np.int32), "scale")
    broken = model(
        [helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="norm")], [("x", [2, 3])], [scale]
    )
    with pytest.raises(ModelError, match=r"node 'norm' \(LayerNormalization\): input 1 'scale' is tensor\(int32\)"):
        run(broken, X23)


def test_required_variadic_input_left_empty():
    """Seed 0, mutant 362: Concat of ["x", ""] ran as Concat of x alone (onnxruntime refuses it)."""
    broken = model([helper.make_node("Concat", ["x", ""], ["y"], name="cat", axis=0)], [("x", [2, 3])])
    with pytest.raises(ModelError, match=r"node 'cat' \(Concat\): input 1 \(inputs\) is required but empty"):
        run(broken, X23)


@pytest.mark.parametrize("axis", [3, -4, 2**62])
def test_flatten_axis_out_of_range(axis):
    """Seed 1, mutant 330: an axis of 2**62 flattened as if it were the rank (onnx's inference
    lets it pass, and checks none where the input's rank is unknown, as here)."""
    broken = model([helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=axis)], [("x", None)])
    with pytest.raises(ModelError, match=rf"node 'flat' \(Flatten\): axis {axis} out of range \[-2, 2\]"):
        run(broken, X23)


def test_gemm_whose_inner_extents_differ():
    """Seed 5, mutant 318: a (16, 4) by (64, 5) product summed over 4 and ran: the Gemm's shapes
    are known only when planned (after a Flatten of a graph input of unknown rank)."""
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["f"], axis=-1),
            helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1),
        ],
        "malformed",
        [helper.make_tensor_value_info("x", FLOAT, None)],
        [helper.make_tensor_value_info("y", FLOAT, None)],
        [numpy_helper.from_array(np.ones((5, 64), np.float32), "w")],
    )
    broken = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=r"node 'fc' \(Gemm\): A of shape \(16, 4\) .* inner extents differ"):
        run(broken, {"x": np.ones((1, 4, 4, 4), np.float32)})


def test_conv_kernel_shape_that_is_not_the_weights_window():
    """Seed 3, mutant 852: kernel_shape [3, 2] beside 3 x 3 weights ran as 3 x 3."""
    with pytest.raises(
        ModelError, match=r"node 'Conv_0' \(Conv\): kernel_shape \[3, 2\] is not the weights' window \(3, 3\)"
    ):
        run(conv(kernel_shape=[3, 2]), IMAGE)


@pytest.mark.parametrize("epsilon", [float("nan"), float("inf")])
def test_non_finite_float_attributes_compute_as_onnxruntime(epsilon):
    """Seed 0, mutants 49 and 577: a NaN or infinite epsilon was printed into TC as a name
    ("cannot compile their TC")."""
    ort = pytest.importorskip("onnxruntime")
    scale = numpy_helper.from_array(np.ones(3, np.float32), "scale")
    normed = model(
        [helper.make_node("LayerNormalization", ["x", "scale"], ["y"], epsilon=epsilon)], [("x", [2, 3])], [scale]
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (expected,) = ort.InferenceSession(normed.SerializeToString(), options).run(None, {"x": x})
    (got,) = run(normed, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)
