"""Packing in the contraction kernel as statements of a polyhedral program, checked by isl.

The BLIS-style kernel (:mod:`polyc.codegen.gemm`) copies a block of each operand into a
contiguous buffer before its micro-kernel multiplies them.  This module states that copy as
polyhedral statements of one cache block, in the kernel's flat view of a contraction
``C[m, n] += A[m, k] * B[k, n]`` (each of m, n, k a flat index of its group; the kernel's
offset tables turn flat indices into storage offsets).  The block is given by parameters: rows
``ic .. ic+mc`` of A, columns ``jc .. jc+nc`` of B and the K range ``pc .. pc+kc``, inside the
flat extents ``M``, ``N`` and ``K``.  With MR x NR the register block::

    PackA[s, k, i]   Apack[s, k, i] = A[ic + MR s + i, pc + k]     0 <= MR s + i < mc
    PadA[s, k, i]    Apack[s, k, i] = 0                            mc <= MR s + i, MR s < mc
    PackB[s, k, j]   Bpack[s, k, j] = B[pc + k, jc + NR s + j]     0 <= NR s + j < nc
    PadB[s, k, j]    Bpack[s, k, j] = 0                            nc <= NR s + j, NR s < nc
    Kernel[sa, sb, k, i, j]   C[ic + MR sa + i, jc + NR sb + j] += Apack[sa, k, i] * Bpack[sb, k, j]

(each over ``0 <= k < kc``, ``0 <= i < MR``, ``0 <= j < NR``).  ``s`` is a sliver: MR rows of A
or NR columns of B, stored as an ``[kc][MR]`` (``[kc][NR]``) array, so that the micro-kernel
reads both buffers with unit stride.  The *Pad* statements fill the rest of the last sliver
with zeros: the micro-kernel always computes full MR x NR blocks, and the write-back drops the
padded rows and columns.  The schedule of a block is the sequence PackB, PackA, Kernel (the B
panel first: it is shared by all row blocks).

:func:`check_packing` proves with isl, for all parameter values, that this program computes
what the contraction does: every buffer element the micro-kernel reads is written first, by
exactly one Pack or Pad instance (isl's dataflow analysis on the block's schedule); through the
buffers each real (unpadded) Kernel instance reads exactly the elements of A and B the
contraction reads; the Pack statements read inside A and B; and the buffers stay within the
boxes the kernel allocates.

:func:`sliver_loops` gives, for one sliver, the loops isl's AST generator builds for its Pack
and Pad statements, in general or for a sliver wholly inside the block; the C back end prints
both (a gather with zeros past the edge, and a copy for a contiguous source).  The kernel keeps
one hand-written special case of PackB (a transposed float B on AVX-512: 16 x 16 register
transposes), and reads a block in place, with no Pack instances, where packing buys nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import islpy as isl

from polyc.errors import PolycError

#: The parameters of one cache block (see the module doc).
BLOCK_PARAMETERS = ("M", "N", "K", "ic", "mc", "jc", "nc", "pc", "kc")

#: What the block parameters satisfy: non-empty blocks inside the flat extents.
_BLOCK_CONTEXT = (
    "0 <= ic and 1 <= mc and ic + mc <= M and 0 <= jc and 1 <= nc and jc + nc <= N "
    "and 0 <= pc and 1 <= kc and pc + kc <= K"
)


@dataclass(frozen=True)
class PackStatement:
    """One packing statement: its instances, the buffer element each writes, and the source
    element each copies (None for a Pad statement, which writes zero)."""

    name: str
    operand: str  # "A" or "B"
    domain: isl.Set
    write: isl.Map
    read: isl.Map | None


@dataclass(frozen=True)
class PackingProgram:
    """The polyhedral program of one cache block with an MR x NR register block."""

    mr: int
    nr: int
    context: isl.Set
    statements: tuple[PackStatement, ...]
    kernel_domain: isl.Set
    kernel_reads: isl.UnionMap  # Kernel -> Apack, Bpack
    kernel_sources: isl.UnionMap  # the real Kernel instances -> the A and B elements they multiply
    order: isl.UnionMap  # every statement's instances -> their time in a block

    @property
    def schedule(self) -> isl.Schedule:
        """The schedule of a block: ``order`` on the statements' instances."""
        domain = _union_set(isl.UnionSet.from_set(s.domain) for s in self.statements).union(
            isl.UnionSet.from_set(self.kernel_domain)
        )
        return isl.Schedule.from_domain(domain).insert_partial_schedule(
            isl.MultiUnionPwAff.from_union_map(self.order.intersect_domain(domain))
        )

    def statement(self, name: str) -> PackStatement:
        return next(s for s in self.statements if s.name == name)

    def to_isl_text(self) -> str:
        """The program as isl text: domains, accesses and the schedule of a block (for reading)."""
        context = self.context
        lines = [
            f"packing of one cache block of the gemm kernel, register block {self.mr} x {self.nr}:",
            f"block: {context}",
        ]
        for s in self.statements:
            lines += [f"{s.name}: {s.domain.gist_params(context)}", f"  writes {s.write.gist_params(context)}"]
            if s.read is not None:
                lines.append(f"  reads {s.read.gist_params(context)}")
        lines += [
            f"Kernel: {self.kernel_domain.gist_params(context)}",
            f"  reads {self.kernel_reads.gist_params(context)}",
            f"schedule of a block: {self.schedule.get_map().gist_params(context)}",
        ]
        return "\n".join(lines)


