"""Load built kernel libraries into this process and look up their functions with ctypes."""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from polyc.errors import CacheError, CompilationError

# A CDLL must outlive every function pointer taken from it, so loaded libraries are kept for the
# life of the process; keying on the resolved path makes a second load return the same object.
_loaded_libraries: dict[Path, ctypes.CDLL] = {}
_loading = threading.Lock()

#: How many times GNU OpenMP's idle threads poll for work before they sleep (its
#: ``GOMP_SPINCOUNT``), unless the user sets ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``.  libgomp's
#: default, 300000 polls (milliseconds), suits a machine the program has to itself: with
#: another process busy on one of two cores, a worker polling after a call took the processor
#: from the thread that would make the next call, and sgemm 256 took 1.8-3.0 s for 1000 calls
#: (numpy 0.3-0.5 s).  3000 polls outlast the gap between back-to-back calls from Python, so
#: on an idle machine calls cost the same (0.11-0.12 ms), and under that load 1000 calls took
#: 0.25-0.31 s.  Sleeping at once (``OMP_WAIT_POLICY=passive``) costs 0.07 ms a call on an idle
#: machine, to wake the worker.
OPENMP_SPIN_COUNT = 3000


def load_library(path: str | os.PathLike) -> ctypes.CDLL:
    """The shared library at ``path``, loaded once per process.

    Raises :class:`CacheError` if there is no file at ``path`` and :class:`CompilationError` if
    the dynamic loader rejects it (wrong architecture, a missing runtime such as libgomp, ...).
    """
    resolved = Path(path).resolve()
    with _loading:
        library = _loaded_libraries.get(resolved)
        if library is None:
            if not resolved.is_file():
                raise CacheError(f"compiled kernel library {resolved} does not exist (was the cache cleared?)")
            try:
                with _openmp_settings():
                    library = ctypes.CDLL(str(resolved))
            except OSError as error:
                raise CompilationError(
                    f"cannot load compiled kernel library {resolved}: {error}; "
                    "removing its cache entry forces a rebuild"
                ) from error
            _loaded_libraries[resolved] = library
    return library


@contextlib.contextmanager
def _openmp_settings() -> Iterator[None]:
    """polyc's default for GNU OpenMP's idle polling (:data:`OPENMP_SPIN_COUNT`) in the
    environment while a library loads: libgomp reads it once, when the first kernel built with
    OpenMP brings it into the process.  The environment is restored afterwards, so child
    processes and a libgomp already loaded (by another library) are unaffected."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        yield
        return
    os.environ["GOMP_SPINCOUNT"] = str(OPENMP_SPIN_COUNT)
    try:
        yield
    finally:
        os.environ.pop("GOMP_SPINCOUNT", None)


def get_function(
    library: ctypes.CDLL,
    name: str,
    argtypes: Sequence[type],
    restype: type | None = None,
) -> ctypes._CFuncPtr:
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
