"""Operators beyond the issue's list, where onnx's node cases leave paths untried: CumSum along
long axes (the blocked sums), Upsample and Resize of opset 10 (linear, and downsampling),
GatherElements' and OneHot's edge cases.  Against numpy and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from polyc.errors import PolycError  # noqa: E402
from polyc.frontends.onnx.ops.reductions import CUMSUM_BLOCK, CUMSUM_DIRECT, TOPK_SELECT_FROM  # noqa: E402

_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
}


def one_node_model(node, inputs: dict, output_type, initializers=(), opset: int = 21):
    """The node as a model; its output's shape is onnx's shape inference's."""
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info(name, _TYPES[array.dtype], list(array.shape)) for name, array in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], output_type, None)],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].CopyFrom(inferred.graph.output[0])
    assert model.graph.output[0].type.tensor_type.HasField("shape")
    return model


def run_both(model, feeds: dict):
    ours = ponnx.InferenceSession(model).run(None, feeds)[0]
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return ours, theirs


def numpy_cumsum(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    sums = np.cumsum(y, axis=axis, dtype=x.dtype)
    if exclusive:
        sums = sums - y
    return np.flip(sums, axis) if reverse else sums


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.int64, np.float64], ids=["int64", "float64"])
def test_cumsum_along_a_long_axis_in_blocks(exclusive, reverse, dtype):
    # 300 along the middle axis (blocks of 8, the last one 4 long): past CUMSUM_DIRECT, so
    # the blocked form; integers must come out exact, doubles to rounding.
    assert 300 > CUMSUM_DIRECT and 300 % CUMSUM_BLOCK
    x = np.random.default_rng(1).integers(-50, 50, (2, 300, 3)).astype(dtype)
    axis = numpy_helper.from_array(np.array(-2, np.int64), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = one_node_model(node, {"x": x}, _TYPES[np.dtype(dtype)], [axis])
    ours, theirs = run_both(model, {"x": x})
    expected = numpy_cumsum(x, 1, exclusive, reverse)
    np.testing.assert_array_equal(theirs, expected)
    if dtype == np.int64:
        np.testing.assert_array_equal(ours, expected)
    else:
        np.testing.assert_allclose(ours, expected, rtol=1e-12)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 1)])
def test_cumsum_along_a_very_long_axis_in_levels_of_blocks(exclusive, reverse):
    # 10000 elements: blocks of 64, whose 157 totals are summed in blocks of 13 in turn.
    x = np.random.default_rng(2).integers(-50, 50, (10000, 2)).astype(np.int64)
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    ours, _ = run_both(one_node_model(node, {"x": x}, TensorProto.INT64, [axis]), {"x": x})
    np.testing.assert_array_equal(ours, numpy_cumsum(x, 0, exclusive, reverse))


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_along_a_long_axis_in_blocks(exclusive, reverse):
    # Products of 300 factors of -1 and 1 (exact in int64) and near 1 (float64), blocked as
    # CumSum is; against numpy (onnxruntime has no CumProd yet), the reverse and exclusive
    # forms as flips and a shift by one.
    rng = np.random.default_rng(4)
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    for x in (rng.choice(np.array([-1, 1], np.int64), (2, 300, 3)), rng.uniform(0.98, 1.02, (2, 300, 3))):
        model = one_node_model(node, {"x": x}, _TYPES[x.dtype], [axis], opset=26)
        (ours,) = ponnx.InferenceSession(model).run(None, {"x": x})
        y = np.flip(x, 1) if reverse else x
        products = np.cumprod(y, axis=1, dtype=x.dtype)
        if exclusive:
            products = np.concatenate([np.ones_like(products[:, :1]), products[:, :-1]], axis=1)
        expected = np.flip(products, 1) if reverse else products
        np.testing.assert_allclose(ours, expected, rtol=1e-12)


