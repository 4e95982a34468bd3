"""Schedule tree transformations: tiling, intra-tile reordering and marks for code generation.

``optimize_schedule`` first fuses sequences of loop nests that share a parallel outer loop
(:mod:`polyc.schedule.outer_fusion`, unless fusion is ``min``), then walks the tree once, band
by band:

0. the outermost band of each nest takes the loop order the options name (``loop_order``);
1. a permutable band of two or more members is tiled (rectangular tiles; sizes from the options
   or from the cache model in :mod:`polyc.schedule.tiling`);
2. the outermost band on each path gets a ``parallel`` mark when one of its members carries no
   dependence (moved to the front first, which permutability allows);
3. in an innermost band, the member whose accesses are most often stride-1 among those that
   vectorise is moved innermost, and marked ``simd`` (and ``unroll`` when asked).  A member
   vectorises when it is coincident, or when the only dependences it carries are those of
   reductions into elements it does not move (a row sum along its row): it is then marked
   ``simd:OP:TENSOR;...``, an OpenMP simd loop with reductions, after the ``!``
   initialisations in the band are split off in front of it.  Members that extend its
   accesses to one contiguous block of every tensor (h outside w over whole rows) stay just
   outside it, and the others (a reduction) go outside them, while the blocks fit in L1.

Marks are isl mark nodes whose id carries a :class:`LoopMark` record (its kind, one of MARKS;
the schedule depths of the band members the pragma may go to; the reductions or the unroll
factor); the id's name, ``KIND[:ARGUMENT]@DEPTHS``, is for people reading the tree.  Code
generation reads the record (:func:`loop_mark`) and applies the pragma to the first loop under
the mark only if that loop (iterator ``c<DEPTH>``) is at one of the depths, so a pragma never
lands on a wrong loop when isl elides single-iteration loops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyc.errors import PolycError
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.schedule import register_tiling, tiling
from polyc.schedule.isl_helpers import sets
from polyc.schedule.outer_fusion import fuse_outer_loops
from polyc.schedule.register_tiling import RegisterTile
from polyc.schedule.tiling import choose_tile_sizes

PARALLEL, SIMD, UNROLL, REDUCE, REGISTER = "parallel", "simd", "unroll", "reduce", "register"

#: Statement instances below which a band gets no parallel loop: starting and joining a team of
#: two threads costs on the order of a microsecond, the work of thousands of instances, which a
#: depthwise convolution's border slabs each paid (a corner: 32 instances).
MIN_PARALLEL_INSTANCES = 4096

#: The same, per iteration of the sequential loops around the band (a recurrence's time steps):
#: a parallel loop inside a sequential one meets its team at a barrier every iteration (see
#: polyc/codegen/c.py, ``team_loop``), so each iteration needs work enough to pay for one.  Below
#: this the sequential loop and all inside it run on the calling thread.  The matrix-vector
#: kernel (polyc/codegen/gemv.py) parallelises from the same size.
MIN_PARALLEL_STEP_INSTANCES = 1 << 16
MARKS = (PARALLEL, SIMD, UNROLL, REDUCE, REGISTER)

#: A reduction OpenMP combines: its operator and the tensor it reduces into.
Reduction = tuple[str, str]


@dataclass(frozen=True)
class LoopMark:
    """What a mark asks of the first loop under it: a ``kind`` of MARKS, the schedule ``depths``
    that loop may be at, the ``reductions`` of a simd or reduce mark, the factor of an unroll.
    A ``register`` mark asks instead that the code under it keep a block of a tensor in
    registers (``register_tile``: :class:`polyc.schedule.register_tiling.RegisterTile`)."""

    kind: str
    depths: tuple[int, ...]
    reductions: tuple[Reduction, ...] = ()
    unroll: int = 1
    register_tile: RegisterTile | None = None

    @property
    def name(self) -> str:
        """The mark's name in printed schedule trees: ``kind[:argument]@depth[,depth...]``."""
        if self.register_tile is not None:
            return self.register_tile.name
        argument = str(self.unroll) if self.kind == UNROLL else clause_text(self.reductions)
        head = f"{self.kind}:{argument}" if argument else self.kind
        return f"{head}@{','.join(str(d) for d in self.depths)}"

    def insert_above(self, node: isl.ScheduleNode) -> isl.ScheduleNode:
        """``node`` with this mark inserted above it (the mark node is returned)."""
        return node.insert_mark(isl.Id(self.name, user=self, context=node.get_ctx()))


def loop_mark(mark: isl.Id) -> LoopMark:
    """The record a CPU schedule mark's id carries."""
    record = mark.get_user()
    if not isinstance(record, LoopMark):
        raise PolycError(f"internal: the schedule mark {mark.get_name()!r} carries no LoopMark")
    return record


