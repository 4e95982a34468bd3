"""C for integer matrix products (8-bit operands, int32 sums) in the structure of BLIS.

For an :class:`~polyc.schedule.integer_contraction.IntegerContraction`
``Y[b, M, N] (+)= sum_K (A - za)[b, M, K] * (B - zb)[b, K, N]`` this module prints one
translation unit whose function has the generic back end's signature.  Its loops are those of
the float kernel (:mod:`polyc.codegen.gemm`) arranged so that threads never wait at a barrier
(``templates/integer_gemm_loops.c`` and ``integer_gemm_run.c``): the threads take blocks of at
most MC rows as they come free and keep each through every K block (KC long), packing its rows
of A sliver by sliver and running an MR x NR register block over every sliver of B.  B is packed
whole, each sliver once per call by the first thread that needs it (the others wait for that
sliver only), so a thread held up by a busy machine delays the others by one sliver at most;
with two products or more per thread, threads take whole products instead.

Zero points never touch the products: with the values packed as they are (or shifted by 128 to
fit an instruction's operand type, which is a change of zero point too),

    sum_k (a - za)(b - zb) = sum_k a b - zb * rowsum(a) - za * colsum(b) + K * za * zb,

the row sums are taken as A is packed, the column sums as B is, and the micro-kernel subtracts
the correction when it writes its block.  Everything is computed modulo 2^32 (wrapping int32
vector arithmetic, uint32 in C), so the result is exact wherever it fits in int32, as numpy's
int64 product of the shifted operands does.

Epilogue statements (:class:`~polyc.schedule.integer_contraction.IntegerEpilogue`: a
requantization, a dequantization, a bias) become ``polyc_epilogue``, which a thread calls on its
block of rows once the block's last K block is summed, while the block's int32 sums are in cache;
it runs along whole rows, the innermost index of N in a vector loop.

Register blocks, chosen by the C preprocessor (so one source serves every machine):

=============  ================================  =====  ==  ================================
set            condition                         block  G   the multiply-add
=============  ================================  =====  ==  ================================
avx512vnni     ``__AVX512VNNI__``                6x64   4   vpdpbusd zmm: u8 x s8 groups of 4
avxvnni        ``__AVXVNNI__``                   6x16   4   vpdpbusd ymm (VEX)
avx2           ``__AVX2__``                      5x16   2   vpmaddwd on int16 pairs
neon_dotprod   ``__ARM_FEATURE_DOTPROD``         8x12   4   sdot s8 x s8 by lanes
neon           ``__ARM_NEON`` (AArch64)          8x8    1   smlal int16 x int16 by lanes
portable       otherwise                         4x16   1   C the compiler vectorises
=============  ================================  =====  ==  ================================

The byte dot products take their operands as one type each (vpdpbusd: unsigned x signed;
sdot: signed x signed): an operand of the other type is packed with its sign bit flipped
(``x ^ 0x80``, which is ``x + 128`` or ``x - 128``), and its zero point shifted alike, so the
correction above undoes it.  vpmaddubsw is not used: its int16 sums of pairs saturate
(255 * -128 * 2), which is not exact for full-range weights; AVX2 widens to int16 and uses
vpmaddwd, whose pair sums are exact in int32.  ``vectorize=False`` (the
``POLYC_IGEMM_PORTABLE`` macro) selects the portable code everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.codegen.c import c_comment
from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.schedule import tiling
from polyc.schedule.integer_contraction import IntegerContraction, ZeroPoint
from polyc.target import INTEGER_DOT_PRODUCT_SETS

#: The return value when packing buffers or tables cannot be allocated.
STATUS_OUT_OF_MEMORY = 2

#: Below this many multiply-adds a product runs on one thread.
_PARALLEL_THRESHOLD = 64 * 64 * 64

#: Macro that forces the portable code.
PORTABLE_MACRO = "POLYC_IGEMM_PORTABLE"


@dataclass(frozen=True)
class IntegerBlock:
    """One instruction set's register block: MR x NR int32 sums, K in groups of ``group``
    values, A's packed as ``packed_a`` and B's as ``packed_b`` (``int8``, ``uint8`` or
    ``int16``), ``lanes`` int32 per vector."""

    isa: str
    mr: int
    nr: int
    group: int
    packed_a: str
    packed_b: str
    lanes: int

    def shifts(self, a_dtype: np.dtype, b_dtype: np.dtype) -> tuple[int, int]:
        """What packing adds to A's and B's values so that they fit the packed types."""

        def shift(dtype: np.dtype, packed: str) -> int:
            if packed == "uint8" and dtype == np.dtype(np.int8):
                return 128
            if packed == "int8" and dtype == np.dtype(np.uint8):
                return -128
            return 0

        return shift(np.dtype(a_dtype), self.packed_a), shift(np.dtype(b_dtype), self.packed_b)


#: The register block of each instruction set, best first (see the module doc).
BLOCKS = {
    "avx512vnni": IntegerBlock("avx512vnni", 6, 64, 4, "uint8", "int8", 16),
    "avxvnni": IntegerBlock("avxvnni", 6, 16, 4, "uint8", "int8", 8),
    "avx2": IntegerBlock("avx2", 5, 16, 2, "int16", "int16", 8),
    "neon_dotprod": IntegerBlock("neon_dotprod", 8, 12, 4, "int8", "int8", 4),
    "neon": IntegerBlock("neon", 8, 8, 1, "int16", "int16", 4),
    "portable": IntegerBlock("portable", 4, 16, 1, "int16", "int16", 16),
}


#: The 128-bit byte dot product (unsigned x signed, groups of four into int32) of the sets that have one.
_DOT4 = {"avx512vnni": "_mm_dpbusd_epi32", "avxvnni": "_mm_dpbusd_avx_epi32"}

#: How many groups of K an x86 micro-kernel's loop takes per iteration.
UNROLL = {"avx512vnni": 1, "avxvnni": 1, "avx2": 2}


def block_sizes(block: IntegerBlock, caches: dict[int, int]) -> tuple[int, int]:
    """(MC, KC): a B sliver (KC x NR packed values) in half of L1, an A block (MC x KC) in half
    of L2.  (B is packed whole, each sliver once, and streams from L3 or memory.)"""
    l1, l2 = caches.get(1, 32 * 1024), caches.get(2, 1 << 20)
    size_a = np.dtype(block.packed_a).itemsize
    size_b = np.dtype(block.packed_b).itemsize
    kc = max(64, (l1 // 2) // (block.nr * size_b) // 16 * 16)
    mc = max(block.mr, (l2 // 2) // (kc * size_a) // block.mr * block.mr)
    return mc, kc


def generate_integer_gemm(program: PolyProgram, contraction: IntegerContraction, options: Options) -> DedicatedKernel:
    """The C translation unit computing ``program`` (one integer contraction)."""
    return _Writer(program, contraction, options).write()


class _Writer(PatternKernelWriter):
    def __init__(self, program: PolyProgram, contraction: IntegerContraction, options: Options):
        super().__init__(program, options)
        self.contraction = contraction
        #: Each instruction set's register block and cache blocks, as :meth:`instruction_sets` printed them.
        self.printed_blocks: list[dict] = []

    def write(self) -> DedicatedKernel:
        d, c = self.definition, self.contraction
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [
            self.header(),
            PRELUDE,
            self.preamble(PORTABLE_MACRO, ["#include <sched.h>"]),
            (
                "#if defined(_OPENMP)\n#define POLYC_IGEMM_PARALLEL 1\n#else\n#define POLYC_IGEMM_PARALLEL 0\n#endif"
                if self.options.parallel
                else "#define POLYC_IGEMM_PARALLEL 0"
            ),
            f"typedef {c_type(c.a_dtype)} polyc_ta;",
            f"typedef {c_type(c.b_dtype)} polyc_tb;",
            _CONTEXT,
            self.epilogue_function(),
            self.instruction_sets(),
            c_template("integer_gemm_run.c")
            .replace("STATUS", str(STATUS_OUT_OF_MEMORY))
            .replace("THRESHOLD", f"{float(_PARALLEL_THRESHOLD)!r}"),
            self.entry_function(name, sizes),
            "",
        ]
        decisions = {
            "kernel": "integer_gemm",
            "contraction": c.describe(),
            "instruction_sets": tuple(INTEGER_DOT_PRODUCT_SETS),
            "register_blocks": tuple(self.printed_blocks),
            "cache_sizes": dict(tiling.cache_sizes(self.options)),
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
            "epilogues": tuple(e.statement.text for e in c.epilogues),
        }
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), decisions)

    def header(self) -> str:
        o = self.options
        lines = [
            f"polyc integer gemm kernel for def '{self.definition.name}' (8-bit operands, int32 sums; "
            "BLIS structure: packing, cache blocks, register micro-kernel)",
            f"sizes: {self.sizes_comment()}",
            f"options: parallel={o.parallel} vectorize={o.vectorize} specialize={o.specialize}",
            f"contraction: {self.contraction.describe()}",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    # ------------------------------------------------------------------ epilogues
    def epilogue_function(self) -> str:
        """``polyc_epilogue(g, bt, row0, rows, col0, cols)``: the epilogue statements at every
        point of rows ``row0..`` and columns ``col0..`` of product ``bt`` (flat indices of the
        M, N and batch groups), once its sums are final; empty without epilogues.  Each point's
        values stay in locals from one statement to the next; the epilogues' outputs (and the
        product, where an epilogue updates it and it is an output) are stored.  The innermost
        index of the N group runs in the innermost loop, so that the compiler vectorises it."""
        c = self.contraction
        if not c.epilogues:
            return ""
        d = self.definition
        local = {c.target.tensor: f"polyc_l_{c.target.tensor}"}
        body = []
        for position, tensor in enumerate(d.tensors):
            qualified = f"const {c_type(tensor.dtype)}" if tensor.role is ir.Role.INPUT else c_type(tensor.dtype)
            body.append(f"{qualified} *restrict {tensor.name} = ({qualified} *)polyc_gp->tensors[{position}];")
            body.append(f"(void){tensor.name};")
        sizes = list(d.sizes)
        body += self.size_declarations(lambda size: f"polyc_gp->sizes[{sizes.index(size)}]")
        body += self.decompose("polyc_bt", c.batch)
        run = self.contiguous_run()
        inner, outer = run[-1], c.n[: len(c.n) - len(run)]
        run_extent = " * ".join(f"({self.size_expr(c.extent(i))})" for i in run)
        point = [
            f"int32_t {local[c.target.tensor]} = "
            f"{self.element(c.target.tensor, [f'polyc_ix_{i}' for i in c.target.indices])};"
        ]
        stored: dict[str, str] = {}

        def access(read: ir.Read, subscripts: list[str]) -> str:
            return local.get(read.tensor) or self.element(read.tensor, subscripts)

        for epilogue in c.epilogues:
            statement = epilogue.statement
            index_c = {mine: f"polyc_ix_{theirs}" for mine, theirs in epilogue.points}

            def index(name: str, index_c: dict[str, str] = index_c) -> str:
                return index_c.get(name) or self.size_c[name]

            printer = CExpressionPrinter(access=access, index=index, size=self.size_expr)
            value = printer.to_c(statement.rhs)
            name = statement.target
            if name in local:
                point.append(f"{local[name]} = {value};")
            else:
                local[name] = f"polyc_l_{name}"
                point.append(f"{c_type(d.tensor(name).dtype)} {local[name]} = {value};")
            if d.tensor(name).role is ir.Role.OUTPUT:
                stored[name] = self.element(name, [index_c[i] for i in statement.indices])
        point += [f"{element} = {local[name]};" for name, element in stored.items()]
        body += [
            "for (int64_t polyc_r = polyc_row0; polyc_r < polyc_row0 + polyc_rows; polyc_r++) {",
            *("    " + line for line in self.decompose("polyc_r", c.m)),
            "    for (int64_t polyc_j = polyc_col0; polyc_j < polyc_col0 + polyc_cols;) {",
            *("        " + line for line in self.decompose("polyc_j", outer, run)),
            *(f"        const int64_t polyc_ix_{index} = 0;" for index in run[:-1]),
            f"        const int64_t polyc_run = polyc_min(polyc_col0 + polyc_cols - polyc_j, {run_extent} - polyc_first);",
            "        #pragma omp simd",
            "        for (int64_t polyc_t = 0; polyc_t < polyc_run; polyc_t++) {",
            f"            const int64_t polyc_ix_{inner} = polyc_first + polyc_t;",
            *("            " + line for line in point),
            "        }",
            "        polyc_j += polyc_run;",
            "    }",
            "}",
        ]
        signature = (
            "static void polyc_epilogue(const polyc_igemm_t *restrict polyc_gp, int64_t polyc_bt, int64_t polyc_row0,\n"
            "                           int64_t polyc_rows, int64_t polyc_col0, int64_t polyc_cols)"
        )
        return (
            "/* The epilogue statements at the points of a block of the product whose sums are final. */\n"
            "#define POLYC_EPILOGUE 1\n" + signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"
        )

    def contiguous_run(self) -> tuple[str, ...]:
        """The innermost indices of the N group that the epilogue's loop runs along as one flat
        index: the longest suffix that every tensor it touches (the product, the epilogues'
        targets, what they read) holds as its last dimensions in that order, whole, or not at
        all.  Along them the elements are one run in each, so a run spans whole rows of an image
        (positions 7 x 7 are one run of 49, not seven of 7)."""
        c, d = self.contraction, self.definition
        accesses = [(c.target.tensor, list(c.target.indices))]
        for epilogue in c.epilogues:
            statement = epilogue.statement
            accesses.append((statement.target, [epilogue.contraction_index(i) for i in statement.indices]))
            for read in ir.reads(statement.rhs):
                subscripts: list = []
                for subscript in read.subscripts:
                    assert isinstance(subscript, Affine)  # (the recogniser takes affine reads only)
                    names = [epilogue.contraction_index(n) for n in subscript.names() if n in dict(epilogue.points)]
                    plain = len(names) == 1 and subscript == Affine.var(list(subscript.names())[0])
                    subscripts.append(names[0] if plain else tuple(names))
                accesses.append((read.tensor, subscripts))

        def holds(suffix: tuple[str, ...]) -> bool:
            for tensor, subscripts in accesses:
                mentioned = [s for s in subscripts if s in suffix or (isinstance(s, tuple) and set(s) & set(suffix))]
                if not mentioned:
                    continue
                if tuple(subscripts[len(subscripts) - len(suffix) :]) != suffix or len(mentioned) != len(suffix):
                    return False
                shape = d.tensor(tensor).shape
                if any(shape[len(shape) - len(suffix) + k] != c.extent(i) for k, i in enumerate(suffix) if k > 0):
                    return False
            return True

        run: tuple[str, ...] = (c.n[-1],)
        while len(run) < len(c.n) and holds(c.n[len(c.n) - len(run) - 1 :]):
            run = c.n[len(c.n) - len(run) - 1 :]
        return run

    def decompose(self, flat: str, indices: tuple[str, ...], run: tuple[str, ...] = ()) -> list[str]:
        """C declaring ``polyc_ix_<index>`` for each of ``indices`` (outermost first) from the
        flat number ``flat`` of a point of their group, in row-major order; with ``run``, the
        group's innermost indices after them, whose flat value is declared as ``polyc_first``."""
        group = list(indices) + (["polyc_run"] if run else [])
        if not group:
            return []
        lines = [f"int64_t polyc_rest_{flat} = {flat};"]
        for position in reversed(range(len(group))):
            index = group[position]
            if index == "polyc_run":
                extent = "(" + " * ".join(f"({self.size_expr(self.contraction.extent(i))})" for i in run) + ")"
            else:
                extent = f"({self.size_expr(self.contraction.extent(index))})"
            name = "polyc_first" if index == "polyc_run" else f"polyc_ix_{index}"
            if position == 0:
                lines.append(f"const int64_t {name} = polyc_rest_{flat};")
            else:
                lines.append(f"const int64_t {name} = polyc_rest_{flat} % {extent}; polyc_rest_{flat} /= {extent};")
        return lines + [f"(void)polyc_rest_{flat};"]

    def instruction_sets(self) -> str:
        """Per instruction set, under its preprocessor guard: the block's constants, the packing
        and the micro-kernel."""
        c = self.contraction
        caches = tiling.cache_sizes(self.options)
        pieces = []
        guards = [(name, s.condition, s.header) for name, s in INTEGER_DOT_PRODUCT_SETS.items()]
        for position, (isa, condition, header) in enumerate(guards):
            if condition is None:
                pieces.append("#else")
            else:
                pieces.append(f"{'#if' if position == 0 else '#elif'} !defined({PORTABLE_MACRO}) && {condition}")
            if header is not None:
                pieces.append(f"#include <{header}>")
            block = BLOCKS[isa]
            mc, kc = block_sizes(block, caches)
            shift_a, shift_b = block.shifts(c.a_dtype, c.b_dtype)
            self.printed_blocks.append(
                {"isa": isa, "mr": block.mr, "nr": block.nr, "mc": mc, "kc": kc, "group": block.group}
            )
            pieces += [
                f'#define POLYC_IGEMM_ISA "{isa}"',
                f"#define MR {block.mr}",
                f"#define NR {block.nr}",
                f"#define G {block.group}",
                f"#define MC {mc}",
                f"#define KC {kc}",
                f"typedef {c_type(np.dtype(block.packed_a))} polyc_pa;",
                f"typedef {c_type(np.dtype(block.packed_b))} polyc_pb;",
                f"#define POLYC_A_SHIFT ({shift_a})",
                f"#define POLYC_B_SHIFT ({shift_b})",
            ]
            if isa in _DOT4:  # 4 lanes of unsigned x signed bytes, for B's column sums
                pieces.append(f"#define POLYC_DOT4(acc, a, b) {_DOT4[isa]}((acc), (a), (b))")
        pieces.append("#endif")
        pieces.append("#if defined(__SSE2__)\n#include <immintrin.h>\n#endif")
        pieces.append(c_template("integer_gemm_loops.c"))
        for position, (isa, condition, _) in enumerate(guards):
            if condition is None:
                pieces.append("#else")
            else:
                pieces.append(f"{'#if' if position == 0 else '#elif'} !defined({PORTABLE_MACRO}) && {condition}")
            pieces.append(_MICRO_KERNELS[isa](BLOCKS[isa]))
        pieces.append("#endif")
        return "\n".join(pieces)

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        c = self.contraction
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
        layout = [(table, group) for group in groups for table in tables[group]]
        total = " + ".join(f"polyc_{group}" for _, group in layout)
        body += [
            f"int64_t *polyc_tables = (int64_t *)malloc(sizeof(int64_t) * (size_t)({total}));",
            "int32_t *polyc_zeros = (int32_t *)malloc(sizeof(int32_t) * (size_t)(polyc_m + polyc_n));",
            "if (polyc_tables == NULL || polyc_zeros == NULL) {",
            "    free(polyc_tables);",
            "    free(polyc_zeros);",
            f"    return {STATUS_OUT_OF_MEMORY};",
            "}",
            "int64_t *polyc_next = polyc_tables;",
        ]
        for table, group in layout:
            body += [f"int64_t *polyc_{table} = polyc_next;", f"polyc_next += polyc_{group};"]
        for group, indices in groups.items():
            body += self.fill_tables(indices, tables[group], operand_of)
        body += self.fill_zeros("polyc_zeros", c.m, c.a_zero, "POLYC_A_SHIFT")
        body += self.fill_zeros("polyc_zeros + polyc_m", c.n, c.b_zero, "POLYC_B_SHIFT")
        body += [
            "polyc_igemm_t polyc_g;",
            "memset(&polyc_g, 0, sizeof polyc_g);",
            f"polyc_g.a = {c.a.tensor}; polyc_g.b = {c.b.tensor}; polyc_g.c = {c.target.tensor};",
            "polyc_g.m = polyc_m; polyc_g.n = polyc_n; polyc_g.k = polyc_k; polyc_g.nbatch = polyc_batch;",
            *(f"polyc_g.{table} = polyc_{table};" for table, _ in layout),
            f"polyc_g.a_k_stride = {self.group_stride(c.k, c.a)};",
            f"polyc_g.b_k_stride = {self.group_stride(c.k, c.b)};",
            f"polyc_g.b_n_stride = {self.group_stride(c.n, c.b)};",
            f"polyc_g.c_n_stride = {self.group_stride(c.n, c.target)};",
            "polyc_g.za = polyc_zeros; polyc_g.zb = polyc_zeros + polyc_m;",
            f"const void *polyc_tensors[] = {{{', '.join(f'(const void *){t.name}' for t in self.definition.tensors)}}};",
            f"const int64_t polyc_sizes[] = {{{', '.join(self.size_c[s] for s in self.definition.sizes) or '0'}}};",
            "polyc_g.tensors = polyc_tensors; polyc_g.sizes = polyc_sizes;",
            *self.contiguous_groups(groups, tables),
            "for (int64_t polyc_i = 0; polyc_i < polyc_m + polyc_n; polyc_i++)",
            "    if (polyc_zeros[polyc_i] != 0) {",
            "        polyc_g.corrected = 1;",
            "        if (polyc_i < polyc_m) polyc_g.need_colsums = 1;",
            "        else polyc_g.need_rowsums = 1;",
            "    }",
            f"const int polyc_status = polyc_igemm_run(&polyc_g, {1 if c.init else 0});",
            "free(polyc_tables);",
            "free(polyc_zeros);",
            "return polyc_status;",
        ]
        signature = f"int {name}({', '.join(self.pointer_arguments(sizes))})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    @staticmethod
    def contiguous_groups(groups: dict, tables: dict) -> list[str]:
        """C that gives a group of several indices the stride its offsets step by, where they
        step evenly in a tensor (images and positions one run, as an integer convolution's
        columns are): the packing and the stores then take the one-index fast paths."""
        strides = {"a_k": "a_k_stride", "b_k": "b_k_stride", "b_n": "b_n_stride", "c_n": "c_n_stride"}
        lines = []
        for group, indices in groups.items():
            if len(indices) < 2:
                continue
            for table in tables[group]:
                if table in strides:
                    lines.append(f"polyc_g.{strides[table]} = polyc_even_stride(polyc_{table}, polyc_{group});")
        return lines

    def group_stride(self, indices: tuple[str, ...], operand) -> str:
        """C of the stride of a one-index group in ``operand`` (-1 for a group of several
        indices: the packing then reads through the offset tables)."""
        if len(indices) != 1:
            return "-1"
        return self.stride(operand.tensor, operand.indices.index(indices[0]))

    def fill_tables(self, indices: tuple[str, ...], tables: tuple[str, ...], operand_of) -> list[str]:
        """C filling the offset tables of one group: a loop nest over its indices, outermost
        first, at flat index ``polyc_f``."""
        if not indices:
            return [f"polyc_{table}[0] = 0;" for table in tables]
        lines, flat = self.group_loops(indices)
        inner = "    " * (len(indices) + 1)
        lines.append(f"{inner}const int64_t polyc_f = {flat};")
        for table in tables:
            operand = operand_of[table[0]]
            terms = [
                f"polyc_v_{index} * {self.stride(operand.tensor, operand.indices.index(index))}" for index in indices
            ]
            lines.append(f"{inner}polyc_{table}[polyc_f] = {' + '.join(terms)};")
        lines += ["    " * (depth + 1) + "}" for depth in reversed(range(len(indices)))]
        return lines + ["}"]

    def group_loops(self, indices: tuple[str, ...]) -> tuple[list[str], str]:
        """The opening lines of a loop nest over a group's indices (variables ``polyc_v_<index>``)
        and the C of the flat index inside it."""
        lines = ["{"]
        flat = "0"
        for depth, index in enumerate(indices):
            extent = self.size_expr(self.contraction.extent(index))
            lines.append(
                "    " * (depth + 1) + f"for (int64_t polyc_v_{index} = 0; polyc_v_{index} < ({extent}); "
                f"polyc_v_{index}++) {{"
            )
            flat = f"polyc_v_{index}" if depth == 0 else f"({flat}) * ({extent}) + polyc_v_{index}"
        return lines, flat

    def fill_zeros(self, table: str, group: tuple[str, ...], zero: ZeroPoint | None, shift: str) -> list[str]:
        """C filling ``table`` (one int32 per flat index of the group) with the zero point plus
        the packing's shift."""
        if zero is None or zero.tensor is None:
            value = f"(int32_t)({zero.value if zero is not None else 0}) + {shift}"
            count = "polyc_m" if table == "polyc_zeros" else "polyc_n"
            return [f"for (int64_t polyc_f = 0; polyc_f < {count}; polyc_f++) ({table})[polyc_f] = {value};"]
        lines, flat = self.group_loops(group)
        inner = "    " * (len(group) + 1)
        subscripts = [f"polyc_v_{s.terms[0][0]}" if s.terms else str(s.constant) for s in zero.subscripts]
        element = self.element(zero.tensor, subscripts)
        lines.append(f"{inner}({table})[{flat}] = (int32_t){element} + {shift};")
        lines += ["    " * (depth + 1) + "}" for depth in reversed(range(len(group)))]
        return lines + ["}"]