def test_cumsum_of_float32_positions_from_a_mask():
    # A transformer's position ids from its attention mask: cumsum(mask) * mask - 1, over a
    # sequence of 512, in float32 within the backend suite's tolerance.
    mask = (np.random.default_rng(2).random((4, 512)) > 0.2).astype(np.float32)
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    model = one_node_model(helper.make_node("CumSum", ["x", "axis"], ["y"]), {"x": mask}, TensorProto.FLOAT, [axis])
    ours, theirs = run_both(model, {"x": mask})
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize(
    "mode,scales", [("nearest", [1, 1, 2, 3]), ("linear", [1, 1, 2, 2]), ("nearest", [1, 1, 0.5, 0.5])]
)
def test_opset_9_upsample_and_opset_10_resize_as_onnxruntime(mode, scales):
    x = np.random.default_rng(3).standard_normal((1, 2, 4, 6)).astype(np.float32)
    table = numpy_helper.from_array(np.array(scales, np.float32), "scales")
    for op, opset in (("Upsample", 9), ("Resize", 10)):
        if op == "Upsample" and min(scales) < 1:
            continue  # Upsample's scales are at least 1
        model = one_node_model(
            helper.make_node(op, ["x", "scales"], ["y"], mode=mode), {"x": x}, TensorProto.FLOAT, [table], opset=opset
        )
        ours, theirs = run_both(model, {"x": x})
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6, err_msg=f"{op}-{opset}")


def test_gather_elements_counts_negative_indices_from_the_end_and_checks_the_others():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    index = np.array([[0, -1, 2], [-4, 1, 3]], np.int64)
    node = helper.make_node("GatherElements", ["x", "index"], ["y"], axis=1)
    model = one_node_model(node, {"x": x, "index": index}, TensorProto.FLOAT)
    ours, theirs = run_both(model, {"x": x, "index": index})
    np.testing.assert_array_equal(ours, np.take_along_axis(x[:2], index % 4, axis=1))
    np.testing.assert_array_equal(ours, theirs)
    session = ponnx.InferenceSession(model)
    with pytest.raises(PolycError, match="outside"):
        session.run(None, {"x": x, "index": np.array([[0, 4, 1], [0, 0, 0]], np.int64)})


def test_one_hot_leaves_indices_out_of_range_off():
    index = np.array([[0, 3, -1], [5, -6, 2]], np.int64)
    depth = numpy_helper.from_array(np.array(5, np.int64), "depth")
    values = numpy_helper.from_array(np.array([-1.0, 2.0], np.float32), "values")
    node = helper.make_node("OneHot", ["index", "depth", "values"], ["y"], axis=1)
    model = one_node_model(node, {"index": index}, TensorProto.FLOAT, [depth, values])
    ours, theirs = run_both(model, {"index": index})
    expected = np.where(np.arange(5)[None, :, None] == np.where(index < 0, index + 5, index)[:, None, :], 2.0, -1.0)
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(ours, theirs)


def test_a_scalar_mean_and_a_division_by_a_scalar_sum():
    # Two bugs onnx's loss expansions found: a mean over every axis without keepdims read its
    # scalar at another index than it wrote, and a division fused into the sum that made its
    # scalar divisor updated the scalar in place, the same way.  Both were TC errors.
    x = np.random.default_rng(4).random((3, 2)).astype(np.float32)
    w = np.array(2.0, np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Div", ["w", "total"], ["ratio"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scalars",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("mean", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("ratio", TensorProto.FLOAT, []),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for fusion in (True, False):
        mean, ratio = ponnx.InferenceSession(model, graph_fusion=fusion).run(None, {"x": x, "w": w})
        np.testing.assert_allclose(mean, x.mean(), rtol=1e-6)
        np.testing.assert_allclose(ratio, w / x.sum(), rtol=1e-6)


@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=["float32", "int32"])
def test_top_k_orders_ties_by_index_as_onnxruntime(largest, dtype):
    # Many ties (values from 0 to 9 along 1000 class scores, top 20), along the middle axis.
    x = np.random.default_rng(5).integers(0, 10, (2, 1000, 3)).astype(dtype)
    k = numpy_helper.from_array(np.array([20], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=largest)
    graph = helper.make_graph(
        [node],
        "topk",
        [helper.make_tensor_value_info("x", _TYPES[np.dtype(dtype)], x.shape)],
        [
            helper.make_tensor_value_info("values", _TYPES[np.dtype(dtype)], [2, 20, 3]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 20, 3]),
        ],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for mine, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, expected)


def test_top_k_puts_nan_above_every_number_as_onnxs_reference():
    x = np.array([[1.0, np.nan, -0.0, np.inf, 0.0, np.nan, -np.inf, 2.0]], np.float32)
    for largest in (1, 0):
        k = numpy_helper.from_array(np.array([8], np.int64), "k")
        node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], largest=largest)
        graph = helper.make_graph(
            [node],
            "topk",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
            [
                helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, 8]),
                helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 8]),
            ],
            [k],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        values, positions = ponnx.InferenceSession(model).run(None, {"x": x})
        expected_values, expected_positions = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_array_equal(positions, expected_positions)
        np.testing.assert_array_equal(values, expected_values)


