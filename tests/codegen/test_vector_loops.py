"""How the C back end writes vector loops: float sums in blocks of one constant length, and a
loop written once per value of a select condition it leaves fixed (a recurrence's first step
reading the initial state), so that no select is left inside the vector loop.

Each case is also run against the reference interpreter or numpy: a wrong version or a block
of the wrong length gives wrong numbers, not only other C.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc.codegen.c import SUM_BLOCK
from polyc.interpreter import interpret

# The recurrent part of an RNN layer: a dot product per output whose vector operand is the
# previous step's state, or the initial state at the first step.
RECURRENCE = """
def recurrence(float(T, G) XW, float(G, G) R, float(G) H0) -> (float(T, G) Y) {
    for t in 0:T {
        A(t, g) +=! (t >= 1 ? Y(t - 1, r_g) : H0(r_g)) * R(g, r_g)
        Y(t, g) = tanh(XW(t, g) + A(t, g))
    }
}
"""

ROW_SUM = "def row_sum(float(M, K) X) -> (S) { S(m) +=! X(m, r_k) }"


def vector_loops(source: str) -> list[str]:
    """The text of each loop under an ``omp simd`` pragma: the pragma's next line and the
    statement line after it."""
    lines = source.splitlines()
    return [
        lines[i + 1] + "\n" + lines[i + 2]
        for i, line in enumerate(lines)
        if line.strip().startswith("#pragma omp simd")
    ]


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_a_select_on_the_step_is_decided_outside_the_vector_loop(steps):
    kernel = polyc.define(RECURRENCE, tuning=False).recurrence
    sizes = {"T": steps, "G": 300}
    source = kernel.c_source(sizes)
    dot_products = [loop for loop in vector_loops(source) if "R[" in loop]
    assert dot_products, source
    assert all(" ? " not in loop for loop in dot_products), dot_products  # no select per element
    assert "polyc: the loop above, for !" in source  # the initial state's version
    versioned = [fact for fact in kernel.stages(sizes).kernel.loops if fact.versioned_on]
    assert versioned and all(len(fact.versioned_on) == 1 for fact in versioned)
    assert "written once per value of" in str(kernel.explain(sizes))

    rng = np.random.default_rng(steps)
    xw = rng.standard_normal((steps, 300)).astype(np.float32)
    r = (rng.standard_normal((300, 300)) / 20).astype(np.float32)
    h0 = rng.standard_normal(300).astype(np.float32)
    expected = interpret(kernel.definition, [xw, r, h0])[0]
    np.testing.assert_allclose(kernel(xw, r, h0), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "length, block, even",
    [
        (2 * SUM_BLOCK, SUM_BLOCK, True),  # two blocks of SUM_BLOCK
        (1000, 250, True),  # four blocks of 250: no block longer than SUM_BLOCK
        (769, SUM_BLOCK, False),  # 769 = 4 x 192 + 1: SUM_BLOCK and a shorter last block
    ],
)
def test_a_long_float_sum_runs_in_blocks_of_one_length_where_its_length_allows(length, block, even):
    kernel = polyc.define(ROW_SUM, tuning=False).row_sum
    sizes = {"M": 8, "K": length}
    source = kernel.c_source(sizes)
    steps = re.findall(r"(\w+)_block \+= (\d+)\)", source)
    assert steps and {int(step) for _, step in steps} == {block}, steps
    ends = re.findall(r"const int64_t \w+_last = (.*);", source)
    assert ends and all(end.startswith("polyc_min(") != even for end in ends), ends
    facts = [fact for fact in kernel.stages(sizes).kernel.loops if fact.blocked]
    assert facts and all(fact.sum_block == block for fact in facts)
    assert f"summed in blocks of {block} iterations" in str(kernel.explain(sizes))

    x = np.random.default_rng(length).standard_normal((8, length)).astype(np.float32)
    np.testing.assert_allclose(kernel(x), x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
