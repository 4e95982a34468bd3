"""Tuning records: every measured candidate, as append-only JSON lines.

One line per measurement, so an interrupted run loses at most the line being written and a
later run resumes from what is there.  The file lives in the kernel cache directory
(``<cache>/tuning/records.jsonl``, see :func:`polyc.runtime.cache.cache_dir`) unless a path is
given or ``$POLYC_TUNING_FILE`` names another.  A line looks like::

    {"schema": 1, "key": {"def": "3f2a...", "sizes": {"M": 1024, ...}, "dtypes": ["float32", ...],
     "target": "c 1a2b...", "machine": "9c8d...", "polyc": "0.1.0"},
     "tc": "def matmul(...) {...}", "machine": {...fingerprint...},
     "options": {"tile_sizes": [96, 2048, 256]}, "status": "ok", "seconds": 0.0061,
     "runs": [...], "message": "", "session": "...", "trial": 7, "config": {"mc": 96, ...},
     "time": "2026-11-23T23:59:00Z"}

``options`` holds only the tuned options that differ from polyc's defaults.  ``status`` is
``ok`` (checked against the reference, then timed), ``wrong`` (a result that did not match: the
candidate is never used), ``error`` (compilation or run failed), or ``pruned`` (stopped after
two runs many times slower than the best).  ``"confirmed": true`` marks the records of a
search's confirmation: its best candidate and polyc's defaults timed against each other in
alternating blocks (:func:`polyc.tuning.search.confirm_candidates`); where a key has some, the
latest confirmation decides (:func:`chosen_record`).

A record is used automatically (:func:`best_options`) only when its whole key matches: the same
def (its canonical text), sizes, dtypes, compiler target, machine fingerprint and polyc version.
Records from another machine can be imported explicitly as starting points for a search
(:func:`polyc.tuning.tune` ``start_from=``); they are never used silently.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

from polyc.errors import PolycError, PolycWarning
from polyc.lang.checked import CheckedDef
from polyc.runtime.machine import MachineFingerprint, this_machine
from polyc.version import __version__ as POLYC_VERSION

fcntl: ModuleType | None
try:
    import fcntl
except ImportError:  # not POSIX: appends are still single writes
    fcntl = None

#: The record format written by this polyc.  Older formats are converted by _UPGRADES on load.
SCHEMA_VERSION = 1
#: schema version N -> a function turning a version-N record (a dict) into a version-N+1 record.
#: Add one entry here each time SCHEMA_VERSION is bumped, so that old files keep loading.
_UPGRADES: dict[int, Callable[[dict], dict]] = {}

RECORD_FILE = Path("tuning") / "records.jsonl"
STATUSES = ("ok", "wrong", "error", "pruned")


def default_records_path() -> Path:
    """``$POLYC_TUNING_FILE`` when set, else ``tuning/records.jsonl`` in the kernel cache directory."""
    if os.environ.get("POLYC_TUNING_FILE"):
        return Path(os.environ["POLYC_TUNING_FILE"]).expanduser().absolute()
    from polyc.runtime.cache import cache_dir

    return cache_dir() / RECORD_FILE


def definition_digest(definition: CheckedDef) -> str:
    """A digest of a def's meaning, independent of its formatting and comments: the checked def's
    tensors, statements and index ranges (what :meth:`CheckedDef.describe` prints), not its text."""
    return hashlib.sha256(definition.describe().encode()).hexdigest()[:20]


@dataclass(frozen=True)
class TuningKey:
    """What a tuned configuration is for.  Equal keys: the record applies."""

    definition: str  # definition_digest
    sizes: tuple[tuple[str, int], ...]  # sorted by name
    dtypes: tuple[str, ...]  # of the inputs, in declared order
    target: str  # the back end and the compiler it builds with
    machine: str  # MachineFingerprint.id
    polyc: str = POLYC_VERSION

    @staticmethod
    def for_call(
        definition: CheckedDef, sizes: Mapping[str, int], target: str, machine: MachineFingerprint | None = None
    ) -> TuningKey:
        machine = machine or this_machine()
        dtypes = tuple(np.dtype(definition.tensor(name).dtype).name for name in definition.inputs)
        return TuningKey(
            definition_digest(definition),
            tuple(sorted((s, int(sizes[s])) for s in definition.sizes)),
            dtypes,
            target,
            machine.id,
        )

    def to_json(self) -> dict:
        return {
            "def": self.definition,
            "sizes": dict(self.sizes),
            "dtypes": list(self.dtypes),
            "target": self.target,
            "machine": self.machine,
            "polyc": self.polyc,
        }

    @staticmethod
    def from_json(data: Mapping) -> TuningKey:
        return TuningKey(
            str(data["def"]),
            tuple(sorted((str(k), int(v)) for k, v in dict(data["sizes"]).items())),
            tuple(str(d) for d in data["dtypes"]),
            str(data["target"]),
            str(data["machine"]),
            str(data["polyc"]),
        )


@dataclass(frozen=True)
class TuningRecord:
    """One measured candidate (see the module docstring for the fields)."""

    key: TuningKey
    options: Mapping[str, object]
    status: str
    seconds: float | None = None
    runs: tuple[float, ...] = ()
    message: str = ""
    tc: str = ""
    machine: Mapping | None = None
    session: str = ""
    trial: int = 0
    config: Mapping[str, object] | None = None  # the search space's knobs, for the cost model
    confirmed: bool = False  # timed in a confirmation (see the module docstring)
    time: str = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    )

    @property
    def timed_seconds(self) -> float:
        """``seconds`` of a record known to hold a time (the callers keep only "ok" records
        with one); such a record without a time is an internal error."""
        assert self.seconds is not None, f"tuning record of {self.key} ({self.status}) holds no time"
        return self.seconds

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA_VERSION,
            "key": self.key.to_json(),
            "tc": self.tc,
            "machine": self.machine,
            "options": dict(self.options),
            "status": self.status,
            "seconds": self.seconds,
            "runs": list(self.runs),
            "message": self.message,
            "session": self.session,
            "trial": self.trial,
            "config": None if self.config is None else dict(self.config),
            "confirmed": self.confirmed,
            "time": self.time,
        }

    @staticmethod
    def from_json(data: Mapping) -> TuningRecord:
        if data.get("status") not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {data.get('status')!r}")
        seconds = data.get("seconds")
        return TuningRecord(
            TuningKey.from_json(data["key"]),
            dict(data.get("options") or {}),
            data["status"],
            None if seconds is None else float(seconds),
            tuple(float(r) for r in data.get("runs") or ()),
            str(data.get("message", "")),
            str(data.get("tc", "")),
            data.get("machine"),
            str(data.get("session", "")),
            int(data.get("trial", 0)),
            data.get("config"),
            bool(data.get("confirmed", False)),
            str(data.get("time", "")),
        )


def _upgrade(data: dict, where: str) -> dict | None:
    """``data`` converted to SCHEMA_VERSION, or None (with a warning) when that cannot be done."""
    version = data.get("schema")
    if not isinstance(version, int):
        warnings.warn(f"{where}: tuning record without a schema version, skipped", PolycWarning, stacklevel=4)
        return None
    if version > SCHEMA_VERSION:
        warnings.warn(
            f"{where}: tuning record of schema {version}, newer than this polyc's "
            f"{SCHEMA_VERSION} (polyc {POLYC_VERSION}); skipped: upgrade polyc to use it",
            PolycWarning,
            stacklevel=4,
        )
        return None
    while version < SCHEMA_VERSION:
        if version not in _UPGRADES:
            warnings.warn(
                f"{where}: tuning record of schema {version}, which this polyc cannot convert; skipped",
                PolycWarning,
                stacklevel=4,
            )
            return None
        data = _UPGRADES[version](data)
        version = data["schema"]
    return data


def read_records(path: str | os.PathLike) -> list[TuningRecord]:
    """Every valid record in ``path`` (missing file: none).  A line that does not parse (a run
    killed mid-write, a hand edit) is skipped with a :class:`polyc.PolycWarning` naming it; a
    file that cannot be read at all is a :class:`PolycError`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as error:
        raise PolycError(f"{path}: cannot read the tuning records: {error.strerror}") from error
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            data = _upgrade(data, where)
            if data is not None:
                records.append(TuningRecord.from_json(data))
        except (ValueError, KeyError, TypeError) as error:
            warnings.warn(f"{where}: unreadable tuning record skipped ({error})", PolycWarning, stacklevel=2)
    return records


