"""Statement instances at small sizes, the dependence pairs between them, and what the compiled
schedule does with each one: its position in the execution order, its tile, and the iteration
of the parallel loop it runs in.  The static plots (:mod:`polyc.viz.domain`) and the interactive
view (:mod:`polyc.viz.view`) draw the same :class:`Instances`.

Everything is enumerated by isl from the compilation's own objects (:class:`polyc.driver.Stages`):
the statements' domains, the dependence relations, the optimised schedule's map, and the bands'
tiling and parallel decisions (:class:`polyc.schedule.transform.BandDecision`).

Arrows are the nearest dependences: the pairs between shown instances that no chain of two or
more dependence pairs implies (the transitive reduction of the union of the kinds drawn,
computed by isl on the relations at the given sizes), each drawn once under its first kind.  A reduction's relation holds every earlier step to every
later one; its reduction is the chain of consecutive steps, which orders them all the same.
Above :data:`ARROWS_PER_100_POINTS` the arrows are thinned (:func:`thin`: every class kept,
the arrows into a sample of points) and the picture says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from polyc.errors import PolycError
from polyc.paths import gemm as gemm_path
from polyc.paths import kernel_path

KINDS = ("flow", "anti", "output", "reduction")
#: The most instances a picture draws as points; a statement with more in the slice drawn is
#: drawn aggregated (:func:`plot_domain`), in at most CELLS_PER_AXIS blocks along each axis.
MAX_POINTS = 20000
CELLS_PER_AXIS = 16
#: The most arrows a picture draws per 100 points drawn; more are thinned (:func:`thin`).
ARROWS_PER_100_POINTS = 150
# Squarings of a relation tried for its transitive closure (paths up to 2**12 pairs long).
_CLOSURE_ROUNDS = 12


@dataclass
class StatementPoints:
    name: str
    indices: tuple[str, ...]
    points: np.ndarray  # every instance at the sizes, one row per point
    shown: np.ndarray  # mask of the rows in the plotted slice
    dims: tuple[int, ...]  # which indices are the picture's axes (x, y[, z])
    fixed: dict  # index -> value of the other indices in the slice
    #: Drawn aggregated (more than MAX_POINTS instances in the slice): block -> its instances,
    #: a block ``b`` holding the values ``b[d] * cell_sizes[d]`` to ``(b[d] + 1) * cell_sizes[d] - 1``
    #: along axis d (``points`` and ``shown`` are then empty).
    cells: dict = field(default_factory=dict)
    cell_sizes: tuple[int, ...] = ()
    count: int = 0  # instances in the slice
    cell_label: str = ""  # what the blocks are, when not equal cuts of the axes
    bounds: tuple[tuple[int, int], ...] = ()  # (lowest, highest) value along each axis, aggregated

    @property
    def aggregated(self) -> bool:
        return bool(self.cells)

    def shown_points(self) -> list[tuple[int, ...]]:
        return [tuple(int(v) for v in p) for p in self.points[self.shown]]


@dataclass
class Instances:
    """What a picture of ``kernel`` at ``sizes`` shows.  Keys of the per-instance dicts are
    ``(statement, point)`` with ``point`` a tuple of the statement's index values."""

    statements: list[StatementPoints]
    arrows: list[tuple[str, str, tuple, str, tuple]]  # (kind, source, point, sink, point)
    title: str = ""
    order: dict = field(default_factory=dict)  # -> position in the schedule, 0 first
    tile: dict = field(default_factory=dict)  # -> tile coordinates in the outermost tiled band
    tile_sizes: tuple = ()
    parallel: dict = field(default_factory=dict)  # -> iteration of the outermost parallel loop
    parallel_loop: str = ""  # e.g. "m (tiles of 32)"
    violated: set = field(default_factory=set)  # arrows a user's schedule runs sink-first
    violated_elsewhere: int = 0  # violated pairs with an end outside the drawn slice
    schedule_source: str = "compiled"  # whose order: "compiled" or "user"
    nearest_arrows: int = 0  # the nearest dependence pairs between shown points, before thinning
    tile_label: str = ""  # what the tiles are, when not the schedule's tiles (a kernel path's blocks)
    flattened: str = ""  # the index groups drawn flattened (a gemm kernel's M and N), or ""

    @property
    def point_count(self) -> int:
        return sum(int(s.shown.sum()) for s in self.statements)

    @property
    def thinned(self) -> bool:
        """Whether fewer arrows are kept than the nearest dependences between shown points."""
        return len(self.arrows) < self.nearest_arrows

    @property
    def arrows_note(self) -> str:
        """What the arrows are, for a legend or title: nearest pairs, and how many were thinned."""
        if self.thinned:
            return (
                f"{len(self.arrows)} of {self.nearest_arrows} nearest dependences drawn "
                f"(those into a sample of points, at most {ARROWS_PER_100_POINTS} per 100 points)"
            )
        return "nearest dependences (pairs no chain of others implies)"

    def crosses_tiles(self, arrow) -> bool:
        """Whether a dependence arrow joins two different tiles (islplot shows only those)."""
        _, source, a, sink, b = arrow
        return self.tile.get((source, a)) != self.tile.get((sink, b))