@cache
def packing_program(mr: int, nr: int) -> PackingProgram:
    """The packing program of a block for an ``mr`` x ``nr`` register block (see the module
    doc); built once per register block and checked with :func:`check_packing`."""
    ctx = isl.Context()
    params = f"[{', '.join(BLOCK_PARAMETERS)}]"

    def set_(text: str) -> isl.Set:
        return isl.Set.read_from_str(ctx, f"{params} -> {{ {text} }}")

    def map_(text: str) -> isl.Map:
        return isl.Map.read_from_str(ctx, f"{params} -> {{ {text} }}")

    context = set_(f": {_BLOCK_CONTEXT}").params()
    a_box, b_box = f"0 <= k < kc and 0 <= i < {mr}", f"0 <= k < kc and 0 <= j < {nr}"
    a_row, b_column = f"{mr} s + i", f"{nr} s + j"
    statements: tuple[PackStatement, ...] = (
        PackStatement(
            "PackA",
            "A",
            set_(f"PackA[s, k, i] : {a_box} and 0 <= {a_row} < mc"),
            map_("PackA[s, k, i] -> Apack[s, k, i]"),
            map_(f"PackA[s, k, i] -> A[ic + {a_row}, pc + k]"),
        ),
        PackStatement(
            "PadA",
            "A",
            set_(f"PadA[s, k, i] : {a_box} and mc <= {a_row} and 0 <= {mr} s < mc"),
            map_("PadA[s, k, i] -> Apack[s, k, i]"),
            None,
        ),
        PackStatement(
            "PackB",
            "B",
            set_(f"PackB[s, k, j] : {b_box} and 0 <= {b_column} < nc"),
            map_("PackB[s, k, j] -> Bpack[s, k, j]"),
            map_(f"PackB[s, k, j] -> B[pc + k, jc + {b_column}]"),
        ),
        PackStatement(
            "PadB",
            "B",
            set_(f"PadB[s, k, j] : {b_box} and nc <= {b_column} and 0 <= {nr} s < nc"),
            map_("PadB[s, k, j] -> Bpack[s, k, j]"),
            None,
        ),
    )
    statements = tuple(
        PackStatement(
            s.name,
            s.operand,
            s.domain.intersect_params(context),
            s.write.intersect_domain(s.domain).intersect_params(context),
            None if s.read is None else s.read.intersect_domain(s.domain).intersect_params(context),
        )
        for s in statements
    )
    kernel_domain = set_(
        f"Kernel[sa, sb, k, i, j] : 0 <= k < kc and 0 <= i < {mr} and 0 <= j < {nr} "
        f"and 0 <= {mr} sa < mc and 0 <= {nr} sb < nc"
    ).intersect_params(context)
    kernel_reads = (
        isl.UnionMap.from_map(map_("Kernel[sa, sb, k, i, j] -> Apack[sa, k, i]"))
        .union(isl.UnionMap.from_map(map_("Kernel[sa, sb, k, i, j] -> Bpack[sb, k, j]")))
        .intersect_domain(isl.UnionSet.from_set(kernel_domain))
    )
    real = kernel_domain.intersect(set_(f"Kernel[sa, sb, k, i, j] : {mr} sa + i < mc and {nr} sb + j < nc"))
    kernel_sources = (
        isl.UnionMap.from_map(map_(f"Kernel[sa, sb, k, i, j] -> A[ic + {mr} sa + i, pc + k]"))
        .union(isl.UnionMap.from_map(map_(f"Kernel[sa, sb, k, i, j] -> B[pc + k, jc + {nr} sb + j]")))
        .intersect_domain(isl.UnionSet.from_set(real))
    )

    # The block's order: the B panel, then the A block, then the micro-kernel's loops (B
    # slivers outside A slivers, as the kernel runs them).
    order = isl.UnionMap.read_from_str(
        ctx,
        f"{params} -> {{ PackB[s, k, j] -> [0, s, k, j, 0, 0]; PadB[s, k, j] -> [0, s, k, j, 0, 0]; "
        f"PackA[s, k, i] -> [1, s, k, i, 0, 0]; PadA[s, k, i] -> [1, s, k, i, 0, 0]; "
        f"Kernel[sa, sb, k, i, j] -> [2, sb, sa, k, i, j] }}",
    )
    return PackingProgram(mr, nr, context, statements, kernel_domain, kernel_reads, kernel_sources, order)


