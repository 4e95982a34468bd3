"""Load built kernel libraries into this process and look up their functions with ctypes."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from polyc.errors import CacheError, CompilationError
from polyc.runtime import after_fork  # noqa: F401 -- a forked child's kernels run on one OpenMP thread
from polyc.runtime.environment import check_environment
from polyc.runtime.pool import loaded_pool_path, thread_pool

if TYPE_CHECKING:
    from _ctypes import CFuncPtr  # the class of a library's functions; ctypes re-exports it only privately

# A CDLL must outlive every function pointer taken from it, so loaded libraries are kept for the
# life of the process; keying on the resolved path makes a second load return the same object.
_loaded_libraries: dict[Path, ctypes.CDLL] = {}
_loading = threading.Lock()


def _new_lock_in_child() -> None:
    """After ``fork``: another thread of the parent may have held the lock."""
    global _loading
    _loading = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def load_library(path: str | os.PathLike) -> ctypes.CDLL:
    """The shared library at ``path``, loaded once per process.

    Raises :class:`CacheError` if there is no file at ``path`` and :class:`CompilationError` if
    the dynamic loader rejects it (wrong architecture, a missing runtime such as libgomp, ...).
    """
    resolved = Path(path).resolve()
    # Before any kernel library: OpenMP reads OMP_NUM_THREADS when a kernel library loads it.
    check_environment()
    # Before any kernel library: kernels resolve their weak reference to the pool at load time.
    thread_pool()
    with _loading:
        library = _loaded_libraries.get(resolved)
        if library is None:
            if not resolved.is_file():
                raise CacheError(f"compiled kernel library {resolved} does not exist (was the cache cleared?)")
            try:
                library = ctypes.CDLL(str(resolved))
            except OSError as error:
                raise CompilationError(
                    f"cannot load compiled kernel library {resolved}: {error}; "
                    "removing its cache entry forces a rebuild"
                ) from error
            _loaded_libraries[resolved] = library
    return library


def loaded_library_paths() -> frozenset[Path]:
    """The (resolved) paths of every kernel library this process has loaded, the thread pool's
    included: the kernel cache never evicts them (:mod:`polyc.runtime.cache_space`)."""
    with _loading:
        paths = set(_loaded_libraries)
    pool = loaded_pool_path()
    if pool is not None:
        paths.add(pool)
    return frozenset(paths)


def get_function(
    library: ctypes.CDLL,
    name: str,
    argtypes: Sequence[type],
    restype: type | None = None,
) -> CFuncPtr:
    """The exported function ``name`` of ``library``, typed with ``argtypes`` and ``restype``
    (``None`` means ``void``).  Raises :class:`CompilationError` if it is not exported.

    >>> axpy = get_function(lib, "axpy", [ctypes.c_long, ctypes.c_float, FLOAT_P, FLOAT_P])  # doctest: +SKIP
    """
    try:
        # Indexing, unlike attribute access, makes a fresh function object, so two callers
        # setting different argtypes on one symbol do not overwrite each other.
        function = library[name]
    except AttributeError as error:
        raise CompilationError(f"compiled kernel library {library._name} exports no function {name!r}") from error
    function.argtypes = list(argtypes)
    function.restype = restype
    return function
