"""Run polyc's OpenCL kernels for tests/gpu/test_oclgrind.py, under oclgrind (a subprocess:
oclgrind replaces the OpenCL library with its simulator through LD_PRELOAD).

    python oclgrind_runner.py case NAME       a corpus kernel at its first size set, checked against numpy
    python oclgrind_runner.py block-rows NAME the same with a block per row (tree reductions, barriers)
    python oclgrind_runner.py unmodified      the controls' baseline: matmul as generated, same harness
    python oclgrind_runner.py racy            negative control: matmul with its reduction loop across threads
    python oclgrind_runner.py out-of-bounds   negative control: matmul reading one row past A
    python oclgrind_runner.py no-barrier      negative control: shared-memory matmul without its barriers
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import CASES, check_kernel  # noqa: E402

import polyc  # noqa: E402
from polyc.codegen.gpu import generate_gpu  # noqa: E402
from polyc.runtime.gpu import OpenCLRuntime  # noqa: E402
from polyc.schedule.gpu_mapping import GpuPlan, MappingOptions, _launch, _mapped_loops  # noqa: E402

MATMUL_SIZES = dict(M=4, K=40, N=5)  # K > 32: two slices of the shared-memory tiles


def run_case(name: str) -> None:
    case = CASES[name]
    kernel = polyc.define(case.source, backend="opencl")[case.entry]
    check_kernel(case, kernel, case.size_sets[0], seed=0)


def run_block_rows(name: str) -> None:
    """A corpus kernel with a block per row (sm_80's model) at sizes long enough for it."""
    case = CASES[name]
    kernel = polyc.define(case.source, backend="opencl", device="sm_80")[case.entry]
    sizes = {size: (value if value <= 2 else max(value, 70)) for size, value in case.size_sets[0].items()}
    first = next(iter(sizes))  # few rows: oclgrind runs every work-item of every block
    sizes[first] = min(sizes[first], 3)
    assert any(launch.reduction is not None for launch in kernel.gpu_stages(sizes).gpu.launches)
    check_kernel(case, kernel, sizes, seed=0)


def run_matmul_source(source_of) -> np.ndarray:
    """Run matmul's OpenCL code as ``source_of(stages)`` gives it (launches as generated) on random
    inputs of the shapes it was built for; return C."""
    kernel = polyc.define(CASES["matmul"].source, backend="opencl").matmul
    stages = kernel.gpu_stages(MATMUL_SIZES)
    code = source_of(stages)
    rng = np.random.default_rng(0)
    m, k, n = MATMUL_SIZES["M"], MATMUL_SIZES["K"], MATMUL_SIZES["N"]
    arrays = {
        "A": rng.uniform(-1, 1, (m, k)).astype(np.float32),
        "B": rng.uniform(-1, 1, (k, n)).astype(np.float32),
        "C": np.zeros((m, n), np.float32),
    }
    OpenCLRuntime.shared().run(code, arrays, ("C",))
    return arrays


def unmodified(stages):
    """The baseline of the controls: the same harness, polyc's code as generated."""
    return stages.gpu_source


def racy(stages):
    """The reduction member r_k given to the threads: the proofs refuse it, oclgrind sees the race."""
    (launch,) = stages.gpu.launches
    band = stages.optimized_schedule.get_root().child(0)
    loops = _mapped_loops(stages.program, band, launch.domain, [2], MappingOptions(block=(8,)))
    bad = _launch(launch.name, stages.program, launch.schedule, launch.domain, loops, "negative control: racy")
    return generate_gpu(stages.program, GpuPlan("matmul", (bad,)), stages.options, "opencl")


def out_of_bounds(stages):
    """The first read of A one row further down: the last row's threads read past the buffer."""
    code = stages.gpu_source
    start = code.source.index("__kernel")
    read = re.compile(r"(?<!\w)A\[").search(code.source, code.source.index("{", start))
    source = code.source[: read.end()] + "A_extent1 + " + code.source[read.end() :]
    return type(code)(code.dialect, source, code.launches, code.tensor_arguments)


def without_barriers(stages):
    """The shared-memory matmul with its barriers deleted: copies race with reads."""
    code = stages.gpu_source
    source = code.source.replace("barrier(CLK_LOCAL_MEM_FENCE);", ";")
    assert source != code.source
    return type(code)(code.dialect, source, code.launches, code.tensor_arguments)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "case":
        run_case(sys.argv[2])
    elif mode == "block-rows":
        run_block_rows(sys.argv[2])
    elif mode == "unmodified":
        arrays = run_matmul_source(unmodified)
        np.testing.assert_allclose(arrays["C"], arrays["A"] @ arrays["B"], rtol=1e-5, atol=1e-5)
    elif mode == "racy":
        run_matmul_source(racy)
    elif mode == "out-of-bounds":
        run_matmul_source(out_of_bounds)
    elif mode == "no-barrier":
        run_matmul_source(without_barriers)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print("done")