@cache
def checked_packing_program(mr: int, nr: int) -> PackingProgram:
    """:func:`packing_program`, proved correct by :func:`check_packing` (once per process)."""
    program = packing_program(mr, nr)
    check_packing(program)
    return program


def check_packing(program: PackingProgram) -> None:
    """Prove that the packing program computes what the contraction does, for every block
    (every value of the parameters, see the module doc); raises PolycError (an internal error:
    the kernel must not be built) where it does not."""

    def fail(what: str) -> None:
        raise PolycError(f"internal: packing for the {program.mr} x {program.nr} register block: {what}")

    statements = program.statements
    writes = _union_map(s.write for s in statements)
    if not writes.is_injective():
        fail("two packing statement instances write the same buffer element")

    # Dataflow: every element the micro-kernel reads was written before, in the block's order.
    access = isl.UnionAccessInfo.from_sink(program.kernel_reads)
    access = access.set_must_source(writes).set_schedule(program.schedule)
    flow = access.compute_flow()
    unwritten = flow.get_must_no_source()
    if not unwritten.is_empty():
        fail(f"the micro-kernel reads buffer elements no statement wrote: {unwritten}")

    # Through the buffers, each real Kernel instance multiplies the elements the contraction does.
    producers = flow.get_must_dependence()  # PackX/PadX instance -> Kernel instance
    copies = _union_map(s.read for s in statements if s.read is not None)  # PackX instance -> source
    through_buffers = producers.reverse().apply_range(copies)
    sources = program.kernel_sources
    if not through_buffers.intersect_domain(sources.domain()).is_equal(sources):
        fail("the packed buffers do not hold the operands' elements the micro-kernel needs")
    # Padding: a Kernel instance multiplies a Pad statement's zero exactly when it computes a
    # padded lane (one the write-back drops), so padded lanes hold zeros and real ones never
    # read padding.
    pads = _union_set(isl.UnionSet.from_set(s.domain) for s in statements if s.read is None)
    zero_fed = producers.reverse().intersect_range(pads).domain()
    padded = isl.UnionSet.from_set(program.kernel_domain).subtract(sources.domain())
    if not zero_fed.is_equal(padded):
        fail("padded micro-kernel lanes and zero-filled buffer elements do not match")

    # The copies read inside the operands.
    ctx = program.context.get_ctx()
    inside = isl.UnionSet.read_from_str(
        ctx, "[M, N, K] -> { A[m, k] : 0 <= m < M and 0 <= k < K; B[k, n] : 0 <= k < K and 0 <= n < N }"
    )
    if not copies.range().is_subset(inside):
        fail(f"packing reads outside an operand: {copies.range().subtract(inside)}")

    # The buffers stay in the boxes the kernel allocates (as C arrays, row-major):
    # [ceil(mc / MR)][kc][MR] and [ceil(nc / NR)][kc][NR].
    mr, nr = program.mr, program.nr
    boxes = isl.UnionSet.read_from_str(
        ctx,
        f"[mc, kc, nc] -> {{ Apack[s, k, i] : 0 <= {mr} s < mc and 0 <= k < kc and 0 <= i < {mr}; "
        f"Bpack[s, k, j] : 0 <= {nr} s < nc and 0 <= k < kc and 0 <= j < {nr} }}",
    )
    if not writes.range().is_subset(boxes):
        fail("packing writes outside its buffers")


