"""Recurrences: a statement reading what it wrote at an earlier step along one index, and
``for t in lo:hi { ... }`` blocks whose statements run step by step (docs/language.md,
"Recurrences").  The interpreter and the C back end against numpy, specialised and parametric;
the sequential loop in the schedule; the errors for misuse."""

from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc.errors import TCSemanticError, TCSyntaxError
from polyc.interpreter import interpret

CUMSUM = """
def cumsum(float(T, N) X) -> (S) {
    S(t, n) = X(t, n) where t in 0:T
    S(t, n) = S(t - 1, n) + X(t, n) where t in 1:T
}
"""

# The state read before it is written, at the step before: an output declared with its type
# and sizes; the first step reads the initial state through a guard.
RNN = """
def rnn(float(T, B, I) X, float(G, I) W, float(G, G) R, float(G) Bias, float(B, G) H0) -> (float(T, B, G) Y) {
    XW(t, b, g) +=! X(t, b, r_i) * W(g, r_i)
    for t in 0:T {
        A(t, b, g) +=! (t >= 1 ? Y(t - 1, b, r_g) : H0(b, r_g)) * R(g, r_g)
        Y(t, b, g) = tanh(XW(t, b, g) + A(t, b, g) + Bias(g))
    }
}
"""

GRU = """
def gru(float(T, B, I) X, float(3, G, I) W, float(3, G, G) R, float(B, G) H0) -> (float(T, B, G) Y) {
    XW(t, b, q, g) +=! X(t, b, r_i) * W(q, g, r_i)
    for t in 0:T {
        P(t, b, g) = t >= 1 ? Y(t - 1, b, g) : H0(b, g)
        ZR(t, b, q, g) +=! P(t, b, r_g) * R(q, g, r_g) where q in 0:2
        Z(t, b, g) = 1 / (1 + exp(-(XW(t, b, 0, g) + ZR(t, b, 0, g))))
        Rs(t, b, g) = 1 / (1 + exp(-(XW(t, b, 1, g) + ZR(t, b, 1, g))))
        N(t, b, g) +=! Rs(t, b, r_g) * P(t, b, r_g) * R(2, g, r_g)
        Y(t, b, g) = (1 - Z(t, b, g)) * tanh(XW(t, b, 2, g) + N(t, b, g)) + Z(t, b, g) * P(t, b, g)
    }
}
"""

LSTM = """
def lstm(float(T, B, I) X, float(4, G, I) W, float(4, G, G) R, float(4, G) Bias, float(B, G) H0, float(B, G) C0)
    -> (float(T, B, G) Y, float(T, B, G) C) {
    XW(t, b, q, g) +=! X(t, b, r_i) * W(q, g, r_i)
    for t in 0:T {
        Pre(t, b, q, g) +=! (t >= 1 ? Y(t - 1, b, r_g) : H0(b, r_g)) * R(q, g, r_g)
        Act(t, b, q, g) = Pre(t, b, q, g) + XW(t, b, q, g) + Bias(q, g)
        C(t, b, g) = 1 / (1 + exp(-Act(t, b, 2, g))) * (t >= 1 ? C(t - 1, b, g) : C0(b, g))
                   + 1 / (1 + exp(-Act(t, b, 0, g))) * tanh(Act(t, b, 3, g))
        Y(t, b, g) = 1 / (1 + exp(-Act(t, b, 1, g))) * tanh(C(t, b, g))
    }
}
"""


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _cumsum_case(rng, t, n):
    x = rng.standard_normal((t, n)).astype(np.float32)
    return (x,), (np.cumsum(x.astype(np.float64), axis=0),)


def _rnn_case(rng, t, b, i, g):
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    w, r = (rng.uniform(-0.5, 0.5, shape).astype(np.float32) for shape in ((g, i), (g, g)))
    bias, h0 = rng.standard_normal(g).astype(np.float32), rng.standard_normal((b, g)).astype(np.float32)
    h, ys = h0.astype(np.float64), []
    for step in range(t):
        h = np.tanh(x[step] @ w.T + h @ r.T + bias)
        ys.append(h)
    return (x, w, r, bias, h0), (np.stack(ys),)


