"""C99 + OpenMP code generation from a scheduled polyhedral program.

isl builds an AST from the schedule tree (``AstBuild.node_from_schedule``); this module turns
that AST into cgen nodes and prints one translation unit holding one function:

    int polyc_<def>(const float *restrict A, ..., float *restrict C[, int64_t M, ...]);

Tensors are passed as pointers to C-contiguous data (the runtime copies other layouts);
temporaries as zeroed buffers; sizes as int64 arguments, or as constants when the kernel is
specialised.  All index arithmetic is 64-bit.  Marks in the schedule become pragmas:
``parallel`` -> ``#pragma omp parallel for``, ``simd`` -> ``#pragma omp simd``, ``unroll:N`` ->
``#pragma GCC unroll N``.  A ``simd:OP:T;...`` loop reduces into one element of each T: the
element is loaded into a local accumulator before the loop, updated under ``#pragma omp simd
reduction(OP:acc)`` (floating-point min/max through a declared reduction with polyc's fmin/fmax)
and stored back after it.  The function returns 0, or 1 when a data-dependent subscript fell
outside its tensor (the element is then not read, and the caller raises BoundsError).

As it prints, the writer records a :class:`LoopFact` for every loop it writes (the kernel's
``loops``): the loop's iterator and the statement indices it runs over, read off isl's AST, and
the pragmas it put on it.  Explanations (:mod:`polyc.viz.explain`) describe these, so they
cannot disagree with the C: a loop isl elided has no fact, a marked loop whose simd pragma the
writer dropped says so.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import cgen
import islpy as isl
import numpy as np

from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_constant, c_type, to_float16
from polyc.codegen.templates import c_template
from polyc.errors import PolycError
from polyc.ir.model import PolyProgram, PolyStatement, isl_name
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.schedule.register_tiling import RegisterTile
from polyc.schedule.transform import PARALLEL, REDUCE, REGISTER, SIMD, UNROLL, Reduction, loop_mark
from polyc.types import identity

#: OpenMP's operator for a reduction of bools: TC's bool + is "or" and * is "and" (gcc combines
#: the private copies of a _Bool + reduction modulo 2, so true + true would give false).
_BOOL_REDUCTIONS = {"+": "||", "*": "&&", "max": "||", "min": "&&"}

#: Float ``+`` reductions over longer loops add up partial sums of this many iterations, each
#: summed from zero (vectorised), so the rounding error grows with SUM_BLOCK + n / SUM_BLOCK
#: terms instead of n: long sums come out as accurate as numpy's pairwise ones.
SUM_BLOCK = 256
#: A vector loop is written in one version per value of at most this many select conditions it
#: leaves fixed (2 ** n copies of it): see ``_KernelWriter.versioned_simd_loop``.
MAX_VERSIONED_CONDITIONS = 2
# A parallel loop of fewer iterations than this takes the parallel loops nested right inside it
# into its iteration space (OpenMP's collapse): a transformer encoder's qkv Transpose, parallel
# over its 3 matrices, gave one of two threads two thirds of the work; collapsed with the loops
# over heads it ran faster (``python -m benchmarks.onnx_bench --models encoder``).
COLLAPSE_BELOW = 32

_STATUS = "polyc_status"
_MIXED = "<not one element>"
_C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto
    if inline int long register restrict return short signed sizeof static struct switch typedef union
    unsigned void volatile while""".split()
)

# Data-dependent subscripts go through this: an index outside [0, extent) sets the status
# (atomically: OpenMP threads may race to it) and reads element 0 instead of wild memory.
_CHECKED_INDEX = c_template("c_checked_index.c")


@dataclass(frozen=True)
class LoopFact:
    """One loop of the generated C, as the writer wrote it (a ``for`` of isl's AST that is not
    degenerate: isl prints a loop of one iteration as an assignment, and it has no fact).

    ``iterator``: its C iterator, ``c<depth>`` with ``depth`` the schedule depth; ``enclosing``:
    the position (in the kernel's ``loops``, which are in the order of the C text) of the loop
    right around it, or None; ``step`` and ``trip_count`` where they are constants (a tile
    loop steps by its tile size); ``indices``: per statement under it, the statement's indices
    whose subscripts in the AST use the iterator (a tile loop and its point loop both run over
    ``m`` when the statement's argument is ``c0 + c3``).

    What the writer made of it: ``parallel`` when OpenMP shares its iterations among threads,
    by a pragma on it (``collapse`` loops, 1 or more, or ``parallel_reductions``) or as a loop
    ``collapsed_into`` the parallel loop at that position; ``simd`` under ``omp simd`` (with
    ``simd_reductions``); ``blocked`` when a float sum runs in blocks of ``sum_block``
    iterations, at most :data:`SUM_BLOCK` (the C then has two loops for it: the blocks,
    parallel if this is, and the vector loop in a block); ``dropped`` says why a loop marked simd (or a parallel reduction
    in blocks) has no OpenMP pragma; ``unroll`` the factor of a ``GCC unroll`` pragma (1: none);
    ``versioned_on`` the select conditions (C text) the loop is written once per value of, in
    versions under ifs (this fact describes the version where all are true); ``register_tile``
    on the first loop of a register tile's reduction part: ``(tensor, rows, columns)``, the
    block of the tensor kept in a local array while the loop runs
    (:mod:`polyc.schedule.register_tiling`)."""

    iterator: str
    depth: int
    enclosing: int | None
    step: int | None
    trip_count: int | None
    indices: tuple[tuple[str, tuple[str, ...]], ...]
    parallel: bool = False
    collapse: int = 0
    collapsed_into: int | None = None
    parallel_reductions: tuple[Reduction, ...] = ()
    simd: bool = False
    simd_reductions: tuple[Reduction, ...] = ()
    blocked: bool = False
    dropped: str = ""
    unroll: int = 1
    sum_block: int = 0
    versioned_on: tuple[str, ...] = ()
    register_tile: tuple[str, int, int] | None = None

    @property
    def statements(self) -> tuple[str, ...]:
        """The statements that run inside the loop, in the order the C first runs them."""
        return tuple(statement for statement, _ in self.indices)


@dataclass(frozen=True)
class GeneratedKernel:
    """C source of one kernel and how to call it.

    ``tensor_arguments`` lists the tensors in argument order (inputs, outputs, temporaries);
    ``size_arguments`` the sizes passed at run time (empty when specialised); ``loops``, for a
    kernel printed from isl's AST, what the writer did with each loop (:class:`LoopFact`, in
    the order of the C text; empty for the dedicated kernels).
    """

    function_name: str
    source: str
    tensor_arguments: tuple[str, ...]
    size_arguments: tuple[str, ...]
    loops: tuple[LoopFact, ...] = ()


def c_comment(lines: list[str]) -> str:
    """A C block comment holding ``lines`` (a ``*/`` inside them cannot end it early)."""
    return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */"


def generate_c(program: PolyProgram, schedule: isl.Schedule, options: Options) -> GeneratedKernel:
    """The C translation unit for ``program`` executed in the order of ``schedule``."""
    return _KernelWriter(program, schedule, options).write()


