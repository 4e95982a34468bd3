"""The default tile sizes (:func:`polyc.schedule.tiling.choose_tile_sizes`): the cost model's
choice between equal blocks and whole inner loops, read from the compiled kernel's decisions
(``kernel.explain``), with the cache sizes pinned so that the choice does not depend on the
machine the tests run on."""

from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc.schedule import tiling

CACHES = (32 * 1024, 512 * 1024, 32 * 1024 * 1024)

TENSORDOT = """
def tensordot(float(N, C1, C2, H, W) I0, float(N, C2, C3, H, W) I1) -> (O) {
    O(n, c1, c3, h, w) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, c3, h, w)
}"""

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


def tiles(source: str, entry: str, sizes: dict, **options) -> dict[str, int | None]:
    # (the cache tiles alone: a register tile cuts the point loops again, tests/test_register_tiles.py)
    options = {"threads": 2, "register_tiles": (), **options}
    kernel = polyc.define(source, tuning=False, cache_sizes=CACHES, **options)[entry]
    explanation = kernel.explain(sizes)
    return {loop.index: loop.tile_size for loop in explanation.loops}


def test_a_streaming_contraction_keeps_its_planes_whole():
    # Every access is moved by n, h and w: cutting the 28 x 28 planes buys no reuse, only
    # short inner loops (twice as slow, measured); the outer n and c1 shrink instead.
    chosen = tiles(TENSORDOT, "tensordot", dict(N=32, C1=512, C2=8, C3=2, H=28, W=28))
    assert chosen["h"] == 28 and chosen["w"] == 28 and chosen["n"] == 1
    assert chosen["c1"] < 512


def test_a_matmul_keeps_equal_blocks():
    # Each operand is reused along the member that does not move it: equal blocks keep that.
    chosen = tiles(MATMUL, "mm", dict(M=512, N=512, K=512), blas_contractions=False)
    assert chosen["m"] == chosen["n"] == chosen["r_k"] == 128  # 3 x 128 x 128 floats: 192 KiB, half of L2


def test_symbolic_sizes_get_equal_blocks():
    kernel = polyc.define(TENSORDOT, tuning=False, specialize=False, cache_sizes=CACHES).tensordot
    explanation = kernel.explain(dict(N=32, C1=512, C2=8, C3=2, H=28, W=28))
    assert len({loop.tile_size for loop in explanation.loops}) == 1


def test_the_model_prefers_whole_inner_loops_only_when_reuse_is_not_lost():
    # (members moving the access, element size): a matmul's three operands...
    matmul = [(frozenset({0, 2}), 4), (frozenset({2, 1}), 4), (frozenset({0, 1}), 4)]
    budget = CACHES[1] // 2
    equal = tiling._equal_sizes(matmul, 3, budget)
    whole = tiling._outer_first_sizes(matmul, [512, 512, 512], 1, budget)
    assert tiling._cost(matmul, equal, 1) < tiling._cost(matmul, whole, 1)
    # ... and an elementwise product, where no member gives reuse.
    elementwise = [(frozenset({0, 1}), 4)] * 3
    equal = tiling._equal_sizes(elementwise, 2, budget)
    whole = tiling._outer_first_sizes(elementwise, [1000, 1000], 1, budget)
    assert whole[1] == 1000 and tiling._cost(elementwise, whole, 1) < tiling._cost(elementwise, equal, 1)


@pytest.mark.parametrize("sizes", [dict(N=2, C1=8, C2=3, C3=2, H=5, W=7), dict(N=3, C1=40, C2=8, C3=2, H=28, W=28)])
def test_the_chosen_tiles_compute_the_tensordot(sizes):
    rng = np.random.default_rng(0)
    n, c1, c2, c3, h, w = (sizes[k] for k in ("N", "C1", "C2", "C3", "H", "W"))
    I0 = rng.standard_normal((n, c1, c2, h, w)).astype(np.float32)
    I1 = rng.standard_normal((n, c2, c3, h, w)).astype(np.float32)
    kernel = polyc.define(TENSORDOT, tuning=False, cache_sizes=CACHES).tensordot
    expected = np.einsum("nachw,ncbhw->nabhw", I0.astype(np.float64), I1.astype(np.float64))
    np.testing.assert_allclose(kernel(I0, I1), expected, rtol=1e-5, atol=1e-5)