def _top_k_model(x, k: int, axis: int, largest: int):
    types = {**_TYPES, np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.uint8): TensorProto.UINT8}
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    shape = list(x.shape)
    shape[axis] = k
    graph = helper.make_graph(
        [node],
        "topk",
        [helper.make_tensor_value_info("x", types[x.dtype], x.shape)],
        [
            helper.make_tensor_value_info("values", types[x.dtype], shape),
            helper.make_tensor_value_info("indices", TensorProto.INT64, shape),
        ],
        [numpy_helper.from_array(np.array([k], np.int64), "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "dtype,largest,k",
    [
        (np.float32, 1, 40),
        (np.float32, 0, 700),
        (np.float64, 0, 40),
        (np.float16, 1, 40),
        (np.int64, 1, 900),
        (np.uint8, 0, 40),
        (np.int32, 1, 1400),
    ],
    ids=[
        "float32-largest",
        "float32-smallest-half",
        "float64-smallest",
        "float16-largest",
        "int64-largest-most",
        "uint8-smallest",
        "int32-largest-into-the-least",
    ],
)
def test_top_k_of_a_long_axis_selects_by_key_as_onnxs_reference(dtype, largest, k):
    # Past TOPK_SELECT_FROM, TopK selects by integer keys: many ties (values 0 to 49, so the
    # k-th value is tied), and for floats NaN, +-0, +-inf and negative numbers; a row of equal
    # values (the first k by index); the least int32, whose key is that of the padding past
    # the row's 1500 elements (to 1536), among the selected.
    assert 1500 >= TOPK_SELECT_FROM
    rng = np.random.default_rng(9)
    x = rng.integers(0, 50, (3, 1500)).astype(dtype)
    if x.dtype.kind == "f":
        x[0] -= 25
        x[0, rng.choice(1500, 60, replace=False)] = np.nan
        x[1, rng.choice(1500, 300, replace=False)] = rng.choice([0.0, -0.0, np.inf, -np.inf], 300)
        x[1, :50] = rng.standard_normal(50) * 1e-30 if dtype != np.float16 else -0.0
    if x.dtype == np.int32:
        x[1, ::5] = np.iinfo(np.int32).min
    x[2] = 7
    model = _top_k_model(x, k, 1, largest)
    values, positions = ponnx.InferenceSession(model).run(None, {"x": x})
    expected_values, expected_positions = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(positions, expected_positions)
    np.testing.assert_array_equal(values, expected_values)


def test_top_k_of_a_long_middle_axis_as_onnxruntime():
    x = np.random.default_rng(10).integers(-1000, 1000, (2, 1100, 3)).astype(np.int32)
    model = _top_k_model(x, 25, 1, 1)
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for mine, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, expected)


def scatter_model(op: str, data, index, updates, opset: int = 18, **attributes):
    node = helper.make_node(op, ["data", "index", "updates"], ["y"], **attributes)
    arrays = {"data": data, "index": index, "updates": updates}
    return one_node_model(node, arrays, _TYPES[data.dtype], opset=opset), arrays


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd_updates_a_cache_at_positions_as_onnxruntime(reduction):
    # A key cache (batch 1, 4 heads, 16 positions, 8 features) updated at positions 5 and 9 of
    # every head; "add" and "max" with two updates aimed at one row.
    rng = np.random.default_rng(6)
    cache = rng.standard_normal((1, 4, 16, 8)).astype(np.float32)
    positions = [5, 9] if reduction == "none" else [5, 5]
    index = np.array([[[0, h, p] for p in positions] for h in range(4)], np.int64)
    index[1, 0, 2] -= 16  # a negative position counts from the end
    updates = rng.standard_normal((4, 2, 8)).astype(np.float32)
    model, feeds = scatter_model("ScatterND", cache, index, updates, reduction=reduction)
    ours, theirs = run_both(model, feeds)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    assert np.array_equal(feeds["data"], cache)  # the feed itself is not written


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "min"])
def test_scatter_elements_along_an_axis_with_fewer_rows_of_indices(reduction):
    # Indices with 2 of the data's 3 rows and 2 of its 5 columns (axis 1): elements beyond them
    # keep the data; int64 data, so results are exact.
    rng = np.random.default_rng(7)
    data = rng.integers(-9, 9, (3, 5)).astype(np.int64)
    index = np.array([[4, 0], [-1, 2]], np.int64) if reduction == "none" else np.array([[1, 1], [3, -2]], np.int64)
    updates = rng.integers(-9, 9, (2, 2)).astype(np.int64)
    model, feeds = scatter_model("ScatterElements", data, index, updates, axis=1, reduction=reduction)
    ours, theirs = run_both(model, feeds)
    np.testing.assert_array_equal(ours, theirs)


