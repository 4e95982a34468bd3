"""The channels-last pass (polyc/frontends/onnx/channels_last.py): convolution chains in NHWC,
against onnxruntime, with transposes only where values cross between the layouts."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx import channels_last  # noqa: E402


def _model(nodes, weights, outputs, channels=3, image=12):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", channels, image, image])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in outputs],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _two_inputs(nodes, weights, first, second, output_shape, rng):
    """(model, feeds, onnxruntime's output) of a graph with two inputs (name, shape) and one output Y."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in (first, second)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in (first, second)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return model, feeds, want


def network() -> onnx.ModelProto:
    """Every kind of node the pass converts: a padded strided Conv with BatchNormalization and
    Relu, a padded MaxPool, a depthwise Conv with Clip, a 1x1 Conv, a residual Add, a Mul and a
    PRelu by (C, 1, 1) constants, a Concat along the channels, an AveragePool counting its
    padding, a GlobalAveragePool before a Flatten and a Gemm; a second output from the middle."""
    rng = np.random.default_rng(0)

    def r(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {
        "W1": r(8, 3, 3, 3),
        "B1": r(8),
        "scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
        "shift": r(8),
        "mean": r(8),
        "var": rng.uniform(0.5, 2, 8).astype(np.float32),
        "Wd": r(8, 1, 3, 3),
        "Bd": r(8),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
        "Wp": r(8, 8, 1, 1),
        "M": r(8, 1, 1, scale=1),
        "slope": r(8, 1, 1, scale=0.1),
        "Wc": r(4, 8, 3, 3),
        "Wf": r(5, 12),
        "Bf": r(5),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["bn"], name="bn"),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], name="pool"
        ),
        helper.make_node("Conv", ["p1", "Wd", "Bd"], ["d1"], group=8, pads=[1, 1, 1, 1], name="dw"),
        helper.make_node("Clip", ["d1", "lo", "hi"], ["d2"], name="relu6"),
        helper.make_node("Conv", ["d2", "Wp"], ["pw"], name="pw"),
        helper.make_node("Add", ["pw", "p1"], ["res"], name="add"),
        helper.make_node("Mul", ["res", "M"], ["scaled"], name="mul"),
        helper.make_node("PRelu", ["scaled", "slope"], ["pr"], name="prelu"),
        helper.make_node("Conv", ["pr", "Wc"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Concat", ["c2", "pr"], ["cat"], axis=1, name="concat"),
        helper.make_node(
            "AveragePool",
            ["cat"],
            ["ap"],
            kernel_shape=[2, 2],
            pads=[1, 1, 1, 1],
            strides=[2, 2],
            count_include_pad=1,
            name="avg",
        ),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "Wf", "Bf"], ["Y"], transB=1, name="fc"),
    ]
    return _model(nodes, weights, [("Y", ["N", 5]), ("res", ["N", 8, 6, 6])])


def test_a_network_in_channels_last_matches_onnxruntime_at_two_batches():
    model = network()
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session, nchw = ponnx.InferenceSession(model), ponnx.InferenceSession(model, channels_last=False)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 12, 12)).astype(np.float32)
        want = reference.run(None, {"X": x})
        for got in (session.run(None, {"X": x}), nchw.run(None, {"X": x})):
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # No transpose into NHWC (the first convolution reads the 3-channel image where it is),
    # one back for the middle output; the global pool's 1 x 1 output goes back to NCHW as a
    # view, not a kernel.
    nodes = [name for group in session.groups for name in group]
    assert not [n for n in nodes if n.endswith(" to NHWC")]
    assert [n for n in nodes if n.endswith(" to NCHW")] == ["res to NCHW"]
    source = session.tc_source()
    assert "float(3, 6, 6, 8)" in source  # NHWC tensors (the last plan: batch 3)
    assert "dw" in nodes and "concat" in nodes


