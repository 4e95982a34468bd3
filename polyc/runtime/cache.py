"""A content-addressed on-disk cache of compiled kernels, safe to share between processes.

An entry is named by :func:`cache_key`, a sha256 of the C source, the compiler fingerprint,
the polyc version and :data:`CACHE_FORMAT_VERSION`, and lives in ``<cache>/<key[:2]>/<key>/``::

    kernel.c     the source, for people reading the cache
    kernel.so    the library
    meta.json    sha256 and size of kernel.so; written last, so its presence marks a complete entry

How concurrent builders stay correct:

* A library is built in a private temporary directory inside the cache (same file system) and its
  files are moved into the entry with ``os.replace``, meta.json last.  A reader therefore sees a
  whole old file or a whole new one, never a partial one, and a library another process has loaded
  is never rewritten in place.
* An entry is used only after meta.json parses and the library's size and sha256 match it; anything
  else (a truncated file, garbage metadata, a crash between writes) is rebuilt, never loaded.
* Builders of one key serialise on ``<cache>/<key[:2]>/<key>.lock`` with ``flock`` and recheck the
  entry once they hold it, so N processes asking for a new kernel cause one build.  Where ``flock``
  is unavailable they all build, which is slower but still correct by the two rules above.

Hashing a library costs a read of the file, so each process verifies an entry once and afterwards
trusts it while the ``stat`` (inode, size, mtime) of its library and meta.json is unchanged.

Compile requests: generating a kernel's C (dependences, scheduling, code generation) costs tens
of milliseconds per def, which a process that finds every library in the cache should not pay
(seconds for an ONNX model's kernels).  So ``<cache>/requests/<key[:2]>/<key>.json`` maps a
request -- the def's TC text, its options, its sizes and a digest of polyc's own code, see
:func:`request_key` -- to the library entry its C went into and how to call it.  A request file
is only a shortcut: one that is missing, malformed or names an entry that fails its checks is a
miss, and the kernel is generated again.  Other such records (:func:`read_record`,
:func:`write_record`) keep what a def's define-time proofs found (:mod:`polyc.runtime.proofs`).

The cache is bounded by a size limit (``POLYC_CACHE_MAX_SIZE``), least recently used first: an
entry or a record is touched when it is used, and a build that takes the cache over its limit
evicts (:mod:`polyc.runtime.cache_space`).  Each kernel built is logged on the
``polyc.runtime.cache`` logger (INFO), each taken from the cache too (DEBUG).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

from polyc.errors import CacheError, CompilationError
from polyc.runtime import cache_space
from polyc.runtime.compiler import INTRINSICS_HEADER, CompilerOptions, compile_shared_library, precompile_header
from polyc.runtime.loader import load_library, loaded_library_paths
from polyc.version import __version__ as POLYC_VERSION

logger = logging.getLogger(__name__)

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: build without the per-key lock
    fcntl = None

#: Bump when the entry layout or meta.json changes, so old entries are no longer found.
CACHE_FORMAT_VERSION = 1

SOURCE_NAME = "kernel.c"
LIBRARY_NAME = "kernel.so"
META_NAME = "meta.json"
#: Prefix of the private build directories; anything so named in the cache is a build in progress.
BUILD_DIR_PREFIX = ".build-"

REQUESTS_DIR = "requests"
#: Precompiled headers, one directory per compiler fingerprint: ``<cache>/headers/<digest>/``.
HEADERS_DIR = "headers"

#: Entry directory -> signatures of its library and meta.json when this process last verified it.
_verified_entries: dict[Path, tuple[tuple[int, int, int], tuple[int, int, int]]] = {}


def configured_cache_dir() -> Path:
    """The cache directory asked for, absolute: ``$POLYC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/polyc``, else ``~/.cache/polyc`` (it may not exist)."""
    if os.environ.get("POLYC_CACHE_DIR"):
        directory = Path(os.environ["POLYC_CACHE_DIR"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        directory = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "polyc"
    else:
        directory = Path.home() / ".cache" / "polyc"
    return directory.absolute()  # returned paths must not change meaning if the cwd does


#: Configured cache directory -> the private temporary cache used instead, for this process.
_fallbacks: dict[Path, Path] = {}
_fallbacks_lock = threading.Lock()


def cache_dir() -> Path:
    """The cache directory kernels are built into: :func:`configured_cache_dir`, created if
    needed; where it cannot be created or written (a read-only file system, a full disk, a
    file in the way), a private temporary directory for this process, with a warning once
    (entries already in the configured one are still used: :func:`get_or_build`)."""
    directory = configured_cache_dir()
    fallback = _fallbacks.get(directory)
    if fallback is not None:
        return fallback
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return _fall_back(directory, f"it cannot be created ({error.strerror})")
    if not os.access(directory, os.W_OK | os.X_OK):
        return _fall_back(directory, "it is not writable")
    return directory


def _fall_back(directory: Path, why: str) -> Path:
    """The private temporary cache used instead of ``directory`` from now on in this process
    (made, and warned about, once).  Raises :class:`CacheError` where no temporary directory
    can be made either."""
    with _fallbacks_lock:
        fallback = _fallbacks.get(directory)
        if fallback is not None:
            return fallback
        try:
            fallback = Path(tempfile.mkdtemp(prefix="polyc-cache-"))
        except OSError as error:
            raise CacheError(
                f"the kernel cache directory {directory} cannot be used ({why}) and no temporary one can be "
                f"made ({error.strerror}); set POLYC_CACHE_DIR to a writable directory"
            ) from error
        _fallbacks[directory] = fallback
        atexit.register(shutil.rmtree, fallback, ignore_errors=True)
    warnings.warn(
        f"polyc: the kernel cache directory {directory} cannot be written ({why}); kernels are built in "
        f"the private temporary cache {fallback} for this process (its entries already in {directory} are "
        "still used). Set POLYC_CACHE_DIR to a writable directory to keep them.",
        RuntimeWarning,
        stacklevel=3,
    )
    return fallback


def _read_only_dirs() -> list[Path]:
    """The configured cache directory, when kernels are built elsewhere: its entries are read."""
    directory = configured_cache_dir()
    return [directory] if directory in _fallbacks and directory.is_dir() else []


def cache_key(c_source: str, options: CompilerOptions) -> str:
    """The hex sha256 naming the library built from ``c_source`` with ``options``."""
    identity = {
        "format": CACHE_FORMAT_VERSION,
        "polyc": POLYC_VERSION,
        "compiler": options.fingerprint(),
        "source": c_source,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def get_or_build(
    c_source: str, options: CompilerOptions | None = None, *, rehash: bool = False, name: str = ""
) -> Path:
    """Path of the shared library built from ``c_source``, compiling it only if the cache lacks a
    valid copy.

    ``rehash=True`` checks the library's sha256 even if this process has already verified the
    unchanged file.  ``name``: what the log calls the kernel (default: its key).  Raises
    :class:`~polyc.errors.CompilationError` if the build fails and
    :class:`~polyc.errors.CacheError` if the cache cannot be used or ``$POLYC_CACHE_MAX_SIZE``
    is not a size.
    """
    return fetch_library(c_source, options, rehash=rehash, name=name).path


class Fetched:
    """Where :func:`fetch_library` found a library: its ``path``, whether this call ``built``
    it and the compiler's ``seconds`` (0 for one taken from the cache)."""

    __slots__ = ("path", "built", "seconds")

    def __init__(self, path: Path, built: bool, seconds: float):
        self.path, self.built, self.seconds = path, built, seconds