def test_scatter_indices_outside_the_data_are_errors_not_dropped_updates():
    data = np.zeros((4, 3), np.float32)
    model, _ = scatter_model("ScatterND", data, np.array([[1]], np.int64), np.ones((1, 3), np.float32))
    session = ponnx.InferenceSession(model)
    np.testing.assert_array_equal(
        session.run(None, {"data": data, "index": np.array([[-1]], np.int64), "updates": np.ones((1, 3), np.float32)})[
            0
        ][3],
        1,
    )
    with pytest.raises(PolycError, match="outside"):
        session.run(None, {"data": data, "index": np.array([[4]], np.int64), "updates": np.ones((1, 3), np.float32)})
    model, _ = scatter_model("ScatterElements", data, np.array([[0, 1, 2]], np.int64), np.ones((1, 3), np.float32))
    with pytest.raises(PolycError, match="outside"):
        ponnx.InferenceSession(model).run(
            None, {"data": data, "index": np.array([[0, -5, 2]], np.int64), "updates": np.ones((1, 3), np.float32)}
        )


def test_top_k_of_none_is_empty():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = numpy_helper.from_array(np.array([0], np.int64), "k")
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"])
    graph = helper.make_graph(
        [node],
        "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, [2, 0]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [2, 0]),
        ],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    values, positions = ponnx.InferenceSession(model).run(None, {"x": x})
    assert values.shape == positions.shape == (2, 0) and positions.dtype == np.int64


