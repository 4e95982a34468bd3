"""Pieces shared by the recognisers of statements that get a hand-structured kernel
(:mod:`polyc.schedule.contraction`, :mod:`polyc.schedule.convolution`).

- :data:`KERNEL_DTYPES`: the element types those kernels are generated for;
- :func:`two_factors`: the two reads of a right-hand side ``read * read`` (through casts that
  do not change the type);
- :func:`is_epilogue`: whether a later statement updates the kernel's target element by
  element (bias, activation), so that it can run on each finished block of the target.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine

#: Element types of the specialised kernels (target and both operands alike).
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def two_factors(rhs: ir.TExpr, dtype: np.dtype) -> tuple[ir.Read, ir.Read] | None:
    """The two reads of ``rhs = read * read`` (through same-type casts), both of ``dtype``, or None."""
    if not (isinstance(rhs, ir.Binary) and rhs.op == "*" and rhs.dtype == dtype):
        return None
    first, second = strip_casts(rhs.lhs), strip_casts(rhs.rhs)
    if not (isinstance(first, ir.Read) and isinstance(second, ir.Read)):
        return None
    if first.dtype != dtype or second.dtype != dtype:
        return None
    return first, second


def strip_casts(expr: ir.TExpr) -> ir.TExpr:
    """``expr`` without the casts around it that do not change its type."""
    while isinstance(expr, ir.Cast) and expr.operand.dtype == expr.dtype:
        expr = expr.operand
    return expr


def is_epilogue(
    statement: ir.CheckedStatement,
    target: str,
    target_indices: tuple[str, ...],
    extents: Mapping[str, Affine],
    definition: ir.CheckedDef,
) -> bool:
    """Whether ``statement`` updates ``target`` element by element after the kernel's statement.

    ``target_indices`` are the kernel statement's indices of the target, by dimension, and
    ``extents`` their extents (each ranges over ``[0, extent)``).  The statement must write
    the target at the same point (same indices by position, full ranges, no reduction), read
    the target only at that point, read other tensors only through affine subscripts and only
    when they are inputs, and be ``=`` or an update without ``!``.
    """
    if statement.target != target or statement.reduction_indices:
        return False
    if statement.op != "=" and statement.init:
        return False
    if len(statement.indices) != len(target_indices) or len(set(statement.indices)) != len(statement.indices):
        return False
    for index, kernel_index in zip(statement.indices, target_indices):
        r = statement.range_of(index)
        if r.lo != Affine.const(0) or r.hi != extents[kernel_index]:
            return False
    own_point = tuple(Affine.var(i) for i in statement.indices)
    for read in ir.reads(statement.rhs):
        if not read.is_affine:
            return False
        if read.tensor == target and tuple(read.subscripts) != own_point:
            return False  # another element of the target may not be final yet
        if read.tensor != target and definition.tensor(read.tensor).role is not ir.Role.INPUT:
            return False
    return True


def affine_conjunction(cond: ir.TExpr) -> tuple[Affine, ...] | None:
    """``cond`` (comparisons of integer affine expressions joined by ``&&``) as expressions
    that must all be >= 0, or None."""
    if isinstance(cond, ir.Binary) and cond.op == "&&":
        lhs, rhs = affine_conjunction(cond.lhs), affine_conjunction(cond.rhs)
        return None if lhs is None or rhs is None else lhs + rhs
    if not (isinstance(cond, ir.Binary) and cond.op in ("<", "<=", ">", ">=", "==")):
        return None
    from polyc.ir.model import affine_value  # the model's reading of index arithmetic (imports this module)

    left, right = affine_value(cond.lhs), affine_value(cond.rhs)
    if left is None or right is None:
        return None
    one = Affine.const(1)
    return {
        "<=": (right - left,),
        "<": (right - left - one,),
        ">=": (left - right,),
        ">": (left - right - one,),
        "==": (left - right, right - left),
    }[cond.op]


def guarded_product(rhs: ir.TExpr) -> tuple[ir.TExpr, tuple[Affine, ...]] | None:
    """``rhs`` as (product, guard): ``cond ? product : 0`` gives the affine conjunction of
    ``cond`` (expressions that must be >= 0), a plain ``rhs`` no guard; None for another
    condition or another value otherwise."""
    if not isinstance(rhs, ir.Select):
        return rhs, ()
    if not (isinstance(rhs.otherwise, ir.Const) and rhs.otherwise.value == 0):
        return None
    guard = affine_conjunction(rhs.cond)
    return None if guard is None else (rhs.then, guard)
