"""The machines polyc builds for and runs on: every fact polyc reads of them, in one place.

Three kinds of facts live here and nowhere else:

* **The processor this process runs on** (:func:`host`): its instruction-set flags, identity,
  caches and usable cores, read once from Linux's ``/proc/cpuinfo`` and sysfs.  No other module
  opens those files or asks the operating system for the processor count.
* **Instruction sets** (:data:`INSTRUCTION_SETS`): each set's vector width, registers, intrinsics
  header and the C preprocessor condition that selects its code in generated C.  The gemm,
  convolution, depthwise, Winograd and gemv kernels hold one code path per set behind these
  guards, so one C text serves every machine and the compiler's flags choose.
* **A** :class:`Target`: what generated code is built for: the C compiler and its flags, the vector
  width, the caches tiles and blocks are sized for, and, for GPU back ends, a device model
  (:data:`DEVICE_MODELS`).  :func:`target_of` makes the target of a kernel's
  :class:`~polyc.options.Options`; :data:`TARGETS` are the named targets of exported C.

This module imports nothing of polyc but its errors, so every layer can receive a Target.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from polyc.errors import CompilationError, PolycError

if TYPE_CHECKING:
    from polyc.options import Options


# ----------------------------------------------------------------------------- the processor
_CPUINFO = Path("/proc/cpuinfo")
_CACHE_DIRECTORY = Path("/sys/devices/system/cpu/cpu0/cache")

#: Caches assumed where sysfs does not describe them (L1d, L2 per core, L3), in bytes.
DEFAULT_CACHES = (32 * 1024, 1024 * 1024, 8 * 1024 * 1024)
#: L1's size over its ways where sysfs does not say: a page, as in every x86 L1 of the last decade.
PAGE_BYTES = 4096


@dataclass(frozen=True)
class Processor:
    """The processor this process runs on, as Linux describes it.

    ``cpuinfo`` holds the first processor's ``/proc/cpuinfo`` fields (empty elsewhere); ``flags``
    its feature flags (x86 ``flags``, ARM ``Features``); ``caches`` the L1 data, L2 and L3 sizes
    in bytes; ``l1_set_span`` the bytes between two addresses that share a set of L1.
    """

    machine: str
    cpuinfo: Mapping[str, str]
    flags: frozenset[str]
    caches: tuple[int, int, int]
    l1_set_span: int
    #: A short identity of the processor: machine type plus a hash of its model and feature
    #: lines (what ``-march=native`` builds depend on).
    digest: str

    @property
    def model(self) -> str:
        """The model name (on ARM, the implementer and part), or "unknown"."""
        return (
            self.cpuinfo.get("model name")
            or " ".join(f"{key} {self.cpuinfo[key]}" for key in ("CPU implementer", "CPU part") if key in self.cpuinfo)
            or platform.processor()
            or "unknown"
        )

    @property
    def vector_bits(self) -> int:
        """The widest vector registers with FMA this processor has: 512, 256, 128 (NEON) or 0."""
        if self.machine in ("aarch64", "arm64"):
            return 128
        return 512 if "avx512f" in self.flags else 256 if {"avx2", "fma"} <= self.flags else 0


@functools.cache
def host() -> Processor:
    """The processor this process runs on (read once)."""
    fields: dict[str, str] = {}
    identity: dict[str, str] = {}
    try:
        with _CPUINFO.open(encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor's block is enough
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
                if name.strip() in _IDENTITY_FIELDS:
                    identity.setdefault(name.strip(), line.strip())
    except OSError:  # not Linux: the processor string is the best cheap description
        identity["processor"] = platform.processor()
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    digest = hashlib.sha256("\n".join(sorted(identity.values())).encode()).hexdigest()[:16]
    return Processor(
        platform.machine(), fields, flags, _read_caches(), _read_l1_set_span(), f"{platform.machine()} {digest}"
    )


#: The /proc/cpuinfo lines a processor's digest is made of.
_IDENTITY_FIELDS = ("model name", "flags", "Features", "CPU implementer", "CPU part")


def _read_caches() -> tuple[int, int, int]:
    sizes = dict(zip((1, 2, 3), DEFAULT_CACHES))
    try:
        for entry in _CACHE_DIRECTORY.glob("index*"):
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            level = int((entry / "level").read_text())
            text = (entry / "size").read_text().strip().upper()
            factor = {"K": 1024, "M": 1024 * 1024}.get(text[-1], 1)
            sizes[level] = int(text.rstrip("KM")) * factor
    except (OSError, ValueError):
        pass
    return sizes[1], sizes[2], sizes[3]


def _read_l1_set_span() -> int:
    for entry in _CACHE_DIRECTORY.glob("index*"):
        try:
            if (entry / "level").read_text().strip() == "1" and (entry / "type").read_text().strip() != "Instruction":
                sets = int((entry / "number_of_sets").read_text())
                line = int((entry / "coherency_line_size").read_text())
                if sets > 0 and line > 0:
                    return sets * line
        except (OSError, ValueError):
            pass
    return PAGE_BYTES


def usable_cores() -> int:
    """The processors this process may run on now (its affinity mask can change)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- instruction sets
