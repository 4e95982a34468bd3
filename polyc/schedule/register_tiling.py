"""Register tiles of the generic path: a reduction's target kept in registers while its
reduction loops run (unroll-and-jam, as Pluto and Polly's register tiling do).

Without it, the innermost loop of a reduction's band is vectorised along the target's last
index and every reduction step loads and stores the target's elements: a matmul's inner loop
does a load of C, a load of B, a multiply-add and a store of C per vector, and runs at the
speed of its stores.  A register tile reorders the band's point loops so that a block of
``rows x columns`` target elements stays in local accumulators while every reduction loop
runs.  ``rows`` run along an output index that some vector operand does not depend on (a
matmul's m: B(r_k, n) is the same for every row), so each vector of it loaded is used
``rows`` times; ``columns`` run along the vectorised index (the target's last), a few
vectors wide; the operand that does not move with that index (A(m, r_k)) is one broadcast
value per row.  The target is read and written once per block and cache tile.

On the point band ``P`` of a tiled band (members: the target's indices, and for a band like a
matmul's, reduction indices too), the transformation builds::

    outer band: P's output members, the row member and the column member last, each cut to
                multiples of the tile (``m - m mod rows``)
      sequence: the ``!`` initialisations             -> inner band
                the rest -> P's reduction members (if any) -> what P had below (a
                convolution's reduction bands, a bias added after the sum) -> inner band

where the inner band (``m mod rows``, unrolled; ``n mod columns``, vectorised) sits above every
leaf.  The result is checked against every dependence and dropped where it breaks one.  A
``register`` mark above the statements' part tells code generation
(:mod:`polyc.codegen.c`) to keep the target's block in a local array there, loaded before the
reduction loops and stored after them.  The sizes come from the vector registers of the
build (:func:`choose_register_tile`); ``register_tiles`` sets them, ``()`` turns tiles off.
The effect is measured by ``python -m benchmarks.generic_path``.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram, PolyStatement
from polyc.lang.symbolic import Affine
from polyc.schedule.isl_helpers import sets

#: Vector accumulators a register tile may hold, per width of the build's vector registers:
#: three quarters of AVX-512's and NEON's 32 registers and of AVX2's 16, leaving the rest for
#: the operands loaded in each step.  Portable C (0) gets a small tile the compiler can still
#: keep in registers on most machines.
ACCUMULATORS = {512: 24, 256: 12, 128: 24, 0: 8}

#: The fewest rows a tile must have to be worth its bookkeeping.
MIN_ROWS = 2


@dataclass(frozen=True)
class RegisterTile:
    """A register tile as code generation reads it from the ``register`` mark.

    ``tensor``: the target kept in registers; ``rows`` x ``columns``: the block; ``depths``:
    per statement under the mark, the schedule depths of its row and column loops (the inner
    band's members, which sit at different depths under different reduction loops);
    ``row_index``, ``column_index``: the update's TC indices along the rows and columns (for
    explanations)."""

    tensor: str
    rows: int
    columns: int
    depths: tuple[tuple[str, int, int], ...]
    row_index: str
    column_index: str

    @property
    def name(self) -> str:
        """The mark's name in printed schedule trees."""
        return f"register:{self.tensor}:{self.rows}x{self.columns}"

    def depths_of(self, statement: str) -> tuple[int, int] | None:
        """The schedule depths of ``statement``'s row and column loops, None if it has none."""
        return next(((row, column) for name, row, column in self.depths if name == statement), None)


@dataclass(frozen=True)
class _Plan:
    """What :func:`plan_register_tile` found: the band's members by role, and the sizes."""

    update: PolyStatement
    row: int
    column: int
    reductions: tuple[int, ...]
    outputs: tuple[int, ...]
    rows: int
    columns: int
    row_index: str


#: How much more a row of a partial tile (cut short at the domain's edge) costs than a full
#: one's: its trip counts are not constants, so the compiler keeps its accumulators in memory.
PARTIAL_TILE_COST = 2

#: The narrowest vector the compiler splits a loop's remainder into (SSE's and NEON's four
#: floats); what is left runs scalar.
NARROWEST_VECTOR_BYTES = 16


