"""Tile sizes: given by the user, or chosen by a simple model of the machine's caches.

The model: a tile of a band with sizes T1..Tn touches, for each access, the product of the tile
sizes of the members that move its subscripts (an access moved by k members touches about T^k
elements).  The default picks the largest equal power-of-two size whose total footprint fits in
half the L2 cache, so that a tile's data stays cached while the tile runs.  The caches are this
machine's, or the ``cache_sizes`` option's (exports for another machine).
"""
from __future__ import annotations

import functools
from pathlib import Path

import islpy as isl

from polyc.ir.model import PolyProgram
from polyc.lang.symbolic import Affine
from polyc.options import Options

_CANDIDATE_SIZES = (256, 128, 64, 32, 16, 8)


def cache_sizes(options: Options | None = None) -> dict[int, int]:
    """Data/unified cache size in bytes per level (1, 2, 3): ``options.cache_sizes`` when given
    (an export for another machine), else this machine's."""
    if options is not None and options.cache_sizes is not None:
        return dict(zip((1, 2, 3), options.cache_sizes))
    return machine_cache_sizes()


@functools.lru_cache(maxsize=None)
def machine_cache_sizes() -> dict[int, int]:
    """Data/unified cache size in bytes per level, read from Linux sysfs (defaults elsewhere)."""
    sizes = {1: 32 * 1024, 2: 1024 * 1024, 3: 8 * 1024 * 1024}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for entry in base.glob("index*"):
            kind = (entry / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = int((entry / "level").read_text())
            text = (entry / "size").read_text().strip().upper()
            factor = {"K": 1024, "M": 1024 * 1024}.get(text[-1], 1)
            sizes[level] = int(text.rstrip("KM")) * factor
    except (OSError, ValueError):
        pass
    return sizes


def choose_tile_sizes(node: isl.ScheduleNode, program: PolyProgram,
                      user_sizes: tuple[int, ...] | None, caches: dict[int, int]) -> list[int] | None:
    """Tile sizes for the band at ``node`` (outermost member first), or None not to tile."""
    n = node.band_n_member()
    if user_sizes:
        sizes = list(user_sizes[:n])
        return sizes + [sizes[-1]] * (n - len(sizes))
    from polyc.schedule.transform import member_indices  # shares the member analysis

    movers: list[dict[str, str]] = [member_indices(node, m, program) for m in range(n)]
    footprints: list[tuple[int, int]] = []  # (members moving the access, element size)
    statements = set().union(*[m.keys() for m in movers]) if movers else set()
    for name in statements:
        statement = program.statement(name)
        indices = {m[name] for m in movers if name in m}
        accesses = [(statement.source.target, tuple(Affine.var(i) for i in statement.source.indices))]
        accesses += [(a.tensor, a.read.subscripts) for a in statement.reads if a.read is not None]
        for tensor, subscripts in accesses:
            moved = sum(1 for index in indices
                        if any(not isinstance(s, Affine) or index in s.names() for s in subscripts))
            footprints.append((moved, program.definition.tensor(tensor).dtype.itemsize))
    budget = caches.get(2, 1 << 20) // 2
    for size in _CANDIDATE_SIZES:
        total = sum(size ** moved * itemsize for moved, itemsize in footprints)
        if total <= budget:
            return [size] * n
    return [_CANDIDATE_SIZES[-1]] * n