def _gru_case(rng, t, b, i, g):
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    w = rng.uniform(-0.5, 0.5, (3, g, i)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (3, g, g)).astype(np.float32)
    h0 = rng.standard_normal((b, g)).astype(np.float32)
    h, ys = h0.astype(np.float64), []
    for step in range(t):
        xw = np.einsum("bi,qgi->qbg", x[step], w)
        z = _sigmoid(xw[0] + h @ r[0].T)
        reset = _sigmoid(xw[1] + h @ r[1].T)
        candidate = np.tanh(xw[2] + (reset * h) @ r[2].T)
        h = (1 - z) * candidate + z * h
        ys.append(h)
    return (x, w, r, h0), (np.stack(ys),)


def _lstm_case(rng, t, b, i, g):
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    w = rng.uniform(-0.5, 0.5, (4, g, i)).astype(np.float32)
    r = rng.uniform(-0.5, 0.5, (4, g, g)).astype(np.float32)
    bias = rng.standard_normal((4, g)).astype(np.float32)
    h0, c0 = (rng.standard_normal((b, g)).astype(np.float32) for _ in range(2))
    h, c, ys, cs = h0.astype(np.float64), c0.astype(np.float64), [], []
    for step in range(t):
        act = np.einsum("bi,qgi->qbg", x[step], w) + np.einsum("bh,qgh->qbg", h, r) + bias[:, None, :]
        c = _sigmoid(act[2]) * c + _sigmoid(act[0]) * np.tanh(act[3])
        h = _sigmoid(act[1]) * np.tanh(c)
        ys.append(h)
        cs.append(c)
    return (x, w, r, bias, h0, c0), (np.stack(ys), np.stack(cs))


