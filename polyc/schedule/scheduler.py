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
    return constraints.compute_schedule()
