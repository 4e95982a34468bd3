"""NaN, +-inf and -0 as onnxruntime computes them: first the activations and clamps (Relu,
Sign, HardSigmoid and Clip keep a NaN, fmin/fmax would drop it; Relu and Clip keep -0; Clip
without a bound clamps to the type's largest finite value; Selu(-0) is +0), then a sweep over
every float operator polyc converts (issue 81), with the tables of what is left out and why,
and the rules behind the exclusions (ArgMax's, the max of a slice holding NaN, Winograd's)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402

SPECIAL = [np.nan, 1.0, -np.inf, np.inf, -0.0, 0.0, -2.5, 3.0, 7.0]
TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16}


def both(nodes, x: np.ndarray, initializers=()):
    element = TYPES[x.dtype.type]
    graph = helper.make_graph(
        nodes,
        "special",
        [helper.make_tensor_value_info("x", element, list(x.shape))],
        [helper.make_tensor_value_info("y", element, None)],
        [numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return ours, theirs


def assert_same_values(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Equal, NaN where NaN, and the same sign of every zero."""
    np.testing.assert_array_equal(ours, theirs)  # (NaN equals NaN here)
    finite = ~np.isnan(theirs)
    np.testing.assert_array_equal(np.signbit(ours[finite]), np.signbit(theirs[finite]))


