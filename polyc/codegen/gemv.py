"""C for matrix-vector products: ``y[M] (+)= scale * sum_K A[M, K] * x[K]`` (PolyBench's atax,
bicg, mvt, gemver, gesummv; any layout of A, see below).

A matrix-vector product reads every element of A once and does two flops with it, so it runs
at the speed of memory: what matters is streaming A contiguously on every core, with the
vector work done by SIMD instructions as A arrives.  Two loop orders do that, chosen per call
from the layout of A (its offset tables, as the gemm kernel tabulates them):

* **rows** (K contiguous in A, ``y = A x``): each row is a dot product with x; four rows at a
  time share the loads of x.  Each row's blocks of ``SUM_BLOCK`` columns are summed from zero
  (as accurate as numpy's pairwise sums, see :data:`polyc.codegen.c.SUM_BLOCK`) in a vector
  register (AVX-512, AVX2 or NEON intrinsics), the blocks' vectors added up, and the row's
  vector summed across its lanes once at the end; without a vector instruction set the
  blocks are ``omp simd`` reductions;
* **columns** (M contiguous in A, ``y = A^T x``): y is built a block of columns at a time, the
  block held in L1 while the rows of A stream past, four rows per pass over the block;
* anything else (not generated for today's recognised layouts, kept for safety) reads A and x
  through the offset tables, one element at a time.

Threads share out rows or column blocks in equal contiguous ranges (no synchronisation: each
owns its part of y).  The result is scaled by the product's scalar factors, written with ``=``
(``+=!``) or added (``+=``), and the epilogue statements run on each finished part of y.

The context record, tables, scale, epilogue and entry function are the gemm kernel's
(:class:`polyc.codegen.gemm._GemmWriter`), with an empty N group.
"""

from __future__ import annotations

from math import prod

from polyc.codegen.c import SUM_BLOCK
from polyc.codegen.c_expr import PRELUDE
from polyc.codegen.gemm import _COMMON, _NEON_SPELLINGS, _VECTOR_SPELLINGS, ISA_GUARDS, ISA_HEADERS, _GemmWriter
from polyc.codegen.pattern_kernel import DedicatedKernel, typed
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.options import Options
from polyc.schedule.contraction import Contraction

#: Below this many multiply-adds a product runs on one thread.
_PARALLEL_THRESHOLD = 1 << 16

#: The vector width of the rows order's dot products per instruction set (portable: ``omp simd``).
_ROW_VECTOR_BITS = {"avx512": 512, "avx2": 256, "neon": 128, "portable": 0}

#: Columns of y per block in the columns order (4 KiB of float, 8 KiB of double: held in L1).
GEMV_BLOCK = 1024


def generate_gemv(program: PolyProgram, contraction: Contraction, options: Options) -> DedicatedKernel:
    """The C translation unit computing ``program`` (one matrix-vector product and its epilogues)."""
    if not contraction.is_matvec:
        raise ValueError(f"{contraction.describe()} is not a matrix-vector product")
    return _GemvWriter(program, contraction, options).write()