_CONTEXT = """/* Everything the loops need: operands, flattened extents, for each flat index of a group its
   offset in each tensor (a_m[m]: offset in A of row m, ...), the strides of one-index groups
   (-1: several indices, read through the tables), and per row of A and column of B the zero
   point plus the packing's shift (za, zb); corrected: some of them are not zero (need_colsums:
   some of A's, so B's column sums are needed; need_rowsums: some of B's). */
typedef struct {
    const polyc_ta *a;
    const polyc_tb *b;
    int32_t *c;
    int64_t m, n, k, nbatch;
    const int64_t *a_m, *a_k, *b_k, *b_n, *c_m, *c_n, *a_batch, *b_batch, *c_batch;
    int64_t a_k_stride, b_k_stride, b_n_stride, c_n_stride;
    const int32_t *za, *zb;
    int corrected, need_colsums, need_rowsums;
    const void *const *tensors;  /* every tensor of the def, in signature order (for the epilogues) */
    const int64_t *sizes;
} polyc_igemm_t;

/* The step of offsets `table` (count of them) when they step evenly from 0, else -1. */
static inline int64_t polyc_even_stride(const int64_t *table, int64_t count)
{
    if (count < 2)
        return table[0] == 0 ? 1 : -1;
    const int64_t step = table[1] - table[0];
    if (table[0] != 0 || step <= 0)
        return -1;
    for (int64_t i = 2; i < count; i++)
        if (table[i] - table[i - 1] != step)
            return -1;
    return step;
}"""