@pytest.mark.parametrize("op", ["Relu", "HardSigmoid", "Selu", "Sign"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float", "double"])
def test_activations_keep_nan_and_signed_zeros(op, dtype):
    if op in ("HardSigmoid", "Selu") and dtype == np.float64:
        pytest.skip(f"onnxruntime has no double {op} on the CPU")
    x = np.array([SPECIAL], dtype)
    ours, theirs = both([helper.make_node(op, ["x"], ["y"])], x)
    assert_same_values(ours, theirs)


def test_relu_of_nan_is_nan_and_not_zero():
    # The negative control of the comparison above: the old rule (x > 0 ? x : 0) gives 0.
    x = np.array([[np.nan, -0.0]], np.float32)
    ours, _ = both([helper.make_node("Relu", ["x"], ["y"])], x)
    assert np.isnan(ours[0, 0]) and np.signbit(ours[0, 1])
    with pytest.raises(AssertionError):
        assert_same_values(np.array([[0.0, 0.0]], np.float32), ours)


@pytest.mark.parametrize("dtype", list(TYPES), ids=["float", "double", "float16"])
@pytest.mark.parametrize("given", [("lo", "hi"), (), ("lo",), ("", "hi")], ids=["both", "none", "min", "max"])
def test_clip_keeps_nan_and_clamps_to_the_largest_finite_value(dtype, given):
    x = np.array([SPECIAL], dtype)
    bounds = [("lo", np.array(0, dtype)), ("hi", np.array(6, dtype))]
    ours, theirs = both([helper.make_node("Clip", ["x", *given], ["y"])], x, [b for b in bounds if b[0] in given])
    assert_same_values(ours, theirs)


def test_clip_before_opset_11_keeps_nan():
    x = np.array([SPECIAL], np.float32)
    node = helper.make_node("Clip", ["x"], ["y"], min=-1.0, max=1.0)
    graph = helper.make_graph(
        [node],
        "clip6",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert_same_values(ours, theirs)


# Rows long enough that polyc sums them in blocks and the total is an OpenMP reduction over the
# threads (the partial sums whose start from +0 gave +0); the short row is one vector loop.
NEGATIVE_ZERO_SUMS = {
    "ReduceSum_rows": ([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], (4, 3001), [1]),
    "ReduceSum_all": ([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], (7, 20011), None),
    "ReduceSum_short": ([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], (5, 3), [1]),
    "Einsum_rows": ([helper.make_node("Einsum", ["x"], ["y"], equation="ij->i")], (4, 3001), None),
    "Einsum_total": ([helper.make_node("Einsum", ["x"], ["y"], equation="ij->")], (7, 20011), None),
}


@pytest.mark.parametrize("dtype", list(TYPES), ids=["float", "double", "float16"])
@pytest.mark.parametrize("case", list(NEGATIVE_ZERO_SUMS))
def test_a_sum_of_negative_zeros_is_negative_zero(case, dtype):
    """-0 is the identity of IEEE addition (x + -0 is x, +0 + -0 is +0): a sum whose every term
    is -0 is -0, in onnxruntime (numpy 2's sums start from +0 and give +0) and in polyc, whose
    sums, their vector lanes' and their threads' partial sums start from -0 (issue 81)."""
    nodes, shape, axes = NEGATIVE_ZERO_SUMS[case]
    x = np.full(shape, -0.0, dtype)
    ours, theirs = both(nodes, x, [("axes", np.array(axes, np.int64))] if axes else [])
    assert np.signbit(theirs).all(), "onnxruntime's sum of -0s is -0"
    assert ours.shape == theirs.shape and (ours == 0).all() and np.signbit(ours).all(), ours
    # One +0 term makes the sum +0, in both.
    x.reshape(-1)[shape[-1] // 2] = 0.0
    ours, theirs = both(nodes, x, [("axes", np.array(axes, np.int64))] if axes else [])
    assert_same_values(ours, theirs)


@pytest.mark.parametrize(
    "channels, kernel, group", [(16, 1, 1), (32, 3, 32), (16, 3, 1)], ids=["pointwise", "depthwise", "3x3"]
)
def test_nan_and_inf_images_through_conv_and_relu(channels, kernel, group):
    # Fused into the convolution kernels' epilogues, Relu keeps each NaN of onnxruntime's result.
    # (Winograd off: its tile transforms subtract neighbouring inputs, so an inf in a tile makes
    # NaN where a direct convolution makes +-inf; see the ONNX guide.)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, 12, 12)).astype(np.float32)
    x[0, :, 5, 5] = np.nan
    x[0, 0, 9, 9], x[0, 1, 2, 2] = np.inf, -np.inf
    w = rng.standard_normal((channels, channels // group, kernel, kernel)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[kernel // 2] * 4, group=group),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    (ours,) = ponnx.InferenceSession(model, winograd=False).run(None, {"x": x})
    (theirs,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.isnan(theirs).sum() > 0
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(theirs))
    finite = np.isfinite(theirs)
    np.testing.assert_allclose(ours[finite], theirs[finite], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The sweep (issue 81): every float operator polyc converts, on inputs holding NaN, +-inf, -0
# and +0 among ordinary numbers at several positions, against onnxruntime with its graph
# optimisations off, in float, double and float16 wherever onnxruntime has the kernel.  Where
# onnxruntime's result is exact (moves, comparisons, selections, IEEE's correctly rounded
# + - * / sqrt, maxima), every element must have its bits (a NaN only needs to be a NaN);
# elsewhere the finite elements agree within onnx's backend-test tolerance, while NaN, the
# infinities with their signs, and the signs of exact zeros must agree everywhere.

F32, F64, F16 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)
ELEMENT = {F32: TensorProto.FLOAT, F64: TensorProto.DOUBLE, F16: TensorProto.FLOAT16}
BOOL, INT64 = TensorProto.BOOL, TensorProto.INT64
#: The backend node tests' tolerances (tests/onnx/node_suite.py); float16's rtol its spacing's.
RTOL, ATOL = {F32: 1e-3, F64: 1e-3, F16: 2e-3}, 1e-7
VALUES = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-3, -7.0]


def vector(dtype) -> np.ndarray:
    """Every special value among ordinary ones, forwards and backwards (two positions each)."""
    return np.array([VALUES, VALUES[::-1]], dtype)


def pairs(dtype) -> dict:
    """A column and a row whose broadcast pairs every value with every value."""
    column = np.array(VALUES, dtype).reshape(-1, 1)
    return {"x": column, "y": column.reshape(1, -1).copy()}


def rows(dtype) -> np.ndarray:
    """Rows for reductions: a NaN first, inside, last; infinities of one and both signs; zeros
    of both signs in both orders; ordinary numbers with ties."""
    return np.array(
        [
            [np.nan, 1.0, 2.0, -3.0],
            [1.0, np.nan, 2.0, -3.0],
            [1.0, 2.0, -3.0, np.nan],
            [np.nan, np.inf, -np.inf, 1.0],
            [1.0, np.inf, 2.0, -1.0],
            [1.0, -np.inf, 2.0, -1.0],
            [np.inf, -np.inf, 0.5, 2.0],
            [-np.inf, -np.inf, -np.inf, -np.inf],
            [-0.0, -0.0, -0.0, -0.0],
            [-0.0, 0.0, -0.0, 0.0],
            [0.0, -0.0, 0.0, -0.0],
            [-0.0, -1.0, -2.0, -3.0],
            [0.5, -2.5, 3.0, 3.0],
        ],
        dtype,
    )


def rows_without_nan(dtype) -> np.ndarray:
    return rows(dtype)[4:]


def image(dtype, shape=(1, 2, 6, 6), seed=0, nan=True) -> np.ndarray:
    """Ordinary numbers with NaN (unless not ``nan``), +inf, -inf and -0 at a corner, an edge
    and inside."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    n = flat.size
    if nan:
        flat[[0, n // 3, n - 1]] = np.nan
    flat[[n // 5, n // 2]] = np.inf
    flat[[n // 4, (2 * n) // 3]] = -np.inf
    flat[[1, n // 7]] = -0.0
    return x


def normal(dtype, shape, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class Case:
    """One operator's model: nodes reading the feeds and initializers (functions of the float
    type), the outputs' element types (None: the float type), the opset, and whether
    onnxruntime's result is exact."""

    def __init__(
        self,
        name,
        nodes,
        feeds,
        *,
        init=None,
        outputs=("out",),
        types=None,
        opset=21,
        exact=False,
        reference=None,
        dtypes=(F32, F64, F16),
    ):
        self.name, self.nodes, self.feeds = name, nodes, feeds
        self.init = init or (lambda dtype: {})
        self.outputs, self.types = list(outputs), types or {}
        self.opset, self.exact = opset, exact
        self.reference = reference  # other nodes for onnxruntime, where it lacks the operator
        self.dtypes = dtypes

    def model(self, dtype, reference: bool = False) -> bytes:
        feeds, init = self.feeds(dtype), self.init(dtype)
        graph = helper.make_graph(
            (self.reference if reference and self.reference else self.nodes)(dtype),
            self.name,
            [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), None)
                for n, a in feeds.items()
            ],
            [helper.make_tensor_value_info(n, self.types.get(n, ELEMENT[dtype]), None) for n in self.outputs],
            [numpy_helper.from_array(np.asarray(a), n) for n, a in init.items()],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)]).SerializeToString()


def nodes_of(op, inputs=("x",), outputs=("out",), **attrs):
    return lambda dtype: [helper.make_node(op, list(inputs), list(outputs), **attrs)]


def unary(op, name=None, exact=False, opset=21, out=None, **attrs) -> Case:
    types = {"out": out} if out is not None else None
    return Case(name or op, nodes_of(op, **attrs), lambda d: {"x": vector(d)}, exact=exact, opset=opset, types=types)


