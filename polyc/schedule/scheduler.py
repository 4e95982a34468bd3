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

import islpy as isl

from polyc.errors import PolycError
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram

#: The largest constant shift of a statement in a band that ``smart`` fusion keeps.  Fusing loops
#: by shifting one statement a few iterations is what stencils need; a shift by most of a loop's
#: extent (a layer norm's variance pass fused after its mean pass, 767 iterations later, which
#: isl finds once the sizes are literal numbers) buys no reuse, since every value is consumed
#: long after it was produced, and it costs the vector loop: the fused band then runs along
#: the rows, several times slower.  Such a schedule is computed again with the components apart, and
#: :mod:`polyc.schedule.outer_fusion` then fuses their outer loops.  (Bounding isl's constant
#: terms instead made its search take minutes on mobilenet_v2's unrolled depthwise convolutions.)
MAX_SHIFT = 16


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
    """An affine schedule tree for ``program`` respecting ``dependences``."""
    configure_fusion(program.ctx, fusion)
    every = dependences.all
    constraints = isl.ScheduleConstraints.on_domain(program.domain).set_context(program.context)
    constraints = constraints.set_validity(every).set_proximity(every).set_coincidence(every)
    schedule = constraints.compute_schedule()
    if fusion == "smart" and largest_shift(schedule) > MAX_SHIFT:
        configure_fusion(program.ctx, "min")
        schedule = constraints.compute_schedule()
        configure_fusion(program.ctx, fusion)
    return schedule


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