def test_what_the_pass_leaves_in_onnx_layout():
    """Weights computed at run time, a grouped (not depthwise) Conv and a 1-D Conv stay in NCHW,
    and so does a convolution whose weights outweigh its few output pixels."""
    rng = np.random.default_rng(1)
    weights = {
        "Wg": rng.standard_normal((4, 2, 3, 3)).astype(np.float32),
        "W1": rng.standard_normal((4, 4, 3, 3)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["a"], pads=[1, 1, 1, 1], name="runtime_weights"),
        helper.make_node("Conv", ["a", "Wg"], ["b"], group=2, name="grouped"),
        helper.make_node("Conv", ["b", "W1"], ["Y"], name="heavy"),
    ]
    model, feeds, want = _two_inputs(nodes, weights, ("X", [1, 4, 6, 6]), ("W", [4, 4, 3, 3]), [1, 4, 2, 2], rng)
    limit = channels_last.CHANNELS_LAST_WEIGHT_BYTES
    try:
        channels_last.CHANNELS_LAST_WEIGHT_BYTES = 4 * 4 * 9 * 4 - 1  # "heavy"'s weights are more
        session = ponnx.InferenceSession(model)
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    finally:
        channels_last.CHANNELS_LAST_WEIGHT_BYTES = limit
    assert not any(name.endswith((" to NHWC", " to NCHW")) for group in session.groups for name in group)


def test_converted_nodes_in_the_backend_sense():
    """A Conv of 6 channels (transposed in and out), a pool of an NCHW input (not converted),
    and an elementwise node between an NHWC value and an NCHW graph input (transposed)."""
    rng = np.random.default_rng(2)
    weights = {"W": rng.standard_normal((6, 6, 3, 3)).astype(np.float32)}
    nodes = [
        helper.make_node("MaxPool", ["X"], ["p"], kernel_shape=[2, 2], name="pool"),
        helper.make_node("Conv", ["p", "W"], ["c"], name="conv"),
        helper.make_node("Add", ["c", "Z"], ["Y"], name="add"),
    ]
    model, feeds, want = _two_inputs(nodes, weights, ("X", [2, 6, 9, 9]), ("Z", [2, 6, 6, 6]), [2, 6, 6, 6], rng)
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    names = [name for group in session.groups for name in group]
    assert {"p to NHWC", "Z to NHWC", "Y to NCHW"} <= set(names)


@pytest.mark.parametrize(
    "attributes",
    [
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], ceil_mode=1),
        dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
        dict(kernel_shape=[4, 4], strides=[3, 3]),
    ],
    ids=["resnet", "ceil-asymmetric", "dilated", "no-edges"],
)
def test_max_pools_of_nhwc_images(attributes):
    """MaxPool after a convolution, so in NHWC: one statement per region of positions."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], name="conv"),
        helper.make_node("MaxPool", ["c"], ["Y"], name="pool", **attributes),
    ]
    model = _model(
        nodes, {"W": rng.standard_normal((16, 3, 1, 1)).astype(np.float32)}, [("Y", ["N", 16, "H", "W"])], image=11
    )
    feeds = {"X": rng.standard_normal((2, 3, 11, 11)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)
    assert "Y to NCHW" in [name for group in session.groups for name in group]


@pytest.mark.parametrize(
    "attributes",
    [
        dict(pads=[1, 1, 1, 1], strides=[2, 2]),
        dict(pads=[0, 1, 1, 0]),
        dict(dilations=[2, 2], pads=[2, 2, 2, 2]),
        dict(kernel=[5, 5], pads=[2, 2, 2, 2]),
        dict(kernel=[5, 5], pads=[1, 2, 2, 1], strides=[2, 2]),
        dict(kernel=[5, 3], pads=[0, 0, 0, 0], dilations=[1, 2]),
    ],
    ids=["stride-2", "asymmetric", "dilated", "5x5", "5x5-stride-2-asymmetric", "5x3-unpadded"],
)
def test_depthwise_convolutions_of_nhwc_images(attributes):
    """A depthwise Conv after a convolution (so in NHWC): one kernel, polyc's depthwise kernel,
    its zero padding in its statement's condition (no padding step) and its bias an epilogue;
    after a 1 x 1 convolution that nothing else reads, one kernel with it (the expansion and
    depthwise layers of an inverted-residual block)."""
    attributes = dict(attributes)
    kernel = attributes.pop("kernel", [3, 3])
    rng = np.random.default_rng(4)
    for first, expected in (
        ((1, 1), "polyc pointwise + depthwise conv kernel"),
        ((3, 3), "polyc depthwise conv kernel"),
    ):
        weights = {
            "W": rng.standard_normal((16, 3, *first)).astype(np.float32),
            "Wd": rng.standard_normal((16, 1, *kernel)).astype(np.float32),
            "Bd": rng.standard_normal(16).astype(np.float32),
        }
        nodes = [
            helper.make_node("Conv", ["X", "W"], ["c"], name="conv", pads=[first[0] // 2] * 4),
            helper.make_node("Conv", ["c", "Wd", "Bd"], ["Y"], group=16, name="dw", **attributes),
        ]
        model = _model(nodes, weights, [("Y", ["N", 16, "H", "W"])], image=11)
        feeds = {"X": rng.standard_normal((2, 3, 11, 11)).astype(np.float32)}
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        session = ponnx.InferenceSession(model)
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)
        names = [name for group in session.groups for name in group]
        assert "c to NCHW" not in names
        group = ["conv", "dw"] if first == (1, 1) else ["dw"]
        assert session.groups.count(group) == 1
        source = session.kernels({"X": feeds["X"].shape})[session.groups.index(group)].c_source({})
        assert expected in source


def test_the_shape_of_an_nhwc_value_needs_no_transpose():
    """Shape (and what exporters compute from it) of a value that exists in NHWC only is its
    NCHW shape, read without moving the data."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Shape", ["c"], ["S"], name="shape"),
        helper.make_node("GlobalAveragePool", ["c"], ["Y"], name="gap"),
    ]
    model = _model(nodes, {"W": rng.standard_normal((8, 3, 3, 3)).astype(np.float32)}, [("Y", ["N", 8, 1, 1])], image=9)
    model.graph.output.append(helper.make_tensor_value_info("S", TensorProto.INT64, [4]))
    feeds = {"X": rng.standard_normal((2, 3, 9, 9)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    session = ponnx.InferenceSession(model)
    got = session.run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])
    assert not any(name.endswith(" to NCHW") for group in session.groups for name in group)