def binary(op, exact=True, out=None, **attrs) -> Case:
    types = {"out": out} if out is not None else None
    return Case(op, nodes_of(op, ("x", "y"), **attrs), pairs, exact=exact, types=types)


def along_rows(op, name=None, exact=False, out=None, opset=18, axes="input", feed=rows, **attrs) -> Case:
    """Along each row (``out``) and down the columns (``down``); the axis as an attribute
    (``axes="attribute"``), a 1-D input (``"input"``) or a scalar input (``"scalar"``)."""

    def nodes(dtype):
        if axes == "attribute":
            return [
                helper.make_node(op, ["x"], ["out"], axis=1, **attrs),
                helper.make_node(op, ["x"], ["down"], axis=0, **attrs),
            ]
        return [
            helper.make_node(op, ["x", "one"], ["out"], **attrs),
            helper.make_node(op, ["x", "zero"], ["down"], **attrs),
        ]

    shape = () if axes == "scalar" else (1,)
    init = {"one": np.ones(shape, np.int64), "zero": np.zeros(shape, np.int64)}
    return Case(
        name or op,
        nodes,
        lambda d: {"x": feed(d)},
        init=None if axes == "attribute" else (lambda d: init),
        exact=exact,
        outputs=("out", "down"),
        types={"out": out, "down": out} if out is not None else None,
        opset=opset,
    )


def on_image(
    op, name=None, exact=False, init=None, opset=21, inputs=("x",), shape=(1, 2, 6, 6), nan=True, **attrs
) -> Case:
    return Case(
        name or op,
        nodes_of(op, inputs, **attrs),
        lambda d: {"x": image(d, shape, nan=nan)},
        init=init,
        exact=exact,
        opset=opset,
    )


def index(array) -> callable:
    return lambda dtype: {"i": np.array(array, np.int64)}


