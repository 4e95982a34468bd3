"""float16 models (onnxruntime's float16 conversion of float32 models) computed in float32 and
rounded to float16 between operators (polyc.frontends.onnx.float16): the kernel paths of their
float32 twins, and the values of onnxruntime's float16 models and of the same computation
without roundings between operators.

Tolerances.  Each operator's result is rounded to float16 once (relative error at most
u = 2^-11), its sums in float32 (relative error K 2^-24 for K terms, far below u here).  An
operator passes on its inputs' errors scaled by its condition, which for these small layers is
of order one; so an output of a chain of L rounding operators is within about L u of the exact
value of the float16 model, relative to the output's range.  Two float16 computations
of the same model (polyc's, onnxruntime's) each stay within that, so they differ by at most
twice that.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
float16_conversion = pytest.importorskip(
    "onnxruntime.transformers.float16", reason="onnxruntime's float16 conversion (onnxruntime.transformers)"
)
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx.float16 import computed_in_float32  # noqa: E402
from tests.builds import builds  # noqa: E402

UNIT_ROUNDOFF = 2.0**-11  # float16's


def _float16(model):
    return float16_conversion.convert_float_to_float16(model, keep_io_types=False)


def _onnxruntime(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _unrounded_reference(model16, feeds):
    """The float16 model's value without roundings between operators: its weights (float16
    values) and inputs widened, every operator computed by onnxruntime in float32 (whose
    rounding, 2^-24 per operator, is negligible beside float16's; onnxruntime's CPU provider has
    no float64 convolution), as float64."""
    model = onnx.ModelProto()
    model.CopyFrom(model16)
    graph = model.graph
    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            wide = numpy_helper.to_array(tensor).astype(np.float32)
            graph.initializer[index].CopyFrom(numpy_helper.from_array(wide, tensor.name))
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    del graph.value_info[:]
    wide_feeds = {name: array.astype(np.float32) for name, array in feeds.items()}
    return _onnxruntime(model, wide_feeds).astype(np.float64)


def _convolutional(rng):
    """conv 3x3 + relu, conv 3x3 + residual add + relu, average pool, flatten, gemm."""
    weights = {
        "W1": rng.standard_normal((16, 8, 3, 3)) * 0.15,
        "B1": rng.standard_normal(16) * 0.1,
        "W2": rng.standard_normal((16, 16, 3, 3)) * 0.1,
        "P": rng.standard_normal((16, 8, 1, 1)) * 0.3,
        "G": rng.standard_normal((10, 16)) * 0.3,
        "C": rng.standard_normal(10) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Conv", ["X", "P"], ["p"], name="project"),
        helper.make_node("Add", ["c2", "p"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "G", "C"], ["Y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8, 12, 12])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), 6


def _attention_like(rng):
    """matmul + bias, softmax over scores, matmul, then a layer normalisation spelled out."""
    weights = {
        "W": rng.standard_normal((32, 32)) * 0.2,
        "B": rng.standard_normal(32) * 0.1,
        "eps": np.array(1e-5),
        "scale": np.array(0.25),
    }
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["m"], name="project"),
        helper.make_node("Add", ["m", "B"], ["h"], name="bias"),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1], name="transpose"),
        helper.make_node("MatMul", ["h", "ht"], ["scores"], name="scores"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        helper.make_node("Softmax", ["scaled"], ["weights"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["weights", "h"], ["a"], name="attend"),
        helper.make_node("ReduceMean", ["a"], ["mean"], axes=[-1], name="mean"),
        helper.make_node("Sub", ["a", "mean"], ["centred"], name="centre"),
        helper.make_node("Mul", ["centred", "centred"], ["squares"], name="square"),
        helper.make_node("ReduceMean", ["squares"], ["variance"], axes=[-1], name="variance"),
        helper.make_node("Add", ["variance", "eps"], ["shifted"], name="epsilon"),
        helper.make_node("Sqrt", ["shifted"], ["deviation"], name="sqrt"),
        helper.make_node("Div", ["centred", "deviation"], ["Y"], name="normalise"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 24, 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 24, 32])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), 13


def _input(model, rng, batch):
    shape = [batch] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    return rng.standard_normal(shape).astype(np.float16)


@pytest.mark.parametrize("make", [_convolutional, _attention_like], ids=["convolutional", "attention"])
@builds("native", "avx2", "portable")
def test_float16_models_agree_with_onnxruntime_and_the_exact_value(make, cflags):
    rng = np.random.default_rng(5)
    model32, operators = make(rng)
    model = _float16(model32)
    options = {} if cflags is None else {"cflags": cflags}
    session = ponnx.InferenceSession(model, **options)
    for batch in (1, 3):
        x = _input(model, rng, batch)
        (got,) = session.run(None, {"X": x})
        assert got.dtype == np.float16
        want = _onnxruntime(model, {"X": x})
        exact = _unrounded_reference(model, {"X": x})
        scale = np.abs(exact).max()
        # Within `operators` roundings of the exact value; onnxruntime too, so twice that apart.
        assert np.abs(got.astype(np.float64) - exact).max() <= operators * UNIT_ROUNDOFF * scale
        assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= 2 * operators * UNIT_ROUNDOFF * scale
        if make is _convolutional:
            assert (got.argmax(axis=1) == exact.argmax(axis=1)).all()


def test_float16_models_take_the_kernel_paths_of_float32_models():
    # The convolutions, products and the layer's gemm take their kernels, not the generic loop
    # nest; the roundings after them are their epilogues, in registers where the build has them.
    rng = np.random.default_rng(6)
    for make, kernel_nodes in ((_convolutional, {"conv1", "conv2", "fc"}), (_attention_like, {"project"})):
        model32, _ = make(rng)
        model = _float16(model32)
        session = ponnx.InferenceSession(model)
        x = _input(model, rng, 2)
        session.run(None, {"X": x})
        kernels = session.kernels({"X": x.shape})
        for group, kernel in zip(session.groups, kernels):
            if kernel_nodes & set(group):
                assert kernel.stages().path != "generic", group
                assert all(kernel.definition.tensor(t).dtype != np.float16 for t in kernel.definition.inputs), group


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 instruction-set flags")
def test_the_rounding_is_in_registers_with_f16c_and_in_float_arithmetic_without():
    rng = np.random.default_rng(7)
    model = _float16(_convolutional(rng)[0])
    x = _input(model, rng, 1)
    for cflags, conversion in (("-O2 -mavx512f -mavx512vl -mfma", "_mm512_cvtps_ph"), ("-O2 -mavx2 -mfma", None)):
        session = ponnx.InferenceSession(model, cflags=cflags)
        session.run(None, {"X": x})
        kernel = session.kernels({"X": x.shape})[next(i for i, g in enumerate(session.groups) if "conv1" in g)]
        source = kernel.c_source({})
        assert "polyc_round_float16" in source
        if conversion:
            assert conversion in source


def test_values_are_rounded_to_float16_between_operators():
    # (x + c) - x in float16: the sum is rounded before the subtraction, as numpy computes it;
    # computed in float32 through both, it would be c.
    nodes = [
        helper.make_node("Add", ["X", "C"], ["s"], name="add"),
        helper.make_node("Sub", ["s", "X"], ["d"], name="sub"),
        helper.make_node("Mul", ["d", "K"], ["Y"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "rounding",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [64])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [64])],
        [
            numpy_helper.from_array(np.array(3e-4, np.float16), "C"),
            numpy_helper.from_array(np.array(3.0, np.float16), "K"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.linspace(0.5, 4.0, 64).astype(np.float16)
    want = ((x + np.float16(3e-4)) - x) * np.float16(3.0)
    (got,) = ponnx.InferenceSession(model).run(None, {"X": x})
    np.testing.assert_array_equal(got, want)
    # (onnxruntime's CPU provider, with no float16 Add or Sub kernel, computes the chain in
    # float32 between Casts that it merges, so it gives c * 3 here.)


def test_rounding_to_float16_in_float_matches_numpy():
    # polyc_round_float16 (scalar, in float arithmetic) over normal, subnormal, overflowing, tied and
    # special values, as a Cast pair inlined into one statement.
    nodes = [
        helper.make_node("Cast", ["X"], ["h"], to=TensorProto.FLOAT16, name="down"),
        helper.make_node("Cast", ["h"], ["Y"], to=TensorProto.FLOAT, name="up"),
    ]
    graph = helper.make_graph(
        nodes,
        "round",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(8)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, -65520.0, 2.0**-14, 2.0**-24, 2.0**-25,
         3 * 2.0**-26, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11],
        np.float32,
    )  # fmt: skip
    x = np.concatenate([bits.view(np.float32), special, rng.standard_normal(1000).astype(np.float32) * 1e-5])
    (got,) = ponnx.InferenceSession(model).run(None, {"X": x})
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


def test_models_without_float16_are_left_alone():
    model32, _ = _convolutional(np.random.default_rng(9))
    assert computed_in_float32(model32) is model32


def test_outputs_read_inside_exact_outputs_and_casts_from_double():
    # A float16 output that another operator reads, one that Transpose (exact, no rounding)
    # makes, and a float16 value cast from double (one rounding, not two through float32):
    # as numpy computes them in float16.
    nodes = [
        helper.make_node("Cast", ["D"], ["d"], to=TensorProto.FLOAT16, name="narrow"),
        helper.make_node("Add", ["X", "d"], ["S"], name="add"),
        helper.make_node("Transpose", ["S"], ["T"], perm=[1, 0], name="transpose"),
        helper.make_node("Mul", ["T", "T"], ["Q"], name="square"),
    ]
    graph = helper.make_graph(
        nodes,
        "outputs",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT16, [4, 6]),
            helper.make_tensor_value_info("D", TensorProto.DOUBLE, [4, 6]),
        ],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT16, None) for name in ("S", "T", "Q")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 6)).astype(np.float16)
    # doubles just above a float16 tie whose float32 rounding lands on the tie
    d = (1.0 + 2.0**-11 + 2.0**-40) * np.ones((4, 6)) * rng.choice([1.0, -2.0], (4, 6))
    s = x + d.astype(np.float16)
    want = {"S": s, "T": s.T, "Q": s.T * s.T}
    got = ponnx.InferenceSession(model).run(None, {"X": x, "D": d})
    for name, value in zip(("S", "T", "Q"), got):
        assert value.dtype == np.float16
        np.testing.assert_array_equal(value, want[name], err_msg=name)
