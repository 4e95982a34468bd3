"""The GPU back end through OpenCL (PoCL on a machine without a GPU) against the numpy references.

Every kernel of the corpus (tests/kernels.py) at every size set, under several mapping option
sets: the default, fusion off, odd block sizes (partial blocks at every edge), shared memory off, private memory off,
and a shared-memory budget that admits only small tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernels import DIVERGENT_BARRIERS_DEF, FLOAT16_DEFS, KERNELS, check_kernel

import polyc
from polyc.runtime.gpu import opencl_missing

pyopencl = pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")


pytestmark = pytest.mark.skipif(opencl_missing() is not None, reason=str(opencl_missing()))


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    directory = tmp_path_factory.mktemp("opencl-kernel-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(directory))
        yield directory


OPTION_SETS = {
    "default": {},
    "fusion-min": dict(fusion="min"),
    "odd-blocks": dict(block=(7, 3, 2)),
    "no-shared-memory": dict(use_shared_memory=False),
    "no-private-memory": dict(use_private_memory=False),
    "small-shared-memory": dict(max_shared_memory=600, block=(16, 4)),
}

CORPUS = [
    pytest.param(case, options, id=f"{case.name}-{label}") for label, options in OPTION_SETS.items() for case in KERNELS
]


@pytest.mark.parametrize("case, options", CORPUS)
def test_kernel_matches_numpy_through_opencl(case, options):
    kernel = polyc.define(case.source, backend="opencl", **options)[case.entry]
    for sizes in case.size_sets:
        check_kernel(case, kernel, sizes, seed=0)


#: Kernels whose launches run a block per row (or one block) under sm_80's model at long rows.
BLOCK_REDUCTIONS = (
    "matvec",
    "dot",
    "sum_all",
    "symmetrize_trace",
    "atax",
    "gesummv",
    "softmax",
    "log_softmax",
    "layernorm",
    "window_sum",
    "row_sum",
    "row_mean",
    "row_max",
    "col_min",
    "row_prod",
    "max_all",
    "int_rowsum",
    "double_norm",
    "compare",
    "running_max",
)


@pytest.mark.parametrize("name", BLOCK_REDUCTIONS)
def test_block_reductions_match_numpy_through_opencl(name):
    from kernels import CASES

    case = CASES[name]
    kernel = polyc.define(case.source, backend="opencl", device="sm_80")[case.entry]
    sizes = {size: (value if value <= 2 else max(value, 70)) for size, value in case.size_sets[0].items()}
    assert any(launch.reduction is not None for launch in kernel.gpu_stages(sizes).gpu.launches)
    check_kernel(case, kernel, sizes, seed=0)


def test_device_arrays_are_used_in_place_and_outputs_stay_on_the_device():
    from pyopencl import array as cl_array

    from polyc.runtime.gpu import OpenCLRuntime

    queue = OpenCLRuntime.shared().queue
    kernel = polyc.define(
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }", backend="opencl"
    ).mm
    rng = np.random.default_rng(0)
    a, b = rng.random((9, 40), np.float32), rng.random((40, 7), np.float32)
    a_device, b_device = cl_array.to_device(queue, a), cl_array.to_device(queue, b)
    c = kernel(a_device, b_device)
    assert isinstance(c, cl_array.Array)
    np.testing.assert_allclose(c.get(), a @ b, rtol=1e-5)
    mixed = kernel(a_device, b)  # a host input beside a device one is copied in
    np.testing.assert_allclose(mixed.get(), a @ b, rtol=1e-5)
    given = cl_array.zeros(queue, (9, 7), np.float32)
    assert kernel(a_device, b_device, outputs=[given]) is given
    np.testing.assert_allclose(given.get(), a @ b, rtol=1e-5)
    with pytest.raises(polyc.PolycError, match="float32 device array of shape"):
        kernel(a_device, cl_array.to_device(queue, b.astype(np.float64)))
    with pytest.raises(polyc.PolycError, match="must be a device array"):
        kernel(a_device, b_device, outputs=[np.zeros((9, 7), np.float32)])


def test_integer_extremes_compile_in_opencl_c():
    """OpenCL C has no <stdint.h>: the limits and constant macros C's integer code uses come
    from polyc's header (found by the OpenCL fuzzer: an int32 max=! starts from INT32_MIN)."""
    kernel = polyc.define(
        """
def extremes(int32(N) A, int64(N) B, uint64(N) U) -> (O, P, Q) {
    O() max=! A(r_i)
    P() max=! B(r_i)
    Q() max=! U(r_i)
}""",
        backend="opencl",
    ).extremes
    a = np.array([-5, -7, -(2**31)], np.int32)
    b = np.array([-(2**63), -1, -9], np.int64)
    u = np.array([3, 2**64 - 1, 0], np.uint64)
    o, p, q = kernel(a, b, u)
    assert (o, p, q) == (-5, -1, 2**64 - 1)


