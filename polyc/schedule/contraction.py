"""Recognising tensor contractions: the statements a BLAS-style (BLIS) kernel computes best.

A statement is a *contraction* when, up to a permutation of every tensor's dimensions, it is a
(batched) matrix product::

    C(b.., m.., n..) +=[!] A(b.., m.., k..) * B(b.., k.., n..)      (any dimension order)

Precisely (:func:`recognise_contraction`):

- the update operator is ``+`` (``+=!`` starts from zero, ``+=`` accumulates into the target);
- the right-hand side is a product of two reads and of any number of *scale* factors
  (constants and reads of 0-d tensors), each possibly under a cast that does not change the
  type; target and both operands are float32, or all three float64;
- or, for ``+=`` (accumulating into the target) and ``+=!``, such a product under a *guard*:
  ``cond ? product : 0`` with ``cond`` a conjunction (``&&``) of affine comparisons of the
  target's indices and the sizes, as in PolyBench's triangular ``syrk`` (``j <= i``).  Where
  the guard is false the statement adds nothing;
- every subscript of the target and of the operands is a single index (coefficient 1, no
  offset); no index repeats within one tensor; the operands are not the target;
- every index ranges over ``[0, extent)`` of each dimension it subscripts;
- every index is in exactly one class, and the classes M, N and K are not empty:

  ========  =======================  ===================================
  class     appears in               e.g. in ``C(m, n) +=! A(m, k) * B(k, n)``
  ========  =======================  ===================================
  batch     C, A and B               (none)
  M         C and A                  m
  N         C and B                  n
  K         A and B (reduced)        k
  ========  =======================  ===================================

Anything else (an index only in one operand and reduced, a diagonal ``A(i, i)``, strides and
offsets as in convolutions, a third tensor factor, ``min=``, integers, a guard on a reduction
index or with ``||``) is not a contraction: the
functions return None and the generic polyhedral path compiles the statement.

This covers matmul in every transposition, batched matmul, tensordot, Kronecker steps, 1x1
convolutions and fully connected layers.  Which operand is "A" is chosen for the kernel: the
operand sharing the target's innermost (non-batch) dimension is B, so that the N group, the
one the micro-kernel vectorises along, is contiguous in C when the layout allows it.  Each
group's indices are ordered as in the target (K: as in A), which is the order the kernel
flattens them in.

:func:`recognise_gemm_def` accepts a whole def: one contraction, followed optionally by
*epilogue* statements that update the same target element by element (bias, activation), as in
``O(i, j) = fmax(O(i, j) + b(j), 0)``.

    >>> from polyc.lang.sema import check_source
    >>> d = check_source('''def tmm(float(M, K) A, float(N, K) B) -> (C) {
    ...     C(m, n) +=! A(m, r_k) * B(n, r_k) }''')[0]
    >>> c = recognise_contraction(d.statements[0], d)
    >>> c.m, c.n, c.k, c.a.tensor, c.b.tensor
    (('m',), ('n',), ('r_k',), 'A', 'B')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.schedule.patterns import KERNEL_DTYPES, guarded_product, is_epilogue, strip_casts

#: Element types a contraction kernel is generated for (target and both operands alike).
CONTRACTION_DTYPES = KERNEL_DTYPES


@dataclass(frozen=True)
class Operand:
    """One factor of a contraction: its tensor and the index subscripting each dimension."""

    tensor: str
    indices: tuple[str, ...]


@dataclass(frozen=True)
class Contraction:
    """A statement recognised as ``C[batch, M, N] (+)= sum_K A[batch, M, K] * B[batch, K, N]``.

    ``batch``, ``m``, ``n`` and ``k`` hold index names, in the order the kernel flattens each
    group (target order; K in A's order).  ``extents`` gives every index's extent (its range
    is ``[0, extent)``).  ``init`` is the statement's ``!``: the target starts from zero
    (beta = 0) instead of accumulating (beta = 1).  ``epilogues`` are the elementwise
    statements after it on the same target (see :func:`recognise_gemm_def`).  ``scale`` holds
    the scalar factors of the product (constants, reads of 0-d tensors; none: 1), ``guard`` the
    affine expressions in the target's indices that must all be >= 0 for an element to be
    updated (none: every element is).
    """

    statement: ir.CheckedStatement
    target: Operand
    a: Operand
    b: Operand
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    extents: tuple[tuple[str, Affine], ...]
    dtype: np.dtype
    init: bool
    epilogues: tuple[ir.CheckedStatement, ...] = ()
    scale: tuple[ir.TExpr, ...] = ()
    guard: tuple[Affine, ...] = ()

    def extent(self, index: str) -> Affine:
        return dict(self.extents)[index]

    @property
    def is_matvec(self) -> bool:
        """A matrix-vector product: A is the matrix, B the vector, the target has no N group."""
        return not self.n

    def describe(self) -> str:
        """One line: the classes of the indices, e.g. ``batch=() M=(m) N=(n) K=(r_k)``."""
        groups = [("batch", self.batch), ("M", self.m), ("N", self.n), ("K", self.k)]
        text = " ".join(f"{name}=({', '.join(indices)})" for name, indices in groups)
        scale = "scalar * " if self.scale else ""
        guard = f" where {' and '.join(f'{g} >= 0' for g in self.guard)}" if self.guard else ""
        return (
            f"{self.target.tensor} {'=' if self.init else '+='} {scale}{self.a.tensor} * {self.b.tensor}"
            f"{guard}: {text}" + (f"; {len(self.epilogues)} epilogue statement(s)" if self.epilogues else "")
        )


def recognise_gemm_def(definition: ir.CheckedDef) -> Contraction | None:
    """The def as one contraction plus elementwise epilogues on its target, or None.

    The first statement must be a contraction into an output; every later statement must be
    an epilogue: it writes that output at the same point as the contraction (same indices by
    position, full ranges, no reduction), reads the output only at that point, reads other
    tensors only through affine subscripts, and is ``=`` or an update without ``!``.
    """
    if not definition.statements:
        return None
    contraction = recognise_contraction(definition.statements[0], definition, matvec=True)
    if contraction is None or definition.tensor(contraction.target.tensor).role is not ir.Role.OUTPUT:
        return None
    epilogues = definition.statements[1:]
    extents = dict(contraction.extents)
    target = contraction.target
    if not all(is_epilogue(s, target.tensor, target.indices, extents, definition) for s in epilogues):
        return None
    return Contraction(**{**contraction.__dict__, "epilogues": tuple(epilogues)})


def worth_a_gemm_kernel(contraction: Contraction) -> bool:
    """Whether the BLIS-style kernel (or, for a matrix-vector product, the matrix-vector
    kernel) suits the contraction's layout.

    Not when the target's innermost dimension is a batch index (as in TC's tensordot, whose
    innermost ``w`` is in all three tensors): the kernel would vectorise along N, made of the
    tensor's outer dimensions, while the generic path vectorises along the contiguous batch
    dimension.

    A matrix-vector product takes the matrix-vector kernel (:mod:`polyc.codegen.gemv`) when
    its groups are laid out as that kernel streams them: the matrix is ``[M.., K..]`` or
    ``[K.., M..]``, the vector ``[K..]`` and the target ``[M..]``, each in one order, so that
    flat indices are contiguous.
    """
    c = contraction
    if c.is_matvec:
        return c.a.indices in (c.m + c.k, c.k + c.m) and c.b.indices == c.k and c.target.indices == c.m
    return c.target.indices[-1] not in c.batch


def recognise_contraction(
    statement: ir.CheckedStatement, definition: ir.CheckedDef, matvec: bool = False
) -> Contraction | None:
    """``statement`` as a :class:`Contraction`, or None when it is not one (see the module doc);
    with ``matvec``, matrix-vector products (no N group, no batch, no guard) are accepted too."""
    target_tensor = definition.tensor(statement.target)
    if statement.op != "+" or target_tensor.dtype not in CONTRACTION_DTYPES:
        return None
    guarded = _guarded_product(statement.rhs, statement.indices, definition.sizes)
    if guarded is None:
        return None
    product, guard = guarded
    split = _factors(product, target_tensor.dtype, definition)
    if split is None:
        return None
    factors, scale = split
    target = Operand(statement.target, statement.indices)
    operands = []
    for read in factors:
        indices = _plain_indices(read.subscripts)
        if indices is None or read.tensor == statement.target:
            return None
        if definition.tensor(read.tensor).dtype != target_tensor.dtype:
            return None
        operands.append(Operand(read.tensor, indices))
    if len(set(target.indices)) != len(target.indices):
        return None
    extents = _full_range_extents(statement, definition, [target, *operands])
    if extents is None:
        return None

    first, second = operands
    in_c, in_a, in_b = set(target.indices), set(first.indices), set(second.indices)
    if set(statement.reduction_indices) != (in_a | in_b) - in_c:
        return None
    batch_set = in_c & in_a & in_b
    m_set, n_set, k_set = (in_c & in_a) - in_b, (in_c & in_b) - in_a, (in_a & in_b) - in_c
    if in_c != batch_set | m_set | n_set or in_a | in_b != batch_set | m_set | n_set | k_set:
        return None  # an index in the target alone, or in one operand alone
    if not k_set or not (m_set or n_set):
        return None  # outer products, dot products
    if not (m_set and n_set):
        # A matrix-vector product: the matrix is A, the target's indices its M group.
        if not matvec or batch_set or guard:
            return None
        if n_set:
            first, second, m_set, n_set = second, first, n_set, m_set
    else:
        # B holds the target's innermost non-batch dimension: the kernel's N group.
        innermost = next((i for i in reversed(target.indices) if i not in batch_set), None)
        if innermost in m_set:
            first, second, m_set, n_set = second, first, n_set, m_set

    for group in (batch_set, m_set, n_set):
        if len(group) > 1 and any(g.names() & group for g in guard):
            return None  # the kernel evaluates guards on single-index groups only

    def in_order(group: set[str], order: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(i for i in order if i in group)

    return Contraction(
        statement=statement,
        target=target,
        a=first,
        b=second,
        batch=in_order(batch_set, target.indices),
        m=in_order(m_set, target.indices),
        n=in_order(n_set, target.indices),
        k=in_order(k_set, first.indices),
        extents=tuple((i, extents[i]) for i in statement.all_indices),
        dtype=target_tensor.dtype,
        init=statement.init,
        scale=scale,
        guard=guard,
    )


def _guarded_product(
    rhs: ir.TExpr, target_indices: tuple[str, ...], sizes: tuple[str, ...]
) -> tuple[ir.TExpr, tuple[Affine, ...]] | None:
    """:func:`~polyc.schedule.patterns.guarded_product` whose condition is linear in
    ``target_indices``, with sizes (else None)."""
    guarded = guarded_product(rhs)
    if guarded is None:
        return None
    for g in guarded[1]:
        indices = g.names() - set(sizes)
        if not indices <= set(target_indices) or not indices <= g.linear_names():
            return None
    return guarded


def _factors(
    product: ir.TExpr, dtype: np.dtype, definition: ir.CheckedDef
) -> tuple[tuple[ir.Read, ir.Read], tuple[ir.TExpr, ...]] | None:
    """The two tensor reads and the scalar factors (constants, 0-d reads) of a product of
    ``dtype`` values (through same-type casts), or None when it has not exactly two tensor
    reads or has any other factor."""
    reads: list[ir.Read] = []
    scale: list[ir.TExpr] = []

    def collect(expr: ir.TExpr) -> bool:
        expr = strip_casts(expr)
        if expr.dtype != dtype:
            return False
        if isinstance(expr, ir.Binary) and expr.op == "*":
            return collect(expr.lhs) and collect(expr.rhs)
        if isinstance(expr, ir.Const):
            scale.append(expr)
            return True
        if isinstance(expr, ir.Read) and not expr.subscripts and definition.tensor(expr.tensor).rank == 0:
            scale.append(expr)
            return True
        if isinstance(expr, ir.Read):
            reads.append(expr)
            return True
        return False

    if not collect(product) or len(reads) != 2:
        return None
    return (reads[0], reads[1]), tuple(scale)


def _plain_indices(subscripts) -> tuple[str, ...] | None:
    """The index names of subscripts that are each a single index, all different; else None."""
    names = []
    for s in subscripts:
        if not isinstance(s, Affine) or s.constant != 0 or len(s.terms) != 1:
            return None
        atom, coefficient = s.terms[0]
        if not isinstance(atom, str) or coefficient != 1:
            return None
        names.append(atom)
    if len(set(names)) != len(names):
        return None
    return tuple(names)


def _full_range_extents(
    statement: ir.CheckedStatement, definition: ir.CheckedDef, operands: list[Operand]
) -> dict[str, Affine] | None:
    """Each index's extent when its range is ``[0, extent)`` of every dimension it subscripts."""
    extents: dict[str, Affine] = {}
    ranges = dict(statement.ranges)
    for operand in operands:
        shape = definition.tensor(operand.tensor).shape
        for index, extent in zip(operand.indices, shape):
            if index not in ranges:
                return None  # a size name used as a subscript
            r = ranges[index]
            if r.lo != Affine.const(0) or r.hi != extent:
                return None
            extents[index] = extent
    return extents