UNARY_EXACT = "Relu Neg Abs Sign Floor Ceil Round Sqrt Reciprocal Identity".split()
UNARY_ROUNDED = (
    "Exp Log Tanh Erf Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Sigmoid Softplus Softsign "
    "HardSwish Mish Elu Selu HardSigmoid Celu".split()
)
W3 = lambda d: {"w": normal(d, (3, 2, 3, 3)), "b": normal(d, (3,), 2)}  # noqa: E731
CASES = [
    *[unary(op, exact=True) for op in UNARY_EXACT],
    *[unary(op) for op in UNARY_ROUNDED],
    unary("LeakyRelu", exact=True, alpha=0.1),
    unary("ThresholdedRelu", exact=True, alpha=0.7),
    unary("Shrink", exact=True, lambd=0.7, bias=0.2),
    unary("Dropout", exact=True),
    Case(
        "Clip",
        nodes_of("Clip", ("x", "lo", "hi")),
        lambda d: {"x": vector(d)},
        init=lambda d: {"lo": np.array(-0.0, d), "hi": np.array(2, d)},
        exact=True,
    ),
    unary("Gelu", opset=20),
    unary("Gelu", "Gelu_tanh", opset=20, approximate="tanh"),
    unary("Swish", opset=24),
    unary("IsNaN", exact=True, out=BOOL),
    unary("IsInf", exact=True, out=BOOL),
    unary("IsInf", "IsInf_negative", exact=True, out=BOOL, detect_positive=0),
    unary("Cast", "Cast_bool", exact=True, out=BOOL, to=BOOL),
    *[
        unary("Cast", f"Cast_{n}", exact=True, out=ELEMENT[t], to=ELEMENT[t])
        for n, t in (("float", F32), ("double", F64), ("float16", F16))
    ],
    *[binary(op) for op in "Add Sub Mul Div Max Min Sum Mean".split()],
    binary("Pow", exact=False),
    binary("Mod", fmod=1),
    binary("PRelu"),
    *[binary(op, out=BOOL) for op in "Equal Less Greater LessOrEqual GreaterOrEqual".split()],
    Case(
        "Where",
        lambda d: [helper.make_node("Greater", ["x", "y"], ["c"]), helper.make_node("Where", ["c", "x", "y"], ["out"])],
        pairs,
        exact=True,
    ),
    Case(
        "SwiGLU",
        nodes_of("SwiGLU", ("x", "y")),
        lambda d: {"x": vector(d), "y": vector(d)[::-1].copy()},
        opset=28,
        # (onnxruntime 1.32 has no kernel for the Swish of SwiGLU's function body: x sigmoid(x) y)
        reference=lambda d: [
            helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["g"]),
            helper.make_node("Mul", ["g", "y"], ["out"]),
        ],
    ),
    # (NaN-free: onnxruntime's max and min of a slice holding a NaN depend on where it is; see
    # test_reductions_of_nan_as_onnxruntime_where_it_is_defined)
    along_rows("ReduceMax", exact=True, feed=rows_without_nan),
    along_rows("ReduceMin", exact=True, feed=rows_without_nan),
    along_rows("ReduceSum", opset=13),
    *[
        along_rows(op)
        for op in "ReduceMean ReduceProd ReduceSumSquare ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp".split()
    ],
    along_rows("ArgMax", exact=True, out=INT64, axes="attribute"),
    along_rows("ArgMin", exact=True, out=INT64, axes="attribute"),
    along_rows("ArgMax", "ArgMax_last", exact=True, out=INT64, axes="attribute", select_last_index=1),
    along_rows("ArgMin", "ArgMin_last", exact=True, out=INT64, axes="attribute", select_last_index=1),
    along_rows("Hardmax", exact=True, axes="attribute", feed=rows_without_nan),
    along_rows("Softmax", axes="attribute"),
    along_rows("LogSoftmax", axes="attribute"),
    along_rows("CumSum", axes="scalar", opset=14),
    along_rows("CumProd", axes="scalar", opset=26),
    along_rows("LpNormalization", axes="attribute"),
    along_rows("LpNormalization", "LpNormalization_l1", axes="attribute", p=1),
    Case(
        "TopK",
        lambda d: [
            helper.make_node("TopK", ["x", "k"], ["out", "at"], axis=1),
            helper.make_node("TopK", ["x", "k"], ["low", "low_at"], axis=1, largest=0),
        ],
        lambda d: {"x": rows(d)},
        init=lambda d: {"k": np.array([3], np.int64)},
        outputs=("out", "at", "low", "low_at"),
        types={"at": INT64, "low_at": INT64},
        exact=True,
    ),
    Case(
        "LayerNormalization",
        nodes_of("LayerNormalization", ("x", "scale", "bias")),
        lambda d: {"x": rows(d)},
        init=lambda d: {"scale": normal(d, (4,)), "bias": normal(d, (4,), 2)},
    ),
    Case(
        "RMSNormalization",
        nodes_of("RMSNormalization", ("x", "scale")),
        lambda d: {"x": rows(d)},
        init=lambda d: {"scale": normal(d, (4,))},
        opset=23,
    ),
    on_image(
        "InstanceNormalization", inputs=("x", "s", "b"), init=lambda d: {"s": normal(d, (2,)), "b": normal(d, (2,), 2)}
    ),
    on_image(
        "GroupNormalization",
        inputs=("x", "s", "b"),
        init=lambda d: {"s": normal(d, (2,)), "b": normal(d, (2,), 2)},
        num_groups=2,
    ),
    on_image("MeanVarianceNormalization"),
    on_image("LRN", size=3),
    on_image(
        "BatchNormalization",
        inputs=("x", "s", "b", "m", "v"),
        init=lambda d: {
            "s": normal(d, (2,)),
            "b": normal(d, (2,), 2),
            "m": normal(d, (2,), 3),
            "v": np.abs(normal(d, (2,), 4)),
        },
    ),
    on_image("Conv", inputs=("x", "w", "b"), init=W3, pads=[1, 1, 1, 1]),
    on_image("Conv", "Conv_strided", inputs=("x", "w"), init=W3, strides=[2, 2]),
    on_image(
        "Conv",
        "Conv_depthwise",
        inputs=("x", "w"),
        init=lambda d: {"w": normal(d, (2, 1, 3, 3))},
        pads=[1, 1, 1, 1],
        group=2,
    ),
    on_image("Conv", "Conv_pointwise", inputs=("x", "w"), init=lambda d: {"w": normal(d, (3, 2, 1, 1))}),
    on_image(
        "ConvTranspose",
        inputs=("x", "w"),
        init=lambda d: {"w": normal(d, (2, 3, 3, 3))},
        strides=[2, 2],
    ),
    on_image("MaxPool", exact=True, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    on_image("MaxPool", "MaxPool_strided", exact=True, kernel_shape=[2, 2], strides=[2, 2]),
    on_image("AveragePool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    on_image("AveragePool", "AveragePool_exclude_pad", kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    on_image("LpPool", kernel_shape=[2, 2], p=2),
    on_image("GlobalMaxPool", exact=True, nan=False),
    on_image("GlobalAveragePool"),
    Case(
        "MatMul",
        nodes_of("MatMul", ("x", "w")),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (4, 5))},
    ),
    Case(
        "MatMul_special_weights",
        nodes_of("MatMul", ("x", "w")),
        lambda d: {"x": normal(d, (3, 12))},
        init=lambda d: {"w": vector(d).T.copy()},
    ),
    Case(
        "Gemm",
        nodes_of("Gemm", ("x", "w", "c"), transB=1, alpha=0.5, beta=2.0),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (5, 4)), "c": np.array([0.0, -0.0, np.inf, np.nan, 1.0], d)},
    ),
    Case(
        "Einsum",
        nodes_of("Einsum", ("x", "w"), equation="ij,jk->ik"),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (4, 3))},
    ),
    on_image(
        "Resize",
        "Resize_linear",
        inputs=("x", "", "s"),
        init=lambda d: {"s": np.array([1, 1, 2, 2], np.float32)},
        mode="linear",
    ),
    on_image(
        "Resize",
        "Resize_nearest",
        exact=True,
        inputs=("x", "", "s"),
        init=lambda d: {"s": np.array([1, 1, 2, 2], np.float32)},
    ),
    on_image(
        "Resize",
        "Resize_cubic",
        inputs=("x", "", "s"),
        init=lambda d: {"s": np.array([1, 1, 2, 2], np.float32)},
        mode="cubic",
    ),
    on_image(
        "Upsample", exact=True, inputs=("x", "s"), init=lambda d: {"s": np.array([1, 1, 2, 2], np.float32)}, opset=9
    ),
    on_image(
        "GridSample",
        inputs=("x", "g"),
        init=lambda d: {"g": np.random.default_rng(5).uniform(-1, 1, (1, 4, 4, 2)).astype(d)},
    ),
    on_image(
        "RoiAlign",
        inputs=("x", "r", "i"),
        init=lambda d: {"r": np.array([[0, 0, 4, 4], [1, 1, 5, 5]], d), "i": np.array([0, 0], np.int64)},
        output_height=2,
        output_width=2,
        sampling_ratio=2,
    ),
    on_image("DepthToSpace", exact=True, shape=(1, 4, 3, 3), blocksize=2),
    on_image("SpaceToDepth", exact=True, blocksize=2),
    on_image("Transpose", exact=True, perm=[0, 2, 3, 1]),
    on_image("Flatten", exact=True),
    on_image("Tile", exact=True, inputs=("x", "r"), init=lambda d: {"r": np.array([1, 2, 1, 2], np.int64)}),
    on_image(
        "Pad",
        "Pad_reflect",
        exact=True,
        inputs=("x", "p"),
        init=lambda d: {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)},
        mode="reflect",
    ),
    on_image(
        "Pad",
        exact=True,
        inputs=("x", "p", "v"),
        init=lambda d: {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "v": np.array(-0.0, d)},
    ),
    on_image(
        "Slice",
        exact=True,
        inputs=("x", "s", "e", "a", "st"),
        init=lambda d: {"s": np.array([1, 5]), "e": np.array([6, 0]), "a": np.array([2, 3]), "st": np.array([1, -2])},
    ),
    on_image("Gather", exact=True, inputs=("x", "i"), init=index([1, 0, 1]), axis=1),
    on_image("Concat", exact=True, inputs=("x", "x"), axis=3),
    on_image("Trilu", exact=True, inputs=("x",)),
    Case(
        "Expand",
        nodes_of("Expand", ("x", "s")),
        lambda d: {"x": vector(d)[:1]},
        init=lambda d: {"s": np.array([3, 12], np.int64)},
        exact=True,
    ),
    Case(
        "ReverseSequence",
        nodes_of("ReverseSequence", ("x", "l"), batch_axis=0, time_axis=1),
        lambda d: {"x": vector(d)},
        init=lambda d: {"l": np.array([5, 12], np.int64)},
        exact=True,
    ),
    Case(
        "GatherElements",
        nodes_of("GatherElements", ("x", "i"), axis=1),
        lambda d: {"x": vector(d)},
        init=lambda d: {"i": np.array([[11, 0, 3, 4, 4, 1], [2, 3, 4, 0, 0, 1]], np.int64)},
        exact=True,
    ),
    Case(
        "ScatterElements",
        nodes_of("ScatterElements", ("x", "i", "u"), axis=1),
        lambda d: {"x": vector(d)},
        init=lambda d: {
            "i": np.array([[11, 0, 3], [2, 3, 4]], np.int64),
            "u": np.array([[np.nan, -0.0, np.inf], [-np.inf, 0.0, -0.0]], d),
        },
        exact=True,
    ),
    Case(
        "ScatterND",
        nodes_of("ScatterND", ("x", "i", "u")),
        lambda d: {"x": vector(d)},
        init=lambda d: {"i": np.array([[1], [0]], np.int64), "u": vector(d)[::-1].copy()},
        exact=True,
    ),
    Case(
        "Compress",
        nodes_of("Compress", ("x", "c"), axis=1),
        lambda d: {"x": vector(d)},
        init=lambda d: {"c": np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1], bool)},
        exact=True,
    ),
    Case("NonZero", nodes_of("NonZero"), lambda d: {"x": vector(d)}, types={"out": INT64}, exact=True),
    Case(
        "Unique",
        nodes_of("Unique", outputs=("out", "first", "inverse", "counts"), sorted=1),
        lambda d: {"x": np.array([1.0, -0.0, 0.0, np.inf, -np.inf, 1.0, -np.inf, 2.0], d)},
        outputs=("out", "first", "inverse", "counts"),
        types={"first": INT64, "inverse": INT64, "counts": INT64},
        exact=True,
    ),
    Case(
        "RNN",
        nodes_of("RNN", ("x", "w", "r"), outputs=("out",), hidden_size=3),
        lambda d: {"x": image(d, (4, 1, 5)).astype(d)},
        init=lambda d: {"w": normal(d, (1, 3, 5)), "r": normal(d, (1, 3, 3), 2)},
    ),
    Case(
        "DFT",
        nodes_of("DFT", ("x", "", "a")),
        lambda d: {"x": vector(d).reshape(1, 24, 1)},
        init=lambda d: {"a": np.array(1, np.int64)},
        opset=20,
    ),
]


