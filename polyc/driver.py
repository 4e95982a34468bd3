"""The compiler pipeline, stage by stage, and the compiled kernel it produces.

    checked def --build_program--> PolyProgram --compute_dependences--> Dependences
        --compute_schedule--> schedule tree --optimize_schedule--> tiled, marked tree
        --generate_c--> C source --runtime.get_or_build--> shared library --ctypes--> call

``compile_stages`` runs the stages for one set of sizes (or parametrically) and keeps every
intermediate result for inspection; ``CompiledKernel`` caches one compiled function per size
signature so that repeated calls cost only argument checking and the call itself.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import islpy as isl
import numpy as np

from polyc.codegen.c import GeneratedKernel
from polyc.codegen.gemm import STATUS_OUT_OF_MEMORY
from polyc.codegen.gpu import GpuKernelSource
from polyc.errors import BoundsError, PolycError
from polyc.ir.dependences import Dependences, compute_dependences
from polyc.ir.model import PolyProgram, build_program
from polyc.lang.checked import CheckedDef
from polyc.options import Options
from polyc.paths import KernelPath, PathRequest, choose_path, gpu_mapping, settle_options
from polyc.runtime import CompilerOptions, arguments, get_function
from polyc.runtime.arguments import BoundCall
from polyc.runtime.cache import fetch_library, find_request, load_kernel_library, remember_request, request_key
from polyc.runtime.compiler import compiler_options
from polyc.runtime.progress import progress_bar, progress_wanted
from polyc.runtime.sequence import CTYPES_MAX_ARGUMENTS, TableCall
from polyc.runtime.tuning_records import tuned_options
from polyc.schedule.contraction import Contraction
from polyc.schedule.convolution import Convolution
from polyc.schedule.gpu_mapping import GpuPlan
from polyc.schedule.packing import PackingProgram
from polyc.schedule.scheduler import compute_schedule
from polyc.schedule.user import user_schedule
from polyc.target import usable_cores

logger = logging.getLogger(__name__)


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
    segments: tuple[Stages, ...] = ()  # when ``kernel`` runs the def in segments, theirs
    packing: tuple[PackingProgram, ...] = ()  # a gemm kernel's packing statements, per register block
    decisions: tuple = ()  # per band: tiling, parallel and simd decisions (polyc.schedule.transform.BandDecision)
    options: Options | None = None  # the options it was compiled with (tuning records applied)
    gpu: GpuPlan | None = None  # for the GPU back ends: the launches and their mapping
    gpu_source: GpuKernelSource | None = None  # ... and their code (``kernel.source`` too)
    path: str = "generic"  # the kernel path that compiled it (polyc.paths.KERNEL_PATHS)
    requested: Options | None = None  # the options the user gave, before tuning records (None: ``options``)

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


def compile_stages(
    definition: CheckedDef,
    options: Options,
    sizes: Mapping[str, int] | None = None,
    analysis: Analysis | None = None,
    requested: Options | None = None,
    *,
    part: bool = False,
) -> Stages:
    """Run the pipeline up to C source; ``sizes`` specialises it (None: parametric).

    The schedule is computed for all sizes (``analysis``, computed here when not given); the
    sizes then fix the context of tiling decisions and of code generation.  The kernel path
    that compiles the def is the first of :data:`polyc.paths.KERNEL_PATHS` that recognises it
    (a contraction: the gemm or gemv kernel; a convolution: the Winograd, depthwise or direct
    kernel; contractions among other statements: segments, each through its own stages; else
    the generic loop nest).  The whole def's schedules are still computed, for inspection.

    With ``options.schedule`` (a schedule of the user's), that schedule is checked
    (:func:`polyc.schedule.user.user_schedule`: an illegal one is an
    :class:`~polyc.errors.IllegalScheduleError`) and compiled on the ``user_schedule`` path instead.

    The path then settles the options (:func:`polyc.paths.settle_options`): ``requested`` are
    the options the user gave (None: ``options`` themselves; they differ when tuning records
    were applied); ``part``: the def is a segment of a larger one.
    """
    analysis = analysis or analyse(definition, options.fusion)
    program = analysis.program
    if options.specialize and sizes is not None:
        program = build_program(definition, sizes, ctx=analysis.program.ctx)
    schedule, dependences = analysis.schedule, analysis.dependences
    if options.schedule is not None and options.backend == "c":
        # The user's schedule, checked at these sizes (every size when not specialised).
        schedule, dependences = user_schedule(
            program, dependences, options.schedule, dict(sizes) if sizes is not None and options.specialize else None
        )
    request = PathRequest(
        definition,
        options,
        program.size_values,
        program,
        dependences,
        schedule,
        compile_part=lambda segment: compile_stages(segment, options, sizes, part=True),
    )
    path, match = choose_path(request)
    request.options = settle_options(path, options, None if part else (requested or options))
    return replace(_stages_of(request, path, match), requested=requested or options)


def compile_gpu_stages(
    program: PolyProgram, dependences: Dependences, schedule: isl.Schedule, options: Options, dialect: str | None = None
) -> Stages:
    """The GPU path (:mod:`polyc.paths.gpu_mapping`) for ``program``, printed in ``dialect``
    (default: the back end's)."""
    request = PathRequest(program.definition, options, program.size_values, program, dependences, schedule)
    request.options = settle_options(gpu_mapping.PATH, options, options)
    return _stages_of(request, gpu_mapping.PATH, dialect or options.backend)


def _stages_of(request: PathRequest, path: KernelPath, match) -> Stages:
    """The stages of ``request``'s def compiled on ``path``."""
    if path.backends == ("c",):
        request.optimized_schedule()  # every CPU path keeps the tiled schedule and its decisions, for inspection
    generated = path.generate(request, match)
    optimized = generated.schedule if generated.schedule is not None else request.optimized_schedule()
    return Stages(
        request.program,
        request.dependences,
        request.schedule,
        optimized,
        generated.kernel,
        generated.contraction,
        generated.convolution,
        generated.segments,
        generated.packing,
        decisions=tuple(request.decisions),
        options=request.options,
        gpu=generated.gpu,
        gpu_source=generated.gpu_source,
        path=path.name,
    )


def gpu_code_generator(definition: CheckedDef, options: Options) -> Callable[[Mapping[str, int]], GpuKernelSource]:
    """sizes -> the GPU code of ``definition`` at those sizes (the GPU path's launches), its
    size-independent analysis computed at the first call and shared by the others."""
    analyses: list[Analysis] = []

    def generate(sizes: Mapping[str, int]) -> GpuKernelSource:
        if not analyses:
            analyses.append(analyse(definition, options.fusion))
        return compile_stages(definition, options.replace(specialize=True), sizes, analyses[0]).gpu_source

    return generate


class _Compiled:
    """One loaded kernel function and the argument layout it expects."""

    def __init__(self, kernel: GeneratedKernel, options: Options, name: str):
        """``name``: what the log calls the kernel."""
        self.kernel = kernel
        library = load_kernel_library(kernel.source, compiler_options(options), name=name)
        pointers, sizes = len(kernel.tensor_arguments), len(kernel.size_arguments)
        #: called as ``function(*pointers, *sizes)``, returns the kernel's status
        self.function: Callable[..., int]
        if pointers + sizes <= CTYPES_MAX_ARGUMENTS:
            self.function = get_function(
                library, kernel.function_name, [ctypes.c_void_p] * pointers + [ctypes.c_int64] * sizes, ctypes.c_int
            )
            #: the C function's address, for callers that call it from C (an ONNX plan)
            self.address: int = ctypes.cast(self.function, ctypes.c_void_p).value or 0
        else:  # more arguments than ctypes passes: through a C call reading them from a table
            self.address = ctypes.cast(get_function(library, kernel.function_name, []), ctypes.c_void_p).value or 0
            self.function = TableCall(self.address, pointers, sizes, options.cc)


class CompiledKernel:
    """Calls a def through compiled C; compiles on first use per size signature."""

    def __init__(self, definition: CheckedDef, options: Options):
        self.definition = definition
        self.options = options
        self._compiled: dict[tuple, _Compiled] = {}
        #: Size key -> what build_ahead's caller called the kernel, for the log of its loading.
        self._names: dict[tuple, str] = {}
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
                    name = self._names.get(key, self.definition.name)
                    compiled = self._from_earlier_process(options, key, name)
                    if compiled is None:
                        kernel = self._generated(options, sizes)
                        compiled = _Compiled(kernel, options, name)
                        self._remember(options, key, kernel)
                    self._compiled[key] = compiled
        return compiled

    def library_to_build(self, sizes: Mapping[str, int], name: str = "") -> tuple[str, CompilerOptions] | None:
        """The library a call at ``sizes`` will load, generated now, for the caller to build in
        any thread (see :func:`build_ahead`): its C source and compiler options, the request
        remembered so that the call finds it in the cache (:meth:`_from_earlier_process`).  None
        when the call needs nothing built: compiled or cached already, or a def without TC text
        (generated at its call).  ``name``: what the log calls the kernel (default: the def's name)."""
        name = name or self.definition.name
        key = self._sizes_key(sizes)
        self._names[key] = name
        if key in self._compiled:
            logger.debug("%s: from cache (compiled in this process)", name)
            return None
        options = tuned_options(self.definition, self.options, sizes)
        if self._request(options, key) is None:
            return None
        with self._lock:
            cached = self._compiled.get(key) or self._from_earlier_process(options, key, name)
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
        return compile_stages(self.definition, options, sizes, analysis, self.options).kernel

    def _request(self, options: Options, sizes_key: tuple) -> str | None:
        """The cache's name for compiling this def with ``options`` at these sizes (None for a
        def without TC text, which is always generated)."""
        if not self.definition.source:
            return None
        return request_key(
            {
                "def": self.definition.name,
                "text": self.definition.source,
                "options": repr(options),
                "sizes": list(sizes_key),
            }
        )

    def _from_earlier_process(self, options: Options, sizes_key: tuple, name: str) -> _Compiled | None:
        """The kernel an earlier process generated for the same request, straight from the
        cache: no dependences, scheduling or code generation (see polyc.runtime.cache)."""
        key = self._request(options, sizes_key)
        found = find_request(key, compiler_options(options)) if key else None
        if found is None:
            return None
        source, call = found
        try:
            kernel = GeneratedKernel(
                call["function_name"], source, tuple(call["tensor_arguments"]), tuple(call["size_arguments"])
            )
        except (KeyError, TypeError):
            return None
        return _Compiled(kernel, options, name)

    def _remember(self, options: Options, sizes_key: tuple, kernel: GeneratedKernel) -> None:
        key = self._request(options, sizes_key)
        if key:
            remember_request(
                key,
                kernel.source,
                compiler_options(options),
                {
                    "function_name": kernel.function_name,
                    "tensor_arguments": list(kernel.tensor_arguments),
                    "size_arguments": list(kernel.size_arguments),
                },
            )

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

    def repeat_plan(self, call: BoundCall) -> RepeatCall:
        """A call like ``call`` (same input shapes and dtypes, C-contiguous inputs, fresh
        outputs) without the checks and lookups that ``call`` has passed: see :class:`RepeatCall`."""
        return RepeatCall(self.definition, self.compiled_for(call.sizes), call)


@dataclass(frozen=True)
class BuildSummary:
    """What :func:`build_ahead` did: kernels ``built`` now (``compile_seconds`` of compiler time
    among them), found ``cached`` (in the disk cache or compiled in this process), ``failed``
    (left to their calls, which report the error), in ``seconds`` of wall time."""

    built: int = 0
    cached: int = 0
    failed: int = 0
    compile_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def kernels(self) -> int:
        return self.built + self.cached + self.failed


def build_ahead(
    calls: Iterable[tuple],
    jobs: int | None = None,
    *,
    progress: bool | None = None,
    description: str = "polyc: compiling",
) -> BuildSummary:
    """Build the libraries of several kernel calls at once, before they are made: each call's C
    is generated in this thread, in turn, while the C compiler builds those before it on ``jobs``
    threads (default: the processors this process may use); the calls then find them in the
    cache.  ``calls``: (kernel, sizes) or (kernel, sizes, name) tuples, the kernels
    :class:`CompiledKernel` or :class:`polyc.api.Kernel`, the name what the log and the progress
    bar call the kernel (default: its def's).  Most of a model's cold compile is the C compiler's
    (the ``cold_compile`` of ``python -m benchmarks.onnx_bench``,
    ``benchmarks/results/zen4_onnx.json``), which one thread left to one processor.  A kernel
    that fails to generate or build is left to its call, which reports the error.

    ``progress``: a bar over the kernels (:func:`polyc.runtime.progress.progress_wanted`: by
    default where the output is a terminal or a notebook, unless ``POLYC_PROGRESS=0``), shown
    from the first kernel that has to be built (a compile found all in the cache shows none)."""
    calls = list(calls)
    started = time.perf_counter()
    show = progress_wanted(progress)
    bar = None
    done = [0]
    counts = {"built": 0, "cached": 0, "failed": 0}
    compile_seconds = [0.0]
    tally = threading.Lock()

    def finished(outcome: str, seconds: float = 0.0) -> None:
        with tally:
            counts[outcome] += 1
            compile_seconds[0] += seconds
            done[0] += 1
        if bar is not None:
            bar.update(1)

    def build_done(future: Future) -> None:
        try:
            fetched = future.result()
        except Exception:  # a failed build, or one cancelled (Ctrl-C): the call builds it
            finished("failed")
        else:
            finished("built" if fetched.built else "cached", fetched.seconds)

    builders = ThreadPoolExecutor(max_workers=jobs or usable_cores(), thread_name_prefix="polyc-build")
    try:
        builds = []
        for kernel, sizes, *named in calls:
            name = named[0] if named else getattr(kernel, "name", "") or ""
            try:
                library = kernel.library_to_build(sizes, name=name)
            except PolycError:
                finished("failed")
                continue
            if library is None:
                finished("cached")
                continue
            if bar is None and show:
                bar = progress_bar(len(calls), description, initial=done[0])
            if bar is not None:
                bar.set_postfix_str(name, refresh=False)
            future = builders.submit(fetch_library, *library, name=name)
            future.add_done_callback(build_done)
            builds.append(future)
        for build in builds:
            try:
                build.result()
            except PolycError:
                pass
    finally:  # interrupted (Ctrl-C): the builds not yet started are dropped
        builders.shutdown(cancel_futures=True)
        if bar is not None:
            bar.set_postfix_str("", refresh=False)
            bar.close()
    summary = BuildSummary(
        counts["built"], counts["cached"], counts["failed"], compile_seconds[0], time.perf_counter() - started
    )
    if summary.kernels:
        logger.info(
            "%d kernel(s) in %.2f s: %d built (%.2f s of compiler time on %d threads), %d from cache%s",
            summary.kernels,
            summary.seconds,
            summary.built,
            summary.compile_seconds,
            jobs or usable_cores(),
            summary.cached,
            f", {summary.failed} left to their calls (they failed to generate or build)" if summary.failed else "",
        )
    return summary


class RepeatCall:
    """The C function, the sizes and the output and temporary allocations of one argument
    signature, resolved once.  Calling it with inputs of that signature (checked by the caller,
    :class:`polyc.api.Kernel`, outputs by :meth:`outputs_fit`) costs about half a checked call,
    most of a tiny kernel's time.
    """

    def __init__(self, definition: CheckedDef, compiled: _Compiled, call: BoundCall):
        self.definition = definition
        self.function = compiled.function
        #: the C function's address (see :mod:`polyc.runtime.sequence`)
        self.address = compiled.address
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
                self.arguments.append(
                    (
                        call.shapes[name],
                        definition.tensor(name).dtype,
                        name in call.written_before_read,
                        outputs.get(name),
                    )
                )
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
            if (
                type(array) is not np.ndarray
                or array.shape != shape
                or array.dtype != dtype
                or not array.flags.c_contiguous
                or not array.flags.writeable
            ):
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
        raise BoundsError(
            f"{definition.name}: a data-dependent subscript fell outside its tensor "
            f"(an index array holds a value out of range)"
        )
