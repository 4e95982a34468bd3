"""The GPU path (back ends ``"cuda"`` and ``"opencl"``): the outer loops fused as on the CPU,
the schedule tree cut into launches and mapped to blocks and threads
(:mod:`polyc.schedule.gpu_mapping`), printed in the back end's dialect (:mod:`polyc.codegen.gpu`)."""

from __future__ import annotations

import math

from polyc.codegen.c import GeneratedKernel
from polyc.codegen.gpu import generate_gpu
from polyc.errors import PolycError
from polyc.options import GPU_BACKENDS, Options
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.schedule import tiling
from polyc.schedule.gpu_mapping import MappingOptions, map_to_gpu
from polyc.schedule.gpu_promotion import DEFAULT_MAX_SHARED_BYTES
from polyc.schedule.outer_fusion import fuse_outer_loops
from polyc.target import DEFAULT_DEVICE, DeviceModel, named_device


def recognise(request: PathRequest):
    """The dialect to print: the back end's."""
    return request.options.backend if request.options.backend in GPU_BACKENDS else None


def generate(request: PathRequest, dialect: str) -> PathKernel:
    program, options = request.built_program, request.options
    assert request.schedule is not None and request.dependences is not None, "a GPU mapping needs the analysis"
    if program.size_values is None:
        raise PolycError(
            f"{program.definition.name}: the GPU back ends compile for concrete sizes "
            "(specialize=False and sizes=None are not supported)"
        )
    mapped = request.schedule
    if options.fusion != "min":
        mapped = fuse_outer_loops(mapped, program, request.dependences, tiling.cache_sizes(options))
    plan = map_to_gpu(program, mapped, request.dependences, mapping_options(options, dialect))
    source = generate_gpu(program, plan, options, dialect)
    first = source.launches[0].function_name if source.launches else ""
    kernel = GeneratedKernel(first, source.source, source.tensor_arguments, ())
    return PathKernel(kernel, schedule=mapped, gpu=plan, gpu_source=source)


def explain(stages) -> list[str]:
    return [f"the def runs on the GPU in {len(stages.gpu.launches)} launch(es): " + stages.gpu.describe()]


def mapping_options(options: Options, dialect: str) -> MappingOptions:
    """The GPU mapping's choices from the user's options and the device's model."""
    device = gpu_device(options, dialect)
    if options.block is not None and math.prod(options.block) > device.max_threads_per_block:
        raise PolycError(
            f"block {options.block} has {math.prod(options.block)} threads; the {device.name} "
            f"allows at most {device.max_threads_per_block} per block"
        )
    return MappingOptions(
        block=options.block,
        grid=options.grid,
        tile_sizes=options.gpu_tiles,
        unroll=options.unroll,
        shared_memory=min(shared_memory_budget(options), device.shared_memory_per_block),
        private_memory=options.use_private_memory,
        double_buffer=options.double_buffer,
        registers=device.register_tile,
        device=device,
    )


def gpu_device(options: Options, dialect: str) -> DeviceModel:
    """The device model the mapping uses: the named one, else the device this machine runs
    ``dialect`` on, else the dialect's named default."""
    if options.device is not None:
        return named_device(options.device)
    if dialect not in _QUERIED_DEVICES:
        from polyc.runtime.gpu import query_device  # the runtime's device queries, imported lazily

        _QUERIED_DEVICES[dialect] = query_device(dialect) or named_device(DEFAULT_DEVICE[dialect])
    return _QUERIED_DEVICES[dialect]


_QUERIED_DEVICES: dict[str, DeviceModel] = {}


def shared_memory_budget(options: Options) -> int:
    """Bytes of shared memory a GPU launch may use for promoted tiles."""
    if not options.use_shared_memory:
        return 0
    return options.max_shared_memory if options.max_shared_memory is not None else DEFAULT_MAX_SHARED_BYTES


PATH = KernelPath(
    "gpu_mapping",
    GPU_BACKENDS,
    recognise,
    generate,
    explain,
    options=(
        "block",
        "grid",
        "device",
        "gpu_tiles",
        "unroll",
        "use_shared_memory",
        "max_shared_memory",
        "use_private_memory",
        "double_buffer",
        "fusion",
    ),
    tile_alias=lambda sizes: {"gpu_tiles": sizes} if sizes else {},
)
