"""Models of GPU devices: the limits and sizes the GPU mapping chooses its defaults from.

A model is named (``device="sm_80"``) or, by default, read from the device the back end runs
on (pyopencl's or pycuda's device queries, :func:`polyc.runtime.gpu.query_device`); where none
exists (exporting CUDA on a machine without a GPU) the back end's named default is used:
``sm_80`` for CUDA, ``pocl`` for OpenCL.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyc.errors import PolycError


@dataclass(frozen=True)
class DeviceModel:
    """What the mapping needs to know of a device."""

    name: str
    max_threads_per_block: int  # CUDA's maxThreadsPerBlock, OpenCL's max_work_group_size
    shared_memory_per_block: int  # bytes a block gets without opting in (OpenCL: local memory)
    warp: int  # threads issued together (a warp, a wavefront, SIMD lanes)
    #: accumulators a thread's register tile may hold: about a quarter of the registers a
    #: thread has when the device runs its most threads
    register_tile: int
    #: threads that keep the whole device busy (its multiprocessors times the threads each
    #: runs at once): a launch with fewer rows than this gives each row a block of its own
    fill_threads: int

    def describe(self) -> str:
        return (
            f"device model {self.name}: at most {self.max_threads_per_block} threads and "
            f"{self.shared_memory_per_block} bytes of shared memory per block, warps of {self.warp}, "
            f"register tiles of at most {self.register_tile} values, {self.fill_threads} threads fill it"
        )


#: Named models.  sm_80 (A100) and sm_90 (H100): 1024 threads per block, 48 KiB of shared
#: memory without opting in, 64 K registers per SM for 2048 threads (32 each at full occupancy,
#: 64 at half: a 16-value tile leaves room for operands and addresses).  PoCL on a CPU: a
#: work-group is a loop nest on one core, "local" memory is ordinary memory in the caches.
DEVICE_MODELS = {
    "sm_80": DeviceModel("sm_80", 1024, 48 * 1024, 32, 16, 108 * 2048),  # A100: 108 SMs
    "sm_90": DeviceModel("sm_90", 1024, 48 * 1024, 32, 16, 132 * 2048),  # H100 SXM: 132 SMs
    "pocl": DeviceModel("pocl", 4096, 256 * 1024, 8, 16, 2 * 8),  # two cores of 8 lanes
}

#: The model a back end assumes when no device can be queried.
DEFAULT_DEVICE = {"cuda": "sm_80", "opencl": "pocl"}


def named_device(name: str) -> DeviceModel:
    try:
        return DEVICE_MODELS[name]
    except KeyError:
        raise PolycError(f"unknown device model {name!r}; the named models are: {', '.join(DEVICE_MODELS)}") from None
