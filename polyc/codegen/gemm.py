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

from polyc.codegen.c import aff_c, c_comment, plain_ast_c
from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter, typed
from polyc.codegen.templates import c_template
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


def generate_gemm(program: PolyProgram, contraction: Contraction, options: Options) -> DedicatedKernel:
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
        #: Each register block printed, with its cache blocks, as :meth:`blocked_loops` filled them in.
        self.printed_blocks: list[dict] = []

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
            self.instruction_sets(),
            typed(_RUN, self.ctype),
            self.entry_function(name, sizes),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions` (call after the text is written)."""
        c, sizes = self.contraction, self.program.size_values
        work = None
        if self.specialised:
            work = int(np.prod([c.extent(i).evaluate(sizes) for i in (*c.batch, *c.m, *c.n, *c.k)]))
        if self.options.micro_kernel is not None:
            choice = f"the micro_kernel option ({self.options.micro_kernel})"
        elif self.specialised:
            choice = "chosen at these sizes from N and C's contiguous run of N (the instruction set's other shapes are not in the source)"
        else:
            choice = "chosen per call from N and C's contiguous run of N"
        return {
            "kernel": "gemm",
            "contraction": c.describe(),
            "instruction_sets": tuple(ISA_GUARDS),
            "register_blocks": tuple(self.printed_blocks),
            "register_block_choice": choice,
            "gemm_blocks": self.options.gemm_blocks,
            "cache_sizes": dict(tiling.cache_sizes(self.options)),
            "kc_grows": self.options.gemm_blocks is None,
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
            "multiply_adds": work,
        }

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
        self.printed_blocks.append({"isa": shape.isa, "mr": shape.mr, "nr": shape.nr, "mc": mc, "nc": nc, "kc": kc})
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


_PACK_ROWS_ALONG_K_PLAIN = c_template("gemm_pack_rows_along_k_plain.c")

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


_TRANSPOSE16 = c_template("gemm_transpose16.c")

_TRANSPOSE8_REGISTERS = c_template("gemm_transpose8_registers.c")

_TRANSPOSE8 = c_template("gemm_transpose8.c")

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
_COMMON = c_template("gemm_common.c")

# Packing, the loops around the micro-kernel and the thread sharing of one register block.  MR,
# NR, MC, NC, KC are replaced by numbers and _SHAPE by the block's name (e.g. _6x64).
_BLOCKED_LOOPS = c_template("gemm_blocked_loops.c")

# After the register blocks: the entry into the loops.
_RUN = c_template("gemm_run.c")
