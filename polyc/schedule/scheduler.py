"""Affine scheduling with isl's ILP-based scheduler, steered by polyc's fusion strategies.

isl's scheduler (Pluto-style: it searches tiling hyperplanes band by band, minimising dependence
distances lexicographically with an ILP, and records which band members carry no dependence,
the *coincident* ones) is driven through ``ScheduleConstraints``:

- validity: every dependence (flow, anti, output, reductions included) must be respected;
- proximity: the same dependences should be short (locality), which is what fuses statements;
- coincidence: members that carry none of them are parallel.

The fusion strategy sets isl's clustering options:

- ``min``: every strongly connected component of the dependence graph is scheduled on its own
  (no fusion);
- ``smart``: components are fused where the fused band keeps its outer parallelism;
- ``max``: components are fused whenever some schedule allows it, even at the price of parallelism.
"""

from __future__ import annotations

from collections.abc import Sequence

import islpy as isl

from polyc.errors import PolycError
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram, PolyStatement
from polyc.schedule.isl_helpers import combine_all

#: The largest constant shift of a statement in a band that ``smart`` fusion keeps.  Fusing loops
#: by shifting one statement a few iterations is what stencils need; a shift by most of a loop's
#: extent (a layer norm's variance pass fused after its mean pass, 767 iterations later, which
#: isl finds once the sizes are literal numbers) buys no reuse, since every value is consumed
#: long after it was produced, and it costs the vector loop: the fused band then runs along
#: the rows, several times slower.  Such a schedule is computed again with the components apart, and
#: :mod:`polyc.schedule.outer_fusion` then fuses their outer loops.  (Bounding isl's constant
#: terms instead made its search take minutes on mobilenet_v2's unrolled depthwise convolutions.)
MAX_SHIFT = 16

#: The most statements of one weakly connected component of the dependence graph that isl's
#: scheduler is given in one problem.  Its clustering merges two clusters at a time and searches
#: the whole dependence graph for each merge, so its time grows with the cube of a component's
#: statement count.  A larger component is
#: scheduled in pieces of consecutive statements, one after the other (see
#: :func:`source_order_pieces`); :mod:`polyc.schedule.outer_fusion` then fuses the outer loops
#: the pieces share.  A def whose components are all at most this large is scheduled as one
#: problem, as before.
MAX_STATEMENTS_PER_PROBLEM = 200


def configure_fusion(ctx: isl.Context, fusion: str) -> None:
    """Set isl's scheduler options on ``ctx`` for a fusion strategy."""
    if fusion == "min":
        ctx.set_schedule_serialize_sccs(1)
        ctx.set_schedule_whole_component(0)
        ctx.set_schedule_maximize_coincidence(1)
    elif fusion == "smart":
        ctx.set_schedule_serialize_sccs(0)
        ctx.set_schedule_whole_component(0)
        ctx.set_schedule_maximize_coincidence(1)
    elif fusion == "max":
        ctx.set_schedule_serialize_sccs(0)
        ctx.set_schedule_whole_component(1)
        ctx.set_schedule_maximize_coincidence(0)
    else:
        raise PolycError(f"unknown fusion strategy {fusion!r}")
    ctx.set_schedule_treat_coalescing(1)  # prefer schedules whose inner loops follow the data
    ctx.set_schedule_outer_coincidence(0)


def compute_schedule(program: PolyProgram, dependences: Dependences, fusion: str = "smart") -> isl.Schedule:
    """An affine schedule tree for ``program`` respecting ``dependences``: isl's, computed as one
    problem unless a component of the dependence graph has more than
    :data:`MAX_STATEMENTS_PER_PROBLEM` statements.  Then the other components are scheduled
    together, each large one piece by piece (:func:`source_order_pieces`), the pieces of a
    component in sequence, the components in a set (they are independent)."""
    every = dependences.all
    maps: list[isl.Map] = []
    every.foreach_map(maps.append)
    components = weak_components(program.statements, maps)
    large = [c for c in components if len(c) > MAX_STATEMENTS_PER_PROBLEM]
    if not large:
        return _compute_schedule(program, program.statements, every, maps, fusion)
    parts = []
    small = [s for c in components if len(c) <= MAX_STATEMENTS_PER_PROBLEM for s in c]
    if small:
        parts.append(_compute_schedule(program, small, every, maps, fusion))
    for component in large:
        pieces = source_order_pieces(component, maps, MAX_STATEMENTS_PER_PROBLEM)
        sequence = combine_all(
            [_compute_schedule(program, piece, every, maps, fusion) for piece in pieces], isl.Schedule.sequence
        )
        assert sequence is not None  # (a component holds a statement)
        parts.append(sequence)
    result = combine_all(parts, isl.Schedule.set)
    assert result is not None
    return result