@pytest.mark.parametrize("inverse,onesided,length", [(1, 0, None), (0, 1, None), (1, 1, None), (0, 0, 12), (0, 1, 7)])
def test_dft_against_numpys_double_fft(inverse, onesided, length):
    # onnx's own inverse cases expect float32 FFT rounding (node_suite.IMPRECISE_EXPECTATIONS);
    # here the exact answer, within the error of polyc's computation: a complex signal of 10 along axis 1, or a
    # real one for the one-sided forward transform; a DFT length that pads (12) or cuts (7).
    rng = np.random.default_rng(8)
    parts = 1 if onesided and not inverse else 2
    samples = 6 if inverse and onesided else 10
    x = rng.integers(-99, 99, (2, samples, 3, parts)).astype(np.float32)
    inputs = ["x", "length" if length else "", "axis"]
    tables = [numpy_helper.from_array(np.array(1, np.int64), "axis")]
    if length:
        tables.append(numpy_helper.from_array(np.array(length, np.int64), "length"))
    model = one_node_model(
        helper.make_node("DFT", inputs, ["y"], inverse=inverse, onesided=onesided),
        {"x": x},
        TensorProto.FLOAT,
        tables,
        opset=20,
    )
    ours = ponnx.InferenceSession(model).run(None, {"x": x})[0]
    signal = x[..., 0].astype(np.float64) + (1j * x[..., 1] if parts == 2 else 0)
    if inverse and onesided:
        expected = np.fft.irfft(signal, n=length or 2 * (samples - 1), axis=1)[..., None]
    else:
        spectrum = (np.fft.ifft if inverse else np.fft.fft)(signal, n=length, axis=1)
        if onesided:
            spectrum = spectrum[:, : spectrum.shape[1] // 2 + 1]
        expected = np.stack([spectrum.real, spectrum.imag], axis=-1)
    # polyc sums the terms (integers below 99 times a matrix entry of at most 1) in double and
    # rounds once to float32: half a float32 spacing, 2^-24 relative, beside the double sum's
    # error of at most terms^2 * 99 * 2^-53 (numpy's FFT in double is as close).
    terms = max(samples, length or 0) * parts
    np.testing.assert_allclose(ours, expected, rtol=2.0**-24, atol=terms**2 * 99 * 2.0**-52)


def test_bit_operations_against_onnxruntime():
    # BitShift of uint32 by counts broadcast along rows, and the bitwise operators of int8
    # with a broadcast mask; counts stay below the width, where C (and onnxruntime) define them.
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2**32, (4, 6), dtype=np.uint64).astype(np.uint32)
    counts = rng.integers(0, 32, (1, 6)).astype(np.uint32)
    a = rng.integers(-128, 128, (4, 6)).astype(np.int8)
    mask = rng.integers(-128, 128, (6,)).astype(np.int8)
    nodes = [
        helper.make_node("BitShift", ["x", "counts"], ["left"], direction="LEFT"),
        helper.make_node("BitShift", ["x", "counts"], ["right"], direction="RIGHT"),
        helper.make_node("BitwiseAnd", ["a", "mask"], ["and"]),
        helper.make_node("BitwiseOr", ["a", "mask"], ["or"]),
        helper.make_node("BitwiseXor", ["a", "mask"], ["xor"]),
        helper.make_node("BitwiseNot", ["a"], ["not"]),
    ]
    types = {np.dtype(np.uint32): TensorProto.UINT32, np.dtype(np.int8): TensorProto.INT8}
    feeds = {"x": x, "counts": counts, "a": a, "mask": mask}
    outputs = {"left": x, "right": x, "and": a, "or": a, "xor": a, "not": a}
    graph = helper.make_graph(
        nodes,
        "bits",
        [helper.make_tensor_value_info(n, types[v.dtype], list(v.shape)) for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, types[v.dtype], [4, 6]) for n, v in outputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ours = ponnx.InferenceSession(model).run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    expected = [x << counts, x >> counts, a & mask, a | mask, a ^ mask, ~a]
    for got, their, want in zip(ours, theirs, expected, strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(their, want)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_far_outside_the_image(mode, padding, align):
    # Points up to three image widths outside (reflected back several times), in 2-D and 3-D
    # against onnx's reference (opset 20), in 2-D also against onnxruntime (opset 16), except
    # cubic sampling with border padding: there onnxruntime, as PyTorch, clamps only each tap's
    # index, where onnx's reference first clamps the coordinate too: they differ by 0.02 to 0.18).
    rng = np.random.default_rng(8)
    for spatial in ((5, 7), (3, 4, 5)):
        k = len(spatial)
        x = rng.standard_normal((2, 3, *spatial)).astype(np.float32)
        grid = rng.uniform(-3, 3, (2, *[4] * k, k)).astype(np.float32)
        feeds = {"x": x, "grid": grid}
        for opset in (20, 16) if k == 2 and (mode, padding) != ("cubic", "border") else (20,):
            name = {"linear": "bilinear", "cubic": "bicubic"}.get(mode, mode) if opset == 16 else mode
            node = helper.make_node(
                "GridSample", ["x", "grid"], ["y"], mode=name, padding_mode=padding, align_corners=align
            )
            model = one_node_model(node, feeds, TensorProto.FLOAT, opset=opset)
            (ours,) = ponnx.InferenceSession(model).run(None, feeds)
            if opset == 16:
                theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
                    None, feeds
                )[0]
            else:
                theirs = ReferenceEvaluator(model).run(None, feeds)[0]
            np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("batch_axis", [0, 1])
def test_reverse_sequence_against_onnxruntime(batch_axis):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 6, 3) if batch_axis == 0 else (6, 4, 3)).astype(np.float32)
    lengths = np.array([6, 0, 1, 4], np.int64)
    node = helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], batch_axis=batch_axis, time_axis=1 - batch_axis)
    model = one_node_model(node, {"x": x, "lengths": lengths}, TensorProto.FLOAT, opset=10)
    ours, theirs = run_both(model, {"x": x, "lengths": lengths})
    np.testing.assert_array_equal(ours, theirs)
    with pytest.raises(PolycError, match="out of range"):  # a length beyond the sequence
        ponnx.InferenceSession(model).run(None, {"x": x, "lengths": np.array([7, 0, 1, 4], np.int64)})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_updates_a_key_value_cache(mode):
    # A cache of 8 positions per (batch, head), updated with 3 new ones from each batch entry's
    # write index; circular wraps past the end.  Against onnx's reference.
    rng = np.random.default_rng(12)
    cache = rng.standard_normal((2, 3, 8, 4)).astype(np.float32)
    update = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    where = np.array([5, 1] if mode == "linear" else [6, 7], np.int64)
    node = helper.make_node("TensorScatter", ["cache", "update", "where"], ["present"], mode=mode)
    feeds = {"cache": cache, "update": update, "where": where}
    model = one_node_model(node, feeds, TensorProto.FLOAT, opset=24)
    (ours,) = ponnx.InferenceSession(model).run(None, feeds)
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, feeds)[0])
    assert np.array_equal(feeds["cache"], cache)  # the user's cache is not written
    if mode == "linear":  # positions 6 to 8 of a cache of 8
        with pytest.raises(PolycError, match="out of range"):
            ponnx.InferenceSession(model).run(None, {**feeds, "where": np.array([6, 1], np.int64)})