def chain(*nodes):
    """Nodes given as (op, inputs, outputs, attributes), the last output ``out``."""
    return lambda dtype: [helper.make_node(op, list(i), list(o), **a) for op, i, o, a in nodes]


#: Operators fused into one kernel: the epilogues of the convolution, product and reduction
#: kernels keep the special values as the operators do alone.
FUSED = [
    Case(
        "fused_Conv_Relu",
        chain(("Conv", "xwb", "c", {"pads": [1, 1, 1, 1]}), ("Relu", "c", ["out"], {})),
        lambda d: {"x": image(d)},
        init=W3,
    ),
    Case(
        "fused_Conv_BatchNormalization_Clip",
        chain(
            ("Conv", "xw", "c", {"pads": [1, 1, 1, 1]}),
            ("BatchNormalization", ["c", "s", "b", "m", "v"], "n", {}),
            ("Clip", ["n", "lo", "hi"], ["out"], {}),
        ),
        lambda d: {"x": image(d)},
        init=lambda d: {
            **W3(d),
            "s": normal(d, (3,)),
            "m": normal(d, (3,), 3),
            "v": np.abs(normal(d, (3,), 4)),
            "lo": np.array(0, d),
            "hi": np.array(6, d),
        },
        # (not float16: onnxruntime rounds the convolution to float16 before the normalization,
        # which magnifies that rounding by s / sqrt(v) beyond the tolerance; polyc rounds once)
        dtypes=(F32, F64),
    ),
    Case(
        "fused_Gemm_bias_Relu",
        chain(("Gemm", ["x", "w", "c"], ["g"], {"transB": 1}), ("Relu", "g", ["out"], {})),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (5, 4)), "c": np.array([0.0, -0.0, np.inf, np.nan, 1.0], d)},
    ),
    Case(
        "fused_MatMul_Add_Max",
        chain(("MatMul", "xw", ["m"], {}), ("Add", ["m", "c"], ["a"], {}), ("Max", ["a", "z"], ["out"], {})),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (4, 6)), "c": normal(d, (6,), 2), "z": np.array(-0.0, d)},
    ),
    Case(
        "fused_MatMul_Softmax",
        chain(("MatMul", "xw", ["m"], {}), ("Softmax", ["m"], ["out"], {"axis": -1})),
        lambda d: {"x": rows(d)},
        init=lambda d: {"w": normal(d, (4, 6))},
    ),
    Case(
        "fused_LayerNormalization_Mul_Sigmoid",
        chain(
            ("LayerNormalization", ["x", "g", "b"], ["n"], {}),
            ("Mul", ["n", "g"], ["m"], {}),
            ("Sigmoid", ["m"], ["out"], {}),
        ),
        lambda d: {"x": rows(d)},
        init=lambda d: {"g": normal(d, (4,)), "b": normal(d, (4,), 2)},
    ),
]
CASES += FUSED
CASE_NAMES = [case.name for case in CASES]

