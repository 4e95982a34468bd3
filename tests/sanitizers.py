"""Running generated code under AddressSanitizer and UBSan.

The kernels are shared libraries loaded into Python, so the sanitizer runtime must be preloaded
into a fresh interpreter: each check is a Python script run in a subprocess that sees polyc and
the test corpus, with its own kernel cache.  Tests skip when the C compiler has no libasan.

The sanitizer runtime's allocator slows polyc's own pipeline (isl, in the same process) about
fourfold, so a script can first be run without it to fill the kernel cache (``build_first``):
the sanitized run then loads the same libraries, built with the same flags, from the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builds import sanitizer_flag_sets

import polyc
from polyc.runtime import CompilerOptions

TESTS_DIR = Path(__file__).resolve().parent
REPOSITORY = TESTS_DIR.parent

#: C flags of sanitized builds (replacing the optimisation flags).
SANITIZER_FLAGS = "-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

#: Sanitized builds for each instruction-set branch of the pattern kernels: the host's (AVX-512
#: on an Intel Xeon here), AVX2 (where the host's is not) and portable C.
ISA_FLAG_SETS = sanitizer_flag_sets(SANITIZER_FLAGS)


def python_environment(**variables: str) -> dict[str, str]:
    """This process's environment for a Python subprocess that imports polyc and the corpus."""
    search_path = [str(REPOSITORY), str(TESTS_DIR)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(search_path), **variables}


def sanitizer_runtime() -> str | None:
    """Path of the compiler's libasan, or None when it has none."""
    try:
        cc = CompilerOptions().compiler_words()
        result = subprocess.run([*cc, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError, polyc.PolycError):
        return None
    path = Path(result.stdout.strip())
    return str(path) if result.returncode == 0 and path.is_absolute() and path.exists() else None


# Prepended to a script run to fill the kernel cache only: polyc kernels are generated and
# built with the script's flags but not loaded (a sanitized library cannot be loaded without
# the runtime), their calls do nothing, and the tests' comparisons are skipped.
_BUILD_ONLY_PRELUDE = """
import kernels
import polyc.driver
from polyc.runtime import get_or_build

def _build_without_loading(self, kernel, options):
    self.kernel = kernel
    get_or_build(kernel.source, polyc.driver.compiler_options(options))
    self.function = lambda *arguments: 0

polyc.driver._Compiled.__init__ = _build_without_loading
kernels.assert_close = lambda *arguments, **keywords: None
"""


def run_sanitized(
    script: str, *arguments: str, cache_dir: Path | None = None, timeout: float = 600, build_first: bool = False
) -> subprocess.CompletedProcess:
    """Run ``script`` (Python source) with the sanitizer runtime preloaded; skip the calling
    test when there is none.  ``cache_dir``: the kernel cache of the subprocess.
    ``build_first``: run the script without the runtime first, only to build its polyc kernels
    (for scripts that check their results with ``kernels.assert_close`` or ``check_kernel``);
    what that run does not build, the sanitized run builds itself."""
    runtime = sanitizer_runtime()
    if runtime is None:
        pytest.skip("the C compiler has no AddressSanitizer runtime (libasan.so)")
    extra = {"POLYC_CACHE_DIR": str(cache_dir)} if cache_dir is not None else {}
    if build_first:
        subprocess.run(
            [sys.executable, "-c", _BUILD_ONLY_PRELUDE + script, *arguments],
            env=python_environment(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    environment = python_environment(
        LD_PRELOAD=runtime,
        ASAN_OPTIONS="detect_leaks=0",  # the Python interpreter itself leaks
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        **extra,
    )
    return subprocess.run(
        [sys.executable, "-c", script, *arguments], env=environment, capture_output=True, text=True, timeout=timeout
    )


def assert_clean(result: subprocess.CompletedProcess) -> None:
    """The subprocess exited normally and the sanitizers reported nothing."""
    report = f"exit status {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-6000:]}"
    assert result.returncode == 0, report
    assert "runtime error" not in result.stderr, report
    assert "AddressSanitizer" not in result.stderr, report


def checked_lines(flag_sets) -> list[str]:
    """The words a sanitized script prints, ``checked`` and each flag set's last flag in turn."""
    return [word for flags in flag_sets for word in ("checked", flags.split()[-1])]