def append_record(record: TuningRecord, path: str | os.PathLike | None = None) -> None:
    """Add ``record`` as one line; concurrent writers (threads, processes, Dask workers sharing a
    file system) each append whole lines."""
    path = Path(path) if path is not None else default_records_path()
    line = json.dumps(record.to_json(), sort_keys=True) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as file, _locked(file):
            file.write(line)
            file.flush()
    except OSError as error:
        raise PolycError(f"{path}: cannot write the tuning record: {error.strerror}") from error
    _RECORD_INDEX.pop(path, None)


@contextlib.contextmanager
def _locked(file) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    fcntl.flock(file.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)


def best_record(records: Iterable[TuningRecord], key: TuningKey) -> TuningRecord | None:
    """The fastest checked record for ``key``, or None."""
    matching = [r for r in records if r.key == key and r.status == "ok" and r.seconds is not None]
    return min(matching, key=lambda r: r.timed_seconds) if matching else None


#: path -> ((mtime_ns, size), {key: best record}): re-read only when the file changes.
_RECORD_INDEX: dict[Path, tuple[tuple[int, int], dict[TuningKey, TuningRecord]]] = {}


def best_options(key: TuningKey, path: str | os.PathLike | None = None) -> dict | None:
    """The options of the fastest checked record for ``key`` in the records file, or None.  Cheap
    after the first call: the file is indexed once and re-read only when it changes."""
    try:
        path = Path(path) if path is not None else default_records_path()
        stat = path.stat()
    except (OSError, PolycError):
        return None
    if not stat.st_size:
        return None
    signature = (stat.st_mtime_ns, stat.st_size)
    cached = _RECORD_INDEX.get(path)
    if cached is None or cached[0] != signature:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PolycWarning)  # `polyc tune --list` shows them
            try:
                records = read_records(path)
            except PolycError:
                return None
        cached = _RECORD_INDEX[path] = (signature, chosen_records(records))
    record = cached[1].get(key)
    return dict(record.options) if record is not None else None