#: (case, float type or None for all) -> why onnxruntime's result is left out of the comparison.
EXCLUDED: dict[tuple[str, np.dtype | None], str] = {
    ("Sign", F16): "onnxruntime's float16 Sign makes a NaN 0, its float and double Sign keep it "
    "NaN; polyc computes float16 in float and keeps it, as the float kernel does",
    ("LogSoftmax", F64): "onnxruntime's double LogSoftmax takes log(max(sum, 1e-20)) of the sum of "
    "exponentials with a max that drops a NaN (a row holding NaN gives x - max + 46.05); its float "
    "LogSoftmax and polyc give NaN there",
    ("MaxPool", F64): "onnxruntime's double MaxPool makes a window holding a NaN NaN, its float "
    "MaxPool (MLAS's) skips the NaN, as polyc does in every type",
    ("MaxPool_strided", F64): "as MaxPool's",
    ("Resize_cubic", None): "onnxruntime multiplies an edge element by each cubic tap clamped onto "
    "it, of weights of both signs, so an infinity there gives inf - inf = NaN; onnx's reference, "
    "whose weights polyc computes with, sums the clamped taps' weights first and gives the infinity",
    ("MeanVarianceNormalization", F16): "ONNX's function body adds a float epsilon to the float16 "
    "deviation, which polyc refuses as operands of two types; onnxruntime has a kernel of its own",
}
#: (case, float type or None) -> why zeros are compared without their signs there.
UNSIGNED_ZEROS: dict[tuple[str, np.dtype | None], str] = {
    ("Celu", None): "onnxruntime's Celu kernel makes -0 +0; ONNX defines Celu as the function "
    "alpha Elu(x / alpha), which polyc runs and which gives -0 (so does onnxruntime's Elu)",
    ("Max", F16): "onnxruntime's float16 Max and Min give the second of two equal zeros, its float "
    "and double ones the first, as polyc does in every type",
    ("Min", F16): "as Max's",
    ("Where", None): "onnxruntime's Where selects X's elements and Y's in two passes merged where "
    "X's part is not zero: an X of -0 selected comes out +0 (a Y of -0 stays -0); polyc selects",
}
#: (case, float type or None) -> why the comparison is within tolerance where the case is exact.
ROUNDED: dict[tuple[str, np.dtype | None], str] = {
    ("Shrink", F64): "onnxruntime's double Shrink rounds x -+ bias to float (0.8 for 1 - 0.2 is "
    "float's 0.800000011920929); polyc computes in double",
}


def _reason(table: dict, name: str, dtype) -> str | None:
    return table.get((name, dtype)) or table.get((name, None))


def reference_session(model: bytes, dtype) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime's kernel lookup raises its own types
        if dtype == F32:
            raise  # every case runs in float: a failure there is the case's own mistake
        pytest.skip(f"onnxruntime has no {dtype} kernel: {str(error).splitlines()[0][:160]}")


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_agree(ours: np.ndarray, theirs: np.ndarray, exact: bool, what: str, signed_zeros: bool = True) -> None:
    """Exact: equal bits where onnxruntime's is not NaN, NaN where it is.  Rounded: the same
    NaN, infinities and signs of zeros, the finite numbers within the backend tolerance.
    Without ``signed_zeros``, -0 and +0 are one value."""
    if not signed_zeros and theirs.dtype.kind == "f":
        ours, theirs = ours + 0, theirs + 0  # (-0 + 0 is +0)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (what, ours.shape, theirs.shape, ours.dtype)
    if theirs.dtype.kind != "f":
        np.testing.assert_array_equal(ours, theirs, err_msg=what)
        return
    nan = np.isnan(theirs)
    np.testing.assert_array_equal(np.isnan(ours), nan, err_msg=f"{what}: NaN positions\n{ours}\n{theirs}")
    if exact:
        np.testing.assert_array_equal(_bits(ours[~nan]), _bits(theirs[~nan]), err_msg=f"{what}: bits\n{ours}\n{theirs}")
        return
    infinite = np.isinf(theirs)
    np.testing.assert_array_equal(np.isinf(ours), infinite, err_msg=f"{what}: inf positions\n{ours}\n{theirs}")
    np.testing.assert_array_equal(ours[infinite], theirs[infinite], err_msg=f"{what}: inf signs")
    zeros = (ours == 0) & (theirs == 0)
    np.testing.assert_array_equal(
        np.signbit(ours[zeros]), np.signbit(theirs[zeros]), err_msg=f"{what}: signs of zeros\n{ours}\n{theirs}"
    )
    finite = np.isfinite(theirs)
    dtype = np.dtype(theirs.dtype)
    np.testing.assert_allclose(
        ours[finite].astype(np.float64),
        theirs[finite].astype(np.float64),
        rtol=RTOL.get(dtype, 1e-3),
        atol=ATOL,
        err_msg=what,
    )


