"""The "gpu" group: polyc's GPU back ends on real-sized kernels.

Where an NVIDIA GPU and pycuda are present, each kernel runs through ``backend="cuda"`` beside
cupy or torch (whichever is installed: cuBLAS and cuDNN behind them), medians of repeated runs.
Without a GPU (these development machines) the group says so and prints each kernel's static
figures instead, from nvcc's ptxas report for sm_80 (Ampere) and polyc's mapping:

- registers per thread and shared memory per block, spills;
- estimated occupancy on sm_80: resident warps per SM over the 64 possible, limited by registers
  (65536 per SM, allocated per warp in units of 256), threads (2048 per SM), blocks (32 per SM)
  and shared memory (164 KiB per SM);
- global loads per FMA: reads of tensors left in global memory (counted over the iteration
  domains with isl), copies into shared memory (each block's box once per slice) and loads of
  the per-thread register arrays, per multiply-add: what promotion lowers (3 without it);
- the time on the OpenCL device that is present (PoCL on the CPU here: a check that the kernel
  runs, not a GPU figure).

    python -m benchmarks --filter gpu
"""

from __future__ import annotations

import math

import numpy as np

import polyc
from benchmarks.measure import median_time
from polyc.lang import checked as ir

#: (name, TC source, sizes): a contraction, a batched one, a convolution, row-wise reductions.
GPU_CASES = (
    (
        "matmul",
        "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
        dict(M=1024, K=1024, N=1024),
    ),
    (
        "batch_matmul",
        "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, r_k) * Y(b, r_k, n) }",
        dict(B=12, M=128, K=64, N=128),
    ),
    (
        "conv2d 3x3",
        "def conv(float(N, C, H, W) I, float(F, C, 3, 3) K) -> (O) {\n"
        "  O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * K(f, r_c, r_kh, r_kw)\n}",
        dict(N=1, C=64, H=58, W=58, F=64),
    ),
    (
        "softmax",
        "def softmax(float(N, D) X) -> (Y, mx, s) {\n  mx(n) max=! X(n, r_d)\n"
        "  s(n) +=! exp(X(n, r_d) - mx(n))\n  Y(n, d) = exp(X(n, d) - mx(n)) / s(n)\n}",
        dict(N=4096, D=1024),
    ),
    (
        "layernorm",
        "def layernorm(float(N, D) X, float(D) G, float(D) Bt) -> (Y, mean, var) {\n"
        "  mean(n) +=! X(n, r_d) / D\n  var(n) +=! (X(n, r_d) - mean(n)) * (X(n, r_d) - mean(n)) / D\n"
        "  Y(n, d) = (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) * G(d) + Bt(d)\n}",
        dict(N=4096, D=768),
    ),
)

SM80 = dict(registers=65536, threads=2048, blocks=32, warps=64, shared=164 * 1024)