def clause_text(reductions: tuple[Reduction, ...]) -> str:
    """``op:tensor;...``, as explanations and mark names show reductions."""
    return ";".join(f"{op}:{tensor}" for op, tensor in reductions)


#: Reduction operators OpenMP's reduction clause computes with polyc's semantics.  Floating-point
#: min/max are left out: OpenMP's compare differently from fmin/fmax when a NaN is involved.
_OPENMP_REDUCTIONS = {"+": "+", "*": "*"}
_OPENMP_INTEGER_REDUCTIONS = {"+": "+", "*": "*", "min": "min", "max": "max"}
#: Reduction operators of simd loops: code generation keeps the accumulator in a local variable
#: and gives floating-point min/max a user-defined OpenMP reduction with polyc's fmin/fmax.
_SIMD_REDUCTIONS = ("+", "*", "min", "max")
#: Largest target (elements) reduced in parallel: every thread gets a private copy of it.
_MAX_PRIVATE_REDUCTION = 4096

_BAND = isl.schedule_node_type.band


@dataclass
class BandDecision:
    """What :func:`optimize_schedule` decided for one band, and why (read by :mod:`polyc.viz`).

    ``statements``: the statements under the band; ``depth``: the schedule depth of its first
    member; ``tile_sizes``: the sizes it was tiled with, or None with ``tiling`` saying why not;
    ``parallel``: "parallel" (member 0 is a parallel loop), "reduce:CLAUSES" (a parallel loop
    with OpenMP reductions) or None with ``parallel_reason``; ``innermost``: for a leaf band,
    "simd", "simd:CLAUSES" or None with ``simd_reason``."""

    statements: tuple[str, ...]
    depth: int
    members: int
    permutable: bool
    coincident: tuple[bool, ...]
    tile_sizes: tuple[int, ...] | None = None
    tiling: str = ""
    parallel: str | None = None
    parallel_reason: str = ""
    innermost: str | None = None
    simd_reason: str = ""
    #: The band as the scheduler left it (before tiling): per member a union map from statement
    #: instances to that loop's value, and the map of the enclosing loops.
    member_maps: tuple = ()
    prefix: object = None
    #: Per member: statement -> the TC index that loop runs over (as member_indices finds it).
    member_indices: tuple = ()
    #: What a register tile keeps in registers (:mod:`polyc.schedule.register_tiling`), or "".
    register_tile: str = ""


@dataclass(frozen=True)
class _Context:
    program: PolyProgram
    options: Options
    dependences: Dependences | None
    decisions: list | None = None
    vector_bits: int | None = None  # of the build; None: no register tiles


def optimize_schedule(
    schedule: isl.Schedule,
    program: PolyProgram,
    options: Options,
    dependences: Dependences | None = None,
    decisions: list | None = None,
    vector_bits: int | None = None,
) -> isl.Schedule:
    """Tile, reorder and mark ``schedule`` as the options ask; the result is equivalent to it.

    With ``dependences``, loop nests in sequence that share a parallel outer loop are fused
    first (unless ``options.fusion`` is ``min``); a band with no parallel member whose outer
    member carries only reduction dependences is marked ``reduce``: a parallel loop with an
    OpenMP reduction; and innermost reduction loops are vectorised (``simd:`` marks).
    ``decisions``, when given, receives a :class:`BandDecision` per band visited.
    ``vector_bits``: the width of the build's vector registers, which sizes register tiles
    (:mod:`polyc.schedule.register_tiling`); None: no register tiles.
    """
    if dependences is not None and options.fusion != "min":
        schedule = fuse_outer_loops(schedule, program, dependences, tiling.cache_sizes(options))
    context = _Context(program, options, dependences, decisions, vector_bits)
    node = _visit(schedule.get_root(), context, parallel_above="")
    return node.get_schedule()


def _visit(node: isl.ScheduleNode, context: _Context, parallel_above: str, steps: int = 1) -> isl.ScheduleNode:
    """Transform the subtree at ``node``; return the node now at the same position.
    ``parallel_above``: why no loop below may be parallel (an enclosing band took the
    threads), or "" when one may.  ``steps``: the iterations of the sequential loops around it
    (1 where none, or unknown)."""
    if node.get_type() == _BAND:
        return _visit_band(node, context, parallel_above, steps)
    for position in range(node.n_children()):
        node = _visit(node.child(position), context, parallel_above, steps).parent()
    return node


