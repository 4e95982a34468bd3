"""Which loops a CPU kernel's ``omp parallel for`` shares out among the threads.

A parallel loop of few iterations leaves threads idle or unevenly loaded (3 matrices over 2
threads: one thread does two thirds), so the C back end collapses the parallel loops nested
right inside it into one iteration space (:data:`polyc.codegen.c.COLLAPSE_BELOW`), but only
loops that carry no dependence and have constant bounds, and not the loop around a vector loop.  Each case is also checked against
numpy with several thread counts, since a wrong collapse would race or skip iterations.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc.codegen.c import COLLAPSE_BELOW

# The qkv Transpose of a transformer encoder exported from PyTorch: (1, seq, 3, heads, dh) ->
# (3, 1, heads, seq, dh); its outermost parallel loop has 3 iterations.
HEADS_FIRST = """def heads_first(float(1, 128, 3, 12, 64) X) -> (Y) {
    Y(i0, i1, i2, i3, i4) = X(i1, i3, i0, i2, i4) where i0 in 0:3, i1 in 0:1, i2 in 0:12, i3 in 0:128, i4 in 0:64
}"""
# Untiled, a parallel loop of 3 iterations around a loop over r_j (constant bounds), which
# carries the sum's dependence and must stay inside a thread.
MIDDLE_SUM = "def middle_sum(float(3, 100, 64) A) -> (S) { S(i, k) +=! A(i, r_j, k) }"


def parallel_pragmas(kernel) -> list[str]:
    return [line.strip() for line in kernel.c_source().splitlines() if "#pragma omp parallel" in line]


def collapsed_loops(pragma: str) -> int:
    found = re.search(r"collapse\((\d+)\)", pragma)
    return int(found.group(1)) if found else 1


@pytest.mark.parametrize("threads", [None, 2, 3, 5])
def test_a_short_parallel_loop_shares_out_the_parallel_loops_inside_it(threads):
    kernel = polyc.define(HEADS_FIRST, threads=threads, tuning=False).heads_first
    pragmas = parallel_pragmas(kernel)
    assert len(pragmas) == 1 and collapsed_loops(pragmas[0]) >= 2, pragmas
    x = np.random.default_rng(0).standard_normal((1, 128, 3, 12, 64)).astype(np.float32)
    for _ in range(3):  # threads take other shares in other calls: every element, every time
        assert np.array_equal(kernel(x), x.transpose(2, 0, 3, 1, 4))


def test_collapsing_stops_once_there_are_enough_iterations():
    source = polyc.define(HEADS_FIRST, tuning=False).heads_first.c_source()
    lines = source.splitlines()
    at = next(i for i, line in enumerate(lines) if "#pragma omp parallel" in line)
    loops = collapsed_loops(lines[at])
    trips = []
    for line in lines[at + 1 : at + 1 + loops]:
        init, last, step = (
            int(v)
            for v in re.search(
                r"= INT64_C\((\d+)\); c\d+ <= INT64_C\((\d+)\); c\d+ \+= INT64_C\((\d+)\)", line
            ).groups()
        )
        trips.append((last - init) // step + 1)
    assert np.prod(trips[:-1]) < COLLAPSE_BELOW <= np.prod(trips), trips


@pytest.mark.parametrize("threads", [None, 2, 3])
def test_a_loop_that_carries_a_dependence_is_not_collapsed(threads):
    kernel = polyc.define(MIDDLE_SUM, threads=threads, loop_tiles=(), tuning=False).middle_sum
    pragmas = parallel_pragmas(kernel)
    assert pragmas and all(collapsed_loops(p) == 1 for p in pragmas), pragmas
    a = np.random.default_rng(1).standard_normal((3, 100, 64)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(kernel(a), a.sum(axis=1, dtype=np.float64), rtol=1e-4, atol=1e-4)


def test_a_loop_whose_bounds_are_not_constants_is_not_collapsed():
    source = HEADS_FIRST.replace("float(1, 128, 3, 12, 64) X", "float(1, S, 3, 12, 64) X").replace(
        "i3 in 0:128", "i3 in 0:S"
    )
    kernel = polyc.define(source, specialize=False, tuning=False).heads_first
    pragmas = parallel_pragmas(kernel)
    assert pragmas and all(collapsed_loops(p) == 1 for p in pragmas), pragmas  # S iterations: unknown
    x = np.random.default_rng(2).standard_normal((1, 40, 3, 12, 64)).astype(np.float32)
    assert np.array_equal(kernel(x), x.transpose(2, 0, 3, 1, 4))


def test_the_loop_around_a_vector_loop_stays_a_loop_of_each_thread():
    # (1, 12, 128, 64) -> (1, 12, 64, 128): 2 blocks of 6 heads x 6 heads, then 64 rows around
    # the vector loop; collapsing the rows too made gcc's code of the pair slower (16 -> 28 us).
    source = """def rows_last(float(1, 12, 128, 64) X) -> (Y) {
        Y(i0, i1, i2, i3) = X(i0, i1, i3, i2) where i0 in 0:1, i1 in 0:12, i2 in 0:64, i3 in 0:128
    }"""
    # the generic path's loop nest (the transpose path would take this def otherwise)
    kernel = polyc.define(source, tuning=False, transpose_kernels=False).rows_last
    lines = kernel.c_source().splitlines()
    at = next(i for i, line in enumerate(lines) if "#pragma omp parallel" in line)
    loops = collapsed_loops(lines[at])
    # the pragma, the collapsed loops, the row loop, then the vector loop
    assert loops >= 2 and lines[at + loops + 2].strip() == "#pragma omp simd", lines[at : at + loops + 3]
    x = np.random.default_rng(3).standard_normal((1, 12, 128, 64)).astype(np.float32)
    assert np.array_equal(kernel(x), x.transpose(0, 1, 3, 2))


def test_threads_on_a_parallel_vector_loop():
    # A loop both parallel and vectorised is one "omp parallel for simd" pragma; the threads
    # option's clauses went between "for" and "simd", which gcc refuses (issue 84's
    # consistency test found it).
    source = "def firstsum(float(N) A) -> (B) { B(j) = A(j) where j in 0:N\n B(z) += A(r) where z in 0:1, r in 0:N }"
    kernel = polyc.define(source, threads=2, tuning=False).firstsum
    pragmas = parallel_pragmas(kernel)
    assert any(p.startswith("#pragma omp parallel for simd num_threads(2)") for p in pragmas), pragmas
    a = np.arange(10000, dtype=np.float32) / 1000
    expected = a.copy()
    expected[0] += a.sum(dtype=np.float64)
    np.testing.assert_allclose(kernel(a), expected, rtol=1e-5)
