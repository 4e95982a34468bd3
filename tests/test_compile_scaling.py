"""Compile time of defs with many statements grows with their number, not its square.

The tests count work instead of timing it, so that a loaded machine cannot make them fail: the
outer-loop fusion (:mod:`polyc.schedule.outer_fusion`) asks isl whether dependences stay within
one iteration of a loop, and the number of maps in the relations it hands isl for those checks
(and the number of checks) is the work that grew with the square of the statement count (it formed the relation "same
point of the loop" between every two statements of a run: 600 independent statements took over
ten minutes).  Counted for ``n`` and ``4 n`` statements, linear work grows four times, quadratic
sixteen times; the bound of six leaves room for constant terms.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc.driver import analyse
from polyc.ir.dependences import compute_dependences
from polyc.ir.model import build_program
from polyc.lang.parser import parse
from polyc.lang.sema import check_def
from polyc.schedule import scheduler
from polyc.schedule.outer_fusion import fuse_outer_loops


def _chain(n: int) -> str:
    lines = ["T0(i) = X(i) * 2.0"] + [f"T{k}(i) = T{k - 1}(i) + 1.0" for k in range(1, n)]
    body = "\n".join(lines)
    return f"def chain(float(N) X) -> (T{n - 1}) {{\n{body}\n}}"


def _independent(n: int) -> str:
    inputs = ", ".join(f"float(N) A{k}" for k in range(n))
    outputs = ", ".join(f"B{k}" for k in range(n))
    lines = [f"B{k}(i) = A{k}(i) + 1.0" for k in range(n)]
    body = "\n".join(lines)
    return f"def independent({inputs}) -> ({outputs}) {{\n{body}\n}}"


def _subset_work(source: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """The subset checks of isl during the outer-loop fusion of the def in ``source``, each
    counted as one and the number of maps in its two relations."""
    (tree,) = parse(source).defs
    analysis = analyse(check_def(tree, source), "smart")
    work = 0
    is_subset = isl.UnionMap.is_subset

    def counted(self: isl.UnionMap, other: isl.UnionMap) -> bool:
        nonlocal work
        work += 1 + self.n_map() + other.n_map()
        return is_subset(self, other)

    with monkeypatch.context() as patch:
        patch.setattr(isl.UnionMap, "is_subset", counted)
        fuse_outer_loops(analysis.schedule, analysis.program, analysis.dependences, {})
    return work


@pytest.mark.parametrize("program", [_chain, _independent])
def test_outer_fusion_work_grows_linearly(program, monkeypatch):
    small = _subset_work(program(15), monkeypatch)
    large = _subset_work(program(60), monkeypatch)
    assert 0 < large <= 6 * small, (small, large)


def test_many_independent_statements_compile_and_run():
    # (Over ten minutes for 600 such statements while the fusion checks were quadratic.)
    n = 120
    kernel = polyc.define(_independent(n), tuning=False).independent
    inputs = [np.full(8, k, np.float32) for k in range(n)]
    results = kernel(*inputs)
    for k, result in enumerate(results):
        np.testing.assert_array_equal(result, inputs[k] + 1)


def _rows(n: int) -> str:
    """Row reductions and row-wise passes, each reading the one before (a component of ``n``
    statements, and their initialisations)."""
    lines = ["S0(i) +=! X(i, r)", "T0(i, j) = X(i, j) - S0(i)"]
    for k in range(1, n // 2):
        lines += [f"S{k}(i) +=! T{k - 1}(i, r)", f"T{k}(i, j) = T{k - 1}(i, j) * S{k}(i)"]
    body = "\n".join(lines)
    return f"def rows(float(N, M) X) -> (T{n // 2 - 1}) {{\n{body}\n}}"


RECURRENCE = """
def rnn(float(T, B, I) X, float(G, I) W, float(G, G) R, float(B, G) H0) -> (float(T, B, G) Y, P) {
    XW(t, b, g) +=! X(t, b, r_i) * W(g, r_i)
    for t in 0:T {
        A(t, b, g) +=! (t >= 1 ? Y(t - 1, b, r_g) : H0(b, r_g)) * R(g, r_g)
        Z(t, b, g) = tanh(XW(t, b, g) + A(t, b, g))
        U(t, b, g) = Z(t, b, g) * 0.5
        Y(t, b, g) = U(t, b, g) + Z(t, b, g)
    }
    P(t, b, g) = Y(t, b, g) * 2.0
}"""


@pytest.mark.parametrize("source", [_chain(40), _rows(40), _independent(40)], ids=["chain", "rows", "independent"])
def test_a_large_component_scheduled_in_pieces_gives_the_same_code(source, monkeypatch):
    # isl's clustering grows with the cube of a component's size, so a large one is scheduled
    # in pieces of consecutive statements; the outer-loop fusion joins their loops again.
    name = source.split("(")[0].split()[-1]
    expected = getattr(polyc.define(source, tuning=False), name).c_source()
    monkeypatch.setattr(scheduler, "MAX_STATEMENTS_PER_PROBLEM", 8)
    assert getattr(polyc.define(source, tuning=False), name).c_source() == expected


def test_pieces_keep_a_sequential_loop_whole():
    (tree,) = parse(RECURRENCE).defs
    program = build_program(check_def(tree, RECURRENCE))
    maps = []
    compute_dependences(program).all.foreach_map(maps.append)
    pieces = scheduler.source_order_pieces(program.statements, maps, 1)
    names = [[s.name for s in piece] for piece in pieces]
    in_loop = [s.name for s in program.statements if s.loop is not None and s.kind != "init"]
    assert [statement for piece in names for statement in piece] == [s.name for s in program.statements]
    assert any(set(in_loop) <= set(piece) for piece in names), names
    assert len(pieces) > 1, names


def test_recurrence_scheduled_in_pieces_runs(monkeypatch):
    monkeypatch.setattr(scheduler, "MAX_STATEMENTS_PER_PROBLEM", 1)
    kernel = polyc.define(RECURRENCE, tuning=False).rnn
    rng = np.random.default_rng(0)
    t, b, i, g = 5, 2, 3, 4
    x, w, r, h0 = (rng.standard_normal(s).astype(np.float32) for s in ((t, b, i), (g, i), (g, g), (b, g)))
    state, expected = h0, []
    for step in range(t):
        z = np.tanh(x[step] @ w.T + state @ r.T)
        state = z * 0.5 + z
        expected.append(state)
    y, p = kernel(x, w, r, h0)
    np.testing.assert_allclose(y, np.stack(expected), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(p, 2 * np.stack(expected), rtol=1e-5, atol=1e-5)