class _KernelWriter:
    def __init__(self, program: PolyProgram, schedule: isl.Schedule, options: Options):
        self.program = program
        self.definition = program.definition
        self.schedule = schedule
        self.options = options
        self.specialised = program.size_values is not None
        tensor_names = {t.name for t in self.definition.tensors}
        # A size may share its name with the 0-d input it comes from, or with a C keyword.
        self.size_c = {p: (f"{p}_size" if p in tensor_names or p in _C_KEYWORDS else p) for p in program.params}
        # isl may rename parameters that clash with its keywords; map its names back to ours.
        self.param_names = {isl_name(p): self.size_c[p] for p in program.params}
        self.simd: _SimdLoopState | None = None  # while the body of a simd loop is written
        self.loops: list[_LoopRecord] = []  # every loop written so far, in the order of the text
        self.open_loops: list[int] = []  # positions in self.loops of the loops being written
        self.open_nodes: dict[str, isl.AstNode] = {}  # iterator -> the AST loop being written
        self.register: _RegisterRegionState | None = None  # while a register tile's part is written

    # ------------------------------------------------------------------ top level
    def write(self) -> GeneratedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        tensors = tuple(t.name for t in d.tensors)
        sizes = () if self.specialised else tuple(d.sizes)
        arguments = []
        for t in d.tensors:
            ctype = c_type(t.dtype)
            qualified = f"const {ctype}" if t.role is ir.Role.INPUT else ctype
            arguments.append(cgen.RestrictPointer(cgen.Value(qualified, t.name)))
        arguments += [cgen.Value("int64_t", self.size_c[s]) for s in sizes]

        body: list = []
        if self.specialised:
            for s in d.sizes:
                body.append(cgen.Statement(f"const int64_t {self.size_c[s]} = {self.program.size_values[s]}"))
        for t in d.tensors:
            for dim, extent in enumerate(t.shape):
                body.append(cgen.Statement(f"const int64_t {_extent_name(t.name, dim)} = {self.size_expr(extent)}"))
        body.append(cgen.Statement(f"int {_STATUS} = 0"))
        body.append(cgen.Statement(f"(void){_STATUS}"))
        build = isl.AstBuild.from_context(self.program.context)
        ast = build.node_from_schedule(self.schedule)
        body.append(self.node(ast))
        body.append(cgen.Statement(f"return {_STATUS}"))
        function = cgen.FunctionBody(cgen.FunctionDeclaration(cgen.Value("int", name), arguments), cgen.Block(body))
        text = str(function)
        if self.options.threads is not None:
            # Every parallel loop: at most that many threads, and one where OpenMP is set to one
            # (a forked child's, whose team is gone: see polyc/runtime/after_fork.py).  The clauses
            # follow the construct's whole name: "parallel for num_threads(4) simd" is no pragma.
            text = re.sub(
                r"^(\s*#pragma omp parallel(?: for(?: simd)?)?\b)",
                rf"\1 num_threads({self.options.threads}) if(omp_get_max_threads() > 1)",
                text,
                flags=re.M,
            )
            text = "#ifdef _OPENMP\n#include <omp.h>\n#endif\n" + text
        source = "\n".join([self.header(), PRELUDE, _CHECKED_INDEX, text, ""])
        return GeneratedKernel(name, source, tensors, sizes, tuple(record.fact() for record in self.loops))

    def header(self) -> str:
        o = self.options
        sizes = ", ".join(f"{k}={v}" for k, v in self.program.size_values.items()) if self.specialised else "parametric"
        lines = [
            f"polyc kernel for def '{self.definition.name}'",
            f"sizes: {sizes}",
            f"options: fusion={o.fusion} tile_sizes={o.loop_tiles} parallel={o.parallel} "
            f"vectorize={o.vectorize} unroll={o.unroll} specialize={o.specialize}"
            + (f" threads={o.threads}" if o.threads is not None else ""),
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    # ------------------------------------------------------------------ AST nodes
    def node(self, node: isl.AstNode):
        kind = node.get_type()
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            return cgen.Block([self.node(children.get_at(i)) for i in range(children.n_ast_node())])
        if kind == isl.ast_node_type.for_:
            if self.simd is None and not node.for_is_degenerate():
                team = self.team_loop(node)
                if team is not None:
                    return team
            return self.for_node(node, [])
        if kind == isl.ast_node_type.if_:
            if self.simd is not None:
                self.simd.guards += 1  # statements below may not run in every iteration
            then_node = self.node(node.if_get_then_node())
            else_node = self.node(node.if_get_else_node()) if node.if_has_else_node() else None
            if self.simd is not None:
                self.simd.guards -= 1
            if else_node is not None and not isinstance(then_node, cgen.Block):
                # Unbraced, a then-branch ending in an else-less 'if' (say, as the body of a
                # loop) would take this 'else' in C.
                then_node = cgen.Block([then_node])
            return cgen.If(self.expr(node.if_get_cond()), then_node, else_node)
        if kind == isl.ast_node_type.mark:
            if loop_mark(node.mark_get_id()).kind == REGISTER:
                return self.register_region(node)
            return self.mark_node(node)
        if kind == isl.ast_node_type.user:
            return self.user_node(node.user_get_expr())
        raise PolycError(f"internal: unexpected isl AST node {kind}")

    # ------------------------------------------------------------------ teams
    def team_loop(self, node: isl.AstNode):
        """A sequential loop with parallel loops inside (a recurrence's time loop): one OpenMP
        team for the whole loop, not one per iteration and parallel loop.

        Every thread runs the sequential loop (its bounds and the conditions inside depend on
        outer iterators and sizes only, the same in every thread); the parallel loops inside
        share their iterations (``omp for``); the rest runs on one thread (``omp single``).
        Both end in a barrier, so each part sees what the parts before it wrote, as in the
        sequential order.  Starting a team costs several microseconds and, on a machine busier
        than its cores, a wait for each of its threads to be scheduled; a barrier costs about
        one.  None where the loop has no parallel loop inside, or one this does not take (a
        parallel reduction, whose private copies OpenMP combines at the region's end): the
        loop is then written as before."""
        if PARALLEL not in _mark_kinds(node.for_get_body()) or REDUCE in _mark_kinds(node.for_get_body()):
            return None
        try:
            loop = self.for_node(node, [], body=self.team_part)
        except _NoTeam:
            return None
        return cgen.Module([cgen.Pragma("omp parallel"), cgen.Block([loop])])

    def team_part(self, node: isl.AstNode):
        """``node`` inside a team's sequential loop (see :meth:`team_loop`)."""
        kind = node.get_type()
        if PARALLEL not in _mark_kinds(node):
            return cgen.Module([cgen.Pragma("omp single"), cgen.Block([self.node(node)])])
        if kind == isl.ast_node_type.block:
            children = node.block_get_children()
            parts: list = []
            serial: list = []  # consecutive serial parts: one omp single, so one barrier, for all
            for i in range(children.n_ast_node()):
                child = children.get_at(i)
                if PARALLEL not in _mark_kinds(child):
                    serial.append(self.node(child))
                    continue
                if serial:
                    parts += [cgen.Pragma("omp single"), cgen.Block(serial)]
                    serial = []
                parts.append(self.team_part(child))
            if serial:
                parts += [cgen.Pragma("omp single"), cgen.Block(serial)]
            return cgen.Block(parts)
        if kind == isl.ast_node_type.for_:
            return self.for_node(node, [], body=self.team_part)
        if kind == isl.ast_node_type.if_:
            then_node = self.team_part(node.if_get_then_node())
            else_node = self.team_part(node.if_get_else_node()) if node.if_has_else_node() else None
            if else_node is not None and not isinstance(then_node, cgen.Block):
                then_node = cgen.Block([then_node])
            return cgen.If(self.expr(node.if_get_cond()), then_node, else_node)
        if kind != isl.ast_node_type.mark:
            raise _NoTeam
        marks, depths, below = _mark_chain(node)
        if not self.is_marked_loop(below, depths):
            return self.team_part(below)  # isl elided the marked loop: the marks do nothing
        if PARALLEL not in {m.kind for m in marks}:
            raise _NoTeam  # a loop with parallel loops inside, itself vectorised or unrolled
        lines = str(self.mark_node(node)).split("\n")
        shared = 0
        for position, line in enumerate(lines):
            stripped = line.lstrip()
            if stripped.startswith("#pragma omp parallel"):
                if not stripped.startswith("#pragma omp parallel for") or "reduction(" in stripped:
                    raise _NoTeam
                lines[position] = line.replace("#pragma omp parallel for", "#pragma omp for", 1)
                shared += 1
        if shared != 1:
            raise _NoTeam
        return _Lines(lines)

    def is_marked_loop(self, node: isl.AstNode, depths: frozenset[int]) -> bool:
        """Whether ``node`` is the loop that marks of schedule ``depths`` above it annotate."""
        return (
            node.get_type() == isl.ast_node_type.for_
            and not node.for_is_degenerate()
            and self.expr(node.for_get_iterator()) in {f"c{d}" for d in depths}
        )

    def mark_node(self, node: isl.AstNode):
        """Pragmas for a run of nested marks, applied to the loop of the marked band member."""
        pragmas: list[str] = []
        simd_reductions: tuple[Reduction, ...] = ()
        parallel_reductions: tuple[Reduction, ...] = ()
        target_depths: frozenset[int] = frozenset()
        unroll = 1
        first = True
        while node.get_type() == isl.ast_node_type.mark:
            mark = loop_mark(node.mark_get_id())
            if not first and frozenset(mark.depths) != target_depths:
                break  # a mark of a deeper band whose outer loops isl elided: handled on its own
            first, target_depths = False, frozenset(mark.depths)
            if mark.kind == SIMD:
                simd_reductions = mark.reductions
            if mark.kind == UNROLL:
                unroll = mark.unroll
            if mark.kind == REDUCE:
                parallel_reductions = mark.reductions
                pragmas.append("omp parallel for " + self.reduction_clauses(mark.reductions))
            else:
                pragmas.append(
                    {PARALLEL: "omp parallel for", SIMD: "omp simd"}.get(mark.kind, f"GCC unroll {mark.unroll}")
                )
            node = node.mark_get_node()
        if "omp parallel for" in pragmas and "omp simd" in pragmas:  # one loop, both: one pragma
            pragmas = ["omp parallel for simd"] + [p for p in pragmas if not p.startswith("omp ")]
        if any(p.startswith("omp ") for p in pragmas):
            # gcc accepts no pragma between an OpenMP one and its loop; a vectorised or parallel
            # loop is left for the C compiler to unroll.
            pragmas = [p for p in pragmas if p.startswith("omp ")]
        marked = (pragmas, target_depths, simd_reductions, parallel_reductions, unroll)
        if node.get_type() == isl.ast_node_type.block:
            # isl split the marked member's loop in pieces (a statement runs in part of its range
            # only, or at one value of it): each piece that is a loop of the member carries the mark.
            children = node.block_get_children()
            return cgen.Block([self.marked_loop(children.get_at(i), *marked) for i in range(children.n_ast_node())])
        return self.marked_loop(node, *marked)

    def marked_loop(
        self,
        node: isl.AstNode,
        pragmas: list[str],
        target_depths: frozenset[int],
        simd_reductions: tuple[Reduction, ...],
        parallel_reductions: tuple[Reduction, ...],
        unroll: int,
    ):
        """``node`` with the pragmas of the marks above it if it is the loop of a marked band
        member (``target_depths``), else as it is (isl elided a loop of one iteration)."""
        is_marked_loop = (
            node.get_type() == isl.ast_node_type.for_
            and not node.for_is_degenerate()
            and self.expr(node.for_get_iterator()) in {f"c{d}" for d in target_depths}
        )
        if is_marked_loop and any(p.startswith("omp ") and "simd" in p for p in pragmas):
            return self.simd_loop(node, pragmas, simd_reductions)
        if (
            is_marked_loop
            and parallel_reductions
            and self.sums_in_blocks(node, parallel_reductions)
            and _is_innermost(node.for_get_body())
        ):
            # A long float sum into one element per thread: blocked, each block a simd loop.
            return self.simd_loop(node, pragmas, parallel_reductions, parallel_reduction=True)
        if is_marked_loop:
            loops = 1
            if pragmas == ["omp parallel for"]:
                loops = _collapsible_loops(node, {f"c{d}" for d in target_depths})
                if loops > 1:
                    pragmas = [f"omp parallel for collapse({loops})"]
            position = len(self.loops)
            written = self.for_node(node, pragmas)
            record = self.loops[position]
            if any(p.startswith("omp parallel for") for p in pragmas):
                record.parallel, record.collapse, record.parallel_reductions = True, loops, parallel_reductions
                for inner in self.loops[position + 1 : position + loops]:  # perfectly nested: the next ones
                    inner.parallel, inner.collapsed_into = True, position
            if any(p.startswith("GCC unroll") for p in pragmas):
                record.unroll = unroll
            return written
        return self.node(node)  # isl elided the marked loop (one iteration): nothing to annotate

    def register_region(self, node: isl.AstNode):
        """The code under a ``register`` mark, with the tile of its target in a local array.

        The array is loaded from the target before the code and stored back after it; inside,
        every access to the target's element becomes the array's element at the row and
        column loops' iterators, so the compiler keeps the block in registers across the
        reduction loops (the row loop is unrolled, the column loop vectorised; see
        :mod:`polyc.schedule.register_tiling`).  Written as it is, the target in memory,
        where an access to the target is not to the tile's element, a statement's row or
        column loop is missing (isl elided it) or differs from another's, or the element or
        the loops' bounds move with a loop of the code."""
        tile = loop_mark(node.mark_get_id()).register_tile
        assert tile is not None
        inside = node.mark_get_node()
        position = len(self.loops)
        general = self.register_version(inside, _RegisterRegionState(tile))
        if general is None or position == len(self.loops):
            del self.loops[position:]
            return self.node(inside)
        if not general[1].full_conditions:
            self.loops[position].register_tile = (tile.tensor, tile.rows, tile.columns)
            return general[0]
        # Tiles cut short at the domain's edge: the full ones get a version of their own.
        del self.loops[position:]
        first = general[1]
        full = self.register_version(
            inside, _RegisterRegionState(tile, constant_bounds=first.constant_bounds, assume_full=True)
        )
        if full is None:
            del self.loops[position:]
            return self.register_version(inside, _RegisterRegionState(tile))[0]  # type: ignore[index]
        self.loops[position].register_tile = (tile.tensor, tile.rows, tile.columns)
        kept = len(self.loops)
        partial = self.register_version(inside, _RegisterRegionState(tile))
        del self.loops[kept:]
        assert partial is not None
        condition = " && ".join(first.full_conditions)
        return cgen.If(
            condition,
            cgen.Block([full[0]]),
            cgen.Block([cgen.Comment(f"polyc: the loops above, for !({condition})"), partial[0]]),
        )

    def register_version(self, inside: isl.AstNode, state: _RegisterRegionState):
        """One version of a register tile's code (see :meth:`register_region`): the block
        and the state it was written with, or None where the tile cannot be kept."""
        tile = state.tile
        self.register = state
        try:
            body = self.node(inside)
        finally:
            self.register = None
        if state.failure or state.element is None:
            return None
        ctype = c_type(self.definition.tensor(tile.tensor).dtype)
        array = _tile_array(tile.tensor)
        row, column = _TILE_ROW, _TILE_COLUMN
        row_cond, column_cond = state.bounds
        cell = f"{array}[{row}][{column}]"

        def copy(assignment: str) -> cgen.Generable:
            return cgen.For(
                f"int64_t {row} = 0",
                row_cond,
                f"{row} += 1",
                cgen.Module(
                    [
                        cgen.Pragma("omp simd"),
                        cgen.For(f"int64_t {column} = 0", column_cond, f"{column} += 1", cgen.Statement(assignment)),
                    ]
                ),
            )

        block = cgen.Block(
            [
                cgen.Statement(f"{ctype} {array}[{tile.rows}][{tile.columns}]"),
                copy(f"{cell} = {state.element}"),
                body,
                copy(f"{state.element} = {cell}"),
            ]
        )
        return block, state

    def register_element(self, statement: PolyStatement, arguments: dict[str, isl.AstExpr], index_c: dict[str, str]):
        """Inside a register tile's code: note what ``statement``'s accesses to the tile's
        target must become (the array's element), or that the tile cannot be kept."""
        state = self.register
        assert state is not None
        tile = state.tile
        source = statement.source
        touches = source.target == tile.tensor or any(a.tensor == tile.tensor for a in statement.reads)
        state.cell = None
        if not touches:
            return
        depths = tile.depths_of(statement.name)
        loops = None if depths is None else [self.open_nodes.get(f"c{depth}") for depth in depths]
        if source.target != tile.tensor or loops is None or any(loop is None for loop in loops):
            state.failure = True
            return
        assert loops[0] is not None and loops[1] is not None
        row_iterator, column_iterator = (self.expr(loop.for_get_iterator()) for loop in loops)
        names = {**self.param_names, row_iterator: _TILE_ROW, column_iterator: _TILE_COLUMN}
        moving = state.inner_iterators - {row_iterator, column_iterator}
        used = set().union(*(_ast_identifiers(arguments[i]) for i in source.indices))
        for loop in loops:
            used |= _ast_identifiers(loop.for_get_cond())
            init, step = loop.for_get_init(), loop.for_get_inc()
            starts_at_zero = init.get_type() == isl.ast_expr_type.int and init.get_val().to_python() == 0
            steps_by_one = step.get_type() == isl.ast_expr_type.int and step.get_val().to_python() == 1
            if not (starts_at_zero and steps_by_one):
                state.failure = True
        if column_iterator in _ast_identifiers(loops[0].for_get_cond()) or used & moving:
            state.failure = True
        element = self.element(tile.tensor, [ast_expr_c(arguments[i], names) for i in source.indices])
        bounds = tuple(
            self.loop_condition(loop, iterator, names)[0]
            for loop, iterator in zip(loops, (row_iterator, column_iterator))
        )
        if state.element is None:
            state.element, state.bounds = element, (bounds[0], bounds[1])
        elif (state.element, state.bounds) != (element, bounds):
            state.failure = True
        state.cell = f"{_tile_array(tile.tensor)}[{row_iterator}][{column_iterator}]"
        for loop, iterator in zip(loops, (row_iterator, column_iterator)):
            own = {**self.param_names, iterator: "@"}
            bound = _constant_bound(loop.for_get_cond())
            if bound is not None and iterator not in _ast_identifiers(bound[1]):
                state.constant_bounds[ast_expr_c(loop.for_get_cond(), own, outermost=True)] = bound[0]
                state.full_conditions[f"{bound[0]} <= {ast_expr_c(bound[1], self.param_names)}"] = None

    def simd_loop(
        self,
        node: isl.AstNode,
        pragmas: list[str],
        reductions: tuple[Reduction, ...],
        parallel_reduction: bool = False,
        assumed: dict[str, bool] | None = None,
    ):
        """A loop under a simd mark, with the loop-invariant work moved out of it.

        Reads of elements the loop does not move (a row's mean, say), in statements the loop
        runs in every iteration and outside selects, are loaded into constants before the loop: inside OpenMP's outlined functions gcc no longer knows the tensors do
        not alias, so it would reload them every iteration, and may then not vectorise at all.
        Reductions (``reductions``: (op, tensor) pairs) accumulate in local variables, loaded
        before and stored after the loop, under ``omp simd reduction(...)``.  Both happen only
        when the loop has an iteration, since the subscripts are valid only then.  Without
        pragmas (still correct) if some update is not to one loop-invariant element.  Selects
        whose condition the loop leaves fixed are decided outside it: the loop is written once
        per value of those conditions (:meth:`versioned_simd_loop`); ``assumed`` gives the
        values of the version being written.
        """
        clauses = list(reductions)
        iterator = self.expr(node.for_get_iterator())
        position = len(self.loops)  # this loop's record; a rewrite of the loop replaces the records
        self.simd = _SimdLoopState({iterator}, {tensor: None for _, tensor in clauses}, assumed=dict(assumed or {}))
        loop = self.for_node(node, [])
        state, self.simd = self.simd, None
        elements = state.accumulated_elements
        if any(e is None or e is _MIXED for e in elements.values()):
            del self.loops[position:]
            written = self.for_node(node, [p for p in pragmas if not p.startswith("omp ")])
            self.loops[
                position
            ].dropped = "an update in it is not to one element the loop leaves fixed, or runs under a condition"
            return written
        if assumed is None and 0 < len(state.fixed_conditions) <= MAX_VERSIONED_CONDITIONS:
            del self.loops[position:]
            return self.versioned_simd_loop(
                node, pragmas, reductions, parallel_reduction, tuple(state.fixed_conditions)
            )
        if state.invariant_loads.keys() & state.written:
            del self.loops[position:]
            self.simd = _SimdLoopState({iterator}, dict.fromkeys(elements), hoist=False, assumed=dict(assumed or {}))
            loop = self.for_node(node, [])
            self.simd = None
        omp = [p for p in pragmas if p.startswith("omp ")]
        blocked = (
            {tensor for op, tensor in clauses if op == "+" and self.definition.tensor(tensor).dtype.kind == "f"}
            if self.sums_in_blocks(node, reductions) and isinstance(loop, cgen.For)
            else set()
        )
        record = self.loops[position]
        if parallel_reduction and len(blocked) < len(clauses):
            del self.loops[position:]
            written = self.for_node(node, pragmas)
            record = self.loops[position]
            record.parallel, record.collapse, record.parallel_reductions = True, 1, reductions
            return written
        record.parallel = omp[0].startswith("omp parallel for")
        record.collapse = int(record.parallel)
        record.simd, record.blocked = True, bool(blocked)
        if blocked:
            record.sum_block = (record.trip_count or SUM_BLOCK) if _at_most_one_block(node) else _sum_block(node)[0]
        if parallel_reduction:
            record.parallel_reductions = reductions
        else:
            record.simd_reductions = reductions
        before, after, reduction_clauses, block_start, block_end, outer_clauses = [], [], [], [], [], []
        for (ctype, element), variable in state.invariant_loads.items():
            before.append(cgen.Statement(f"const {ctype} {variable} = {element}"))
        for op, tensor in clauses:
            dtype = self.definition.tensor(tensor).dtype
            variable = _accumulator(tensor)
            identifier = self.reduction_identifier(op, dtype)
            reduction_clauses.append(f"reduction({identifier}:{variable})")
            if _reduces_in_lanes(op, dtype):
                # The lanes' copies start from +-inf and take no NaN, so OpenMP's own min/max
                # combines them; the loaded element (maybe a NaN) joins with fmin/fmax after.
                ctype = c_type(dtype)
                identity_c = "-INFINITY" if op == "max" else "INFINITY"
                before.append(cgen.Statement(f"{ctype} {variable} = {identity_c}"))
                after.append(
                    cgen.Statement(f"{elements[tensor]} = {_combine(op, dtype, elements[tensor], variable, ctype)}")
                )
                outer_clauses.append(f"reduction({identifier}:{variable})")
            elif tensor in blocked:
                # The loop's sum is the sum of its blocks' sums, each block summed from zero.
                total = f"{variable}_total"
                before.append(cgen.Statement(f"{c_type(dtype)} {total} = {elements[tensor]}"))
                after.append(cgen.Statement(f"{elements[tensor]} = {total}"))
                zero = c_constant(identity("+", dtype).item(), dtype)
                block_start.append(cgen.Statement(f"{c_type(dtype)} {variable} = {zero}"))
                block_end.append(cgen.Statement(f"{total} = {_combine('+', dtype, total, variable, c_type(dtype))}"))
                outer_clauses.append(f"reduction({identifier}:{total})")
            else:
                before.append(cgen.Statement(f"{c_type(dtype)} {variable} = {elements[tensor]}"))
                after.append(cgen.Statement(f"{elements[tensor]} = {variable}"))
                outer_clauses.append(f"reduction({identifier}:{variable})")
        if blocked:
            parallel = omp[0].startswith("omp parallel for")
            outer_pragma = " ".join(["omp parallel for", *outer_clauses]) if parallel else None
            inner_pragma = " ".join(["omp simd", *reduction_clauses])
            body = [*before, self.blocked_loop(node, loop, outer_pragma, inner_pragma, block_start, block_end), *after]
        else:
            pragma = " ".join([omp[0], *reduction_clauses])
            body = [*before, cgen.Pragma(pragma), loop, *after]
        if not before:
            return cgen.Module(body)
        if _runs_at_least_once(node):
            return cgen.Block(body)
        # The loop's condition at its first iterator value: the loop runs at least once.
        self.param_names[iterator] = f"({self.expr(node.for_get_init())})"
        runs = self.expr(node.for_get_cond(), outermost=True)
        del self.param_names[iterator]
        return cgen.If(runs, cgen.Block(body))

    def versioned_simd_loop(
        self,
        node: isl.AstNode,
        pragmas: list[str],
        reductions: tuple[Reduction, ...],
        parallel_reduction: bool,
        conditions: tuple[str, ...],
    ) -> cgen.Generable:
        """The simd loop ``node`` written once per value of ``conditions`` (C text of select
        conditions the loop leaves fixed, such as a recurrence's ``t >= 1`` choosing between
        the previous step and the initial state), under ifs that pick the version: a select
        inside a vector loop costs both branches' loads and a blend per element, and gcc does
        not take such a condition out of the loop itself.  The kernel's loop facts describe the
        first version (all conditions true) and name the conditions (``versioned_on``)."""
        position = len(self.loops)
        first_version_loops: list[int] = []

        def version(values: dict[str, bool]) -> cgen.Generable:
            written = self.simd_loop(node, pragmas, reductions, parallel_reduction, assumed=values)
            if not first_version_loops:
                first_version_loops.append(len(self.loops))
            else:
                text = " && ".join(f"{'' if v else '!'}({c})" for c, v in values.items())
                written = cgen.Module([cgen.Comment(f"polyc: the loop above, for {text}"), written])
            return written

        def choose(depth: int, values: dict[str, bool]) -> cgen.Generable:
            if depth == len(conditions):
                return version(values)
            condition = conditions[depth]
            then = choose(depth + 1, {**values, condition: True})
            otherwise = choose(depth + 1, {**values, condition: False})
            return cgen.If(condition, cgen.Block([then]), cgen.Block([otherwise]))

        written = choose(0, {})
        del self.loops[first_version_loops[0] :]
        if len(self.loops) > position:
            self.loops[position].versioned_on = conditions
        return written

    def sums_in_blocks(self, node: isl.AstNode, reductions: tuple[Reduction, ...]) -> bool:
        """Whether a loop reducing ``reductions`` ((op, tensor) pairs) sums floats in blocks of
        :data:`SUM_BLOCK` iterations: it has a float ``+`` reduction, steps by one up to a bound
        (``c <= b`` or ``c < b``), and is not known to stay within one block."""
        clauses = list(reductions)
        if not any(op == "+" and self.definition.tensor(tensor).dtype.kind == "f" for op, tensor in clauses):
            return False
        increment, cond = node.for_get_inc(), node.for_get_cond()
        if increment.get_type() != isl.ast_expr_type.int or increment.get_val().to_python() != 1:
            return False
        if (
            cond.get_type() != isl.ast_expr_type.op
            or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt)
            or self.expr(cond.get_op_arg(0)) != self.expr(node.for_get_iterator())
        ):
            return False
        init, bound = node.for_get_init(), cond.get_op_arg(1)
        if init.get_type() == bound.get_type() == isl.ast_expr_type.int:
            last = bound.get_val().to_python() - (cond.get_op_type() == isl.ast_expr_op_type.lt)
            return last - init.get_val().to_python() + 1 > SUM_BLOCK
        return True

    def blocked_loop(
        self,
        node: isl.AstNode,
        loop: cgen.For,
        outer_pragma: str | None,
        inner_pragma: str,
        block_start: list,
        block_end: list,
    ) -> cgen.Module:
        """``loop`` (of ``node``, see :meth:`sums_in_blocks`) split into blocks of SUM_BLOCK
        iterations: the block loop (under ``outer_pragma``, if any) starts the block's sums
        (``block_start``), runs the vectorised loop over the block, and adds them up
        (``block_end``)."""
        iterator = self.expr(node.for_get_iterator())
        cond = node.for_get_cond()
        if _at_most_one_block(node):  # a point loop of a tile, say: its sum is the one block's
            return cgen.Module([*block_start, cgen.Pragma(inner_pragma), loop, *block_end])
        bound = self.expr(cond.get_op_arg(1))
        last = bound if cond.get_op_type() == isl.ast_expr_op_type.le else f"{bound} - 1"
        block, block_last = f"{iterator}_block", f"{iterator}_last"
        size, even = _sum_block(node)
        # Blocks of one constant length where the loop's length allows: gcc then compiles the
        # vector loop without the run-time trip count's prologue and epilogue, which cost a
        # third of an LSTM step's dot products (benchmarks/results/*_onnx_zoo*.json, lstm_lm).
        block_end_c = f"{block} + {size - 1}" if even else f"polyc_min({block} + {size - 1}, {last})"
        inner = cgen.For(f"int64_t {iterator} = {block}", f"{iterator} <= {block_last}", f"{iterator} += 1", loop.body)
        outer = cgen.For(
            f"int64_t {block} = {self.expr(node.for_get_init())}",
            f"{block} <= {last}",
            f"{block} += {size}",
            cgen.Block(
                [
                    cgen.Statement(f"const int64_t {block_last} = {block_end_c}"),
                    *block_start,
                    cgen.Pragma(inner_pragma),
                    inner,
                    *block_end,
                ]
            ),
        )
        return cgen.Module(([cgen.Pragma(outer_pragma)] if outer_pragma else []) + [outer])

    def reduction_identifier(self, op: str, dtype: np.dtype) -> str:
        """OpenMP's name for reducing with ``op`` in ``dtype`` (float min/max: see
        :func:`_reduces_in_lanes`; a float sum: the prelude's, whose partial sums start from -0)."""
        if op == "+" and dtype.kind == "f":
            return f"polyc_sum_{dtype.name}"
        return _BOOL_REDUCTIONS[op] if dtype.kind == "b" else op

    def reduction_clauses(self, reductions: tuple[Reduction, ...]) -> str:
        """``reduction(op:T[0:n]) ...`` for a reduce mark's reductions."""
        clauses = []
        for op, tensor in reductions:
            shape, dtype = self.definition.tensor(tensor).shape, self.definition.tensor(tensor).dtype
            elements = " * ".join(f"({self.size_expr(e)})" for e in shape) or "1"
            clauses.append(f"reduction({self.reduction_identifier(op, dtype)}:{tensor}[0:{elements}])")
        return " ".join(clauses)

    def for_node(self, node: isl.AstNode, pragmas: list[str], body: Callable | None = None):
        """The loop ``node`` under ``pragmas``, its body written by ``body`` (:meth:`node`)."""
        iterator = self.expr(node.for_get_iterator())
        if self.simd is not None:
            self.simd.iterators.add(iterator)
        if self.register is not None:
            self.register.inner_iterators.add(iterator)
        init = self.expr(node.for_get_init())
        write_body = body or self.node
        if node.for_is_degenerate():
            body = write_body(node.for_get_body())
            return cgen.Block([cgen.Statement(f"const int64_t {iterator} = {init}"), body])
        step = node.for_get_inc()
        condition, full_bound = self.loop_condition(node, iterator)
        self.loops.append(
            _LoopRecord(
                iterator,
                self.open_loops[-1] if self.open_loops else None,
                step.get_val().to_python() if step.get_type() == isl.ast_expr_type.int else None,
                _constant_trip_count(node) if full_bound is None else full_bound + 1,
            )
        )
        self.open_loops.append(len(self.loops) - 1)
        self.open_nodes[iterator] = node
        body = write_body(node.for_get_body())
        del self.open_nodes[iterator]
        self.open_loops.pop()
        loop = cgen.For(f"int64_t {iterator} = {init}", condition, f"{iterator} += {self.expr(step)}", body)
        if not pragmas:
            return loop
        return cgen.Module([cgen.Pragma(p) for p in pragmas] + [loop])

    def loop_condition(self, node: isl.AstNode, iterator: str, names: dict[str, str] | None = None):
        """The C condition of the loop ``node`` (identifiers renamed by ``names``, else the
        writer's), and the constant bound it was given, if any: in the full tiles' version of
        a register tile, a row or column loop cut short at the domain's edge runs to its
        tile's end (see :meth:`register_region`)."""
        names = self.param_names if names is None else names
        cond = node.for_get_cond()
        state = self.register
        if state is not None and state.assume_full:
            own = ast_expr_c(cond, {**self.param_names, iterator: "@"}, outermost=True)
            if own in state.constant_bounds:
                bound = state.constant_bounds[own]
                return f"{names.get(iterator, iterator)} <= {bound}", bound
        return ast_expr_c(cond, names, outermost=True), None

    # ------------------------------------------------------------------ AST expressions
    def expr(self, e: isl.AstExpr, outermost: bool = False) -> str:
        return ast_expr_c(e, self.param_names, outermost)

    # ------------------------------------------------------------------ statements
    def user_node(self, call: isl.AstExpr):
        name = call.get_op_arg(0).get_id().get_name()
        statement = self.program.statement(name)
        argument_exprs = [call.get_op_arg(i + 1) for i in range(call.get_op_n_arg() - 1)]
        arguments = [self.expr(argument) for argument in argument_exprs]
        index_c = dict(zip(statement.indices, arguments))
        uses = [_ast_identifiers(argument) for argument in argument_exprs]
        for position in self.open_loops:
            record = self.loops[position]
            moved = tuple(index for index, used in zip(statement.indices, uses) if record.iterator in used)
            record.indices[name] = tuple(dict.fromkeys(record.indices.get(name, ()) + moved))
        if self.register is not None:
            self.register_element(statement, dict(zip(statement.indices, argument_exprs)), index_c)
        return cgen.Statement(self.statement_text(statement, index_c))

    def statement_text(self, statement: PolyStatement, index_c: dict[str, str]) -> str:
        source = statement.source
        target = self.definition.tensor(source.target)
        lhs = self.element(source.target, [index_c[i] for i in source.indices])
        if self.register is not None and source.target == self.register.tile.tensor:
            lhs = self.register.replacement()
        ctype = c_type(target.dtype)
        simd = self.simd
        if simd is not None:
            simd.written.add(source.target)
        if statement.kind == "init":
            if simd is not None and source.target in simd.accumulated_elements:
                simd.accumulated_elements[source.target] = _MIXED  # not split off the loop
            return f"{lhs} = {c_constant(identity(source.op, target.dtype).item(), target.dtype)}"
        guarded = simd is not None and simd.guards > 0
        unconditional = _unconditional_reads(source.rhs) if simd is not None and simd.hoist and not guarded else set()

        def access(read: ir.Read, subscripts: list[str]) -> str:
            element = self.element(read.tensor, subscripts, checked=not read.is_affine)
            if self.register is not None and read.tensor == self.register.tile.tensor:
                return self.register.replacement()  # (planned: the statement's own element)
            if id(read) in unconditional and read.is_affine and not simd.moves(element):
                key = (c_type(self.definition.tensor(read.tensor).dtype), element)
                return simd.invariant_loads.setdefault(key, f"polyc_invariant_{len(simd.invariant_loads)}")
            if self.definition.tensor(read.tensor).dtype.kind == "b":
                return f"polyc_bool_at(&{element})"
            return element

        def known_condition(select: ir.Select) -> bool | None:
            if simd is None or not _reads_nothing(select.cond):
                return None
            return simd.known_condition(printer.to_c(select.cond))

        printer = CExpressionPrinter(
            access=access,
            index=lambda n: index_c[n] if n in index_c else self.size_c[n],
            size=self.size_expr,
            known_condition=known_condition,
        )
        value = printer.to_c(source.rhs)
        if statement.kind == "assign":
            return f"{lhs} = {value}"
        if simd is not None and source.target in simd.accumulated_elements:
            seen = simd.accumulated_elements[source.target]
            invariant = seen in (None, lhs) and not simd.moves(lhs) and not guarded
            simd.accumulated_elements[source.target] = lhs if invariant else _MIXED
            accumulator = _accumulator(source.target)
            if _reduces_in_lanes(source.op, target.dtype):
                return f"{accumulator} = {_lane_combine(source.op, target.dtype, accumulator, value)}"
            return f"{accumulator} = {_combine(source.op, target.dtype, accumulator, value, ctype)}"
        return f"{lhs} = {_combine(source.op, target.dtype, lhs, value, ctype)}"

    def size_expr(self, value: Affine) -> str:
        """C text of an expression in the sizes."""
        return value.to_c(lambda name: self.size_c[name])

    def element(self, tensor_name: str, subscripts: list[str], checked: bool = False) -> str:
        """C lvalue of an element; data-dependent subscripts are bounds-checked at run time."""
        tensor = self.definition.tensor(tensor_name)
        if tensor.rank == 0:
            return f"{tensor_name}[0]"
        offset = ""
        for dim, subscript in enumerate(subscripts):
            extent = _extent_name(tensor_name, dim)
            if checked:
                subscript = f"polyc_checked_index({subscript}, {extent}, &{_STATUS})"
            offset = f"({subscript})" if dim == 0 else f"({offset} * {extent} + ({subscript}))"
        return f"{tensor_name}[{offset}]"