@dataclass(frozen=True)
class InstructionSet:
    """One instruction set generated C has a code path for.

    ``condition`` is the C preprocessor condition under which the compiler's flags enable it
    (None: the portable code, always available); ``header`` declares its intrinsics.
    """

    name: str
    vector_bits: int
    vector_registers: int
    condition: str | None
    header: str | None


#: The instruction sets, best first; ``portable`` is plain C that every compiler builds.
INSTRUCTION_SETS: dict[str, InstructionSet] = {
    "avx512": InstructionSet("avx512", 512, 32, "defined(__AVX512F__)", "immintrin.h"),
    "avx2": InstructionSet("avx2", 256, 16, "defined(__AVX2__) && defined(__FMA__)", "immintrin.h"),
    "neon": InstructionSet("neon", 128, 32, "defined(__aarch64__) && defined(__ARM_NEON)", "arm_neon.h"),
    "portable": InstructionSet("portable", 0, 0, None, None),
}


#: The instruction sets integer (8-bit) matrix products have code for, best first
#: (:mod:`polyc.codegen.integer_gemm`): byte dot products (AVX-512 VNNI, AVX-VNNI, Arm's dot
#: product extension), AVX2 and NEON on int16, and portable C.
INTEGER_DOT_PRODUCT_SETS: dict[str, InstructionSet] = {
    "avx512vnni": InstructionSet(
        "avx512vnni",
        512,
        32,
        "defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)",
        "immintrin.h",
    ),
    "avxvnni": InstructionSet("avxvnni", 256, 16, "defined(__AVXVNNI__) && defined(__AVX2__)", "immintrin.h"),
    "avx2": InstructionSet("avx2", 256, 16, "defined(__AVX2__)", "immintrin.h"),
    "neon_dotprod": InstructionSet(
        "neon_dotprod", 128, 32, "defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)", "arm_neon.h"
    ),
    "neon": InstructionSet("neon", 128, 32, "defined(__aarch64__) && defined(__ARM_NEON)", "arm_neon.h"),
    "portable": InstructionSet("portable", 0, 0, None, None),
}


def isa_guards(names: Iterable[str], portable_macro: str) -> dict[str, str | None]:
    """The preprocessor guard of each named instruction set's code in one kernel family, best
    first, ending with ``portable`` (None).  Defining ``portable_macro`` forces the portable
    code (the tests build it so on every machine)."""
    guards: dict[str, str | None] = {}
    for name in names:
        condition = INSTRUCTION_SETS[name].condition
        if condition is not None:
            guards[name] = f"!defined({portable_macro}) && {condition}"
    guards["portable"] = None
    return guards


def instruction_set_of(flags: Iterable[str], machine: str) -> str:
    """The instruction set whose code runs on a processor with these ``/proc/cpuinfo`` flags."""
    flags = set(flags)
    if "avx512f" in flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    return "neon" if machine in ("aarch64", "arm64") and "asimd" in flags else "portable"


