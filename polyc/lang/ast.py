"""The syntax tree of TC source, as the parser builds it: no names resolved, no types known.

Every node is an immutable record carrying the :class:`SourceLocation` of its first token, so
that later stages can point at the place in the source an error comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyc.errors import SourceLocation

_NOWHERE = SourceLocation(0, 0)


# ----------------------------------------------------------------------------- expressions
@dataclass(frozen=True)
class Expr:
    """Base of expression nodes."""

    @property
    def loc(self) -> SourceLocation:
        """Where the expression starts; every node class holds it as its ``loc`` field."""
        raise NotImplementedError(f"{type(self).__name__} declares no 'loc' field")


@dataclass(frozen=True)
class Number(Expr):
    """A numeric literal; ``is_float`` tells ``2.0``/``1e-5`` from ``2``."""

    value: int | float
    is_float: bool
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Name(Expr):
    """An identifier in expression position: an index, a size, a 0-d tensor or a let name."""

    name: str
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Access(Expr):
    """``T(e0, e1, ...)``: an element of tensor ``T`` (or, for builtin names, a call; see Call)."""

    tensor: str
    args: tuple[Expr, ...]
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Call(Expr):
    """``f(a, b)`` where ``f`` is a builtin function or a type name (a cast).

    The parser produces Call only for names that are builtins or types; every other
    ``name(...)`` is an Access.
    """

    func: str
    args: tuple[Expr, ...]
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Extent(Expr):
    """``T.d``: the extent of tensor ``T`` along dimension ``d``."""

    tensor: str
    dim: int
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Unary(Expr):
    """``-x`` or ``!x``."""

    op: str
    operand: Expr
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Binary(Expr):
    """``a OP b`` with OP one of ``+ - * / % < <= > >= == != && ||``."""

    op: str
    lhs: Expr
    rhs: Expr
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Ternary(Expr):
    """``cond ? then : otherwise``."""

    cond: Expr
    then: Expr
    otherwise: Expr
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


#: Binding strength of the binary operators (higher binds tighter); all are left-associative.
#: The parser and the printer both read it.
BINARY_PRECEDENCE = {
    "||": 1,
    "&&": 2,
    "==": 3,
    "!=": 3,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}


# ----------------------------------------------------------------------------- where clauses
@dataclass(frozen=True)
class RangeClause:
    """``where i in lo:hi``: index ``i`` takes the values lo, lo+1, ..., hi-1."""

    index: str
    lo: Expr
    hi: Expr
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class ExistsClause:
    """``where exists T(i, ...)``: an access used only to infer ranges."""

    access: Access
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class LetClause:
    """``where x = expr``: a name bound for use in the statement."""

    name: str
    value: Expr
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


WhereClause = RangeClause | ExistsClause | LetClause


# ----------------------------------------------------------------------------- statements, defs
#: Assignment operators as written, without the ``!``.
ASSIGN_OPS = ("=", "+=", "*=", "min=", "max=")


@dataclass(frozen=True)
class SequentialLoop:
    """``for t in lo:hi { statements }``: for t = lo, lo+1, ..., hi-1 in turn, the block's
    statements run one after the other with t fixed, each reading what the earlier steps wrote.
    ``number`` tells the loops of a def apart (source order, from 0)."""

    index: str
    lo: Expr
    hi: Expr
    number: int
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Statement:
    """``T(i, j) OP[!] rhs where ...``.

    ``indices`` are the left-hand index names (empty for a 0-d target); ``op`` is one of
    ASSIGN_OPS and ``init`` is True when it was followed by ``!``.  ``equivalent`` is TC's
    annotation ``<=> matmul(A(i, k), B(k, j))`` naming a library operation the statement is
    equivalent to; it has no effect on what the statement computes.  ``loop`` is the
    ``for`` block the statement is written in, if any.
    """

    target: str
    indices: tuple[str, ...]
    op: str
    init: bool
    rhs: Expr
    where: tuple[WhereClause, ...] = ()
    equivalent: Access | None = None
    loop: SequentialLoop | None = None
    loc: SourceLocation = field(default=_NOWHERE, compare=False)
    index_locs: tuple[SourceLocation, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class Param:
    """An input or output in a def's signature.

    ``dtype`` is the type name as written (None for a bare output name); ``sizes`` holds one
    Name or Number per dimension, or is None when no parenthesised size list was written
    (a 0-d input ``float x``, or a bare output).
    """

    name: str
    dtype: str | None
    sizes: tuple[Name | Number, ...] | None
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class Def:
    """``def name(inputs) -> (outputs) { statements }``; the statements of ``for`` blocks are
    listed in place, each pointing at its block."""

    name: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    statements: tuple[Statement, ...]
    loc: SourceLocation = field(default=_NOWHERE, compare=False)


@dataclass(frozen=True)
class SourceFile:
    """A parsed TC source: its defs in order, plus the text and file name for messages."""

    defs: tuple[Def, ...]
    text: str = field(default="", compare=False, repr=False)
    filename: str = field(default="<tc>", compare=False)

    def get(self, name: str) -> Def | None:
        return next((d for d in self.defs if d.name == name), None)
