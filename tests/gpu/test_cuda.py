"""The CUDA dialect: every corpus kernel compiles with nvcc for sm_80 and sm_90 (no GPU needed),
with ptxas's resource report checked (no spills); launches need a GPU and skip without one."""

from __future__ import annotations

import numpy as np
import pytest
from kernels import CASES, FLOAT16_DEFS, KERNELS

import polyc
from polyc.errors import PolycError
from polyc.runtime.gpu import CUDA_ARCHITECTURES, cuda_missing, cuda_resources, find_nvcc


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """Builds (OpenCL programs of the benchmark test) go to a cache of this module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(tmp_path_factory.mktemp("cuda-test-cache")))
        yield


needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (the CUDA toolkit) is not installed")


@needs_nvcc
@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in KERNELS])
def test_corpus_kernel_compiles_for_ampere_and_hopper_without_spills(case):
    kernel = polyc.define(case.source)[case.entry]
    stages = kernel.gpu_stages(dict(case.size_sets[0]), "cuda")
    report = cuda_resources(stages.gpu_source.source)
    assert set(report) == set(CUDA_ARCHITECTURES)
    for arch, functions in report.items():
        assert set(functions) == {launch.name for launch in stages.gpu.launches}, arch
        for resources in functions.values():
            assert resources.spill_stores == resources.spill_loads == 0, (arch, resources)
            assert 0 < resources.registers <= 255


@needs_nvcc
def test_float16_defs_compile_as_half_for_ampere_and_hopper():
    module = polyc.define(FLOAT16_DEFS, device="sm_80")
    for name, sizes in (
        ("elementwise", dict(N=300)),
        ("matmul", dict(M=40, K=70, N=36)),
        ("softmax", dict(N=7, D=300)),
    ):
        source = module[name].gpu_source(sizes, "cuda")
        assert "__half" in source
        for functions in cuda_resources(source).values():
            assert all(r.spill_stores == r.spill_loads == 0 for r in functions.values())


def test_cuda_launches_match_numpy_where_a_gpu_exists():
    missing = cuda_missing()
    if missing is not None:
        pytest.skip(f"needs an NVIDIA GPU with pycuda: {missing}")
    case = CASES["matmul"]
    kernel = polyc.define(case.source, backend="cuda")[case.entry]
    a, b = np.ones((33, 17), np.float32), np.ones((17, 65), np.float32)
    np.testing.assert_allclose(kernel(a, b), a @ b)


def test_cuda_without_a_gpu_is_a_clear_error():
    if cuda_missing() is None:
        pytest.skip("a GPU is present")
    kernel = polyc.define(CASES["matmul"].source, backend="cuda").matmul
    with pytest.raises(PolycError, match="backend='cuda' needs"):
        kernel(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))


def test_occupancy_estimate_follows_the_sm80_limits():
    from benchmarks.gpu_bench import occupancy_sm80

    assert occupancy_sm80(32, 256, 0) == 1.0  # 8 blocks of 8 warps: all 64 warps
    assert occupancy_sm80(128, 256, 0) == 0.25  # 4096 registers per warp: 2 blocks of 8 warps
    assert occupancy_sm80(32, 256, 48 * 1024) == 0.375  # 3 blocks fit in 164 KiB of shared memory


@needs_nvcc
def test_gpu_benchmark_group_reports_static_figures_without_a_gpu():
    from benchmarks.gpu_bench import run_gpu_cases

    result = run_gpu_cases(1, ["batch_matmul"])
    (row,) = result["rows"]
    # with shared memory and the accumulator in a register: far fewer than 3 loads per FMA
    assert row["spills"] == 0 and row["registers"] > 0 and row["loads_per_fma"] < 0.3