def _visit_band(node: isl.ScheduleNode, context: _Context, parallel_above: str, steps: int = 1) -> isl.ScheduleNode:
    options = context.options
    depth = node.get_tree_depth()
    leaf_band = not _has_band_below(node)
    n_members = node.band_n_member()
    if options.loop_order and node.get_schedule_depth() == 0 and n_members > 1 and node.band_get_permutable():
        node = _in_loop_order(node, context.program, options.loop_order)
    decision = BandDecision(
        tuple(sorted(s.get_tuple_name() for s in sets(node.get_domain()))),
        node.get_schedule_depth(),
        n_members,
        bool(node.band_get_permutable()),
        tuple(bool(node.band_member_get_coincident(i)) for i in range(n_members)),
    )
    if context.decisions is not None:
        decision.member_maps = tuple(_member_map(node, m) for m in range(n_members))
        decision.prefix = node.get_prefix_schedule_union_map()
        decision.member_indices = tuple(member_indices(node, m, context.program) for m in range(n_members))
        context.decisions.append(decision)

    iterations = 1 if leaf_band else _iterations(node, context.program.context)  # before tiling splits the band
    tiled = False
    if options.loop_tiles == ():
        decision.tiling = "tiling is off (loop_tiles=())"
    elif options.schedule is not None:
        decision.tiling = "the schedule is the user's (schedule=): its loops run as given, untiled"
    elif not node.band_get_permutable():
        decision.tiling = "the band is not permutable: its loops cannot be interchanged, so not tiled"
    elif n_members < 2:
        decision.tiling = "one loop: nothing to tile"
    else:
        sizes = choose_tile_sizes(
            node,
            context.program,
            options.loop_tiles,
            tiling.cache_sizes(options),
            options.threads,
            tiling.l1_set_span(options),
        )
        if sizes is not None:
            node = _shift_to_origin(node)
            node = node.band_tile(isl.MultiVal.from_val_list(node.band_get_space(), _val_list(node, sizes)))
            tiled = True
            decision.tile_sizes = tuple(sizes)
        else:
            decision.tiling = "the cache model found the data of the loops fits in cache untiled"

    marked_parallel = False
    # (per step with the sizes of the program, where the schedule is one for every size)
    instances = _instance_count(node) if steps <= 1 else _instance_count(node, context.program.context)
    least = MIN_PARALLEL_INSTANCES if steps <= 1 else MIN_PARALLEL_STEP_INSTANCES
    too_little = instances is not None and instances // steps < least
    if not options.parallel:
        decision.parallel_reason = "parallel loops are off (parallel=False)"
    elif parallel_above:
        decision.parallel_reason = parallel_above
    if options.parallel and not parallel_above:
        # A coincident loop of one iteration (a batch of one) is no parallel loop: isl elides
        # it, and marking it parallel kept the loops inside (a recurrence's step loop and the
        # parallel loops within it) on one thread.
        coincident = [
            node.band_member_get_coincident(i) and _member_extent(node, i, context.program.context) != 1
            for i in range(node.band_n_member())
        ]
        if any(coincident):
            first = coincident.index(True)
            if first != 0 and node.band_get_permutable():
                order = [first] + [i for i in range(node.band_n_member()) if i != first]
                node = _permute(node, order)
            marked_parallel = (
                bool(node.band_member_get_coincident(0)) and _member_extent(node, 0, context.program.context) != 1
            )
            if marked_parallel:
                decision.parallel = "parallel"
            else:
                decision.parallel_reason = "the coincident loop cannot be moved outermost: the band is not permutable"
        elif any(node.band_member_get_coincident(i) for i in range(node.band_n_member())):
            decision.parallel_reason = "the band's coincident loops run one iteration each"
        else:
            decision.parallel_reason = "every loop of the band carries a dependence"

    reduction_clause = None
    if options.parallel and not parallel_above and not marked_parallel:
        node, reduction_clause = _parallel_reduction(node, context, decision)
        if reduction_clause is not None and not too_little:
            decision.parallel = f"{REDUCE}:{clause_text(reduction_clause)}"
            node = LoopMark(REDUCE, (node.get_schedule_depth(),), reduction_clause).insert_above(node).child(0)
    if too_little and (marked_parallel or reduction_clause is not None):
        # The band keeps the shape a parallel loop gave it, but runs on the calling thread.
        decision.parallel = None
        decision.parallel_reason = (
            f"too little work for threads: {instances} statement instances, fewer than {MIN_PARALLEL_INSTANCES}"
            if steps <= 1
            else f"too little work for threads: {instances // steps} statement instances per iteration of the "
            f"{steps} of the sequential loops around it, fewer than {MIN_PARALLEL_STEP_INSTANCES}"
        )

    # Step into the point band (if tiled) for the innermost-loop decisions.
    inner = node.child(0) if tiled else node
    registers = _register_tile(inner, context, decision)
    if registers is not None:
        inner = registers
    elif leaf_band:
        inner = _finish_innermost(
            inner,
            context,
            keep_first=(marked_parallel or reduction_clause is not None) and not tiled,
            decision=decision,
        )
    else:
        # A band that runs its loops in order (a recurrence's time loop) repeats what is inside.
        sequential = not (marked_parallel or reduction_clause is not None)
        inside = steps * iterations if sequential else steps
        for position in range(inner.n_children()):
            inner = _visit(
                inner.child(position), context, parallel_above or _below(marked_parallel, instances), inside
            ).parent()
    # Climb back to the position the band had when we were called.
    while inner.get_tree_depth() > depth:
        inner = inner.parent()
    if marked_parallel and not too_little:
        # Any coincident member down the band chain may turn out to be the outermost loop
        # (isl elides loops of one iteration, e.g. a tile loop when the tile covers the extent).
        inner = LoopMark(PARALLEL, tuple(_coincident_depths(inner))).insert_above(inner)
    return inner


