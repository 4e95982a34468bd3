"""isl's scheduler as polyc configures it (:mod:`polyc.schedule.scheduler`)."""
from __future__ import annotations

import re

import numpy as np

import polyc

# A layer norm as the ONNX front end writes it: literal sizes, a leading dimension of one.
LAYER_NORM = """
def norm(float(1, 16, 96) X, float(96) G, float(96) B) -> (Y) {
    S(i0, i1) +=! X(i0, i1, r2)
    M(i0, i1) = S(i0, i1) / 96
    V(i0, i1) +=! (X(i0, i1, r2) - M(i0, i1)) * (X(i0, i1, r2) - M(i0, i1))
    Y(i0, i1, i2) = (X(i0, i1, i2) - M(i0, i1)) / sqrt(V(i0, i1) / 96 + 1e-5) * G(i2) + B(i2)
}"""


def test_no_statement_is_shifted_by_most_of_a_loop():
    # With literal sizes isl could fuse the variance pass after the mean pass by shifting it
    # 95 iterations along the row: one fused loop over both, vectorised across rows (a gather
    # per element; 6x slower at 128 x 768).  Each pass now runs along its row.
    kernel = polyc.define(LAYER_NORM, tuning=False).norm
    source = kernel.c_source()
    assert "- INT64_C(95)" not in source and "+ INT64_C(95)" not in source
    simd_bounds = re.findall(r"#pragma omp simd[^\n]*\n\s*for \(int64_t c\d+ = INT64_C\(0\); c\d+ <= INT64_C\((\d+)\)", source)
    assert simd_bounds and set(simd_bounds) == {"95"}, simd_bounds
    rng = np.random.default_rng(0)
    x, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 16, 96), (96,), (96,)))
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(kernel(x, g, b), expected, rtol=1e-4, atol=1e-5)
