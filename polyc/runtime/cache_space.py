"""The room the kernel cache takes: what it holds, a size limit with least-recently-used
eviction, and clearing it (``polyc cache info | clear | prune``).

What the cache directory holds (:mod:`polyc.runtime.cache` writes most of it)::

    <key[:2]>/<key>/            kernel entries: kernel.so, meta.json (the library), kernel.c (its source)
    <key[:2]>/<key>.lock        a kernel entry's build lock
    requests/<key[:2]>/*.json   compile requests: a def, options and sizes -> the library they compile to
    proofs/<key[:2]>/*.json     what a def's define-time proofs found
    headers/<digest>/           precompiled intrinsics headers, one per compiler and flags
    tuning/records.jsonl        tuning records (:mod:`polyc.runtime.tuning_records`)
    opencl/, cuda/              pyopencl's and pycuda's program caches
    .build-*                    builds in progress (or left by a process that died in one)

**The limit** (``POLYC_CACHE_MAX_SIZE``, default :data:`DEFAULT_MAX_SIZE`) bounds what polyc
can make again: kernel entries, compile requests, proof records and precompiled headers.
Tuning records (measurements, which cannot be made again without measuring) and the GPU
program caches (pyopencl's and pycuda's own) are never evicted and not counted.

**Least recently used** is read from modification times: an entry's directory and a record's
file are touched each time a process uses them (:func:`touch`), so no index has to be kept
consistent between processes.

**Eviction is cheap**: each process keeps an estimate of the cache's size (a scan of the cache
at its first build, then the sizes it builds), and scans and evicts again only when the
estimate crosses the limit or every :data:`RESCAN_EVERY` builds (other processes add to the
cache too); it then frees down to :data:`EVICT_TO` of the limit, so that the builds after do
not each scan.

**Safe with concurrent processes**: a kernel entry or a header is removed only under its build
lock, taken without waiting (one being built is skipped), by renaming its directory away first,
so that a reader sees a whole entry or none; a reader that found an entry valid just before it
went finds no library to load and builds it again
(:func:`polyc.runtime.cache.load_kernel_library`).  On Linux a library another process has
loaded stays mapped in that process when its file is removed.  Never removed: the entry just
built, and the libraries and headers this process has loaded or uses.  Only one process evicts
from a cache at a time (``evict.lock``, also taken without waiting).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from polyc.errors import CacheError

try:
    import fcntl
except ImportError:  # not POSIX: remove without the locks (publishing is still atomic)
    fcntl = None  # type: ignore[assignment]

#: The limit when ``POLYC_CACHE_MAX_SIZE`` is unset: a few thousand kernels of a few hundred KiB.
DEFAULT_MAX_SIZE = 2 * 1024**3
SIZE_VARIABLE = "POLYC_CACHE_MAX_SIZE"
#: Values of ``POLYC_CACHE_MAX_SIZE`` (and of ``--max-size``) that mean no limit.
UNBOUNDED = ("none", "unlimited", "0")
#: A process scans the cache again after this many builds, even if its estimate is under the limit.
RESCAN_EVERY = 64
#: Eviction frees the cache down to this fraction of the limit.
EVICT_TO = 0.9
#: A build directory this old was left by a process that died in it (a build takes seconds).
STALE_BUILD_SECONDS = 3600

_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_KEY = re.compile(r"^[0-9a-f]{64}$")
_SHARD = re.compile(r"^[0-9a-f]{2}$")

#: Kinds of entry, in the order ``polyc cache info`` lists them: kind -> what it is.
KINDS = {
    "kernel libraries": "kernel.so and meta.json of each kernel entry",
    "kernel sources": "kernel.c of each kernel entry",
    "compile requests": "a def, its options and sizes -> the library they compile to",
    "proof records": "what each def's define-time proofs found",
    "precompiled headers": "the intrinsics header, parsed once per compiler and flags",
    "tuning records": "measured options (never evicted; polyc cache clear --tuning)",
    "GPU program caches": "pyopencl's and pycuda's (never evicted)",
    "builds in progress": "private build directories (or left by a process that died in one)",
}
#: The kinds the limit counts and eviction removes.
EVICTABLE = ("kernel entries", "compile requests", "proof records", "precompiled headers")

# The directories of the cache's layout (polyc.runtime.cache and tuning_records name them too).
_RECORD_KINDS = {"requests": "compile requests", "proofs": "proof records"}
_HEADERS = "headers"
_TUNING = "tuning"
_GPU = ("opencl", "cuda")
_BUILD_PREFIX = ".build-"
_EVICT_LOCK = "evict.lock"
_LIBRARY_FILES = ("kernel.so", "meta.json")


def parse_size(text: str) -> int | None:
    """Bytes in a size such as ``500M``, ``2G``, ``1.5GiB`` or ``1048576`` (units are powers of
    1024); None for ``0``, ``none`` or ``unlimited`` (no limit).  Raises ValueError with a
    sentence saying what is accepted."""
    if text.strip().lower() in UNBOUNDED:
        return None
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a size: give bytes, or a number with K, M, G or T (powers of 1024), "
            "such as 500M or 2G; 0 or none for no limit"
        )
    size = int(float(match["number"]) * _UNITS[match["unit"].lower()])
    return size if size > 0 else None


def size_limit() -> int | None:
    """The cache's limit in bytes from ``$POLYC_CACHE_MAX_SIZE`` (unset or empty:
    :data:`DEFAULT_MAX_SIZE`), None for no limit.  Raises :class:`CacheError` for a value that
    is not a size: a limit misread would delete what the user meant to keep, or keep too much."""
    text = os.environ.get(SIZE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(text)
    except ValueError as error:
        raise CacheError(f"{SIZE_VARIABLE}={error}") from None


def format_size(size: int) -> str:
    """``1.5 GiB``, ``300.0 KiB``, ``12 B``."""
    if size < 1024:
        return f"{size} B"
    scaled = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        scaled /= 1024
        if scaled < 1024 or unit == "TiB":
            break
    return f"{scaled:.1f} {unit}"


# ----------------------------------------------------------------------------- what the cache holds
@dataclass(frozen=True)
class Item:
    """One removable thing in the cache: a kernel entry (its directory), a record file, a
    header's directory, a build directory, the tuning records or a GPU program cache.
    ``sizes``: bytes per kind (a kernel entry's library and source are two kinds);
    ``last_used``: its modification time, which use refreshes (:func:`touch`);
    ``lock``: the build lock to hold while removing it, if any."""

    kind: str
    path: Path
    sizes: tuple[tuple[str, int], ...]
    last_used: float
    lock: Path | None = None
    count: int = 1

    @property
    def size(self) -> int:
        return sum(size for _, size in self.sizes)


def inventory(root: Path) -> list[Item]:
    """Everything polyc made in the cache directory ``root`` (nothing else is ever listed, so
    nothing else is ever removed); empty when there is no such directory."""
    items: list[Item] = []
    for child in _directory(root):
        name = child.name
        if _SHARD.match(name) and _is_real_directory(child):
            items += _kernel_entries(child)
        elif name in _RECORD_KINDS and _is_real_directory(child):
            items += _records(child, _RECORD_KINDS[name])
        elif name == _HEADERS and _is_real_directory(child):
            items += _headers(child)
        elif name == _TUNING and _is_real_directory(child):
            size, _ = _tree_size(child)
            items.append(
                Item(
                    "tuning records",
                    Path(child.path),
                    (("tuning records", size),),
                    _mtime(child),
                    None,
                    _records_in(child),
                )
            )
        elif name in _GPU and _is_real_directory(child):
            size, files = _tree_size(child)
            items.append(
                Item(
                    "GPU program caches", Path(child.path), (("GPU program caches", size),), _mtime(child), None, files
                )
            )
        elif name.startswith(_BUILD_PREFIX):
            size, _ = _tree_size(child) if _is_real_directory(child) else (_file_size(child), 1)
            items.append(Item("builds in progress", Path(child.path), (("builds in progress", size),), _mtime(child)))
    return items


def usage(items: Iterable[Item]) -> dict[str, tuple[int, int]]:
    """Kind -> (entries, bytes), for every kind of :data:`KINDS` (zeros where there are none)."""
    found = {kind: [0, 0] for kind in KINDS}
    for item in items:
        for kind, size in item.sizes:
            found[kind][0] += item.count
            found[kind][1] += size
    return {kind: (count, size) for kind, (count, size) in found.items()}


def evictable_size(items: Iterable[Item]) -> int:
    """Bytes of what the limit counts (:data:`EVICTABLE`)."""
    return sum(item.size for item in items if item.kind in EVICTABLE)


def _directory(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError:
        return []


def _is_real_directory(entry: os.DirEntry) -> bool:
    """A directory, not a link to one (a link could lead outside the cache)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _mtime(entry: os.DirEntry | Path) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return 0.0


def _file_size(entry: os.DirEntry | Path) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_size
    except OSError:
        return 0


def _tree_size(path: os.DirEntry | Path) -> tuple[int, int]:
    """(bytes, files) under a directory, links not followed."""
    size = files = 0
    for directory, _, names in os.walk(os.fspath(path)):
        for name in names:
            size += _file_size(Path(directory, name))
            files += 1
    return size, files


def _records_in(tuning: os.DirEntry) -> int:
    """Lines (tuning records) in the tuning directory's files."""
    lines = 0
    for directory, _, names in os.walk(tuning.path):
        for name in names:
            with contextlib.suppress(OSError), open(Path(directory, name), "rb") as file:
                lines += sum(block.count(b"\n") for block in iter(lambda: file.read(1 << 20), b""))
    return lines


def _kernel_entries(shard: os.DirEntry) -> list[Item]:
    items = []
    for entry in _directory(Path(shard.path)):
        if not (_KEY.match(entry.name) and _is_real_directory(entry)):
            continue
        library = source = 0
        for file in _directory(Path(entry.path)):
            if file.name in _LIBRARY_FILES:
                library += _file_size(file)
            else:
                source += _file_size(file)
        sizes = (("kernel libraries", library), ("kernel sources", source))
        lock = Path(shard.path, entry.name + ".lock")
        items.append(Item("kernel entries", Path(entry.path), sizes, _mtime(entry), lock))
    return items


def _records(directory: os.DirEntry, kind: str) -> list[Item]:
    items = []
    for shard in _directory(Path(directory.path)):
        if not (_SHARD.match(shard.name) and _is_real_directory(shard)):
            continue
        for record in _directory(Path(shard.path)):
            if record.name.endswith(".json") and _KEY.match(record.name[:-5]):
                items.append(Item(kind, Path(record.path), ((kind, _file_size(record)),), _mtime(record)))
            elif record.name.startswith(_BUILD_PREFIX):
                size = _file_size(record)
                items.append(
                    Item("builds in progress", Path(record.path), (("builds in progress", size),), _mtime(record))
                )
    return items


def _headers(directory: os.DirEntry) -> list[Item]:
    items = []
    for header in _directory(Path(directory.path)):
        if _is_real_directory(header) and re.match(r"^[0-9a-f]{32}$", header.name):
            size, _ = _tree_size(header)
            kind = "precompiled headers"
            lock = Path(directory.path, header.name + ".lock")
            items.append(Item(kind, Path(header.path), ((kind, size),), _mtime(header), lock))
    return items


# ----------------------------------------------------------------------------- use and removal
def touch(path: Path) -> None:
    """Mark an entry (its directory) or a record (its file) used now, for least-recently-used
    eviction; best effort (a read-only cache is read, never evicted)."""
    with contextlib.suppress(OSError):
        os.utime(path)


@dataclass(frozen=True)
class Removed:
    """What a :func:`evict` or :func:`clear` removed, and what it kept because it was in use."""

    count: int
    size: int
    busy: int

    def __add__(self, other: Removed) -> Removed:
        return Removed(self.count + other.count, self.size + other.size, self.busy + other.busy)


def evict(root: Path, target: int, keep: Iterable[Path] = ()) -> Removed:
    """Remove the least recently used of what the limit counts in ``root`` until it takes at
    most ``target`` bytes, skipping ``keep`` (entry directories or header directories) and
    what is locked (being built).  Nothing when another process is evicting from ``root``."""
    with _exclusive(root / _EVICT_LOCK, wait=False) as held:
        if not held:
            return Removed(0, 0, 0)
        items = inventory(root)
        size = evictable_size(items)
        kept = {Path(path) for path in keep}
        removed = Removed(0, 0, 0)
        for item in sorted((i for i in items if i.kind in EVICTABLE), key=lambda i: i.last_used):
            if size <= target:
                break
            if item.path in kept:
                continue
            if _remove(root, item):
                size -= item.size
                removed += Removed(1, item.size, 0)
            else:
                removed += Removed(0, 0, 1)
        return removed


def clear(root: Path, tuning: bool = False, keep: Iterable[Path] = ()) -> Removed:
    """Remove everything polyc made in ``root`` but the tuning records (those too with
    ``tuning=True``) and the builds in progress (those left over an hour ago go); entries being
    built are kept (``busy``), and so is ``keep``.  Nothing outside ``root``, and nothing in it
    that polyc did not make, is touched."""
    kept = {Path(path) for path in keep}
    removed = Removed(0, 0, 0)
    now = time.time()
    for item in inventory(root):
        if item.path in kept or item.kind == "tuning records" and not tuning:
            continue
        if item.kind == "builds in progress" and now - item.last_used < STALE_BUILD_SECONDS:
            continue
        if _remove(root, item):
            removed += Removed(1, item.size, 0)
        else:
            removed += Removed(0, 0, 1)
    # The locks of entries gone.  (Empty shard directories stay: a builder may be about to lock
    # a file in one.)
    for shard in _directory(root):
        if _SHARD.match(shard.name) and _is_real_directory(shard):
            for lock in _directory(Path(shard.path)):
                if lock.name.endswith(".lock") and _KEY.match(lock.name[:-5]):
                    _remove_lock_if_free(Path(lock.path), Path(shard.path, lock.name[:-5]))
    return removed


def _remove(root: Path, item: Item) -> bool:
    """Remove one item; False when it is in use (its build lock is held)."""
    if item.lock is None:
        if _is_directory(item.path):
            shutil.rmtree(item.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                item.path.unlink()
        return True
    with _exclusive(item.lock, wait=False) as held:
        if not held:
            return False
        # Renamed away first: a reader sees the whole entry or none of it.
        try:
            doomed = Path(tempfile.mkdtemp(prefix=_BUILD_PREFIX + "evicted-", dir=root))
        except OSError:
            return False
        try:
            os.replace(item.path, doomed / "entry")
        except FileNotFoundError:  # another process removed it meanwhile
            pass
        except OSError:
            os.rmdir(doomed)
            return False
        # The lock goes too (still held): a waiter on it builds beside a new lock's holder,
        # which is correct, as builders without locks are (polyc.runtime.cache).
        with contextlib.suppress(OSError):
            item.lock.unlink()
        shutil.rmtree(doomed, ignore_errors=True)
        return True


def _remove_lock_if_free(lock: Path, entry: Path) -> None:
    with _exclusive(lock, wait=False) as held:
        if held and not entry.exists():
            with contextlib.suppress(OSError):
                lock.unlink()


def _is_directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


@contextlib.contextmanager
def _exclusive(lock_path: Path, wait: bool) -> Iterator[bool]:
    """Hold ``flock`` on ``lock_path``; yields whether it is held (without ``fcntl``: True)."""
    if fcntl is None:
        yield True
        return
    try:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)


# ----------------------------------------------------------------------------- the limit, kept
class _Estimate:
    """A process's running estimate of one cache's counted size (:func:`after_build`)."""

    def __init__(self, size: int):
        self.size = size
        self.builds = 0


_estimates: dict[Path, _Estimate] = {}
_estimates_lock = threading.Lock()
_evicting = threading.Lock()


def after_build(root: Path, entry: Path, size: int, in_use: Iterable[Path]) -> Removed | None:
    """Keep the cache ``root`` under its limit after this process built ``entry`` (``size``
    bytes): scan and evict when the estimate crosses the limit (or every
    :data:`RESCAN_EVERY` builds), never removing ``entry`` nor ``in_use`` (what this process
    has loaded).  Returns what was removed, None when nothing was scanned.  Raises
    :class:`CacheError` for a bad ``$POLYC_CACHE_MAX_SIZE``."""
    limit = size_limit()
    if limit is None:
        return None
    with _estimates_lock:
        estimate = _estimates.get(root)
        if estimate is not None and estimate.builds < RESCAN_EVERY and estimate.size + size <= limit:
            estimate.size += size
            estimate.builds += 1
            return None
    with _evicting:  # (one thread of the process at a time; their scans are short)
        removed = Removed(0, 0, 0)
        counted = evictable_size(inventory(root))
        if counted > limit:
            removed = evict(root, int(limit * EVICT_TO), keep=[entry, *in_use])
            counted -= removed.size
        with _estimates_lock:
            _estimates[root] = _Estimate(counted)
        return removed