def vector_operations(columns: int, lanes: int, itemsize: int) -> int:
    """The vector (and scalar) operations one row of ``columns`` elements takes: whole vectors
    of ``lanes``, then the halves, quarters... down to :data:`NARROWEST_VECTOR_BYTES`, then
    scalars, as gcc vectorises a loop of a constant trip count and its remainder."""
    operations, left, width = 0, columns, lanes
    narrowest = max(1, NARROWEST_VECTOR_BYTES // itemsize)
    while width >= narrowest and left:
        operations += left // width
        left %= width
        width //= 2
    return operations + left


def choose_register_tile(
    row_extent: int, column_extent: int, itemsize: int, vector_bits: int
) -> tuple[int, int] | None:
    """Rows and columns of a register tile for a band whose row and column point loops run
    ``row_extent`` and ``column_extent`` iterations, of elements of ``itemsize`` bytes, in
    vector registers of ``vector_bits`` (0: portable C).

    Columns: one or two vectors, or the whole column loop where it is at most two vectors
    long (four, where whole vectors leave a remainder that needs no scalar operation),
    whichever takes the fewest
    operations along the whole loop
    (:func:`vector_operations`, a partial tile at the end costing :data:`PARTIAL_TILE_COST`
    times more), the wider on a tie.  Rows: the accumulators (:data:`ACCUMULATORS`) over the
    operations a row takes, lowered to the largest divisor of the row loop where that is at
    least three quarters of it."""
    lanes = max(1, (vector_bits or 128) // (8 * itemsize))

    def cost(columns: int) -> float:
        full, left = divmod(column_extent, columns)
        partial = vector_operations(left, lanes, itemsize) * PARTIAL_TILE_COST if left else 0
        return full * vector_operations(columns, lanes, itemsize) + partial

    # One or two whole vectors, or the whole loop where it is short: a tile of another
    # width has a remainder in every tile, which gcc writes as a loop of its own whose
    # accumulators stay in memory (a 54-wide row in tiles of 24 or 28 ran 3-5x slower than in
    # tiles of 16; python -m benchmarks.generic_path's grouped convolution).
    candidates = {c for c in (lanes, 2 * lanes) if c <= column_extent}
    narrowest = max(1, NARROWEST_VECTOR_BYTES // itemsize)
    if column_extent <= 2 * lanes or (
        column_extent <= 4 * lanes and column_extent % lanes and column_extent % narrowest == 0
    ):
        candidates.add(column_extent)  # (up to four vectors where tiles would leave a remainder)
    columns = min(candidates, key=lambda c: (cost(c), -c))
    operations = max(1, vector_operations(columns, lanes, itemsize))
    most = min(row_extent, max(1, ACCUMULATORS.get(vector_bits, ACCUMULATORS[0]) // operations))
    if most < MIN_ROWS:
        return None

    # The most rows, or a divisor of the row loop near it (every tile full): a tile of more
    # rows reuses each loaded vector more (sgemm 1024 on AVX-512: 12 rows of two vectors, one
    # partial tile, ran faster than 8 rows in full tiles; python -m benchmarks.generic_path).
    divisor = max(r for r in range(1, most + 1) if row_extent % r == 0)
    rows = divisor if 4 * divisor >= 3 * most else most
    return rows, columns


def plan_register_tile(
    band: isl.ScheduleNode,
    program: PolyProgram,
    extents: list[int | None],
    vector_bits: int,
    sizes: tuple[int, ...] | None,
) -> _Plan | None:
    """The members and sizes of a register tile for ``band``, or None where
    it takes none: one reduction (an update with a reduction index) and its initialisation
    under it, any other statement writing the same element of the same target (a bias added
    after the sum), the target floating-point; a coincident member along the target's last
    index (the vector loop) and another one along a target index that some read moving with the
    vector loop does not depend on (the rows).  ``extents``: the point loops' iteration counts;
    ``sizes``: the user's (rows, columns), or None for :func:`choose_register_tile`'s."""
    from polyc.schedule.transform import member_indices  # shares the member analysis

    statements = [program.statement(s.get_tuple_name()) for s in sets(band.get_domain())]
    updates = [s for s in statements if s.kind == "update"]
    if len(updates) != 1:
        return None
    update = updates[0]
    source = update.source
    target = program.definition.tensor(source.target)
    if target.dtype.kind != "f" or target.dtype.itemsize < 4 or not source.indices:
        return None
    reduction_indices = set(update.indices) - set(source.indices)
    if not reduction_indices:
        return None
    for statement in statements:
        if statement is update:
            continue
        if statement.source.target != source.target or len(statement.source.indices) != len(source.indices):
            return None
        for access in statement.reads:
            if access.tensor == source.target and (
                access.read is None or [str(s) for s in access.read.subscripts] != list(statement.source.indices)
            ):
                return None
    if any(a.read is not None and a.tensor == source.target for a in update.reads):
        return None  # the update reads its own target elsewhere than the element it accumulates
    n = band.band_n_member()
    indices = [member_indices(band, m, program) for m in range(n)]
    # Every other statement's members must run over its target indices as the update's do.
    for statement in statements:
        if statement is update:
            continue
        for position, index in enumerate(source.indices):
            members = [m for m in range(n) if indices[m].get(update.name) == index]
            theirs = [m for m in range(n) if indices[m].get(statement.name) == statement.source.indices[position]]
            if members != theirs:
                return None
    update_index = [indices[m].get(update.name) for m in range(n)]
    reductions = tuple(m for m in range(n) if update_index[m] in reduction_indices)
    outputs = tuple(m for m in range(n) if m not in reductions)
    last = source.indices[-1]
    column = next((m for m in outputs if update_index[m] == last and band.band_member_get_coincident(m)), None)
    if column is None or extents[column] is None:
        return None
    # Rows: a target index some read that moves with the columns does not depend on.
    streamed = [
        a.read
        for a in update.reads
        if a.read is not None and any(last in s.names() for s in a.read.subscripts if hasattr(s, "names"))
    ]
    if not all(_vector_read(read.subscripts, last) for read in streamed):
        return None  # a read across rows (a transposed operand): the dot-product form is better
    rows_candidates = []
    for m in outputs:
        runs_over, extent = update_index[m], extents[m]
        if m == column or runs_over is None or runs_over not in source.indices or not extent:
            continue
        if not band.band_member_get_coincident(m):
            continue
        reused = [r for r in streamed if not any(runs_over in s.names() for s in r.subscripts if hasattr(s, "names"))]
        if reused and extent >= MIN_ROWS:
            rows_candidates.append((len(reused), extent, -m, m))
    if not rows_candidates:
        return None
    row = max(rows_candidates)[-1]
    row_extent, column_extent = extents[row], extents[column]
    assert row_extent is not None and column_extent is not None
    if sizes is not None:
        rows, columns = min(sizes[0], row_extent), min(sizes[1], column_extent)
        if rows < 1 or columns < 1:
            return None
    else:
        chosen = choose_register_tile(row_extent, column_extent, target.dtype.itemsize, vector_bits)
        if chosen is None:
            return None
        rows, columns = chosen
    return _Plan(update, row, column, reductions, outputs, rows, columns, update_index[row] or "")


#: The largest step along the column index of a read the column loop vectorises: 2 is a
#: stride-2 convolution's input row, gathered from two vectors; a larger one (a transposed
#: operand, a row of a matrix) is a gather per lane, and the reduction then runs better as
#: the vectorised dot product the band had.
MAX_COLUMN_STEP = 2


def _vector_read(subscripts, column: str) -> bool:
    """Whether a read moves with the column index only in its last subscript, by at most
    :data:`MAX_COLUMN_STEP` elements per column."""
    *outer, innermost = subscripts
    if any(not isinstance(s, Affine) or column in s.names() for s in outer):
        return False
    return isinstance(innermost, Affine) and 0 < abs(innermost.coefficient(column)) <= MAX_COLUMN_STEP


def apply_register_tile(
    band: isl.ScheduleNode, plan: _Plan, program: PolyProgram, dependences: Dependences | None
) -> isl.ScheduleNode | None:
    """``band`` rebuilt as a register tile (see the module's description), with its marks:
    unroll on the rows, simd on the columns, ``register`` above the reduction part; the node at
    the band's position.  None where the result would break a dependence."""
    from polyc.schedule.transform import REGISTER, SIMD, UNROLL, LoopMark

    ctx = band.get_ctx()
    partial = band.band_get_partial_schedule()
    coincident = [bool(band.band_member_get_coincident(m)) for m in range(band.band_n_member())]

    def member(m: int) -> isl.UnionPwAff:
        return partial.get_at(m)

    def cut(m: int, size: int) -> tuple[isl.UnionPwAff, isl.UnionPwAff]:
        inner = member(m).mod_val(isl.Val.int_from_si(ctx, size))
        return member(m).sub(inner), inner

    row_outer, row_inner = cut(plan.row, plan.rows)
    column_outer, column_inner = cut(plan.column, plan.columns)
    others = [m for m in plan.outputs if m not in (plan.row, plan.column)]
    outer = _multi([member(m) for m in others] + [row_outer, column_outer])
    outer_coincident = [coincident[m] for m in others] + [coincident[plan.row], coincident[plan.column]]
    reduction = _multi([member(m) for m in plan.reductions]) if plan.reductions else None
    inner = _multi([row_inner, column_inner])

    top_depth = band.get_tree_depth()
    inits = {s.name for s in program.statements if s.kind == "init"}
    node = band.delete().insert_partial_schedule(outer).band_set_permutable(1)
    for position, flag in enumerate(outer_coincident):
        node = node.band_member_set_coincident(position, flag)
    node = node.child(0)
    node = _initialisations_first(node, inits)
    node = _sink(node, inner, (coincident[plan.row], coincident[plan.column]))
    # The reduction part: the highest node on the update's path that holds no initialisation.
    # The band's own reduction members (a matmul's r_k) go there, above the reduction bands
    # below it (a convolution's taps), in their order; the register mark above them.
    region = _region_root(node.parent(), plan.update.name, inits)
    if region is None:
        return None
    if reduction is not None:
        region = region.insert_partial_schedule(reduction.intersect_domain(region.get_domain()))
    depths: list[tuple[str, int, int]] = []
    _inner_depths(region, depths)
    tile = RegisterTile(
        plan.update.source.target,
        plan.rows,
        plan.columns,
        tuple(depths),
        plan.row_index,
        plan.update.source.indices[-1],
    )
    region = LoopMark(REGISTER, (), register_tile=tile).insert_above(region)
    node = region
    while node.get_tree_depth() > top_depth:
        node = node.parent()
    if dependences is not None and not _respects(node, dependences, program):
        return None
    # Marks on the inner bands: rows unrolled, columns vectorised (they are now fixed in place).
    node = _mark_inner_bands(node, depths, plan.rows, LoopMark, UNROLL, SIMD)
    while node.get_tree_depth() > top_depth:
        node = node.parent()
    return node


def _multi(pieces: list[isl.UnionPwAff]) -> isl.MultiUnionPwAff:
    result = isl.MultiUnionPwAff.from_union_pw_aff(pieces[0])
    for piece in pieces[1:]:
        result = result.flat_range_product(isl.MultiUnionPwAff.from_union_pw_aff(piece))
    return result


def _initialisations_first(node: isl.ScheduleNode, inits: set[str]) -> isl.ScheduleNode:
    """``node`` under a sequence that runs the ``!`` initialisations among its statements first
    (each part a copy of the subtree, filtered: the initialisations' copy of reduction loops
    runs once, their values constant), where it holds both kinds; else ``node``."""
    names = _statements_at(node)
    if not (names & inits) or names <= inits:
        return node
    domain = node.get_domain()
    first = isl.UnionSet.empty(domain.get_space())
    rest = isl.UnionSet.empty(domain.get_space())
    for piece in sets(domain):
        if piece.get_tuple_name() in inits:
            first = first.union(isl.UnionSet.from_set(piece))
        else:
            rest = rest.union(isl.UnionSet.from_set(piece))
    filters = isl.UnionSetList.alloc(node.get_ctx(), 2).add(first).add(rest)
    return node.insert_sequence(filters)


def _sink(node: isl.ScheduleNode, inner: isl.MultiUnionPwAff, coincident: tuple[bool, bool]) -> isl.ScheduleNode:
    """Insert the inner band above every leaf under ``node``; returns the node at ``node``'s
    position."""
    if node.get_type() != isl.schedule_node_type.leaf:
        for position in range(node.n_children()):
            node = _sink(node.child(position), inner, coincident).parent()
        return node
    domain = node.get_domain()
    if domain.is_empty():
        return node
    node = node.insert_partial_schedule(inner.intersect_domain(domain))
    return node.band_member_set_coincident(0, coincident[0]).band_member_set_coincident(1, coincident[1])


def _inner_depths(node: isl.ScheduleNode, depths: list[tuple[str, int, int]]) -> None:
    """Each statement under ``node`` with the schedule depths of its inner band (the band
    right above its leaf: its row and column members)."""
    if node.get_type() == isl.schedule_node_type.leaf:
        band = node.parent()
        depth = band.get_schedule_depth()
        depths.extend((name, depth, depth + 1) for name in sorted(_statements_at(node)))
        return
    for position in range(node.n_children()):
        _inner_depths(node.child(position), depths)


def _region_root(node: isl.ScheduleNode, update: str, inits: set[str]) -> isl.ScheduleNode | None:
    """The highest node under ``node`` (a band) on the update's path whose statements include
    no initialisation (a filter's child: a filter node's domain is the one reaching it)."""
    node = node.child(0)
    while True:
        names = _statements_at(node)
        if update not in names:
            return None
        if not names & inits and node.get_type() != isl.schedule_node_type.filter:
            return node
        chosen = next(
            (node.child(i) for i in range(node.n_children()) if update in _statements_at(node.child(i))), None
        )
        if chosen is None:
            return None
        node = chosen


def _statements_at(node: isl.ScheduleNode) -> set[str]:
    """The statements whose instances run under ``node`` (a filter's: those it lets through)."""
    domain = node.get_domain()
    if node.get_type() == isl.schedule_node_type.filter:
        domain = domain.intersect(node.filter_get_filter())
    return {s.get_tuple_name() for s in sets(domain) if not s.is_empty()}


def _respects(node: isl.ScheduleNode, dependences: Dependences, program: PolyProgram) -> bool:
    """Whether the subtree at ``node`` runs every dependence among its statement instances
    (those with the same values of the enclosing loops) forward."""
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map()
    same = prefix.apply_range(prefix.reverse())
    among = dependences.all.intersect_domain(domain).intersect_range(domain).intersect(same)
    if among.is_empty():
        return True
    subtree = node.get_subtree_schedule_union_map()
    pairs = among.apply_domain(subtree).apply_range(subtree).intersect_params(program.context)
    maps: list[isl.Map] = []
    pairs.foreach_map(maps.append)
    return all(m.is_subset(lex_before(m.get_space())) for m in maps)


def lex_before(space: isl.Space) -> isl.Map:
    """The pairs of time vectors of ``space`` (a map space; the vectors may differ in length,
    as a schedule tree's do for statements at different depths) whose first is before the
    second: greater in the first position, within their common length, where they differ."""
    sources, sinks = space.dim(isl.dim_type.in_), space.dim(isl.dim_type.out)
    before = isl.Map.empty(space)
    for position in range(min(sources, sinks)):
        piece = isl.Map.universe(space)
        for earlier in range(position):
            piece = piece.equate(isl.dim_type.in_, earlier, isl.dim_type.out, earlier)
        before = before.union(piece.order_lt(isl.dim_type.in_, position, isl.dim_type.out, position))
    return before


def _mark_inner_bands(node, depths, rows, loop_mark, unroll, simd) -> isl.ScheduleNode:
    """Split every inner band under ``node`` into its row and column members, the rows marked
    unroll (by ``rows``), the columns simd."""
    if node.get_type() == isl.schedule_node_type.band and node.band_n_member() == 2 and _is_inner(node, depths):
        depth = node.get_schedule_depth()
        node = node.band_split(1)
        node = loop_mark(unroll, (depth,), unroll=rows).insert_above(node).child(0)
        column = node.child(0)
        column = loop_mark(simd, (depth + 1,)).insert_above(column)
        return column.parent().parent()
    for position in range(node.n_children()):
        node = _mark_inner_bands(node.child(position), depths, rows, loop_mark, unroll, simd).parent()
    return node


def _is_inner(node: isl.ScheduleNode, depths) -> bool:
    """Whether a band of two members is an inner band :func:`_sink` inserted (a leaf below it)."""
    if node.n_children() != 1 or node.child(0).get_type() != isl.schedule_node_type.leaf:
        return False
    depth = node.get_schedule_depth()
    names = {s.get_tuple_name() for s in sets(node.get_domain())}
    return all((name, depth, depth + 1) in depths for name in names)
