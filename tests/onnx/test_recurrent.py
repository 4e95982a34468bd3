"""RNN, GRU and LSTM (polyc/frontends/onnx/ops/recurrent.py) against onnxruntime: both directions
and both layouts with initial states and biases, GRU's linear_before_reset, LSTM's clip,
input_forget, peepholes and other activations; sequences longer than one concatenation
reads; the recurrence one kernel per direction; padded sequences (``sequence_lens`` shorter than
the sequence), still unrolled, whose steps share one kernel."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402
from polyc.frontends.onnx.ops.shapes import CONCAT_FAN_IN  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
STEPS, BATCH, INPUT, HIDDEN = 11, 3, 5, 4


def recurrent_model(
    op: str, direction: str, layout: int, steps: int = STEPS, peepholes: bool = False, batch: int = BATCH, **attributes
):
    """``op`` with every input a graph input (weights too: onnxruntime runs them the same), and
    its feeds; batchwise (``layout``) the same values transposed."""
    rng = np.random.default_rng(10)
    directions = 2 if direction == "bidirectional" else 1
    gates = GATES[op] * HIDDEN
    state_shape = (directions, batch, HIDDEN)
    feeds = {
        "X": rng.standard_normal((steps, batch, INPUT)),
        "W": rng.standard_normal((directions, gates, INPUT)) * 0.5,
        "R": rng.standard_normal((directions, gates, HIDDEN)) * 0.5,
        "B": rng.standard_normal((directions, 2 * gates)) * 0.5,
        "sequence_lens": np.full(batch, steps, np.int32),
        "initial_h": rng.standard_normal(state_shape),
    }
    if op == "LSTM":
        feeds["initial_c"] = rng.standard_normal(state_shape)
        if peepholes:
            feeds["P"] = rng.standard_normal((directions, 3 * HIDDEN))
    feeds = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}
    if layout:  # batch first: the same values, transposed
        for name in ("X", "initial_h", "initial_c"):
            if name in feeds:
                feeds[name] = np.ascontiguousarray(feeds[name].transpose(1, 0, 2))
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(
        op, list(feeds), outputs, hidden_size=HIDDEN, direction=direction, layout=layout, **attributes
    )
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(k, types[v.dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model, feeds


def against_onnxruntime(model, feeds):
    session = ponnx.InferenceSession(model)
    ours = session.run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, expected in zip(ours, theirs, strict=True):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    return session


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_directions_and_layouts(op, direction):
    assert STEPS > CONCAT_FAN_IN  # the outputs are stacked by a tree of concatenations
    model, feeds = recurrent_model(op, direction, 0)
    expected = against_onnxruntime(model, feeds).run(None, feeds)
    # The batchwise layout (which onnxruntime does not run): the same layer, transposed.
    model, feeds = recurrent_model(op, direction, 1)
    for got, want in zip(ponnx.InferenceSession(model).run(None, feeds), expected, strict=True):
        np.testing.assert_array_equal(got, want.transpose([2, 0, 1, 3] if want.ndim == 4 else [1, 0, 2]))


def test_gru_with_linear_before_reset():
    against_onnxruntime(*recurrent_model("GRU", "bidirectional", 0, linear_before_reset=1))


def test_lstm_with_clip_coupled_gates_peepholes_and_other_activations():
    against_onnxruntime(*recurrent_model("LSTM", "forward", 0, peepholes=True, clip=0.8, input_forget=1))
    activations = ["HardSigmoid", "LeakyRelu", "Softsign", "Sigmoid", "Tanh", "ScaledTanh"]
    against_onnxruntime(
        *recurrent_model(
            "LSTM",
            "bidirectional",
            0,
            peepholes=True,
            activations=activations,
            activation_alpha=[0.3, 0.2, 0.7],
            activation_beta=[0.4, 1.3],
        )
    )


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_the_recurrence_is_one_kernel_per_direction(op, direction):
    # The time loop is inside the kernel (a 'for' block): a few kernels whatever the length,
    # where the unrolled lowering made one call per time step.  A batch of one: each step's
    # products are matrix-vector products.
    session = against_onnxruntime(*recurrent_model(op, direction, 0, steps=40, batch=1))
    _assert_looped(session, direction)


def _assert_looped(session, direction):
    kernels = session.kernels()
    assert len(session.groups) == len(kernels) < 10
    looped = [k for k in kernels if k.definition.has_sequential_loops]
    assert len(looped) == (2 if direction == "bidirectional" else 1)


@pytest.mark.parametrize(
    "op, attributes, looped",
    [("RNN", {}, False), ("LSTM", {}, False), ("GRU", {"linear_before_reset": 1}, False), ("GRU", {}, True)],
)
def test_a_larger_batch_is_unrolled_where_each_step_is_a_contraction(op, attributes, looped):
    # Unrolled, such a step is one contraction kernel reading the weights once for the whole
    # batch; GRU's reset gate scales the state inside its product (without linear_before_reset),
    # no contraction kernel takes that step, and the time loop stays faster.
    session = against_onnxruntime(*recurrent_model(op, "forward", 0, steps=20, **attributes))
    if looped:
        _assert_looped(session, "forward")
    else:
        assert len(session.kernels()) >= 20
        assert not any(k.definition.has_sequential_loops for k in session.kernels())


def test_the_steps_of_a_padded_sequence_share_their_kernels():
    # Entries of different lengths keep the unrolled lowering, one call per step.
    model, feeds = recurrent_model("LSTM", "forward", 0, steps=40)
    feeds["sequence_lens"] = np.array([40, 31, 40], np.int32)
    session = against_onnxruntime(model, feeds)
    kernels = session.kernels()
    assert len(kernels) >= 40 and len({id(k) for k in kernels}) <= 8


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_padded_sequences(op, direction):
    # Entries shorter than the sequence (one empty): their states stay once their steps are
    # done, the reverse direction starts at each entry's own end, Y is zero past each length.
    # The lengths are a graph input: the session plans once per distinct set of lengths.
    model, feeds = recurrent_model(op, direction, 0)
    session = ponnx.InferenceSession(model)
    for lengths in ([STEPS, STEPS - 4, 1], [2, STEPS, 0]):
        feeds["sequence_lens"] = np.array(lengths, np.int32)
        ours = session.run(None, feeds)
        theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for got, expected in zip(ours, theirs, strict=True):
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_sequence_lengths_beyond_the_sequence_are_an_error():
    model, feeds = recurrent_model("GRU", "forward", 0)
    feeds["sequence_lens"] = np.array([STEPS, STEPS + 2, STEPS], np.int32)
    with pytest.raises(polyc.UnsupportedError, match=r"node 'GRU_0' \(GRU\): sequence_lens \[11, 13, 11\] for"):
        ponnx.InferenceSession(model).run(None, feeds)