# ----------------------------------------------------------------------------- micro-kernels
_KERNEL_SIGNATURE = (
    "static inline void polyc_ikernel(int64_t kg, const unsigned char *restrict ap, const unsigned char *restrict bp,\n"
    "    int32_t *restrict c, const int64_t *restrict c_m, const int64_t *restrict c_n, int64_t mr, int64_t nr,\n"
    "    int beta, int unit, int corrected)"
)

#: x86 spellings per vector width: type, prefix, unaligned load and store of integer vectors.
_X86 = {
    512: ("__m512i", "_mm512", "_mm512_loadu_si512((const void *)({p}))", "_mm512_storeu_si512((void *)({p}), {v})"),
    256: (
        "__m256i",
        "_mm256",
        "_mm256_loadu_si256((const __m256i *)({p}))",
        "_mm256_storeu_si256((__m256i *)({p}), {v})",
    ),
}


def _x86_kernel(block: IntegerBlock) -> str:
    """An MR x NR micro-kernel in x86 intrinsics: vpdpbusd (AVX-512 VNNI, AVX-VNNI) on groups of
    four bytes, or vpmaddwd then vpaddd (AVX2) on pairs of int16; one broadcast of A's group per
    row, NR / lanes loads of B per group."""
    bits = block.lanes * 32
    vec, pre, load, store = _X86[bits]
    mr, nv = block.mr, block.nr // block.lanes
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    group_bytes = block.group * np.dtype(block.packed_a).itemsize  # one row's group: 4 bytes
    lines = [
        f"/* {mr} x {block.nr} block ({block.isa}): C[c_m[i] + c_n[j]] (+)= sum over the K block of A(i, k) * B(k, j),",
        "   corrected for the zero points (see polyc_write_block). */",
        _KERNEL_SIGNATURE,
        "{",
        "    const unsigned char *restrict a = ap + POLYC_A_TAIL;",
        "    const unsigned char *restrict b = bp + POLYC_B_TAIL;",
    ]
    for row in acc:
        lines.append(f"    {vec} " + ", ".join(f"{name} = {pre}_setzero_si{bits}()" for name in row) + ";")
    b_bytes = block.nr * block.group * np.dtype(block.packed_b).itemsize

    def group(step: int) -> list[str]:
        """The multiply-adds of one group of K (the ``step``-th of an unrolled iteration)."""
        a_offset, b_offset = step * mr * group_bytes, step * b_bytes
        loads = ", ".join(f"b{v} = {load.format(p=f'b + {b_offset + v * bits // 8}')}" for v in range(nv))
        body = [f"{{ const {vec} {loads};", f"  {vec} x;"]
        for i in range(mr):
            if block.isa == "avx512vnni":
                ops = [f"{acc[i][v]} = _mm512_dpbusd_epi32({acc[i][v]}, x, b{v});" for v in range(nv)]
            elif block.isa == "avxvnni":
                ops = [f"{acc[i][v]} = _mm256_dpbusd_avx_epi32({acc[i][v]}, x, b{v});" for v in range(nv)]
            else:
                # (the empty asm keeps each sum in its register: gcc otherwise adds the products
                # of two groups first and spills accumulators to the stack)
                ops = [
                    f"{acc[i][v]} = _mm256_add_epi32({acc[i][v]}, _mm256_madd_epi16(x, b{v})); "
                    f'__asm__("" : "+x"({acc[i][v]}));'
                    for v in range(nv)
                ]
            body.append(
                f"  x = {pre}_set1_epi32((int)polyc_load32(a + {a_offset + i * group_bytes})); " + " ".join(ops)
            )
        return body + ["}"]

    unroll = UNROLL[block.isa]
    lines.append("    int64_t q = 0;")
    if unroll > 1:
        lines.append(
            f"    for (; q + {unroll} <= kg; q += {unroll}, a += {unroll * mr * group_bytes}, b += {unroll * b_bytes}) {{"
        )
        for step in range(unroll):
            lines += ["        " + line for line in group(step)]
        lines.append("    }")
    lines.append(f"    for (; q < kg; q++, a += {mr * group_bytes}, b += {b_bytes}) {{")
    lines += ["        " + line for line in group(0)]
    lines.append("    }")
    lines += _vector_write_back(block, acc, vec, pre, load, store, bits)
    lines.append("}")
    return "\n".join(lines)


