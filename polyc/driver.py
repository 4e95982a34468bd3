"""The compiler pipeline, stage by stage, and the compiled kernel it produces.

    checked def --build_program--> PolyProgram --compute_dependences--> Dependences
        --compute_schedule--> schedule tree --optimize_schedule--> tiled, marked tree
        --generate_c--> C source --runtime.get_or_build--> shared library --ctypes--> call

``compile_stages`` runs the stages for one set of sizes (or parametrically) and keeps every
intermediate result for inspection; ``CompiledKernel`` caches one compiled function per size
signature so that repeated calls cost only argument checking and the call itself.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Mapping

import islpy as isl
import numpy as np

from polyc.codegen.c import GeneratedKernel, generate_c
from polyc.codegen.conv import generate_conv
from polyc.codegen.gemm import STATUS_OUT_OF_MEMORY, generate_gemm, packing_programs
from polyc.codegen.gemv import generate_gemv
from polyc.codegen.link import link_segments
from polyc.codegen.pointwise_depthwise import generate_pointwise_depthwise
from polyc.codegen.gpu import GpuKernelSource, generate_gpu
from polyc.errors import BoundsError, PolycError
from polyc.ir.dependences import Dependences, compute_dependences
from polyc.ir.model import PolyProgram, build_program
from polyc.lang.checked import CheckedDef
from polyc.options import GPU_BACKENDS, Options
from polyc.runtime import CompilerOptions, get_function, get_or_build, load_library
from polyc.runtime import arguments
from polyc.runtime.arguments import BoundCall
from polyc.runtime.cache import find_request, remember_request, request_key
from polyc.runtime.compiler import LANGUAGE_FLAGS
from polyc.schedule.contraction import Contraction, recognise_gemm_def, worth_a_gemm_kernel
from polyc.schedule.convolution import Convolution, PointwiseDepthwise, recognise_conv_def, \
    recognise_pointwise_depthwise_def
from polyc.schedule import tiling
from polyc.schedule.gpu_device import DEFAULT_DEVICE, DeviceModel, named_device
from polyc.schedule.gpu_mapping import GpuPlan, MappingOptions, map_to_gpu
from polyc.schedule.gpu_promotion import DEFAULT_MAX_SHARED_BYTES
from polyc.schedule.outer_fusion import fuse_outer_loops
from polyc.schedule.packing import PackingProgram
from polyc.schedule.scheduler import compute_schedule
from polyc.schedule.segments import plan_segments
from polyc.schedule.transform import optimize_schedule
from polyc.tune.records import tuned_options


@dataclass(frozen=True)
class Stages:
    """Every intermediate result of compiling one def for one size signature."""

    program: PolyProgram
    dependences: Dependences
    schedule: isl.Schedule
    optimized_schedule: isl.Schedule
    kernel: GeneratedKernel
    contraction: Contraction | None = None  # set when ``kernel`` is a contraction (gemm or gemv) kernel
    convolution: Convolution | None = None  # set when ``kernel`` is a direct convolution kernel
    segments: tuple["Stages", ...] = ()     # when ``kernel`` runs the def in segments, theirs
    packing: tuple[PackingProgram, ...] = ()  # a gemm kernel's packing statements, per register block
    decisions: tuple = ()   # per band: tiling, parallel and simd decisions (polyc.schedule.transform.BandDecision)
    options: Options | None = None  # the options it was compiled with (tuning records applied)
    gpu: "GpuPlan | None" = None  # for the GPU back ends: the launches and their mapping
    gpu_source: "GpuKernelSource | None" = None  # ... and their code (``kernel.source`` too)

    @property
    def mapped_schedule(self) -> isl.Schedule:
        """The schedule tree the code was generated from: for the GPU back ends the launches'
        mapping (kernel marks, bands of block and thread ids, the order inside each thread)."""
        return self.gpu.schedule(self.program.ctx) if self.gpu is not None else self.optimized_schedule


@dataclass(frozen=True)
class Analysis:
    """What does not depend on the sizes of a call: the parametric program, its dependences and
    its schedule.  Scheduling once for all sizes is faster, and it keeps isl's ILP small: with
    the sizes fixed, large constants can make it search for minutes."""

    program: PolyProgram
    dependences: Dependences
    schedule: isl.Schedule


def analyse(definition: CheckedDef, fusion: str) -> Analysis:
    """Model, dependences and schedule of ``definition`` for every size."""
    program = build_program(definition)
    dependences = compute_dependences(program)
    return Analysis(program, dependences, compute_schedule(program, dependences, fusion))


def compile_stages(definition: CheckedDef, options: Options,
                   sizes: Mapping[str, int] | None = None, analysis: Analysis | None = None) -> Stages:
    """Run the pipeline up to C source; ``sizes`` specialises it (None: parametric).

    The schedule is computed for all sizes (``analysis``, computed here when not given); the
    sizes then fix the context of tiling decisions and of code generation.  A def that is one
    tensor contraction (plus elementwise epilogues) gets the BLIS-style kernel of
    :mod:`polyc.codegen.gemm` (a matrix-vector product that of :mod:`polyc.codegen.gemv`), a
    def that is one convolution (plus elementwise epilogues) the direct convolution kernel of
    :mod:`polyc.codegen.conv`; a def with contractions among other statements is compiled in
    segments (:mod:`polyc.schedule.segments`), each through its own stages, and linked into
    one kernel.  The whole def's schedules are still computed, for inspection.
    """
    analysis = analysis or analyse(definition, options.fusion)
    dependences, schedule = analysis.dependences, analysis.schedule
    program = analysis.program
    if options.specialize and sizes is not None:
        program = build_program(definition, sizes, ctx=analysis.program.ctx)
    if options.backend in GPU_BACKENDS:
        return compile_gpu_stages(program, dependences, schedule, options)
    decisions: list = []
    optimized = optimize_schedule(schedule, program, options, dependences, decisions)
    contraction = find_blas_contraction(definition, options)
    if contraction is not None:
        if contraction.is_matvec:
            return Stages(program, dependences, schedule, optimized, generate_gemv(program, contraction, options),
                          contraction, decisions=tuple(decisions), options=options)
        return Stages(program, dependences, schedule, optimized, generate_gemm(program, contraction, options),
                      contraction, packing=packing_programs(program, contraction, options),
                      decisions=tuple(decisions), options=options)
    convolution = find_convolution(definition, options)
    if convolution is not None:
        return Stages(program, dependences, schedule, optimized, generate_conv(program, convolution, options),
                      convolution=convolution, decisions=tuple(decisions), options=options)
    chain = find_pointwise_depthwise(definition, options)
    if chain is not None:
        return Stages(program, dependences, schedule, optimized, generate_pointwise_depthwise(program, chain, options),
                      decisions=tuple(decisions), options=options)
    segments = plan_segments(definition) if _blas_enabled(options) else None
    if segments is not None:
        parts = tuple(compile_stages(segment.definition, options, sizes) for segment in segments)
        size_arguments = () if program.size_values is not None else tuple(definition.sizes)
        kernel = link_segments(definition.name, definition, [part.kernel for part in parts], size_arguments)
        return Stages(program, dependences, schedule, optimized, kernel, segments=parts, decisions=tuple(decisions),
                      options=options)
    return Stages(program, dependences, schedule, optimized, generate_c(program, optimized, options),
                  decisions=tuple(decisions), options=options)


def compile_gpu_stages(program: PolyProgram, dependences: Dependences, schedule: isl.Schedule,
                       options: Options, dialect: str | None = None) -> Stages:
    """The GPU pipeline: outer loops fused as on the CPU, the tree cut into launches and mapped
    to blocks and threads (:mod:`polyc.schedule.gpu_mapping`), printed in ``dialect`` (default:
    the back end's)."""
    if program.size_values is None:
        raise PolycError(f"{program.definition.name}: the GPU back ends compile for concrete sizes "
                         "(specialize=False and sizes=None are not supported)")
    mapped = schedule
    if options.fusion != "min":
        mapped = fuse_outer_loops(schedule, program, dependences, tiling.cache_sizes(options))
    plan = map_to_gpu(program, mapped, dependences, mapping_options(options, dialect or options.backend))
    source = generate_gpu(program, plan, options, dialect or options.backend)
    first = source.launches[0].function_name if source.launches else ""
    kernel = GeneratedKernel(first, source.source, source.tensor_arguments, ())
    return Stages(program, dependences, schedule, mapped, kernel, options=options, gpu=plan, gpu_source=source)


def mapping_options(options: Options, dialect: str) -> MappingOptions:
    """The GPU mapping's choices from the user's options and the device's model."""
    device = gpu_device(options, dialect)
    if options.block is not None and math.prod(options.block) > device.max_threads_per_block:
        raise PolycError(f"block {options.block} has {math.prod(options.block)} threads; the {device.name} "
                         f"allows at most {device.max_threads_per_block} per block")
    return MappingOptions(block=options.block, grid=options.grid, tile_sizes=options.tile_sizes or None,
                          unroll=options.unroll, shared_memory=min(shared_memory_budget(options),
                                                                   device.shared_memory_per_block),
                          private_memory=options.use_private_memory, double_buffer=options.double_buffer,
                          registers=device.register_tile,
                          device=device)


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


def _blas_enabled(options: Options) -> bool:
    return options.backend == "c" and options.blas_contractions


def find_blas_contraction(definition: CheckedDef, options: Options) -> Contraction | None:
    """The contraction a def is compiled as by the gemm back end, or None for the generic path."""
    if not _blas_enabled(options):
        return None
    contraction = recognise_gemm_def(definition)
    return contraction if contraction is not None and worth_a_gemm_kernel(contraction) else None


def find_convolution(definition: CheckedDef, options: Options) -> Convolution | None:
    """The convolution a def is compiled as by the direct convolution kernel, or None."""
    if options.backend != "c" or not options.direct_convolutions:
        return None
    return recognise_conv_def(definition)


def find_pointwise_depthwise(definition: CheckedDef, options: Options) -> PointwiseDepthwise | None:
    """The 1 x 1 and depthwise convolutions a def is compiled as by the fused kernel of
    :mod:`polyc.codegen.pointwise_depthwise`, or None."""
    if options.backend != "c" or not options.direct_convolutions:
        return None
    return recognise_pointwise_depthwise_def(definition)


def compiler_options(options: Options) -> CompilerOptions:
    """The runtime's compiler settings for polyc options (``cflags`` replace the optimisation
    flags; the language standard and OpenMP stay)."""
    flags = None if options.cflags is None else tuple(options.cflags) + LANGUAGE_FLAGS
    return CompilerOptions(cc=options.cc, flags=flags, openmp=True)


class _Compiled:
    """One loaded kernel function and the argument layout it expects."""

    def __init__(self, kernel: GeneratedKernel, options: Options):
        self.kernel = kernel
        library = load_library(get_or_build(kernel.source, compiler_options(options)))
        argtypes = [ctypes.c_void_p] * len(kernel.tensor_arguments) + [ctypes.c_int64] * len(kernel.size_arguments)
        self.function = get_function(library, kernel.function_name, argtypes, ctypes.c_int)


class CompiledKernel:
    """Calls a def through compiled C; compiles on first use per size signature."""

    def __init__(self, definition: CheckedDef, options: Options):
        self.definition = definition
        self.options = options
        self._compiled: dict[tuple, _Compiled] = {}
        self._analysis: Analysis | None = None
        self._lock = threading.Lock()

    def analysis(self) -> Analysis:
        """The size-independent analysis, computed once per kernel."""
        if self._analysis is None:
            self._analysis = analyse(self.definition, self.options.fusion)
        return self._analysis

    def stages(self, sizes: Mapping[str, int] | None = None) -> Stages:
        return compile_stages(self.definition, self.options, sizes, self.analysis())

    def compiled_for(self, sizes: Mapping[str, int]) -> _Compiled:
        key = self._sizes_key(sizes)
        compiled = self._compiled.get(key)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(key)
                if compiled is None:
                    options = tuned_options(self.definition, self.options, sizes)
                    compiled = self._from_earlier_process(options, key)
                    if compiled is None:
                        kernel = self._generated(options, sizes)
                        compiled = _Compiled(kernel, options)
                        self._remember(options, key, kernel)
                    self._compiled[key] = compiled
        return compiled

    def library_to_build(self, sizes: Mapping[str, int]) -> tuple[str, CompilerOptions] | None:
        """The library a call at ``sizes`` will load, generated now, for the caller to build in
        any thread (see :func:`build_ahead`): its C source and compiler options, the request
        remembered so that the call finds it in the cache (:meth:`_from_earlier_process`).  None
        when the call needs nothing built: compiled or cached already, or a def without TC text
        (generated at its call)."""
        key = self._sizes_key(sizes)
        if key in self._compiled:
            return None
        options = tuned_options(self.definition, self.options, sizes)
        if self._request(options, key) is None:
            return None
        with self._lock:
            cached = self._compiled.get(key) or self._from_earlier_process(options, key)
            if cached is not None:  # kept, so that the call does not look it up again
                self._compiled[key] = cached
                return None
        kernel = self._generated(options, sizes)
        self._remember(options, key, kernel)
        return kernel.source, compiler_options(options)

    def _sizes_key(self, sizes: Mapping[str, int]) -> tuple:
        """The compiled functions' key: the sizes when specialised, else one for all."""
        return tuple(sizes[s] for s in self.definition.sizes) if self.options.specialize else ()

    def _generated(self, options: Options, sizes: Mapping[str, int]) -> GeneratedKernel:
        """The kernel's C for ``sizes`` with ``options``, through every stage (the analysis shared
        while the fusion option is the def's own)."""
        analysis = self.analysis() if options.fusion == self.options.fusion else None
        return compile_stages(self.definition, options, sizes, analysis).kernel

    def _request(self, options: Options, sizes_key: tuple) -> str | None:
        """The cache's name for compiling this def with ``options`` at these sizes (None for a
        def without TC text, which is always generated)."""
        if not self.definition.source:
            return None
        return request_key({"def": self.definition.name, "text": self.definition.source,
                            "options": repr(options), "sizes": list(sizes_key)})

    def _from_earlier_process(self, options: Options, sizes_key: tuple) -> "_Compiled | None":
        """The kernel an earlier process generated for the same request, straight from the
        cache: no dependences, scheduling or code generation (see polyc.runtime.cache)."""
        key = self._request(options, sizes_key)
        found = find_request(key, compiler_options(options)) if key else None
        if found is None:
            return None
        source, call = found
        try:
            kernel = GeneratedKernel(call["function_name"], source, tuple(call["tensor_arguments"]),
                                     tuple(call["size_arguments"]))
        except (KeyError, TypeError):
            return None
        return _Compiled(kernel, options)

    def _remember(self, options: Options, sizes_key: tuple, kernel: GeneratedKernel) -> None:
        key = self._request(options, sizes_key)
        if key:
            remember_request(key, kernel.source, compiler_options(options),
                             {"function_name": kernel.function_name, "tensor_arguments": list(kernel.tensor_arguments),
                              "size_arguments": list(kernel.size_arguments)})

    def forget_compiled(self) -> None:
        """Drop the compiled functions, so that the next call of each size looks up its options
        again (after :func:`polyc.tune` recorded better ones)."""
        with self._lock:
            self._compiled.clear()

    def __call__(self, call: BoundCall) -> tuple[np.ndarray, ...]:
        """Run on checked arguments (see :func:`polyc.runtime.arguments.bind_arguments`)."""
        definition = self.definition
        compiled = self.compiled_for(call.sizes)
        buffers: dict[str, np.ndarray] = {}
        for tensor in definition.tensors:
            array = call.arrays.get(tensor.name)
            if array is None:  # a temporary
                array = call.new_array(tensor)
            buffers[tensor.name] = np.ascontiguousarray(array)
        pointers = [buffers[name].ctypes.data for name in compiled.kernel.tensor_arguments]
        sizes = [call.sizes[s] for s in compiled.kernel.size_arguments]
        _check_status(definition, compiled.function(*pointers, *sizes))
        results = []
        for name in definition.outputs:
            given = call.arrays[name]
            if buffers[name] is not given:  # a non-contiguous output was computed in a copy
                given[...] = buffers[name]
            results.append(given)
        return tuple(results)

    def repeat_plan(self, call: BoundCall) -> "RepeatCall":
        """A call like ``call`` (same input shapes and dtypes, C-contiguous inputs, fresh
        outputs) without the checks and lookups that ``call`` has passed: see :class:`RepeatCall`."""
        return RepeatCall(self.definition, self.compiled_for(call.sizes), call)


def build_ahead(calls: Iterable[tuple[object, Mapping[str, int]]], jobs: int | None = None) -> None:
    """Build the libraries of several kernel calls at once, before they are made: each call's C
    is generated in this thread, in turn, while the C compiler builds those before it on ``jobs``
    threads (default: the processors this process may use); the calls then find them in the
    cache.  ``calls``: (kernel, sizes) pairs, the kernels :class:`CompiledKernel` or
    :class:`polyc.api.Kernel`.  Most of a model's cold compile is the C compiler's (mobilenet_v2:
    55 s of 63), which one thread left to one processor.  A kernel that fails to generate or
    build is left to its call, which reports the error."""
    builders = ThreadPoolExecutor(max_workers=jobs or tiling.usable_cores(), thread_name_prefix="polyc-build")
    try:
        builds = []
        for kernel, sizes in calls:
            try:
                library = kernel.library_to_build(sizes)
            except PolycError:
                continue
            if library is not None:
                builds.append(builders.submit(get_or_build, *library))
        for build in builds:
            with contextlib.suppress(PolycError):
                build.result()
    finally:  # interrupted (Ctrl-C): the builds not yet started are dropped
        builders.shutdown(cancel_futures=True)


class RepeatCall:
    """The C function, the sizes and the output and temporary allocations of one argument
    signature, resolved once.  Calling it with inputs of that signature (checked by the caller,
    :class:`polyc.api.Kernel`, outputs by :meth:`outputs_fit`) costs half a checked call: for a 4 x 4
    matmul 6 us, not 12.
    """

    def __init__(self, definition: CheckedDef, compiled: _Compiled, call: BoundCall):
        self.definition = definition
        self.function = compiled.function
        self.sizes = tuple(call.sizes[s] for s in compiled.kernel.size_arguments)
        inputs = {name: i for i, name in enumerate(definition.inputs)}
        outputs = {name: i for i, name in enumerate(definition.outputs)}
        # per tensor argument: the input's position, or how to allocate an output (with its
        # position among the outputs) or a temporary (None)
        self.arguments = []
        for name in compiled.kernel.tensor_arguments:
            if name in inputs:
                self.arguments.append(inputs[name])
            else:
                self.arguments.append((call.shapes[name], definition.tensor(name).dtype,
                                       name in call.written_before_read, outputs.get(name)))
        # (shape, dtype) of each output, in declared order
        self.output_types = [None] * len(definition.outputs)
        for argument in self.arguments:
            if type(argument) is not int and argument[3] is not None:
                self.output_types[argument[3]] = argument[:2]

    def outputs_fit(self, args: tuple, outputs) -> bool:
        """Whether ``outputs`` can be written as they are: one C-contiguous, writeable ndarray of
        the right shape and dtype per output, none of whose bytes lie between the first and last
        byte of another argument (a stricter test than :func:`bind_arguments`'s, which the call
        falls back to otherwise)."""
        if type(outputs) not in (list, tuple) or len(outputs) != len(self.output_types):
            return False
        spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in args if type(a) is np.ndarray]
        for array, (shape, dtype) in zip(outputs, self.output_types):
            if type(array) is not np.ndarray or array.shape != shape or array.dtype != dtype \
                    or not array.flags.c_contiguous or not array.flags.writeable:
                return False
            start = array.ctypes.data
            end = start + array.nbytes
            if any(start < other_end and other_start < end for other_start, other_end in spans):
                return False
            spans.append((start, end))
        return True

    def argument_sources(self) -> list[tuple]:
        """Where each tensor argument of the C function (in order, before the sizes) comes
        from: ``("input", position)``, ``("output", position)``, or ``("temporary", shape,
        dtype, uninitialised)`` (uninitialised: the kernel writes it all before reading it, so
        its memory may be reused; else it must start as zeros)."""
        sources = []
        for argument in self.arguments:
            if type(argument) is int:
                sources.append(("input", argument))
            elif argument[3] is not None:
                sources.append(("output", argument[3]))
            else:
                sources.append(("temporary", *argument[:3]))
        return sources

    def status(self, status: int) -> None:
        """Raise the error the C function's return value stands for (nothing for 0)."""
        if status:
            _check_status(self.definition, status)

    def __call__(self, args: tuple, outputs=None) -> tuple[np.ndarray, ...]:
        """``outputs``: None (fresh arrays), or arrays that passed :meth:`outputs_fit`."""
        pointers, allocated = [], []  # temporaries too stay alive until the function returns
        results = [None] * len(self.definition.outputs)
        for argument in self.arguments:
            if type(argument) is int:
                pointers.append(args[argument].ctypes.data)
            else:
                shape, dtype, uninitialised, output = argument
                if output is not None and outputs is not None:
                    array = outputs[output]
                else:
                    array = arguments.allocate(shape, dtype, uninitialised)
                    allocated.append(array)
                pointers.append(array.ctypes.data)
                if output is not None:
                    results[output] = array
        _check_status(self.definition, self.function(*pointers, *self.sizes))
        return tuple(results)


def _check_status(definition: CheckedDef, status: int) -> None:
    """Raise the error a kernel's non-zero return value stands for."""
    if status == STATUS_OUT_OF_MEMORY:  # only contraction and convolution kernels allocate
        raise MemoryError(f"{definition.name}: the kernel could not allocate its packing buffers")
    if status != 0:
        raise BoundsError(f"{definition.name}: a data-dependent subscript fell outside its tensor "
                          f"(an index array holds a value out of range)")