@pytest.mark.parametrize("attributes", [dict(), dict(strides=[2, 3], dilations=[2, 1], pads=[1, 0, 2, 1])])
def test_col2im_against_onnxruntime(attributes):
    # Columns of 3 x 2 blocks of a 7 x 8 image, with strides, dilations and uneven pads.
    k = 2
    strides, dilations = attributes.get("strides", [1] * k), attributes.get("dilations", [1] * k)
    pads = attributes.get("pads", [0] * 2 * k)
    image, block = [7, 8], [3, 2]
    blocks = [
        (image[d] + pads[d] + pads[k + d] - dilations[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(k)
    ]
    x = np.random.default_rng(13).standard_normal((2, 4 * 6, blocks[0] * blocks[1])).astype(np.float32)
    shapes = [
        numpy_helper.from_array(np.array(image, np.int64), "image"),
        numpy_helper.from_array(np.array(block, np.int64), "block"),
    ]
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attributes)
    model = one_node_model(node, {"x": x}, TensorProto.FLOAT, shapes, opset=18)
    ours, theirs = run_both(model, {"x": x})
    assert ours.shape == (2, 4, 7, 8)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_against_onnxruntime(storage_order):
    # Overlapping, dilated, padded windows over an image with ties (the first maximum of a
    # window in row-major order is the one reported).
    rng = np.random.default_rng(14)
    x = rng.integers(0, 4, (2, 3, 9, 8)).astype(np.float32)
    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y", "where"],
        kernel_shape=[3, 2],
        strides=[2, 1],
        pads=[1, 0, 1, 1],
        dilations=[1, 2],
        storage_order=storage_order,
    )
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("where", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    ours = ponnx.InferenceSession(model).run(None, {"x": x})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transformation", ["half_pixel", "output_half_pixel"])
def test_roi_align_against_onnxruntime(mode, transformation):
    # Boxes of two images, partly or wholly off the map, one inverted (malformed).
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    boxes = (
        np.array([[1, 1, 8, 6], [-4, 2, 5, 13], [9, 7, 30, 25], [6, 5, 2, 1], [0.5, 0.25, 11.5, 9.75]], np.float32)
        * 0.8
    )
    batch = np.array([0, 1, 1, 0, 1], np.int64)
    node = helper.make_node(
        "RoiAlign",
        ["x", "boxes", "batch"],
        ["y"],
        mode=mode,
        output_height=3,
        output_width=4,
        sampling_ratio=2,
        spatial_scale=1.25,
        coordinate_transformation_mode=transformation,
    )
    feeds = {"x": x, "boxes": boxes, "batch": batch}
    model = one_node_model(node, feeds, TensorProto.FLOAT, opset=16)
    ours, theirs = run_both(model, feeds)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_deform_conv_with_groups_offset_groups_and_a_mask():
    # Offsets of up to three pixels move taps off the image; two groups, two offset groups,
    # a stride, a dilation and pads.  Against onnx's reference.
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    out_h, out_w = (7 + 1 + 0 - 2 * 2 - 1) // 2 + 1, (6 + 0 + 1 - 1 - 1) // 1 + 1
    offsets = rng.uniform(-3, 3, (2, 2 * 2 * 6, out_h, out_w)).astype(np.float32)
    mask = rng.uniform(0, 1, (2, 2 * 6, out_h, out_w)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    node = helper.make_node(
        "DeformConv",
        ["x", "w", "offsets", "bias", "mask"],
        ["y"],
        group=2,
        offset_group=2,
        strides=[2, 1],
        dilations=[2, 1],
        pads=[1, 0, 0, 1],
        kernel_shape=[3, 2],
    )
    feeds = {"x": x, "w": w, "offsets": offsets, "bias": bias, "mask": mask}
    model = one_node_model(node, feeds, TensorProto.FLOAT, opset=19)
    (ours,) = ponnx.InferenceSession(model).run(None, feeds)
    assert ours.shape == (2, 6, out_h, out_w)
    np.testing.assert_allclose(ours, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-4, atol=1e-5)
    bad = {**feeds, "offsets": offsets[:, :, :, :-1]}  # offsets for a smaller output
    bad_model = one_node_model(node, bad, TensorProto.FLOAT, opset=19)
    with pytest.raises(PolycError, match=r"offsets \(2, 24, 2, 5\)"):
        ponnx.InferenceSession(bad_model).run(None, bad)


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 6)]),  # batch axes broadcast, as numpy's
        ("...ij,...jk", [(3, 2, 4), (3, 4, 5)]),  # implicit output: the ellipsis, then i, k
        ("i...,i...->...", [(4, 2, 3), (4, 1, 3)]),
        ("...ii->...i", [(2, 3, 4, 4)]),  # a diagonal under batch axes
        ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),  # implicit: b appears twice, so summed
        ("ii", [(5, 5)]),  # the trace
    ],
)
def test_einsum_with_an_ellipsis_broadcasting_and_diagonals(equation, shapes):
    rng = np.random.default_rng(len(equation))
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    names = [f"x{k}" for k in range(len(arrays))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    model = one_node_model(node, dict(zip(names, arrays)), TensorProto.FLOAT, opset=12)
    (ours,) = ponnx.InferenceSession(model).run(None, dict(zip(names, arrays)))
    np.testing.assert_allclose(ours, np.einsum(equation, *arrays), rtol=1e-5, atol=1e-5)


def test_einsum_whose_extents_disagree_is_an_error():
    x, y = np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)
    node = helper.make_node("Einsum", ["x", "y"], ["z"], equation="ij,jk->ik", name="product")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 5])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    with pytest.raises(PolycError, match=r"'product' \(Einsum\): 'j' of 'ij,jk->ik' has extents 3 and 4"):
        ponnx.InferenceSession(model).run(None, {"x": x, "y": y})