def _vector_write_back(block: IntegerBlock, acc, vec: str, pre: str, load: str, store: str, bits: int) -> list[str]:
    """The end of an x86 micro-kernel: a whole-width block whose columns are contiguous in C is
    corrected and written with vector loads and stores, row by row; others through a buffer
    (``polyc_write_block``)."""
    mr, nr, lanes = block.mr, block.nr, block.lanes
    nv = nr // lanes
    lines = [
        f"    if (unit && nr == {nr}) {{",
        "        if (corrected) {",
        "            const int32_t *restrict at = (const int32_t *)ap, *restrict bt = (const int32_t *)bp;",
    ]
    for v in range(nv):
        lines += [
            "            {",
            f"                const {vec} zb = {load.format(p=f'bt + {v * lanes}')}, "
            f"cs = {load.format(p=f'bt + {nr + v * lanes}')};",
        ]
        for i in range(mr):
            lines.append(
                f"                {acc[i][v]} = {pre}_sub_epi32({acc[i][v]}, {pre}_add_epi32("
                f"{pre}_mullo_epi32({pre}_set1_epi32(at[{mr + i}]), zb), {pre}_mullo_epi32({pre}_set1_epi32(at[{i}]), cs)));"
            )
        lines.append("            }")
    lines += ["        }", "        int32_t *restrict base = c + c_n[0];"]
    for i in range(mr):
        guard = "" if i == 0 else f"if (mr > {i}) "
        body = [f"int32_t *restrict row = base + c_m[{i}];"]
        body += [
            f"if (beta) {acc[i][v]} = {pre}_add_epi32({load.format(p=f'row + {v * lanes}')}, {acc[i][v]});"
            for v in range(nv)
        ]
        body += [store.format(p=f"row + {v * lanes}", v=acc[i][v]) + ";" for v in range(nv)]
        lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    lines += ["    } else {", f"        int32_t block[{mr * nr}] __attribute__((aligned(64)));"]
    for i in range(mr):
        lines.append(
            "        " + " ".join(store.format(p=f"block + {i * nr + v * lanes}", v=acc[i][v]) + ";" for v in range(nv))
        )
    lines += ["        polyc_write_block(block, ap, bp, c, c_m, c_n, mr, nr, beta, corrected);", "    }"]
    return lines


