"""What a child of ``fork()`` does with the threads its parent's kernels left behind.

A forked child has only the thread that called ``fork``; its parent's other threads are gone.
GNU OpenMP (libgomp) keeps the team it made for the thread's last parallel region and reuses it
in the next one, so in the child that region waits forever for threads that do not exist (a
kernel called in a ``multiprocessing`` worker after the parent ran a parallel kernel hung every
time).  libgomp has no way to start afresh, so the child's forking thread runs its kernels on one
thread (``omp_set_num_threads(1)``: that thread's own setting; a thread the child starts later
has no team yet and gets OpenMP's threads as usual).  LLVM's and Intel's OpenMP restart
themselves after ``fork``: with them nothing changes.

polyc's own thread pool (:mod:`polyc.runtime.pool`) forgets its helpers in the child in its C
code and starts new ones; the loader and the pool make their Python locks anew in the child, in
case another thread of the parent held one when it forked.
"""

from __future__ import annotations

import ctypes
import os

#: The GNU OpenMP runtime's library, as kernels built with gcc load it.
LIBGOMP = "libgomp.so.1"


def loaded_libgomp() -> ctypes.CDLL | None:
    """libgomp when this process has loaded it already (never loads it)."""
    if not hasattr(os, "RTLD_NOLOAD"):
        return None
    try:
        return ctypes.CDLL(LIBGOMP, mode=os.RTLD_NOLOAD)
    except OSError:
        return None


def _single_threaded_openmp() -> None:
    """In the child: this thread's parallel regions run on one thread."""
    libgomp = loaded_libgomp()
    if libgomp is not None:
        libgomp.omp_set_num_threads.argtypes = [ctypes.c_int]
        libgomp.omp_set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_single_threaded_openmp)
