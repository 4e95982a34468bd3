"""polyc's thread pool: one per process, shared by every kernel library it loads.

A short parallel call on a machine busier than its cores is at the mercy of the scheduler: an
OpenMP team ends with a join that waits for every thread, and a thread woken while another
process has its processor waits a scheduler slice (milliseconds) to start, so beside one busy
process a call of a fraction of a millisecond can take a whole slice.  The thread policy's answer,
one thread under load (:data:`polyc.codegen.pattern_kernel.THREAD_POLICY_C`), caps it at the
one-thread time (measured with ``python -m benchmarks.tail_latency``; results in
``benchmarks/results/zen4_tail_latency*.json``).

The pool's work is a job of *tickets* (independent pieces: whole products, or a product's
column blocks), which the calling thread and the helpers take as they come.  The caller never
waits for a helper that has not started: it takes the tickets left, and returns once every
ticket taken is done.  So a late helper costs at most the one-thread time, never a slice.
The contraction kernels use it for such shares when other processes crowd the machine (or
always, with ``POLYC_THREADS=pool``); on an idle machine they keep OpenMP's threads, which the
other kernels of a model use too: the two sets of threads would meet on the cores (a transformer
encoder's products on the pool ran several times slower: ``python -m benchmarks.onnx_bench
--models encoder``).

How helpers are kept ready (each choice measured beside a spinning process with ``python -m
benchmarks.tail_latency``; ``benchmarks/results/zen4_tail_latency_2026-12-05_pool_run*.json``
and ``..._keepoff_run*.json``):

* A helper never shares the caller's processor: before a job, the caller takes its processor
  out of the helpers' affinity masks (when they may run elsewhere; a system call per helper,
  only when the caller has moved since the last job).  A woken helper was otherwise placed on
  the caller's processor in most calls, next to the thread it should run beside, and almost
  never did a ticket.  Done by each helper before it waited, with the processor of the last
  job's caller, it missed runs of calls after the caller had moved.
* A helper asks the scheduler for short slices (``sched_setattr``'s ``sched_runtime``, 100 us:
  Linux 6.12 and later let a waking task with a shorter slice preempt the running one), so it
  misses fewer calls beside a busy process.  Older kernels ignore it.
* After a job a helper spins for up to 3 ms (the next call of a sequence finds it running),
  except for a while after it was kept off its processor for over 0.5 ms as it spun: a machine
  with other work then gets the processor back at once, and the helper, asleep, is woken by the
  next call, which (unlike a spinning thread that used up its share) preempts the other
  process.  Spinning while busy, or yielding instead of spinning, it missed many more calls.
  That while is 0.1 s, doubled up to 1.6 s while each try at spinning is kept off again: with
  a fixed 0.1 s, each try cost a few calls in a row.  Helpers are named ``polyc-pool``
  (``top -H``, ``/proc``).
* The caller waits for a helper's ticket spinning, yielding its processor only after 1 ms:
  yielding at once gave it to the busy process for a whole slice.

Kernels reach the pool through a weak symbol (``polyc_pool_run_v1``): this module loads the
pool library (built in the kernel cache like any kernel) with ``RTLD_GLOBAL`` before the first
kernel library, and a kernel whose symbol stayed unresolved -- exported C built elsewhere, or
``POLYC_POOL=off`` -- uses OpenMP as before.  After ``fork`` the child starts helpers of its own
(where it runs kernels on several threads: see :mod:`polyc.runtime.after_fork`).
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path

from polyc.codegen.templates import c_template

#: The pool's C source: built once per compiler into the kernel cache.
POOL_C = c_template("pool.c")


#: Set to "off" (or "0") to run every kernel on OpenMP's threads alone.
POOL_SWITCH = "POLYC_POOL"

_lock = threading.Lock()
_pool: ctypes.CDLL | None = None
_tried = False


def _new_lock_in_child() -> None:
    """After ``fork``: another thread of the parent may have held the lock (the C pool resets
    itself, see ``polyc_pool_after_fork``)."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def thread_pool() -> ctypes.CDLL | None:
    """The pool library, built and loaded into this process (``RTLD_GLOBAL``, so that kernel
    libraries loaded later resolve their weak reference to it) on the first call; None when
    ``POLYC_POOL=off`` or when it cannot be built or loaded (kernels then use OpenMP alone,
    with a warning saying why)."""
    global _pool, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get(POOL_SWITCH, "").strip().lower() not in ("off", "0", "no", "false"):
                _pool = _load()
    return _pool


def loaded_pool_path() -> Path | None:
    """The path of the pool's library if this process has loaded it (without loading it)."""
    return Path(_pool._name).resolve() if _pool is not None else None


def _load() -> ctypes.CDLL | None:
    from polyc.errors import PolycError
    from polyc.runtime.cache import get_or_build
    from polyc.runtime.compiler import CompilerOptions

    try:
        path = get_or_build(POOL_C, CompilerOptions(flags=("-O2",), openmp=False), name="the thread pool")
        library = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        library.polyc_pool_statistics_v1  # noqa: B018 -- a compiler for another OS builds an empty library
    except (PolycError, OSError, AttributeError) as error:
        warnings.warn(
            f"polyc's thread pool is unavailable, kernels use OpenMP's threads alone: {error}",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    library.polyc_pool_statistics_v1.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    library.polyc_pool_statistics_v1.restype = None
    library.polyc_pool_hold_v1.argtypes = [ctypes.c_int]
    library.polyc_pool_hold_v1.restype = None
    return library


def pool_statistics() -> dict[str, int] | None:
    """Jobs the pool has run in this process, tickets its helpers did and helpers started; None
    without a pool."""
    library = thread_pool()
    if library is None:
        return None
    out = (ctypes.c_int64 * 3)()
    library.polyc_pool_statistics_v1(out)
    return {"jobs": out[0], "helper_tickets": out[1], "helpers": out[2]}


def hold_helpers(held: bool) -> None:
    """For tests: while held, the pool's helpers do not start on the jobs they see, like threads
    the scheduler keeps waiting."""
    library = thread_pool()
    if library is not None:
        library.polyc_pool_hold_v1(int(held))
