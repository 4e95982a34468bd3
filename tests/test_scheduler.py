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
    # Every vectorised loop that reads X runs along a row (the loops over the 16 rows alone
    # initialise S and V and compute M).
    simd_loops = re.findall(
        r"#pragma omp (?:parallel for )?simd[^\n]*\n\s*for \(int64_t c\d+ = INT64_C\(0\); "
        r"c\d+ <= INT64_C\((\d+)\)[^\n]*\n([^\n]*)",
        source,
    )
    bounds = {bound for bound, body in simd_loops if "X[" in body}
    assert bounds == {"95"}, simd_loops
    rng = np.random.default_rng(0)
    x, g, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, 16, 96), (96,), (96,)))
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(kernel(x, g, b), expected, rtol=1e-4, atol=1e-5)


# A depthwise 3x3 convolution with ReLU6 as the ONNX front end unrolls it, at batch 3: the bias,
# the interior without guards, the slabs along each edge with guards, the clip.
def _taps(region: str, guarded: bool) -> str:
    terms = []
    for i in range(3):
        for j in range(3):
            read = f"X(n, c, h + {i - 1}, w + {j - 1})"
            if guarded:
                read = (
                    f"((h + {i - 1} >= 0 && h + {i - 1} < 20 && w + {j - 1} >= 0 && w + {j - 1} < 20) ? {read} : 0.0)"
                )
            terms.append(f"W(c, {i}, {j}) * {read}")
    return f"    O(n, c, h, w) += {' + '.join(terms)} where n in 0:3, c in 0:8, {region}\n"


DEPTHWISE = (
    "def dw(float(3, 8, 20, 20) X, float(8, 3, 3) W, float(8) B) -> (O) {\n"
    "    O(n, c, h, w) = B(c) where n in 0:3, c in 0:8, h in 0:20, w in 0:20\n"
    + _taps("h in 1:19, w in 1:19", False)
    + "".join(
        _taps(region, True)
        for region in ("h in 0:1, w in 0:20", "h in 19:20, w in 0:20", "h in 1:19, w in 0:1", "h in 1:19, w in 19:20")
    )
    + "    O(i0, i1, i2, i3) = fmin(fmax(O(i0, i1, i2, i3), 0.0), 6.0)"
    " where i0 in 0:3, i1 in 0:8, i2 in 0:20, i3 in 0:20\n}"
)


def test_statements_sharing_two_outer_loops_run_inside_both():
    """Statements over regions of each (image, channel) plane, which isl schedules apart, are
    fused under both shared outer loops (polyc.schedule.outer_fusion), not under the image loop
    alone with each statement sweeping every channel: at batch 8 a mobilenet_v2 depthwise layer
    then works plane by plane in the caches."""
    kernel = polyc.define(DEPTHWISE, tuning=False).dw
    (top,) = [d for d in kernel.stages(None).decisions if d.depth == 0]
    assert len(top.statements) == 7 and top.members == 2 and top.coincident == (True, True), top
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((3, 8, 20, 20), (8, 3, 3), (8,)))
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    expected = b[None, :, None, None] + sum(
        w[None, :, i, j, None, None] * padded[:, :, i : i + 20, j : j + 20] for i in range(3) for j in range(3)
    )
    np.testing.assert_allclose(kernel(x, w, b), np.clip(expected, 0, 6), rtol=1e-5, atol=1e-5)


# The minimum of a whole tensor and a statement reading it, as DynamicQuantizeLinear's body
# (ReduceMin, then Min with 0) lowers: the second statement's one point sat at the reduction
# band's last iteration (a constant 3071 iterations on), so the band held a statement other than
# the reduction and its loop ran scalar.
FULL_MINIMUM = """
def low(float(1, 128, 3072) X) -> (L) {
    M(z0) min=! X(r0, r1, r2) where z0 in 0:1, r0 in 0:1, r1 in 0:128, r2 in 0:3072
    L(z0) = min(M(0), 0.0) where z0 in 0:1
}"""


def test_a_full_reduction_read_by_a_statement_after_it_is_vectorised():
    kernel = polyc.define(FULL_MINIMUM, tuning=False).low
    source = kernel.c_source()
    assert re.search(r"#pragma omp (?:parallel for )?simd reduction\(min:", source), source[-1500:]
    x = np.random.default_rng(1).standard_normal((1, 128, 3072)).astype(np.float32)
    x[0, 5, 7] = -40.0
    np.testing.assert_array_equal(kernel(x), [-40.0])