def fetch_library(
    c_source: str, options: CompilerOptions | None = None, *, rehash: bool = False, name: str = ""
) -> Fetched:
    """As :func:`get_or_build`, saying also whether the library was built now and how long that took."""
    options = options if options is not None else CompilerOptions()
    key = cache_key(c_source, options)
    label = name or f"kernel {key[:12]}"
    root = cache_dir()
    for directory in [root, *_read_only_dirs()]:
        entry = directory / key[:2] / key
        if _entry_is_valid(entry, key, rehash=rehash):
            if directory == root:
                cache_space.touch(entry)
            logger.debug("%s: from cache (%s)", label, entry)
            return Fetched(entry / LIBRARY_NAME, False, 0.0)
    limit = cache_space.size_limit()  # a bad value fails before the build, not after it
    try:
        fetched = _build_in(root, c_source, options, key, rehash, label)
    except CacheError as error:
        if root != configured_cache_dir():
            raise  # the temporary cache fails too
        # A disk that filled up, a file system remounted read-only: the rest of the process
        # builds in a temporary cache.
        root = _fall_back(root, str(error))
        fetched = _build_in(root, c_source, options, key, rehash, label)
    if fetched.built and limit is not None:
        _keep_under_limit(root, fetched.path.parent)
    return fetched