def layout(statements: list[StatementPoints], dims: int) -> tuple[dict, list[list[tuple[float, str]]]]:
    """Where a picture of ``dims`` axes draws each shown instance, and its ticks.

    Returns (statement, point) -> coordinates, and per axis the (position, label) ticks, every
    label the index value of the points drawn at that position.  Statements are drawn at their
    index values: those with ``dims`` axes overlap, each nudged by less than a step along the
    diagonal so a dependence between them is a short arrow; one with fewer axes is a row (or
    plane) of its own just below the others along the axes it lacks.  When no statement has
    more than one axis, each is a row of its own (y = 0, -1, ...) and y has no ticks."""
    axes_of = {s.name: list(dict.fromkeys(s.dims)) for s in statements}
    flat = all(len(axes) == 1 for axes in axes_of.values())
    full = [s for s in statements if len(axes_of[s.name]) >= dims]
    values: list[list[int]] = [[] for _ in range(dims)]
    for s in statements:
        for point in s.shown_points():
            for d, axis in enumerate(axes_of[s.name][:dims] if s in full else axes_of[s.name][:1]):
                values[d].append(point[axis])
    nudge = 0.0 if len(full) <= 1 else 0.5 / len(full)
    position: dict = {}
    rows = 0
    for s in statements:
        axes = axes_of[s.name]
        shift = nudge * full.index(s) if s in full else 0.0
        row = 0
        if flat or s not in full:
            row, rows = rows, rows + 1
        for point in s.shown_points():
            if flat:
                coordinates = [float(point[axes[0]])] + ([-float(row)] if dims > 1 else [])
            else:
                coordinates = [point[axis] + shift for axis in axes[:dims]]
                coordinates += [min(values[d], default=0) - 1 - row for d in range(len(coordinates), dims)]
            position[(s.name, point)] = tuple(float(c) for c in coordinates) + (0.0,) * (dims - len(coordinates))
    if flat:
        values[1:] = [[] for _ in values[1:]]
    ticks = [[(float(v), str(v)) for v in integer_ticks(min(vs), max(vs))] if vs else [] for vs in values]
    return position, ticks


