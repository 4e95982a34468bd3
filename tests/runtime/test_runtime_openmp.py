"""Kernels built with the default options run OpenMP loops on several cores."""
from __future__ import annotations

import ctypes
import os
import time

import pytest

from polyc.runtime import get_function, get_or_build, load_library

# A reduction over independent, evenly costed iterations; num_threads is passed in so that an
# OMP_NUM_THREADS=1 in the environment cannot make the test meaningless.
PARALLEL_SOURCE = """\
#include <math.h>

double parallel_sum(long n, int threads)
{
    double total = 0.0;
    #pragma omp parallel for reduction(+:total) num_threads(threads) schedule(static)
    for (long i = 0; i < n; ++i)
        total += sin((double)i) * cos((double)i * 0.5);
    return total;
}
"""


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.mark.skipif(usable_cpus() < 2, reason="needs at least 2 CPUs to observe parallel speed-up")
def test_openmp_uses_several_cores():
    parallel_sum = get_function(
        load_library(get_or_build(PARALLEL_SOURCE)), "parallel_sum", [ctypes.c_long, ctypes.c_int], ctypes.c_double
    )
    threads = min(usable_cpus(), 4)
    parallel_sum(1000, threads)  # starts the thread pool outside the measurement

    # Grow the work until one call takes ~100 ms, so thread start-up and timer noise are small.
    n = 100_000
    while True:
        start = time.perf_counter()
        parallel_sum(n, threads)
        if time.perf_counter() - start > 0.1 or n > 10**9:
            break
        n *= 2

    ratios = []
    for _ in range(3):  # a busy machine can steal a core for a while; one clean run is enough
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        parallel_sum(n, threads)
        wall, cpu = time.perf_counter() - wall_start, time.process_time() - cpu_start
        ratios.append(cpu / wall)
        if ratios[-1] > 1.5:
            break
    assert max(ratios) > 1.5, f"process CPU time / wall time was only {ratios} with {threads} threads"