def load_kernel_library(c_source: str, options: CompilerOptions | None = None, *, name: str = ""):
    """The library built from ``c_source`` (:func:`get_or_build`), loaded into this process
    (:func:`polyc.runtime.loader.load_library`).  A library that another process evicted
    between the two is built again."""
    path = get_or_build(c_source, options, name=name)
    try:
        return load_library(path)
    except CacheError:
        if path.is_file():
            raise
        return load_library(get_or_build(c_source, options, name=name))


def _build_in(root: Path, c_source: str, options: CompilerOptions, key: str, rehash: bool, label: str) -> Fetched:
    """Builds the entry ``key`` in the cache ``root`` under its lock, unless another process
    did meanwhile; its library's path."""
    entry = root / key[:2] / key
    try:
        entry.parent.mkdir(exist_ok=True)
    except OSError as error:
        raise CacheError(f"cannot write to the kernel cache at {root}: {error.strerror}") from error
    with _build_lock(entry.parent / f"{key}.lock"):
        # Another process may have built the entry while this one waited for the lock.
        if _entry_is_valid(entry, key, rehash=rehash):
            logger.debug("%s: from cache, built by another process meanwhile (%s)", label, entry)
            return Fetched(entry / LIBRARY_NAME, False, 0.0)
        started = time.perf_counter()
        _build_entry(c_source, options, key, entry, root)
        seconds = time.perf_counter() - started
    logger.info("built %s in %.2f s (%s)", label, seconds, entry)
    return Fetched(entry / LIBRARY_NAME, True, seconds)


def in_use_here() -> list[Path]:
    """The cache's entry and header directories this process uses: the libraries it has loaded
    and the precompiled headers it builds with (eviction never removes them)."""
    in_use = [path.parent for path in loaded_library_paths()]
    return in_use + [header.parent for header in _intrinsics_headers.values() if header is not None]


def _keep_under_limit(root: Path, entry: Path) -> None:
    """After building ``entry`` in ``root``: evict the least recently used entries where the
    cache went over its limit, never ``entry`` nor what this process has loaded or uses."""
    try:
        size = sum(os.stat(entry / name).st_size for name in (SOURCE_NAME, LIBRARY_NAME, META_NAME))
        removed = cache_space.after_build(root, entry, size, in_use_here())
    except OSError as error:  # eviction is housekeeping: it never fails a build
        logger.debug("the kernel cache at %s was not pruned: %s", root, error)
        return
    if removed is not None and removed.count:
        logger.info(
            "evicted %d least recently used cache entries (%s) from %s to keep it under %s (%s)",
            removed.count,
            cache_space.format_size(removed.size),
            root,
            cache_space.format_size(cache_space.size_limit() or 0),
            cache_space.SIZE_VARIABLE,
        )


def _entry_is_valid(entry: Path, key: str, *, rehash: bool) -> bool:
    """Whether ``entry`` holds a complete library matching its meta.json."""
    if not rehash and entry in _verified_entries and _verified_entries[entry] == _entry_signature(entry):
        return True
    try:
        # Read each file through the descriptor we stat, so a concurrent replace cannot pair the
        # signature of one version with the contents of another.
        with open(entry / META_NAME, "rb") as meta_file:
            meta_stat = os.fstat(meta_file.fileno())
            meta = json.loads(meta_file.read())
        with open(entry / LIBRARY_NAME, "rb") as library_file:
            library_stat = os.fstat(library_file.fileno())
            digest = _file_sha256(library_file)
    except (OSError, ValueError):  # missing files; undecodable or malformed JSON
        return False
    if not isinstance(meta, dict) or meta.get("key") != key:
        return False
    if library_stat.st_size != meta.get("size") or digest != meta.get("sha256"):
        return False
    _verified_entries[entry] = (_file_signature(library_stat), _file_signature(meta_stat))
    return True


