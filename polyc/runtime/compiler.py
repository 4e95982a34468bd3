"""Turn generated C text into a shared library by running the system C compiler.

The compiler and its flags are one immutable :class:`CompilerOptions` record.  Its
:meth:`~CompilerOptions.fingerprint` names everything that can change the bytes of the built
library, so the kernel cache can key entries on it.

Defaults, read from the environment when a ``CompilerOptions`` is created:

``cc``
    ``$POLYC_CC``, else ``$CC``, else the first of ``gcc``, ``cc``, ``clang`` found on ``PATH``.
    The value may carry a launcher or fixed arguments (``"ccache gcc"``); it is split like a
    shell word list and the first word is the program.
``flags``
    The optimisation/architecture part, ``-O3 -march=native``, followed by the language flags
    ``-std=gnu11 -fno-math-errno -fno-trapping-math``.  A non-empty ``$POLYC_CFLAGS`` replaces the
    optimisation/architecture part only, so ``POLYC_CFLAGS="-O2 -g"`` gives
    ``flags == ("-O2", "-g", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math")``.

Every command line also carries ``-fPIC -shared`` (the output must be a loadable library, so
these are not options), ``-fopenmp`` when ``openmp`` is true, then ``extra_flags``, and links
``-lm``.  With all defaults the command is::

    gcc -fPIC -shared -O3 -march=native -std=gnu11 -fno-math-errno -fno-trapping-math -fopenmp -o kernel.so kernel.c -lm
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from polyc.errors import CompilationError
from polyc.target import (
    FALLBACK_COMPILERS,
    INSTRUCTION_SETS,
    LANGUAGE_FLAGS,
    InstructionSet,
    default_compiler,
    default_optimisation_flags,
    find_program,
    host,
    shell_words,
)

#: Flags without which the output is not a shared library ctypes can load.
REQUIRED_FLAGS: tuple[str, ...] = ("-fPIC", "-shared")
#: Libraries linked after the source; generated code may call ``<math.h>`` functions.
LINK_LIBRARIES: tuple[str, ...] = ("-lm",)
#: Seconds a single compilation may take before it is abandoned.
DEFAULT_TIMEOUT = 300.0
#: How much compiler output a CompilationError quotes; the first errors are the useful ones.
MAX_DIAGNOSTIC_LINES = 60
MAX_DIAGNOSTIC_CHARS = 8000


def _default_flags() -> tuple[str, ...]:
    return default_optimisation_flags() + LANGUAGE_FLAGS


@dataclass(frozen=True)
class CompilerOptions:
    """Which C compiler builds kernels, and with which flags.

    ``cc=None`` and ``flags=None`` mean the defaults described in the module docstring (from
    ``$POLYC_CC``, ``$CC`` and ``$POLYC_CFLAGS``); they are filled in when the record is made, so
    ``cc`` is None afterwards only if no compiler could be found.

    >>> options = CompilerOptions(cc="gcc", flags=("-O2",), openmp=False)
    >>> options.command("kernel.c", "kernel.so")
    ['gcc', '-fPIC', '-shared', '-O2', '-o', 'kernel.so', 'kernel.c', '-lm']
    """

    cc: str | None = None
    flags: tuple[str, ...] | None = None
    #: Appended after ``flags``, e.g. ``("-fsanitize=address,undefined",)``.
    extra_flags: tuple[str, ...] = ()
    openmp: bool = True

    def __post_init__(self) -> None:
        # object.__setattr__ because the record is frozen; tuples keep it hashable if given lists.
        object.__setattr__(self, "cc", self.cc if self.cc is not None else default_compiler())
        object.__setattr__(self, "flags", tuple(self.flags) if self.flags is not None else _default_flags())
        object.__setattr__(self, "extra_flags", tuple(self.extra_flags))

    def compiler_words(self) -> list[str]:
        """``cc`` split into words, the first being the program; CompilationError if unset."""
        source = next(
            (name for name in ("POLYC_CC", "CC") if self.cc and os.environ.get(name, "").strip() == self.cc), "cc"
        )
        words = shell_words(self.cc, source) if self.cc else []
        if not words:
            raise CompilationError(
                "no C compiler found: none of " + ", ".join(FALLBACK_COMPILERS) + " is on PATH "
                "and neither POLYC_CC nor CC is set; install one or set POLYC_CC to a C compiler"
            )
        return words

    def all_flags(self) -> list[str]:
        """Every flag between the compiler and ``-o``, in command-line order."""
        return [*REQUIRED_FLAGS, *(self.flags or ()), *(["-fopenmp"] if self.openmp else []), *self.extra_flags]

    def command(self, source: str | os.PathLike, output: str | os.PathLike, header: Path | None = None) -> list[str]:
        """The full argument list that compiles ``source`` into the shared library ``output``;
        with ``header``, a header included before the source (a precompiled one beside it is
        read instead of its text when the compiler can: see :func:`precompile_header`)."""
        before = ["-I", str(header.parent), "-include", header.name] if header is not None else []
        return [*self.compiler_words(), *self.all_flags(), *before, "-o", str(output), str(source), *LINK_LIBRARIES]

    def uses_gcc(self) -> bool:
        """Whether the compiler is GCC (whose precompiled headers :func:`precompile_header` makes)."""
        try:
            version = _compiler_version(tuple(self.compiler_words()))
        except CompilationError:
            return False
        return "gcc" in version.lower() and "clang" not in version.lower()

    def resolved_compiler(self) -> str:
        """Absolute path of the compiler program; CompilationError if it cannot be run."""
        program = self.compiler_words()[0]
        path = find_program(program)
        if path is None:
            raise CompilationError(
                f"C compiler {program!r} was not found or is not executable; "
                "set POLYC_CC (or CompilerOptions(cc=...)) to a working C compiler"
            )
        return os.path.abspath(path)

    def fingerprint(self) -> str:
        """A stable text naming everything that decides the built library's bytes: the compiler's
        path and ``--version`` line, the flags and, for ``*=native`` flags, the host CPU."""
        words = self.compiler_words()
        parts = [
            shlex.join([self.resolved_compiler(), *words[1:]]),
            _compiler_version(tuple(words)),
            shlex.join([*self.all_flags(), *LINK_LIBRARIES]),
        ]
        # -march=native code can fault on another CPU, e.g. a cache in a home directory shared by
        # the nodes of a cluster, so such builds are keyed on the host CPU as well.
        if any("=native" in flag for flag in self.all_flags()):
            parts.append("host " + host().digest)
        return "\n".join(parts)


@functools.cache
def compiler_options(options) -> CompilerOptions:
    """The compiler settings for :class:`polyc.options.Options` (``cflags`` replace the
    optimisation flags; the language standard and OpenMP stay)."""
    flags = None if options.cflags is None else tuple(options.cflags) + LANGUAGE_FLAGS
    return CompilerOptions(cc=options.cc, flags=flags, openmp=True)


def _compiler_version(compiler_words: tuple[str, ...]) -> str:
    """First line of ``cc --version``, memoised because every cache lookup needs it."""
    command = [*compiler_words, "--version"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilationError(f"cannot run the C compiler ({shlex.join(command)}): {error}") from error
    lines = (result.stdout or result.stderr).strip().splitlines()
    if result.returncode != 0 or not lines:
        raise CompilationError(
            f"the C compiler does not answer {shlex.join(command)} (exit status {result.returncode}); "
            "set POLYC_CC to a working C compiler"
        )
    return lines[0].strip()


def vector_bits(options: CompilerOptions | None = None) -> int:
    """The width in bits of the SIMD registers that code built with ``options`` computes in, as
    the compiler's preprocessor tells it (the macros the intrinsic micro-kernels are chosen by):
    512 with ``__AVX512F__``, 256 with ``__AVX2__`` and ``__FMA__``, 128 with AArch64's NEON,
    else 0 (portable C).  Decisions that depend on the register block (weights blocked as the
    gemm kernel reads them) follow the build, not the processor: ``POLYC_CFLAGS="-O3 -mavx2
    -mfma"`` on an AVX-512 machine builds the AVX2 kernels, which read 16-wide slivers of B, not
    64-wide ones.  Where the compiler cannot be asked, this machine's own width."""
    options = options if options is not None else CompilerOptions()
    try:
        words = tuple(options.compiler_words())
    except CompilationError:
        return host().vector_bits
    return _preprocessor_vector_bits(words, tuple(options.flags or ()) + tuple(options.extra_flags))