def _register_tile(band: isl.ScheduleNode, context: _Context, decision: BandDecision) -> isl.ScheduleNode | None:
    """The band rebuilt as a register tile (:mod:`polyc.schedule.register_tiling`), marked
    for code generation, or None where it takes none (the band is then left as it was).  Its
    outer band keeps only coincident members, so the parallel mark still finds its loop."""
    options = context.options
    if context.vector_bits is None or not options.vectorize or options.register_tiles == ():
        return None
    if options.schedule is not None or band.get_type() != _BAND or context.program.size_values is None:
        return None
    params = context.program.context
    extents = [_member_extent(band, m, params) for m in range(band.band_n_member())]
    plan = register_tiling.plan_register_tile(
        band, context.program, extents, context.vector_bits, options.register_tiles
    )
    if plan is None:
        return None
    tiled = register_tiling.apply_register_tile(band, plan, context.program, context.dependences)
    if tiled is None:
        return None
    decision.innermost = SIMD
    decision.register_tile = (
        f"{plan.update.source.target} in registers: {plan.rows} x {plan.columns} elements "
        f"({plan.row_index} x {plan.update.source.indices[-1]}) across the reduction loops"
    )
    return tiled


def _below(marked_parallel: bool, instances: int | None) -> str:
    """Why the bands under a band that ``marked_parallel`` (with ``instances`` under it) get no
    parallel loop; "" where they may have one."""
    if not marked_parallel:
        return ""
    if instances is not None and instances < MIN_PARALLEL_INSTANCES:
        # The enclosing loop keeps the shape of the parallel one but runs on the calling thread.
        return (
            f"too little work for threads: the enclosing loop nest has {instances} statement instances, "
            f"fewer than {MIN_PARALLEL_INSTANCES}"
        )
    return "an enclosing loop is already parallel (OpenMP loops are not nested)"


def _shift_to_origin(band: isl.ScheduleNode) -> isl.ScheduleNode:
    """The band with each member shifted by a constant so that its smallest value is 0, where
    that value is known.  Tiles are cut from 0: the interior of a padded image's rows, 1..110,
    in tiles of 55 made tiles of 54, 55 and 1 rows, and its parallel loop of three iterations
    gave one thread two of them.  A constant shift of a whole member keeps every order."""
    schedule = band.band_get_partial_schedule().intersect_domain(band.get_domain())
    shifts = []
    for member in range(band.band_n_member()):
        try:
            lowest = schedule.get_union_pw_aff(member).min_val()
        except isl.Error:
            return band
        if not lowest.is_int():
            return band
        shifts.append(lowest.neg())
    if all(shift.is_zero() for shift in shifts):
        return band
    shift = band.band_get_partial_schedule()
    domain = shift.domain()
    for member, value in enumerate(shifts):
        shift = shift.set_union_pw_aff(member, isl.UnionPwAff.val_on_domain(domain, value))
    return band.band_shift(shift)


def _instance_count(node: isl.ScheduleNode, params: isl.Set | None = None) -> int | None:
    """At most how many statement instances run under ``node``: for each statement the product
    of its indices' ranges (the count itself, by isl's enumeration, took seconds for a
    convolution's billion instances); None where the sizes are not fixed."""
    total = 0
    domains = node.get_domain() if params is None else node.get_domain().intersect_params(params)
    for domain in sets(domains):
        count = 1
        for dimension in range(domain.dim(isl.dim_type.set)):
            low, high = domain.dim_min_val(dimension), domain.dim_max_val(dimension)
            if not (low.is_int() and high.is_int()):
                return None
            count *= max(0, high.to_python() - low.to_python() + 1)
        total += count
    return total


def _member_extent(band: isl.ScheduleNode, member: int, params: isl.Set) -> int | None:
    """How many values member ``member`` of ``band`` takes over its domain where the sizes
    satisfy ``params`` (the program's context), at most; None where that is not known (sizes
    not fixed)."""
    values = _member_map(band, member).intersect_domain(band.get_domain()).range().intersect_params(params)
    low = high = None
    for piece in sets(values):
        least, most = piece.dim_min_val(0), piece.dim_max_val(0)
        if not (least.is_int() and most.is_int()):
            return None
        low = least.to_python() if low is None else min(low, least.to_python())
        high = most.to_python() if high is None else max(high, most.to_python())
    return 0 if low is None else high - low + 1