def _file_signature(stat: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten: inode, size, modification time."""
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _entry_signature(entry: Path) -> tuple[tuple[int, int, int], tuple[int, int, int]] | None:
    """Signatures of an entry's library and meta.json, or None if either is missing."""
    try:
        return (_file_signature(os.stat(entry / LIBRARY_NAME)), _file_signature(os.stat(entry / META_NAME)))
    except OSError:
        return None


def _file_sha256(file: BinaryIO) -> str:
    """Hex sha256 of an open binary file, read from its current position."""
    digest = hashlib.sha256()
    for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _build_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path``; just proceed if locking is not possible."""
    lock_fd = None
    if fcntl is not None:
        try:
            lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        except OSError:  # e.g. a network file system without flock: atomic publishing suffices
            pass
    try:
        yield
    finally:
        # Closing releases the lock.  The lock file stays: unlinking it would let a later process
        # lock a new file while a waiter still holds the old one.
        if lock_fd is not None:
            os.close(lock_fd)


def _build_entry(c_source: str, options: CompilerOptions, key: str, entry: Path, root: Path) -> None:
    """Compile into a private directory, then move the files into ``entry``, meta.json last."""
    try:
        # A stale entry must stop looking valid before any of its files is replaced.
        (entry / META_NAME).unlink(missing_ok=True)
        build_dir = Path(tempfile.mkdtemp(prefix=BUILD_DIR_PREFIX + key[:16] + "-", dir=root))
    except OSError as error:
        raise CacheError(f"cannot write to the kernel cache at {root}: {error.strerror}") from error
    try:
        library = build_dir / LIBRARY_NAME
        header = _intrinsics_header(options, root) if "#include <immintrin.h>" in c_source else None
        try:
            compile_shared_library(c_source, library, options, header=header)
        except CompilationError:
            if header is None:
                raise
            # GCC fails on a damaged precompiled header (a truncated one), which goes: the next
            # build that wants it makes it again, and this one is tried on its source alone.
            _intrinsics_headers.pop((root, options.fingerprint()), None)
            header.with_name(header.name + ".gch").unlink(missing_ok=True)
            compile_shared_library(c_source, library, options)
        with open(library, "rb") as library_file:
            library_stat = os.fstat(library_file.fileno())
            sha256 = _file_sha256(library_file)
        meta = {
            "key": key,
            "sha256": sha256,
            "size": library_stat.st_size,
            "format": CACHE_FORMAT_VERSION,
            "polyc": POLYC_VERSION,
            "compiler": options.fingerprint(),
        }
        (build_dir / META_NAME).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        meta_stat = os.stat(build_dir / META_NAME)
        # No fsync: after a crash a short or empty library fails the size/sha check and is rebuilt.
        entry.mkdir(exist_ok=True)
        for name in (SOURCE_NAME, LIBRARY_NAME, META_NAME):
            os.replace(build_dir / name, entry / name)
        # A rename keeps inode and mtime, so this holds until someone replaces or edits a file.
        _verified_entries[entry] = (_file_signature(library_stat), _file_signature(meta_stat))
    except OSError as error:
        raise CacheError(
            f"cannot write the kernel cache entry {entry}: {error}; "
            "remove that directory or set POLYC_CACHE_DIR to another writable directory"
        ) from error
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


#: (cache, compiler fingerprint) -> its precompiled intrinsics header, or None where there is none.
_intrinsics_headers: dict[tuple[Path, str], Path | None] = {}


def _intrinsics_header(options: CompilerOptions, root: Path) -> Path | None:
    """The intrinsics header precompiled for ``options`` in the cache (made by the first build
    that needs it, under a lock as entries are), or None when the compiler cannot make one."""
    fingerprint = options.fingerprint()
    known = _intrinsics_headers.get((root, fingerprint), False)
    if known is None or (isinstance(known, Path) and known.is_file()):
        return known
    digest = hashlib.sha256(f"{fingerprint}\n{INTRINSICS_HEADER}".encode()).hexdigest()[:32]
    directory = root / HEADERS_DIR / digest
    header = directory / "polyc_intrinsics.h"
    made = header.with_name(header.name + ".gch")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with _build_lock(directory.with_name(digest + ".lock")):
            ready = made.is_file() and header.is_file() and header.read_text(encoding="utf-8") == INTRINSICS_HEADER
            ready = ready or precompile_header(INTRINSICS_HEADER, header, options)
    except OSError:
        ready = False
    if ready:
        cache_space.touch(directory)
    _intrinsics_headers[root, fingerprint] = header if ready else None
    return _intrinsics_headers[root, fingerprint]


# ----------------------------------------------------------------------------- compile requests
_code_digest: str | None = None


def polyc_code_digest() -> str:
    """sha256 of polyc's own Python sources: a request made by other code is another request."""
    global _code_digest
    if _code_digest is None:
        package = Path(__file__).resolve().parent.parent
        digest = hashlib.sha256()
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
        _code_digest = digest.hexdigest()
    return _code_digest


def request_key(identity: dict) -> str:
    """The hex sha256 naming a compile request (``identity``: JSON-serialisable, e.g. the def's
    text, options and sizes)."""
    whole = {"format": CACHE_FORMAT_VERSION, "polyc": POLYC_VERSION, "code": polyc_code_digest(), "request": identity}
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=repr).encode()).hexdigest()


