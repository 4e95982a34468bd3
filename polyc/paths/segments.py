"""The segments path: a def with contractions among other statements runs in segments
(:mod:`polyc.schedule.segments`), each compiled through the whole pipeline on its own path and
linked into one kernel (:mod:`polyc.codegen.link`)."""

from __future__ import annotations

from polyc.codegen.link import link_segments
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.explaining import decisions_of
from polyc.paths.generic import LoopNestTuning
from polyc.schedule.segments import plan_segments, split_sums, why_generic


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
    kernel = link_segments(
        definition.name, definition, [part.kernel for part in parts], size_arguments, plan_decisions(request, segments)
    )
    return PathKernel(kernel, segments=parts)


def plan_decisions(request: PathRequest, segments) -> dict:
    """How the def was cut: per segment its kind, its statements' text, its contraction and why
    its statements are not a BLIS kernel's (a generic segment's); the sums split into products."""
    definition = request.definition
    split = len(split_sums(definition)) - len(definition.statements)
    return {
        "kernel": "segments",
        "segments": tuple(
            {
                "kind": segment.kind,
                "statements": tuple(s.text.strip() for s in segment.definition.statements),
                "contraction": segment.contraction.describe() if segment.contraction is not None else None,
                "why_generic": tuple(why_generic(s, segment.definition) for s in segment.definition.statements)
                if segment.kind == "generic"
                else (),
            }
            for segment in segments
        ),
        "split_statements": split,
    }


def explain(stages) -> list[str]:
    """What the cut recorded: each segment's statements, the path that compiled it (from its own
    stages) and why the def was cut there."""
    decisions = decisions_of(stages)
    lines = [
        f"the def mixes contractions with other statements: it runs as {len(stages.segments)} segments in order, "
        "each compiled on its own path (TC runs statements in order, each to completion, so the segments compute "
        "the def; what is given up is fusion across their borders)"
    ]
    for number, (segment, part) in enumerate(zip(decisions.get("segments", ()), stages.segments)):
        statements = "; ".join(f"`{text}`" for text in segment["statements"])
        if segment["kind"] == "generic":
            reasons = sorted(set(segment["why_generic"]))
            why = f"no contraction worth a BLIS kernel ({'; '.join(reasons)})"
        else:
            what = "matrix-vector product" if segment["kind"] == "gemv" else "contraction"
            why = f"a {what} (the statements after it are its elementwise epilogues): {segment['contraction']}"
        lines.append(f"segment {number} ({part.path} path): {statements}: {why}")
    if decisions.get("split_statements"):
        lines.append(
            "a + reduction over a sum of products became one statement per product (the '(term k of n)' statements): "
            "each is a contraction; only the order of the additions changes"
        )
    return lines


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