def _iterations(band: isl.ScheduleNode, params: isl.Set) -> int:
    """How many times the loops of ``band`` run what is below them, at most: the product of its
    members' ranges over its domain; 1 where a range is not known (sizes not fixed)."""
    count = 1
    for member in range(band.band_n_member()):
        extent = _member_extent(band, member, params)
        if extent is None:
            return 1
        count *= max(1, extent)
    return count


def _parallel_reduction(
    band: isl.ScheduleNode, context: _Context, decision: BandDecision | None = None
) -> tuple[isl.ScheduleNode, tuple[Reduction, ...] | None]:
    """Make the band's first member a parallel loop with an OpenMP reduction, if that is valid.

    It is when every update under the band is a reduction with an operator OpenMP can combine,
    each target is small enough to privatise, and the member carries no dependence but
    reduction ones.  The ``!`` initialisations the scheduler fused into the band are first
    split off in front of it (a sequence), since inside the loop they would reset a thread's
    private copy.  Returns the node at the band's position and the reductions, or None.
    """

    def declined(reason: str):
        if decision is not None:
            decision.parallel_reason += f"; not a parallel reduction either: {reason}"
        return band, None

    if context.dependences is None:
        return band, None
    program = context.program
    domain = band.get_domain()
    statements = [program.statement(s.get_tuple_name()) for s in sets(domain)]
    updates = [s for s in statements if s.kind == "update"]
    inits = [s for s in statements if s.kind == "init"]
    if not updates or len(updates) + len(inits) != len(statements):
        return declined("the band holds statements other than reductions and their initialisations")
    clauses: dict[str, str] = {}
    for statement in updates:
        source = statement.source
        target = program.definition.tensor(source.target)
        table = _OPENMP_INTEGER_REDUCTIONS if target.dtype.kind in "iu" else _OPENMP_REDUCTIONS
        if source.op not in table:
            if source.op in ("min", "max"):
                return declined(
                    f"{source.op}= on floating-point {source.target}: OpenMP's {source.op} reduction "
                    "treats NaN differently from polyc's fmin/fmax semantics"
                )
            return declined(f"OpenMP has no reduction for {source.op}= on {target.dtype}")
        size = 1
        for extent in target.shape:
            if program.size_values is None and not extent.is_constant:
                return declined(f"{source.target}'s size is not known when compiling (specialize=False)")
            size *= extent.evaluate(program.size_values or {})
        if size > _MAX_PRIVATE_REDUCTION:
            return declined(
                f"{source.target} has {size} elements, more than the {_MAX_PRIVATE_REDUCTION} "
                "that every thread could keep a private copy of"
            )
        if clauses.get(source.target, table[source.op]) != table[source.op]:
            return declined(f"{source.target} is reduced with two different operators")
        clauses[source.target] = table[source.op]
    every = context.dependences.all
    update_domain = _union_of(program, updates)
    if inits:
        init_domain = _union_of(program, inits)
        # Running all initialisations first is valid only if none of them waits for an update.
        if not every.intersect_domain(update_domain).intersect_range(init_domain).is_empty():
            return declined("an initialisation must wait for an update")
    others = context.dependences.non_reduction.intersect_domain(update_domain).intersect_range(update_domain)
    prefix = band.get_prefix_schedule_union_map()
    member = isl.UnionMap.from_multi_union_pw_aff(
        isl.MultiUnionPwAff.from_union_pw_aff(band.band_get_partial_schedule().get_at(0))
    )
    carried = others.intersect(prefix.apply_range(prefix.reverse())).subtract(member.apply_range(member.reverse()))
    if not carried.is_empty():
        return declined("the outer loop carries dependences other than the reductions'")
    if inits:
        filters = isl.UnionSetList.alloc(band.get_ctx(), 2).add(init_domain).add(update_domain)
        band = band.insert_sequence(filters).child(1).child(0)
    return band, tuple((op, target) for target, op in sorted(clauses.items()))


def _union_of(program: PolyProgram, statements) -> isl.UnionSet:
    result = isl.UnionSet.empty(program.context.get_space())
    for statement in statements:
        result = result.union(isl.UnionSet.from_set(statement.domain))
    return result


def _coincident_depths(node: isl.ScheduleNode) -> list[int]:
    """Schedule depths of the coincident members of the chain of bands starting at ``node``."""
    depths: list[int] = []
    while node.get_type() in (_BAND, isl.schedule_node_type.mark):
        if node.get_type() == _BAND:
            base = node.get_schedule_depth()
            depths += [base + i for i in range(node.band_n_member()) if node.band_member_get_coincident(i)]
        if node.n_children() != 1:
            break
        node = node.child(0)
    return depths


