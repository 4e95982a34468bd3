"""The environment variables kernels read at run time, checked once per process before the first
kernel library is loaded (:func:`polyc.runtime.loader.load_library`).

- ``POLYC_THREADS``: unset, ``all`` or ``pool`` (:data:`polyc.codegen.pattern_kernel.THREAD_POLICY_C`
  reads it in C); any other value is warned about, and kernels keep the thread policy, as unset.
- ``POLYC_POOL``: ``off`` (``0``, ``no``, ``false``) or on (unset, ``on``, ``1``, ``yes``,
  ``true``); another value is warned about, and the pool stays on.
- ``POLYC_PROGRESS``: ``0`` (``off``, ``no``, ``false``), ``1`` (``on``, ``yes``, ``true``) or
  ``auto`` (unset): whether compiles show a progress bar (:mod:`polyc.runtime.progress`); another
  value is warned about, and read as ``auto``.
- ``OMP_NUM_THREADS``: a team larger than :func:`most_threads` is cut to it, with a warning.
  GNU OpenMP tries to start every thread asked for, and with 100000 a kernel's first parallel
  region crashed the process (its threads' stacks cannot all be mapped); it reads the variable
  when it is loaded, which the first kernel library does, so the variable is rewritten first.

``POLYC_CC``, ``CC`` and ``POLYC_CFLAGS`` are checked where they are split into words
(:mod:`polyc.runtime.compiler`): an unbalanced quote is an error naming the variable.
``POLYC_CACHE_MAX_SIZE`` is checked where the cache's limit is read
(:func:`polyc.runtime.cache_space.size_limit`): a value that is not a size is an error naming
the variable, since it decides what is deleted.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings

THREAD_SETTINGS = ("all", "pool")
POOL_OFF = ("off", "0", "no", "false")
POOL_ON = ("", "on", "1", "yes", "true")
PROGRESS_VARIABLE = "POLYC_PROGRESS"
PROGRESS_OFF = ("0", "off", "no", "false")
PROGRESS_ON = ("1", "on", "yes", "true")
PROGRESS_AUTO = ("", "auto")

_checked = False
_lock = threading.Lock()


def most_threads() -> int:
    """The largest OpenMP team a kernel starts: 1024 (the size of polyc's pool) or the
    processors, if more."""
    return max(1024, os.cpu_count() or 1)


def capped_omp_num_threads(value: str, most: int) -> str | None:
    """``OMP_NUM_THREADS`` with its first level cut to ``most`` threads, or None when it needs no
    cut (or is not a number: OpenMP then warns and ignores it itself)."""
    levels = value.split(",")
    try:
        first = int(levels[0])
    except ValueError:
        return None
    if first <= most:
        return None
    return ",".join([str(most), *levels[1:]])


def environment_problems(environment) -> list[str]:
    """What is wrong with ``POLYC_THREADS``, ``POLYC_POOL`` and ``POLYC_PROGRESS`` in
    ``environment`` (a mapping), one sentence each."""
    problems = []
    threads = environment.get("POLYC_THREADS")
    if threads is not None and threads not in THREAD_SETTINGS:
        problems.append(
            f"POLYC_THREADS={threads!r} is not one of {', '.join(THREAD_SETTINGS)}: kernels keep the thread "
            "policy, as when it is unset"
        )
    pool = environment.get("POLYC_POOL")
    if pool is not None and pool.strip().lower() not in POOL_OFF + POOL_ON:
        problems.append(
            f"POLYC_POOL={pool!r} is neither off ({', '.join(POOL_OFF)}) nor on ({', '.join(POOL_ON[1:])}): "
            "the thread pool stays on"
        )
    progress = environment.get(PROGRESS_VARIABLE)
    if progress is not None and progress.strip().lower() not in PROGRESS_OFF + PROGRESS_ON + PROGRESS_AUTO:
        problems.append(
            f"{PROGRESS_VARIABLE}={progress!r} is neither off ({', '.join(PROGRESS_OFF)}), on "
            f"({', '.join(PROGRESS_ON)}) nor auto: progress bars show where the output is a terminal "
            "or a notebook, as when it is unset"
        )
    return problems


def check_environment() -> None:
    """Warns once per process about the variables above, and cuts ``OMP_NUM_THREADS``."""
    global _checked
    with _lock:
        if _checked:
            return
        _checked = True
    for problem in environment_problems(os.environ):
        warnings.warn(f"polyc: {problem}", RuntimeWarning, stacklevel=3)
    value = os.environ.get("OMP_NUM_THREADS", "")
    capped = capped_omp_num_threads(value, most_threads())
    if capped is not None:
        os.environ["OMP_NUM_THREADS"] = capped
        _cap_loaded_openmp(most_threads())
        warnings.warn(
            f"polyc: OMP_NUM_THREADS={value} is more threads than a team can start; kernels use "
            f"{most_threads()} at most",
            RuntimeWarning,
            stacklevel=3,
        )


def _cap_loaded_openmp(most: int) -> None:
    """Where GNU OpenMP was loaded already (it read the variable then), this thread's teams."""
    from polyc.runtime.after_fork import loaded_libgomp

    libgomp = loaded_libgomp()
    if libgomp is not None and libgomp.omp_get_max_threads() > most:
        libgomp.omp_set_num_threads(ctypes.c_int(most))