@dataclass
class _LoopRecord:
    """A :class:`LoopFact` while the loop is written (its statements found as the body is)."""

    iterator: str
    enclosing: int | None
    step: int | None
    trip_count: int | None
    indices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parallel: bool = False
    collapse: int = 0
    collapsed_into: int | None = None
    parallel_reductions: tuple[Reduction, ...] = ()
    simd: bool = False
    simd_reductions: tuple[Reduction, ...] = ()
    blocked: bool = False
    dropped: str = ""
    unroll: int = 1
    sum_block: int = 0
    versioned_on: tuple[str, ...] = ()
    register_tile: tuple[str, int, int] | None = None

    def fact(self) -> LoopFact:
        return LoopFact(
            self.iterator,
            int(self.iterator[1:]) if self.iterator[1:].isdigit() else -1,
            self.enclosing,
            self.step,
            self.trip_count,
            tuple(self.indices.items()),
            self.parallel,
            self.collapse,
            self.collapsed_into,
            self.parallel_reductions,
            self.simd,
            self.simd_reductions,
            self.blocked,
            self.dropped,
            self.unroll,
            self.sum_block,
            self.versioned_on,
            self.register_tile,
        )


def _ast_identifiers(e: isl.AstExpr) -> set[str]:
    """The names an isl AST expression uses (iterators and parameters)."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.id:
        return {e.get_id().get_name()}
    if kind == isl.ast_expr_type.int:
        return set()
    return set().union(*(_ast_identifiers(e.get_op_arg(i)) for i in range(e.get_op_n_arg())))


@dataclass
class _SimdLoopState:
    """What writing the body of a simd loop found out (see ``_KernelWriter.simd_loop``).

    ``iterators``: the loop's and those of (degenerate) loops in its body;
    ``accumulated_elements``: per reduced tensor, the element its updates go to (None until
    one is seen, _MIXED if not one element the loop leaves fixed, or one under a condition); ``invariant_loads``: (C type,
    element) -> the constant it was replaced by; ``written``: tensors the loop writes.
    """

    iterators: set[str]
    accumulated_elements: dict[str, str | None]
    hoist: bool = True
    guards: int = 0  # how many ifs of the body enclose the statement being written
    invariant_loads: dict[tuple[str, str], str] = field(default_factory=dict)
    written: set[str] = field(default_factory=set)
    # Conditions of selects that read no tensor and that the loop leaves fixed (C text, in the
    # order found), and the values assumed for them in the version of the loop being written.
    fixed_conditions: dict[str, None] = field(default_factory=dict)
    assumed: dict[str, bool] = field(default_factory=dict)

    def known_condition(self, condition: str) -> bool | None:
        """The value assumed for a select's condition (C text) in this version of the loop,
        None if the condition moves with the loop (or is not assumed); records fixed ones."""
        if self.moves(condition):
            return None
        self.fixed_conditions.setdefault(condition)
        return self.assumed.get(condition)

    def moves(self, text: str) -> bool:
        """Whether C text depends on an iterator of the loop or of a loop in its body."""
        return any(re.search(rf"\b{re.escape(name)}\b", text) for name in self.iterators)


#: The C iterators of the loops that load and store a register tile's array.
_TILE_ROW, _TILE_COLUMN = "polyc_tile_row", "polyc_tile_column"


def _constant_bound(cond: isl.AstExpr) -> tuple[int, isl.AstExpr] | None:
    """(K, e) for a loop condition ``c <= min(K, e)`` (or ``min(e, K)``), else None."""
    if cond.get_type() != isl.ast_expr_type.op or cond.get_op_type() != isl.ast_expr_op_type.le:
        return None
    bound = cond.get_op_arg(1)
    if bound.get_type() != isl.ast_expr_type.op or bound.get_op_type() != isl.ast_expr_op_type.min:
        return None
    if bound.get_op_n_arg() != 2:
        return None
    first, second = bound.get_op_arg(0), bound.get_op_arg(1)
    for constant, other in ((first, second), (second, first)):
        if constant.get_type() == isl.ast_expr_type.int:
            return constant.get_val().to_python(), other
    return None


def _tile_array(tensor: str) -> str:
    return f"polyc_tile_{tensor}"


@dataclass
class _RegisterRegionState:
    """What writing a register tile's code found out (see ``_KernelWriter.register_region``).

    ``element``: the target's element in the load and store loops' iterators; ``bounds``:
    their conditions; ``cell``: the array's element for the statement being written (None
    where it has none); ``inner_iterators``: loops opened inside; ``failure``: the tile cannot
    be kept.  A row or column loop cut short at the edge of the domain (``c <= min(K, e)``)
    has ``constant_bounds`` (its condition, its own iterator written ``@`` -> K) and
    ``full_conditions`` (``K <= e``): where all hold, the tile is full, and its version with
    constant trip counts is the one whose block the compiler keeps in registers."""

    tile: RegisterTile
    element: str | None = None
    bounds: tuple[str, str] = ("", "")
    cell: str | None = None
    inner_iterators: set[str] = field(default_factory=set)
    failure: bool = False
    constant_bounds: dict[str, int] = field(default_factory=dict)
    full_conditions: dict[str, None] = field(default_factory=dict)
    #: While the full tiles' version is written: constant_bounds, applied by for_node.
    assume_full: bool = False

    def replacement(self) -> str:
        """The array's element for the statement being written (noting a failure where it
        has none)."""
        if self.cell is None:
            self.failure = True
            return "polyc_no_tile_element"
        return self.cell


def ast_expr_c(e: isl.AstExpr, names: dict[str, str], outermost: bool = False) -> str:
    """C text of an isl AST expression, identifiers renamed by ``names`` (others kept);
    ``outermost`` drops the outer parentheses, which OpenMP's canonical loop form does not
    allow around a loop condition."""
    kind = e.get_type()
    if kind == isl.ast_expr_type.id:
        name = e.get_id().get_name()
        return names.get(name, name)
    if kind == isl.ast_expr_type.int:
        return f"INT64_C({e.get_val().to_python()})"
    op = e.get_op_type()
    args = [ast_expr_c(e.get_op_arg(i), names) for i in range(e.get_op_n_arg())]
    t = isl.ast_expr_op_type
    binary = {
        t.add: "+",
        t.sub: "-",
        t.mul: "*",
        t.div: "/",
        t.pdiv_q: "/",
        t.pdiv_r: "%",
        t.zdiv_r: "%",
        t.and_: "&&",
        t.and_then: "&&",
        t.or_: "||",
        t.or_else: "||",
        t.eq: "==",
        t.le: "<=",
        t.lt: "<",
        t.ge: ">=",
        t.gt: ">",
    }
    if op in binary:
        text = f"{args[0]} {binary[op]} {args[1]}"
        return text if outermost else f"({text})"
    if op == t.minus:
        return f"(-{args[0]})"
    if op == t.fdiv_q:
        return f"polyc_floord({args[0]}, {args[1]})"
    if op in (t.min, t.max):
        helper = "polyc_min" if op == t.min else "polyc_max"
        text = args[0]
        for a in args[1:]:
            text = f"{helper}({text}, {a})"
        return text
    if op in (t.cond, t.select):
        return f"({args[0]} ? {args[1]} : {args[2]})"
    raise PolycError(f"internal: unexpected isl AST operation {op}")


def aff_c(aff: isl.Aff, arguments: list[str], names: dict[str, str]) -> str:
    """C text of an integer affine expression of a statement's dimensions (given as C texts in
    ``arguments``) and parameters (renamed by ``names``)."""
    if not aff.get_denominator_val().is_one():
        raise PolycError(f"internal: a rational affine expression in C: {aff}")
    terms = []
    for kind, texts in (
        (isl.dim_type.in_, arguments),
        (
            isl.dim_type.param,
            [
                names.get(aff.get_dim_name(isl.dim_type.param, p), aff.get_dim_name(isl.dim_type.param, p))
                for p in range(aff.dim(isl.dim_type.param))
            ],
        ),
    ):
        for position, text in enumerate(texts):
            coefficient = aff.get_coefficient_val(kind, position).to_python()
            if coefficient:
                terms.append(text if coefficient == 1 else f"{coefficient} * {text}")
    constant = aff.get_constant_val().to_python()
    if constant or not terms:
        terms.append(str(constant))
    return " + ".join(terms).replace("+ -", "- ")


def plain_ast_c(node: isl.AstNode, user: Callable[[str, list[str]], str], names: dict[str, str]):
    """An isl AST without marks as cgen nodes: ``user(statement, argument texts)`` gives each
    statement's C (without its semicolon)."""
    kind = node.get_type()
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        return cgen.Block([plain_ast_c(children.get_at(i), user, names) for i in range(children.n_ast_node())])
    if kind == isl.ast_node_type.for_:
        iterator = ast_expr_c(node.for_get_iterator(), names)
        init = ast_expr_c(node.for_get_init(), names)
        body = plain_ast_c(node.for_get_body(), user, names)
        if node.for_is_degenerate():
            return cgen.Block([cgen.Statement(f"const int64_t {iterator} = {init}"), body])
        return cgen.For(
            f"int64_t {iterator} = {init}",
            ast_expr_c(node.for_get_cond(), names, outermost=True),
            f"{iterator} += {ast_expr_c(node.for_get_inc(), names)}",
            body,
        )
    if kind == isl.ast_node_type.if_:
        then_node = cgen.Block([plain_ast_c(node.if_get_then_node(), user, names)])
        else_node = plain_ast_c(node.if_get_else_node(), user, names) if node.if_has_else_node() else None
        return cgen.If(ast_expr_c(node.if_get_cond(), names, outermost=True), then_node, else_node)
    if kind == isl.ast_node_type.user:
        call = node.user_get_expr()
        arguments = [ast_expr_c(call.get_op_arg(i + 1), names) for i in range(call.get_op_n_arg() - 1)]
        return cgen.Statement(user(call.get_op_arg(0).get_id().get_name(), arguments))
    raise PolycError(f"internal: unexpected isl AST node {kind}")


