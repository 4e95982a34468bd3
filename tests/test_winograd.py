"""The Winograd F(2x2, 3x3) convolution kernel (polyc/codegen/winograd.py): which convolutions
take it, and its results against numpy within the direct kernel's tolerance (TC's rule, the
reduction's length as the operation count), on AVX-512, AVX2 and portable builds."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from builds import builds
from kernels import assert_close
from sanitizers import python_environment
from test_conv import _nhwc_reference, _padded, padded_conv, rand

import polyc

BUILDS = builds("native", "avx2", "portable")

#: (N, H, W, C, F, pads (top, left, bottom, right)): resnet's same-size padding; odd output
#: sizes (a last row and column of tiles half outside); no padding; padding on two sides only
#: (a window offset, and a box bounded on one side); output channels that are not a whole
#: register block (48 and 16 of AVX-512's 64); a batch whose tiles run across images.
GEOMETRIES = [
    (1, 12, 12, 64, 64, (1, 1, 1, 1)),
    (2, 9, 11, 16, 48, (1, 1, 1, 1)),
    (1, 14, 17, 32, 16, (0, 0, 0, 0)),
    (3, 8, 7, 16, 80, (1, 0, 0, 1)),
]


def uses_winograd(kernel) -> bool:
    return "Winograd F(2x2, 3x3)" in kernel.c_source({})


@BUILDS
def test_winograd_against_numpy(cflags):
    rng = np.random.default_rng(5)
    for n, h, w, c, f, pads in GEOMETRIES:
        for relu in (True, False):
            source, _ = padded_conv(n, h, w, c, f, (3, 3), (1, 1), (1, 1), pads, relu=relu)
            compiled = polyc.define(source, cflags=cflags, winograd=True).conv
            assert uses_winograd(compiled), (n, h, w, c, f, pads)
            image, weights, bias = rand(rng, (n, h, w, c)), rand(rng, (3, 3, c, f)), rand(rng, (f,))
            want = _nhwc_reference(_padded(image, pads), weights.transpose(3, 2, 0, 1)) + bias
            want = np.maximum(want, 0) if relu else want
            assert_close(compiled(image, weights, bias), want, 9 * c + 1, np.float32, (image, weights, bias))


@BUILDS
def test_winograd_accumulates_and_runs_epilogues_it_cannot_vectorise(cflags):
    """``+=`` into given outputs, and a sigmoid and a residual after the sum (the epilogue
    then runs on each work item's finished outputs)."""
    n, h, w, c, f = 2, 10, 9, 32, 32
    source = f"""def conv(float({n}, {h}, {w}, {c}) I, float(3, 3, {c}, {f}) W1, float({n}, {h}, {w}, {f}) R) -> (O) {{
    O(n, y, x, f) += (y + r_kh >= 1 && y + r_kh < {h + 1} && x + r_kw >= 1 && x + r_kw < {w + 1}) ? I(n, y + r_kh - 1, x + r_kw - 1, r_c) * W1(r_kh, r_kw, r_c, f) : 0 where y in 0:{h}, x in 0:{w}, r_kh in 0:3, r_kw in 0:3
    O(n, y, x, f) = R(n, y, x, f) / (1 + exp(-O(n, y, x, f)))
}}"""
    compiled = polyc.define(source, cflags=cflags, winograd=True).conv
    assert uses_winograd(compiled)
    rng = np.random.default_rng(6)
    image, weights, residual = rand(rng, (n, h, w, c)), rand(rng, (3, 3, c, f)), rand(rng, (n, h, w, f))
    start = rand(rng, (n, h, w, f))
    sums = start + _nhwc_reference(_padded(image, (1, 1, 1, 1)), weights.transpose(3, 2, 0, 1))
    want = residual / (1 + np.exp(-sums))
    out = start.copy()
    assert compiled(image, weights, residual, outputs=[out]) is out
    assert_close(out, want, 9 * c + 10, np.float32, (image, weights, residual, start))


def test_other_convolutions_keep_the_direct_kernel():
    """Off by default; with it on, strides, other kernel sizes, channels not multiples of 16,
    float64 and too few tiles keep the direct kernel."""

    def kernel(n, h, w, c, f, kernel=(3, 3), stride=(1, 1), dtype="float", **options):
        source, _ = padded_conv(n, h, w, c, f, kernel, stride, (1, 1), (1, 1, 1, 1))
        return polyc.define(source.replace("float", dtype), **options).conv

    assert not uses_winograd(kernel(1, 16, 16, 16, 16))
    assert uses_winograd(kernel(1, 16, 16, 16, 16, winograd=True))
    assert "Winograd" in str(kernel(1, 16, 16, 16, 16, winograd=True).explain({}))
    direct = str(kernel(1, 16, 16, 16, 16).explain({}))
    assert "direct_convolution path" in direct and "Winograd F(2x2, 3x3) kernel computes it" not in direct
    assert "why direct, not Winograd: the option winograd is off" in direct
    assert not uses_winograd(kernel(1, 16, 16, 16, 16, stride=(2, 2), winograd=True))
    assert not uses_winograd(kernel(1, 16, 16, 16, 16, kernel=(5, 5), winograd=True))
    assert not uses_winograd(kernel(1, 16, 16, 20, 16, winograd=True))
    assert not uses_winograd(kernel(1, 16, 16, 16, 16, dtype="double", winograd=True))
    assert not uses_winograd(kernel(1, 8, 8, 16, 16, winograd=True))  # 16 tiles
    with pytest.raises(polyc.PolycError, match="winograd must be True or False"):
        polyc.define("def f(float(N) A) -> (B) { B(i) = A(i) }", winograd=1)


_TEAM_SCRIPT = """
import numpy as np
import polyc
from kernels import assert_close
from test_conv import _nhwc_reference, _padded, padded_conv, rand
source, _ = padded_conv(1, 16, 16, 16, 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), relu=False)
kernel = polyc.define(source, winograd=True).conv
rng = np.random.default_rng(0)
image, weights, bias = rand(rng, (1, 16, 16, 16)), rand(rng, (3, 3, 16, 32)), rand(rng, (32,))
want = _nhwc_reference(_padded(image, (1, 1, 1, 1)), weights.transpose(3, 2, 0, 1)) + bias
assert_close(kernel(image, weights, bias), want, 9 * 16 + 1, np.float32, (image, weights, bias))
print("ok")
"""


def test_winograd_shares_its_work_among_the_threads_openmp_gives(tmp_path):
    """Under a thread limit OpenMP runs a smaller team than the thread policy asked for; every
    work item still runs (a share by the threads asked for left half the outputs unwritten)."""
    result = subprocess.run(
        [sys.executable, "-c", _TEAM_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env=python_environment(OMP_THREAD_LIMIT="1", OMP_NUM_THREADS="2", POLYC_CACHE_DIR=str(tmp_path)),
    )
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stdout + result.stderr[-3000:]
