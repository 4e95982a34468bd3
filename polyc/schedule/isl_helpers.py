"""Small isl conveniences the schedule stages share: the pieces of union sets and maps, and the
constant values of loop bounds once a program's sizes are fixed."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import islpy as isl

from polyc.errors import PolycError


def sets(union: isl.UnionSet) -> list[isl.Set]:
    """The sets of ``union``, one per statement."""
    found: list[isl.Set] = []
    union.foreach_set(found.append)
    return found


_Item = TypeVar("_Item")


def combine_all(items: list[_Item], combine: Callable[[_Item, _Item], _Item]) -> _Item | None:
    """``items`` combined in order by the associative ``combine`` (None for none), in halves:
    isl copies the union, sequence or set that it extends, so adding one item at a time would
    copy the growing result once per item (isl flattens nested sequences and sets, so the
    result is the one of adding them one at a time)."""
    if not items:
        return None
    while len(items) > 1:
        items = [combine(*items[i : i + 2]) if i + 1 < len(items) else items[i] for i in range(0, len(items), 2)]
    return items[0]


def named(union: isl.UnionSet, name: str) -> isl.UnionSet:
    """The part of ``union`` whose tuple is ``name``."""
    result = isl.UnionSet.empty(union.get_space())
    for piece in sets(union):
        if piece.get_tuple_name() == name:
            result = result.union(isl.UnionSet.from_set(piece))
    return result


def out_dims(flat: isl.UnionMap) -> int:
    """How many output dimensions the maps of a flat schedule have (0 for an empty one)."""
    maps: list[isl.Map] = []
    flat.foreach_map(maps.append)
    return maps[0].dim(isl.dim_type.out) if maps else 0


def project_params(union: isl.UnionSet, names: list[str]) -> isl.UnionSet:
    """``union`` with the parameters ``names`` (those it has) projected out."""
    for name in names:
        position = union.get_space().find_dim_by_name(isl.dim_type.param, name)
        if position >= 0:
            union = union.project_out(isl.dim_type.param, position, 1)
    return union


def constant_bound(bound: isl.PwAff) -> int:
    """The integer a bound computed under fixed sizes is; a PolycError (an internal one) when it
    is not a single integer constant."""
    pieces: list[isl.Aff] = []
    bound.foreach_piece(lambda _set, aff: pieces.append(aff))
    if len(pieces) != 1 or not pieces[0].is_cst():
        raise PolycError(f"internal: the GPU mapping found a loop bound that is not a constant: {bound}")
    value = pieces[0].get_constant_val()
    if not value.is_int():
        raise PolycError(f"internal: the GPU mapping found a fractional loop bound: {bound}")
    return value.to_python()


def value_range(values: isl.UnionSet, context: isl.Set) -> tuple[int, int]:
    """The smallest and the largest of one-dimensional ``values`` with the sizes fixed by
    ``context`` (a schedule member's values over a launch, say)."""
    fixed = isl.Set.from_union_set(values).intersect_params(context)
    fixed = fixed.project_out(isl.dim_type.param, 0, fixed.dim(isl.dim_type.param))
    return constant_bound(fixed.dim_min(0)), constant_bound(fixed.dim_max(0))
