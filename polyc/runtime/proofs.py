"""What a def's define-time proofs found, remembered in the kernel cache.

``polyc.define`` proves every affine access in bounds (:func:`polyc.ir.bounds.check_bounds`) and
finds the outputs and temporaries each def writes entirely before reading them
(:func:`polyc.ir.coverage.written_before_read`).  Both need the def's polyhedral model: isl sets
and maps for every statement and access, milliseconds a def, which an ONNX model's warm start
paid for each of its kernels although every library came from the cache (the warm compile time
of ``python -m benchmarks.onnx_bench``).  Both results depend
only on the def's text and polyc's code, so they are recorded under ``<cache>/proofs/`` by
:func:`polyc.runtime.cache.request_key` of that text, and a later process reads them back.

A def whose proof fails (an access out of bounds for every size) is not recorded: it fails
again, with the same message, each time.  A missing, unreadable or malformed record is a miss,
and so is one whose checksum does not match what it says:
the proofs run again and the record is rewritten.  A cache that cannot be written only loses the
shortcut: ``define`` never fails for the cache's sake.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import islpy as isl

from polyc.errors import CacheError
from polyc.ir.bounds import BoundsPrecondition, check_bounds
from polyc.ir.coverage import written_before_read
from polyc.ir.model import build_program
from polyc.lang.checked import CheckedDef
from polyc.runtime.cache import read_record, request_key, write_record

PROOFS_DIR = "proofs"


@dataclass(frozen=True)
class DefineProofs:
    """``bounds``: what every call's sizes must satisfy; ``written_before_read``: the outputs and
    temporaries whose every element the def writes before any statement reads it (their
    buffers need no zeroing)."""

    bounds: BoundsPrecondition
    written_before_read: frozenset[str]


def define_proofs(definition: CheckedDef) -> DefineProofs:
    """The proofs of ``definition``, from the cache when an earlier process recorded them."""
    key = _proofs_key(definition)
    recorded = _recorded(key, definition) if key is not None else None
    if recorded is not None:
        return recorded
    program = build_program(definition)
    proofs = DefineProofs(
        check_bounds(program),  # raises BoundsError for an always-wrong access
        written_before_read(program, (*definition.outputs, *definition.temporaries)),
    )
    if key is not None:
        found = {"bounds": proofs.bounds.to_json(), "written_before_read": sorted(proofs.written_before_read)}
        write_record(PROOFS_DIR, key, {**found, "digest": _digest(key, found)})
    return proofs


def _digest(key: str, found: dict) -> str:
    """A checksum of what a record says, under its name: a record edited or damaged into another
    well-formed one (no violations where the proof found some) is a miss, not a proof."""
    return hashlib.sha256(json.dumps([key, found], sort_keys=True).encode()).hexdigest()


def _proofs_key(definition: CheckedDef) -> str | None:
    """The record's name (None for a def built without TC text, which is never recorded)."""
    if not definition.source:
        return None
    try:
        return request_key({"proofs": definition.name, "text": definition.source})
    except (OSError, CacheError):  # polyc's sources unreadable for the code digest
        return None


def _recorded(key: str, definition: CheckedDef) -> DefineProofs | None:
    data = read_record(PROOFS_DIR, key)
    if not isinstance(data, dict):
        return None
    found = {name: data.get(name) for name in ("bounds", "written_before_read")}
    if data.get("digest") != _digest(key, found):
        return None
    try:
        bounds = BoundsPrecondition.from_json(data["bounds"], definition.loc.filename)
        covered = frozenset(str(name) for name in data["written_before_read"])
    except (ValueError, KeyError, TypeError, IndexError, isl.Error):  # not what this module writes
        return None
    known = {*definition.outputs, *definition.temporaries}
    if bounds.params != definition.sizes or not covered <= known:
        return None
    return DefineProofs(bounds, covered)