#: A confirmed candidate replaces polyc's defaults only when it is this much faster than they
#: were in the same confirmation: a smaller difference is within what the timings vary.
CONFIRMED_MARGIN = 0.02


def chosen_record(records: list[TuningRecord]) -> TuningRecord | None:
    """The record whose options calls of this key use, among ``records`` (all of one key, in
    file order): where there are confirmed ones, the fastest of the latest confirmation (its
    session's), unless polyc's defaults were within CONFIRMED_MARGIN of it there; else the
    fastest checked record."""
    confirmed = [r for r in records if r.confirmed and r.status == "ok" and r.seconds is not None]
    if confirmed:
        latest = [r for r in confirmed if r.session == confirmed[-1].session]
        fastest = min(latest, key=lambda r: r.timed_seconds)
        defaults = [r for r in latest if not r.options]
        if defaults and fastest.timed_seconds > defaults[0].timed_seconds * (1 - CONFIRMED_MARGIN):
            return defaults[0]
        return fastest
    checked = [r for r in records if r.status == "ok" and r.seconds is not None]
    return min(checked, key=lambda r: r.timed_seconds) if checked else None


def chosen_records(records: Iterable[TuningRecord]) -> dict[TuningKey, TuningRecord]:
    """Each key's chosen record (:func:`chosen_record`) among ``records``."""
    by_key: dict[TuningKey, list[TuningRecord]] = {}
    for record in records:
        by_key.setdefault(record.key, []).append(record)
    return {key: chosen for key, held in by_key.items() if (chosen := chosen_record(held)) is not None}


def merge_records(sources: Iterable[str | os.PathLike], into: str | os.PathLike | None = None) -> int:
    """Append to ``into`` (default: this user's records) every record of ``sources`` it does not
    already hold.  Records keep their machine fingerprints, so ones from other machines are
    stored but never used automatically here.  Returns the number of records added."""
    into = Path(into) if into is not None else default_records_path()
    seen = {json.dumps(r.to_json(), sort_keys=True) for r in read_records(into)}
    added = 0
    for source in sources:
        for record in read_records(source):
            text = json.dumps(record.to_json(), sort_keys=True)
            if text not in seen:
                append_record(record, into)
                seen.add(text)
                added += 1
    return added


def record_target(options) -> str:
    """The back end and compiler a record was measured with (part of its key)."""
    from polyc.runtime.compiler import compiler_options

    digest = hashlib.sha256(compiler_options(options).fingerprint().encode()).hexdigest()[:12]
    caches = "" if options.cache_sizes is None else " caches " + "/".join(map(str, options.cache_sizes))
    return f"{options.backend} {digest}{caches}"


def tuned_options(definition: CheckedDef, options, sizes: Mapping[str, int]):
    """``options`` with the best record's values for ``definition`` at ``sizes`` on this machine
    (see ``Options.tuning``), or ``options`` itself when tuning is off or there is no record.
    Options the user set away from their defaults are kept.  Never raises for a bad records file:
    a kernel must compile with or without its tuning history."""
    from polyc.options import Options

    if not options.tuning or not options.specialize or options.backend != "c":
        return options
    try:
        recorded = best_options(TuningKey.for_call(definition, sizes, record_target(options)))
    except (PolycError, OSError, ValueError):
        return options
    if not recorded:
        return options
    defaults = Options()
    changes = {
        name: value
        for name, value in recorded.items()
        if hasattr(defaults, name) and getattr(options, name) == getattr(defaults, name) and name != "winograd"
    }
    if recorded.get("winograd") is False and options.winograd:
        # The Winograd kernel is the user's opt-in (its numerics differ on non-finite values):
        # a record may turn it off where the direct kernel measured faster, never on.
        changes["winograd"] = False
    try:
        return options.replace(**changes) if changes else options
    except PolycError:  # a record naming options this polyc no longer accepts
        return options