@pytest.mark.parametrize("dtype", [F32, F64, F16], ids=["float", "double", "float16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_NAMES)
def test_special_values_as_onnxruntime(case, dtype):
    if dtype not in case.dtypes:
        pytest.skip(f"{case.name} runs in {', '.join(str(d) for d in case.dtypes)} (see its case)")
    reason = _reason(EXCLUDED, case.name, dtype)
    if reason:
        pytest.skip(reason)
    feeds = case.feeds(dtype)
    theirs = reference_session(case.model(dtype, reference=True), dtype).run(None, feeds)
    ours = ponnx.InferenceSession(case.model(dtype)).run(None, feeds)
    exact = case.exact and not _reason(ROUNDED, case.name, dtype)
    signed = not _reason(UNSIGNED_ZEROS, case.name, dtype)
    for name, a, c in zip(case.outputs, ours, theirs):
        assert_agree(np.asarray(a), np.asarray(c), exact, f"{case.name} {dtype} output {name}", signed)


#: Operators with converters (or run as ONNX functions) that the sweep leaves out, and why.
NOT_SWEPT = {
    **dict.fromkeys(
        "And Or Xor Not BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot".split(), "integer or bool operands only"
    ),
    **dict.fromkeys(
        "Shape Size Constant ConstantOfShape Range EyeLike OneHot".split(), "no float elements read (shapes, constants)"
    ),
    **dict.fromkeys(
        "Reshape Squeeze Unsqueeze Split GatherND Scatter TensorScatter OptionalHasElement "
        "OptionalGetElement BitCast CastLike".split(),
        "moves or reinterprets elements as the swept Flatten, Gather, Slice, ScatterND and Cast do",
    ),
    **dict.fromkeys(
        "QuantizeLinear DequantizeLinear MatMulInteger QLinearMatMul ConvInteger QLinearConv DynamicQuantizeLinear".split(),
        "quantized operators: a NaN has no integer (onnxruntime's rounding of NaN to an integer is the "
        "conversion's, undefined in C++)",
    ),
    **dict.fromkeys(
        "HannWindow HammingWindow BlackmanWindow MelWeightMatrix".split(), "computed from sizes, no float input"
    ),
    **dict.fromkeys(["GRU", "LSTM"], "the same unrolled kernels as the swept RNN, more gates"),
    "STFT": "the swept DFT's kernels over frames",
    "DeformConv": "the swept RoiAlign's bilinear samples and Conv's products",
    "Col2Im": "sums of moved elements, as the swept ConvTranspose",
    "TfIdfVectorizer": "integer or string n-grams",
    "NonMaxSuppression": "selection by scores: a NaN score's order is the sweep's TopK's",
    "MaxUnpool": "moves elements to indices, as the swept ScatterElements",
    **dict.fromkeys(
        "Attention RotaryEmbedding LinearAttention CausalConvWithState SoftmaxCrossEntropyLoss "
        "NegativeLogLikelihoodLoss CenterCropPad AffineGrid Bernoulli SequenceMap".split(),
        "ONNX functions whose bodies are swept operators (MatMul, Softmax, Mul, ...) or not float maths",
    ),
}


def test_the_sweep_covers_every_float_operator():
    from polyc.frontends.onnx.ops import CONVERTERS

    swept = {node.op_type for case in CASES for node in case.nodes(F32)}
    known = set(CONVERTERS) | set(ponnx.function_operators())
    missing = sorted(known - swept - set(NOT_SWEPT))
    assert not missing, f"operators neither swept nor listed in NOT_SWEPT with a reason: {missing}"


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float", "double"])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 5), (2, 33, 3)], ids=str)
def test_argmax_and_argmin_with_nan_as_onnxruntime_along_every_axis(shape, dtype):
    # onnxruntime's ArgMax/ArgMin keep the first element until one compares above (below) it,
    # so a NaN first is index 0 and a NaN elsewhere is never taken (checked against that rule
    # on float, double and float16 along every axis of these shapes and others)
    rng = np.random.default_rng(len(shape))
    x = rng.integers(-3, 4, shape).astype(dtype)
    u = rng.random(shape)
    x[u < 0.15], x[(u > 0.15) & (u < 0.2)], x[(u > 0.2) & (u < 0.25)] = np.nan, np.inf, -np.inf
    x[(u > 0.25) & (u < 0.3)] = -0.0
    nodes, outputs = [], []
    for axis in range(len(shape)):
        for op in ("ArgMax", "ArgMin"):
            for last in (0, 1):
                outputs.append(f"{op}_{axis}_{last}")
                nodes.append(helper.make_node(op, ["x"], [outputs[-1]], axis=axis, select_last_index=last))
    case = Case("args", lambda d: nodes, lambda d: {"x": x}, outputs=outputs, types=dict.fromkeys(outputs, INT64))
    model = case.model(dtype)
    theirs = reference_session(model, dtype).run(None, {"x": x})
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    for name, a, c in zip(outputs, ours, theirs):
        np.testing.assert_array_equal(a, c, err_msg=name)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "GlobalMaxPool"])
