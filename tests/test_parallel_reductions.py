"""Reductions to small targets run as OpenMP reduction loops, and stay correct.

The float sums are checked by the differential fuzzer's rule (``sum_bound``).  On random inputs
in [0, 1) that rule (and any honest bound for a float32 sum of 10^5 terms in an unknown order)
is hundreds of units wide, wide enough to hide a lost thread's partial sum.  So the inputs are
multiples of 1/64 in [1/64, 1]: every partial sum is then a float32 exactly, the rule's bound
is 0 in any summation order, and dropping or repeating any single term is an error of at least
1/64.  The sizes are not multiples of any vector width, so the remainder loops run too.
"""

import numpy as np
import pytest
from test_differential_fuzz import sum_bound

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
    assert "#pragma omp parallel for reduction(polyc_sum_float32:polyc_acc_S_total)" in source
    assert "#pragma omp simd reduction(polyc_sum_float32:polyc_acc_S)" in source
    a = grid_values(np.random.default_rng(0), 100_003)
    assert_sum_within_bound(module.total(a), a)


def grid_values(rng: np.random.Generator, shape) -> np.ndarray:
    """float32 multiples of 1/64 in [1/64, 1]: every sum of them below 2^18 is exact in float32."""
    return (rng.integers(1, 65, shape) / 64).astype(np.float32)


def assert_sum_within_bound(result, terms: np.ndarray) -> None:
    expected = sum_bound(terms, terms.dtype)
    assert float(expected.error) == 0.0, "the inputs must keep the sum exact (see the module docstring)"
    assert float(result) == float(expected.value), f"sum {float(result)!r}, exactly {float(expected.value)!r}"


def test_a_sum_that_drops_its_last_term_is_caught():
    # Negative control: the mistake of a remainder loop that stops one element early.
    a = grid_values(np.random.default_rng(0), 100_003)
    with pytest.raises(AssertionError, match="exactly"):
        assert_sum_within_bound(a[:-1].sum(dtype=np.float32), a)


def test_double_dot(module):
    rng = np.random.default_rng(1)
    a, b = rng.random(12345), rng.random(12345)
    assert "omp parallel for reduction(polyc_sum_float64:polyc_acc_S_total)" in module.dot.c_source({"N": 12345})
    np.testing.assert_allclose(module.dot(a, b), a @ b, rtol=1e-12)


def test_integer_sum_and_max_are_exact(module):
    a = np.random.default_rng(2).integers(-1000, 1000, 50_001).astype(np.int32)
    source = module.int_stats.c_source({"N": 50_001})
    assert "reduction(max:M[0:1])" in source and "reduction(+:S[0:1])" in source
    total, largest = module.int_stats(a)
    assert int(total) == int(a.sum()) and int(largest) == int(a.max())


def test_float_max_reduces_in_lanes_that_never_hold_a_nan(module):
    # OpenMP's max is not fmax where a NaN is involved: polyc's lanes start from -inf and keep
    # their value against a NaN (polyc_lane_maxf), so OpenMP's max only ever combines numbers,
    # and the element loaded before the loop joins through fmax (c._reduces_in_lanes).
    source = module.float_max.c_source({"N": 100})
    assert "omp parallel for reduction" not in source
    assert "omp simd reduction(max:polyc_acc_M)" in source and "polyc_lane_maxf(polyc_acc_M" in source
    reference = polyc.define(SOURCE, backend="interpreter").float_max
    nan, inf = np.nan, np.inf
    for values in (
        [1.0, nan, 3.0] * 11,
        [nan] * 33,
        [nan] + [-inf] * 40,
        [-inf] * 40 + [nan],
        [nan, -5.0] + [nan] * 30,
    ):
        a = np.array(values, dtype=np.float32)
        np.testing.assert_array_equal(module.float_max(a), reference(a), err_msg=str(values))
    assert float(module.float_max(np.array([1.0, nan, 3.0] * 11, dtype=np.float32))) == 3.0


def test_two_dimensional_total(module):
    a = grid_values(np.random.default_rng(3), (301, 203))
    assert_sum_within_bound(module.sum2d(a), a)


def test_no_reduction_clause_without_parallel(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    kernel = polyc.define(SOURCE, parallel=False).total
    assert "omp parallel" not in kernel.c_source({"N": 1000})