def _preprocessor_vector_bits(compiler_words: tuple[str, ...], flags: tuple[str, ...]) -> int:
    macros = _predefined_macros(compiler_words, flags)
    if macros is None:
        return host().vector_bits
    if "__AVX512F__" in macros:
        return 512
    if {"__AVX2__", "__FMA__"} <= macros:
        return 256
    if {"__aarch64__", "__ARM_NEON"} <= macros:
        return 128
    return 0


@functools.cache
def _predefined_macros(compiler_words: tuple[str, ...], flags: tuple[str, ...]) -> frozenset[str] | None:
    """The macros the compiler predefines with ``flags``, or None when it cannot be asked."""
    command = [*compiler_words, *flags, "-dM", "-E", "-x", "c", os.devnull]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    return frozenset(line.split()[1] for line in result.stdout.splitlines() if line.startswith("#define "))


def built_instruction_set(options, sets: Mapping[str, InstructionSet] = INSTRUCTION_SETS) -> str | None:
    """The first of ``sets`` (:data:`polyc.target.INSTRUCTION_SETS`, best first, or another
    family's) whose preprocessor condition holds when a kernel is built with ``options``
    (:class:`polyc.options.Options`): the code path of a kernel's ``#if`` chain that runs.
    ``vectorize=False`` builds the portable code; None when the compiler cannot be asked."""
    if not options.vectorize:
        return "portable"
    build = compiler_options(options)
    try:
        words = tuple(build.compiler_words())
    except CompilationError:
        return None
    macros = _predefined_macros(words, tuple(build.flags or ()) + tuple(build.extra_flags))
    if macros is None:
        return None
    for name, isa in sets.items():
        if isa.condition is None:
            return name
        needed = re.findall(r"defined\((\w+)\)", isa.condition)
        if all(macro in macros for macro in needed):
            return name
    return None


