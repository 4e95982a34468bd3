"""The integer product path: a def that is one matrix product of 8-bit tensors (int8 or
uint8) summed in int32, with optional zero points subtracted, gets the BLIS-style integer
kernel of :mod:`polyc.codegen.integer_gemm` (byte dot products where the machine has them).

The canonical TC form (recognised by
:func:`polyc.schedule.integer_contraction.recognise_integer_gemm_def`; dimensions in any order,
batch dimensions allowed, either factor first)::

    def qmm(uint8(M, K) A, int8(K, N) B, uint8(1) ZA, int8(N) ZB) -> (Y) {
        Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA(0))) * (int32(B(r_k, n)) - int32(ZB(n)))
    }

``Y`` int32; each operand read under ``int32(..)``; each ``- zero point`` optional, a literal or
``int32(Z(..))`` with one value, one per row of A (subscripted by A's M indices) or one per
column of B (by B's N indices).  Statements after it that compute other tensors from the
product's points (a requantization, a dequantization, a bias) are its epilogues, applied to each
block of the sums as the kernel finishes it.  The result is exact (the int32 value of the sum, as numpy's
int64 product of the shifted operands gives wherever that fits in int32).  Anything else falls
through to the other paths; ``blas_contractions=False`` sends this form to the generic loop nest
too.
"""

from __future__ import annotations

from polyc.codegen.integer_gemm import generate_integer_gemm
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence
from polyc.schedule.integer_contraction import IntegerContraction, recognise_integer_gemm_def
from polyc.target import INTEGER_DOT_PRODUCT_SETS


def recognise(request: PathRequest) -> IntegerContraction | None:
    options = request.options
    if options.backend != "c" or not options.blas_contractions:
        return None
    return request.memo("integer_contraction", lambda: recognise_integer_gemm_def(request.definition))


def generate(request: PathRequest, contraction: IntegerContraction) -> PathKernel:
    return PathKernel(generate_integer_gemm(request.built_program, contraction, request.options))


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    lines = [
        f"{decisions.get('contraction', stages.program.definition.name)} is an integer matrix product: polyc's "
        "integer gemm kernel computes it exactly in int32 (packed panels, K in groups the byte dot product "
        "instructions take, blocks of rows taken by the threads as they go); zero points are applied afterwards "
        "through row and column sums taken while packing",
    ]
    if decisions.get("epilogues"):
        lines.append(
            "then, on each block of rows of the int32 sums once final, while it is in cache: "
            + "; ".join(decisions["epilogues"])
        )
    if decisions:
        isa = built_for(stages, INTEGER_DOT_PRODUCT_SETS)
        lines.append(built_for_sentence(stages, decisions, isa))
        blocks = [b for b in decisions["register_blocks"] if isa is None or b["isa"] == isa]
        for b in blocks:
            lines.append(
                f"register block ({b['isa']}): {b['mr']} x {b['nr']} int32 sums, K in groups of {b['group']}; "
                f"cache blocks MC={b['mc']}, KC={b['kc']} from polyc's cache model (a KC x NR sliver of B in half of "
                "L1, the MC x KC block of A in half of L2)"
            )
        lines.append(threads_sentence(stages, decisions, None, "blocks of rows taken by the threads as they go"))
    lines.append("blas_contractions=False compiles it as a loop nest instead")
    return lines


PATH = KernelPath(
    "integer_gemm",
    ("c",),
    recognise,
    generate,
    explain,
    options=("blas_contractions", "parallel", "threads"),
)
