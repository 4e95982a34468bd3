"""What a kernel path is: the record each path module registers, and what it is given.

A *kernel path* is one way of turning a checked def into code: the generic polyhedral loop
nest, the BLIS-style gemm kernel, the direct convolution kernel, the GPU mapping, ...  Each is a
module of :mod:`polyc.paths` that builds one :class:`KernelPath`:

- ``recognise(request)``: the match (whatever the generator needs: a
  :class:`~polyc.schedule.contraction.Contraction`, a
  :class:`~polyc.schedule.convolution.Convolution`, ...) or None when the path does not apply;
- ``generate(request, match)``: the kernel, as a :class:`PathKernel`;
- ``explain(stages)``: sentences saying what the path did and which options change it;
- ``tuning``: a :class:`Tuning`, what :func:`polyc.tune` may search on this path;
- ``options``: the :class:`~polyc.options.Options` fields the path reads; among the block
  options (:data:`polyc.options.BLOCK_OPTIONS`), a def given one its path does not read is
  refused (:func:`polyc.paths.settle_options`);
- ``tile_alias``: what the deprecated ``tile_sizes`` option means on the path.

The driver (:func:`polyc.driver.compile_stages`), the tuner (:func:`polyc.tuning.space.space_for`)
and :func:`polyc.viz.explain` ask the same registry, so the three always agree on the path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from polyc.codegen.c import GeneratedKernel
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram
from polyc.lang.checked import CheckedDef
from polyc.options import Options
from polyc.runtime.compiler import compiler_options, vector_bits
from polyc.schedule.contraction import Contraction, recognise_gemm_def, worth_a_gemm_kernel
from polyc.schedule.convolution import Convolution, recognise_conv_def
from polyc.schedule.transform import optimize_schedule

Config = dict[str, Any]  # knob values: ints, bools and strings


class PathRequest:
    """One def to compile with some options, at some sizes (None: parametric).

    Recognisers read ``definition``, ``options`` and ``sizes`` only, so the tuner can ask which
    path a def takes without building its program (``program`` and the analysis are then None).
    Facts several paths recognise from (the def's contraction, its convolution) are computed
    once per request (:meth:`memo`).
    """

    def __init__(
        self,
        definition: CheckedDef,
        options: Options,
        sizes: Mapping[str, int] | None,
        program: PolyProgram | None = None,
        dependences: Dependences | None = None,
        schedule: isl.Schedule | None = None,
        compile_part: Callable[[CheckedDef], Any] | None = None,
    ):
        self.definition = definition
        self.options = options
        self.sizes = sizes
        self.program = program
        self.dependences = dependences
        self.schedule = schedule
        #: Compiles a part of the def (a segment) through the whole pipeline, returning its stages.
        self.compile_part = compile_part
        #: The loop-nest decisions :func:`optimize_schedule` made (per band), once it has run.
        self.decisions: list = []
        self._optimized: isl.Schedule | None = None
        self._memo: dict[str, object] = {}

    def memo(self, key: str, compute: Callable[[], object]) -> Any:
        """``compute()``, computed once per request under ``key``."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def built_program(self) -> PolyProgram:
        """The def's program: a request to generate code always has one (recognisers may be
        asked without it)."""
        assert self.program is not None, "code is generated only for a request with the def's program"
        return self.program

    def optimized_schedule(self) -> isl.Schedule:
        """The schedule tiled and marked for the CPU (:func:`optimize_schedule`), computed once."""
        if self._optimized is None:
            assert self.schedule is not None, "a schedule is optimised only for a request with one"
            self._optimized = optimize_schedule(
                self.schedule,
                self.built_program,
                self.options,
                self.dependences,
                self.decisions,
                vector_bits=vector_bits(compiler_options(self.options)),
            )
        return self._optimized


@dataclass(frozen=True)
class PathKernel:
    """What a path generated: the kernel, and what :class:`polyc.driver.Stages` keeps of its match."""

    kernel: GeneratedKernel
    contraction: Contraction | None = None
    convolution: Convolution | None = None
    segments: tuple = ()  # the segments' stages, for a def compiled in parts
    packing: tuple = ()  # a gemm kernel's packing statements, per register block
    schedule: isl.Schedule | None = None  # the schedule the code follows, where not the CPU's tiled one
    gpu: object = None  # for the GPU back ends: the launches' mapping (GpuPlan)
    gpu_source: object = None  # ... and their code (GpuKernelSource)


@dataclass(frozen=True)
class Knob:
    """One choice the tuner makes: its name and its values (the first is not special)."""

    name: str
    choices: tuple
    numeric: bool = True  # features use log2(value) (each non-positive value: its own flag)


@dataclass(frozen=True)
class SpaceRequest:
    """What a path's tuning space depends on: the def and its sizes, the options, the largest
    statement's indices and loop extents (outermost first), and the instruction set whose
    register blocks the build holds (a function: finding it may ask the C compiler)."""

    definition: CheckedDef
    sizes: Mapping[str, int]
    options: Options
    match: Any  # what the path's recogniser returned
    indices: tuple[str, ...]
    extents: tuple[int, ...]
    instruction_set: Callable[[], str]


class Tuning:
    """What :func:`polyc.tune` may change on a path; this base class: nothing (the thread
    count, which every path has, is the tuner's own).  A configuration is a dict knob -> value."""

    def knobs(self, request: SpaceRequest) -> tuple[tuple[Knob, ...], Config]:
        """The knobs and polyc's own choice of each (the default configuration)."""
        return (), {}

    def option_changes(self, config: Config) -> dict:
        """The ``polyc.define`` options ``config`` stands for (only those unlike the defaults)."""
        return {}

    def unused(self, config: Config, knobs: tuple[Knob, ...]) -> set[str]:
        """Knobs that ``config``'s other knobs make meaningless (:meth:`option_changes` ignores them)."""
        return set()

    def block_bytes(self, config: Config, itemsize: int, extents: tuple[int, ...]) -> tuple[float, float, float] | None:
        """Bytes of the blocks ``config`` makes, held in L1, L2 and L3 (None: no blocks to speak of)."""
        return None


@dataclass(frozen=True)
class KernelPath:
    """One way of compiling a def (see the module docstring)."""

    name: str
    backends: tuple[str, ...]
    recognise: Callable[[PathRequest], object]
    generate: Callable[[PathRequest, Any], PathKernel]
    explain: Callable[[Any], list[str]]
    options: tuple[str, ...] = ()
    tuning: Tuning = field(default_factory=Tuning)
    #: Whether the code that runs is the loop nest of the tiled schedule (the generic path's):
    #: then explanations and pictures of the schedule's loops describe the code.
    runs_schedule_loops: bool = False
    #: What the deprecated ``tile_sizes`` means on this path: its sizes -> this path's own block
    #: options (None: the path takes no sizes, and ``tile_sizes`` is ignored).
    tile_alias: Callable[[tuple[int, ...]], dict] | None = None
    #: Whether the path compiles parts of the def through the whole pipeline, each choosing its
    #: own path with the def's options (the parts, not this path, read the block options).
    compiles_parts: bool = False
    #: Whether the path compiles defs with sequential loops (recurrences): only those that keep
    #: the dependences of the def's polyhedral model do.
    sequential_loops: bool = False


def blas_contraction(request: PathRequest) -> Contraction | None:
    """The contraction the gemm and gemv paths compile ``request``'s def as, or None."""

    def find() -> Contraction | None:
        options = request.options
        if options.backend != "c" or not options.blas_contractions:
            return None
        contraction = recognise_gemm_def(request.definition)
        return contraction if contraction is not None and worth_a_gemm_kernel(contraction) else None

    return request.memo("blas_contraction", find)


def direct_convolution(request: PathRequest) -> Convolution | None:
    """The convolution the convolution paths compile ``request``'s def as, or None."""

    def find() -> Convolution | None:
        options = request.options
        if options.backend != "c" or not options.direct_convolutions:
            return None
        return recognise_conv_def(request.definition)

    return request.memo("convolution", find)
