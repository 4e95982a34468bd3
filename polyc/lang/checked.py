"""Checked definitions: the front end's output and every later stage's input.

A :class:`CheckedDef` is a TC def with every name resolved, every expression typed, let
bindings inlined, every index given a range and every tensor a dtype and a shape.  Index
expressions, ranges and shapes are :class:`~polyc.lang.symbolic.Affine` values over the def's
size names, so the polyhedral model, the interpreter and code generation all read one fact.

Statement semantics (the reference interpreter is their executable statement): for every point
of the left-hand indices' ranges, the right-hand side is evaluated at every point of the
reduction indices' ranges, the values are combined with the update operator, and the result is
combined with the target's current element (or with the operator's identity when ``init``).
Statements run in order; each reads the tensors as earlier statements left them.  The
statements of a :class:`SequentialLoop` run together: for each value of the loop's index in
increasing order, each of them runs, in order, with that index fixed, so a statement can read
what the block wrote at an earlier step (a recurrence).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from polyc.errors import SourceLocation
from polyc.lang.symbolic import Affine


# ----------------------------------------------------------------------------- typed expressions
@dataclass(frozen=True)
class TExpr:
    """Base of typed expressions; every node has a numpy ``dtype``."""

    dtype: np.dtype


@dataclass(frozen=True)
class Const(TExpr):
    value: int | float | bool


@dataclass(frozen=True)
class IndexValue(TExpr):
    """The current value of an iteration index (int64)."""

    name: str


@dataclass(frozen=True)
class SizeValue(TExpr):
    """A value fixed by the sizes alone: a size name or a tensor extent ``T.d`` (int64)."""

    value: Affine


#: One subscript of a tensor access: affine in indices and sizes, or a data-dependent value.
Subscript = Affine | TExpr


@dataclass(frozen=True)
class Read(TExpr):
    """An element of a tensor.  ``subscripts`` has one entry per dimension."""

    tensor: str
    subscripts: tuple[Subscript, ...]
    loc: SourceLocation = field(default=SourceLocation(0, 0), compare=False)

    @property
    def is_affine(self) -> bool:
        return all(isinstance(s, Affine) for s in self.subscripts)


@dataclass(frozen=True)
class Unary(TExpr):
    """``-x`` (``neg``) or ``!x`` (``not``)."""

    op: str
    operand: TExpr


@dataclass(frozen=True)
class Binary(TExpr):
    """Arithmetic (``+ - * / %``), comparison (``< <= > >= == !=``) or logic (``&& ||``).

    Operands already have the operation's type (comparisons: the promoted operand type).
    ``/`` and ``%`` on integers truncate toward zero as in C; division by zero gives 0.
    """

    op: str
    lhs: TExpr
    rhs: TExpr


@dataclass(frozen=True)
class Select(TExpr):
    """``cond ? then : otherwise``; only the chosen branch's accesses need be in bounds."""

    cond: TExpr
    then: TExpr
    otherwise: TExpr


@dataclass(frozen=True)
class Call(TExpr):
    """A builtin of :mod:`polyc.lang.builtins`, arguments already converted to its type."""

    func: str
    args: tuple[TExpr, ...]


@dataclass(frozen=True)
class Cast(TExpr):
    """Conversion to ``dtype`` with C semantics (float to int truncates toward zero)."""

    operand: TExpr


def walk(expr: TExpr):
    """Yield ``expr`` and every sub-expression, parents first (subscripts included)."""
    yield expr
    if isinstance(expr, Read):
        for s in expr.subscripts:
            if isinstance(s, TExpr):
                yield from walk(s)
    elif isinstance(expr, Unary):
        yield from walk(expr.operand)
    elif isinstance(expr, Binary):
        yield from walk(expr.lhs)
        yield from walk(expr.rhs)
    elif isinstance(expr, Select):
        yield from walk(expr.cond)
        yield from walk(expr.then)
        yield from walk(expr.otherwise)
    elif isinstance(expr, Call):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, Cast):
        yield from walk(expr.operand)


def reads(expr: TExpr) -> list[Read]:
    """Every tensor read in ``expr``, in evaluation order."""
    return [e for e in walk(expr) if isinstance(e, Read)]


