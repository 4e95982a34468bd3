"""C for tensor contractions in the structure of BLIS: packing, cache blocking, a register
micro-kernel for the host's vector instructions.

For a :class:`~polyc.schedule.contraction.Contraction` ``C[b, M, N] (+)= A[b, M, K] * B[b, K, N]``
(each of b, M, N, K a group of indices, flattened; any dimension order in any tensor) this
module prints one translation unit whose function has the same signature as the generic
back end's (:mod:`polyc.codegen.c`)::

    for each batch point                       (OpenMP over batches when there are enough)
      for jc in N by NC                        (B panel: KC x NC, lives in L3)
        for pc in K by KC
          pack B[pc:pc+KC, jc:jc+NC] into NR-wide slivers        (threads share the work)
          for ic in M by MC                    (this thread's rows; A panel: MC x KC in L2)
            pack A[ic:ic+MC, pc:pc+KC] into MR-tall slivers
            for jr in NC by NR                 (one B sliver: KC x NR)
              for ir in MC by MR               (one A sliver: MR x KC in L1)
                micro-kernel: MR x NR block of C in vector registers, += over KC,
                then C = block (first KC block of a `+=!`: beta 0) or C += block (beta 1);
                after the last KC block, the epilogue statements on the finished block.

Packing is the statements of :mod:`polyc.schedule.packing` (PackA/PadA, PackB/PadB), proved
right by isl for every register block before it is printed.  Their loops are printed from
isl's AST, twice per operand: for any sliver (a gather through the offset tables, zeros past
the edge) and for a whole sliver whose source is contiguous (a copy).  One special case is
written by hand: on AVX-512, a float B stored transposed is packed by 16 x 16 register
transposes.

Packing is skipped where it buys nothing: a B sliver already laid out like a packed one
(columns contiguous, rows NR apart, as in Kronecker steps), or used by few rows of A, is read in
place; so is an A block with evenly spaced rows that at most two B slivers use (narrow products
such as batched small matrices), or whose rows are contiguous along K (register blocks of two or
more vectors per row).

Addresses are never assumed: for every flat index of a group the kernel tabulates its offset
in each tensor (``a_m[m]``, ``c_n[n]``, ...), so permuted and multi-index groups need no
transposition.  Packing and the write-back take the contiguous fast path where a sliver's
offsets step by one (checked per sliver, ``polyc_contiguous``), and a gather/scatter path
elsewhere.  Partial MR x NR blocks at the edges are computed in full from zero-padded packed
slivers and written back under masks (or element by element): nothing outside the tensors is
read or written.

Register blocks.  The instruction set is chosen by the C preprocessor, so one source serves
every machine: AVX-512 (``__AVX512F__``), AVX2 with FMA, NEON on AArch64 (``__aarch64__`` and
``__ARM_NEON``, as in the ``neon`` export target), or portable C with ``#pragma omp simd``
(``vectorize=False`` selects the portable code everywhere).  Each instruction set has a few
MR x NR shapes (:func:`micro_kernel_shapes`: for AVX-512 float 6 x 64, 8 x 32 and 8 x 16; for
NEON float 8 x 12, 8 x 8 and 8 x 4) and the kernel picks one per call from N and the contiguous
run length of N in C, so that narrow products (N of 16 or 32, or N made of short contiguous
runs) do not compute on padding.
Block sizes come from :func:`polyc.schedule.tiling.cache_sizes` (:func:`block_sizes`: the machine's
caches, or the ``cache_sizes`` option's, as in exports for another machine);
the ``gemm_blocks`` option ``(MC, NC, KC)`` overrides them (rounded to multiples of MR and NR).

Threads: with ``parallel=True`` (and enough work), whole products are shared out when there
are at least two per thread, else the blocks of rows of each product (or, for short and wide
products, its column slivers).  Threads take batches, row blocks and B slivers from shared
tickets as they go and wait at a barrier that yields the processor, so a thread held up by a
busy machine delays the others by one block.  On a machine crowded by other processes, whole
products and products shared by columns (no barrier) run instead on polyc's thread pool
(:mod:`polyc.runtime.pool`), whose calls never wait for a thread that has not started.  The
packing buffers are one block of memory the kernel keeps from call to call
(:data:`polyc.codegen.pattern_kernel.KEPT_WORKSPACE_C`).  The function returns 0, or 2 when
memory for the buffers could not be allocated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyc.codegen.c import GeneratedKernel, aff_c, c_comment, plain_ast_c
from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_type
from polyc.codegen.pattern_kernel import PatternKernelWriter, typed
from polyc.errors import PolycError
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.schedule import packing, tiling
from polyc.schedule.contraction import Contraction
from polyc.target import INSTRUCTION_SETS, isa_guards

#: The return value when packing buffers or offset tables cannot be allocated.
STATUS_OUT_OF_MEMORY = 2

#: Below this many multiply-adds a contraction runs on one thread (a parallel region costs more).
_PARALLEL_THRESHOLD = 96 * 96 * 96

#: Offset tables at least this long are filled by all threads.
_PARALLEL_TABLE = 1 << 16


# ----------------------------------------------------------------------------- register blocks
@dataclass(frozen=True)
class MicroKernelShape:
    """An MR x NR register block: MR rows of ``vectors`` vectors of ``lanes`` elements.

    ``efficiency`` is the fraction of the FMA peak the shape reaches on full blocks, relative
    to the widest shape of its instruction set; the kernel weighs it against the padding a
    shape would compute on (see ``polyc_gemm_run_best`` in the generated C).
    """

    isa: str
    mr: int
    lanes: int
    vectors: int
    efficiency: float = 1.0

    @property
    def nr(self) -> int:
        return self.lanes * self.vectors

    @property
    def name(self) -> str:
        return f"{self.mr}x{self.nr}"


#: The C preprocessor condition of each instruction set, best first (portable: the rest).
ISA_GUARDS = isa_guards(("avx512", "avx2", "neon"), "POLYC_GEMM_PORTABLE")

#: The header declaring each instruction set's intrinsics.
ISA_HEADERS = {name: isa.header for name, isa in INSTRUCTION_SETS.items() if isa.header is not None}


def micro_kernel_shapes(isa: str, dtype: np.dtype) -> tuple[MicroKernelShape, ...]:
    """The register blocks of one instruction set for ``dtype``, widest first.

    AVX-512 has 32 vector registers: 6 x 4 vectors (24 accumulators, 4 loads of B and 6
    broadcasts of A per step), 8 x 2 and 8 x 1.  AVX2 has 16: 6 x 2 and 8 x 1.  At most 8 rows,
    so that an A read in place needs no more row pointers than there are general registers.

    NEON (AArch64) has 32 registers of 128 bits, and its multiply-add takes one operand as a
    lane of a register, so a packed column of A costs MR / lanes vector loads, not MR
    broadcasts.  float: 8 x 3 vectors (8 x 12: 24 accumulators + 3 of B + 2 of A = 29
    registers, 5 loads per 24 multiply-adds), 8 x 8 and 8 x 4 for narrow N.  double (2 lanes):
    6 x 4 vectors (6 x 8: 24 + 4 of B + 3 of A = 31 registers), 8 x 4 and 8 x 2.  The
    efficiencies of the narrow shapes are estimates from their ratio of loads to multiply-adds,
    as for AVX-512.
    """
    lanes_512 = 64 // np.dtype(dtype).itemsize  # 16 float, 8 double
    if isa == "avx512":
        return (
            MicroKernelShape(isa, 6, lanes_512, 4),
            MicroKernelShape(isa, 8, lanes_512, 2, 0.93),
            MicroKernelShape(isa, 8, lanes_512, 1, 0.85),
        )
    if isa == "avx2":
        return (MicroKernelShape(isa, 6, lanes_512 // 2, 2), MicroKernelShape(isa, 8, lanes_512 // 2, 1, 0.85))
    if isa == "neon":
        lanes_128 = lanes_512 // 4  # 4 float, 2 double
        if lanes_128 == 4:
            return (
                MicroKernelShape(isa, 8, lanes_128, 3),
                MicroKernelShape(isa, 8, lanes_128, 2, 0.93),
                MicroKernelShape(isa, 8, lanes_128, 1, 0.85),
            )
        return (
            MicroKernelShape(isa, 6, lanes_128, 4),
            MicroKernelShape(isa, 8, lanes_128, 2, 0.93),
            MicroKernelShape(isa, 8, lanes_128, 1, 0.85),
        )
    return (MicroKernelShape(isa, 4, lanes_512 // 2, 2),)


def block_sizes(
    shape: MicroKernelShape, itemsize: int, gemm_blocks: tuple[int, int, int] | None, caches: dict[int, int]
) -> tuple[int, int, int]:
    """(MC, NC, KC) for a register block: ``gemm_blocks`` when given, else from the cache model: the A sliver (MR x KC) takes a quarter of L1, the A
    panel (MC x KC) a quarter of L2 (the B sliver streams through the rest), and the B panel
    (KC x NC) half of L3, at most 4096 columns.  Long KC blocks amortise the write-back of C.

    AVX2's blocks take three eighths of L1 and of L2 instead.  Their multiply-adds are half
    as wide, so the block asks for half the bytes per cycle that AVX-512's does (6 x 16 float:
    88 bytes per 12 multiply-adds), which L2 feeds when the slivers spill out of L1, and the
    longer KC saves a pass over C per block (sgemm, tmm and PolyBench's gemm before and after:
    ``benchmarks/results/zen3_before_avx2_blocks.json`` and ``zen3_contraction_polybench.json``)."""
    mr, nr = shape.mr, shape.nr
    if gemm_blocks is not None:
        mc, nc, kc = gemm_blocks
    else:
        l1, l2, l3 = caches.get(1, 32 * 1024), caches.get(2, 1 << 20), caches.get(3, 8 << 20)
        share = 3 / 8 if shape.isa == "avx2" else 1 / 4
        kc = max(64, int(l1 * share) // (mr * itemsize) // 16 * 16)
        mc = int(l2 * share) // (kc * itemsize)
        nc = min(4096, (l3 // 2) // (kc * itemsize))
    mc = max(mr, mc // mr * mr)
    nc = max(nr, nc // nr * nr)
    return mc, nc, max(1, kc)


def generate_gemm(program: PolyProgram, contraction: Contraction, options: Options) -> GeneratedKernel:
    """The C translation unit computing ``program`` (one contraction and its epilogues)."""
    return _GemmWriter(program, contraction, options).write()


def packing_programs(
    program: PolyProgram, contraction: Contraction, options: Options
) -> tuple[packing.PackingProgram, ...]:
    """The packing statements of the register blocks :func:`generate_gemm` prints for
    ``program`` (every instruction set's), as polyhedral programs of one cache block."""
    writer = _GemmWriter(program, contraction, options)
    blocks = sorted({(s.mr, s.nr) for isa in ISA_GUARDS for s in writer.shapes_for(isa)})
    return tuple(packing.checked_packing_program(mr, nr) for mr, nr in blocks)


# ----------------------------------------------------------------------------- the writer
class _GemmWriter(PatternKernelWriter):
    def __init__(self, program: PolyProgram, contraction: Contraction, options: Options):
        super().__init__(program, options)
        self.contraction = contraction
        self.dtype = contraction.dtype
        self.ctype = c_type(self.dtype)

    def write(self) -> GeneratedKernel:
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
            self.instruction_sets(),
            typed(_RUN, self.ctype),
            self.entry_function(name, sizes),
            "",
        ]
        return GeneratedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes)

    def header(self) -> str:
        o = self.options
        sizes = self.sizes_comment()
        lines = [
            f"polyc gemm kernel for def '{self.definition.name}' (BLIS structure: packing, "
            f"cache blocks, register micro-kernel)",
            f"sizes: {sizes}",
            f"options: gemm_blocks={o.gemm_blocks} parallel={o.parallel} vectorize={o.vectorize} "
            f"specialize={o.specialize}",
            f"contraction: {self.contraction.describe()}",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def includes(self) -> str:
        return self.preamble("POLYC_GEMM_PORTABLE", ["#include <sched.h>"])

    # ------------------------------------------------------------------ the context record
    def epilogue_tensors(self) -> list[str]:
        return self.tensors_of_epilogues(self.contraction.target.tensor, self.contraction.epilogues)

    def multi_index_groups(self) -> list[tuple[str, ...]]:
        """Groups of several indices whose values the epilogue needs (from tables)."""
        c = self.contraction
        return [g for g in (c.batch, c.m, c.n) if len(g) > 1] if c.epilogues else []

    def context_struct(self) -> str:
        t = self.ctype
        fields = [
            f"const {t} *a",
            f"const {t} *b",
            f"{t} *c",
            f"{t} scale",
            "int64_t m, n, k, nbatch",
            "const int64_t *a_m, *a_k, *b_k, *b_n, *c_m, *c_n, *a_batch, *b_batch, *c_batch",
            "int64_t a_m_stride, a_k_stride, b_k_stride, b_n_stride, c_n_run",
            f"int64_t key[{self.key_length()}]",
        ]
        for name in self.epilogue_tensors():
            tensor = self.definition.tensor(name)
            qualifier = "const " if tensor.role is ir.Role.INPUT else ""
            fields.append(f"{qualifier}{c_type(tensor.dtype)} *t_{name}")
        if self.needs_sizes():
            fields += [f"int64_t s_{self.size_c[s]}" for s in self.definition.sizes]
        for group in self.multi_index_groups():
            fields += [f"const int64_t *ix_{index}" for index in group]
        body = "\n".join(f"    {f};" for f in fields)
        return (
            "/* Everything the loops need: operands, flattened extents, for each flat index of a group\n"
            "   its offset in each tensor (a_m[m]: offset in A of row m, ...); a_m_stride: s when\n"
            "   a_m[m] == m*s for every m, else -1 (so for a_k, b_k, b_n); c_n_run: how many offsets\n"
            "   of c_n from 0 on step by one. */\n"
            f"typedef struct {{\n{body}\n}} polyc_gemm_t;"
        )

    # ------------------------------------------------------------------ register blocks
    def shapes_for(self, isa: str) -> tuple[MicroKernelShape, ...]:
        """The register blocks to generate for ``isa``: the one the ``micro_kernel`` option
        names; else all of them for a parametric kernel (the choice is made per call), the best
        alone when the sizes are known, which saves the C compiler most of its work."""
        shapes = micro_kernel_shapes(isa, self.dtype)
        if self.options.micro_kernel is not None:
            return (shapes[min(self.options.micro_kernel, len(shapes)) - 1],)
        if not self.specialised or len(shapes) == 1:
            return shapes
        c, sizes = self.contraction, self.program.size_values
        m = int(np.prod([c.extent(i).evaluate(sizes) for i in c.m]))
        n_extents = [c.extent(i).evaluate(sizes) for i in c.n]
        n = int(np.prod(n_extents))
        if m == 0 or n == 0:
            return shapes[:1]
        # Offsets of the N group's flat indices in C, as the kernel tabulates them (c_n).
        shape_c = [extent.evaluate(sizes) for extent in self.definition.tensor(c.target.tensor).shape]
        strides = {index: int(np.prod(shape_c[d + 1 :])) for d, index in enumerate(c.target.indices)}
        offsets = np.zeros(1, dtype=np.int64)
        for index, extent in zip(c.n, n_extents):
            offsets = (offsets[:, None] + np.arange(extent, dtype=np.int64) * strides[index]).ravel()
        steps = np.flatnonzero(offsets != offsets[0] + np.arange(n))
        run = int(steps[0]) if steps.size else n
        best, choice = -1.0, shapes[0]
        for shape in shapes:  # as polyc_gemm_run_best: a later shape must score 2% better
            score = _shape_score(shape, m, n, run)
            if score > best * 1.02:
                best, choice = score, shape
        return (choice,)

    def instruction_sets(self) -> str:
        """Per instruction set, under its preprocessor guard: every register block's packing,
        micro-kernel and loops, and the choice among them."""
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            if isa in ISA_HEADERS:
                pieces.append(f"#include <{ISA_HEADERS[isa]}>")
            if isa in _TRANSPOSES and self.dtype.itemsize == 4:
                pieces += [_TRANSPOSE8_REGISTERS, _TRANSPOSES[isa]]
            pieces.append(_rows_along_k_packing(isa, self.dtype))
            pieces.append(f'#define POLYC_GEMM_ISA "{isa}"')
            shapes = self.shapes_for(isa)
            for shape in shapes:
                pieces += [_MICRO_KERNELS[isa](shape, self.dtype), self.blocked_loops(shape)]
            pieces.append(_shape_choice(shapes))
        pieces.append("#endif")
        return "\n".join(pieces)

    def blocked_loops(self, shape: MicroKernelShape) -> str:
        caches = tiling.cache_sizes(self.options)
        mc, nc, kc = block_sizes(shape, self.dtype.itemsize, self.options.gemm_blocks, caches)
        text = typed(_BLOCKED_LOOPS, self.ctype).replace("TRANSPOSED_B\n", _transposed_b(shape, self.dtype))
        text = text.replace("PACK_SLIVERS\n", typed(_pack_sliver_functions(shape), self.ctype))
        text = text.replace("ROWS_ALONG_K_A", _rows_along_k_a(shape, self.dtype))
        kc_fixed = self.options.gemm_blocks is not None
        l2 = caches.get(2, 1 << 20)
        values = {
            "MR": shape.mr,
            "NR": shape.nr,
            "MC": mc,
            "NC": nc,
            "KC": kc,
            "KC_FIXED": int(kc_fixed),
            "L1_BYTES": caches.get(1, 32 * 1024),
            "L2_BYTES": l2,
            "WIDE_BLOCK": int(shape.vectors >= 2 and shape.isa != "avx2"),
            "PACK_RUN": max(1, 256 // (shape.nr * self.dtype.itemsize)),
        }
        # In the code only: the comments keep the names ("the longest KC block", not "the longest 256 block").
        pieces = re.split(r"(/\*.*?\*/)", text, flags=re.S)
        names = re.compile(r"\b(" + "|".join(values) + r")\b")
        text = "".join(
            piece if piece.startswith("/*") else names.sub(lambda m: str(values[m.group(1)]), piece) for piece in pieces
        )
        text = (
            f"/* Register block {shape.name}: MR = {shape.mr}, NR = {shape.nr}; cache blocks MC = {mc}, "
            f"NC = {nc}, KC = {kc}{' (given)' if kc_fixed else ''}. */\n" + text
        )
        text = text.replace("_SHAPE", f"_{shape.name}").replace("MASKED_B", "1" if shape.isa == "avx512" else "0")
        if not self.options.parallel:
            text = re.sub(r"#if defined\(_OPENMP\)\n.*?#endif\n", "", text, flags=re.DOTALL)
        return text.replace("STATUS", str(STATUS_OUT_OF_MEMORY)).replace("THRESHOLD", f"{float(_PARALLEL_THRESHOLD)!r}")

    def needs_sizes(self) -> bool:
        """Whether the loops read the sizes from the context (epilogue or guard, parametric)."""
        return bool(self.contraction.epilogues or self.contraction.guard) and not self.specialised

    # ------------------------------------------------------------------ scale and guard
    def scale_value(self) -> str:
        """C of the product of the contraction's scalar factors (1 without any)."""
        c = self.contraction
        if not c.scale:
            return "1"
        printer = CExpressionPrinter(
            access=lambda read, subscripts: f"{read.tensor}[0]",
            index=lambda n: n,
            size=lambda value: value.to_c(lambda n: self.size_c[n]),
        )
        return " * ".join(f"({printer.to_c(factor)})" for factor in c.scale)

    def scale_and_guard(self) -> str:
        """POLYC_SCALED (packing multiplies A by the scale), and with a guard the functions
        telling where it holds: ``polyc_guard_cover`` of a block (0 nowhere, 1 in part, 2
        everywhere) and ``polyc_guarded_write`` of a partly guarded block."""
        c = self.contraction
        lines = [
            f"#define POLYC_HAS_SCALE {1 if c.scale else 0}",
            "#define POLYC_SCALED(x) (POLYC_HAS_SCALE ? g->scale * (x) : (x))",
            f"#define POLYC_HAS_GUARD {1 if c.guard else 0}",
        ]
        if not c.guard:
            return "\n".join(
                lines
                + [
                    "static int polyc_guard_cover(const polyc_gemm_t *g, int64_t bt, int64_t m0, int64_t mr, int64_t n0,",
                    "                             int64_t nr) { (void)g; (void)bt; (void)m0; (void)mr; (void)n0; (void)nr; return 2; }",
                    f"static void polyc_guarded_write(const polyc_gemm_t *g, int64_t bt, const {self.ctype} *block, int64_t stride,",
                    f"                                {self.ctype} *c, int64_t m0, int64_t mr, int64_t n0, int64_t nr, int beta)",
                    "{ (void)g; (void)bt; (void)block; (void)stride; (void)c; (void)m0; (void)mr; (void)n0; (void)nr; (void)beta; }",
                ]
            )
        sizes = self.size_declarations(lambda s: f"g->s_{self.size_c[s]}")
        group_of = {i: "bt" for i in c.batch} | {i: "m" for i in c.m} | {i: "n" for i in c.n}

        def value(expression: Affine, corner: str) -> str:
            """The expression at the block's corner minimising ("lo") or maximising ("hi") it."""
            bound = {}
            for index in expression.names() & set(group_of):
                positive = expression.coefficient(index) > 0
                low_end = positive == (corner == "lo")
                group = group_of[index]
                bound[index] = Affine.var(
                    "bt" if group == "bt" else f"{group}0" if low_end else f"({group}0 + {group}r - 1)"
                )
            return expression.substitute(bound).to_c(lambda n: self.size_c.get(n, n))

        everywhere = " && ".join(f"({value(e, 'lo')}) >= 0" for e in c.guard)
        nowhere = " || ".join(f"({value(e, 'hi')}) < 0" for e in c.guard)
        element = {"bt": "bt", "m": "(m0 + i)", "n": "(n0 + j)"}
        holds = " && ".join(
            f"({e.to_c(lambda n: element[group_of[n]] if n in group_of else self.size_c[n])}) >= 0" for e in c.guard
        )
        body = "\n".join("    " + line for line in sizes)
        return (
            "\n".join(lines)
            + f"""
/* The guard on the block of rows m0 .. m0+mr-1 and columns n0 .. n0+nr-1 of product bt: 2 when
   it holds everywhere, 0 nowhere, else 1 (each affine condition at the block's extreme corners). */
static int polyc_guard_cover(const polyc_gemm_t *g, int64_t bt, int64_t m0, int64_t mr, int64_t n0, int64_t nr)
{{
{body}
    (void)g; (void)bt; (void)m0; (void)mr; (void)n0; (void)nr;
    if ({everywhere}) return 2;
    if ({nowhere}) return 0;
    return 1;
}}

/* Adds block (NULL: zeros; row stride `stride`) to C where the guard holds; elsewhere adds
   nothing, but the first KC block of a `+=!` (beta 0) writes zero. */
static void polyc_guarded_write(const polyc_gemm_t *g, int64_t bt, const {self.ctype} *block, int64_t stride,
                                {self.ctype} *c, int64_t m0, int64_t mr, int64_t n0, int64_t nr, int beta)
{{
{body}
    (void)bt;
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {{
            {self.ctype} *p = c + g->c_m[m0 + i] + g->c_n[n0 + j];
            const {self.ctype} v = (block != NULL && {holds}) ? block[i * stride + j] : 0;
            if (!beta) *p = v;
            else if (block != NULL) *p = *p + v;
        }}
}}"""
        )

    # ------------------------------------------------------------------ epilogue
    def epilogue_function(self) -> str:
        c = self.contraction
        if not c.epilogues:
            return (
                "#define POLYC_HAS_EPILOGUE 0\n"
                "static void polyc_epilogue(const polyc_gemm_t *g, int64_t bt, int64_t m0, int64_t mr,\n"
                "                           int64_t n0, int64_t nr)\n"
                "{ (void)g; (void)bt; (void)m0; (void)mr; (void)n0; (void)nr; }"
            )
        body = self.size_declarations(lambda s: f"polyc_g->s_{self.size_c[s]}")
        for name in self.epilogue_tensors():
            tensor = self.definition.tensor(name)
            qualifier = "const " if tensor.role is ir.Role.INPUT else ""
            body.append(f"{qualifier}{c_type(tensor.dtype)} *restrict {name} = polyc_g->t_{name};")

        def values(group: tuple[str, ...], flat: str) -> list[str]:
            if len(group) == 1:
                return [f"const int64_t polyc_ix_{group[0]} = {flat};"]
            return [f"const int64_t polyc_ix_{i} = polyc_g->ix_{i}[{flat}];" for i in group]

        body += values(c.batch, "polyc_bt") if c.batch else ["(void)polyc_bt;"]
        statements = [self.epilogue_assignment(statement, c.target.indices) + ";" for statement in c.epilogues]
        simd = ["#pragma omp simd"] if self.options.vectorize else []
        body += [
            "for (int64_t polyc_mi = polyc_m0; polyc_mi < polyc_m0 + polyc_mr; polyc_mi++) {",
            *("    " + line for line in values(c.m, "polyc_mi")),
        ]
        if len(c.n) <= 1:  # (none: a matrix-vector product's, called with polyc_nj 0)
            body += [
                *("    " + line for line in simd),
                "    for (int64_t polyc_nj = polyc_n0; polyc_nj < polyc_n0 + polyc_nr; polyc_nj++) {",
                *("        " + line for line in values(c.n, "polyc_nj") + statements),
                "    }",
            ]
        else:
            # Several N indices (a product by blocked weights, (.., N / NR, NR)): runs of the
            # block along which only the last index moves, that index affine in polyc_nj, so
            # that the accesses are vectors; read from the tables per element, it made them
            # gathers (slower on BERT's 128 x 3072 product with its bias and GELU).
            last = c.n[-1]
            body += [
                "    for (int64_t polyc_run = polyc_n0; polyc_run < polyc_n0 + polyc_nr; ) {",
                f"        const int64_t polyc_first = polyc_g->ix_{last}[polyc_run];",
                "        const int64_t polyc_stop = polyc_min(polyc_n0 + polyc_nr, polyc_run + "
                f"({self.size_expr(c.extent(last))}) - polyc_first);",
                *(f"        const int64_t polyc_ix_{i} = polyc_g->ix_{i}[polyc_run];" for i in c.n[:-1]),
                *("        " + line for line in simd),
                "        for (int64_t polyc_nj = polyc_run; polyc_nj < polyc_stop; polyc_nj++) {",
                f"            const int64_t polyc_ix_{last} = polyc_first + (polyc_nj - polyc_run);",
                *("            " + line for line in statements),
                "        }",
                "        polyc_run = polyc_stop;",
                "    }",
            ]
        body.append("}")
        return (
            "#define POLYC_HAS_EPILOGUE 1\n"
            "/* The statements after the contraction, on one finished block of the target. */\n"
            "static void polyc_epilogue(const polyc_gemm_t *polyc_g, int64_t polyc_bt, int64_t polyc_m0,\n"
            "                           int64_t polyc_mr, int64_t polyc_n0, int64_t polyc_nr)\n{\n"
            + "\n".join("    " + line for line in body)
            + "\n}"
        )

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        d, c = self.definition, self.contraction
        arguments = []
        for t in d.tensors:
            qualified = f"const {c_type(t.dtype)}" if t.role is ir.Role.INPUT else c_type(t.dtype)
            arguments.append(f"{qualified} *__restrict__ {t.name}")  # as the generic back end: C++ reads it
        arguments += [f"int64_t {self.size_c[s]}" for s in sizes]
        body = self.size_declarations(lambda s: None)

        def product(group: tuple[str, ...]) -> str:
            return " * ".join(f"({self.size_expr(c.extent(i))})" for i in group) or "1"

        groups = {"batch": c.batch, "m": c.m, "n": c.n, "k": c.k}
        tables = {
            "batch": ("a_batch", "b_batch", "c_batch"),
            "m": ("a_m", "c_m"),
            "n": ("b_n", "c_n"),
            "k": ("a_k", "b_k"),
        }
        operand_of = {"a": c.a, "b": c.b, "c": c.target}
        for group in groups:
            body.append(f"const int64_t polyc_{group} = {product(groups[group])};")
        body.append("if (polyc_batch == 0 || polyc_m == 0 || polyc_n == 0) return 0;")
        # One allocation holds every table: offsets, runs, index values for the epilogue.  The
        # tables depend on the sizes only, so they are kept for later calls (kept_tables):
        # built on every call, they were a visible share of a short product (a 1 x 1
        # convolution of mobilenet_v2, 196 x 576 x 96); kept, they cost next to nothing.
        layout = [(table, group) for group in groups for table in tables[group]]
        layout += [
            (f"ix_{index}", group)
            for group in ("batch", "m", "n")
            for index in groups[group]
            if groups[group] in self.multi_index_groups()
        ]
        total = " + ".join(f"polyc_{group}" for _, group in layout)
        build = [
            f"polyc_tables = (int64_t *)malloc(sizeof(int64_t) * (size_t)({total}));",
            f"if (polyc_tables == NULL) return {STATUS_OUT_OF_MEMORY};",
            "int64_t *polyc_next = polyc_tables;",
        ]
        for table, group in layout:
            build += [f"int64_t *polyc_{table} = polyc_next;", f"polyc_next += polyc_{group};"]
        for group, indices in groups.items():
            build += self.fill_tables(group, indices, tables[group], operand_of)
        build.append("polyc_g.m = polyc_m; polyc_g.n = polyc_n; polyc_g.k = polyc_k; polyc_g.nbatch = polyc_batch;")
        build += [f"polyc_g.{table} = polyc_{table};" for table, _ in layout]
        build += [
            f"polyc_g.{table}_stride = {self.group_stride(groups[group], operand_of[table[0]])};"
            for table, group in (("a_m", "m"), ("a_k", "k"), ("b_k", "k"), ("b_n", "n"))
        ]
        build.append("polyc_g.c_n_run = polyc_run_length(polyc_c_n, polyc_n);")
        body += self.kept_tables("polyc_gemm_t", build)
        body.append(f"polyc_g.a = {c.a.tensor}; polyc_g.b = {c.b.tensor}; polyc_g.c = {c.target.tensor};")
        for tensor in self.epilogue_tensors():
            body.append(f"polyc_g.t_{tensor} = {tensor};")
        if self.needs_sizes():
            body += [f"polyc_g.s_{self.size_c[s]} = {self.size_c[s]};" for s in d.sizes]
        body.append(f"polyc_g.scale = {self.scale_value()};")
        body += [
            f"const int polyc_status = polyc_gemm_run(&polyc_g, {1 if c.init else 0});",
            "free(polyc_tables);",
            "return polyc_status;",
        ]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    def group_stride(self, indices: tuple[str, ...], operand) -> str:
        """C of the stride of a group's flat index in one operand, -1 when its offsets are not
        a multiple of the flat index (what a scan of the group's table would find,
        from the extents and strides without reading the table)."""
        if not indices:
            return "0"
        extents = ", ".join(f"({self.size_expr(self.contraction.extent(index))})" for index in indices)
        strides = ", ".join(self.stride(operand.tensor, operand.indices.index(index)) for index in indices)
        return f"polyc_group_stride({len(indices)}, (const int64_t[]){{{extents}}}, (const int64_t[]){{{strides}}})"

    def fill_tables(self, group: str, indices: tuple[str, ...], tables: tuple[str, ...], operand_of) -> list[str]:
        """C filling the offset tables of one group (and its index value tables): a loop nest
        over the group's indices, outermost first, at flat index ``polyc_f``.  Long tables (a
        Kronecker step's 262144 rows) are filled by all threads: serial, the fill took a fifth
        of the call."""
        c = self.contraction
        if not indices:
            return [f"polyc_{table}[0] = 0;" for table in tables]
        lines = ["{"]
        if self.options.parallel:
            lines.append(f"    #pragma omp parallel for schedule(static) if (polyc_{group} >= {_PARALLEL_TABLE})")
        flat = "0"
        for depth, index in enumerate(indices):
            extent = self.size_expr(c.extent(index))
            lines.append(
                "    " * (depth + 1) + f"for (int64_t polyc_v_{index} = 0; polyc_v_{index} < ({extent}); "
                f"polyc_v_{index}++) {{"
            )
            flat = f"polyc_v_{index}" if depth == 0 else f"({flat}) * ({extent}) + polyc_v_{index}"
        inner = "    " * (len(indices) + 1)
        lines.append(f"{inner}const int64_t polyc_f = {flat};")
        for table in tables:
            operand = operand_of[table[0]]
            terms = [
                f"polyc_v_{index} * {self.stride(operand.tensor, operand.indices.index(index))}" for index in indices
            ]
            lines.append(f"{inner}polyc_{table}[polyc_f] = {' + '.join(terms)};")
        if len(indices) > 1 and indices in self.multi_index_groups():
            lines += [f"{inner}polyc_ix_{index}[polyc_f] = polyc_v_{index};" for index in indices]
        lines += ["    " * (depth + 1) + "}" for depth in reversed(range(len(indices)))]
        lines.append("}")
        return lines


# ----------------------------------------------------------------------------- micro-kernels
_VECTOR_SPELLINGS = {
    # isa, element size -> vector type, intrinsic prefix, suffix
    ("avx512", 4): ("__m512", "_mm512", "ps"),
    ("avx512", 8): ("__m512d", "_mm512", "pd"),
    ("avx2", 4): ("__m256", "_mm256", "ps"),
    ("avx2", 8): ("__m256d", "_mm256", "pd"),
}


#: element size -> NEON vector type, intrinsic suffix
_NEON_SPELLINGS = {4: ("float32x4_t", "f32"), 8: ("float64x2_t", "f64")}


def _vector_micro_kernel(shape: MicroKernelShape, dtype: np.dtype) -> str:
    """An MR x NR micro-kernel in AVX-512 or AVX2 intrinsics, unrolled over the register block.

    Element (i, k) of A is ``ap[i * a_rs + k * a_cs]`` (packed: a_rs = 1, a_cs = MR; or A
    itself), row k of B is ``bp + k * b_rs`` (packed: b_rs = NR; or B itself), so the loops can
    skip packing where it buys nothing.  Rows i >= mr read row 0 (their results are dropped);
    AVX-512 loads B under the column mask, so B itself may end after nr columns (AVX2 reads
    full rows: its callers pass B itself only for full slivers).  The block accumulates in
    MR x ``vectors`` registers; the write-back uses masked vector loads and stores per row when
    the block's columns are contiguous in C (``unit``), else a buffer and ``polyc_scatter``.
    """
    ctype = c_type(dtype)
    vec, pre, suffix = _VECTOR_SPELLINGS[(shape.isa, np.dtype(dtype).itemsize)]
    mr, nr, nv, lanes = shape.mr, shape.nr, shape.vectors, shape.lanes
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [
        f"/* {mr} x {nr} block: C[c_m[i] + c_n[j]] (+)= sum over k < kc of A(i, k) * B(k, j). */",
        f"static inline void polyc_kernel_{shape.name}(int64_t kc, const {ctype} *restrict ap, int64_t a_rows,",
        f"    int64_t a_rs, int64_t a_cs, const {ctype} *restrict bp, int64_t b_rs, int b_full,",
        f"    {ctype} *restrict c, const int64_t *restrict c_m, const int64_t *restrict c_n, int64_t mr,",
        "    int64_t nr, int beta, int unit)",
        "{",
    ]
    lines += [
        f"    const {ctype} *restrict a{i} = ap + {'0' if i == 0 else f'(a_rows > {i} ? {i} * a_rs : 0)'};"
        for i in range(mr)
    ]
    if shape.isa == "avx512":
        mask_type = "__mmask16" if lanes == 16 else "__mmask8"
        lines += [
            f"    const {mask_type} k{v} = ({mask_type})polyc_lane_mask(nr - {v * lanes}, {lanes});" for v in range(nv)
        ]
        # Masked loads cost more than plain ones in the inner loop: only partial slivers of B use them.
        loads_b = {
            "b_full": f"{pre}_loadu_{suffix}(bp + {{offset}})",
            None: f"{pre}_maskz_loadu_{suffix}(k{{v}}, bp + {{offset}})",
        }
        load = f"{pre}_maskz_loadu_{suffix}(k{{v}}, row + {{offset}})"
        store = f"{pre}_mask_storeu_{suffix}(row + {{offset}}, k{{v}}, {{value}});"
    else:
        bits = 32 if lanes == 8 else 64
        set1 = "_mm256_set1_epi32((int)" if bits == 32 else "_mm256_set1_epi64x((long long)"
        iota = f"_mm256_setr_epi32({', '.join(map(str, range(8)))})" if bits == 32 else "_mm256_setr_epi64x(0, 1, 2, 3)"
        lines += [
            f"    const __m256i k{v} = _mm256_cmpgt_epi{bits}("
            f"{set1}polyc_max(0, polyc_min({lanes}, nr - {v * lanes}))), {iota});"
            for v in range(nv)
        ]
        lines.append("    (void)b_full;")
        loads_b = {None: f"{pre}_loadu_{suffix}(bp + {{offset}})"}
        load = f"{pre}_maskload_{suffix}(row + {{offset}}, k{{v}})"
        store = f"{pre}_maskstore_{suffix}(row + {{offset}}, k{{v}}, {{value}});"
    for row in acc:
        lines.append(f"    {vec} " + ", ".join(f"{name} = {pre}_setzero_{suffix}()" for name in row) + ";")
    # The block of C is read after the loop (beta 1): start fetching its rows now, every cache
    # line of them (a 6 x 64 float block's rows are four lines: fetching only the first and the
    # last left two misses per row at the write-back, measured with ``python -m benchmarks
    # --filter sgemm``).  Not when it is only written: that would read the target from memory
    # for nothing.
    lines += [
        "    if (unit && beta)",
        "        for (int64_t i = 0; i < mr; i++) {",
        f"            for (int64_t j = 0; j < nr; j += {64 // np.dtype(dtype).itemsize})",
        "                _mm_prefetch((const char *)(c + c_n[0] + c_m[i] + j), _MM_HINT_T0);",
        "            _mm_prefetch((const char *)(c + c_n[0] + c_m[i] + nr - 1), _MM_HINT_T0);",
        "        }",
    ]

    # The k loop for the first `rows` rows.  A block of fewer than MR rows (the last of a
    # product whose M is not a multiple of MR) computes only those: with M = 128 and MR = 6 the
    # last block would spend two thirds of its multiply-adds on dropped rows, 3% of the whole.
    def k_loop(rows: int, indent: str) -> list[str]:
        loop = []
        for condition, load_b in loads_b.items():
            inner = indent if len(loads_b) == 1 else indent + "    "
            if len(loads_b) > 1:
                loop.append(f"{indent}{'if (b_full) {' if condition else '} else {'}")
            loop += [
                f"{inner}for (int64_t k = 0, ka = 0; k < kc; k++, ka += a_cs, bp += b_rs) {{",
                f"{inner}    const {vec} "
                + ", ".join(f"b{v} = {load_b.format(v=v, offset=v * lanes)}" for v in range(nv))
                + ";",
                f"{inner}    {vec} a;",
            ]
            for i in range(rows):
                fmas = " ".join(f"{acc[i][v]} = {pre}_fmadd_{suffix}(a, b{v}, {acc[i][v]});" for v in range(nv))
                loop.append(f"{inner}    a = {pre}_set1_{suffix}(a{i}[ka]); {fmas}")
            loop.append(f"{inner}}}")
        if len(loads_b) > 1:
            loop.append(f"{indent}}}")
        return loop

    lines.append(f"    switch (mr < {mr} ? mr : {mr}) {{")
    for rows in range(mr, 0, -1):
        lines += [f"    {'default' if rows == mr else f'case {rows}'}: {{"] + k_loop(rows, "        ")
        lines += ["        break;", "    }"]
    lines.append("    }")
    # Full-width rows use plain loads and stores: masked ones are slower, and a masked store of
    # a whole cache line may not spare the processor reading the line first.
    full_load, full_store = (
        f"{pre}_loadu_{suffix}(row + {{offset}})",
        f"{pre}_storeu_{suffix}(row + {{offset}}, {{value}});",
    )
    lines += ["    if (unit) {", f"        {ctype} *restrict base = c + c_n[0];"]
    for width, (row_load, row_store) in (("nr == NR", (full_load, full_store)), ("else", (load, store))):
        lines.append(f"        if (nr == {nr}) {{" if width != "else" else "        } else {")
        for i in range(mr):
            guard = "" if i == 0 else f"if (mr > {i}) "
            body = [f"{ctype} *restrict row = base + c_m[{i}];"]
            body += [
                f"if (beta) {acc[i][v]} = {pre}_add_{suffix}({row_load.format(v=v, offset=v * lanes)}, {acc[i][v]});"
                for v in range(nv)
            ]
            body += [row_store.format(v=v, offset=v * lanes, value=acc[i][v]) for v in range(nv)]
            lines.append(f"            {guard}{{ " + " ".join(body) + " }")
    lines += ["        }", "    } else {", f"        {ctype} block[{mr * nr}] __attribute__((aligned(64)));"]
    for i in range(mr):
        lines.append(
            "        "
            + " ".join(f"{pre}_store_{suffix}(block + {i * nr + v * lanes}, {acc[i][v]});" for v in range(nv))
        )
    lines += [f"        polyc_scatter(block, {nr}, c, c_m, c_n, mr, nr, beta);", "    }", "}"]
    return "\n".join(lines)


def _neon_micro_kernel(shape: MicroKernelShape, dtype: np.dtype) -> str:
    """An MR x NR micro-kernel in arm_neon.h intrinsics (AArch64), unrolled over the register
    block; called like the AVX kernels (:func:`_vector_micro_kernel`).

    When a column of A is MR consecutive values (packed A, or A itself stored with M innermost)
    and all MR rows are real, it is loaded as MR / lanes vectors and each row's multiply-add
    takes its element as a lane operand (``fmla v.4s, v.4s, v.s[i]``); else each element of A
    is loaded alone (rows i >= a_rows read row 0, their results are dropped).  B rows are read
    in full: without masked loads, the loops pass B itself only for full slivers (as for AVX2).
    A block whose NR columns are all there and contiguous in C (``unit``) is updated with
    vector loads and stores; edge blocks and scattered columns go through a buffer and
    ``polyc_scatter``, so nothing outside C is touched.
    """
    ctype = c_type(dtype)
    vec, suffix = _NEON_SPELLINGS[np.dtype(dtype).itemsize]
    mr, nr, nv, lanes = shape.mr, shape.nr, shape.vectors, shape.lanes
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [
        f"/* {mr} x {nr} block: C[c_m[i] + c_n[j]] (+)= sum over k < kc of A(i, k) * B(k, j). */",
        f"static inline void polyc_kernel_{shape.name}(int64_t kc, const {ctype} *restrict ap, int64_t a_rows,",
        f"    int64_t a_rs, int64_t a_cs, const {ctype} *restrict bp, int64_t b_rs, int b_full,",
        f"    {ctype} *restrict c, const int64_t *restrict c_m, const int64_t *restrict c_n, int64_t mr,",
        "    int64_t nr, int beta, int unit)",
        "{",
        "    (void)b_full;",
    ]
    for row in acc:
        lines.append(f"    {vec} " + ", ".join(f"{name} = vdupq_n_{suffix}(0)" for name in row) + ";")
    # The block of C is read after the loop (beta 1): start fetching its rows now.  Not when it
    # is only written: that would read the target from memory for nothing.
    lines += [
        "    if (unit && beta)",
        "        for (int64_t i = 0; i < mr; i++) {",
        "            __builtin_prefetch(c + c_n[0] + c_m[i]);",
        "            __builtin_prefetch(c + c_n[0] + c_m[i] + nr - 1);",
        "        }",
    ]
    load_b = f"const {vec} " + ", ".join(f"b{v} = vld1q_{suffix}(bp + {v * lanes})" for v in range(nv)) + ";"
    # A's column as vectors, each row's element a lane of one of them.
    lines += [
        f"    if (a_rs == 1 && a_rows == {mr}) {{",
        "        for (int64_t k = 0, ka = 0; k < kc; k++, ka += a_cs, bp += b_rs) {",
        f"            {load_b}",
        f"            const {vec} "
        + ", ".join(f"av{x} = vld1q_{suffix}(ap + ka + {x * lanes})" for x in range(mr // lanes))
        + ";",
    ]
    for i in range(mr):
        lines.append(
            "            "
            + " ".join(
                f"{acc[i][v]} = vfmaq_laneq_{suffix}({acc[i][v]}, b{v}, av{i // lanes}, {i % lanes});"
                for v in range(nv)
            )
        )
    lines += ["        }", "    } else {"]
    # A element by element, from row pointers (A read in place with rows apart, or a partial block).
    lines += [
        f"        const {ctype} *restrict a{i} = ap + {'0' if i == 0 else f'(a_rows > {i} ? {i} * a_rs : 0)'};"
        for i in range(mr)
    ]
    lines += ["        for (int64_t k = 0, ka = 0; k < kc; k++, ka += a_cs, bp += b_rs) {", f"            {load_b}"]
    for i in range(mr):
        lines.append(
            f"            {{ const {ctype} a = a{i}[ka]; "
            + " ".join(f"{acc[i][v]} = vfmaq_n_{suffix}({acc[i][v]}, b{v}, a);" for v in range(nv))
            + " }"
        )
    lines += ["        }", "    }"]
    lines += [f"    if (unit && nr == {nr}) {{", f"        {ctype} *restrict base = c + c_n[0];"]
    for i in range(mr):
        guard = "" if i == 0 else f"if (mr > {i}) "
        body = [f"{ctype} *restrict row = base + c_m[{i}];"]
        body += [
            f"if (beta) {acc[i][v]} = vaddq_{suffix}(vld1q_{suffix}(row + {v * lanes}), {acc[i][v]});"
            for v in range(nv)
        ]
        body += [f"vst1q_{suffix}(row + {v * lanes}, {acc[i][v]});" for v in range(nv)]
        lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    lines += ["    } else {", f"        {ctype} block[{mr * nr}] __attribute__((aligned(16)));"]
    for i in range(mr):
        lines.append(
            "        " + " ".join(f"vst1q_{suffix}(block + {i * nr + v * lanes}, {acc[i][v]});" for v in range(nv))
        )
    lines += [f"        polyc_scatter(block, {nr}, c, c_m, c_n, mr, nr, beta);", "    }", "}"]
    return "\n".join(lines)


def _portable_micro_kernel(shape: MicroKernelShape, dtype: np.dtype) -> str:
    ctype = c_type(dtype)
    text = typed(
        r"""
/* MR x NR block in portable C (A and B addressed as in the vector kernels, B rows read in
   full); the compiler vectorises the inner loop. */
static inline void polyc_kernel_SHAPE(int64_t kc, const T *restrict ap, int64_t a_rows, int64_t a_rs,
    int64_t a_cs, const T *restrict bp, int64_t b_rs, int b_full, T *restrict c, const int64_t *restrict c_m,
    const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta, int unit)
{
    (void)unit; (void)a_rows; (void)b_full;
    T block[MR * NR] __attribute__((aligned(64)));
    for (int64_t x = 0; x < MR * NR; x++) block[x] = 0;
    for (int64_t k = 0; k < kc; k++, bp += b_rs)
        for (int64_t i = 0; i < mr; i++) {
            const T a = ap[i * a_rs + k * a_cs];
            #pragma omp simd
            for (int64_t j = 0; j < NR; j++)
                block[i * NR + j] += a * bp[j];
        }
    polyc_scatter(block, NR, c, c_m, c_n, mr, nr, beta);
}""",
        ctype,
    )
    return re.sub(r"\bMR\b", str(shape.mr), re.sub(r"\bNR\b", str(shape.nr), text)).replace("SHAPE", shape.name)


#: The writer of each instruction set's micro-kernel (shape, dtype) -> C.
_MICRO_KERNELS = {
    "avx512": _vector_micro_kernel,
    "avx2": _vector_micro_kernel,
    "neon": _neon_micro_kernel,
    "portable": _portable_micro_kernel,
}


def _transposed_b(shape: MicroKernelShape, dtype: np.dtype) -> str:
    """Packing of a float sliver of B stored transposed (columns evenly spaced, K contiguous,
    as in ``A * B^T``) by register transposes: 16 x 16 blocks on AVX-512, 8 x 8 on AVX2.
    Element by element the packing costs a large share of a 128 x 1024 x 1024 product on AVX2;
    by blocks, a fraction of that (the ``tmm`` case of ``python -m benchmarks --filter tmm``).
    The blocks go down K first, so each group of `block` columns of B is read as that many
    sequential streams: across K first, every step started the NR columns' rows over (NR
    streams, a row of B apart), and the transposed product took longer than the plain one;
    down K first it takes the plain product's time."""
    block = {"avx512": 16, "avx2": 8}.get(shape.isa)
    if block is None or np.dtype(dtype).itemsize != 4:
        return ""
    return f"""    if (cols == NR && g->b_n_stride > 0 && g->b_k_stride == 1) {{  /* B transposed: in {block} x {block} blocks */
        const int64_t whole = kc - kc % {block};
        for (int64_t v = 0; v < NR; v += {block})
            for (int64_t k = 0; k < whole; k += {block})
                polyc_transpose{block}(b + b_n[v] + pc + k, g->b_n_stride, dst + k * NR + v, NR);
        for (int64_t k = whole; k < kc; k++)
            for (int64_t j = 0; j < NR; j++)
                dst[k * NR + j] = b[b_n[j] + pc + k];
        return;
    }}
"""


def _rows_along_k_a(shape: MicroKernelShape, dtype: np.dtype) -> str:
    """The branch of A's packing for an A whose rows run along K (row-major A, as in ``A * B``
    and the MLP layer): :func:`_rows_along_k_packing`.  Element by element through the offset
    tables, each value costs two lookups: on AVX2, which packs A (see ``direct_a``), that was a
    third of the micro-kernel's time in the 128 x 2000 x 128 MLP layer, and a quarter in
    PolyBench's doitgen (double)."""
    if shape.isa in _TRANSPOSES and np.dtype(dtype).itemsize == 4 and shape.mr > 8:  # one 8 x 8 transpose
        raise PolycError(f"internal: the float packing of A's rows takes at most 8 rows, not {shape.mr}")
    return """        else if (g->a_m_stride > 0 && g->a_k_stride == 1)
            polyc_pack_rows_along_k(a + (ic + s * MR) * g->a_m_stride + pc, g->a_m_stride,
                                    (int)polyc_min(MR, mc - s * MR), MR, kc, POLYC_HAS_SCALE, g->scale, dst);
"""


def _rows_along_k_packing(isa: str, dtype: np.dtype) -> str:
    """``polyc_pack_rows_along_k`` for one instruction set's section: by register transposes
    for float and double on x86 (:data:`_PACK_ROWS_ALONG_K`), else in plain C (one load per
    value and no table lookups; the C compiler unrolls the rows)."""
    if isa in _TRANSPOSES and np.dtype(dtype).itemsize in _PACK_ROWS_ALONG_K:
        return _PACK_ROWS_ALONG_K[np.dtype(dtype).itemsize]
    return typed(_PACK_ROWS_ALONG_K_PLAIN, c_type(dtype))


_PACK_ROWS_ALONG_K_PLAIN = r"""
/* dst[k*height + i] = src[i*ld + k] (times scale when scaled) for i < rows, zero for
   rows <= i < height, k < kc: a sliver of A whose rows run along K. */
static inline void polyc_pack_rows_along_k(const T *restrict src, int64_t ld, int rows, int height,
                                           int64_t kc, int scaled, T scale, T *restrict dst)
{
    for (int64_t k = 0; k < kc; k++)
        for (int i = 0; i < height; i++)
            dst[k * height + i] = i >= rows ? 0 : scaled ? scale * src[i * ld + k] : src[i * ld + k];
}
"""

#: A sliver of A whose rows run along K, packed by register transposes, per element size.
#: float: 8 x 8 blocks (:data:`_TRANSPOSE8_REGISTERS`).  Each column of a block is stored as 8
#: values at its place, which also writes the first 8 - height values of the next column; the
#: columns are stored in order, so the next store puts those right.  The last column of the
#: sliver is stored value by value, so nothing past the sliver is written.
#: double: 4 x 4 blocks, each column stored as the 4 (or fewer) values of its rows.
_PACK_ROWS_ALONG_K = {
    4: r"""
/* dst[k*height + i] = src[i*ld + k] (times scale when scaled) for i < rows, zero for
   rows <= i < height (height <= 8), k < kc: a sliver of A whose rows run along K. */
static inline void polyc_pack_rows_along_k(const float *restrict src, int64_t ld, int rows, int height,
                                           int64_t kc, int scaled, float scale, float *restrict dst)
{
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8], column[8];
        for (int i = 0; i < 8; i++) {
            r[i] = i < rows ? _mm256_loadu_ps(src + i * ld + k) : _mm256_setzero_ps();
            if (scaled)
                r[i] = _mm256_mul_ps(_mm256_set1_ps(scale), r[i]);
        }
        polyc_transpose8_registers(r, column);
        const int whole = height == 8 || k + 8 < kc ? 8 : 7;
        for (int c = 0; c < whole; c++)
            _mm256_storeu_ps(dst + (k + c) * height, column[c]);
        if (whole == 7) {
            float last[8] __attribute__((aligned(32)));
            _mm256_store_ps(last, column[7]);
            for (int i = 0; i < height; i++)
                dst[(k + 7) * height + i] = last[i];
        }
    }
    for (; k < kc; k++)
        for (int i = 0; i < height; i++)
            dst[k * height + i] = i >= rows ? 0 : scaled ? scale * src[i * ld + k] : src[i * ld + k];
}
""",
    8: r"""
/* dst[k*height + i] = src[i*ld + k] (times scale when scaled) for i < rows, zero for
   rows <= i < height, k < kc: a sliver of A whose rows run along K. */
static inline void polyc_pack_rows_along_k(const double *restrict src, int64_t ld, int rows, int height,
                                           int64_t kc, int scaled, double scale, double *restrict dst)
{
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4)
        for (int g = 0; g < height; g += 4) {  /* rows g .. g + 3 */
            __m256d r[4], column[4];
            for (int i = 0; i < 4; i++) {
                r[i] = g + i < rows ? _mm256_loadu_pd(src + (g + i) * ld + k) : _mm256_setzero_pd();
                if (scaled)
                    r[i] = _mm256_mul_pd(_mm256_set1_pd(scale), r[i]);
            }
            const __m256d even01 = _mm256_unpacklo_pd(r[0], r[1]), odd01 = _mm256_unpackhi_pd(r[0], r[1]);
            const __m256d even23 = _mm256_unpacklo_pd(r[2], r[3]), odd23 = _mm256_unpackhi_pd(r[2], r[3]);
            column[0] = _mm256_permute2f128_pd(even01, even23, 0x20);
            column[1] = _mm256_permute2f128_pd(odd01, odd23, 0x20);
            column[2] = _mm256_permute2f128_pd(even01, even23, 0x31);
            column[3] = _mm256_permute2f128_pd(odd01, odd23, 0x31);
            const int width = height - g < 4 ? height - g : 4;
            for (int c = 0; c < 4; c++) {
                double *restrict to = dst + (k + c) * height + g;
                if (width == 4) {
                    _mm256_storeu_pd(to, column[c]);
                } else if (width == 2) {
                    _mm_storeu_pd(to, _mm256_castpd256_pd128(column[c]));
                } else {
                    double values[4] __attribute__((aligned(32)));
                    _mm256_store_pd(values, column[c]);
                    for (int i = 0; i < width; i++)
                        to[i] = values[i];
                }
            }
        }
    for (; k < kc; k++)
        for (int i = 0; i < height; i++)
            dst[k * height + i] = i >= rows ? 0 : scaled ? scale * src[i * ld + k] : src[i * ld + k];
}
""",
}


# ----------------------------------------------------------------------------- packing
#: How the packing statements' parameters (:mod:`polyc.schedule.packing`) read in the C.
_PACKING_NAMES = {"M": "g->m", "N": "g->n", "K": "g->k"}

#: Per operand: the source pointer, its block parameters, the offset tables of the flat view's
#: two dimensions, and which of them a contiguous sliver runs along (A's rows, B's columns).
_PACKED_OPERANDS = {
    "A": ("a", ("ic", "mc"), ("g->a_m", "g->a_k"), 0),
    "B": ("b", ("jc", "nc"), ("g->b_k", "g->b_n"), 1),
}


def _pack_sliver_functions(shape: MicroKernelShape) -> str:
    """The packing of one sliver of A and of B, printed from isl's loops for the packing
    statements (:func:`polyc.schedule.packing.sliver_loops`) after isl proved the statements
    right (:func:`~polyc.schedule.packing.check_packing`): per operand the general case (a
    gather through the offset tables, zeros past the edge) and the case of a whole sliver
    whose source elements are contiguous (one offset per row of the buffer)."""
    program = packing.checked_packing_program(shape.mr, shape.nr)
    functions = []
    for operand, (pointer, (first, size), _, _) in _PACKED_OPERANDS.items():
        width = shape.mr if operand == "A" else shape.nr
        statements = {s.name: s for s in program.statements if s.operand == operand}
        for contiguous in (False, True):

            def user(name: str, arguments: list[str], contiguous=contiguous, width=width, statements=statements):
                return _packing_statement_c(statements[name], arguments, width, contiguous)

            body = plain_ast_c(packing.sliver_loops(program, operand, full=contiguous), user, _PACKING_NAMES)
            kind = "contiguous" if contiguous else "sliver"
            what = (
                "a whole sliver whose source elements are contiguous along each buffer row"
                if contiguous
                else "any sliver, through the offset tables"
            )
            functions.append(
                f"/* Sliver s of {operand}'s block, {what}: the statements Pack{operand}"
                f"{'' if contiguous else ' and Pad' + operand} of polyc.schedule.packing, in loops built by "
                f"isl. */\n"
                f"static inline void polyc_pack_{pointer}_{kind}_SHAPE(const polyc_gemm_t *restrict g, "
                f"const T *restrict {pointer}, int64_t {first}, int64_t {size}, int64_t pc, int64_t kc, int64_t s, "
                f"T *restrict dst)\n{{\n{_indented(str(body))}\n}}\n"
            )
    return "\n".join(functions)


def _packing_statement_c(statement: packing.PackStatement, arguments: list[str], width: int, contiguous: bool) -> str:
    """One instance of a packing statement in C, its sliver's dimensions given by ``arguments``:
    the buffer element (the sliver is a ``[kc][width]`` array at ``dst``), and the source element
    through the offset tables, or zero for a Pad statement.  With ``contiguous`` the source
    runs along the buffer row: one table lookup for the sliver's first element, plus the lane."""
    pointer, _, tables, runs_along = _PACKED_OPERANDS[statement.operand]
    k, lane = (aff_c(a, arguments, _PACKING_NAMES) for a in _affs(statement.write)[1:])
    destination = f"dst[{k} * {width} + {lane}]"
    if statement.read is None:
        return f"{destination} = 0"
    offsets = []
    for dimension, (table, aff) in enumerate(zip(tables, _affs(statement.read))):
        if contiguous and dimension == runs_along:
            if not aff.get_coefficient_val(isl.dim_type.in_, 1).is_one():
                raise PolycError(f"internal: {statement.name} does not copy along its last dimension")
            # (An isl.Val, not a Python int: islpy's conversion of the int throws a C++ exception
            # internally, which aborts the process under AddressSanitizer.)
            first_element = aff.set_coefficient_val(isl.dim_type.in_, 1, isl.Val.zero(aff.get_ctx()))
            offsets.append(f"{table}[{aff_c(first_element, arguments, _PACKING_NAMES)}] + {arguments[1]}")
        else:
            offsets.append(f"{table}[{aff_c(aff, arguments, _PACKING_NAMES)}]")
    value = f"{pointer}[{' + '.join(offsets)}]"
    return f"{destination} = {'POLYC_SCALED(' + value + ')' if statement.operand == 'A' else value}"


def _affs(relation) -> list:
    """The output expressions of a packing access, in the sliver's frame (``s`` a parameter),
    as isl affine expressions of the remaining dimensions."""
    sliver = packing.sliver_as_parameter_map(relation)
    pieces = isl.PwMultiAff.from_map(sliver)
    result = []
    for d in range(pieces.dim(isl.dim_type.out)):
        ((_, aff),) = pieces.get_pw_aff(d).get_pieces()
        result.append(aff)
    return result


def _indented(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.splitlines())


_TRANSPOSE16 = r"""
/* dst[t*ldd + j] = src[j*ld + t] for j, t < 16: a 16 x 16 float block transposed in registers. */
#define POLYC_LO64(a, b) _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
#define POLYC_HI64(a, b) _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
static inline void polyc_transpose16(const float *restrict src, int64_t ld, float *restrict dst, int64_t ldd)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(src + i * ld);
    for (int i = 0; i < 16; i += 2) {  /* interleave pairs of rows, 32 bits at a time */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* then pairs of pairs, 64 bits at a time */
        r[i] = POLYC_LO64(t[i], t[i + 2]);
        r[i + 1] = POLYC_HI64(t[i], t[i + 2]);
        r[i + 2] = POLYC_LO64(t[i + 1], t[i + 3]);
        r[i + 3] = POLYC_HI64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {  /* then 128-bit lanes of groups of four rows */
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++)
        _mm512_storeu_ps(dst + i * ldd, r[i]);
}
"""

_TRANSPOSE8_REGISTERS = r"""
/* column[c] lane i = r[i] lane c for i, c < 8: eight float vectors transposed in AVX registers. */
static inline void polyc_transpose8_registers(__m256 r[8], __m256 column[8])
{
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {  /* interleave pairs of rows, within 128-bit lanes */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  /* then pairs of pairs: columns c and c + 4 of four rows */
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {  /* then the 128-bit halves of rows 0-3 and 4-7 */
        column[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        column[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
}
"""

_TRANSPOSE8 = r"""
/* dst[t*ldd + j] = src[j*ld + t] for j, t < 8: an 8 x 8 float block transposed in AVX registers. */
static inline void polyc_transpose8(const float *restrict src, int64_t ld, float *restrict dst, int64_t ldd)
{
    __m256 r[8], column[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + i * ld);
    polyc_transpose8_registers(r, column);
    for (int i = 0; i < 8; i++)
        _mm256_storeu_ps(dst + i * ldd, column[i]);
}
"""

#: The register transposes of each instruction set, for packing a transposed float B.
_TRANSPOSES = {"avx512": _TRANSPOSE16, "avx2": _TRANSPOSE8}


def _shape_score(shape: MicroKernelShape, m: int, n: int, run: int) -> float:
    """The score ``polyc_gemm_run_best`` (:func:`_shape_choice`) gives ``shape`` for an
    m x n product whose N offsets in C step by one for ``run`` columns."""
    mr, nr = shape.mr, shape.nr
    columns = ((n + nr - 1) // nr if run >= n else (n // run) * ((run + nr - 1) // nr)) * nr
    rows = (m + mr - 1) // mr * mr
    return shape.efficiency * n / columns * m / rows * (1.0 if run >= n or run % nr == 0 else 0.5)


def _shape_choice(shapes: tuple[MicroKernelShape, ...]) -> str:
    """C choosing a register block per call: the best ``efficiency x useful lanes x useful
    rows``, where the useful lanes are the fraction of each NR-wide sliver that is real columns
    (the scattered write-back of slivers that cross a run of contiguous columns of C counts
    half) and the useful rows the fraction of the MR-tall slivers that is real rows."""
    lines = [
        "static int polyc_gemm_run_best(const polyc_gemm_t *restrict g, int init)",
        "{",
        "    const int64_t m = g->m, n = g->n, run = g->c_n_run;",
        "    double best = -1.0;",
        "    int choice = 0;",
    ]
    for position, shape in enumerate(shapes):
        mr, nr = shape.mr, shape.nr
        lines += [
            f"    {{  /* {shape.name} */",
            f"        const int64_t columns = (run >= n ? (n + {nr - 1}) / {nr}"
            f" : (n / run) * ((run + {nr - 1}) / {nr})) * {nr};",
            f"        const int64_t rows = (m + {mr - 1}) / {mr} * {mr};",
            f"        const double score = {shape.efficiency!r} * (double)n / (double)columns"
            f" * (double)m / (double)rows * (run >= n || run % {nr} == 0 ? 1.0 : 0.5);",
            f"        if (score > best * 1.02) {{ best = score; choice = {position}; }}",
            "    }",
        ]
    lines.append("    switch (choice) {")
    for position, shape in enumerate(shapes):
        lines.append(f"    case {position}: return polyc_gemm_run_{shape.name}(g, init);")
    lines += ["    }", "    return 0;", "}"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- fixed C text


# Helpers every register block uses.
_COMMON = r"""
/* The fewest rows in a block of rows threads share: each such block streams the whole B panel,
   so it must do enough work per byte of B (2 * 96 flops per element of B). */
#define POLYC_SHARED_ROWS 96

/* Whether offsets[i] == offsets[0] + i for every i < count. */
static inline int polyc_contiguous(const int64_t *restrict offsets, int64_t count)
{
    for (int64_t i = 1; i < count; i++)
        if (offsets[i] != offsets[0] + i) return 0;
    return 1;
}

/* How many offsets from the first on step by one. */
static int64_t polyc_run_length(const int64_t *offsets, int64_t count)
{
    int64_t run = 1;
    while (run < count && offsets[run] == offsets[0] + run) run++;
    return run;
}

/* s when the offsets of a group of `rank` indices (their extents and their strides in one
   tensor, outermost first) are f * s at every flat index f, else -1; 0 for at most one element.
   Indices of extent 1 do not count: they are always 0. */
static int64_t polyc_group_stride(int rank, const int64_t *extent, const int64_t *stride)
{
    int64_t count = 1;
    for (int d = 0; d < rank; d++) count *= extent[d];
    if (count <= 1) return 0;
    int64_t s = -1, inner = 1;  /* inner: the flat distance of a step of index d */
    for (int d = rank - 1; d >= 0; inner *= extent[d], d--) {
        if (extent[d] == 1) continue;
        if (s < 0) s = stride[d];  /* the innermost index that moves: inner == 1 here */
        else if (stride[d] != s * inner) return -1;
    }
    return s;
}

/* The lowest min(max(n, 0), lanes) bits set. */
static inline uint32_t polyc_lane_mask(int64_t n, int lanes)
{
    return n >= lanes ? (uint32_t)((1ull << lanes) - 1) : n <= 0 ? 0u : (uint32_t)((1u << n) - 1);
}

/* Writes an mr x nr block (row stride `stride` in `block`) to C at offsets c_m[i] + c_n[j]. */
static void polyc_scatter(const T *restrict block, int64_t stride, T *restrict c, const int64_t *restrict c_m,
                          const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta)
{
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            T *restrict p = c + c_m[i] + c_n[j];
            *p = beta ? *p + block[i * stride + j] : block[i * stride + j];
        }
}

/* Asks for the cache lines of `rows` rows of `bytes` bytes each, `stride` elements apart. */
static void polyc_prefetch_rows(const T *p, int64_t rows, int64_t stride, int64_t bytes)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t offset = 0; offset < bytes; offset += 64)
            __builtin_prefetch((const char *)(p + i * stride) + offset, 0, 3);
}

static int64_t polyc_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The step that cuts `total` into as few blocks of at most `most` as possible, of nearly equal
   sizes, multiples of `multiple` (`most` is one): 600 by at most 512 gives 300, not 512 + 88. */
static int64_t polyc_balanced_step(int64_t total, int64_t most, int64_t multiple)
{
    if (total <= 0) return most;
    const int64_t blocks = (total + most - 1) / most;
    return polyc_min(most, polyc_round_up((total + blocks - 1) / blocks, multiple));
}

/* The same for blocks that `nthr` threads take in turn: their count a multiple of nthr where
   the rounding to `multiple` allows, so no thread is left computing the last block alone (as
   a 512^3 sgemm cut into 5 row blocks of 126 rows for 2 threads was: python -m benchmarks
   --filter sgemm, benchmarks/results/zen5_contraction_polybench.json). */
static int64_t polyc_team_step(int64_t total, int64_t most, int64_t multiple, int nthr)
{
    if (total <= 0 || nthr <= 1) return polyc_balanced_step(total, most, multiple);
    const int64_t blocks = polyc_round_up((total + most - 1) / most, nthr);
    return polyc_max(multiple, polyc_round_up((total + blocks - 1) / blocks, multiple));
}

/* A barrier that spins briefly, then yields the processor while it waits: on a machine busier
   than its cores, a waiting thread must not keep the thread it waits for off the processor
   (OpenMP's default spinning can cost a scheduler time slice, milliseconds, per barrier).
   Sleeping on a futex instead of yielding made sgemm 2048 slower (waking a sleeper takes
   tens of microseconds), so the waiter yields (python -m benchmarks --filter sgemm). */
typedef struct { int count, generation; } polyc_barrier_t;

static void polyc_barrier_wait(polyc_barrier_t *barrier, int nthr)
{
    const int generation = __atomic_load_n(&barrier->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&barrier->count, 1, __ATOMIC_ACQ_REL) == nthr) {
        __atomic_store_n(&barrier->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&barrier->generation, generation + 1, __ATOMIC_RELEASE);
        return;
    }
    for (int spins = 0; __atomic_load_n(&barrier->generation, __ATOMIC_ACQUIRE) == generation; spins++) {
        if (spins >= 200)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#elif defined(__aarch64__)
        else
            __asm__ __volatile__("yield");
#endif
    }
}

/* polyc's thread pool (polyc/runtime/pool.py), when the process has loaded it: its tickets
   are taken by the calling thread and the pool's helpers as they come, and a helper that has
   not started is never waited for. */
#if defined(_OPENMP) && defined(__linux__)
typedef void (*polyc_pool_task_t)(void *context, int64_t ticket, int worker);
extern void polyc_pool_run_v1(polyc_pool_task_t task, void *context, int64_t tickets, int workers) __attribute__((weak));
#define POLYC_POOL_LOADED (polyc_pool_run_v1 != NULL)
#else
#define POLYC_POOL_LOADED 0
#endif

/* The threads computing products together: their barrier and ticket counters. */
typedef struct { int size; polyc_barrier_t barrier; int64_t pack_tickets, row_tickets, batch_tickets; } polyc_team_t;

/* One thread's count of B panels and of tickets used (the same in every thread of a team). */
typedef struct { int64_t panels, pack_base, row_base; } polyc_progress_t;

/* The next of `count` work items of a phase, or -1 when they are all taken.  Each thread takes
   until it fails once, so a phase uses count + nthr tickets and the next phase starts at the
   base after them (phases of one counter never overlap: barriers separate them). */
static int64_t polyc_take(int64_t *tickets, int64_t *base, int64_t count, int nthr)
{
    const int64_t item = __atomic_fetch_add(tickets, 1, __ATOMIC_RELAXED) - *base;
    if (item < count) return item;
    *base += count + nthr;
    return -1;
}
"""

# Packing, the loops around the micro-kernel and the thread sharing of one register block.  MR,
# NR, MC, NC, KC are replaced by numbers and _SHAPE by the block's name (e.g. _6x64).
_BLOCKED_LOOPS = r"""
PACK_SLIVERS
/* A[ic:ic+mc, pc:pc+kc] into MR-tall slivers: element (i, k) of sliver s at
   [s*MR*kc + k*MR + i], times the contraction's scale; rows past the end are zero.  An A whose
   rows run along K (evenly spaced, K contiguous) is packed without the offset tables (by
   register transposes on x86). */
static void polyc_pack_a_SHAPE(const polyc_gemm_t *restrict g, const T *restrict a, int64_t ic, int64_t mc,
                               int64_t pc, int64_t kc, T *restrict dst)
{
    for (int64_t s = 0; s * MR < mc; s++, dst += MR * kc) {
        if (mc - s * MR >= MR && polyc_contiguous(g->a_m + ic + s * MR, MR))
            polyc_pack_a_contiguous_SHAPE(g, a, ic, mc, pc, kc, s, dst);
ROWS_ALONG_K_A        else
            polyc_pack_a_sliver_SHAPE(g, a, ic, mc, pc, kc, s, dst);
    }
}

/* Sliver s of B[pc:pc+kc, jc:jc+nc] (NR columns) into dst: element (k, j) at [k*NR + j];
   columns past the end are zero.  On AVX-512 a float B stored transposed is packed by
   register transposes. */
static void polyc_pack_b_SHAPE(const polyc_gemm_t *restrict g, const T *restrict b, int64_t jc, int64_t nc,
                               int64_t s, int64_t pc, int64_t kc, T *restrict dst)
{
    const int64_t cols = polyc_min(NR, nc - s * NR);
    const int64_t *restrict b_n = g->b_n + jc + s * NR;
    if (cols == NR && polyc_contiguous(b_n, NR)) {
        polyc_pack_b_contiguous_SHAPE(g, b, jc, nc, pc, kc, s, dst);
        return;
    }
TRANSPOSED_B
    polyc_pack_b_sliver_SHAPE(g, b, jc, nc, pc, kc, s, dst);
}

/* The longest KC block.  KC keeps an A sliver in L1 and an A panel in L2 for the products
   BLIS is made for; a product whose target is small (an eighth of L2) is dominated instead by
   what each KC block costs again (passes over C, packing B, a barrier per panel), so its KC
   block grows up to 4 KC while the A panel stays within three quarters of L2 (the 128 x 2000
   x 128 MLP layer: one block instead of four; the mlp case of python -m benchmarks).  Not
   when KC was given. */
static int64_t polyc_kc_most_SHAPE(const polyc_gemm_t *g)
{
    if (KC_FIXED || g->m * g->n * (int64_t)sizeof(T) > L2_BYTES / 8)
        return KC;
    const int64_t rows = polyc_round_up(polyc_min(MC, g->m), MR);
    return polyc_max(KC, polyc_min(4 * KC, (3 * (int64_t)L2_BYTES / 4) / ((int64_t)sizeof(T) * rows)));
}

/* How one product is shared among nthr threads: by blocks of rows (0), or (1) by the column
   slivers of each NC block, whichever balances better (the longest share, in blocks).  On a
   tie, the threads share the longer dimension: sharing rows, every thread streams all of B
   (and A is packed once); sharing columns, every thread streams all of A.  So a product of
   few rows and many columns (Kronecker steps: 16 rows, 100 000 columns) must not share rows.
   Rows are shared in blocks taken as threads come free, which absorbs a thread held up by the
   machine; with fewer than two blocks per thread (see polyc_product) that is lost, and sharing
   columns, which needs no barrier per panel, is better (the 128 x 128 MLP layer). */
static int polyc_split_n_SHAPE(const polyc_gemm_t *g, int nthr)
{
    if (nthr <= 1) return 0;
    const int64_t m_slivers = (g->m + MR - 1) / MR;
    const int64_t n_slivers = (polyc_min(g->n, NC) + NR - 1) / NR;
    const int64_t m_rounds = (m_slivers + nthr - 1) / nthr, n_rounds = (n_slivers + nthr - 1) / nthr;
    const int64_t longest_rows = m_rounds * n_slivers, longest_columns = n_rounds * m_slivers;
    if (longest_rows != longest_columns)
        return longest_columns < longest_rows;
    return g->m < g->n || g->m < 2 * POLYC_SHARED_ROWS * nthr;
}

/* Whether the loops read B's sliver at column jr itself rather than packing it: when it is
   laid out like a packed sliver (columns contiguous, rows NR apart), or when few rows of A use
   it and its rows are not far apart.  The same for every thread: it decides who packs what. */
static int polyc_direct_b_SHAPE(const polyc_gemm_t *restrict g, int64_t jr, int64_t nr)
{
    const int64_t stride = g->b_k_stride;
    if (stride < 0 || (!MASKED_B && nr < NR) || !polyc_contiguous(g->b_n + jr, nr))
        return 0;
    return stride == NR || (g->m <= 4 * MR && stride * (int64_t)sizeof(T) <= 4096);
}

/* Slivers s .. s + count - 1 of B[pc:pc+kc, jc:jc+nc] that are not read in place into dst
   (sliver q at q * stride), as polyc_pack_b packs them one by one.  When they are whole, none
   is read in place and their columns are contiguous, they are copied a row of B at a time: the
   same elements as polyc_pack_b_contiguous reads (the offset of column jc + s*NR + j is then
   b_n[jc + s*NR] + j), as one run of count * NR values per row instead of count runs of NR
   values kc rows apart. */
static void polyc_pack_b_run_SHAPE(const polyc_gemm_t *restrict g, const T *restrict b, int64_t jc, int64_t nc,
                                   int64_t s, int64_t count, int64_t pc, int64_t kc, T *restrict dst,
                                   int64_t stride)
{
    const int64_t *restrict b_n = g->b_n + jc + s * NR;
    int64_t direct = 0;
    for (int64_t q = 0; q < count; q++)
        direct += polyc_direct_b_SHAPE(g, jc + (s + q) * NR, polyc_min(NR, nc - (s + q) * NR));
    if (count == 1 || direct > 0 || (s + count) * NR > nc || !polyc_contiguous(b_n, count * NR)) {
        for (int64_t q = 0; q < count; q++)
            if (!polyc_direct_b_SHAPE(g, jc + (s + q) * NR, polyc_min(NR, nc - (s + q) * NR)))
                polyc_pack_b_SHAPE(g, b, jc, nc, s + q, pc, kc, dst + q * stride);
        return;
    }
    for (int64_t k = 0; k < kc; k++) {
        const T *restrict row = b + g->b_k[pc + k] + b_n[0];
        for (int64_t q = 0; q < count; q++)
            for (int64_t j = 0; j < NR; j++)
                dst[q * stride + k * NR + j] = row[q * NR + j];
    }
}

/* One product (batch point bt) computed by thread tid of the team (NULL: alone); with a team,
   every thread of it must call it, for the same products in the same order.
   Rows shared: the threads pack each B panel together into one of the two halves of bpacks,
   then take blocks of rows one at a time (a thread held up by the operating system delays the
   others only by the block it is in).  The halves alternate, so one barrier per panel suffices:
   a thread packs panel t + 2 only after every thread passed the barrier of panel t + 1, that
   is after finishing its blocks of panel t.
   Column slivers shared (short products): each thread packs its own slivers into its own
   bpack, no barrier.
   An A block with evenly spaced rows is read in place when at most two B slivers use it, or
   when its rows run along K, the register block is at least two vectors wide and an A sliver
   (MR x KC) is within a quarter of L1, as a packed one would be: packing then costs more than
   it saves (sharing columns, each thread would pack all of A).  Not on AVX2, whose 6 x 16
   block has half the multiply-adds per load of A: the six row streams cost more there than
   packing.  Not with one vector per row, whose loop is mostly A's broadcasts: their MR row
   pointers take the registers; nor with the long KC blocks of small targets (the MLP layer's
   2000).  Measured on the sgemm, tmm, kronecker and mlp cases of python -m benchmarks
   (benchmarks/results/zen4_contraction_polybench.json, zen3_contraction_polybench.json). */
static void polyc_product_SHAPE(const polyc_gemm_t *restrict g, int64_t bt, int init, T *restrict bpacks,
                                T *restrict apack, polyc_team_t *team, int tid, polyc_progress_t *progress)
{
    const int nthr = team ? team->size : 1;
    const T *restrict a = g->a + g->a_batch[bt];
    const T *restrict b = g->b + g->b_batch[bt];
    T *restrict c = g->c + g->c_batch[bt];
    const int split_n = polyc_split_n_SHAPE(g, nthr), shared_b = nthr > 1 && !split_n;
    const int64_t kc_step = polyc_balanced_step(g->k, polyc_kc_most_SHAPE(g), 1);
    const int64_t nc_step = polyc_balanced_step(g->n, NC, NR);
    const int a_in_place = g->a_m_stride >= 0 && g->a_k_stride >= 0 && !POLYC_HAS_SCALE;  /* packing scales */
    /* Shared rows: each block streams the whole B panel, so blocks of at least about
       POLYC_SHARED_ROWS rows, and up to 8 per thread so that a thread held up by the
       machine delays the others by a fraction of its share; a product of few rows is cut
       into one block per thread.  An A read in place (a product at most two B slivers wide,
       see direct_a) is not packed into an L2-sized panel, so its blocks need not fit one:
       longer blocks keep each thread's reads of A long runs.  With MC-row blocks the threads'
       reads interleaved every few ten kilobytes, and the 262144 x 16 x 32 Kronecker step
       (kronecker3_1 in python -m benchmarks) took markedly longer. */
    const int64_t mc_cap = a_in_place && g->n <= 2 * NR ? g->m : MC;
    const int64_t per_thread = polyc_max(1, polyc_min(8, g->m / (POLYC_SHARED_ROWS * nthr)));
    const int64_t mc_most = shared_b ? polyc_min(mc_cap, polyc_round_up((g->m + per_thread * nthr - 1)
                                                                         / (per_thread * nthr), MR)) : MC;
    const int64_t mc_step = shared_b ? polyc_team_step(g->m, mc_most, MR, nthr) : polyc_balanced_step(g->m, mc_most, MR);
    const int64_t row_blocks = (g->m + mc_step - 1) / mc_step;
    const int64_t stride = NR * kc_step;  /* between slivers in a bpack */
    const int64_t panel = polyc_round_up(polyc_min(NC, g->n), NR) * polyc_min(polyc_kc_most_SHAPE(g), g->k);
    /* A partly guarded block's destination: MR x NR values, row i at i * NR. */
    T guard_block[POLYC_HAS_GUARD ? MR * NR : 1] __attribute__((aligned(64)));
    int64_t block_m[MR], block_n[NR];
    for (int64_t i = 0; i < MR; i++) block_m[i] = i * NR;
    for (int64_t j = 0; j < NR; j++) block_n[j] = j;
    for (int64_t jc = 0; jc < g->n; jc += nc_step) {
        const int64_t nc = polyc_min(nc_step, g->n - jc);
        const int64_t slivers = (nc + NR - 1) / NR;
        int64_t s_lo = 0, s_hi = slivers;
        if (split_n) {
            const int64_t per = (slivers + nthr - 1) / nthr;
            s_lo = polyc_min(slivers, tid * per);
            s_hi = polyc_min(slivers, s_lo + per);
        }
        const int direct_a = a_in_place && (s_hi - s_lo <= 2 || (g->a_k_stride == 1 && WIDE_BLOCK
                                                                  && MR * kc_step * (int64_t)sizeof(T) <= L1_BYTES / 4));
        /* An A read in place whose rows are short (a K block of at most 256 bytes) streams from
           memory at a few multiply-adds per byte, and the hardware prefetcher does not keep up
           with a block's MR row streams: each block asks for the rows about 8 KiB ahead
           (the 262144 x 16 x 32 Kronecker step, kronecker3_1 in python -m benchmarks:
           benchmarks/results/zen5_contraction_polybench.json). */
        const int prefetch_a = direct_a && g->a_k_stride == 1 && g->a_m_stride > 0
                               && kc_step * (int64_t)sizeof(T) <= 256;
        const int64_t a_ahead = prefetch_a ? polyc_round_up(polyc_max(1, 8192 / (g->a_m_stride * (int64_t)sizeof(T))), MR) : 0;
        for (int64_t pc = 0; pc < g->k; pc += kc_step, progress->panels++) {
            const int64_t kc = polyc_min(kc_step, g->k - pc);
            const int beta = pc > 0 || !init;
            const int last = pc + kc >= g->k;
            T *restrict bpack = bpacks + (shared_b ? (progress->panels % 2) * panel : 0);
            if (shared_b) {
                for (;;) {
                    const int64_t s = polyc_take(&team->pack_tickets, &progress->pack_base, slivers, nthr);
                    if (s < 0) break;
                    if (!polyc_direct_b_SHAPE(g, jc + s * NR, polyc_min(NR, nc - s * NR)))
                        polyc_pack_b_SHAPE(g, b, jc, nc, s, pc, kc, bpack + s * stride);
                }
                polyc_barrier_wait(&team->barrier, nthr);
            }
            for (int64_t block = 0;; block++) {
                if (shared_b) {
                    block = polyc_take(&team->row_tickets, &progress->row_base, row_blocks, nthr);
                    if (block < 0) break;
                } else if (block >= row_blocks) {
                    break;
                }
                const int64_t ic = block * mc_step, mc = polyc_min(mc_step, g->m - ic);
                if (!direct_a)
                    polyc_pack_a_SHAPE(g, a, ic, mc, pc, kc, apack);
                for (int64_t s = s_lo; s < s_hi; s++) {
                    const int64_t jr = jc + s * NR, nr = polyc_min(NR, nc - s * NR);
                    const int unit = polyc_contiguous(g->c_n + jr, nr);
                    const int direct_b = polyc_direct_b_SHAPE(g, jr, nr);
                    /* A thread alone on its slivers packs them just before the first row block
                       uses them, PACK_RUN at a time (256 bytes of each row of B), while they are
                       in L1 or L2, as OpenBLAS does.  Packed all first, one sliver at a time, an
                       AVX2 float sliver is one cache line per row of B, and a panel wider than L2
                       goes out to L3 and comes back: packing took a large share of short
                       products such as BERT's 128 x 768 x 3072, which ran faster packed here in
                       runs (python -m benchmarks.onnx_bench --models encoder, and the tmm case
                       of python -m benchmarks, with AVX2 code).  Direct slivers are read in
                       place, never packed. */
                    if (!shared_b && block == 0 && (s - s_lo) % PACK_RUN == 0)
                        polyc_pack_b_run_SHAPE(g, b, jc, nc, s, polyc_min(PACK_RUN, s_hi - s), pc, kc,
                                               bpack + s * stride, stride);
                    const T *restrict bp = direct_b ? b + g->b_n[jr] + pc * g->b_k_stride : bpack + s * stride;
                    const int64_t b_rs = direct_b ? g->b_k_stride : NR;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int64_t mr = polyc_min(MR, mc - ir);
                        /* Under a guard: a block where it holds nowhere adds nothing (zero for
                           `+=!`); one where it holds in part is computed into `block`, then
                           written where it holds. */
                        const int cover = POLYC_HAS_GUARD ? polyc_guard_cover(g, bt, ic + ir, mr, jr, nr) : 2;
                        T *restrict dst = cover == 2 ? c : guard_block;
                        const int64_t *dst_m = cover == 2 ? g->c_m + ic + ir : block_m;
                        const int64_t *dst_n = cover == 2 ? g->c_n + jr : block_n;
                        const int dst_beta = cover == 2 ? beta : 0, dst_unit = cover == 2 ? unit : 1;
                        /* Constant arguments let the compiler specialise the kernel for packed A and B. */
                        if (cover == 0)
                            polyc_guarded_write(g, bt, NULL, 0, c, ic + ir, mr, jr, nr, beta);
                        else if (direct_a) {
                            if (prefetch_a && s == s_lo && ic + ir + a_ahead + mr <= g->m)
                                polyc_prefetch_rows(a + (ic + ir + a_ahead) * g->a_m_stride + pc, mr,
                                                    g->a_m_stride, kc * (int64_t)sizeof(T));
                            polyc_kernel_SHAPE(kc, a + (ic + ir) * g->a_m_stride + pc * g->a_k_stride, mr,
                                               g->a_m_stride, g->a_k_stride, bp, b_rs, !direct_b || nr == NR, dst,
                                               dst_m, dst_n, mr, nr, dst_beta, dst_unit);
                        } else if (direct_b)
                            polyc_kernel_SHAPE(kc, apack + ir * kc, MR, 1, MR, bp, b_rs, nr == NR, dst,
                                               dst_m, dst_n, mr, nr, dst_beta, dst_unit);
                        else
                            polyc_kernel_SHAPE(kc, apack + ir * kc, MR, 1, MR, bp, NR, 1, dst, dst_m,
                                               dst_n, mr, nr, dst_beta, dst_unit);
                        if (cover == 1)
                            polyc_guarded_write(g, bt, guard_block, NR, c, ic + ir, mr, jr, nr, beta);
                        if (POLYC_HAS_EPILOGUE && last)
                            polyc_epilogue(g, bt, ic + ir, mr, jr, nr);
                    }
                }
            }
        }
    }
}

#if defined(_OPENMP) && defined(__linux__)
/* Products shared out as the pool's tickets: whole products (by_batch), or else each product's
   column blocks (`parts` per product); `worker` picks the packing buffers. */
typedef struct {
    const polyc_gemm_t *g;
    int init, by_batch, parts;
    T *bpacks, *apacks;
    int64_t a_elements, b_elements;
} polyc_pooled_SHAPE_t;

static void polyc_pooled_ticket_SHAPE(void *context, int64_t ticket, int worker)
{
    const polyc_pooled_SHAPE_t *job = (const polyc_pooled_SHAPE_t *)context;
    T *bpack = job->bpacks + 2 * job->b_elements * worker, *apack = job->apacks + job->a_elements * worker;
    polyc_progress_t progress = {0, 0, 0};
    if (job->by_batch) {
        polyc_product_SHAPE(job->g, ticket, job->init, bpack, apack, NULL, 0, &progress);
    } else {
        polyc_team_t team;  /* only its size is read when columns are shared */
        memset(&team, 0, sizeof team);
        team.size = job->parts;
        polyc_product_SHAPE(job->g, ticket / job->parts, job->init, bpack, apack, &team,
                            (int)(ticket % job->parts), &progress);
    }
}
#endif

/* Every product with this register block; 0, or STATUS when buffers cannot be allocated. */
static int polyc_gemm_run_SHAPE(const polyc_gemm_t *restrict g, int init)
{
    const int64_t kc_most = polyc_min(polyc_kc_most_SHAPE(g), g->k);
    const int64_t a_elements = polyc_round_up(polyc_min(MC, g->m), MR) * kc_most;
    const int64_t b_elements = polyc_round_up(polyc_min(NC, g->n), NR) * kc_most;
    int nthr = 1, most = 1, pooled = 0;
#if defined(_OPENMP)
    if ((double)g->nbatch * (double)g->m * (double)g->n * (double)g->k >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
        /* On a machine crowded by other processes, shares that need no barrier (whole
           products, or a product's columns) run on polyc's thread pool with every thread: a
           helper kept from running then costs at most the one-thread time, never a scheduler
           slice.  Not on an idle machine: there OpenMP's threads, which a model's other kernels
           use and which spin after their regions, met the pool's helpers on the cores (a
           transformer encoder ran several times slower: python -m benchmarks.onnx_bench
           --models encoder). */
        pooled = most > 1 && POLYC_POOL_LOADED && (g->nbatch >= 2 * most || polyc_split_n_SHAPE(g, most))
                 && (nthr < most || polyc_threads_setting() == POLYC_THREADS_POOL
                     || (polyc_threads_setting() == POLYC_THREADS_POLICY && polyc_machine_crowded_lately(most)));
        if (pooled)
            nthr = most;
    }
#endif
    (void)most;
    (void)pooled;
    /* Per thread: an A panel, and two B panels (a shared pair when rows are shared), in the
       kernel's kept workspace. */
    const int64_t a_total = polyc_round_up(a_elements * nthr, 64 / (int64_t)sizeof(T));
    polyc_workspace_t *workspace = polyc_workspace_take((size_t)(a_total + 2 * b_elements * nthr) * sizeof(T));
    if (workspace == NULL)
        return STATUS;
    T *apacks = (T *)workspace->memory, *bpacks = apacks + a_total;
    if (nthr <= 1) {
        polyc_progress_t progress = {0, 0, 0};
        for (int64_t bt = 0; bt < g->nbatch; bt++)
            polyc_product_SHAPE(g, bt, init, bpacks, apacks, NULL, 0, &progress);
    }
#if defined(_OPENMP) && defined(__linux__)
    else if (pooled) {
        polyc_pooled_SHAPE_t job = {g, init, g->nbatch >= 2 * nthr, nthr, bpacks, apacks, a_elements, b_elements};
        polyc_pool_run_v1(polyc_pooled_ticket_SHAPE, &job, job.by_batch ? g->nbatch : g->nbatch * nthr, nthr);
    }
#endif
#if defined(_OPENMP)
    else {
        /* Whole products per thread when there are enough of them to balance; else share each
           one.  Either way the threads take work as they go.  No barrier of ours ends the
           region: OpenMP's own is enough, and a second one cost a scheduler slice whenever
           one of its waiters lost its core. */
        const int by_batch = g->nbatch >= 2 * nthr;
        polyc_team_t team;
        memset(&team, 0, sizeof team);
        int slow = 0;
        const double call_start = polyc_call_start();
        #pragma omp parallel num_threads(nthr)
        {
            polyc_thread_clock_t clock;
            polyc_thread_start(&clock, call_start);
            const int tid = omp_get_thread_num();
            __atomic_store_n(&team.size, omp_get_num_threads(), __ATOMIC_RELAXED);  /* the same in all */
            polyc_progress_t progress = {0, 0, 0};
            if (by_batch) {
                for (;;) {
                    const int64_t bt = __atomic_fetch_add(&team.batch_tickets, 1, __ATOMIC_RELAXED);
                    if (bt >= g->nbatch) break;
                    polyc_product_SHAPE(g, bt, init, bpacks + 2 * b_elements * tid, apacks + a_elements * tid,
                                        NULL, 0, &progress);
                }
            } else {
                const int split_n = polyc_split_n_SHAPE(g, team.size);
                for (int64_t bt = 0; bt < g->nbatch; bt++)
                    polyc_product_SHAPE(g, bt, init, bpacks + (split_n ? 2 * b_elements * tid : 0),
                                        apacks + a_elements * tid, &team, tid, &progress);
            }
            polyc_thread_stop(&clock, &slow);
        }
        polyc_threads_after(nthr, most, slow);
    }
#endif
    polyc_workspace_give_back(workspace);
    return 0;
}
"""

# After the register blocks: the entry into the loops.
_RUN = r"""
/* Every product; 0, or an error status from the loops. */
static int polyc_gemm_run(const polyc_gemm_t *restrict g, int init)
{
    if (g->k == 0) {  /* no products to add: zero the target for `+=!`, then the epilogue */
        for (int64_t bt = 0; bt < g->nbatch; bt++) {
            if (init)
                for (int64_t m = 0; m < g->m; m++)
                    for (int64_t n = 0; n < g->n; n++)
                        g->c[g->c_batch[bt] + g->c_m[m] + g->c_n[n]] = 0;
            if (POLYC_HAS_EPILOGUE)
                polyc_epilogue(g, bt, 0, g->m, 0, g->n);
        }
        return 0;
    }
    return polyc_gemm_run_best(g, init);
}
"""
