"""Recognising integer contractions: 8-bit matrix products accumulated in int32, with zero points.

The canonical form (each tensor's dimensions in any order, as for float contractions in
:mod:`polyc.schedule.contraction`)::

    Y(b.., m.., n..) +=[!] (int32(A(b.., m.., k..)) - ZA) * (int32(B(b.., k.., n..)) - ZB)

- ``Y`` is an int32 output, written by this one statement (``+=!`` starts from zero, ``+=``
  accumulates into what ``Y`` holds);
- ``A`` and ``B`` are int8 or uint8 tensors, each read under a cast to int32; which factor
  comes first does not matter;
- each ``- Z`` is optional; a zero point is an integer literal or ``int32(Z(..))``, a read of an
  integer tensor (of at most 32 bits) whose subscripts are constants or indices of its own
  operand's group: of the M group for A's (one zero point per row), of the N group for B's
  (one per column).  ``int32(ZA(0))`` or a 0-d ``int32(ZA)``: one value;
- the indices are classed as for float contractions (batch, M, N and K, none of M, N, K empty),
  each subscript a single index over its dimension's full range.

The def may go on with **epilogue statements** (:class:`IntegerEpilogue`) that compute, element
by element, from the product's elements other tensors of its points (a requantization into
uint8, a bias, a dequantization into float; ``Y`` then may be a temporary): each ``=`` over one
point of the product, the product's indices in any order (``Q(n, f, p) = g(Y(f, n, p), ..)``),
reading ``Y`` and the epilogues' earlier targets only at that point, and inputs at any affine
subscripts.  The kernel applies them to each block of its sums as it finishes it.

Anything else is not an integer contraction: :func:`recognise_integer_gemm_def` returns None and
the other paths compile the def (the generic loop nest computes it exactly, slowly).

    >>> from polyc.lang.sema import check_source
    >>> d = check_source('''def q(uint8(M, K) A, int8(K, N) B, uint8 ZA) -> (Y) {
    ...     Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * int32(B(r_k, n)) }''')[0]
    >>> c = recognise_integer_gemm_def(d)
    >>> c.describe()
    'Y = (A - ZA) * B: uint8 x int8 -> int32, batch=() M=(m) N=(n) K=(r_k)'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.schedule.contraction import Operand, _full_range_extents, _plain_indices

#: The operand types of an integer contraction.
OPERAND_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))

#: The types a zero point may be read as (converted to int32 exactly).
ZERO_POINT_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))


@dataclass(frozen=True)
class ZeroPoint:
    """What an operand is shifted by: a literal ``value`` (``tensor`` None), or the element of
    ``tensor`` at ``subscripts`` (each a constant or an index of the operand's M or N group)."""

    tensor: str | None
    value: int = 0
    subscripts: tuple[Affine, ...] = ()

    def describe(self) -> str:
        return str(self.value) if self.tensor is None else self.tensor

    @property
    def indices(self) -> frozenset[str]:
        """The indices the zero point varies with (none: one value)."""
        return frozenset(name for s in self.subscripts for name in s.names())


@dataclass(frozen=True)
class IntegerEpilogue:
    """A statement applied to the product's elements after it: ``points`` maps each of the
    statement's indices to the contraction's index at the same point (of its batch, M or N
    groups)."""

    statement: ir.CheckedStatement
    points: tuple[tuple[str, str], ...]

    def contraction_index(self, index: str) -> str:
        return dict(self.points)[index]


@dataclass(frozen=True)
class IntegerContraction:
    """A statement recognised as ``Y[batch, M, N] (+)= sum_K (A - za)[batch, M, K] * (B - zb)[batch, K, N]``.

    Groups and extents as in :class:`polyc.schedule.contraction.Contraction`; ``a_zero`` and
    ``b_zero`` are None where the operand is not shifted."""

    statement: ir.CheckedStatement
    target: Operand
    a: Operand
    b: Operand
    a_dtype: np.dtype
    b_dtype: np.dtype
    a_zero: ZeroPoint | None
    b_zero: ZeroPoint | None
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    extents: tuple[tuple[str, Affine], ...]
    init: bool
    epilogues: tuple[IntegerEpilogue, ...] = ()

    def extent(self, index: str) -> Affine:
        return dict(self.extents)[index]

    def describe(self) -> str:
        """One line: the product, its types and the classes of its indices (its epilogues are
        ``epilogues``)."""

        def factor(operand: Operand, zero: ZeroPoint | None) -> str:
            return operand.tensor if zero is None else f"({operand.tensor} - {zero.describe()})"

        groups = [("batch", self.batch), ("M", self.m), ("N", self.n), ("K", self.k)]
        text = " ".join(f"{name}=({', '.join(indices)})" for name, indices in groups)
        return (
            f"{self.target.tensor} {'=' if self.init else '+='} {factor(self.a, self.a_zero)} * "
            f"{factor(self.b, self.b_zero)}: {self.a_dtype} x {self.b_dtype} -> int32, {text}"
        )


def recognise_integer_gemm_def(definition: ir.CheckedDef) -> IntegerContraction | None:
    """The def as one integer contraction, with its epilogues, into outputs (see the module doc),
    or None."""
    if not definition.statements:
        return None
    statement = definition.statements[0]
    target_tensor = definition.tensor(statement.target)
    if statement.op != "+" or target_tensor.dtype != np.dtype(np.int32):
        return None
    if target_tensor.role is not ir.Role.OUTPUT and not (
        target_tensor.role is ir.Role.TEMPORARY and len(definition.statements) > 1
    ):
        return None
    rhs = statement.rhs
    if not (isinstance(rhs, ir.Binary) and rhs.op == "*"):
        return None
    factors = [_shifted_read(side, definition) for side in (rhs.lhs, rhs.rhs)]
    if None in factors:
        return None
    (first, first_zero), (second, second_zero) = factors  # type: ignore[misc]
    target = Operand(statement.target, statement.indices)
    operands = []
    for read in (first, second):
        indices = _plain_indices(read.subscripts)
        if indices is None:
            return None
        operands.append(Operand(read.tensor, indices))
    if len(set(target.indices)) != len(target.indices):
        return None
    extents = _full_range_extents(statement, definition, [target, *operands])
    if extents is None:
        return None
    a, b = operands
    in_c, in_a, in_b = set(target.indices), set(a.indices), set(b.indices)
    if set(statement.reduction_indices) != (in_a | in_b) - in_c:
        return None
    batch = in_c & in_a & in_b
    m, n, k = (in_c & in_a) - in_b, (in_c & in_b) - in_a, (in_a & in_b) - in_c
    if in_c != batch | m | n or in_a | in_b != batch | m | n | k or not (m and n and k):
        return None
    a_zero, b_zero = first_zero, second_zero
    # B holds the target's innermost non-batch dimension: the N group the kernel vectorises along.
    innermost = next((i for i in reversed(target.indices) if i not in batch), None)
    if innermost in m:
        a, b, m, n, a_zero, b_zero = b, a, n, m, b_zero, a_zero
    if target.indices[-1] in batch:
        return None  # vectorising along N would stride through the target
    if (a_zero is not None and not a_zero.indices <= m) or (b_zero is not None and not b_zero.indices <= n):
        return None  # a zero point per batch or per K: not a shift the kernel can correct by sums

    def in_order(group: set[str], order: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(i for i in order if i in group)

    epilogues = _epilogues(definition, target, extents)
    if epilogues is None:
        return None
    return IntegerContraction(
        statement=statement,
        target=target,
        a=a,
        b=b,
        a_dtype=definition.tensor(a.tensor).dtype,
        b_dtype=definition.tensor(b.tensor).dtype,
        a_zero=a_zero,
        b_zero=b_zero,
        batch=in_order(batch, target.indices),
        m=in_order(m, target.indices),
        n=in_order(n, target.indices),
        k=in_order(k, a.indices),
        extents=tuple((i, extents[i]) for i in statement.all_indices),
        init=statement.init,
        epilogues=epilogues,
    )


def _epilogues(
    definition: ir.CheckedDef, target: Operand, extents: dict[str, Affine]
) -> tuple[IntegerEpilogue, ...] | None:
    """The statements after the contraction as epilogues on its points (see the module doc), or
    None where one is not."""
    # Each tensor computed so far, by dimension: the contraction's index it is at.
    points: dict[str, tuple[str, ...]] = {target.tensor: target.indices}
    inputs = {t.name for t in definition.tensors if t.role is ir.Role.INPUT}
    epilogues = []
    for statement in definition.statements[1:]:
        if statement.op != "=" or statement.reduction_indices or statement.loop is not None:
            return None
        mapping: dict[str, str] = {}
        for read in ir.reads(statement.rhs):
            if read.tensor in points:
                indices = _plain_indices(read.subscripts)
                if indices is None or len(set(indices)) != len(indices):
                    return None
                for mine, theirs in zip(indices, points[read.tensor]):
                    if mapping.setdefault(mine, theirs) != theirs:
                        return None
            elif read.tensor not in inputs or not read.is_affine:
                return None
        written = statement.indices
        if (
            set(mapping) != set(written)
            or len(set(mapping.values())) != len(mapping)
            or set(mapping.values()) != set(target.indices)
            or len(set(written)) != len(written)
            or statement.target in inputs
        ):
            return None  # not one point of the product each, or the product not whole
        if statement.target in points and tuple(mapping[i] for i in written) != points[statement.target]:
            return None  # a tensor computed so far, updated at another point than its own
        for index in written:
            r = statement.range_of(index)
            if r.lo != Affine.const(0) or r.hi != extents[mapping[index]]:
                return None
        points[statement.target] = tuple(mapping[i] for i in written)
        epilogues.append(IntegerEpilogue(statement, tuple(mapping.items())))
    return tuple(epilogues)


def _int32_cast_operand(expr: ir.TExpr) -> ir.TExpr | None:
    """What ``int32(x)`` casts (None: ``expr`` is not a cast to int32)."""
    return expr.operand if isinstance(expr, ir.Cast) and expr.dtype == np.dtype(np.int32) else None


def _shifted_read(expr: ir.TExpr, definition: ir.CheckedDef) -> tuple[ir.Read, ZeroPoint | None] | None:
    """``int32(X(..))`` or ``int32(X(..)) - zero`` with X of 8 bits: the read and its zero point."""
    zero = None
    if isinstance(expr, ir.Binary) and expr.op == "-" and expr.dtype == np.dtype(np.int32):
        zero = _zero_point(expr.rhs, definition)
        if zero is None:
            return None
        expr = expr.lhs
    read = _int32_cast_operand(expr)
    if not isinstance(read, ir.Read) or definition.tensor(read.tensor).dtype not in OPERAND_DTYPES:
        return None
    if definition.tensor(read.tensor).role is not ir.Role.INPUT:
        return None
    return read, zero


def _zero_point(expr: ir.TExpr, definition: ir.CheckedDef) -> ZeroPoint | None:
    """An integer literal, or ``int32(Z(..))`` with each subscript a constant or a single index."""
    operand = _int32_cast_operand(expr)
    if isinstance(operand, ir.Const):
        expr = operand
    if isinstance(expr, ir.Const):
        value = expr.value
        if isinstance(value, (bool, np.bool_)) or not float(value).is_integer():
            return None
        value = int(value)
        return ZeroPoint(None, value) if np.iinfo(np.int32).min <= value <= np.iinfo(np.int32).max else None
    read = operand
    if not isinstance(read, ir.Read) or definition.tensor(read.tensor).dtype not in ZERO_POINT_DTYPES:
        return None
    if definition.tensor(read.tensor).role is not ir.Role.INPUT:
        return None
    subscripts: list[Affine] = []
    for s in read.subscripts:
        if not isinstance(s, Affine):
            return None  # a gathered zero point
        subscripts.append(s)
        if s.terms and (
            s.constant != 0 or len(s.terms) != 1 or s.terms[0][1] != 1 or not isinstance(s.terms[0][0], str)
        ):
            return None
        if s.terms and s.terms[0][0] in definition.sizes:
            return None
    return ZeroPoint(read.tensor, 0, tuple(subscripts))
