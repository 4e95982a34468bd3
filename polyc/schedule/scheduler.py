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

#: The largest constant shift isl may give a statement in a band.  Fusing loops by shifting one
#: statement a few iterations is what stencils need; a shift by most of a loop's extent (a
#: layer norm's variance pass fused after its mean pass, 767 iterations later, which isl finds
#: once the sizes are literal numbers) buys no reuse, since every value is consumed long after
#: it was produced, and it costs the vector loop: the fused band then runs along the rows.
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
    ctx.set_schedule_max_constant_term(MAX_SHIFT)


def compute_schedule(program: PolyProgram, dependences: Dependences, fusion: str = "smart") -> isl.Schedule:
    """An affine schedule tree for ``program`` respecting ``dependences``."""
    configure_fusion(program.ctx, fusion)
    every = dependences.all
    constraints = isl.ScheduleConstraints.on_domain(program.domain).set_context(program.context)
    constraints = constraints.set_validity(every).set_proximity(every).set_coincidence(every)
    return constraints.compute_schedule()