def test_bitcast_between_kernels_reads_the_bits():
    # |x| by clearing float32's sign bit through int32: a view between two kernels, no copy.
    x = np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("BitCast", ["doubled"], ["bits"], to=TensorProto.INT32),
        helper.make_node("BitwiseAnd", ["bits", "mask"], ["cleared"]),
        helper.make_node("BitCast", ["cleared"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("BitCast", ["x"], ["x_bits"], to=TensorProto.UINT32),
    ]
    graph = helper.make_graph(
        nodes,
        "bitcast",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("x_bits", TensorProto.UINT32, [3, 5]),
        ],
        [
            numpy_helper.from_array(np.array(2, np.float32), "two"),
            numpy_helper.from_array(np.array(0x7FFFFFFF, np.int32), "mask"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    given = x.copy()
    y, x_bits = ponnx.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.abs(2 * x))
    np.testing.assert_array_equal(x_bits, x.view(np.uint32))
    np.testing.assert_array_equal(x, given)  # the output viewing the feed is a copy
    x_bits[0, 0] = 0
    np.testing.assert_array_equal(x, given)


@pytest.mark.parametrize(
    "mode, rank, skips, dtype", [("TF", 2, 2, np.int64), ("IDF", 1, 0, np.int32), ("TFIDF", 2, 1, np.int32)]
)
def test_tfidf_vectorizer_counts_skipping_n_grams(mode, rank, skips, dtype):
    # 1-grams, 2-grams and 3-grams over ids 0..5, the output columns in another order.
    pool = [1, 2, 4, 0, 1, 1, 2, 3, 4, 2, 2, 2, 3, 4]
    attributes = dict(
        mode=mode,
        min_gram_length=1,
        max_gram_length=3,
        max_skip_count=skips,
        ngram_counts=[0, 3, 11],
        ngram_indexes=[7, 1, 2, 3, 4, 5, 6, 0],
        pool_int64s=pool,
        weights=[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
    )
    x = np.random.default_rng(skips).integers(0, 6, (3, 17) if rank == 2 else (17,)).astype(dtype)
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attributes)
    model = one_node_model(node, {"x": x}, TensorProto.FLOAT, opset=9)
    ours, theirs = run_both(model, {"x": x})
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)  # (onnx's reference weighs by column, see text.py)
    assert ours.max() > 0
    attributes["pool_int64s"] = pool[:9] + [3, 4] + pool[11:]  # the 2-gram (3, 4) twice
    with pytest.raises(PolycError, match=r"the n-gram \[3, 4\] is in the pool twice"):
        ponnx.InferenceSession(
            one_node_model(
                helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attributes), {"x": x}, TensorProto.FLOAT, opset=9
            )
        ).run(None, {"x": x})


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceMean", "ReduceProd"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_reduction_of_a_one_element_constant_folds(op, keepdims):
    # torchvision's detection transform takes ReduceMax(Constant([3.0])): the folded constant
    # is inlined as a literal, and the reduction over its one element is the value itself.
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([3.0], np.float32), "c")),
        helper.make_node(op, ["c"], ["r"], keepdims=keepdims),
        helper.make_node("Mul", ["x", "r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([1, 2], np.float32)
    ours, theirs = run_both(model, {"x": x})
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours, 3 * x)


def test_an_elementwise_step_through_a_view_that_adds_unit_dimensions():
    # Add(CumSum(a) viewed as (1, 1, 1), b) joins the CumSum's kernel, updating its (1,) tensor
    # in place: the view's dimensions of extent 1 that the tensor lacks are read at index 0.
    nodes = [
        helper.make_node("CumSum", ["a", "axis"], ["running"]),
        helper.make_node("Reshape", ["running", "shape"], ["viewed"]),
        helper.make_node("Add", ["viewed", "b"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 1, 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1])],
        [
            numpy_helper.from_array(np.array(0, np.int64), "axis"),
            numpy_helper.from_array(np.array([1, 1, 1], np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"a": np.array([2], np.float32), "b": np.array([[[3]]], np.float32)}
    ours, theirs = run_both(model, feeds)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("uniform", [True, False])
def test_scatter_elements_of_whole_rows_takes_the_rows_kernel(uniform):
    from polyc.frontends.onnx.ops import indexing as ponnx_ops

    # torch's index_put_ of rows (torchvision's RoI pooling): the index is the same along a row.
    rng = np.random.default_rng(int(uniform))
    data = rng.standard_normal((150, 16, 7, 7)).astype(np.float32)
    rows = np.array([3, 140, 7, 3, -1, 60, 9, 10, 11, 12, 13, 14], np.int64)  # a repeated row: the last wins
    which = np.broadcast_to(rows.reshape(12, 1, 1, 1), (12, 16, 7, 5)).copy()
    assert data.size * len(rows) >= ponnx_ops.ScatterElements.ROWS_AT_LEAST
    if not uniform:
        which[2, 5, 1, 1] = 8
    updates = rng.standard_normal(which.shape).astype(np.float32)
    node = helper.make_node("ScatterElements", ["data", "which", "updates"], ["y"], axis=0, name="put")
    model = one_node_model(node, {"data": data, "which": which, "updates": updates}, TensorProto.FLOAT, opset=16)
    session = ponnx.InferenceSession(model)
    feeds = {"data": data, "which": which, "updates": updates}
    (ours,) = session.run(None, feeds)
    np.testing.assert_array_equal(ours, ReferenceEvaluator(model).run(None, feeds)[0])
    assert any("rows" in name for group in session.groups for name in group) == uniform
    with pytest.raises(PolycError, match="put"):
        session.run(None, {**feeds, "which": np.where(which == 60, 150, which)})