def integer_ticks(low: int, high: int, most: int = 8) -> list[int]:
    """Index values from ``low`` to ``high`` at a whole step, at most ``most`` of them."""
    step = max(1, -(-(high - low) // max(1, most - 1)))
    return list(range(low, high + 1, step))


def collect(
    kernel,
    sizes: dict,
    statements=None,
    dims=None,
    fixed: dict | None = None,
    kinds=KINDS,
    max_dims: int = 2,
    schedule=None,
    violated: isl.UnionMap | None = None,
    aggregate: bool = False,
) -> Instances:
    """The instances of ``statements`` (names like ``S0``; default: all but ``!`` initialisations)
    of ``kernel`` at ``sizes``, sliced to ``dims`` (at most ``max_dims`` index names; default
    the first ones) at ``fixed`` values of the other indices (default: their lowest), with the
    dependence arrows of ``kinds`` between shown instances and the schedule's view of them.

    ``schedule`` (isl text, a union map from instances to time vectors, or an isl.Schedule)
    orders the instances instead of the compiled schedule (tiles and parallel loops are then
    not shown: they belong to the compiled one); ``violated`` marks the arrows in that relation
    (:meth:`polyc.viz.explain.ScheduleCheck.plot` passes the pairs a schedule violates).

    A slice of more than :data:`MAX_POINTS` instances is refused, or with ``aggregate`` counted
    in blocks (:attr:`StatementPoints.cells`; the gemm kernel's cache blocks where it runs on
    the gemm path), with no arrows, order or tiles for it.  On the gemm path a contraction whose
    M or N is a group of indices, or that has batch indices, is drawn over its flattened M and N
    (as the kernel flattens them) at the lowest batch and K values, when ``dims`` is not given."""
    unknown_kinds = [k for k in kinds if k not in KINDS]
    if unknown_kinds:
        raise PolycError(
            f"unknown dependence kind {', '.join(map(repr, unknown_kinds))}; the kinds are {', '.join(KINDS)}"
        )
    if dims is not None and len(dims) > max_dims:
        raise PolycError(f"at most {max_dims} dims can be drawn here, not {len(dims)} ({', '.join(dims)})")
    stages = kernel.stages(sizes)
    program = stages.program
    names = list(statements) if statements else [s.name for s in program.statements if s.kind != "init"]
    unknown = [n for n in names if n not in {s.name for s in program.statements}]
    if unknown:
        raise PolycError(
            f"no statement {', '.join(unknown)}; the statements are {', '.join(s.name for s in program.statements)}"
        )
    asked = list(names)
    # The violated pairs as values: the relation comes from another analysis of the def, whose
    # isl parameters are not this program's.
    bad = set(pairs(_fix_sizes(violated, sizes))) if violated is not None else None
    if bad and not statements:
        # `!` initialisations are left out by default; one a violated pair touches is drawn too.
        touched = {name for source, _, sink, _ in bad for name in (source, sink)}
        names += [s.name for s in program.statements if s.name in touched and s.name not in names]
    path = kernel_path(stages.path)
    on_gemm = schedule is None and path.name == "gemm" and stages.contraction is not None
    flat_dims = _flat_gemm_dims(stages, names) if on_gemm and dims is None and fixed is None else None
    plotted = None
    if flat_dims is not None:
        plotted = [_slice(program.statement(name), flat_dims[name], None, 4, aggregate=True) for name in names]
        if any(statement.aggregated for statement in plotted):
            plotted = None  # too many points: drawn as any other, aggregated
    if plotted is None:
        flat_dims = None
        blocks = _gemm_cell_hint(stages) if on_gemm else {}
        plotted = [
            _slice(program.statement(name), dims, fixed, max_dims, name not in asked, aggregate, blocks)
            for name in names
        ]
    small = [s for s in plotted if not s.aggregated]
    shown_set = _shown_set(program, small)
    shown = {s.name: set(s.shown_points()) for s in plotted}
    # Nearest pairs of the union of the kinds drawn (every kind when violations are drawn: a
    # violated pair of any kind is shown), each pair once, under the first kind that holds it.
    relations = {}
    for kind in KINDS if bad is not None else kinds:
        relation = getattr(stages.dependences, kind)
        if kind != "reduction":
            relation = relation.subtract(stages.dependences.reduction)
        relation = _fix_sizes(relation, sizes).intersect_params(program.context)
        relations[kind] = relation.intersect_domain(shown_set).intersect_range(shown_set)
    union = isl.UnionMap.empty(program.context.get_space())
    for relation in relations.values():
        union = union.union(relation)
    nearest = transitive_reduction(union)
    arrows: list = []
    violated_pairs: set = set()
    drawn: set = set()
    for kind, relation in relations.items():
        for pair in pairs(relation.intersect(nearest)):
            source, a, sink, b = pair
            if pair in drawn or a not in shown.get(source, ()) or b not in shown.get(sink, ()):
                continue
            if bad and pair in bad:
                violated_pairs.add(pair)
            elif kind not in kinds:
                continue
            drawn.add(pair)
            arrows.append((kind, *pair))
    sizes_text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    if flat_dims is not None:
        flat = {statement.name: _flatten(statement, stages, flat_dims[statement.name]) for statement in plotted}
        arrows = [(kind, a, flat[a][p], b, flat[b][q]) for kind, a, p, b, q in arrows]
    result = Instances(plotted, arrows, f"{kernel.definition.name} at {sizes_text}", nearest_arrows=len(arrows))
    if flat_dims is not None:
        c = stages.contraction
        result.flattened = (
            f"M = ({', '.join(c.m)}) and N = ({', '.join(c.n)}) flattened row-major, as the gemm kernel flattens them"
            + (f", at {', '.join(c.batch)} = lowest" if c.batch else "")
            + f", K = ({', '.join(c.k)}) at its lowest"
        )
        result.title += f"\ndrawn over the flattened index groups: {result.flattened}"
    for statement in plotted:
        if statement.aggregated:
            at = ", ".join(f"{i}={v}" for i, v in statement.fixed.items())
            block_sizes = " x ".join(map(str, statement.cell_sizes))
            result.title += (
                f"\n{statement.name}: {statement.count} instances{' at ' + at if at else ''}, more than {MAX_POINTS}: "
                f"drawn aggregated in blocks of {block_sizes}"
                + (f" ({statement.cell_label})" if statement.cell_label else "")
                + ", each with its count; no arrows, order or tiles drawn for it"
            )
    result.violated = violated_pairs
    if bad:
        result.violated_elsewhere = sum(
            1 for source, a, sink, b in bad if a not in shown.get(source, ()) or b not in shown.get(sink, ())
        )
    result.arrows = thin(result.arrows, result.point_count, result.violated)
    if schedule is None and not path.runs_schedule_loops and stages.gpu is None:
        # The CPU schedule's loop nest is not the code that runs: no order, tiles or threads of
        # it.  (A GPU kernel's schedule is its launches' mapping, which the code follows.)
        if path.name == "gemm" and stages.contraction is not None:
            _gemm_blocks(result, stages, flat_dims is not None)
        result.title += (
            f"\nthis kernel runs on the {path.name} path: the picture shows the statement instances, not the "
            "loops of the schedule (no order or parallel loop of them is drawn"
            + ("; tiles are the kernel's cache blocks)" if result.tile else ", nor tiles)")
        )
    elif schedule is None:
        result.order = schedule_order(stages.optimized_schedule.get_map(), program, small)
        _band_views(result, stages, program)
    else:
        result.order = schedule_order(_fix_sizes(_as_union_map(schedule, program), sizes), program, small)
        result.schedule_source = "user"
    return result


def transitive_reduction(relation: isl.UnionMap) -> isl.UnionMap:
    """The pairs of a bounded, acyclic ``relation`` that no chain of two or more of its pairs
    implies: ``R - R . R+``, with ``R+`` the transitive closure by repeated squaring (exact at
    fixed sizes).  If the closure does not settle, ``R - R . R`` (still only implied pairs go)."""
    closure = relation
    for _ in range(_CLOSURE_ROUNDS):
        grown = closure.union(closure.apply_range(closure)).coalesce()
        if grown.is_subset(closure):
            break
        closure = grown
    else:
        closure = relation
    return relation.subtract(relation.apply_range(closure)).coalesce()


def thin(arrows: list, points: int, keep: set) -> list:
    """At most :data:`ARROWS_PER_100_POINTS` per 100 ``points`` of ``arrows``: one of each class
    (kind, source and sink statements, distance), then the arrows in ``keep`` (violated pairs),
    then the others, each time every arrow into a sample of sink points spread over them, so a
    kept point shows its whole pattern of dependences."""
    budget = max(1, ARROWS_PER_100_POINTS * points // 100)
    if len(arrows) <= budget:
        return arrows
    first: dict = {}
    for arrow in sorted(arrows, key=lambda arrow: arrow[1:] not in keep):
        kind, source, a, sink, b = arrow
        distance = tuple(y - x for x, y in zip(a, b)) if len(a) == len(b) else ()
        first.setdefault((kind, source, sink, distance), arrow)
    chosen = list(first.values())[:budget]
    taken = set(chosen)
    for group in ([a for a in arrows if a[1:] in keep], [a for a in arrows if a[1:] not in keep]):
        chosen += _into_sampled_sinks([a for a in group if a not in taken], budget - len(chosen))
    return chosen


# Sinks are sampled at the multiples of the golden ratio's fraction below a threshold: spread
# over the points without the stripes a regular stride leaves on a grid.
_GOLDEN = 0.6180339887498949


def _into_sampled_sinks(arrows: list, room: int) -> list:
    """At most ``room`` of ``arrows``: all those into a sample of their sink points."""
    if len(arrows) <= room:
        return arrows
    by_sink: dict = {}
    for arrow in arrows:
        by_sink.setdefault(arrow[3:], []).append(arrow)
    groups = list(by_sink.values())
    fraction = room / len(arrows)
    while fraction > 0:
        kept = [a for k, group in enumerate(groups) if (k * _GOLDEN) % 1 < fraction for a in group]
        if len(kept) <= room:
            return kept
        fraction -= 1 / len(groups)
    return []


def _shown_set(program, plotted) -> isl.UnionSet:
    """The shown instances of every plotted statement, as an isl set at the program's sizes."""
    result = isl.UnionSet.empty(program.context.get_space())
    for statement in plotted:
        domain = program.statement(statement.name).domain.intersect_params(program.context)
        for index, value in statement.fixed.items():
            position = statement.indices.index(index)
            domain = domain.fix_val(isl.dim_type.set, position, isl.Val.int_from_si(domain.get_ctx(), int(value)))
        result = result.union(isl.UnionSet.from_set(domain))
    return result


def _fix_sizes(relation: isl.UnionMap, sizes: dict) -> isl.UnionMap:
    """``relation`` with its size parameters set to ``sizes`` (a relation made for every size)."""
    space = relation.get_space()
    names = [str(space.get_dim_name(isl.dim_type.param, i)) for i in range(space.dim(isl.dim_type.param))]
    constraints = " and ".join(f"{n} = {int(sizes[n])}" for n in names if n in sizes)
    if not constraints:
        return relation
    values = isl.Set.read_from_str(relation.get_ctx(), f"[{', '.join(names)}] -> {{ : {constraints} }}")
    return relation.intersect_params(values)


def _as_union_map(schedule, program) -> isl.UnionMap:
    if isinstance(schedule, isl.Schedule):
        schedule = schedule.get_map()
    try:
        relation = isl.UnionMap.read_from_str(program.ctx, str(schedule))
    except isl.Error as error:
        raise PolycError(f"not an isl union map: {schedule!r} ({error})") from error
    return relation.align_params(program.context.get_space())


def _slice(
    statement, dims, fixed, max_dims, lenient: bool = False, aggregate: bool = False, cell_hint=None
) -> StatementPoints:
    """The points of ``statement`` and the slice of them shown.  ``lenient`` (a statement drawn
    without being asked for: an initialisation in a violated pair) takes those of ``dims`` and
    ``fixed`` it has an index for.  A domain of more than :data:`MAX_POINTS` points keeps only
    the slice's; a slice of more is refused, or with ``aggregate`` counted in blocks (along an
    index ``i`` of ``cell_hint``, blocks of ``cell_hint[i]`` where that makes at most
    :data:`CELLS_PER_AXIS` of them; else equal cuts)."""
    domain = statement.domain
    if lenient:
        dims = [d for d in dims if d in statement.indices] if dims else None
        fixed = {i: v for i, v in (fixed or {}).items() if i in statement.indices}
    wanted = tuple(dims) if dims else statement.indices[:max_dims]
    missing = [d for d in wanted if d not in statement.indices]
    if missing:
        raise PolycError(
            f"{statement.name} has no index {', '.join(missing)} (its indices: {', '.join(statement.indices)})"
        )
    unknown_fixed = [i for i in (fixed or {}) if i not in statement.indices]
    if unknown_fixed:
        raise PolycError(
            f"fixed names {', '.join(unknown_fixed)}, which {statement.name} has no index of "
            f"(its indices: {', '.join(statement.indices)})"
        )
    axes = tuple(statement.indices.index(d) for d in wanted) if wanted else (0,)
    others = [(p, i) for p, i in enumerate(statement.indices) if p not in axes]
    if _box_size(domain) <= MAX_POINTS:
        points = domain_points(domain)
        slice_values = {}
        shown = np.ones(len(points), bool)
        for position, index in others:
            value = (fixed or {}).get(index, int(points[:, position].min()) if len(points) else 0)
            slice_values[index] = value
            shown &= points[:, position] == value
        return StatementPoints(statement.name, statement.indices, points, shown, axes, slice_values)
    slice_values = {i: int((fixed or {}).get(i, domain.dim_min_val(p).to_python())) for p, i in others}
    sliced = domain
    for position, index in others:
        sliced = sliced.fix_val(isl.dim_type.set, position, isl.Val.int_from_si(domain.get_ctx(), slice_values[index]))
    count = sliced.count_val().to_python()
    if count <= MAX_POINTS:
        points = domain_points(sliced)
        return StatementPoints(
            statement.name, statement.indices, points, np.ones(len(points), bool), axes, slice_values, count=count
        )
    if not aggregate:
        at = ", ".join(f"{i}={v}" for i, v in slice_values.items())
        raise PolycError(
            f"{statement.name}: {count} instances in the slice drawn{' (at ' + at + ')' if at else ''}, more than "
            f"{MAX_POINTS}: draw smaller sizes or fewer dims (plot_domain draws it aggregated)"
        )
    cells, sizes, label = _cells(sliced, statement.indices, axes, cell_hint or {})
    empty = np.zeros((0, len(statement.indices)), np.int64)
    bounds = tuple((sliced.dim_min_val(a).to_python(), sliced.dim_max_val(a).to_python()) for a in axes)
    return StatementPoints(
        statement.name,
        statement.indices,
        empty,
        np.zeros(0, bool),
        axes,
        slice_values,
        cells,
        sizes,
        count,
        label,
        bounds,
    )


def _box_size(domain: isl.Set) -> int:
    """The points of ``domain``'s bounding box (an upper bound of its points)."""
    size = 1
    for position in range(domain.dim(isl.dim_type.set)):
        size *= domain.dim_max_val(position).to_python() - domain.dim_min_val(position).to_python() + 1
    return size


def _cells(sliced: isl.Set, indices, axes, hint: dict) -> tuple[dict, tuple[int, ...], str]:
    """The instances of ``sliced`` counted per block of the ``axes``, the blocks' sizes, and
    what they are when ``hint`` (index -> block size) gave them."""
    ctx = sliced.get_ctx()
    sizes, ranges, hinted = [], [], []
    for axis in axes:
        low, high = sliced.dim_min_val(axis).to_python(), sliced.dim_max_val(axis).to_python()
        size = hint.get(indices[axis])
        if size is None or high // size - low // size + 1 > CELLS_PER_AXIS:
            size = max(1, -(-(high - low + 1) // CELLS_PER_AXIS))
        else:
            hinted.append(f"{indices[axis]}: {size}")
        sizes.append(size)
        ranges.append(range(low // size, high // size + 1))
    cells: dict = {}
    for block in np.ndindex(*(len(r) for r in ranges)):
        coordinates = tuple(r[b] for r, b in zip(ranges, block))
        part = sliced
        for axis, size, c in zip(axes, sizes, coordinates):
            part = part.lower_bound_val(isl.dim_type.set, axis, isl.Val.int_from_si(ctx, c * size))
            part = part.upper_bound_val(isl.dim_type.set, axis, isl.Val.int_from_si(ctx, (c + 1) * size - 1))
        count = part.count_val().to_python()
        if count:
            cells[coordinates] = count
    label = f"blocks of {', '.join(hinted)}: the gemm kernel's cache blocks" if hinted else ""
    return cells, tuple(sizes), label


def domain_points(domain: isl.Set) -> np.ndarray:
    """Every integer point of a bounded ``domain``, one row each."""
    points: list[list[int]] = []
    n = domain.dim(isl.dim_type.set)

    def add(point):
        if len(points) > MAX_POINTS:
            raise PolycError(f"more than {MAX_POINTS} points: draw smaller sizes")
        points.append([point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n)])

    domain.foreach_point(add)
    return np.array(points, dtype=np.int64).reshape(len(points), n)


def pairs(relation: isl.UnionMap):
    """(source statement, source point, sink statement, sink point) for every pair of a bounded
    relation."""
    maps: list[isl.Map] = []
    relation.foreach_map(maps.append)
    for relation_map in maps:
        n_in, n_out = relation_map.dim(isl.dim_type.in_), relation_map.dim(isl.dim_type.out)
        source = relation_map.get_tuple_name(isl.dim_type.in_)
        sink = relation_map.get_tuple_name(isl.dim_type.out)
        found: list = []
        relation_map.wrap().foreach_point(
            lambda p: found.append([p.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n_in + n_out)])
        )
        for values in found:
            yield source, tuple(values[:n_in]), sink, tuple(values[n_in:])


def _images(relation: isl.UnionMap, program, plotted) -> dict:
    """(statement, point) -> the value vector ``relation`` maps each shown instance to."""
    relation = relation.intersect_params(program.context)
    result = {}
    for statement in plotted:
        domain = program.statement(statement.name).domain
        for index, value in statement.fixed.items():  # (only the slice's instances)
            position = statement.indices.index(index)
            domain = domain.fix_val(isl.dim_type.set, position, isl.Val.int_from_si(domain.get_ctx(), int(value)))
        domain = isl.UnionSet.from_set(domain)
        restricted = relation.intersect_domain(domain.align_params(relation.get_space()))
        wanted = set(statement.shown_points())
        for source, a, _, b in pairs(restricted):
            if source == statement.name and a in wanted:
                result[(source, a)] = b
    return result


def schedule_order(schedule: isl.UnionMap, program, plotted) -> dict:
    """(statement, point) -> its position when ``schedule`` (instances -> time vectors) runs the
    shown instances in order."""
    times = _images(schedule, program, plotted)
    width = max((len(t) for t in times.values()), default=0)
    ordered = sorted(times, key=lambda key: times[key] + (0,) * (width - len(times[key])))
    return {key: rank for rank, key in enumerate(ordered)}


def _flat_gemm_dims(stages, names) -> dict | None:
    """Per statement drawn, its indices that are the gemm contraction's M and N groups (an
    epilogue's or initialisation's by position in the target), when a group has several indices
    or there are batch indices; None when there is nothing to flatten or a statement lacks them."""
    c = stages.contraction
    if len(c.m) == 1 and len(c.n) == 1 and len(c.k) == 1 and not c.batch:
        return None
    dims = {}
    for name in names:
        statement = stages.program.statement(name)
        if statement.kind != "init" and statement.source == c.statement:
            dims[name] = list(c.m + c.n)
        elif statement.source.target == c.target.tensor and len(statement.indices) == len(c.target.indices):
            own = dict(zip(c.target.indices, statement.indices))  # an epilogue's indices are the target's by position
            dims[name] = [own[i] for i in c.m + c.n]
        else:
            return None
    return dims


def _flatten(statement: StatementPoints, stages, dims) -> dict:
    """Draw ``statement`` (sliced to its M and N indices ``dims``) over the flattened M and N:
    its points become (M, N) row-major in each group, its indices the groups' names.  Returns
    each real point's flat one."""
    c = stages.contraction
    values = stages.program.size_values or {}
    extents = [c.extent(i).evaluate(values) for i in c.m + c.n]
    positions = [statement.indices.index(d) for d in dims]
    groups = (range(len(c.m)), range(len(c.m), len(c.m) + len(c.n)))
    flat_points = np.zeros((len(statement.points), 2), np.int64)
    for axis, group in enumerate(groups):
        for member in group:
            flat_points[:, axis] = flat_points[:, axis] * extents[member] + statement.points[:, positions[member]]
    mapping = {tuple(int(v) for v in real): (int(f[0]), int(f[1])) for real, f in zip(statement.points, flat_points)}
    statement.indices = (f"M=({', '.join(c.m)})", f"N=({', '.join(c.n)})")
    statement.points, statement.dims = flat_points, (0, 1)
    return mapping


def _gemm_cell_hint(stages) -> dict:
    """Index -> the gemm kernel's cache block along it (its M, N and K of one index each)."""
    blocks = gemm_path.cache_blocks(stages)
    c = stages.contraction
    if blocks is None or len(c.m) != 1 or len(c.n) != 1 or len(c.k) != 1:
        return {}
    return {c.m[0]: blocks["mc"], c.n[0]: blocks["nc"], c.k[0]: blocks["kc"]}


def _gemm_blocks(result: Instances, stages, flattened: bool = False) -> None:
    """Fill ``tile`` with the gemm kernel's cache blocks: an instance over the contraction's M and
    N indices (and K) is in block (m // MC, n // NC[, k // KC]), with the blocks its code
    generator recorded (:func:`polyc.paths.gemm.cache_blocks`); ``flattened``: the statements
    are drawn over the flattened M and N (:func:`_flatten`), blocked as the kernel blocks them."""
    blocks = gemm_path.cache_blocks(stages)
    c = stages.contraction
    if blocks is None:
        return
    if flattened:
        for statement in result.statements:
            for point in statement.shown_points():
                result.tile[(statement.name, point)] = (point[0] // blocks["mc"], point[1] // blocks["nc"])
        result.tile_sizes = (blocks["mc"], blocks["nc"])
        result.tile_label = (
            f"the gemm kernel's cache blocks of the flattened M x N: MC x NC = {blocks['mc']} x {blocks['nc']}, "
            f"for its {blocks['isa']} {blocks['mr']} x {blocks['nr']} register block; one colour each"
        )
        return
    if len(c.m) != 1 or len(c.n) != 1 or len(c.k) != 1:
        return
    sizes = {c.m[0]: blocks["mc"], c.n[0]: blocks["nc"], c.k[0]: blocks["kc"]}
    for statement in result.statements:
        axes = [(statement.indices.index(i), size) for i, size in sizes.items() if i in statement.indices]
        if len(axes) < 2:
            continue
        for point in statement.shown_points():
            result.tile[(statement.name, point)] = tuple(point[axis] // size for axis, size in axes)
    result.tile_sizes = (blocks["mc"], blocks["nc"], blocks["kc"])
    result.tile_label = (
        f"the gemm kernel's cache blocks of {c.m[0]} x {c.n[0]} (x {c.k[0]}): MC x NC (x KC) = "
        f"{blocks['mc']} x {blocks['nc']} (x {blocks['kc']}), for its {blocks['isa']} {blocks['mr']} x "
        f"{blocks['nr']} register block; one colour each"
    )


def _band_views(result: Instances, stages, program) -> None:
    """Fill ``tile`` from the outermost tiled band and ``parallel`` from the outermost parallel
    band over the shown statements.  A band's member maps are its loops before tiling; a tile
    coordinate is the loop value divided by the tile size, rounded down."""
    drawn = [s for s in result.statements if not s.aggregated]  # (an aggregated one has no tiles drawn)
    names = {s.name for s in drawn}
    decisions = [d for d in stages.decisions if names & set(d.statements) and d.member_maps]
    tiled = next((d for d in decisions if d.tile_sizes), None)
    if tiled is not None:
        values = _member_values(tiled, program, drawn)
        result.tile = {key: tuple(v // t for v, t in zip(vector, tiled.tile_sizes)) for key, vector in values.items()}
        result.tile_sizes = tuple(tiled.tile_sizes)
    parallel = next((d for d in decisions if d.parallel), None)
    if parallel is not None:
        values = _member_values(parallel, program, drawn, members=1)
        size = parallel.tile_sizes[0] if parallel.tile_sizes else 1
        result.parallel = {key: vector[0] // size for key, vector in values.items()}
        index = "/".join(sorted({i for i in parallel.member_indices[0].values()})) if parallel.member_indices else ""
        result.parallel_loop = (index or f"c{parallel.depth}") + (f" (tiles of {size})" if size > 1 else "")


def _member_values(decision, program, plotted, members=None) -> dict:
    maps = decision.member_maps[:members] if members else decision.member_maps
    per_member = [_images(m, program, plotted) for m in maps]
    keys = set(per_member[0]).intersection(*per_member[1:])
    return {key: tuple(m[key][0] for m in per_member) for key in keys}