def weak_components(statements: Sequence[PolyStatement], maps: list[isl.Map]) -> list[list[PolyStatement]]:
    """``statements`` grouped by the weakly connected components of the dependence graph whose
    edges are ``maps``, each in source order, ordered by their first statements."""
    leader = {s.name: s.name for s in statements}

    def find(name: str) -> str:
        while leader[name] != name:
            leader[name] = leader[leader[name]]
            name = leader[name]
        return name

    for dependence in maps:
        source = find(dependence.get_tuple_name(isl.dim_type.in_))
        sink = find(dependence.get_tuple_name(isl.dim_type.out))
        leader[sink] = source
    groups: dict[str, list[PolyStatement]] = {}
    for s in statements:
        groups.setdefault(find(s.name), []).append(s)
    return list(groups.values())


def _compute_schedule(
    program: PolyProgram, statements: Sequence[PolyStatement], every: isl.UnionMap, maps: list[isl.Map], fusion: str
) -> isl.Schedule:
    """isl's schedule of ``statements`` under the dependences among them (``every``, whose maps
    are ``maps``)."""
    if len(statements) == len(program.statements):
        domain, dependences = program.domain, every
    else:
        names = {s.name for s in statements}
        pieces = [isl.UnionSet.from_set(s.domain) for s in statements]
        domain = combine_all(pieces, isl.UnionSet.union) or isl.UnionSet.empty(program.context.get_space())
        among = [
            isl.UnionMap.from_map(m)
            for m in maps
            if m.get_tuple_name(isl.dim_type.in_) in names and m.get_tuple_name(isl.dim_type.out) in names
        ]
        dependences = combine_all(among, isl.UnionMap.union) or isl.UnionMap.empty(every.get_space())
    configure_fusion(program.ctx, fusion)
    constraints = isl.ScheduleConstraints.on_domain(domain).set_context(program.context)
    constraints = constraints.set_validity(dependences).set_proximity(dependences).set_coincidence(dependences)
    schedule = constraints.compute_schedule()
    if fusion == "smart" and largest_shift(schedule) > MAX_SHIFT:
        configure_fusion(program.ctx, "min")
        schedule = constraints.compute_schedule()
        configure_fusion(program.ctx, fusion)
    return schedule


def source_order_pieces(
    statements: Sequence[PolyStatement], maps: list[isl.Map], size: int
) -> list[Sequence[PolyStatement]]:
    """``statements`` (in source order) in runs of consecutive ones, each of ``size`` statements
    or a few more, such that every dependence (of ``maps``) between two runs goes from an
    earlier run to a later one: running the runs one after the other is then valid.  A run is
    cut only where no dependence goes back across the cut (one does between the statements of a
    sequential loop, from a step's last statements to the next step's first), and only where
    its statements are connected by the dependences among them: isl schedules the parts of an
    unconnected run apart, in a set (a reduction's initialisation cut off from the reduction),
    which the outer-loop fusion does not fuse with the runs beside it."""
    position = {s.name: number for number, s in enumerate(statements)}
    # crossings[b] > 0 from a dependence's sink to before its source: it goes back across cut b.
    crossings = [0] * (len(statements) + 1)
    earlier_partners: list[list[int]] = [[] for _ in statements]
    for dependence in maps:
        source = position.get(dependence.get_tuple_name(isl.dim_type.in_))
        sink = position.get(dependence.get_tuple_name(isl.dim_type.out))
        if source is None or sink is None or source == sink:
            continue
        if sink < source:
            crossings[sink] += 1
            crossings[source] -= 1
        earlier_partners[max(source, sink)].append(min(source, sink))
    pieces, start, crossing = [], 0, 0
    leader: dict[int, int] = {}
    components = 0

    def find(statement: int) -> int:
        while leader[statement] != statement:
            leader[statement] = leader[leader[statement]]
            statement = leader[statement]
        return statement

    for cut in range(len(statements) - 1):
        leader[cut] = cut
        components += 1
        for partner in earlier_partners[cut]:
            if partner >= start and find(partner) != find(cut):
                leader[find(partner)] = find(cut)
                components -= 1
        crossing += crossings[cut]
        if crossing == 0 and components == 1 and cut + 1 - start >= size:
            pieces.append(statements[start : cut + 1])
            start, components = cut + 1, 0
    pieces.append(statements[start:])
    return pieces


def largest_shift(schedule: isl.Schedule) -> int:
    """The largest absolute constant term of a statement's piece of a band member that moves
    with the statement's indices.  A constant piece only places a statement whose domain is one
    point along the member, such as the edge row of an unrolled stencil, and is not counted in a
    band with a parallel member; in a band of reduction loops alone it is (a full reduction's
    scalar result read by a statement placed at the last iteration, 3071 iterations on: the
    band then holds a statement other than the reduction, and its loop is not vectorised)."""
    largest, nodes = 0, [schedule.get_root()]
    while nodes:
        node = nodes.pop()
        if node.get_type() == isl.schedule_node_type.band:
            partial = node.band_get_partial_schedule()
            members = partial.dim(isl.dim_type.out)
            parallel = any(node.band_member_get_coincident(member) for member in range(members))
            for member in range(members):
                pieces = partial.get_at(member).get_pw_aff_list()
                for position in range(pieces.n_pw_aff()):
                    for _, aff in pieces.get_at(position).get_pieces():
                        if not aff.is_cst() or not parallel:
                            largest = max(largest, abs(aff.get_constant_val().to_python()))
        nodes += [node.child(position) for position in range(node.n_children())]
    return largest
