"""Differential fuzzing of whole ONNX graphs: random small models through polyc's sessions against
onnxruntime.

The node suite checks each operator alone; the real models check five fixed graphs.  What neither
reaches is the combinations the graph optimiser meets in other people's models: epilogues fused
into convolutions and products, chains fused through views (a Flatten before a Gemm, blocked
weights), batch normalization folded into grouped and depthwise convolutions, an expansion 1x1
convolution fused into the depthwise convolution after it (an inverted-residual block), the channels-last
conversion of convolutions, pools and the elementwise steps between them with transposes where a
value leaves that layout, values used twice (a residual) or returned while also consumed, and
the arena's reuse of buffers by lifetime.  Each hypothesis example is one random graph
(:func:`graphs`): an image input with a symbolic batch, two to seven nodes drawn from those
above and from pools, reductions, softmax, concat, split, slice, pad, transposes, a reshape to a
sequence ``(N, C, H * W)`` with products and layer normalization along it, random constants,
sometimes an intermediate value as a second output.  A session runs it
at batch 2 and then batch 1 (the plan for a new batch, the same session) and every output must
match onnxruntime's within the ONNX backend suite's relative tolerance (1e-3), with an absolute
floor scaled by the output's magnitude (sums of cancelling terms).  Sessions are made with graph
fusion and the channels-last layout, fusion alone, and neither.

Reproducing a failure: hypothesis prints the graph spec (a list of plain tuples) and its seed;
``build_model(spec)`` rebuilds the model.  ``POLYC_GRAPH_FUZZ_EXAMPLES`` sets the number of
examples (default 30, about a minute of compilation from a cold kernel cache; runs of 300 and
400 examples passed in 6.8 and 7.4 minutes).  Shown able to fail: with batch normalization folded with the wrong sign of its
mean, or the arena freeing a value's memory as soon as it is written, the default run failed
and shrank to a two-node graph.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from hypothesis import HealthCheck, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc.onnx as ponnx  # noqa: E402

EXAMPLES = int(os.environ.get("POLYC_GRAPH_FUZZ_EXAMPLES", "30"))

#: Unary operators (name, attributes) whose results stay finite and well conditioned on any input.
UNARY = [
    ("Relu", {}),
    ("Sigmoid", {}),
    ("Tanh", {}),
    ("LeakyRelu", {"alpha": 0.1}),
    ("HardSwish", {}),
    ("Abs", {}),
    ("Neg", {}),
    ("Erf", {}),
    ("HardSigmoid", {"alpha": 0.2, "beta": 0.5}),
]


# ----------------------------------------------------------------------------- the specs
# A spec is a list of steps, plain tuples; every step after the input makes one value from the
# values before it (by their positions).  Shapes are tracked without the batch (it is symbolic):
# ("image", (C, H, W)), ("sequence", (C, L)) or ("matrix", (K,)).


@st.composite
def graphs(draw):
    channels = draw(st.sampled_from([1, 3, 4, 8, 16]))
    size = draw(st.integers(4, 9))
    spec = [("input", channels, size)]
    shapes = [("image", (channels, size, size))]
    for _ in range(draw(st.integers(2, 7))):
        step = draw(_steps(shapes))
        if step is not None:
            spec.append(step)
            shapes.append(step_shape(step, shapes))
    extra = draw(st.integers(1, len(shapes) - 2)) if len(shapes) > 2 and draw(st.booleans()) else None
    spec.append(("outputs", extra))
    return spec


@st.composite
def _steps(draw, shapes):
    """One step on the values made so far, or None where the drawn one does not fit."""
    index = len(shapes) - 1 if draw(st.booleans()) else draw(st.integers(0, len(shapes) - 1))
    kind, shape = shapes[index]
    seed = draw(st.integers(0, 2**16))
    choices = ["unary", "constant", "residual", "softmax"]
    choices += {
        "image": [
            "conv",
            "conv",
            "depthwise",
            "block",
            "block",
            "pool",
            "global",
            "concat",
            "reduce",
            "transpose",
            "flatten",
            "slice",
            "pad",
            "split",
            "sequence",
        ],
        "sequence": ["matmul", "layernorm", "transpose", "reduce"],
        "matrix": ["gemm", "matmul"],
    }[kind]
    choice = draw(st.sampled_from(choices))
    if choice == "slice":
        start = draw(st.integers(0, shape[0] - 1))
        return ("slice", index, start, draw(st.integers(start + 1, shape[0])), draw(st.sampled_from([1, 2])))
    if choice == "pad":
        return (
            "pad",
            index,
            draw(st.lists(st.integers(0, 2), min_size=4, max_size=4)),
            draw(st.sampled_from([0.0, 1.5])),
        )
    if choice == "split":
        if shape[0] % 2:
            return None
        return ("split", index, draw(st.integers(0, 1)))
    if choice == "sequence":  # (N, C, H, W) -> (N, C, H * W)
        return ("sequence", index)
    if choice == "layernorm":
        return ("layernorm", index, seed)
    if choice == "block":  # an inverted-residual block's expansion and depthwise layers (one fused kernel)
        kernel, stride = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2]))
        pad = draw(st.integers(0, kernel // 2))
        if min(shape[1:]) + 2 * pad < kernel:
            return None
        f = shape[0] * draw(st.sampled_from([1, 3, 6]))
        activations = st.sampled_from([None, "Relu", "Clip"])
        expansion = ("conv", index, f, 1, 1, 0, 1, draw(st.booleans()), draw(st.booleans()), draw(activations), seed)
        return (
            "block",
            index,
            expansion,
            (
                "conv",
                None,
                f,
                kernel,
                stride,
                pad,
                f,
                draw(st.booleans()),
                draw(st.booleans()),
                draw(activations),
                seed + 1,
            ),
        )
    if choice in ("conv", "depthwise"):
        kernel = draw(st.sampled_from([1, 3]))
        stride = draw(st.sampled_from([1, 1, 2]))
        pad = draw(st.integers(0, kernel // 2))
        if min(shape[1:]) + 2 * pad < kernel:
            return None
        f = shape[0] if choice == "depthwise" else draw(st.sampled_from([2, 4, 8, 16]))
        group = shape[0] if choice == "depthwise" else 1
        return (
            "conv",
            index,
            f,
            kernel,
            stride,
            pad,
            group,
            draw(st.booleans()),
            draw(st.booleans()),
            draw(st.sampled_from([None, "Relu", "Clip"])),
            seed,
        )
    if choice == "pool":
        kernel, stride = draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2]))
        pad = draw(st.integers(0, kernel // 2))
        if min(shape[1:]) + 2 * pad < kernel:
            return None
        ceil = draw(st.booleans())
        if ceil and any(
            _pooled(n, kernel, stride, pad, True) != -(-(n + 2 * pad - kernel) // stride) + 1 for n in shape[1:]
        ):
            # a last window starting in the padding: onnxruntime drops it, onnx's shape inference
            # does not, and the checker then rejects a constant of the pooled shape added to it
            return None
        return ("pool", index, draw(st.sampled_from(["MaxPool", "AveragePool"])), kernel, stride, pad, ceil)
    if choice == "global":
        return ("global", index, draw(st.sampled_from(["GlobalAveragePool", "GlobalMaxPool"])))
    if choice == "concat":
        partners = [i for i, (k, s) in enumerate(shapes) if k == "image" and s[1:] == shape[1:]]
        return ("concat", index, draw(st.sampled_from(partners)))
    if choice == "softmax":
        return ("softmax", index, 1 if kind == "image" else -1)
    if choice == "reduce" and kind == "sequence":
        return ("reduce_last", index, draw(st.sampled_from(["ReduceMean", "ReduceMax"])))
    if choice == "reduce":
        return ("reduce", index, draw(st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax"])))
    if choice in ("transpose", "flatten"):
        return (choice, index)
    if choice in ("gemm", "matmul"):
        return (choice, index, draw(st.sampled_from([3, 16, 70, 128])), draw(st.booleans()), draw(st.booleans()), seed)
    if choice == "unary":
        return ("unary", index, draw(st.integers(0, len(UNARY) - 1)))
    if choice == "constant":
        form = draw(st.sampled_from(["scalar", "channel", "full"] if kind == "image" else ["scalar", "full", "last"]))
        return ("constant", index, draw(st.sampled_from(["Add", "Mul", "Sub"])), form, seed)
    partners = [i for i, s in enumerate(shapes) if s == (kind, shape)]
    return ("residual", index, draw(st.sampled_from(partners)), draw(st.sampled_from(["Add", "Mul", "Max"])))


def step_shape(step: tuple, shapes: list) -> tuple:
    """(kind, shape without the batch) of the value ``step`` makes."""
    op = step[0]
    if op == "block":  # the depthwise step on the expansion's value
        return step_shape(("conv", len(shapes), *step[3][2:]), shapes + [step_shape(step[2], shapes)])
    kind, shape = shapes[step[1]]
    if op == "conv":
        _, _, f, kernel, stride, pad, *_ = step
        return "image", (f, *((n + 2 * pad - kernel) // stride + 1 for n in shape[1:]))
    if op == "pool":
        _, _, _, kernel, stride, pad, ceil = step
        return "image", (shape[0], *(_pooled(n, kernel, stride, pad, ceil) for n in shape[1:]))
    if op in ("global", "reduce"):
        return "image", (shape[0], 1, 1)
    if op == "concat":
        return "image", (shape[0] + shapes[step[2]][1][0], *shape[1:])
    if op == "transpose":
        return kind, (shape[0], shape[2], shape[1]) if kind == "image" else (shape[1], shape[0])
    if op == "flatten":
        return "matrix", (int(np.prod(shape)),)
    if op in ("gemm", "matmul"):
        return kind, (*shape[:-1], step[2])
    if op == "slice":
        _, _, start, end, stride = step
        return "image", (len(range(start, end, stride)), *shape[1:])
    if op == "pad":
        top, left, bottom, right = step[2]
        return "image", (shape[0], shape[1] + top + bottom, shape[2] + left + right)
    if op == "split":
        return "image", (shape[0] // 2, *shape[1:])
    if op == "sequence":
        return "sequence", (shape[0], shape[1] * shape[2])
    if op == "reduce_last":
        return "sequence", (shape[0], 1)
    return kind, shape


def _pooled(n: int, kernel: int, stride: int, pad: int, ceil: bool) -> int:
    """A pooled extent (ONNX: with ceil_mode, a last window starting in the right padding is dropped)."""
    span = n + 2 * pad - kernel
    out = (-(-span // stride) if ceil else span // stride) + 1
    return out - 1 if ceil and (out - 1) * stride >= n + pad else out


# ----------------------------------------------------------------------------- the models
def build_model(spec: list) -> onnx.ModelProto:
    """The ONNX model of ``spec`` (opset 17; weights from each step's seed)."""
    nodes, initializers, shapes, outputs = [], [], [], []

    def const(name, array):
        initializers.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def integers(name, values):
        initializers.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def conv(step, source, shape, out):
        """The nodes of a "conv" step on ``source`` (of ``shape``) into ``out``."""
        _, _, f, kernel, stride, pad, group, bias, norm, activation, seed = step
        rng = np.random.default_rng(seed)
        c = shape[0]
        weight = rng.standard_normal((f, c // group, kernel, kernel)) / np.sqrt(c // group * kernel * kernel)
        inputs = [source, const(f"{out}_w", weight)] + ([const(f"{out}_b", rng.standard_normal(f))] if bias else [])
        target = f"{out}_conv" if norm or activation else out
        nodes.append(
            helper.make_node(
                "Conv",
                inputs,
                [target],
                kernel_shape=[kernel, kernel],
                strides=[stride] * 2,
                pads=[pad] * 4,
                group=group,
            )
        )
        if norm:
            parameters = [
                const(f"{out}_{p}", v)
                for p, v in (
                    ("scale", rng.uniform(0.5, 1.5, f)),
                    ("shift", rng.standard_normal(f)),
                    ("mean", rng.standard_normal(f) * 0.1),
                    ("var", rng.uniform(0.5, 2.0, f)),
                )
            ]
            normed = f"{out}_bn" if activation else out
            nodes.append(helper.make_node("BatchNormalization", [target] + parameters, [normed]))
            target = normed
        if activation == "Relu":
            nodes.append(helper.make_node("Relu", [target], [out]))
        elif activation == "Clip":
            nodes.append(helper.make_node("Clip", [target, const(f"{out}_lo", 0.0), const(f"{out}_hi", 6.0)], [out]))

    for number, step in enumerate(spec):
        out = f"v{number}"
        op = step[0]
        if op == "input":
            _, channels, size = step
            shapes.append(("image", (channels, size, size)))
            continue
        if op == "outputs":
            outputs = list(dict.fromkeys([len(spec) - 2] + ([step[1]] if step[1] is not None else [])))
            break
        source = f"v{step[1]}"
        kind, shape = shapes[step[1]]
        if op == "conv":
            conv(step, source, shape, out)
        elif op == "block":
            conv(step[2], source, shape, f"{out}_e")
            conv(step[3], f"{out}_e", step_shape(step[2], shapes)[1], out)
        elif op == "pool":
            _, _, name, kernel, stride, pad, ceil = step
            nodes.append(
                helper.make_node(
                    name,
                    [source],
                    [out],
                    kernel_shape=[kernel] * 2,
                    strides=[stride] * 2,
                    pads=[pad] * 4,
                    ceil_mode=int(ceil),
                )
            )
        elif op == "global":
            nodes.append(helper.make_node(step[2], [source], [out]))
        elif op == "concat":
            other = f"v{step[2]}"
            nodes.append(helper.make_node("Concat", [source, other], [out], axis=1))
        elif op == "softmax":
            nodes.append(helper.make_node("Softmax", [source], [out], axis=step[2]))
        elif op == "reduce":
            if step[2] == "ReduceSum":  # opset 13 made its axes an input
                initializers.append(numpy_helper.from_array(np.array([2, 3], np.int64), f"{out}_axes"))
                nodes.append(helper.make_node(step[2], [source, f"{out}_axes"], [out], keepdims=1))
            else:
                nodes.append(helper.make_node(step[2], [source], [out], axes=[2, 3], keepdims=1))
        elif op == "transpose":
            nodes.append(
                helper.make_node("Transpose", [source], [out], perm=[0, 1, 3, 2] if kind == "image" else [0, 2, 1])
            )
        elif op == "slice":
            _, _, start, end, stride = step
            parameters = [
                integers(f"{out}_{name}", [v])
                for name, v in (("starts", start), ("ends", end), ("axes", 1), ("steps", stride))
            ]
            nodes.append(helper.make_node("Slice", [source, *parameters], [out]))
        elif op == "pad":
            top, left, bottom, right = step[2]
            pads = integers(f"{out}_pads", [0, 0, top, left, 0, 0, bottom, right])
            nodes.append(helper.make_node("Pad", [source, pads, const(f"{out}_value", np.array(step[3]))], [out]))
        elif op == "split":
            halves = [f"{out}_0", f"{out}_1"]
            halves[step[2]] = out
            nodes.append(
                helper.make_node("Split", [source, integers(f"{out}_sizes", [shape[0] // 2] * 2)], halves, axis=1)
            )
        elif op == "sequence":
            nodes.append(helper.make_node("Reshape", [source, integers(f"{out}_shape", [0, shape[0], -1])], [out]))
        elif op == "reduce_last":
            nodes.append(helper.make_node(step[2], [source], [out], axes=[-1], keepdims=1))
        elif op == "layernorm":
            rng = np.random.default_rng(step[2])
            width = shape[-1]
            nodes.append(
                helper.make_node(
                    "LayerNormalization",
                    [
                        source,
                        const(f"{out}_scale", rng.uniform(0.5, 1.5, width)),
                        const(f"{out}_bias", rng.standard_normal(width)),
                    ],
                    [out],
                    axis=-1,
                )
            )
        elif op == "flatten":
            nodes.append(helper.make_node("Flatten", [source], [out], axis=1))
        elif op in ("gemm", "matmul"):
            _, _, n, trans_b, bias, seed = step
            rng = np.random.default_rng(seed)
            k = shape[-1]
            weight = rng.standard_normal((k, n)) / np.sqrt(k)
            if op == "gemm":
                inputs = [source, const(f"{out}_w", weight.T if trans_b else weight)]
                inputs += [const(f"{out}_b", rng.standard_normal(n))] if bias else []
                nodes.append(helper.make_node("Gemm", inputs, [out], transB=int(trans_b)))
            else:
                nodes.append(helper.make_node("MatMul", [source, const(f"{out}_w", weight)], [out]))
        elif op == "unary":
            name, attributes = UNARY[step[2]]
            nodes.append(helper.make_node(name, [source], [out], **attributes))
        elif op == "constant":
            _, _, name, form, seed = step
            rng = np.random.default_rng(seed)
            value = {
                "scalar": lambda: rng.uniform(0.5, 1.5, (1,)),
                "channel": lambda: rng.uniform(0.5, 1.5, (shape[0], 1, 1)),
                "full": lambda: rng.uniform(0.5, 1.5, shape),
                "last": lambda: rng.uniform(0.5, 1.5, shape[-1:]),
            }[form]()
            nodes.append(helper.make_node(name, [source, const(f"{out}_k", value)], [out]))
        elif op == "residual":
            nodes.append(helper.make_node(step[3], [source, f"v{step[2]}"], [out]))
        else:
            raise AssertionError(f"unknown step {step}")
        shapes.append(step_shape(step, shapes))
    channels, size = spec[0][1], spec[0][2]
    graph = helper.make_graph(
        nodes,
        "fuzz",
        [helper.make_tensor_value_info("v0", TensorProto.FLOAT, ["N", channels, size, size])],
        # the outputs' extents left symbolic: onnx's shape inference and onnxruntime disagree on
        # some pooled extents with ceil_mode (the ONNX rule drops a last window that starts in the
        # padding, as onnxruntime does), and the test compares with onnxruntime's shapes
        [
            helper.make_tensor_value_info(
                f"v{i}", TensorProto.FLOAT, ["N"] + [f"v{i}_{d}" for d in range(len(shapes[i][1]))]
            )
            for i in outputs
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run_onnxruntime(model, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=graphs(), layout=st.sampled_from([(True, True), (True, False), (False, False)]))
def test_random_graphs_match_onnxruntime(spec, layout):
    graph_fusion, channels_last = layout
    note(f"spec = {spec!r}")
    model = build_model(spec)
    onnx.checker.check_model(model, full_check=True)
    session = ponnx.InferenceSession(model, graph_fusion=graph_fusion, channels_last=channels_last)
    channels, size = spec[0][1], spec[0][2]
    for batch in (2, 1):  # a new batch plans again in the same session
        x = np.random.default_rng(batch).standard_normal((batch, channels, size, size)).astype(np.float32)
        expected = _run_onnxruntime(model, {"v0": x})
        got = session.run(None, {"v0": x})
        assert len(got) == len(expected)
        for ours, theirs in zip(got, expected, strict=True):
            assert ours.shape == theirs.shape
            scale = max(1.0, float(np.abs(theirs).max()))
            np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5 * scale)