# ----------------------------------------------------------------------------- the C compiler
#: The optimisation/architecture part of the default flags; ``$POLYC_CFLAGS`` replaces it.
DEFAULT_OPTIMISATION_FLAGS: tuple[str, ...] = ("-O3", "-march=native")
#: The dialect generated code is written in (C99 plus GNU extensions such as ``__restrict__``).
#: Generated code never reads ``errno``, so math functions need not set it: without the check
#: gcc vectorises ``sqrt`` (results are the same, IEEE square roots either way).  Nor does it
#: read floating-point exception flags: without -fno-trapping-math gcc turns a clamp's selects
#: back into branches it cannot vectorise wherever the clamped value has two uses (a requantized
#: tensor stored and read back ran scalar; tests/test_vector_math.py), and results are the same.
LANGUAGE_FLAGS: tuple[str, ...] = ("-std=gnu11", "-fno-math-errno", "-fno-trapping-math")
#: Compilers tried, in order, when neither ``$POLYC_CC`` nor ``$CC`` is set.
FALLBACK_COMPILERS: tuple[str, ...] = ("gcc", "cc", "clang")

#: (program, $PATH) -> its path, for programs found: every cache lookup resolves the compiler.
_found_programs: dict[tuple[str, str | None], str] = {}


def find_program(program: str) -> str | None:
    """``shutil.which(program)``, remembered once found for the same ``$PATH``."""
    key = (program, os.environ.get("PATH"))
    found = _found_programs.get(key)
    if found is None:
        found = shutil.which(program)
        if found is not None:
            _found_programs[key] = found
    return found


def default_compiler() -> str | None:
    """``$POLYC_CC``, else ``$CC``, else the first of :data:`FALLBACK_COMPILERS` on ``PATH``."""
    for variable in ("POLYC_CC", "CC"):
        value = os.environ.get(variable, "").strip()
        if value:
            return value
    for name in FALLBACK_COMPILERS:
        if find_program(name):
            return name
    return None


def shell_words(text: str, what: str) -> list[str]:
    """``text`` split as a shell splits it; a CompilationError naming ``what`` (the variable or
    option it came from) where it cannot be (an unbalanced quote)."""
    try:
        return shlex.split(text)
    except ValueError as error:
        raise CompilationError(
            f"{what}={text!r} cannot be split into words as a shell would ({error}): an unbalanced quote?"
        ) from error


def default_optimisation_flags() -> tuple[str, ...]:
    """``$POLYC_CFLAGS`` split like a shell word list, else :data:`DEFAULT_OPTIMISATION_FLAGS`."""
    override = os.environ.get("POLYC_CFLAGS", "").strip()
    return tuple(shell_words(override, "POLYC_CFLAGS")) if override else DEFAULT_OPTIMISATION_FLAGS


# ----------------------------------------------------------------------------- GPU devices
@dataclass(frozen=True)
class DeviceModel:
    """What the GPU mapping needs to know of a device.

    A model is named (``device="sm_80"``) or, by default, read from the device the back end runs
    on (pyopencl's or pycuda's device queries, :func:`polyc.runtime.gpu.query_device`); where
    none exists (exporting CUDA on a machine without a GPU) the back end's named default is used.
    """

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
    """The device model called ``name``; PolycError naming the models otherwise."""
    try:
        return DEVICE_MODELS[name]
    except KeyError:
        raise PolycError(f"unknown device model {name!r}; the named models are: {', '.join(DEVICE_MODELS)}") from None