class _NoTeam(Exception):
    """A sequential loop's parallel loops are not ones :meth:`_KernelWriter.team_loop` takes."""


class _Lines(cgen.Generable):
    """Lines of C as they are (a loop written and then given its team's pragmas)."""

    def __init__(self, lines: list[str]):
        self.lines = lines

    def generate(self):
        yield from self.lines


def _mark_chain(node: isl.AstNode) -> tuple[list, frozenset[int], isl.AstNode]:
    """The run of nested marks at ``node`` that annotate one loop (those of its schedule
    depths), the depths, and the node below them."""
    marks: list = []
    depths: frozenset[int] = frozenset()
    while node.get_type() == isl.ast_node_type.mark:
        mark = loop_mark(node.mark_get_id())
        if marks and frozenset(mark.depths) != depths:
            break
        marks.append(mark)
        depths = frozenset(mark.depths)
        node = node.mark_get_node()
    return marks, depths, node


def _mark_kinds(node: isl.AstNode) -> set[str]:
    """The kinds of the marks in the AST at ``node``."""
    kind = node.get_type()
    if kind == isl.ast_node_type.mark:
        return {loop_mark(node.mark_get_id()).kind} | _mark_kinds(node.mark_get_node())
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        return set().union(*(_mark_kinds(children.get_at(i)) for i in range(children.n_ast_node())))
    if kind == isl.ast_node_type.for_:
        return _mark_kinds(node.for_get_body())
    if kind == isl.ast_node_type.if_:
        found = _mark_kinds(node.if_get_then_node())
        return found | _mark_kinds(node.if_get_else_node()) if node.if_has_else_node() else found
    return set()