def test_shared_copies_with_more_elements_than_threads_copy_every_element():
    """A tile of B[4 x 4 x 4] copied by a block of 4 x 8 threads: two rounds per thread.  Found by
    the OpenCL fuzzer: with each thread's elements tied to its id only modulo the block (no
    round in the copy's schedule), isl's AST generation kept one element of the two."""
    kernel = polyc.define(
        """
def spread(float(M, 2) A, float(N, 4, N) B) -> (O, T) {
    T(i, k, j, l, r_a) = A(r_a, k) + B(j, l, i)
    O(i, j, k, l) +=! T(i, k, j, l, r_a)
}""",
        backend="opencl",
    ).spread
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8, 2)).astype(np.float32)
    b = rng.standard_normal((4, 4, 4)).astype(np.float32)
    t = a.T[None, :, None, None, :] + np.transpose(b, (2, 0, 1))[:, None, :, :, None]
    launch = kernel.gpu_stages(dict(M=8, N=4)).gpu.launches[0]
    assert launch.promotion is not None and launch.promotion.array("B") is not None
    o_result, t_result = kernel(a, b)
    np.testing.assert_allclose(t_result, t, rtol=1e-6)
    np.testing.assert_allclose(o_result, t.sum(-1).transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def test_float16_rounds_every_operation_as_the_cpu_does():
    gpu = polyc.define(FLOAT16_DEFS, backend="opencl", device="sm_80")
    cpu = polyc.define(FLOAT16_DEFS)
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal(300).astype(np.float16) for _ in range(2))
    d, i = rng.standard_normal(300) * 1e3, rng.integers(-70000, 70000, 300).astype(np.int32)
    np.testing.assert_array_equal(gpu.elementwise(x, y, d, i), cpu.elementwise(x, y, d, i))  # same roundings
    a, b = rng.standard_normal((40, 70)).astype(np.float16), rng.standard_normal((70, 36)).astype(np.float16)
    launch = gpu.matmul.gpu_stages(dict(M=40, K=70, N=36)).gpu.launches[0]
    assert launch.promotion is not None and launch.private is not None  # shared tiles and registers in float16
    np.testing.assert_allclose(gpu.matmul(a, b).astype(np.float64), a.astype(np.float64) @ b, rtol=0, atol=0.2)
    rows = rng.standard_normal((7, 300)).astype(np.float16)  # few rows: a block per row, trees in float16
    assert gpu.softmax.gpu_stages(dict(N=7, D=300)).gpu.launches[0].reduction is not None
    np.testing.assert_allclose(gpu.softmax(rows).astype(np.float64), cpu.softmax(rows), rtol=0, atol=2e-3)
    with pytest.raises(polyc.PolycError, match="float16"):  # device arrays would hold float, not half
        from pyopencl import array as cl_array

        from polyc.runtime.gpu import OpenCLRuntime

        gpu.matmul(cl_array.to_device(OpenCLRuntime.shared().queue, a), b)


def test_one_thread_blocks_with_register_tiles_and_shared_tiles():
    """Found by the OpenCL fuzzer (seed 4190697506): PoCL's loop-vectorising work-group method
    miscompiled this launch (one thread per block, a register tile of 4, shared tiles); oclgrind
    and PoCL's plain work-item loops, which polyc now selects, compute it right."""
    kernel = polyc.define(
        """
def chain(float(M, N) A, float(M) B) -> (O) {
    O(i) +=! A(r_a, i)
    T(i) +=! O(i) + B(r_a)
    O(i) = T(i)
}""",
        backend="opencl",
        fusion="min",
        block=(1,),
    ).chain
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
    column_sums = a.astype(np.float64).sum(0)
    np.testing.assert_allclose(kernel(a, b), (column_sums[:, None] + b[None, :]).sum(1), rtol=1e-5)


def test_no_launch_writes_outside_its_tensors_where_isl_guarded_its_barriers():
    """Every tensor in a buffer with a guard zone on either side: the launches leave the zones as
    they were, and the result is the CPU back end's."""
    import pyopencl as cl

    from polyc.runtime.gpu import OpenCLRuntime

    options = dict(fusion="min", block=(5, 3))
    kernel = polyc.define(DIVERGENT_BARRIERS_DEF, backend="opencl", **options).fuzz
    sizes = dict(M=14, N=7)
    code = kernel.gpu_stages(sizes).gpu_source
    runtime = OpenCLRuntime.shared()
    program = runtime.program(code.source)
    rng = np.random.default_rng(5)
    shapes = {"A": (7, 14), "B": (14, 7), "C": (7, 7, 14, 14), "O": (7, 7, 14)}
    guard, sentinel = 256, np.float32(7.25)
    hosts, buffers, arguments = {}, [], []
    for name in code.tensor_arguments:
        count = int(np.prod(shapes[name]))
        host = np.full(count + 2 * guard, sentinel, np.float32)
        host[guard : guard + count] = rng.standard_normal(count) if name != "O" else 0
        buffer = cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        hosts[name] = host
        buffers.append(buffer)
        arguments.append(buffer.get_sub_region(guard * 4, count * 4))
    status = np.zeros(1, np.int32)
    arguments.append(cl.Buffer(runtime.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=status))
    for launch in code.launches:
        getattr(program, launch.function_name)(runtime.queue, launch.global_size, launch.block, *arguments)
    for name, buffer in zip(code.tensor_arguments, buffers):
        cl.enqueue_copy(runtime.queue, hosts[name], buffer)
    runtime.queue.finish()
    for name, host in hosts.items():
        zones = np.concatenate([host[:guard], host[-guard:]])
        assert np.all(zones == sentinel), f"{name}: {np.count_nonzero(zones != sentinel)} elements written outside it"
    inputs = [hosts[name][guard:-guard].reshape(shapes[name]) for name in "ABC"]
    expected = polyc.define(DIVERGENT_BARRIERS_DEF, fusion="min").fuzz(*inputs)
    np.testing.assert_allclose(hosts["O"][guard:-guard].reshape(shapes["O"]), expected, rtol=1e-5, atol=1e-5)
