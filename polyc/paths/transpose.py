"""The transpose path: a def that is one transposition (an input copied with its dimensions
permuted so that the innermost one moves) gets the tiled kernel of
:mod:`polyc.codegen.transpose`, whose loads and stores move whole vectors along rows."""

from __future__ import annotations

from polyc.codegen.transpose import generate_transpose
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of
from polyc.schedule.transposition import Transposition, recognise_transposition
from polyc.target import INSTRUCTION_SETS


def recognise(request: PathRequest) -> Transposition | None:
    options = request.options
    if options.backend != "c" or not options.transpose_kernels:
        return None
    return request.memo("transposition", lambda: recognise_transposition(request.definition))


def generate(request: PathRequest, transposition: Transposition) -> PathKernel:
    return PathKernel(generate_transpose(request.built_program, transposition, request.options))


def explain(stages) -> list[str]:
    """What the transpose kernel's writer recorded: the merged dimensions, each plane's rows and
    columns, the tiles, the register transpose the build runs, and how the threads share it."""
    decisions = decisions_of(stages)
    if not decisions:
        return [
            "polyc's transpose kernel moves it in square tiles",
            "transpose_kernels=False compiles it as a loop nest instead",
        ]

    def dims(group) -> str:
        return (
            "dimension " + str(group[0]) if len(group) == 1 else "dimensions " + ", ".join(map(str, group)) + " merged"
        )

    groups = " x ".join("(" + ", ".join(map(str, g)) + ")" for g in decisions["groups"])
    tile = decisions["tile"]
    extents = dict(zip(decisions["groups"], decisions["extents"]))
    rows, columns = extents[decisions["rows"]], extents[decisions["columns"]]
    size = f" of {rows} x {columns}" if rows is not None and columns is not None else ""
    planes = decisions["planes"]
    lines = [
        f"{decisions['transposition']}: polyc's transpose kernel moves it plane by plane; the input's dimensions "
        f"merged where they stay neighbours in the output: {groups}, in the order {decisions['order']} in the output",
        f"each plane{size}: its rows are the input's {dims(decisions['rows'])} (the output's innermost), its columns "
        f"the input's {dims(decisions['columns'])} (the input's innermost); "
        + (
            f"{planes} plane(s), one per value of the other dimensions"
            if planes is not None
            else "one plane per value of the other dimensions"
        )
        + f"; cut into tiles of {tile} x {tile} elements"
        + (f", {decisions['tiles']} tiles in all" if decisions["tiles"] is not None else ""),
    ]
    sets = {name: INSTRUCTION_SETS[name] for name in decisions["instruction_sets"] if name in INSTRUCTION_SETS}
    isa = built_for(stages, sets)
    lines.append(built_for_sentence(stages, decisions, isa))
    bytes_ = decisions["element_bytes"]
    for name, block in decisions["register_blocks"].items():
        if isa is not None and name != isa:
            continue
        lines.append(
            f"inside a tile ({name}): blocks of {block} x {block} elements of {bytes_} bytes transposed in vector "
            "registers, each load and store a whole vector along a row; the blocks at the tile's edges one element "
            "at a time"
            if block is not None
            else f"inside a tile ({name}): one element at a time, along the output's rows (no register transpose "
            f"of {bytes_}-byte elements on {name})"
        )
    options = stages.options
    if options is None or not decisions["parallel"]:
        lines.append("threads: one (parallel=False)")
    else:
        threshold = decisions["parallel_threshold"]
        moved = None if planes is None or rows is None or columns is None else planes * rows * columns
        if moved is not None and moved < threshold:
            lines.append(f"threads: one: {moved} elements moved are fewer than {threshold}")
        else:
            count = f"up to {options.threads} threads" if options.threads else "the OpenMP threads"
            lines.append(
                (
                    f"threads: {moved} elements moved, at least {threshold}: "
                    if moved is not None
                    else f"threads: in a call of at least {threshold} elements, "
                )
                + f"{count} share the tiles of all planes in equal runs (schedule(static))"
            )
    lines.append("transpose_kernels=False compiles it as a loop nest instead")
    return lines


PATH = KernelPath(
    "transpose", ("c",), recognise, generate, explain, options=("transpose_kernels", "parallel", "vectorize", "threads")
)