def _runs_at_least_once(loop: isl.AstNode) -> bool:
    """Whether a loop ``for (c = a; c <= b (or c < b); ...)`` with constant a and b runs."""
    return bool(_constant_trip_count(loop))


def _constant_trip_count(loop: isl.AstNode) -> int | None:
    """The iterations of ``for (c = a; c <= b (or c < b); c += s)`` with constants a, b and s."""
    init, cond, increment = loop.for_get_init(), loop.for_get_cond(), loop.for_get_inc()
    constant = isl.ast_expr_type.int
    if (
        init.get_type() != constant
        or increment.get_type() != constant
        or cond.get_type() != isl.ast_expr_type.op
        or cond.get_op_type() not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt)
    ):
        return None
    bound, step = cond.get_op_arg(1), increment.get_val().to_python()
    if bound.get_type() != constant or step <= 0:
        return None
    last = bound.get_val().to_python() - (cond.get_op_type() == isl.ast_expr_op_type.lt)
    return max(0, (last - init.get_val().to_python()) // step + 1)


def _collapsible_loops(loop: isl.AstNode, parallel_iterators: set[str]) -> int:
    """How many loops, from ``loop`` (a parallel one) inward, one OpenMP loop should share out:
    while their iterations are fewer than COLLAPSE_BELOW, the loop nested right inside (the
    whole body: OpenMP's collapse needs perfectly nested loops) joins when it is parallel too
    (its iterator in ``parallel_iterators``: a coincident band member, which carries no
    dependence, as the outer one carries none) and its bounds are constants (rectangular).  The
    loop right around a marked (vector) loop stays a loop in each thread: gcc optimises the two
    together (a transpose of 12 x 128 x 64 floats ran slower with it collapsed)."""
    loops, iterations = 1, _constant_trip_count(loop)
    inner = loop.for_get_body()
    while (
        iterations is not None
        and iterations < COLLAPSE_BELOW
        and inner.get_type() == isl.ast_node_type.for_
        and not inner.for_is_degenerate()
        and ast_expr_c(inner.for_get_iterator(), {}) in parallel_iterators
        and inner.for_get_body().get_type() != isl.ast_node_type.mark
    ):
        count = _constant_trip_count(inner)
        if count is None:
            break
        loops, iterations = loops + 1, iterations * count
        inner = inner.for_get_body()
    return loops


def _at_most_one_block(loop: isl.AstNode) -> bool:
    """Whether a loop ``for (c = a; c <= min(b, ...) ...)`` with constants a and b (a tile's point
    loop) runs at most SUM_BLOCK iterations."""
    init, cond = loop.for_get_init(), loop.for_get_cond()
    bound = cond.get_op_arg(1)
    constant = isl.ast_expr_type.int
    if bound.get_type() == constant:
        bounds = [bound]
    elif bound.get_type() == isl.ast_expr_type.op and bound.get_op_type() == isl.ast_expr_op_type.min:
        bounds = [bound.get_op_arg(i) for i in range(bound.get_op_n_arg())]
    else:
        return False
    constants = [b.get_val().to_python() for b in bounds if b.get_type() == constant]
    if init.get_type() != constant or not constants:
        return False
    last = min(constants) - (cond.get_op_type() == isl.ast_expr_op_type.lt)
    return last - init.get_val().to_python() + 1 <= SUM_BLOCK


def _sum_block(loop: isl.AstNode) -> tuple[int, bool]:
    """The iterations per block of a float sum in blocks (:meth:`_KernelWriter.blocked_loop`),
    and whether every block has exactly that many: a loop of constant bounds whose length n
    splits into ceil(n / SUM_BLOCK) blocks of one length takes that length (at most
    SUM_BLOCK, so no less accurate); any other takes SUM_BLOCK and a shorter last block."""
    init, cond = loop.for_get_init(), loop.for_get_cond()
    bound = cond.get_op_arg(1)
    if init.get_type() != isl.ast_expr_type.int or bound.get_type() != isl.ast_expr_type.int:
        return SUM_BLOCK, False
    last = bound.get_val().to_python() - (cond.get_op_type() == isl.ast_expr_op_type.lt)
    length = last - init.get_val().to_python() + 1
    blocks = -(-length // SUM_BLOCK)
    if length % blocks == 0:
        return length // blocks, True
    return SUM_BLOCK, False


def _is_innermost(node: isl.AstNode) -> bool:
    """Whether an isl AST has no loop of more than one iteration and no mark."""
    kind = node.get_type()
    if kind == isl.ast_node_type.block:
        children = node.block_get_children()
        return all(_is_innermost(children.get_at(i)) for i in range(children.n_ast_node()))
    if kind == isl.ast_node_type.for_:
        return node.for_is_degenerate() and _is_innermost(node.for_get_body())
    if kind == isl.ast_node_type.if_:
        return _is_innermost(node.if_get_then_node()) and (
            not node.if_has_else_node() or _is_innermost(node.if_get_else_node())
        )
    return kind == isl.ast_node_type.user


def _accumulator(tensor: str) -> str:
    return f"polyc_acc_{tensor}"


def _reads_nothing(expr: ir.TExpr) -> bool:
    """Whether ``expr`` is computed from indices, sizes and constants alone (no tensor read, no
    call): its value is fixed wherever they are."""
    if isinstance(expr, (ir.IndexValue, ir.SizeValue, ir.Const)):
        return True
    if isinstance(expr, ir.Binary):
        return _reads_nothing(expr.lhs) and _reads_nothing(expr.rhs)
    if isinstance(expr, (ir.Unary, ir.Cast)):
        return _reads_nothing(expr.operand)
    if isinstance(expr, ir.Select):
        return _reads_nothing(expr.cond) and _reads_nothing(expr.then) and _reads_nothing(expr.otherwise)
    return False


def _unconditional_reads(expr: ir.TExpr) -> set[int]:
    """ids of the reads in ``expr`` that C evaluates whatever the data: not in a branch of a
    select or on the right of ``&&``/``||``, and not in a data-dependent subscript."""
    found: set[int] = set()

    def visit(e: ir.TExpr) -> None:
        if isinstance(e, ir.Read):
            found.add(id(e))  # its subscripts are not visited: only affine reads are hoisted
        elif isinstance(e, ir.Select):
            visit(e.cond)
        elif isinstance(e, ir.Binary):
            visit(e.lhs)
            if e.op not in ("&&", "||"):
                visit(e.rhs)
        elif isinstance(e, ir.Unary) or isinstance(e, ir.Cast):
            visit(e.operand)
        elif isinstance(e, ir.Call):
            for argument in e.args:
                visit(argument)

    visit(expr)
    return found


def _extent_name(tensor: str, dim: int) -> str:
    return f"{tensor}_extent{dim}"


def _reduces_in_lanes(op: str, dtype: np.dtype) -> bool:
    """Whether a vectorised min/max reduction of ``dtype`` accumulates in lanes that start from
    +-inf (every float type; float16 compares in float).  Each lane keeps its value against a
    NaN (``x > lane ? x : lane``, which gcc makes one vector max), OpenMP's own min/max combines
    the lanes, none of them NaN, and the element loaded before the loop, which may be a NaN,
    joins last through polyc_fmax/fmin: the interpreter's result (fmax/fmin element by
    element), but for which zero of -0 and +0 a tie keeps.  polyc's own reduction (fmax's
    compare as an omp declare reduction) cost several times as much, as gcc keeps a user
    reduction's lanes in memory (the row max of softmax, measured with
    ``python -m benchmarks --filter softmax``)."""
    return op in ("min", "max") and dtype.kind == "f"


def _lane_combine(op: str, dtype: np.dtype, lane: str, value: str) -> str:
    """A lane's min/max with ``value`` (see :func:`_reduces_in_lanes`): a NaN ``value`` leaves it."""
    return f"polyc_lane_{op}{'' if dtype == np.float64 else 'f'}({lane}, {value})"


def _combine(op: str, dtype: np.dtype, current: str, value: str, ctype: str) -> str:
    """``current op value`` in the target type, with the interpreter's min/max semantics."""
    if op in ("+", "*"):
        if dtype == np.float16:  # in float, then one rounding (as every float16 operation)
            return to_float16(f"(float){current} {op} (float){value}")
        return f"({ctype})({current} {op} {value})"
    if dtype.kind == "f":
        suffix = "f" if dtype.itemsize <= 4 else ""
        return f"({ctype})polyc_f{op}{suffix}({current}, {value})"
    compare = "<" if op == "min" else ">"
    return f"(({value}) {compare} ({current}) ? ({value}) : ({current}))"