TRANSPOSE = "def t(float(N, N) A) -> (B) { B(i, j) = A(j, i) * 2 }"


def test_a_transpose_is_cut_into_blocks_not_rows():
    # B(i, j) = A(j, i): j innermost strides across A's rows, one cache line per element.
    # Whole rows of j (16 x 2048 tiles) would touch 2048 lines per run, four times L1, and
    # fetch every line again for the next i; blocks keep a run's lines in L1.  Rows 2000 floats
    # apart spread over all of L1's sets: equal blocks of half of L1.
    chosen = tiles(TRANSPOSE, "t", dict(N=2000))
    assert chosen["i"] == chosen["j"] and chosen["j"] * 64 <= CACHES[0] // 2, chosen


@pytest.mark.parametrize("n, lines", [(2048, 8), (1024, 8), (512, 16), (256, 32)])
def test_a_power_of_two_transpose_runs_over_the_lines_one_set_holds(n, lines):
    # Rows of a 2048-float matrix lie 8 KiB apart, a multiple of L1's 4 KiB set span (a 32 KiB
    # 8-way L1): every line of a run of A(j, i) falls in one set, which holds 8 of them.  Rows
    # 512 floats apart alternate between two sets.  The outer member keeps its equal block.
    chosen = tiles(TRANSPOSE, "t", dict(N=n))
    assert chosen["j"] == lines and chosen["i"] == min(n // 2, 128), chosen


def test_run_capacity_counts_the_sets_a_stride_reaches():
    l1, span = 48 * 1024, 4096  # 12 ways
    assert tiling._run_capacity(8192, l1, span) == 12  # one set
    assert tiling._run_capacity(2048, l1, span) == 24  # two sets
    assert tiling._run_capacity(8000, l1, span) == 384  # every set: half of L1
    assert tiling._run_capacity(None, l1, span) == 384  # the stride unknown


def test_a_power_of_two_transpose_computes_the_transpose():
    # A 12-way L1 (48 KiB): rows 1 KiB apart reach 4 sets, 48 lines; 256 is no multiple of 48,
    # so the last tile of the innermost loop is a partial one.
    A = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    caches = (48 * 1024, 2048 * 1024, 32 * 1024 * 1024)
    kernel = polyc.define(TRANSPOSE, tuning=False, cache_sizes=caches, threads=2).t
    assert {loop.index: loop.tile_size for loop in kernel.explain(dict(N=256)).loops}["j"] == 48
    np.testing.assert_array_equal(kernel(A), A.T * 2)


def test_the_reduction_runs_outside_the_contiguous_planes():
    # h and w scan whole 5 x 6 planes of O, I0 and I1: the reduction over r_c2 (7 steps) goes
    # outside both, so each step streams one plane, instead of running between h and w over
    # 6-element rows of 7 planes.
    import re

    kernel = polyc.define(TENSORDOT, tuning=False, cache_sizes=CACHES, register_tiles=()).tensordot
    source = kernel.c_source(dict(N=2, C1=3, C2=7, C3=2, H=5, W=6))
    bounds = [int(b) for b in re.findall(r"for \(int64_t c\d+ = INT64_C\(0\); c\d+ <= INT64_C\((\d+)\)", source)]
    assert bounds.index(6) < bounds.index(4) < bounds.index(5), bounds  # r_c2, then h, then w


MVT = """
def mvt(double(N) y_1, double(N) y_2, double(N, N) A) -> (x1, x2) {
    x1(i) +=! A(i, r_j) * y_1(r_j)
    x2(i) +=! A(r_j, i) * y_2(r_j)
}"""


def test_the_parallel_loop_keeps_a_tile_for_every_thread():
    # x2's A(r_j, i): the model keeps i whole (stride 1) and cuts r_j; with a 1 MiB L2 (an AMD
    # Zen 5) the whole of i fits, which would leave one tile of the parallel loop over i, and
    # every thread but one idle.  The tile of i shrinks to leave one per thread.
    zen5 = (48 * 1024, 1024 * 1024, 32 * 1024 * 1024)
    for threads in (2, 4):
        kernel = polyc.define(MVT, tuning=False, cache_sizes=zen5, threads=threads, blas_contractions=False).mvt
        explanation = kernel.explain(dict(N=512))
        sizes = [loop.tile_size for loop in explanation.loops if loop.index == "i"]
        assert sizes and all(size is not None and 512 // size >= threads for size in sizes), (threads, sizes)


def test_tiles_are_cut_from_where_the_loop_starts():
    # The interior rows of a padded image, 1..128, in tiles of 64: cut from row 0 they made
    # tiles of 63, 64 and 1 rows, and the parallel loop's three iterations gave one thread
    # two of them.  Each member is shifted to start at 0 first: two tiles of 64.
    source = """def interior(float(130, 256) A) -> (B) {
        B(i, j) = A(i - 1, j) + A(i + 1, j) where i in 1:129, j in 0:256
    }"""
    kernel = polyc.define(source, tuning=False, cache_sizes=CACHES, loop_tiles=(64, 64)).interior
    code = kernel.c_source()
    assert "c0 <= INT64_C(127); c0 += INT64_C(64)" in code, code
    a = np.random.default_rng(3).standard_normal((130, 256)).astype(np.float32)
    np.testing.assert_array_equal(kernel(a)[1:], a[:128] + a[2:])  # (row 0 is not written)


def test_loop_order_sets_the_order_of_the_outer_loops():
    sizes = dict(M=96, N=80, K=72)
    a = np.random.default_rng(5).random((96, 72), dtype=np.float32)
    b = np.random.default_rng(6).random((72, 80), dtype=np.float32)
    # loops it does not name follow; the parallel loop then goes outermost (r_k, the sum, is not
    # one), keeping the tile size loop_order gave it: the loops over the tiles as the C runs them.
    for order, expected, tile_sizes in (
        (None, ["m", "n", "r_k"], [32, 16, 8]),
        (("r_k", "n", "m"), ["n", "r_k", "m"], [16, 32, 8]),
        (("n",), ["n", "m", "r_k"], [32, 16, 8]),
    ):
        kernel = polyc.define(
            MATMUL, tuning=False, cache_sizes=CACHES, blas_contractions=False, loop_tiles=(32, 16, 8), loop_order=order
        ).mm
        # The loops over the tiles (the loops in a tile follow, reordered for stride-1 access).
        outer = [loop for loop in kernel.explain(sizes).loops if loop.tile_loop]
        assert [loop.index for loop in outer] == expected
        # Tile sizes follow loop_order: 32 is the tile of the first loop it names.
        assert [loop.tile_size for loop in outer] == tile_sizes
        assert outer[0].parallel
        parallel = expected[0]
        last = {"m": 95, "n": 79}[parallel]
        assert f"c0 <= INT64_C({last})" in kernel.c_source(sizes)
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-5)


def test_a_loop_order_naming_no_index_is_an_error():
    with pytest.raises(polyc.PolycError, match=r"loop_order names 'q': no index of mm \(the indices: m, n, r_k\)"):
        polyc.define(MATMUL, loop_order=("m", "q"))
    for bad in (("m", "m"), "mn", (), (1, 2)):
        with pytest.raises(polyc.PolycError, match="loop_order must be None or distinct index names"):
            polyc.define(MATMUL, loop_order=bad)