def _finish_innermost(
    node: isl.ScheduleNode, context: _Context, keep_first: bool, decision: BandDecision | None = None
) -> isl.ScheduleNode:
    """Reorder an innermost band for stride-1 access; mark its innermost member simd/unroll.

    ``keep_first``: member 0 is the parallel loop and must stay outermost.  Returns the node at
    the band's (possibly split) top position.
    """
    options = context.options
    n = node.band_n_member()
    movable = range(1 if keep_first else 0, n)
    reductions = {m: _simd_reductions(node, m, context) for m in movable} if options.vectorize else {}
    if len(movable) >= 2 and node.band_get_permutable():
        scores = {member: stride_score(node, member, context.program) for member in movable}
        # A member that is constant for every statement (a batch of one, say) is no loop: made
        # innermost, it took the vector pragma from the real loop whenever every real loop
        # scored below zero (resnet18's stride-2 max pool along rows ran scalar).
        moves = {member: not _constant_member(node, member) for member in movable}

        def preference(m: int):
            coincident = node.band_member_get_coincident(m)
            return moves[m], coincident or reductions.get(m) is not None, scores[m], coincident, m

        best = max(movable, key=preference)
        run = _contiguous_run(node, best, movable, context) if preference(best)[1] else [best]
        order = [m for m in range(n) if m not in run] + run
        if order != list(range(n)):
            node = _permute(node, order)
            reductions = {n - 1: reductions.get(best)}
    coincident = node.band_member_get_coincident(n - 1)
    reduction_clause = reductions.get(n - 1) if not coincident else None
    wants_simd = options.vectorize and (coincident or reduction_clause is not None)
    wants_unroll = options.unroll > 1
    if decision is not None:
        if wants_simd:
            decision.innermost = SIMD if reduction_clause is None else f"{SIMD}:{clause_text(reduction_clause)}"
        elif not options.vectorize:
            decision.simd_reason = "vectorisation is off (vectorize=False)"
        elif keep_first and n == 1:
            decision.simd_reason = "the band's only loop is the parallel one"
        else:
            decision.simd_reason = (
                "the innermost loop carries a dependence that is not a reduction into an element it does not move"
            )
    if not (wants_simd or wants_unroll):
        return node
    top_depth = node.get_tree_depth()
    if n > 1:
        node = node.band_split(n - 1).child(0)
    if reduction_clause is not None:
        node = _split_off_initialisations(node, context.program)
    depth = (node.get_schedule_depth(),)
    if wants_unroll:
        node = LoopMark(UNROLL, depth, unroll=options.unroll).insert_above(node)
    if wants_simd:
        node = LoopMark(SIMD, depth, reduction_clause or ()).insert_above(node)
    while node.get_tree_depth() > top_depth:
        node = node.parent()
    return node


def _contiguous_run(band: isl.ScheduleNode, innermost: int, movable, context: _Context) -> list[int]:
    """``innermost`` and the members that, just outside it, make every access of the band scan
    one contiguous block (outermost first): a member whose index subscripts the dimension just
    before the run's in every access, where the run covers whole rows.  The other members, a
    reduction among them, then go outside the block.  The tensordot
    ``O(n, c1, c3, h, w) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, c3, h, w)`` with W = 28 ran its
    8 reduction steps between h and w, each over 28-element rows of 8 planes of I0; with
    ``r_c2`` outside ``(h, w)`` each step streams a 784-element plane, which runs faster, as gcc
    -O3 runs the naive loops (the ``tensordot`` case of ``python -m benchmarks --filter
    tensordot``).  Only for sizes known when compiling, and while
    the block of every tensor the band touches fits in half of L1, since the reduction now
    reads and writes the target's block once per step."""
    program = context.program
    if program.size_values is None or context.dependences is None:
        return [innermost]
    statements = [program.statement(s.get_tuple_name()) for s in sets(band.get_domain())]
    statements = [s for s in statements if s.kind != "init"]
    indices = {m: member_indices(band, m, program) for m in movable}
    # candidates: members that run over one index of every statement (not a tile's constant 0)
    candidates = [m for m in movable if all(s.name in indices[m] for s in statements)]
    if innermost not in candidates:
        return [innermost]

    def extent(statement, index: str) -> int:
        bounds = statement.source.range_of(index)
        return bounds.hi.evaluate(program.size_values) - bounds.lo.evaluate(program.size_values)

    def extends(member: int, run: list[int]) -> bool:
        for statement in statements:
            index, inner = indices[member][statement.name], [indices[m][statement.name] for m in run]
            for tensor, subscripts in statement_accesses(statement):
                depth = len(subscripts) - len(run)  # the dimension the member must subscript
                shape = program.definition.tensor(tensor).shape
                if (
                    depth < 1
                    or not all(isinstance(x, Affine) for x in subscripts)
                    or subscripts[depth - 1 :] != tuple(Affine.var(i) for i in [index] + inner)
                    or any(index in x.names() for x in subscripts[: depth - 1])
                    or any(
                        shape[depth + k].evaluate(program.size_values) != extent(statement, i)
                        for k, i in enumerate(inner)
                    )
                ):
                    return False
        return True

    def block_bytes(run: list[int]) -> int:
        """Bytes of the blocks the run scans, over the tensors the band touches."""
        blocks: dict[str, int] = {}
        for statement in statements:
            elements = math.prod(extent(statement, indices[m][statement.name]) for m in run)
            for tensor, _ in statement_accesses(statement):
                blocks[tensor] = max(blocks.get(tensor, 0), elements * program.definition.tensor(tensor).dtype.itemsize)
        return sum(blocks.values())

    run = [innermost]
    budget = tiling.cache_sizes(context.options).get(1, 32 << 10) // 2
    while True:
        member = next((m for m in candidates if m not in run and extends(m, run)), None)
        if member is None or block_bytes([member] + run) > budget:
            return run
        run.insert(0, member)


