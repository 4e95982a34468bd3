"""Register tiles of the generic path (polyc/schedule/register_tiling.py, the C in
polyc/codegen/c.py): a reduction's target kept in a local array across its reduction loops.

Each def is compiled on the generic path (every dedicated kernel off) with and without register
tiles; both must match numpy, and the tile must be in the C only where the model takes one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from sanitizers import ISA_FLAG_SETS, assert_clean, checked_lines, run_sanitized

import polyc
from polyc.schedule.register_tiling import choose_register_tile, vector_operations

TESTS_DIR = Path(__file__).resolve().parent
GENERIC = {"blas_contractions": False, "direct_convolutions": False, "transpose_kernels": False}

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
CONV_BIAS = """
def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
    O(n, f, h, w)  = O(n, f, h, w) + B(f)
}"""
BATCHED = "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, r_k) * Y(b, r_k, n) }"


def generic(source: str, **options):
    module = polyc.define(source, **{**GENERIC, **options})
    return module[module.names[0]]


def matmul_inputs(rng, m, k, n):
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def conv_reference(I, W1, B):
    from numpy.lib.stride_tricks import sliding_window_view

    kh, kw = W1.shape[2:]
    windows = sliding_window_view(I.astype(np.float64), (kh, kw), axis=(2, 3))
    return np.einsum("nchwxy,fcxy->nfhw", windows, W1.astype(np.float64)) + B[None, :, None, None]


def tolerance(reduction: int) -> float:
    """float32 sums of ``reduction`` products of unit normals: a few ulps per term."""
    return 4 * np.finfo(np.float32).eps * reduction


@pytest.mark.parametrize("m, k, n", [(64, 48, 96), (37, 19, 45), (128, 64, 7), (5, 3, 130)])
def test_matmul_tiles_match_numpy_and_are_in_the_c(m, k, n):
    rng = np.random.default_rng(m + k + n)
    A, B = matmul_inputs(rng, m, k, n)
    tiled, plain = generic(MATMUL), generic(MATMUL, register_tiles=())
    sizes = {"M": m, "K": k, "N": n}
    expected = A.astype(np.float64) @ B.astype(np.float64)
    for kernel in (tiled, plain):
        np.testing.assert_allclose(kernel(A, B), expected, rtol=0, atol=tolerance(k) * np.abs(expected).max())
    assert "polyc_tile_C[" in tiled.c_source(sizes)
    assert "polyc_tile_C[" not in plain.c_source(sizes)  # the control: off means off


def test_a_tile_cut_short_at_the_edge_gets_a_full_version_and_stays_exact():
    tiled = generic(MATMUL, register_tiles=(8, 32))
    sizes = {"M": 45, "K": 17, "N": 70}  # 45 = 5 x 8 + 5 rows, 70 = 2 x 32 + 6 columns
    source = tiled.c_source(sizes)
    assert "polyc: the loops above, for !(" in source  # the partial tiles' version
    rng = np.random.default_rng(1)
    A, B = matmul_inputs(rng, 45, 17, 70)
    plain = generic(MATMUL, register_tiles=())
    # The same order of additions per element: the results are the same bits.
    np.testing.assert_array_equal(tiled(A, B), plain(A, B))


def test_a_convolution_with_a_bias_keeps_its_output_block_across_channels_and_taps():
    rng = np.random.default_rng(2)
    I = rng.standard_normal((1, 64, 30, 30)).astype(np.float32)
    W1 = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    B = rng.standard_normal(64).astype(np.float32)
    kernel = generic(CONV_BIAS)
    sizes = {"N": 1, "C": 64, "H": 30, "W": 30, "F": 64, "KH": 3, "KW": 3}
    source = kernel.c_source(sizes)
    assert "polyc_tile_O[" in source
    # The bias statement reads and writes the block too: no access to O inside the reduction part
    # but the block's load and store.
    expected = conv_reference(I, W1, B)
    np.testing.assert_allclose(kernel(I, W1, B), expected, rtol=0, atol=tolerance(576) * np.abs(expected).max())


def test_batched_matmul_tiles_each_batch():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((3, 20, 16)).astype(np.float32)
    Y = rng.standard_normal((3, 16, 40)).astype(np.float32)
    kernel = generic(BATCHED)
    assert "polyc_tile_Z[" in kernel.c_source({"B": 3, "M": 20, "K": 16, "N": 40})
    np.testing.assert_array_equal(kernel(X, Y), generic(BATCHED, register_tiles=())(X, Y))
    np.testing.assert_allclose(kernel(X, Y), X.astype(np.float64) @ Y, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "source, sizes, why",
    [
        # y(m): the target's only index is the vector loop; there is no row index.
        ("def mv(float(M, K) A, float(K) x) -> (y) { y(m) +=! A(m, r_k) * x(r_k) }", {"M": 64, "K": 64}, "rows"),
        # Every operand moves with both output indices: no vector is reused along a row.
        (
            "def had(float(M, N, K) A, float(M, N, K) B) -> (C) { C(m, n) +=! A(m, n, r_k) * B(m, n, r_k) }",
            {"M": 16, "N": 32, "K": 8},
            "reuse",
        ),
        # B read across its rows along the columns: the dot product along r_k stays vectorised.
        (
            "def mmt(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
            {"M": 64, "N": 64, "K": 64},
            "transposed",
        ),
        # No reduction: nothing to keep across loops.
        ("def add(float(M, N) A, float(M, N) B) -> (C) { C(m, n) = A(m, n) + B(m, n) }", {"M": 64, "N": 64}, "sum"),
    ],
)
def test_defs_without_reuse_get_no_tile(source, sizes, why):
    kernel = generic(source)
    assert "polyc_tile_" not in kernel.c_source(sizes), why


def test_explain_names_the_register_tile_and_agrees_with_the_c():
    from polyc.viz import schedule_tree
    from tests.viz.test_explain_consistency import disagreements

    kernel = generic(MATMUL, register_tiles=(4, 16))
    for sizes in ({"M": 64, "K": 64, "N": 64}, {"M": 45, "K": 17, "N": 70}):
        explanation = kernel.explain(sizes)
        assert "a register tile: a block of 4 x 16 elements of C" in str(explanation)
        assert not disagreements(explanation, kernel.stages(sizes))
        assert "register:C:4x16" in schedule_tree(kernel, sizes).html()


def test_register_tiles_option_is_checked():
    with pytest.raises(polyc.PolycError, match="register_tiles"):
        polyc.define(MATMUL, register_tiles=(4,))
    with pytest.raises(polyc.PolycError, match="register_tiles"):
        polyc.define(MATMUL, register_tiles=(0, 16))


def test_the_model_sizes_tiles_by_the_vector_registers():
    # AVX-512 (16 floats a vector, 32 registers): two vectors of columns, 12 rows; AVX2 (8 floats,
    # 16 registers): two vectors, 6 rows.
    assert choose_register_tile(128, 128, 4, 512) == (12, 32)
    assert choose_register_tile(128, 128, 4, 256) == (6, 16)
    # A short vector loop is taken whole where that covers it in fewer operations than tiles.
    assert choose_register_tile(32, 28, 4, 512) == (8, 28)
    # Rows: a divisor of the row loop where one is near the most (every tile full).
    assert choose_register_tile(40, 128, 4, 512) == (10, 32)
    # Columns: tiles of one vector where two would leave a long partial tile (54 = 3 x 16 + 6).
    assert choose_register_tile(8, 54, 4, 512) == (8, 16)
    assert choose_register_tile(1, 128, 4, 512) is None  # one row: nothing to share a vector with
    assert vector_operations(28, 16, 4) == 3  # 16 + 8 + 4
    assert vector_operations(18, 16, 4) == 3  # 16 + two scalars


_SANITIZED_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_register_tiles import CONV_BIAS, MATMUL, generic
rng = np.random.default_rng(0)
for flags in sys.argv[2:]:
    cflags = tuple(flags.split())
    for tiles in [None, (8, 32), (3, 5)]:
        A = rng.standard_normal((45, 17)).astype(np.float32)
        B = rng.standard_normal((17, 70)).astype(np.float32)
        got = generic(MATMUL, cflags=cflags, register_tiles=tiles)(A, B)
        if not np.allclose(got, A.astype(np.float64) @ B, atol=1e-3):
            raise SystemExit(f"wrong matmul: {tiles} {flags}")
    I = rng.standard_normal((1, 5, 9, 19)).astype(np.float32)
    W1 = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    got = generic(CONV_BIAS, cflags=cflags)(I, W1, bias)
    want = generic(CONV_BIAS, cflags=cflags, register_tiles=())(I, W1, bias)
    if not np.allclose(got, want, atol=1e-4):
        raise SystemExit(f"wrong convolution: {flags}")
    print("checked", flags.split()[-1], flush=True)
"""


def test_register_tiles_run_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    result = run_sanitized(
        _SANITIZED_SCRIPT, str(TESTS_DIR), *ISA_FLAG_SETS, cache_dir=tmp_path / "cache", build_first=True
    )
    assert_clean(result)
    assert result.stdout.split() == checked_lines(ISA_FLAG_SETS)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
