"""Recognising a def that is one transposition: an output that is an input with its dimensions
permuted so that the innermost one moves (``O(n, p, c) = A(n, c, p)``; not
``O(b, h, s, d) = A(b, s, h, d)``, which copies whole rows of ``d``).

Such a def reads along one dimension and writes along another, so a loop nest in either order
strides through one of the two tensors; the transpose kernel (:mod:`polyc.codegen.transpose`)
moves square blocks instead, each read and written along whole cache lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine


@dataclass(frozen=True)
class Transposition:
    """``target = source`` with output dimension ``e`` holding input dimension
    ``permutation[e]``; ``extents`` are the source's."""

    source: str
    target: str
    permutation: tuple[int, ...]
    extents: tuple[Affine, ...]

    @property
    def rows(self) -> int:
        """The source dimension that is the target's innermost: the rows of each plane moved."""
        return self.permutation[-1]

    @property
    def columns_position(self) -> int:
        """The target dimension holding the source's innermost dimension."""
        return self.permutation.index(len(self.permutation) - 1)

    def describe(self) -> str:
        order = ", ".join(str(d) for d in self.permutation)
        return f"{self.target} = {self.source} with its dimensions in the order ({order})"


def recognise_transposition(definition: ir.CheckedDef) -> Transposition | None:
    """The transposition ``definition`` is, or None: one plain assignment of a whole output
    from a whole input of the same element type, each subscript an index, the innermost input
    dimension not the output's innermost (a permutation that keeps it copies rows, which the
    loop nest does at memory speed)."""
    if len(definition.statements) != 1:
        return None
    statement = definition.statements[0]
    read = statement.rhs
    if statement.op != "=" or statement.reduction_indices or not isinstance(read, ir.Read):
        return None
    source, target = definition.tensor(read.tensor), definition.tensor(statement.target)
    if (
        source.role is not ir.Role.INPUT
        or target.role is not ir.Role.OUTPUT
        or source.dtype != target.dtype
        or read.dtype != target.dtype
        or source.rank != target.rank
        or source.rank < 2
        or len(statement.indices) != target.rank
    ):
        return None
    read_indices = []
    for subscript in read.subscripts:
        index = next((i for i in statement.indices if subscript == Affine.var(i)), None)
        if index is None or index in read_indices:
            return None
        read_indices.append(index)
    permutation = tuple(read_indices.index(index) for index in statement.indices)
    ranges = dict(statement.ranges)
    for position, index in enumerate(statement.indices):
        extent = target.shape[position]
        if ranges[index].lo != Affine.const(0) or ranges[index].hi != extent:
            return None
        if source.shape[permutation[position]] != extent:
            return None
    if permutation[-1] == source.rank - 1:
        return None
    return Transposition(source.name, target.name, permutation, tuple(source.shape))
