"""float16 reductions accumulate in float32 and round once (polyc.lang.float16_sums)."""

import numpy as np
import pytest

import polyc
from polyc.lang.float16_sums import accumulate_float16_in_float32
from polyc.lang.sema import check_source

MATMUL = "def mm(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


@pytest.mark.parametrize("backend", ["c", "interpreter"])
def test_a_long_float16_product_is_summed_in_float32_as_numpys_matmul(backend):
    # Rounded at every step, the sums stopped growing near 930 (exact: about 1000).
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 4000)).astype(np.float16), rng.random((4000, 2)).astype(np.float16)
    got = polyc.define(MATMUL, backend=backend).mm(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=1e-3)  # float16's own rounding
    np.testing.assert_allclose(got, a @ b, rtol=1e-3)  # numpy's order of summation differs: an ulp


def test_the_rewrite_keeps_min_max_and_continues_a_sum_without_bang():
    (definition,) = check_source("""def f(float16(N, K) A, float16(N) B) -> (S, M) {
        S(n) = B(n)
        S(n) += A(n, r_k) * 2
        M(n) max=! A(n, r_k)
    }""")
    rewritten = accumulate_float16_in_float32(definition)
    texts = [(s.target, s.op, s.init) for s in rewritten.statements]
    assert texts == [
        ("S", "=", False),
        ("S_sum32", "=", False),
        ("S_sum32", "+", False),
        ("S", "=", False),
        ("M", "max", True),
    ]
    assert rewritten.tensor("S_sum32").dtype == np.float32 and "S_sum32" in rewritten.temporaries
    assert [s.position for s in rewritten.statements] == list(range(5))
    assert rewritten.statements[2].rhs.dtype == np.float32  # the terms too, in float32
    assert (
        accumulate_float16_in_float32(check_source(MATMUL.replace("float16", "float"))[0]).statements
        == check_source(MATMUL.replace("float16", "float"))[0].statements
    )
    rng = np.random.default_rng(1)
    a, b = rng.random((3, 700)).astype(np.float16), rng.random(3).astype(np.float16)
    s, m = polyc.define(definition.source).f(a, b)
    np.testing.assert_array_equal(m, a.max(1))
    wide = (b.astype(np.float32) + (a.astype(np.float32) * 2).sum(1)).astype(np.float16)
    np.testing.assert_allclose(s, wide, rtol=1e-3)  # rounded every step, about 1000 terms of 1 were lost