def _simd_reductions(band: isl.ScheduleNode, member: int, context: _Context) -> tuple[Reduction, ...] | None:
    """The reductions under which ``member`` of ``band``, moved
    innermost, is a valid simd loop though not coincident; None if there are none or it is not.

    That is when every dependence it carries (for fixed values of the enclosing loops and the
    band's other members) is a reduction dependence of an update that it runs over a reduction
    index, so the updated element is the same across the loop, with an operator OpenMP can
    combine, on a rhs that does not read the element.  ``!`` initialisations in the band are
    split off in front of the loop (:func:`_split_off_initialisations`); none may depend on
    another statement of the band.
    """
    if context.dependences is None or band.band_member_get_coincident(member):
        return None
    program = context.program
    statements = [program.statement(s.get_tuple_name()) for s in sets(band.get_domain())]
    moved = member_indices(band, member, program)
    clauses: dict[str, str] = {}
    for statement in statements:
        if statement.kind == "init":
            continue
        if statement.name not in moved:
            return None
        if statement.kind != "update":
            continue
        source = statement.source
        dtype = program.definition.tensor(source.target).dtype
        reads_target = any(a.read is not None and a.tensor == source.target for a in statement.reads)
        if (
            moved[statement.name] in source.indices
            or reads_target
            or source.op not in _SIMD_REDUCTIONS
            or dtype.kind not in "fiu"
            or dtype.itemsize < 4
            or clauses.setdefault(source.target, source.op) != source.op
        ):
            return None
    if not clauses:
        return None
    inits = [s for s in statements if s.kind == "init"]
    others = [s for s in statements if s.kind != "init"]
    same_others = band.get_prefix_schedule_union_map()
    for m in range(band.band_n_member()):
        if m != member:
            same_others = same_others.flat_range_product(_member_map(band, m))
    same_others = same_others.apply_range(same_others.reverse())
    every = context.dependences.all.intersect(same_others)
    other_domain = _union_of(program, others)
    if inits and not every.intersect_domain(other_domain).intersect_range(_union_of(program, inits)).is_empty():
        return None
    this = _member_map(band, member)
    carried = (
        context.dependences.non_reduction.intersect(same_others)
        .intersect_domain(other_domain)
        .intersect_range(other_domain)
        .subtract(this.apply_range(this.reverse()))
    )
    if not carried.is_empty():
        return None
    return tuple((op, target) for target, op in sorted(clauses.items()))


def _member_map(band: isl.ScheduleNode, member: int) -> isl.UnionMap:
    return isl.UnionMap.from_multi_union_pw_aff(
        isl.MultiUnionPwAff.from_union_pw_aff(band.band_get_partial_schedule().get_at(member))
    )


def _split_off_initialisations(band: isl.ScheduleNode, program: PolyProgram) -> isl.ScheduleNode:
    """Put the ``!`` initialisations under ``band`` in a sequence before the rest; returns the
    band over the rest (at the same position when there are none)."""
    statements = [program.statement(s.get_tuple_name()) for s in sets(band.get_domain())]
    inits = [s for s in statements if s.kind == "init"]
    if not inits:
        return band
    rest = [s for s in statements if s.kind != "init"]
    domain = band.get_domain()
    filters = (
        isl.UnionSetList.alloc(band.get_ctx(), 2)
        .add(domain.intersect(_union_of(program, inits)))
        .add(domain.intersect(_union_of(program, rest)))
    )
    return band.insert_sequence(filters).child(1).child(0)


