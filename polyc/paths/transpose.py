"""The transpose path: a def that is one transposition (an input copied with its dimensions
permuted so that the innermost one moves) gets the tiled kernel of
:mod:`polyc.codegen.transpose`, whose loads and stores move whole vectors along rows."""

from __future__ import annotations

from polyc.codegen.transpose import TILE, generate_transpose, merged_dimensions
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.schedule.transposition import Transposition, recognise_transposition


def recognise(request: PathRequest) -> Transposition | None:
    options = request.options
    if options.backend != "c" or not options.transpose_kernels:
        return None
    return request.memo("transposition", lambda: recognise_transposition(request.definition))


def generate(request: PathRequest, transposition: Transposition) -> PathKernel:
    return PathKernel(generate_transpose(request.built_program, transposition, request.options))


def explain(stages) -> list[str]:
    transposition = recognise_transposition(stages.program.definition)
    assert transposition is not None, "explained only for a def this path compiled"
    groups, order = merged_dimensions(transposition.permutation)
    return [
        f"{transposition.describe()}: polyc's transpose kernel moves it in {TILE} x {TILE} tiles of "
        f"planes ({len(groups)} groups of dimensions that stay neighbours, in the order {order}), "
        "each tile transposed through vector registers and shared among the threads",
        "transpose_kernels=False compiles it as a loop nest instead",
    ]


PATH = KernelPath(
    "transpose", ("c",), recognise, generate, explain, options=("transpose_kernels", "parallel", "vectorize", "threads")
)