class _GemvWriter(_GemmWriter):
    def write(self) -> DedicatedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [
            self.header(),
            PRELUDE,
            self.includes(),
            self.context_struct(),
            typed(_COMMON, self.ctype),
            self.epilogue_function(),
            self.scale_and_guard(),
            self.loops(),
            self.entry_function(name, sizes),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions`."""
        c, sizes = self.contraction, self.program.size_values
        work = None
        if sizes is not None:
            work = prod(c.extent(i).evaluate(sizes) for i in (*c.batch, *c.m, *c.k))
        vectors = self.options.vectorize and self.ctype in ("float", "double")
        itemsize = self.dtype.itemsize
        return {
            "kernel": "gemv",
            "contraction": c.describe(),
            "instruction_sets": tuple(ISA_GUARDS),
            "row_lanes": {isa: (bits // (8 * itemsize) if vectors else 0) for isa, bits in _ROW_VECTOR_BITS.items()},
            "rows_at_a_time": 4,
            "sum_block": SUM_BLOCK,
            "column_block": GEMV_BLOCK,
            "order": "chosen per call from the layout of A: rows when K is contiguous, columns when M is",
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
            "multiply_adds": work,
        }

    def header(self) -> str:
        return (
            super()
            .header()
            .replace("polyc gemm kernel", "polyc gemv kernel", 1)
            .replace("(BLIS structure: packing, cache blocks, register micro-kernel)", "(matrix-vector product)", 1)
        )

    def loops(self) -> str:
        loops = (
            typed(_GEMV_LOOPS, self.ctype)
            .replace("THRESHOLD", f"{float(_PARALLEL_THRESHOLD)!r}")
            .replace("POLYC_SUM_BLOCK SUM_BLOCK", f"POLYC_SUM_BLOCK {SUM_BLOCK}")
            .replace("POLYC_GEMV_BLOCK GEMV_BLOCK", f"POLYC_GEMV_BLOCK {GEMV_BLOCK}")
        )
        text = self.row_vectors() + loops
        if not self.options.vectorize:
            text = "\n".join(line for line in text.splitlines() if "#pragma omp simd" not in line)
        if not self.options.parallel:
            text = text.replace("#if defined(_OPENMP)", "#if 0")
        return text

    def row_vectors(self) -> str:
        """The vector operations of the rows loop, per instruction set (``POLYC_GV_LANES`` 0:
        none, the loop's portable form)."""
        if not self.options.vectorize or self.ctype not in ("float", "double"):
            return "#define POLYC_GV_LANES 0\n"
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            if isa in ISA_HEADERS:
                pieces.append(f"#include <{ISA_HEADERS[isa]}>")
            pieces.append(_row_vector_macros(isa, self.ctype))
        pieces.append("#endif")
        return "\n".join(pieces) + "\n"


def _row_vector_macros(isa: str, ctype: str) -> str:
    """``polyc_gv_t`` and its load, fma (a * b + c), add, zero and horizontal sum in ``isa``."""
    double = ctype == "double"
    itemsize = 8 if double else 4
    if isa in ("avx512", "avx2"):
        vec, pre, suffix = _VECTOR_SPELLINGS[(isa, itemsize)]
        lanes = (512 if isa == "avx512" else 256) // (8 * itemsize)
        if isa == "avx512":
            total = f"#define polyc_gv_sum(v) {pre}_reduce_add_{suffix}(v)"
        elif double:
            total = (
                "static inline double polyc_gv_sum(__m256d v)\n{\n"
                "    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));\n"
                "    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));\n}"
            )
        else:
            total = (
                "static inline float polyc_gv_sum(__m256 v)\n{\n"
                "    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));\n"
                "    s = _mm_add_ps(s, _mm_movehl_ps(s, s));\n"
                "    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));\n}"
            )
        return "\n".join(
            [
                f"#define POLYC_GV_LANES {lanes}",
                f"typedef {vec} polyc_gv_t;",
                f"#define polyc_gv_load(p) {pre}_loadu_{suffix}(p)",
                f"#define polyc_gv_fma(a, b, c) {pre}_fmadd_{suffix}(a, b, c)",
                f"#define polyc_gv_add(a, b) {pre}_add_{suffix}(a, b)",
                f"#define polyc_gv_zero() {pre}_setzero_{suffix}()",
                total,
            ]
        )
    if isa == "neon":
        vec, suffix = _NEON_SPELLINGS[itemsize]
        return "\n".join(
            [
                f"#define POLYC_GV_LANES {16 // itemsize}",
                f"typedef {vec} polyc_gv_t;",
                f"#define polyc_gv_load(p) vld1q_{suffix}(p)",
                f"#define polyc_gv_fma(a, b, c) vfmaq_{suffix}(c, a, b)",
                f"#define polyc_gv_add(a, b) vaddq_{suffix}(a, b)",
                f"#define polyc_gv_zero() vdupq_n_{suffix}(0)",
                f"#define polyc_gv_sum(v) vaddvq_{suffix}(v)",
            ]
        )
    return "#define POLYC_GV_LANES 0"


# Rows, columns and tables (see the module doc); T is the element type.
_GEMV_LOOPS = c_template("gemv_gemv_loops.c")