def sliver_loops(program: PackingProgram, operand: str, full: bool = False) -> isl.AstNode:
    """The loops that pack one sliver of ``operand`` ("A" or "B"): isl's AST of its Pack and Pad
    statements with the sliver ``s`` a parameter, in the buffer's order (k outer); with
    ``full``, for a sliver known to lie wholly inside the block (isl then drops the Pad
    statement and the edge tests).

    The AST calls the statements with their remaining dimensions (``k, i`` or ``k, j``); a
    caller prints Pack as the copy and Pad as the zero fill."""
    parts = [s for s in program.statements if s.operand == operand]
    ctx = program.context.get_ctx()
    params = f"[{', '.join(BLOCK_PARAMETERS)}, s]"
    context = _sliver_as_parameter(parts[0].domain).params()
    if full:
        width, size = (program.mr, "mc") if operand == "A" else (program.nr, "nc")
        context = context.intersect(isl.Set.read_from_str(ctx, f"{params} -> {{ : {width} s + {width} <= {size} }}"))
    domain = _union_set(isl.UnionSet.from_set(_sliver_as_parameter(s.domain)) for s in parts).intersect_params(context)
    # Pack before Pad in each k iteration: the copied rows (or columns) come first.
    order = "; ".join(f"{s.name}[k, x] -> [k, {position}, x]" for position, s in enumerate(parts))
    schedule = isl.UnionMap.read_from_str(ctx, f"{params} -> {{ {order} }}")
    build = isl.AstBuild.from_context(context)
    return build.node_from_schedule_map(schedule.intersect_domain(domain))


def sliver_as_parameter_map(relation: isl.Map) -> isl.Map:
    """A packing access with its statement's first dimension (the sliver) a parameter ``s``."""
    name = relation.get_tuple_name(isl.dim_type.in_)
    n_params = relation.dim(isl.dim_type.param)
    moved = relation.move_dims(isl.dim_type.param, n_params, isl.dim_type.in_, 0, 1)
    return moved.set_dim_name(isl.dim_type.param, n_params, "s").set_tuple_name(isl.dim_type.in_, name)


def _sliver_as_parameter(statement_set: isl.Set) -> isl.Set:
    """A packing statement's instances with its first dimension (the sliver) a parameter ``s``."""
    name = statement_set.get_tuple_name()
    n_params = statement_set.dim(isl.dim_type.param)
    moved = statement_set.move_dims(isl.dim_type.param, n_params, isl.dim_type.set, 0, 1)
    moved = moved.set_dim_name(isl.dim_type.param, n_params, "s")
    return moved.set_tuple_name(name)


def _union_set(parts: Iterable[isl.UnionSet]) -> isl.UnionSet:
    """The union of ``parts`` (at least one)."""
    union: isl.UnionSet | None = None
    for part in parts:
        union = part if union is None else union.union(part)
    assert union is not None, "internal: the union of no sets"
    return union


def _union_map(relations: Iterable[isl.Map]) -> isl.UnionMap:
    """The union of ``relations`` (at least one) as one union map."""
    union: isl.UnionMap | None = None
    for relation in relations:
        part = isl.UnionMap.from_map(relation)
        union = part if union is None else union.union(part)
    assert union is not None, "internal: the union of no relations"
    return union
