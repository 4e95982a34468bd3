"""Where a plan's intermediate tensors live: offsets in one arena, planned by liveness.

Each kernel's outputs used to be fresh arrays from numpy, so every tensor of a run had memory
of its own: a run of mobilenet_v2 touched all its intermediate tensors' memory once, more than
the last-level cache, and a kernel's output was written to lines that no cache held (its
1 x 96 x 112 x 112 convolution took far longer in the model than with a cached output).
onnxruntime plans its buffers from their lifetimes instead; so does this module:

* a value lives from the step that computes it to the last step that reads it or any view of
  it (views are reshapes or parts of their source's memory);
* the values a run returns, and those of their memory, are not in the arena (they are the
  user's arrays), nor are outputs that their kernel reads before it writes them all (they must
  start as zeros: a fresh ``numpy.zeros``);
* at each step the new outputs take the first free range large enough (freed ranges merge with
  their neighbours), and the ranges of values read for the last time are freed after it.  A
  range freed a step ago is most likely still in a cache, and first fit puts the next output
  there.

An arena is one ``numpy.empty`` of :attr:`MemoryPlan.size` bytes with the arrays of every value
placed in it built once (:class:`Arena`); a plan keeps the arenas of finished runs for the next
ones, one per run that was in progress at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from polyc.frontends.onnx.lowering import ViewStep

#: Every value starts at a multiple of this many bytes (a cache line, an AVX-512 vector).
ALIGNMENT = 64


@dataclass(frozen=True)
class MemoryPlan:
    """The arena's size in bytes and each arena value's offset in it (value ident -> bytes)."""

    size: int
    offsets: dict[str, int]


def plan_memory(order: list, outputs: list, arena_values: list) -> MemoryPlan:
    """Offsets for ``arena_values`` (the candidates: kernel outputs in ``order``, the plan's
    steps, that start unread) so that no two values alive at the same step overlap.
    ``outputs``: the values the run returns."""
    root: dict[str, str] = {}  # a view's target -> the value whose memory it is
    for item in order:
        if isinstance(item, ViewStep):
            root[item.target.ident] = root.get(item.source.ident, item.source.ident)
    returned = {root.get(v.ident, v.ident) for v in outputs}
    candidates = {v.ident: v for v in arena_values if v.ident not in returned}
    last_read: dict[str, int] = {}
    for position, item in enumerate(order):
        for value in [item.source] if isinstance(item, ViewStep) else item.inputs:
            last_read[root.get(value.ident, value.ident)] = position
    free: list[tuple[int, int]] = []  # sorted, disjoint, merged ranges [start, end)
    top = 0
    offsets: dict[str, int] = {}
    ends_at: dict[int, list[tuple[int, int]]] = {}  # step -> the (start, size) freed after it
    for position, item in enumerate(order):
        if isinstance(item, ViewStep):
            continue
        for value in item.outputs:
            if value.ident not in candidates:
                continue
            size = _rounded(_nbytes(value))
            start, top = _take(free, top, size)
            offsets[value.ident] = start
            ends_at.setdefault(max(position, last_read.get(value.ident, position)), []).append((start, size))
        for start, size in ends_at.pop(position, ()):
            _give(free, start, size)
    return MemoryPlan(top, offsets)


class ResolvedCalls(Protocol):
    """A plan's kernel calls on one arena, resolved (:class:`polyc.frontends.onnx.plan._ResolvedRun`)."""

    def takes(self, buffers: dict) -> bool:
        """Whether the feeds in ``buffers`` have the dtypes the calls were resolved for."""
        ...

    def run(self, buffers: dict, seconds: list | None = None) -> dict:
        """Runs the calls on the arena; returns ``buffers`` with every value's array."""
        ...


class Arena:
    """One run's memory: the arrays of the plan's arena values, by ident."""

    def __init__(self, memory: MemoryPlan, values: list):
        self.buffer = np.empty(memory.size + ALIGNMENT, np.uint8)
        skip = -self.buffer.ctypes.data % ALIGNMENT
        self.arrays: dict[str, np.ndarray] = {}
        self.resolved: ResolvedCalls | None = None  # the plan's calls on this memory, once resolved (plan.py)
        for value in values:
            offset = skip + memory.offsets[value.ident]
            self.arrays[value.ident] = (
                self.buffer[offset : offset + _nbytes(value)].view(value.dtype).reshape(value.tc_shape)
            )


def _nbytes(value) -> int:
    return value.size * np.dtype(value.dtype).itemsize


def _rounded(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


def _take(free: list, top: int, size: int) -> tuple[int, int]:
    """The start of the first free range of ``size`` bytes (or the end of the arena, which grows:
    over a free range that reaches it, if there is one), and the arena's new end."""
    for position, (start, end) in enumerate(free):
        if end - start >= size:
            free[position : position + 1] = [(start + size, end)] if end - start > size else []
            return start, top
    if free and free[-1][1] == top:
        start, _ = free.pop()
        return start, start + size
    return top, top + size


def _give(free: list, start: int, size: int) -> None:
    """Frees [start, start + size), merged with the free ranges it touches."""
    end = start + size
    kept = []
    for other_start, other_end in free:
        if other_end == start:
            start = other_start
        elif other_start == end:
            end = other_end
        else:
            kept.append((other_start, other_end))
    kept.append((start, end))
    free[:] = sorted(kept)
