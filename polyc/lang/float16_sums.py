"""float16 sums and products accumulate in float32, rounded to float16 once.

polyc computes every float16 operation in float32 and rounds its result, as numpy does.  For a
reduction that would round after every term: the accumulator stops growing once a term is below
half its spacing (a float16 matrix product with K = 4000 terms in [0, 1) came out 930 instead of
1005.5), while numpy's sums and products of float16 accumulate in float32.  So ``define()``
rewrites, for the C back end and the interpreter, each ``+`` or ``*`` reduction into a float16
tensor as statements over a float32 temporary of the target's shape::

    C(m, n) +=! A(m, r_k) * B(r_k, n)   ->   C_sum32(m, n) +=! float(A(m, r_k)) * float(B(r_k, n))
                                             C(m, n) = float16(C_sum32(m, n))

(a reduction without ``!`` first copies the target's elements into the temporary).  The terms
are computed in float32 too, their float16 operands widened, as numpy's matmul does for
float16 (its einsum rounds every step; a user's explicit cast to float16 inside the terms
still rounds).  min and max are exact in float16 and are left alone, as is a reduction that
reads its own target.  The GPU back ends do not rewrite: their mappers keep shared and
register tiles in float16 (a temporary in float32 lost them), and round each step.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine

FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)


def _needs_float32(definition: ir.CheckedDef, statement: ir.CheckedStatement) -> bool:
    return (
        statement.op in ("+", "*")
        and bool(statement.reduction_indices)
        and definition.tensor(statement.target).dtype == FLOAT16
        and all(read.tensor != statement.target for read in ir.reads(statement.rhs))
    )


def _widened(expr: ir.TExpr) -> ir.TExpr:
    """``expr`` computed in float32 wherever it computed in float16: float16 reads and constants
    widened, operations on them done in float32.  A cast to float16 of a wider value (the
    user's own rounding) is kept, and its result widened."""

    def wide(dtype: np.dtype) -> np.dtype:
        return FLOAT32 if dtype == FLOAT16 else dtype

    if isinstance(expr, ir.Read):
        read = dataclasses.replace(
            expr, subscripts=tuple(_widened(sub) if isinstance(sub, ir.TExpr) else sub for sub in expr.subscripts)
        )
        return ir.Cast(FLOAT32, read) if expr.dtype == FLOAT16 else read
    if isinstance(expr, ir.Const):
        return dataclasses.replace(expr, dtype=wide(expr.dtype))
    if isinstance(expr, ir.Unary):
        return dataclasses.replace(expr, dtype=wide(expr.dtype), operand=_widened(expr.operand))
    if isinstance(expr, ir.Binary):
        return dataclasses.replace(expr, dtype=wide(expr.dtype), lhs=_widened(expr.lhs), rhs=_widened(expr.rhs))
    if isinstance(expr, ir.Select):
        return dataclasses.replace(
            expr,
            dtype=wide(expr.dtype),
            cond=_widened(expr.cond),
            then=_widened(expr.then),
            otherwise=_widened(expr.otherwise),
        )
    if isinstance(expr, ir.Call):
        return dataclasses.replace(expr, dtype=wide(expr.dtype), args=tuple(_widened(a) for a in expr.args))
    if isinstance(expr, ir.Cast):
        operand = _widened(expr.operand)
        if expr.dtype == FLOAT16 and operand.dtype.kind == "f" and operand.dtype.itemsize > 2:
            return ir.Cast(FLOAT32, dataclasses.replace(expr, operand=operand))  # the user's rounding
        return dataclasses.replace(expr, dtype=wide(expr.dtype), operand=operand)
    return expr  # indices and sizes


def _fresh_name(base: str, taken: set[str]) -> str:
    name, count = base, 1
    while name in taken:
        count += 1
        name = f"{base}{count}"
    taken.add(name)
    return name


def accumulate_float16_in_float32(definition: ir.CheckedDef) -> ir.CheckedDef:
    """``definition`` with its float16 ``+``/``*`` reductions accumulated in float32 (see the
    module docstring); the same object when it has none."""
    if not any(_needs_float32(definition, s) for s in definition.statements):
        return definition
    taken = (
        {t.name for t in definition.tensors}
        | set(definition.sizes)
        | {i for s in definition.statements for i in s.all_indices}
    )
    temporaries: list[ir.Tensor] = []
    statements: list[ir.CheckedStatement] = []

    def add(statement: ir.CheckedStatement) -> None:
        statements.append(dataclasses.replace(statement, position=len(statements)))

    for statement in definition.statements:
        if not _needs_float32(definition, statement):
            add(statement)
            continue
        target = definition.tensor(statement.target)
        wide = ir.Tensor(
            _fresh_name(f"{target.name}_sum32", taken), FLOAT32, target.shape, ir.Role.TEMPORARY, target.loc
        )
        temporaries.append(wide)
        here = tuple(Affine.var(i) for i in statement.indices)
        element_ranges = statement.ranges[: len(statement.indices)]
        note = f"  (float16 {statement.text}, accumulated in float32)"

        def assignment(into: str, value: ir.TExpr, text: str) -> ir.CheckedStatement:
            return ir.CheckedStatement(
                position=0,
                target=into,
                indices=statement.indices,
                reduction_indices=(),
                ranges=element_ranges,
                op="=",
                init=False,
                rhs=value,
                loop=statement.loop,
                text=text,
                loc=statement.loc,
            )

        if not statement.init:  # `+=`: the sum goes on from the target's elements
            add(
                assignment(
                    wide.name,
                    ir.Cast(FLOAT32, ir.Read(FLOAT16, target.name, here)),
                    f"{wide.name}(...) = float({target.name}(...)){note}",
                )
            )
        add(dataclasses.replace(statement, target=wide.name, rhs=_widened(statement.rhs)))
        add(
            assignment(
                target.name,
                ir.Cast(FLOAT16, ir.Read(FLOAT32, wide.name, here)),
                f"{target.name}(...) = float16({wide.name}(...)){note}",
            )
        )
    return dataclasses.replace(
        definition, tensors=definition.tensors + tuple(temporaries), statements=tuple(statements)
    )