def _truncate_diagnostics(text: str) -> str:
    """The head of a compiler's output, cut to a readable length with a note of what was cut."""
    lines = text.strip().splitlines()
    kept = lines[:MAX_DIAGNOSTIC_LINES]
    shown = "\n".join(kept)
    if len(shown) > MAX_DIAGNOSTIC_CHARS:
        shown = shown[:MAX_DIAGNOSTIC_CHARS] + " ..."
    if len(lines) > len(kept):
        shown += f"\n... ({len(lines) - len(kept)} more lines)"
    return shown


#: The header of the x86 intrinsics, which the gemm and convolution kernels include: parsing it
#: is a large share of every such kernel's build, which a precompiled header saves (the cold
#: compile times of ``python -m benchmarks.onnx_bench``).
INTRINSICS_HEADER = "#include <immintrin.h>\n"


def precompile_header(text: str, header: Path, options: CompilerOptions, *, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Write ``text`` to ``header`` and GCC's precompiled form of it beside it (``header`` +
    ``.gch``), made with ``options``' flags, so that a compile with the same flags that includes
    ``header`` first reads the parsed form.  GCC checks that the flags match and otherwise reads
    the text, so a stale or foreign ``.gch`` costs time, never correctness.  False when the
    compiler is not GCC or fails (kernels then parse their headers as before)."""
    if not options.uses_gcc():
        return False
    flags = [flag for flag in options.all_flags() if flag != "-shared"]
    partial = header.with_name(header.name + ".gch.partial")
    try:
        header.write_text(text, encoding="utf-8")
        result = subprocess.run(
            [*options.compiler_words(), *flags, "-x", "c-header", header.name, "-o", partial.name],
            cwd=header.parent,
            capture_output=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            return False
        os.replace(partial, header.with_name(header.name + ".gch"))
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def compile_shared_library(
    c_source: str,
    output_path: Path,
    options: CompilerOptions | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    header: Path | None = None,
) -> None:
    """Compile ``c_source`` into the shared library ``output_path``.

    The source is written next to the output (same name, suffix ``.c``) and the compiler runs in
    that directory with relative file names, so diagnostics name ``kernel.c`` rather than a
    temporary path and identical sources give identical libraries.  ``header``: one the source
    includes anyway, included first (so that its precompiled form is used).

    Raises :class:`CompilationError` if there is no usable compiler, if it fails (the message holds
    the command and the head of its output) or if it runs longer than ``timeout`` seconds.
    """
    options = options if options is not None else CompilerOptions()
    output_path = Path(output_path).absolute()
    source_path = output_path.with_suffix(".c")
    command = options.command(source_path.name, output_path.name, header)
    options.resolved_compiler()  # a missing compiler gets its own message, not "exit status 127"
    try:
        output_path.parent.mkdir(parents=True, exist_ok=True)
        source_path.write_text(c_source, encoding="utf-8")
    except OSError as error:
        raise CompilationError(f"cannot write the C source to {source_path}: {error}") from error

    where = f"{shlex.join(command)}\n  (in {output_path.parent})"
    try:
        result = subprocess.run(
            command, cwd=output_path.parent, capture_output=True, text=True, errors="replace", timeout=timeout
        )
    except subprocess.TimeoutExpired as error:
        raise CompilationError(f"the C compiler took longer than {timeout:g} s and was stopped:\n  {where}") from error
    except OSError as error:
        raise CompilationError(f"cannot run the C compiler: {error}\n  {where}") from error

    if result.returncode != 0:
        diagnostics = _truncate_diagnostics(result.stderr or result.stdout) or "(no output)"
        raise CompilationError(
            f"the C compiler failed (exit status {result.returncode}) on generated code:\n  {where}\n{diagnostics}"
        )
    if not output_path.is_file():
        raise CompilationError(f"the C compiler reported success but wrote no {output_path.name}:\n  {where}")
