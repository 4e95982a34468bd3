"""The block options of the kernel paths (``loop_tiles``, ``gemm_blocks``, ``conv_block``,
``gpu_tiles``): each read by its own path, refused on another, and the deprecated ``tile_sizes``
read as the option of the path a def compiles on."""

import warnings

import numpy as np
import pytest

import polyc
from polyc.options import BLOCK_OPTIONS
from polyc.paths import KERNEL_PATHS

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
ROW_SUM = "def row_sum(float(M, N) A) -> (S) { S(m) +=! A(m, r_n) }"
CONV = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) Wt) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * Wt(f, r_c, r_kh, r_kw)
}"""
SIZES = dict(M=48, K=32, N=40)
CONV_SIZES = dict(N=1, C=8, H=10, W=10, F=16, KH=3, KW=3)


def test_every_block_option_is_read_by_some_path():
    read = {name for path in KERNEL_PATHS for name in path.options}
    assert set(BLOCK_OPTIONS) <= read
    assert "tile_sizes" not in read  # the alias is no path's option: each path says what it means


def test_each_path_reads_its_block_option():
    generic = polyc.define(MATMUL, blas_contractions=False, loop_tiles=(8, 4, 2)).mm
    assert generic.stages(SIZES).path == "generic"
    assert any(d.tile_sizes == (8, 4, 2) for d in generic.stages(SIZES).decisions)
    gemm = polyc.define(MATMUL, gemm_blocks=(24, 64, 16), tuning=False).mm
    assert gemm.stages(SIZES).path == "gemm"
    assert gemm.c_source(SIZES) != polyc.define(MATMUL, tuning=False).mm.c_source(SIZES)
    conv = polyc.define(CONV, conv_block=8, tuning=False).conv
    assert conv.stages(CONV_SIZES).path == "direct_convolution"
    assert conv.c_source(CONV_SIZES) != polyc.define(CONV, tuning=False).conv.c_source(CONV_SIZES)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((48, 32), np.float32), rng.standard_normal((32, 40), np.float32)
    for kernel in (generic, gemm):
        np.testing.assert_allclose(kernel(a, b), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "source, sizes, given, path, takes",
    [
        (MATMUL, SIZES, dict(gpu_tiles=(32, 32)), "gemm", "gemm_blocks"),
        (MATMUL, SIZES, dict(gemm_blocks=(24, 64, 16), blas_contractions=False), "generic", "loop_tiles"),
        (MATMUL, SIZES, dict(loop_tiles=(8, 8)), "gemm", "gemm_blocks"),
        (ROW_SUM, dict(M=8, N=8), dict(conv_block=4), "generic", "loop_tiles"),
    ],
)
def test_a_block_option_of_another_path_is_a_clear_error(source, sizes, given, path, takes):
    kernel = getattr(polyc.define(source, **given), source.split()[1].split("(")[0])
    name = next(n for n in given if n in BLOCK_OPTIONS)
    with pytest.raises(polyc.PolycError, match=rf"{name} sets .*compiles on the {path} path, which takes {takes}"):
        kernel.c_source(sizes)


def test_block_options_are_checked_when_given():
    for bad, message in (
        (dict(gemm_blocks=(24, 64)), "three positive integers"),
        (dict(conv_block=0), "conv_block must be a positive integer"),
        (dict(loop_tiles=(4, -1)), "loop_tiles must be positive integers"),
        (dict(loop_tiles=(32,), backend="opencl"), "it takes gpu_tiles"),
    ):
        with pytest.raises(polyc.PolycError, match=message):
            polyc.define(MATMUL, **bad)


@pytest.mark.parametrize(
    "source, sizes, tile_sizes, became",
    [
        (MATMUL, SIZES, (24, 64, 16), dict(gemm_blocks=(24, 64, 16))),
        (MATMUL, SIZES, (8, 4), {}),  # fewer than three sizes never sized the gemm kernel's blocks
        (ROW_SUM, dict(M=8, N=8), (4, 2), dict(loop_tiles=(4, 2))),
        (CONV, CONV_SIZES, (8, 1), dict(conv_block=8)),
    ],
)
def test_tile_sizes_is_a_deprecated_alias_that_says_what_it_became(source, sizes, tile_sizes, became):
    name = source.split()[1].split("(")[0]
    with pytest.warns(DeprecationWarning, match="tile_sizes is deprecated: on the .* path") as caught:
        old = getattr(polyc.define(source, tile_sizes=tile_sizes, tuning=False), name).c_source(sizes)
    for option, value in became.items():
        assert f"{option}={value!r}" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = getattr(polyc.define(source, tuning=False, **became), name).c_source(sizes)
    assert old == new