CASES = {
    "cumsum": (CUMSUM, _cumsum_case, [(1, 3), (7, 5), (40, 33)]),
    "rnn": (RNN, _rnn_case, [(1, 1, 2, 3), (6, 3, 4, 5), (12, 2, 16, 40)]),
    "gru": (GRU, _gru_case, [(1, 1, 2, 3), (5, 3, 4, 6), (9, 1, 8, 33)]),
    "lstm": (LSTM, _lstm_case, [(1, 1, 2, 3), (5, 2, 3, 7), (10, 4, 16, 64)]),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("specialize", [True, False], ids=["specialised", "parametric"])
def test_recurrences_match_numpy(name, specialize):
    source, make, size_sets = CASES[name]
    kernel = polyc.define(source, specialize=specialize)[name]
    rng = np.random.default_rng(0)
    for sizes in size_sets:
        args, expected = make(rng, *sizes)
        compiled = kernel(*args)
        interpreted = interpret(kernel.definition, args)
        compiled = compiled if isinstance(compiled, tuple) else (compiled,)
        for got, reference, want in zip(compiled, interpreted, expected):
            np.testing.assert_allclose(reference, want, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_step_loop_is_sequential_and_an_inner_loop_parallel():
    kernel = polyc.define(LSTM).lstm
    stages = kernel.stages({"T": 8, "B": 16, "G": 64, "I": 32})
    # (the zeroing of a reduction's accumulator depends on no other step: it may run in parallel)
    block = {s.name for s in stages.segments[-1].program.statements if s.loop is not None and s.kind != "init"}
    assert block
    decisions = stages.segments[-1].decisions
    steps = [(d, m) for d in decisions for m, indices in enumerate(d.member_indices) if set(indices.values()) == {"t"}]
    assert steps and all(not d.coincident[m] for d, m in steps if set(d.statements) & block)
    assert any(d.parallel == "parallel" and set(d.statements) & block for d in decisions)


def test_a_statement_reading_its_own_earlier_step_is_a_loop_of_its_own():
    definition = polyc.define(CUMSUM).cumsum.definition
    first, second = definition.statements
    assert first.loop is None
    assert second.loop is not None and second.loop.index == "t" and str(second.loop.range) == "1:T"


def test_for_blocks_print_back():
    from polyc.lang.parser import parse
    from polyc.lang.printer import format_source

    text = format_source(parse(RNN))
    assert "    for t in 0:T {\n        A(t, b, g) +=! " in text
    assert format_source(parse(text)) == text


ERRORS = {
    "later step": (
        "def f(float(T, N) X) -> (float(T, N) S) { S(t, n) = S(t + 1, n) + X(t, n) where t in 0:T - 1 }",
        "later step",
    ),
    "non-constant offset": (
        "def f(float(T, N) X) -> (float(T, N) S) { for t in 1:T { S(t, n) = S(t - n, n) + X(t, n) } }",
        "constant",
    ),
    "non-constant offset, no block": (
        "def f(float(T, N) X) -> (float(T, N) S) { S(t, n) = S(n, n) + X(t, n) where t in 1:T }",
        "constant offset",
    ),
    "unguarded read before the start": (
        "def f(float(T, N) X) -> (float(T, N) S) { for t in 0:T { S(t, n) = S(t - 1, n) + X(t, n) } }",
        "guard the read",
    ),
    "same step before it is written": (
        "def f(float(T, N) X) -> (float(T, N) S) { for t in 0:T { A(t, n) = S(t, n) + 1\n"
        " S(t, n) = A(t, n) * X(t, n) } }",
        "after this statement reads",
    ),
    "two indices stepped": (
        "def f(float(T, N) X) -> (float(T, N) S) { S(t, n) = S(t - 1, n - 1) + X(t, n) where t in 1:T, n in 1:N }",
        "along one index",
    ),
    "no step index on the left": (
        "def f(float(T, N) X) -> (S) { for t in 0:T { S(n) = X(t, n) } }",
        "writes its target at 't'",
    ),
    "a where range for the step index": (
        "def f(float(T, N) X) -> (S) { for t in 0:T { S(t, n) = X(t, n) where t in 0:2 } }",
        "gives 't' its range",
    ),
    "state read first, not declared": (
        "def f(float(T, N) X) -> (S) { for t in 1:T { A(t, n) = S(t - 1, n)\n S(t, n) = A(t, n) + X(t, n) } }",
        "declared with its type and sizes",
    ),
}


@pytest.mark.parametrize("case", ERRORS)
def test_misuse_is_a_semantic_error(case):
    source, words = ERRORS[case]
    with pytest.raises(TCSemanticError, match=words):
        polyc.define(source)


def test_nested_for_blocks_are_a_syntax_error():
    with pytest.raises(TCSyntaxError, match="cannot be nested"):
        polyc.define("def f(float(T, N) X) -> (S) { for t in 0:T { for u in 0:N { S(t, u) = X(t, u) } } }")


def test_the_bounds_proof_still_checks_reads_of_earlier_steps():
    # Guarded only for t >= 1, the read at t - 2 leaves S at t = 1: a precondition on the
    # sizes (T >= 2 is wrong), checked at the call.
    kernel = polyc.define(
        "def f(float(T, N) X) -> (float(T, N) S) { for t in 0:T { S(t, n) = (t >= 1 ? S(t - 2, n) : 0) + X(t, n) } }"
    ).f
    assert "T" in str(kernel.bounds_precondition)
    kernel(np.ones((1, 2), np.float32))
    with pytest.raises(polyc.BoundsError):
        kernel(np.ones((3, 2), np.float32))


def test_parallel_loops_inside_the_step_loop_share_one_team():
    """Each step's matrix-vector product is a parallel loop worth a team (the barrier after it
    every step is cheap, a team started every step is not): one ``omp parallel`` around the step
    loop, ``omp for`` inside."""
    kernel = polyc.define(RNN).rnn
    sizes = {"T": 6, "B": 1, "I": 8, "G": 300}
    source = kernel.c_source(sizes)
    team = source[source.index("#pragma omp parallel\n") :]
    assert "#pragma omp for" in team
    assert "#pragma omp parallel for" not in team
    args, expected = _rnn_case(np.random.default_rng(1), 6, 1, 8, 300)
    np.testing.assert_allclose(kernel(*args), expected[0], rtol=1e-3, atol=1e-4)  # sums of 300 in float32


def test_too_little_work_per_step_runs_the_step_loop_on_one_thread():
    source = polyc.define(RNN).rnn.c_source({"T": 50, "B": 1, "I": 8, "G": 32})
    assert "#pragma omp parallel\n" not in source
    assert "#pragma omp for" not in source
