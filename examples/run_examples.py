"""The main job: compile the example kernels, run them, check them and time them against numpy.

    python examples/run_examples.py [--repeat N] [--keep-blas-env]

Each kernel is compiled by polyc to C/OpenMP (cached after the first run), checked against a
numpy computation of the same thing, and timed: median of N runs for polyc and for numpy, in
the same process, printed as a table with the ratio (above 1: polyc is faster).

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which make a current numpy pick a slower BLAS kernel
(some machines set them for older OpenBLAS builds), are cleared for this process before numpy
is imported, as ``python -m benchmarks`` does, so that numpy is timed at its best; the table
says so.  ``--keep-blas-env`` leaves them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CLEARED = {}
if __name__ == "__main__" and "--keep-blas-env" not in sys.argv[1:]:  # before numpy is imported
    CLEARED = {name: os.environ.pop(name) for name in BLAS_VARIABLES if name in os.environ}

import numpy as np  # noqa: E402

import polyc  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent

SOFTMAX = """
def softmax(float(N, D) X) -> (O) {
    M(n) max=! X(n, r_d)
    O(n, d) = exp(X(n, d) - M(n))
    S(n) +=! O(n, r_d)
    O(n, d) = O(n, d) / S(n)
}
"""


def median_seconds(function, repeat: int) -> float:
    # Idle OpenBLAS (numpy) and OpenMP (polyc) threads spin for a while after a call and would
    # take the cores from the other's threads: let them go to sleep first.
    time.sleep(0.3)
    function()  # warm up (and compile, for polyc)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def numpy_conv2d(image, weights, bias):
    n, c, h, w = image.shape
    f, _, kh, kw = weights.shape
    windows = np.lib.stride_tricks.sliding_window_view(image, (kh, kw), axis=(2, 3))
    return np.einsum("nchwij,fcij->nfhw", windows, weights, optimize=True) + bias[None, :, None, None]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=10, help="timed runs per kernel (default 10)")
    parser.add_argument(
        "--keep-blas-env", action="store_true", help="keep OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (cleared by default)"
    )
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)

    matmul = polyc.define((EXAMPLES / "matmul.tc").read_text(), filename="matmul.tc")
    conv = polyc.define((EXAMPLES / "conv.tc").read_text(), filename="conv.tc")
    softmax = polyc.define(SOFTMAX)

    a = rng.standard_normal((512, 512), dtype=np.float32)
    b = rng.standard_normal((512, 512), dtype=np.float32)
    bias = rng.standard_normal(512, dtype=np.float32)
    image = rng.standard_normal((8, 16, 34, 34), dtype=np.float32)
    weights = rng.standard_normal((32, 16, 3, 3), dtype=np.float32)
    conv_bias = rng.standard_normal(32, dtype=np.float32)
    x = rng.standard_normal((1024, 1024), dtype=np.float32)
    e1 = rng.standard_normal((64, 128), dtype=np.float32)
    e2 = rng.standard_normal((128, 32), dtype=np.float32)
    e3 = rng.standard_normal((32, 96), dtype=np.float32)

    cases = [
        ("matmul 512", lambda: matmul.matmul(a, b), lambda: a @ b, 512),
        ("matmul+bias+relu 512", lambda: matmul.matmul_bias_relu(a, b, bias), lambda: np.maximum(a @ b + bias, 0), 512),
        (
            "conv2d 3x3 8x16x34x34",
            lambda: conv.conv2d(image, weights, conv_bias),
            lambda: numpy_conv2d(image, weights, conv_bias),
            16 * 9,
        ),
        ("softmax 1024x1024", lambda: softmax.softmax(x), lambda: numpy_softmax(x), 1024),
        (
            "einsum ij,jk,kl->il",
            lambda: polyc.einsum("ij,jk,kl->il", e1, e2, e3),
            lambda: np.einsum("ij,jk,kl->il", e1, e2, e3, optimize=True),
            128 * 32,
        ),
    ]
    print(
        f"polyc {polyc.__version__}: compiling and running {len(cases)} example kernels (median of {args.repeat} runs)"
    )
    if CLEARED:
        settings = ", ".join(f"{name}={value}" for name, value in CLEARED.items())
        print(f"numpy timed without {settings} (they select a slower OpenBLAS kernel; --keep-blas-env keeps them)")
    print(f"{'kernel':<24} {'polyc ms':>10} {'numpy ms':>10} {'speed vs numpy':>15}  check")
    failures = 0
    for name, run_polyc, run_numpy, ops in cases:
        got = np.asarray(run_polyc())
        want = np.asarray(run_numpy())
        tolerance = ops * np.finfo(np.float32).eps * max(1.0, float(np.abs(want).max()))
        error = float(np.abs(got - want).max())
        ok = got.shape == want.shape and error <= tolerance
        failures += not ok
        polyc_time = median_seconds(run_polyc, args.repeat)
        numpy_time = median_seconds(run_numpy, args.repeat)
        print(
            f"{name:<24} {polyc_time * 1e3:>10.3f} {numpy_time * 1e3:>10.3f} "
            f"{numpy_time / polyc_time:>14.2f}x  {'ok' if ok else f'MISMATCH (error {error:.3g})'}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
