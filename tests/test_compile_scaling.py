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
from polyc.lang.parser import parse
from polyc.lang.sema import check_def
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