def find_request(key: str, options: CompilerOptions) -> tuple[str, dict] | None:
    """(C source, call metadata) recorded for request ``key`` if its library entry is valid."""
    for root in [cache_dir(), *_read_only_dirs()]:
        request = _read_record_in(root, REQUESTS_DIR, key)
        try:
            library_key, call = request["library"], request["call"]
            entry = root / library_key[:2] / library_key
            source = (entry / SOURCE_NAME).read_text(encoding="utf-8")
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (
            isinstance(call, dict)
            and cache_key(source, options) == library_key
            and _entry_is_valid(entry, library_key, rehash=False)
        ):
            return source, call
    return None


def remember_request(key: str, c_source: str, options: CompilerOptions, call: dict) -> None:
    """Record that request ``key`` compiles to ``c_source`` (already in the cache), called as
    ``call`` says.  Best effort: a cache that cannot take the file only loses the shortcut."""
    write_record(REQUESTS_DIR, key, {"library": cache_key(c_source, options), "call": call})


def read_record(kind: str, key: str):
    """The JSON value recorded as ``key`` under ``<cache>/<kind>/``, or None when there is none
    or it does not parse (a truncated or garbled file is a miss, never an error); a read-only
    configured cache is read after the one written (see :func:`cache_dir`)."""
    try:
        roots = [cache_dir(), *_read_only_dirs()]
    except CacheError:
        return None
    for root in roots:
        value = _read_record_in(root, kind, key)
        if value is not None:
            return value
    return None


def _read_record_in(root: Path, kind: str, key: str):
    """The record, touched as used (least recently used records are evicted first)."""
    path = root / kind / key[:2] / f"{key}.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cache_space.touch(path)
    return value


def write_record(kind: str, key: str, value) -> None:
    """Record the JSON-serialisable ``value`` as ``key`` under ``<cache>/<kind>/``, atomically (a
    reader sees the old file or the new one).  Best effort: a cache that cannot take the file
    only loses the shortcut."""
    text = json.dumps(value, sort_keys=True)
    try:
        directory = cache_dir() / kind / key[:2]
        directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=BUILD_DIR_PREFIX, dir=directory)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, directory / f"{key}.json")
    except (OSError, CacheError):
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(temporary)
