"""The matrix-vector path: a contraction with one output dimension besides the reduction
(:mod:`polyc.codegen.gemv`): its rows (or columns) shared among the threads, the reduction
inside each share."""

from __future__ import annotations

from polyc.codegen.gemv import generate_gemv
from polyc.paths.base import KernelPath, PathKernel, PathRequest, blas_contraction


def recognise(request: PathRequest):
    contraction = blas_contraction(request)
    return contraction if contraction is not None and contraction.is_matvec else None


def generate(request: PathRequest, contraction) -> PathKernel:
    return PathKernel(generate_gemv(request.built_program, contraction, request.options), contraction=contraction)


def explain(stages) -> list[str]:
    return [
        f"{stages.contraction.describe()} is a matrix-vector product: polyc's matrix-vector kernel computes "
        "it, its rows (or columns) shared among the threads; the reduction runs inside each share",
        "blas_contractions=False compiles it as a loop nest instead",
    ]


PATH = KernelPath("gemv", ("c",), recognise, generate, explain, options=("blas_contractions", "parallel", "threads"))
