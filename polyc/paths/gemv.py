"""The matrix-vector path: a contraction with one output dimension besides the reduction
(:mod:`polyc.codegen.gemv`): its rows (or columns) shared among the threads, the reduction
inside each share."""

from __future__ import annotations

from polyc.codegen.gemv import generate_gemv
from polyc.paths.base import KernelPath, PathKernel, PathRequest, blas_contraction
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence


def recognise(request: PathRequest):
    contraction = blas_contraction(request)
    return contraction if contraction is not None and contraction.is_matvec else None


def generate(request: PathRequest, contraction) -> PathKernel:
    return PathKernel(generate_gemv(request.built_program, contraction, request.options), contraction=contraction)


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    lines = [
        f"{stages.contraction.describe()} is a matrix-vector product: polyc's matrix-vector kernel computes "
        "it, its rows (or columns) shared among the threads; the reduction runs inside each share",
    ]
    if decisions:
        isa = built_for(stages)
        lines.append(built_for_sentence(stages, decisions, isa))
        lanes = decisions["row_lanes"].get(isa or "", 0)
        vectors = f"vectors of {lanes} elements" if lanes else "omp simd loops"
        lines.append(
            f"loop order {decisions['order']}; rows: {decisions['rows_at_a_time']} rows at a time share the loads "
            f"of x, each row's dot product in {vectors}, summed from zero in blocks of {decisions['sum_block']} "
            f"columns; columns: y built {decisions['column_block']} columns at a time, held in L1 while A's rows "
            "stream past"
        )
        lines.append(
            threads_sentence(
                stages,
                decisions,
                decisions.get("multiply_adds"),
                "each thread owns an equal contiguous range of rows (or column blocks) of y, no synchronisation",
            )
        )
    lines.append("blas_contractions=False compiles it as a loop nest instead")
    return lines


PATH = KernelPath("gemv", ("c",), recognise, generate, explain, options=("blas_contractions", "parallel", "threads"))