def _has_band_below(node: isl.ScheduleNode) -> bool:
    for position in range(node.n_children()):
        child = node.child(position)
        if child.get_type() == _BAND or _has_band_below(child):
            return True
    return False


def _permute(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Reorder the members of a permutable band (member ``order[p]`` goes to position p)."""
    partial = node.band_get_partial_schedule()
    coincident = [node.band_member_get_coincident(i) for i in range(node.band_n_member())]
    reordered = partial
    for position, source in enumerate(order):
        reordered = reordered.set_at(position, partial.get_at(source))
    node = node.delete().insert_partial_schedule(reordered).band_set_permutable(1)
    for position, source in enumerate(order):
        node = node.band_member_set_coincident(position, coincident[source])
    return node


def _in_loop_order(node: isl.ScheduleNode, program: PolyProgram, loop_order: tuple[str, ...]) -> isl.ScheduleNode:
    """The permutable band with its members in the order ``loop_order`` gives their indices
    (a member schedules an index of each of its statements); members whose indices it does not
    name follow, in their order."""
    rank = {name: position for position, name in enumerate(loop_order)}

    def member_rank(member: int) -> int:
        named = [rank[index] for index in member_indices(node, member, program).values() if index in rank]
        return min(named, default=len(loop_order))

    order = sorted(range(node.band_n_member()), key=lambda member: (member_rank(member), member))
    return _permute(node, order) if order != list(range(len(order))) else node


def _val_list(node: isl.ScheduleNode, sizes: list[int]) -> isl.ValList:
    ctx = node.get_ctx()
    values = isl.ValList.alloc(ctx, len(sizes))
    for size in sizes:
        values = values.add(isl.Val.int_from_si(ctx, size))
    return values


# ----------------------------------------------------------------------------- stride analysis
def member_indices(node: isl.ScheduleNode, member: int, program: PolyProgram) -> dict[str, str]:
    """For each statement in the band, the statement index that ``member`` schedules, when the
    member's schedule for that statement is a single index (``c = i + constant``)."""
    found: dict[str, str] = {}
    pw_affs: list[isl.PwAff] = []
    node.band_get_partial_schedule().get_at(member).foreach_pw_aff(pw_affs.append)
    for pw_aff in pw_affs:
        name = pw_aff.get_tuple_id(isl.dim_type.in_).get_name()
        statement = _statement_or_none(program, name)
        if statement is None or pw_aff.n_piece() != 1:
            continue
        affs = []
        pw_aff.foreach_piece(lambda _set, aff: affs.append(aff))
        aff = affs[0]
        coefficients = [aff.get_coefficient_val(isl.dim_type.in_, d).to_python() for d in range(len(statement.indices))]
        nonzero = [d for d, c in enumerate(coefficients) if c != 0]
        if len(nonzero) == 1 and abs(coefficients[nonzero[0]]) == 1:
            found[name] = statement.indices[nonzero[0]]
    return found


def _constant_member(node: isl.ScheduleNode, member: int) -> bool:
    """Whether ``member`` of a band gives every statement instance the same value (within
    each statement: its schedule uses none of the statement's indices)."""
    pieces: list[isl.Aff] = []
    node.band_get_partial_schedule().get_at(member).foreach_pw_aff(
        lambda pw_aff: pw_aff.foreach_piece(lambda _set, aff: pieces.append(aff))
    )
    return all(
        aff.get_coefficient_val(isl.dim_type.in_, d).is_zero()
        for aff in pieces
        for d in range(aff.dim(isl.dim_type.in_))
    )


def _statement_or_none(program: PolyProgram, name: str):
    return next((s for s in program.statements if s.name == name), None)


def statement_accesses(statement) -> list[tuple[str, tuple]]:
    """(tensor, subscripts) of a statement's target and of each of its reads, target first."""
    accesses = [(statement.source.target, tuple(Affine.var(i) for i in statement.source.indices))]
    return accesses + [(a.tensor, tuple(a.read.subscripts)) for a in statement.reads if a.read is not None]


def stride_score(node: isl.ScheduleNode, member: int, program: PolyProgram) -> int:
    """How good a member is as the innermost loop: +2 per stride-1 access, -2 per access it
    strides over a non-last dimension, 0 for accesses it does not move.  ``!`` initialisations
    do not count: they run once per element, not once per iteration of the reduction."""
    score = 0
    for statement_name, index in member_indices(node, member, program).items():
        statement = program.statement(statement_name)
        if statement.kind == "init":
            continue
        for _, access in statement_accesses(statement):
            involved = [d for d, s in enumerate(access) if not isinstance(s, Affine) or index in s.names()]
            if not involved:
                continue
            last = access[-1]
            if involved == [len(access) - 1] and isinstance(last, Affine) and abs(last.coefficient(index)) == 1:
                score += 2
            else:
                score -= 2
    return score