def occupancy_sm80(registers: int, threads: int, shared_bytes: int) -> float:
    """Resident warps per SM over the maximum, for a kernel of this shape on sm_80."""
    warps = math.ceil(threads / 32)
    registers_per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    limits = [SM80["registers"] // (registers_per_warp * warps), SM80["threads"] // (warps * 32), SM80["blocks"]]
    if shared_bytes:
        limits.append(SM80["shared"] // shared_bytes)
    return min(limits) * warps / SM80["warps"]


def loads_per_fma(stages) -> float | None:
    """Global loads per multiply-add over the whole grid (None: no multiply-add): reads of
    tensors left in global memory, plus the copies into shared memory (every block copies its
    box once per slice) and the loads of the private (register) arrays."""
    program = stages.program
    loads = fmas = 0
    for launch in stages.gpu.launches:
        shared = {a.tensor for a in launch.promotion.arrays} if launch.promotion else set()
        private = {a.tensor for a in launch.private.arrays} if launch.private else set()
        for name in launch.statements:
            statement = program.statement(name)
            count = statement.domain.intersect_params(program.context).count_val().to_python()
            loads += count * sum(1 for access in statement.reads if access.tensor not in shared | private)
            rhs = statement.source.rhs
            if (
                statement.kind == "update"
                and statement.source.op == "+"
                and isinstance(rhs, ir.Binary)
                and rhs.op == "*"
            ):
                fmas += count
        blocks = math.prod(launch.grid)
        if launch.promotion:
            loads += blocks * launch.promotion.slices * sum(math.prod(a.sizes) for a in launch.promotion.arrays)
        if launch.private:
            loads += blocks * math.prod(launch.block) * sum(a.elements for a in launch.private.arrays)
    return loads / fmas if fmas else None


def run_gpu_cases(repeat: int, names=None) -> dict:
    from polyc.runtime.gpu import cuda_missing, cuda_resources, find_nvcc

    missing = cuda_missing()
    print("\nGPU kernels (benchmarks.gpu_bench)")
    if missing is not None:
        print(f"no GPU present ({missing}): static figures for sm_80 from ptxas and polyc's mapping instead")
    if find_nvcc() is None:
        print("nvcc not found: no ptxas figures")
    header = (
        f"{'kernel':<14} {'launches':>8} {'block':>12} {'regs':>5} {'smem B':>7} {'spills':>6} "
        f"{'occupancy':>9} {'loads/FMA':>9} {'OpenCL ms':>10}"
    )
    print(header)
    rows = []
    for name, source, sizes in GPU_CASES:
        if names is not None and name not in names:
            continue
        kernel = polyc.define(source)[source.split("(")[0].split()[-1]]
        stages = kernel.gpu_stages(sizes, "cuda")
        row = {
            "name": name,
            "sizes": sizes,
            "launches": len(stages.gpu.launches),
            "blocks": [list(launch.block) for launch in stages.gpu.launches],
            "grids": [list(launch.grid) for launch in stages.gpu.launches],
        }
        if find_nvcc() is not None:
            report = cuda_resources(stages.gpu_source.source, ("sm_80",))["sm_80"]
            worst = max(report.values(), key=lambda r: r.registers)
            threads = max(math.prod(launch.block) for launch in stages.gpu.launches)
            row.update(
                registers=worst.registers,
                shared_bytes=worst.shared_bytes,
                spills=worst.spill_stores + worst.spill_loads,
                occupancy=occupancy_sm80(worst.registers, threads, worst.shared_bytes),
            )
        row["loads_per_fma"] = loads_per_fma(stages)
        row["opencl_ms"] = _opencl_time(source, kernel.name, sizes, repeat)
        if missing is None:  # a GPU: polyc's CUDA on device arrays beside the library's kernel
            row["cuda_ms"], row["baseline_ms"], row["baseline"] = _cuda_times(name, source, kernel.name, sizes, repeat)
            print(
                f"  {name}: polyc CUDA {_fmt(row['cuda_ms'], '.3f')} ms, {row['baseline']} "
                f"{_fmt(row['baseline_ms'], '.3f')} ms"
            )
        rows.append(row)
        block = "x".join(str(b) for b in stages.gpu.launches[0].block) if stages.gpu.launches else "-"
        print(
            f"{name:<14} {row['launches']:>8} {block:>12} {row.get('registers', '-'):>5} "
            f"{row.get('shared_bytes', '-'):>7} {row.get('spills', '-'):>6} "
            f"{_fmt(row.get('occupancy'), '.0%'):>9} {_fmt(row['loads_per_fma'], '.2f'):>9} "
            f"{_fmt(row['opencl_ms'], '.1f'):>10}",
            flush=True,
        )
    return {"gpu": None if missing else "present", "missing": missing, "rows": rows}


def _cuda_times(name: str, source: str, entry: str, sizes: dict, repeat: int):
    """(polyc CUDA ms, baseline ms, baseline name): medians, device arrays, synchronised.
    The baseline is cupy's (cuBLAS for the products) or torch's (cuDNN for the convolution),
    whichever is installed.  Written for machines with a GPU; these development machines have
    none, so this path has not run here."""
    import pycuda.driver as driver
    from pycuda import gpuarray

    kernel = polyc.define(source, backend="cuda")[entry]
    rng = np.random.default_rng(0)
    host = [
        rng.standard_normal(kernel.definition.tensor(n).concrete_shape(sizes)).astype(np.float32)
        for n in kernel.definition.inputs
    ]
    device = [gpuarray.to_gpu(a) for a in host]

    def polyc_call():
        kernel(*device)
        driver.Context.synchronize()

    baseline_name, baseline = _library_baseline(name, host)
    return _median_ms(polyc_call, repeat), (_median_ms(baseline, repeat) if baseline else None), baseline_name


def _library_baseline(name: str, host: list):
    """A callable running the same computation in cupy or torch on the GPU, or (name, None)."""
    try:
        import cupy

        xs = [cupy.asarray(a) for a in host]
        sync = cupy.cuda.Device().synchronize
        library = "cupy"
    except ImportError:
        try:
            import torch

            xs = [torch.from_numpy(a).cuda() for a in host]
            sync = torch.cuda.synchronize
            library = "torch"
        except ImportError:
            return "no cupy or torch", None
    if name in ("matmul", "batch_matmul"):
        run = lambda: xs[0] @ xs[1]  # noqa: E731
    elif name == "conv2d 3x3" and library == "torch":
        import torch.nn.functional as functional

        run = lambda: functional.conv2d(xs[0], xs[1])  # noqa: E731
    elif name == "softmax":

        def run():
            e = _exp(library, xs[0] - _row_max(library, xs[0]))
            return e / (e.sum(axis=1, keepdims=True) if library == "cupy" else e.sum(dim=1, keepdim=True))
    else:
        return f"no {library} baseline", None

    def call():
        run()
        sync()

    return library, call


def _exp(library: str, x):
    if library == "cupy":
        import cupy

        return cupy.exp(x)
    return x.exp()


def _row_max(library: str, x):
    return x.max(axis=1, keepdims=True) if library == "cupy" else x.max(dim=1, keepdim=True).values


def _median_ms(call, repeat: int) -> float:
    return median_time(call, repeat) * 1e3


def _opencl_time(source: str, entry: str, sizes: dict, repeat: int) -> float | None:
    """Median ms of the kernel through backend="opencl" on the device present (None: none)."""
    try:
        kernel = polyc.define(source, backend="opencl")[entry]
        rng = np.random.default_rng(0)
        inputs = [
            rng.standard_normal(kernel.definition.tensor(n).concrete_shape(sizes)).astype(np.float32)
            for n in kernel.definition.inputs
        ]
        return _median_ms(lambda: kernel(*inputs), repeat)
    except polyc.PolycError:
        return None


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
