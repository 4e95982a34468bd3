"""Build the naive C loop nests with gcc and with clang + Polly, and call them through ctypes.

Each file in ``naive/`` defines ``void kernel(...)``: the def's inputs in order (0-d inputs by
value, tensors as fixed-size arrays), then its outputs.  Sizes are ``-D`` macros, so both
compilers see compile-time extents, as PolyBench compiles by default.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAIVE_DIR = Path(__file__).resolve().parent / "naive"

#: The naive baseline: plain gcc -O3, one thread, no OpenMP.
GCC_FLAGS = ("-O3", "-march=native", "-std=gnu11")
#: Polly with its OpenMP code generation.  ``-fopenmp=libgomp`` makes Polly's parallel loops run
#: on libgomp, the runtime polyc's kernels use, so one process never holds two OpenMP runtimes
#: whose idle threads would spin against each other on two cores.
POLLY_FLAGS = (
    "-O3",
    "-march=native",
    "-std=gnu11",
    "-mllvm",
    "-polly",
    "-mllvm",
    "-polly-parallel",
    "-fopenmp=libgomp",
)
CLANG_CANDIDATES = ("clang-19", "clang")


@dataclass(frozen=True)
class Toolchain:
    """A C compiler and the flags one baseline column is built with."""

    label: str
    command: tuple[str, ...]  # compiler and flags, without sources, -D and output
    version: str

    def describe(self) -> dict:
        return {"label": self.label, "command": " ".join(self.command), "version": self.version}


def _version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def gcc_toolchain() -> Toolchain | None:
    gcc = shutil.which("gcc")
    return Toolchain("gcc -O3", (gcc, *GCC_FLAGS), _version(gcc)) if gcc else None


def polly_toolchain(extra_flags: tuple[str, ...] = ()) -> tuple[Toolchain | None, str]:
    """clang with Polly, or None and the reason it is unavailable (checked by compiling a loop)."""
    for name in CLANG_CANDIDATES:
        clang = shutil.which(name)
        if not clang:
            continue
        toolchain = Toolchain("clang+Polly", (clang, *POLLY_FLAGS, *extra_flags), _version(clang))
        probe = "void kernel(float a[restrict 64]) { for (int i = 0; i < 64; i++) a[i] = 2 * a[i]; }\n"
        with tempfile.TemporaryDirectory(prefix="polyc-bench-") as scratch:
            source = Path(scratch) / "probe.c"
            source.write_text(probe)
            result = subprocess.run(
                [*toolchain.command, "-fPIC", "-shared", str(source), "-o", str(Path(scratch) / "probe.so")],
                capture_output=True,
                text=True,
            )
        if result.returncode == 0:
            return toolchain, ""
        return None, f"{name} cannot build with Polly: {result.stderr.strip().splitlines()[-1:]}"
    return None, (
        "clang-19 not found (Debian: apt-get install clang-19 libpolly-19-dev); the clang+Polly column is skipped"
    )


_CTYPES_SCALARS = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


class NaiveKernel:
    """One naive C file built by one toolchain, callable with numpy arrays."""

    def __init__(self, toolchain: Toolchain, c_file: str, sizes: dict[str, int], build_dir: Path):
        source = NAIVE_DIR / c_file
        defines = [f"-D{name}={value}" for name, value in sizes.items()]
        # one file per toolchain and sizes: dlopen of a path already loaded returns the old library
        tag = "_".join([toolchain.label, *(f"{name}{value}" for name, value in sizes.items())])
        library = build_dir / f"{source.stem}-{re.sub(r'[^A-Za-z0-9_]+', '_', tag)}.so"
        command = [*toolchain.command, "-fPIC", "-shared", *defines, str(source), "-o", str(library), "-lm"]
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True, text=True)
        self.compile_seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
        self._library = ctypes.CDLL(str(library))
        self._function = self._library.kernel
        self._function.restype = None

    def bind(self, inputs: tuple, outputs: tuple) -> Callable[[], tuple]:
        """A no-argument callable running the kernel on ``inputs`` into new outputs shaped and
        typed like ``outputs``, zeroed, which it returns: as polyc's and numpy's calls return new
        arrays, so that the page faults of a large output count in every implementation's time
        (tensordot's 100 MB output: polyc 37 ms into an output it was given, 42-50 ms into a
        new one, and 200-270 ms in a few calls of a benchmark run, probably while the host
        faulted in memory the virtual machine had given back; an Intel Xeon VM).  An output that is also read
        (PolyBench's ``C = beta * C + ...``) starts as zeros in every call, as it did in the first.

        The callable holds the inputs as well as their addresses: they must outlive it.
        """
        arrays = [np.asarray(value) for value in inputs]
        arguments = []
        for array in arrays:
            if array.ndim == 0:
                arguments.append(_CTYPES_SCALARS[array.dtype](array.item()))
            else:
                assert array.flags.c_contiguous, "naive kernels take C-contiguous arrays"
                arguments.append(ctypes.c_void_p(array.ctypes.data))
        layouts = [(np.shape(value), np.asarray(value).dtype) for value in outputs]
        function = self._function

        def call(arrays=arrays) -> tuple:
            results = tuple(np.zeros(shape, dtype) for shape, dtype in layouts)
            function(*arguments, *(ctypes.c_void_p(result.ctypes.data) for result in results))
            return results

        return call