# ----------------------------------------------------------------------------- tensors, statements
class Role(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    TEMPORARY = "temporary"


@dataclass(frozen=True)
class Tensor:
    """A tensor of a def: its element type and its shape as expressions in the def's sizes."""

    name: str
    dtype: np.dtype
    shape: tuple[Affine, ...]
    role: Role
    loc: SourceLocation = field(default=SourceLocation(0, 0), compare=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def concrete_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(extent.evaluate(sizes) for extent in self.shape)


@dataclass(frozen=True)
class IndexRange:
    """``lo <= index < hi``, both affine in the sizes.  ``inferred_from`` names the accesses range
    inference took the range from (empty for a ``where`` range), for error messages."""

    lo: Affine
    hi: Affine
    inferred_from: tuple[str, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return f"{self.lo}:{self.hi}"


@dataclass(frozen=True)
class SequentialLoop:
    """``for index in range { ... }`` around a block of consecutive statements.

    Its steps run one after the other in increasing ``index``; within a step, the block's
    statements run in order with ``index`` fixed.  Every statement of the block writes its target
    at ``index``, and reads what the block writes only at an earlier step (``index - c``, c > 0
    constant) or, at the same step, what an earlier statement of the block wrote.  ``first`` is
    the position of the block's first statement, which tells two blocks apart.  A statement that
    reads its own target at an earlier step along one index, outside any ``for`` block, is a
    block of its own.
    """

    index: str
    range: IndexRange
    first: int


def loop_blocks(statements) -> list[tuple[SequentialLoop | None, list]]:
    """``statements`` (checked, or anything with a ``loop``, in order) cut into what runs as a
    unit: each statement outside a loop alone (loop None), each loop's block together."""
    blocks: list[tuple[SequentialLoop | None, list]] = []
    for statement in statements:
        loop = statement.loop
        if loop is not None and blocks and blocks[-1][0] == loop:
            blocks[-1][1].append(statement)
        else:
            blocks.append((loop, [statement]))
    return blocks


#: Update operators of statements after normalisation.
UPDATE_OPS = ("=", "+", "*", "min", "max")


@dataclass(frozen=True)
class CheckedStatement:
    """One statement ``target(indices) op[!] rhs`` with its iteration space.

    ``op`` is ``=`` (plain assignment: no reduction indices) or a reduction operator ``+``,
    ``*``, ``min``, ``max``.  Forms that are equivalent to assignment (``+=!`` with no
    reduction index, ``=!``) are normalised to ``=``.  ``ranges`` lists the left-hand indices
    first, then the reduction indices, in order of first appearance.  ``rhs`` has the
    target's dtype.
    """

    position: int
    target: str
    indices: tuple[str, ...]
    reduction_indices: tuple[str, ...]
    ranges: tuple[tuple[str, IndexRange], ...]
    op: str
    init: bool
    rhs: TExpr
    loop: SequentialLoop | None = None
    text: str = field(default="", compare=False)
    loc: SourceLocation = field(default=SourceLocation(0, 0), compare=False)

    @property
    def name(self) -> str:
        """The statement's name in the polyhedral model: S0, S1, ..."""
        return f"S{self.position}"

    @property
    def has_init_statement(self) -> bool:
        """Whether the polyhedral model gives it a statement of its own that first sets the
        target to the reduction's identity (``S0_init``): a reduction with ``!``."""
        return self.op != "=" and self.init

    @property
    def all_indices(self) -> tuple[str, ...]:
        return self.indices + self.reduction_indices

    def range_of(self, index: str) -> IndexRange:
        return dict(self.ranges)[index]


@dataclass(frozen=True)
class SizeBinding:
    """Where a size's value comes from at call time: dimension ``dim`` of input ``tensor``,
    or (``dim`` None) the value of the 0-d integer input ``tensor``."""

    size: str
    tensor: str
    dim: int | None


@dataclass(frozen=True)
class CheckedDef:
    """A def ready for the polyhedral model and the reference interpreter."""

    name: str
    tensors: tuple[Tensor, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    sizes: tuple[str, ...]
    size_bindings: tuple[SizeBinding, ...]
    statements: tuple[CheckedStatement, ...]
    source: str = field(default="", compare=False, repr=False)
    loc: SourceLocation = field(default=SourceLocation(0, 0), compare=False)

    def tensor(self, name: str) -> Tensor:
        """The tensor called ``name`` (a KeyError if there is none)."""
        return self._tensors_by_name[name]

    @cached_property
    def _tensors_by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in reversed(self.tensors)}  # (the first of a name, as a search finds)

    @property
    def temporaries(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.role is Role.TEMPORARY)

    @property
    def has_sequential_loops(self) -> bool:
        """Whether a statement runs in a sequential loop (a recurrence)."""
        return any(s.loop is not None for s in self.statements)

    def describe(self) -> str:
        """A readable summary: signature with shapes, then each statement with its ranges."""

        def shape(t: Tensor) -> str:
            return f"{t.dtype.name}({', '.join(str(e) for e in t.shape)}) {t.name}"

        lines = [
            f"def {self.name}({', '.join(shape(self.tensor(n)) for n in self.inputs)})"
            f" -> ({', '.join(shape(self.tensor(n)) for n in self.outputs)})"
        ]
        for name in self.temporaries:
            lines.append(f"  temporary {shape(self.tensor(name))}")
        for s in self.statements:
            ranges = ", ".join(f"{i} in {r}" for i, r in s.ranges)
            reduction = f" reduce {s.op} over {', '.join(s.reduction_indices)}" if s.reduction_indices else ""
            lines.append(f"  {s.name}: {s.text.strip()}")
            lines.append(f"      where {ranges or '(no indices)'}{reduction}")
            if s.loop is not None:
                lines.append(
                    f"      in the sequential loop over {s.loop.index} in {s.loop.range} (from S{s.loop.first})"
                )
        return "\n".join(lines)
