"""The segments path: a def with contractions among other statements runs in segments
(:mod:`polyc.schedule.segments`), each compiled through the whole pipeline on its own path and
linked into one kernel (:mod:`polyc.codegen.link`)."""

from __future__ import annotations

from polyc.codegen.link import link_segments
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.generic import LoopNestTuning
from polyc.schedule.segments import plan_segments


def recognise(request: PathRequest):
    options = request.options
    if options.backend != "c" or not options.blas_contractions:
        return None
    return plan_segments(request.definition)


def generate(request: PathRequest, segments) -> PathKernel:
    definition, program = request.definition, request.built_program
    assert request.compile_part is not None, "a def is compiled in segments only with a way to compile each"
    parts = tuple(request.compile_part(segment.definition) for segment in segments)
    size_arguments = () if program.size_values is not None else tuple(definition.sizes)
    kernel = link_segments(definition.name, definition, [part.kernel for part in parts], size_arguments)
    return PathKernel(kernel, segments=parts)


def explain(stages) -> list[str]:
    return [
        f"the def mixes contractions with other statements: it runs as {len(stages.segments)} segments in "
        "order, each compiled on its own path"
    ]


# The tuner searches the loop-nest knobs of the whole def (they apply to its generic segments).
PATH = KernelPath(
    "segments",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=LoopNestTuning(),
    options=("blas_contractions",),
    compiles_parts=True,
    sequential_loops=True,
)
