"""The user's schedule (``polyc.define(..., schedule=...)``): the def's instances run in the order
the user gave, checked against the dependences by the driver (:mod:`polyc.schedule.user`), as
the loop nest of that schedule, marked for the CPU and printed as the generic path prints.

Its tree has one band of one member per time dimension, so
:func:`~polyc.schedule.transform.optimize_schedule` neither tiles nor reorders it; it marks a
loop parallel (or simd) only where the schedule carries no dependence at that loop, fuses
nothing, and leaves the dedicated kernels (gemm, convolutions, ...) aside: the user asked for
this loop order."""

from __future__ import annotations

from polyc.codegen.c import generate_c
from polyc.paths.base import KernelPath, PathKernel, PathRequest


def recognise(request: PathRequest):
    return True if request.options.schedule is not None else None


def generate(request: PathRequest, match) -> PathKernel:
    return PathKernel(generate_c(request.built_program, request.optimized_schedule(), request.options))


def explain(stages) -> list[str]:
    schedule = stages.options.schedule if stages.options is not None else None
    return [
        f"the schedule is the user's (schedule={schedule!r}): polyc checked it against every dependence "
        "and runs the loops in its order, without fusing, tiling or reordering them; a loop is parallel "
        "or vectorised only where the schedule carries no dependence at it"
    ]


PATH = KernelPath(
    "user_schedule",
    ("c",),
    recognise,
    generate,
    explain,
    runs_schedule_loops=True,
    sequential_loops=True,
    options=("schedule", "parallel", "vectorize", "unroll", "specialize", "threads"),
)