@pytest.mark.parametrize("batch", [1, 2])
def test_global_average_of_an_nhwc_image_streams_it_with_the_channels_in_vectors(batch):
    """GlobalAveragePool of an NHWC value: the image viewed as (positions, C) times a vector of
    1 / positions (at batch 1 polyc's matrix-vector kernel), then the Conv after it."""
    rng = np.random.default_rng(5)
    weights = {
        "W": rng.standard_normal((40, 3, 3, 3)).astype(np.float32),
        "Ws": rng.standard_normal((8, 40, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
        helper.make_node("Conv", ["g", "Ws"], ["Y"], name="squeeze"),
    ]
    model = _model(nodes, weights, [("Y", ["N", 8, 1, 1])], image=13)
    feeds = {"X": rng.standard_normal((batch, 3, 13, 13)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)
    stages = session.kernels()[session.groups.index(["gap"])].stages({})
    assert (stages.contraction is not None and stages.contraction.is_matvec) == (batch == 1)


@pytest.mark.parametrize("batch, image", [(1, 7), (2, 14)])
def test_pointwise_convolutions_of_many_filters_read_blocked_weights_at_few_pixels(batch, image):
    """A 1 x 1 NHWC convolution of 512 or more filters is a matrix product; over at most
    BLOCKED_WEIGHT_ROWS pixels its weights are blocked at plan time as the gemm kernel reads
    them (no packing per call), and the bias and Clip are epilogues through the view of the
    blocked product as NHWC, at its (.., F / NR, NR) indices."""
    from polyc.frontends.onnx.channels_last import POINTWISE_GEMM_FILTERS
    from polyc.frontends.onnx.ops.contractions import BLOCKED_WEIGHT_ROWS

    rng = np.random.default_rng(6)
    filters = POINTWISE_GEMM_FILTERS + 128
    weights = {
        "W": rng.standard_normal((24, 3, 3, 3)).astype(np.float32),
        "Wp": rng.standard_normal((filters, 24, 1, 1)).astype(np.float32),
        "Bp": rng.standard_normal(filters).astype(np.float32),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Conv", ["c", "Wp", "Bp"], ["p"], name="pw"),
        helper.make_node("Clip", ["p", "lo", "hi"], ["Y"], name="relu6"),
    ]
    model = _model(nodes, weights, [("Y", ["N", filters, image, image])], image=image)
    feeds = {"X": rng.standard_normal((batch, 3, image, image)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    group = next(g for g in session.plan_for({"X": feeds["X"].shape}).groups if "relu6" in g.nodes)
    assert group.nodes == ["pw", "relu6"]
    blocked = batch * image * image <= BLOCKED_WEIGHT_ROWS
    assert (group.outputs[0].rank == 5) == blocked and group.kernel.stages({}).contraction is not None


@pytest.mark.parametrize("channels, image", [(64, 5), (24, 7)])
def test_pointwise_weights_outweighing_the_output_are_padded_to_whole_slivers(channels, image):
    """A 1 x 1 convolution of a filter count no sliver divides reads its weights blocked, with
    zero filters up to a whole sliver, where they outweigh the output (more channels than
    pixels); the real filters are copied out after, with the bias.  Else the weights are read
    in place."""
    from polyc.frontends.onnx.channels_last import POINTWISE_GEMM_FILTERS

    rng = np.random.default_rng(8)
    filters = POINTWISE_GEMM_FILTERS + 40
    weights = {
        "W": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32),
        "Wp": rng.standard_normal((filters, channels, 1, 1)).astype(np.float32),
        "Bp": rng.standard_normal(filters).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Conv", ["c", "Wp", "Bp"], ["p"], name="pw"),
        helper.make_node("Relu", ["p"], ["Y"], name="relu"),
    ]
    model = _model(nodes, weights, [("Y", ["N", filters, image, image])], image=image)
    feeds = {"X": rng.standard_normal((1, 3, image, image)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    product = next(g for g in session.plan_for({"X": feeds["X"].shape}).groups if "pw" in g.nodes).outputs[0]
    padded = channels >= image * image
    assert (product.rank == 5) == padded
    assert product.shape[-1] == filters or product.shape[-2] * product.shape[-1] > filters


@pytest.mark.parametrize("batch", [1, 2])
def test_convolutions_read_weights_blocked_by_output_channels(batch):
    """3 x 3 convolutions of 128 filters that the Winograd kernel does not take (a stride of 2;
    few tiles) read their weights blocked, ``(F / 64, 3, 3, C, 64)``, into an output blocked
    the same way and viewed as NHWC: the bias, the residual Add and the Relu after them are
    epilogues through that view, applied in registers."""
    rng = np.random.default_rng(9)
    weights = {
        "W1": rng.standard_normal((128, 8, 3, 3)).astype(np.float32) * 0.2,
        "B1": rng.standard_normal(128).astype(np.float32),
        "W2": rng.standard_normal((128, 128, 3, 3)).astype(np.float32) * 0.05,
        "B2": rng.standard_normal(128).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["Y"], name="relu2"),
    ]
    model = _model(nodes, weights, [("Y", ["N", 128, 5, 5])], channels=8, image=10)
    feeds = {"X": rng.standard_normal((batch, 8, 10, 10)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    session = ponnx.InferenceSession(model)
    np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)
    plan = session.plan_for({"X": feeds["X"].shape})
    second = next(g for g in plan.groups if "conv2" in g.nodes)
    assert second.nodes == ["conv2", "add", "relu2"]
    assert [v.shape for v in second.inputs if v.const is not None and v.rank == 5] == [(2, 3, 3, 128, 64)]
    assert second.outputs[0].shape == (batch, 5, 5, 2, 64)
    text = second.kernel.c_source()
    assert "output channels vectorised" in text and "#define POLYC_REGISTER_EPILOGUE 1" in text


@pytest.mark.parametrize(
    "filters, kernel, strides, outputs, options, dtype, block",
    [
        (128, 3, 2, 14, {}, np.float32, 64),
        (512, 3, 1, 7, {"winograd": True}, np.float32, 64),  # Winograd does not pay at 512 channels
        (128, 3, 1, 28, {"winograd": True}, np.float32, 0),  # Winograd takes it
        (128, 3, 1, 28, {"winograd": False}, np.float32, 64),
        (128, 1, 2, 14, {}, np.float32, 64),
        (128, 1, 1, 14, {}, np.float32, 0),  # 1 x 1 stride 1: a depthwise layer may take it in
        (64, 3, 2, 14, {}, np.float32, 0),  # one block
        (96, 3, 2, 14, {}, np.float32, 0),  # not a multiple of the block
        (64, 3, 2, 14, {}, np.float64, 32),
        (128, 3, 2, 14, {"backend": "cuda"}, np.float32, 0),
        (128, 3, 2, 14, {"direct_convolutions": False}, np.float32, 0),
    ],
)
def test_which_convolution_weights_are_blocked(filters, kernel, strides, outputs, options, dtype, block):
    from polyc.codegen.conv_channels import channel_block
    from polyc.frontends.onnx.lowering import Value

    w = Value("w", np.dtype(dtype), (filters, 128, kernel, kernel))
    assert channels_last.filter_block(w, (strides, strides), (1, 1), 1, (outputs, outputs), options) == block
    # Every instruction set's register block of channels divides the block: read in place.
    for isa in ("avx512", "avx2", "portable"):
        assert channels_last.FILTER_BLOCK_BYTES // np.dtype(dtype).itemsize % channel_block(isa, dtype, None).nf == 0


def convnext_blocks(channels=16, blocks=2, gelu=False):
    """ConvNeXt's blocks as torch exports them: a 7 x 7 depthwise Conv (NCHW), a Transpose to
    NHWC, LayerNormalization over the channels, two MatMuls with an activation between, a
    per-channel scale, a Transpose back and the residual Add; a 1 x 1 Conv before them."""
    rng = np.random.default_rng(6)
    c = channels

    def r(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    weights = {"Wstem": r(c, 3, 1, 1)}
    nodes = [helper.make_node("Conv", ["X", "Wstem"], ["h0"], name="stem")]
    for k in range(blocks):
        weights.update(
            {
                f"Wd{k}": r(c, 1, 7, 7),
                f"Bd{k}": r(c),
                f"g{k}": rng.uniform(0.5, 1.5, c).astype(np.float32),
                f"b{k}": r(c),
                f"W1{k}": r(c, 4 * c),
                f"B1{k}": r(4 * c),
                f"W2{k}": r(4 * c, c),
                f"B2{k}": r(c),
                f"s{k}": r(c, 1, 1),
            }
        )
        h, act = f"h{k}", ("Gelu" if gelu else "Relu")
        nodes += [
            helper.make_node(
                "Conv", [h, f"Wd{k}", f"Bd{k}"], [f"d{k}"], group=c, kernel_shape=[7, 7], pads=[3] * 4, name=f"dw{k}"
            ),
            helper.make_node("Transpose", [f"d{k}"], [f"t{k}"], perm=[0, 2, 3, 1], name=f"to_nhwc{k}"),
            helper.make_node("LayerNormalization", [f"t{k}", f"g{k}", f"b{k}"], [f"n{k}"], axis=-1, name=f"ln{k}"),
            helper.make_node("MatMul", [f"n{k}", f"W1{k}"], [f"m{k}"], name=f"fc1_{k}"),
            helper.make_node("Add", [f"m{k}", f"B1{k}"], [f"a{k}"], name=f"bias1_{k}"),
            helper.make_node(act, [f"a{k}"], [f"r{k}"], name=f"act{k}"),
            helper.make_node("MatMul", [f"r{k}", f"W2{k}"], [f"p{k}"], name=f"fc2_{k}"),
            helper.make_node("Add", [f"p{k}", f"B2{k}"], [f"q{k}"], name=f"bias2_{k}"),
            helper.make_node("Transpose", [f"q{k}"], [f"u{k}"], perm=[0, 3, 1, 2], name=f"to_nchw{k}"),
            helper.make_node("Mul", [f"u{k}", f"s{k}"], [f"v{k}"], name=f"scale{k}"),
            helper.make_node("Add", [h, f"v{k}"], [f"h{k + 1}" if k + 1 < blocks else "Y"], name=f"residual{k}"),
        ]
    return _model(nodes, weights, [("Y", ["N", c, 10, 10])], image=10)


def test_transposes_between_the_layouts_are_views():
    """A network that permutes to channels-last around its own layers (ConvNeXt) moves no data
    for those permutations: the Transposes become views of the NHWC values, the layers between
    them stay in NHWC, and every depthwise Conv after the first reads an NHWC image (polyc's
    depthwise kernel); the data moves once into NHWC and once back, for the graph's output."""
    model = convnext_blocks()
    rng = np.random.default_rng(7)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session = ponnx.InferenceSession(model)
    for batch in (1, 2):
        x = rng.standard_normal((batch, 3, 10, 10)).astype(np.float32)
        np.testing.assert_allclose(
            session.run(None, {"X": x})[0], reference.run(None, {"X": x})[0], rtol=1e-4, atol=1e-4
        )
    nodes = [name for group in session.groups for name in group]
    assert not [n for n in nodes if n.startswith(("to_nhwc", "to_nchw"))], session.groups
    assert [n for n in nodes if n.endswith(" to NCHW")] == ["Y to NCHW"], session.groups
    dw1 = next(group for group in session.groups if "dw1" in group)
    source = session.kernels({"X": (2, 3, 10, 10)})[session.groups.index(dw1)].c_source({})
    assert "polyc depthwise conv kernel" in source
    # the control: without the channels-last pass the Transposes move data
    nchw = ponnx.InferenceSession(model, channels_last=False)
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    np.testing.assert_allclose(nchw.run(None, {"X": x})[0], reference.run(None, {"X": x})[0], rtol=1e-4, atol=1e-4)
    assert [n for group in nchw.groups for n in group if n.startswith(("to_nhwc", "to_nchw"))]