# ----------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """A machine to build generated code for.

    ``cc`` is None for the host's compiler (:func:`default_compiler`), or a cross compiler.
    ``flags`` are the optimisation and instruction-set flags; the language flags
    (:data:`LANGUAGE_FLAGS`) and ``-fopenmp`` are added when building.  ``vector_bits`` is the
    width of one SIMD register.  ``cache_sizes`` (L1, L2, L3 in bytes) are the caches tile and
    block sizes are chosen for; None: this machine's.  ``device`` names the GPU device model
    (None: the device the back end finds, else its default).
    """

    name: str
    description: str
    machine: str  # platform.machine() of the CPUs that run the code; "" for any
    cc: str | None
    flags: tuple[str, ...]
    vector_bits: int
    cache_sizes: tuple[int, int, int] | None = None
    device: str | None = None

    @property
    def caches(self) -> dict[int, int]:
        """Data/unified cache size in bytes per level (1, 2, 3) that tiles are sized for."""
        return dict(zip((1, 2, 3), self.cache_sizes if self.cache_sizes is not None else host().caches))

    @property
    def l1_set_span(self) -> int:
        """Bytes between two addresses in one set of L1: this machine's for its own caches, a
        page for caches given by number (another machine's, whose ways are not known)."""
        return host().l1_set_span if self.cache_sizes is None else PAGE_BYTES

    def c_compiler(self) -> str:
        """The compiler command: the cross compiler, or the host's default."""
        return self.cc or default_compiler() or "cc"

    def build_flags(self, openmp: bool = True) -> list[str]:
        """Every flag generated C is built with: ``flags``, the language standard, OpenMP."""
        return [*self.flags, *LANGUAGE_FLAGS, *(["-fopenmp"] if openmp else [])]

    def compile_command(self, sources: Iterable[str], output: str, *extra: str, openmp: bool = True) -> list[str]:
        """The command that builds and links ``sources`` into ``output`` (``extra``: ``-static``...)."""
        return [*self.c_compiler().split(), *self.build_flags(openmp), *extra, "-o", output, *sources, "-lm"]


#: The caches an aarch64 export is blocked for, whatever the exporting machine has: a conservative
#: model of common cores (Cortex-A72/A76, Neoverse): 32 KiB L1d and 512 KiB L2 per core, 2 MiB L3.
#: Larger caches only make these blocks a little small; an x86 server's (2 MiB L2, hundreds of
#: MiB of L3) would make them overflow a phone's or a Raspberry Pi's.
_AARCH64_CACHES = (32 * 1024, 512 * 1024, 2 * 1024 * 1024)

#: The named targets of exported C (``host`` is this machine: :func:`host_target`).
TARGETS: dict[str, Target] = {
    "avx512": Target(
        "avx512",
        "x86-64 with AVX-512 (512-bit vectors, FMA)",
        "x86_64",
        None,
        ("-O3", "-mavx512f", "-mavx512vl", "-mfma"),
        512,
    ),
    "avx2": Target("avx2", "x86-64 with AVX2 (256-bit vectors, FMA)", "x86_64", None, ("-O3", "-mavx2", "-mfma"), 256),
    "generic": Target(
        "generic", "portable C, no instruction-set flags (the compiler's baseline)", "", None, ("-O3",), 128
    ),
    "neon": Target(
        "neon",
        "aarch64 with Advanced SIMD (NEON, 128-bit vectors)",
        "aarch64",
        "aarch64-linux-gnu-gcc",
        ("-O3", "-march=armv8-a+simd"),
        128,
        _AARCH64_CACHES,
    ),
    # Armv8.2-A's dot products (sdot/udot: the integer kernels' 8-bit products) and half-precision
    # arithmetic: Cortex-A55/A75 and later, Neoverse N1 and later, Apple M1 and later.
    "neon-dotprod": Target(
        "neon-dotprod",
        "aarch64 with NEON, the dot product and fp16 extensions (Armv8.2-A: Cortex-A55/A75 and later)",
        "aarch64",
        "aarch64-linux-gnu-gcc",
        ("-O3", "-march=armv8.2-a+dotprod+fp16"),
        128,
        _AARCH64_CACHES,
    ),
}
TARGET_NAMES = ("host", *TARGETS)


def get_target(name: str | Target) -> Target:
    """The target named ``name`` (one of :data:`TARGET_NAMES`); a Target is returned as is."""
    if isinstance(name, Target):
        return name
    if name == "host":
        return host_target()
    if name not in TARGETS:
        raise PolycError(f"unknown target {name!r}; the targets are: {', '.join(TARGET_NAMES)}")
    return TARGETS[name]


@functools.cache
def host_target() -> Target:
    """What the runtime builds for by default: this machine, ``-march=native``."""
    processor = host()
    return Target(
        "host",
        f"this machine ({processor.machine}, -march=native)",
        processor.machine,
        None,
        DEFAULT_OPTIMISATION_FLAGS,
        processor.vector_bits or 128,
    )


def target_of(options: Options | None) -> Target:
    """The target a kernel with these options is built for: this machine, with the options'
    compiler, flags (``cflags``, else ``$POLYC_CFLAGS``), caches and GPU device where given."""
    base = host_target()
    if options is None:
        return base
    return replace(
        base,
        cc=options.cc,
        flags=tuple(options.cflags) if options.cflags is not None else default_optimisation_flags(),
        cache_sizes=options.cache_sizes,
        device=options.device,
    )