@pytest.mark.parametrize("dtype", [F32, F64, F16])
def test_the_max_and_min_of_nans_only_are_nan(op, dtype):
    # onnxruntime gives NaN for a slice of NaNs only; fmax's rule alone would give -inf or inf.
    # (Only slices of NaNs and slices without: where a slice mixes them, onnxruntime's answer
    # depends on the NaNs' positions, see the next test.)
    x = np.full((1, 2, 4, 4) if op == "GlobalMaxPool" else (2, 16), np.nan, dtype)
    if op == "GlobalMaxPool":
        x[0, 1] = np.arange(16, dtype=dtype).reshape(4, 4)
        nodes = nodes_of(op)
    else:
        x[1] = np.arange(16, dtype=dtype)
        nodes = nodes_of(op, axes=[1])
    model = Case(op, nodes, lambda d: {"x": x}, opset=13).model(dtype)
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    (theirs,) = reference_session(model, dtype).run(None, {"x": x})
    np.testing.assert_array_equal(ours, theirs)
    assert np.isnan(ours.ravel()[0]) and not np.isnan(ours.ravel()[1])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "Hardmax", "GlobalMaxPool"])
def test_max_and_min_of_slices_holding_nan_skip_the_nan(op):
    # Left out of the sweep's comparison: onnxruntime's max and min of a slice holding a NaN
    # depend on where the NaN lies against its vector lanes and the slice's alignment (Eigen's
    # vectorised reductions): a NaN first in a row of 4 gives NaN, one second need not, and a
    # NaN first gives NaN in some rows of a 5 x 7 tensor and not in others.  No rule to match,
    # polyc's is fmax's and fmin's: a NaN is skipped, and the others' max or min is the result.
    x = rows(F32)[:4].reshape(1, 4, 4, 1) if op == "GlobalMaxPool" else rows(F32)[:4]
    if op == "GlobalMaxPool":
        nodes, want = nodes_of(op), np.fmax.reduce(x, axis=(2, 3), keepdims=True)
    elif op == "Hardmax":
        nodes = nodes_of(op, axis=1)
        want = (np.arange(4) == np.argmax(np.where(np.isnan(x), -np.inf, x), axis=1)[:, None]).astype(np.float32)
    else:
        nodes = nodes_of(op, axes=[1])
        want = (np.fmax if op == "ReduceMax" else np.fmin).reduce(x, axis=1, keepdims=True)
    model = Case(op, nodes, lambda d: {"x": x}, opset=13).model(F32)
    (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(ours, want)


def test_winograd_differs_from_onnxruntime_only_in_tiles_holding_inf_or_nan():
    # ONNX sessions compute 3x3 convolutions of 16 to 256 channels by Winograd's F(2x2, 3x3),
    # whose transforms add and subtract a 4 x 4 input tile's elements: an infinity there can make
    # inf - inf = NaN in the four outputs of the tile, and a NaN NaN in all four, where
    # the direct convolution (onnxruntime's, and polyc's with winograd=False) gives +-inf or
    # NaN only in the outputs whose 3 x 3 window holds it.  Finite inputs agree within rounding
    # everywhere; every other output here agrees too.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32)
    x[0, 3, 5, 6], x[0, 7, 11, 2], x[0, 9, 0, 15] = np.inf, -np.inf, np.nan
    case = Case(
        "winograd",
        nodes_of("Conv", ("x", "w"), pads=[1, 1, 1, 1]),
        lambda d: {"x": x},
        init=lambda d: {"w": w},
    )
    model = case.model(F32)
    (theirs,) = reference_session(model, F32).run(None, {"x": x})
    by_winograd = ponnx.InferenceSession(model)
    assert any("Winograd F(2x2, 3x3)" in k.c_source({}) for k in by_winograd.kernels({"x": x.shape}))
    (ours,) = by_winograd.run(None, {"x": x})
    (direct,) = ponnx.InferenceSession(model, winograd=False).run(None, {"x": x})
    assert_agree(direct, theirs, False, "direct convolution")
    # The output tiles (2 x 2, from (0, 0)) whose 4 x 4 input tiles (padded by 1) hold a
    # non-finite input: tile (i, j) reads padded rows 2i .. 2i + 3, image rows 2i - 1 .. 2i + 2.
    touched = np.zeros((16, 16), bool)
    for _, r, c in zip(*np.nonzero(~np.isfinite(x[0]))):
        for i in range(8):
            for j in range(8):
                if 2 * i - 1 <= r <= 2 * i + 2 and 2 * j - 1 <= c <= 2 * j + 2:
                    touched[2 * i : 2 * i + 2, 2 * j : 2 * j + 2] = True
    inside = np.broadcast_to(touched, ours.shape)
    assert np.isnan(ours[inside]).any() and not np.isnan(theirs[inside]).all()
    # (rtol and atol: Winograd's rounding, as test_session's check of the kernel)
    assert np.all(np.isnan(ours[inside]) | np.isclose(ours[inside], theirs[inside], rtol=1e-4, atol=1e-5))
    outside = ~inside
    np.testing.assert_array_equal(np.isnan(ours[outside]), np.isnan(theirs[outside]))
    np.testing.assert_allclose(ours[outside], theirs[outside], rtol=1e-4, atol=1e-5)
