"""Cutting a def into segments compiled by different back ends, run one after another.

A def whose statements include contractions among other statements (PolyBench's ``gemm``:
``Cout = beta * C`` then ``Cout += alpha * A * B``; ``2mm``/``3mm``: chains of products;
``syr2k``: a sum of two products under a guard) is compiled in *segments*: each contraction
with the elementwise epilogues after it becomes a BLIS-style kernel (:mod:`polyc.codegen.gemm`),
and the statements between them, consecutive ones together, go through the generic polyhedral
path.  TC executes statements in order, each to completion, so running the segments in order
computes exactly the def; what is given up is fusion across segment borders, which a BLIS
kernel could not take part in anyway.

Before cutting, a ``+`` reduction whose right-hand side is a sum of products, each a
contraction (possibly under the same guard), is split into one statement per product:
``C += g ? P + Q : 0`` becomes ``C += g ? P : 0`` then ``C += g ? Q : 0``.  That reorders the
additions (as any blocked reduction does) and nothing else: both statements keep every
reduction index of the original.

Each segment is a def of its own (:func:`sub_definition`): the parent's tensors in the same
order, its sizes and size bindings, and the segment's statements; tensors the segment writes
are its outputs, the others its inputs.

    >>> from polyc.lang.sema import check_source
    >>> d = check_source('''def gemm(double a, double(M, N) C, double(M, K) A, double(K, N) B) -> (D) {
    ...     D(i, j) = 2 * C(i, j)
    ...     D(i, j) += a * A(i, r_k) * B(r_k, j) }''')[0]
    >>> [(s.kind, [t.name for t in s.definition.statements]) for s in plan_segments(d)]
    [('generic', ['S0']), ('gemm', ['S0'])]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from polyc.lang import checked as ir
from polyc.schedule.contraction import Contraction, recognise_contraction, recognise_gemm_def, worth_a_gemm_kernel
from polyc.schedule.patterns import is_epilogue


@dataclass(frozen=True)
class Segment:
    """Consecutive statements compiled together: ``kind`` is ``"gemm"`` or ``"gemv"``
    (``contraction`` set: one contraction, or matrix-vector product, and its epilogues) or
    ``"generic"``."""

    kind: str
    definition: ir.CheckedDef
    contraction: Contraction | None = None


def plan_segments(definition: ir.CheckedDef) -> tuple[Segment, ...] | None:
    """The segments of ``definition``, or None when cutting it buys nothing: no statement is a
    contraction worth a BLIS kernel, or the whole def already is one (with its epilogues)."""
    statements = split_sums(definition)
    groups: list[tuple[str, list[ir.CheckedStatement]]] = []
    position = 0
    while position < len(statements):
        contraction = _gemm_contraction(statements[position], definition)
        if contraction is None:
            if groups and groups[-1][0] == "generic":
                groups[-1][1].append(statements[position])
            else:
                groups.append(("generic", [statements[position]]))
            position += 1
            continue
        group = [statements[position]]
        position += 1
        target, extents = contraction.target, dict(contraction.extents)
        while position < len(statements) and is_epilogue(
            statements[position],
            target.tensor,
            target.indices,
            extents,
            sub_definition(definition, group + [statements[position]], 0),
        ):
            group.append(statements[position])
            position += 1
        groups.append(("gemv" if contraction.is_matvec else "gemm", group))
    if not any(kind != "generic" for kind, _ in groups):
        return None
    if len(groups) == 1 and len(groups[0][1]) == len(definition.statements):
        return None  # the whole def is one contraction kernel already
    segments = []
    for index, (kind, group) in enumerate(groups):
        part = sub_definition(definition, group, index)
        contraction = recognise_gemm_def(part) if kind != "generic" else None
        if kind != "generic" and contraction is None:  # cannot happen: the group was built to be one
            raise AssertionError(f"segment {index} of {definition.name} is not a contraction")
        segments.append(Segment(kind, part, contraction))
    return tuple(segments)


def why_generic(statement: ir.CheckedStatement, definition: ir.CheckedDef) -> str:
    """Why a statement of a generic segment is not a BLIS kernel's (see :func:`plan_segments`)."""
    if statement.loop is not None:
        return "a step of a recurrence (its block stays whole, in one generic segment)"
    contraction = recognise_contraction(statement, definition, matvec=True)
    if contraction is None:
        return "not a contraction"
    return "a contraction whose layout the kernels do not suit (worth_a_gemm_kernel)"


def _gemm_contraction(statement: ir.CheckedStatement, definition: ir.CheckedDef) -> Contraction | None:
    if statement.loop is not None:
        return None  # a step of a recurrence: its block stays whole, in one generic segment
    contraction = recognise_contraction(statement, definition, matvec=True)
    return contraction if contraction is not None and worth_a_gemm_kernel(contraction) else None


def split_sums(definition: ir.CheckedDef) -> list[ir.CheckedStatement]:
    """The statements with every ``+`` reduction over a sum of contractions split into one
    statement per term (see the module doc); the others unchanged."""
    result: list[ir.CheckedStatement] = []
    for statement in definition.statements:
        parts = _split_sum(statement, definition)
        result.extend(parts if parts is not None else [statement])
    return result


def _split_sum(statement: ir.CheckedStatement, definition: ir.CheckedDef) -> list[ir.CheckedStatement] | None:
    if statement.op != "+" or not statement.reduction_indices:
        return None
    rhs = statement.rhs
    guard = rhs if isinstance(rhs, ir.Select) else None
    terms = _sum_terms(guard.then if guard is not None else rhs)
    if len(terms) < 2:
        return None
    parts = []
    for number, term in enumerate(terms):
        part_rhs = dataclasses.replace(guard, then=term) if guard is not None else term
        part = dataclasses.replace(
            statement,
            rhs=part_rhs,
            init=statement.init and number == 0,
            text=f"{statement.text.strip()}  (term {number + 1} of {len(terms)})",
        )
        if _gemm_contraction(part, definition) is None:
            return None
        parts.append(part)
    return parts


def _sum_terms(expr: ir.TExpr) -> list[ir.TExpr]:
    """The terms of a tree of ``+`` (one term: the expression itself)."""
    if isinstance(expr, ir.Binary) and expr.op == "+":
        return _sum_terms(expr.lhs) + _sum_terms(expr.rhs)
    return [expr]


def sub_definition(parent: ir.CheckedDef, statements: list[ir.CheckedStatement], index: int) -> ir.CheckedDef:
    """The def of one segment: ``parent``'s tensors (in order), sizes and bindings, with
    ``statements`` renumbered; the tensors they write are its outputs, the rest its inputs."""
    written = {s.target for s in statements}
    tensors = tuple(
        dataclasses.replace(t, role=ir.Role.OUTPUT if t.name in written else ir.Role.INPUT) for t in parent.tensors
    )
    return dataclasses.replace(
        parent,
        name=f"{parent.name}_part{index}",
        tensors=tensors,
        inputs=tuple(t.name for t in tensors if t.role is ir.Role.INPUT),
        outputs=tuple(t.name for t in tensors if t.role is ir.Role.OUTPUT),
        statements=tuple(dataclasses.replace(s, position=p) for p, s in enumerate(statements)),
    )