def _neon_kernel(block: IntegerBlock) -> str:
    """An MR x NR micro-kernel in arm_neon.h intrinsics (AArch64): ``sdot`` by lanes
    (``vdotq_laneq_s32``) on groups of four signed bytes, each lane one row of A; or, without
    the dot product, ``smlal``/``smlal2`` by lanes on int16 (``vmlal_laneq_s16``)."""
    mr, nr, lanes = block.mr, block.nr, block.lanes
    nv = nr // lanes
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [
        f"/* {mr} x {nr} block ({block.isa}): C[c_m[i] + c_n[j]] (+)= sum over the K block of A(i, k) * B(k, j),",
        "   corrected for the zero points (see polyc_write_block). */",
        _KERNEL_SIGNATURE,
        "{",
    ]
    for row in acc:
        lines.append("    int32x4_t " + ", ".join(f"{name} = vdupq_n_s32(0)" for name in row) + ";")
    if block.isa == "neon_dotprod":
        lines += [
            "    const int8_t *restrict a = (const int8_t *)(ap + POLYC_A_TAIL);",
            "    const int8_t *restrict b = (const int8_t *)(bp + POLYC_B_TAIL);",
            f"    for (int64_t q = 0; q < kg; q++, a += {mr * 4}, b += {nr * 4}) {{",
            "        const int8x16_t " + ", ".join(f"b{v} = vld1q_s8(b + {16 * v})" for v in range(nv)) + ";",
            "        const int8x16_t " + ", ".join(f"a{x} = vld1q_s8(a + {16 * x})" for x in range(mr // 4)) + ";",
        ]
        for i in range(mr):
            lines.append(
                "        "
                + " ".join(f"{acc[i][v]} = vdotq_laneq_s32({acc[i][v]}, b{v}, a{i // 4}, {i % 4});" for v in range(nv))
            )
    else:
        lines += [
            "    const int16_t *restrict a = (const int16_t *)(ap + POLYC_A_TAIL);",
            "    const int16_t *restrict b = (const int16_t *)(bp + POLYC_B_TAIL);",
            f"    for (int64_t q = 0; q < kg; q++, a += {mr}, b += {nr}) {{",
            "        const int16x8_t " + ", ".join(f"b{v} = vld1q_s16(b + {8 * v})" for v in range(nv // 2)) + ";",
            "        const int16x8_t av = vld1q_s16(a);",
        ]
        for i in range(mr):
            ops = []
            for v in range(nv):
                source = f"b{v // 2}"
                if v % 2 == 0:
                    ops.append(f"{acc[i][v]} = vmlal_laneq_s16({acc[i][v]}, vget_low_s16({source}), av, {i});")
                else:
                    ops.append(f"{acc[i][v]} = vmlal_high_laneq_s16({acc[i][v]}, {source}, av, {i});")
            lines.append("        " + " ".join(ops))
    lines.append("    }")
    lines += [
        f"    if (unit && nr == {nr}) {{",
        "        if (corrected) {",
        "            const int32_t *restrict at = (const int32_t *)ap, *restrict bt = (const int32_t *)bp;",
    ]
    for v in range(nv):
        lines += [
            "            {",
            f"                const int32x4_t zb = vld1q_s32(bt + {v * lanes}), cs = vld1q_s32(bt + {nr + v * lanes});",
        ]
        for i in range(mr):
            lines.append(
                f"                {acc[i][v]} = vsubq_s32({acc[i][v]}, vaddq_s32(vmulq_n_s32(zb, at[{mr + i}]), "
                f"vmulq_n_s32(cs, at[{i}])));"
            )
        lines.append("            }")
    lines += ["        }", "        int32_t *restrict base = c + c_n[0];"]
    for i in range(mr):
        guard = "" if i == 0 else f"if (mr > {i}) "
        body = [f"int32_t *restrict row = base + c_m[{i}];"]
        body += [f"if (beta) {acc[i][v]} = vaddq_s32(vld1q_s32(row + {v * lanes}), {acc[i][v]});" for v in range(nv)]
        body += [f"vst1q_s32(row + {v * lanes}, {acc[i][v]});" for v in range(nv)]
        lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    lines += ["    } else {", f"        int32_t block[{mr * nr}] __attribute__((aligned(16)));"]
    for i in range(mr):
        lines.append("        " + " ".join(f"vst1q_s32(block + {i * nr + v * lanes}, {acc[i][v]});" for v in range(nv)))
    lines += ["        polyc_write_block(block, ap, bp, c, c_m, c_n, mr, nr, beta, corrected);", "    }", "}"]
    return "\n".join(lines)


def _portable_kernel(block: IntegerBlock) -> str:
    """An MR x NR micro-kernel in C: int16 values, int32 sums; the compiler vectorises the
    inner loop."""
    return f"""/* {block.mr} x {block.nr} block in portable C. */
{_KERNEL_SIGNATURE}
{{
    (void)unit;
    const int16_t *restrict a = (const int16_t *)(ap + POLYC_A_TAIL);
    const int16_t *restrict b = (const int16_t *)(bp + POLYC_B_TAIL);
    int32_t block[MR * NR] __attribute__((aligned(64)));
    for (int64_t x = 0; x < MR * NR; x++) block[x] = 0;
    for (int64_t q = 0; q < kg; q++, a += MR, b += NR)
        for (int64_t i = 0; i < MR; i++) {{
            const int32_t value = a[i];
            #pragma omp simd
            for (int64_t j = 0; j < NR; j++)
                block[i * NR + j] += value * (int32_t)b[j];
        }}
    polyc_write_block(block, ap, bp, c, c_m, c_n, mr, nr, beta, corrected);
}}"""


#: The writer of each instruction set's micro-kernel.
_MICRO_KERNELS = {
    "avx512vnni": _x86_kernel,
    "avxvnni": _x86_kernel,
    "avx2": _x86_kernel,
    "neon_dotprod": _neon_kernel,
    "neon": _neon_kernel,
    "portable": _portable_kernel,
}


__all__ = ["BLOCKS", "IntegerBlock", "block_sizes", "generate_integer_gemm"]
