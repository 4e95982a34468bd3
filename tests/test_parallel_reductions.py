"""Reductions to small targets run as OpenMP reduction loops, and stay correct."""
import numpy as np
import pytest

import polyc

SOURCE = """
def total(float(N) A) -> (S) { S +=! A(r_i) }
def dot(double(N) A, double(N) B) -> (S) { S +=! A(r_i) * B(r_i) }
def int_stats(int32(N) A) -> (S, M) {
    S +=! A(r_i)
    M max=! A(r_i)
}
def float_max(float(N) A) -> (M) { M max=! A(r_i) }
def sum2d(float(N, K) A) -> (S) { S +=! A(r_i, r_k) }
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield polyc.define(SOURCE)


def test_sum_is_a_parallel_reduction(module):
    # A float sum over blocks: threads share the blocks, each block is a vectorised sum from zero.
    source = module.total.c_source({"N": 1000})
    assert "#pragma omp parallel for reduction(+:polyc_acc_S_total)" in source
    assert "#pragma omp simd reduction(+:polyc_acc_S)" in source
    a = np.random.default_rng(0).random(100_000, dtype=np.float32)
    assert abs(float(module.total(a)) - a.sum(dtype=np.float64)) <= 100_000 * np.finfo(np.float32).eps * a.sum()


def test_double_dot(module):
    rng = np.random.default_rng(1)
    a, b = rng.random(12345), rng.random(12345)
    assert "omp parallel for reduction(+:polyc_acc_S_total)" in module.dot.c_source({"N": 12345})
    np.testing.assert_allclose(module.dot(a, b), a @ b, rtol=1e-12)


def test_integer_sum_and_max_are_exact(module):
    a = np.random.default_rng(2).integers(-1000, 1000, 50_001).astype(np.int32)
    source = module.int_stats.c_source({"N": 50_001})
    assert "reduction(max:M[0:1])" in source and "reduction(+:S[0:1])" in source
    total, largest = module.int_stats(a)
    assert int(total) == int(a.sum()) and int(largest) == int(a.max())


def test_float_max_is_not_openmps_max_for_nan_semantics(module):
    # OpenMP's max is not fmax: with NaNs the results could differ, so polyc does not use it.
    # The loop is vectorised with a reduction of polyc's own, which is fmax.
    source = module.float_max.c_source({"N": 100})
    assert "reduction(max:" not in source and "omp parallel for reduction" not in source
    assert "omp simd reduction(polyc_fmax_float:" in source
    a = np.array([1.0, np.nan, 3.0] * 11, dtype=np.float32)
    assert float(module.float_max(a)) == 3.0


def test_two_dimensional_total(module):
    a = np.random.default_rng(3).random((300, 200), dtype=np.float32)
    np.testing.assert_allclose(module.sum2d(a), a.sum(dtype=np.float64), rtol=1e-4)


def test_no_reduction_clause_without_parallel(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    kernel = polyc.define(SOURCE, parallel=False).total
    assert "omp parallel" not in kernel.c_source({"N": 1000})
