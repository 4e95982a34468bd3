"""Measure float64 ``polyc_log1p``'s largest error: ``python -m tests.measure_log1p [RUNS]``.

Each run samples the test's inputs (tests/test_vector_math.py) plus a million each around
x = -0.3 (where log1p(x) and e ln2 nearly cancel), over (-1, 3) and over +-10^-18..10^-8,
compiled with and without FMA contraction, against long double; the eight worst of each run
are rechecked against a 200-bit reference.  Needs mpmath (not a test dependency).
"""

from __future__ import annotations

import sys

import mpmath
import numpy as np

from polyc.runtime import CompilerOptions, get_or_build, load_library
from tests import test_vector_math as vm

WITH_FMA = CompilerOptions(extra_flags=("-ffp-contract=fast", "-march=native"), openmp=False)


def exact_error(x: float, result: float) -> float:
    """|result - log1p(x)| in ulp of log1p(x), from a 200-bit log1p."""
    with mpmath.workprec(200):
        exact = mpmath.log1p(mpmath.mpf(x))
        ulp = mpmath.mpf(2) ** (mpmath.floor(mpmath.log(abs(exact), 2)) - 52)
        return float(abs(mpmath.mpf(result) - exact) / ulp)


def main(runs: int) -> None:
    builds = {"no FMA": vm.OPTIONS, "FMA": WITH_FMA}
    worst = (0.0, None)
    for label, options in builds.items():
        library = load_library(get_or_build(vm._harness(vm.FUNCTIONS), options))
        for seed in range(runs):
            rng = np.random.default_rng(100 + seed)
            x = np.concatenate(
                [
                    vm.sample_inputs("log1p", vm.FLOAT64, 1_000_000, seed=seed),
                    rng.uniform(-0.35, -0.25, 1_000_000),
                    rng.uniform(-0.999, 3, 1_000_000),
                    rng.uniform(-1, 1, 1_000_000) * 10.0 ** rng.uniform(-18, -8, 1_000_000),
                ]
            )
            result = vm.apply(library, "log1p", x)
            errors = vm.ulp_errors(result, vm._reference("log1p", x))
            rechecked = max(
                (exact_error(float(x[i]), float(result[i])), float(x[i]))
                for i in np.argsort(errors)[-8:]
                if np.isfinite(x[i])
            )
            print(
                f"{label}, run {seed}: long double {errors.max():.4f} ulp, 200-bit {rechecked[0]:.4f} ulp "
                f"at x = {rechecked[1]!r}",
                flush=True,
            )
            worst = max(worst, rechecked)
    print(f"largest: {worst[0]:.4f} ulp at x = {worst[1]!r}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
