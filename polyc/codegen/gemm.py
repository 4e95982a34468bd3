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
            for jr in NC by NR                 (one B sliver: KC x NR in L1)
              for ir in MC by MR
                micro-kernel: MR x NR block of C in vector registers, += over KC,
                then C = block (first KC block of a `+=!`: beta 0) or C += block (beta 1);
                after the last KC block, the epilogue statements on the finished block.

Addresses are never assumed: for every flat index of a group the kernel tabulates its offset
in each tensor (``a_m[m]``, ``c_n[n]``, ...), so permuted and multi-index groups need no
transposition.  Packing and the write-back take the contiguous fast path where a sliver's
offsets step by one, and a gather/scatter path elsewhere.  Partial MR x NR blocks at the edges
are computed in full from zero-padded packed slivers and written back under masks (or element
by element): nothing outside the tensors is read or written.

The micro-kernel is chosen by the C preprocessor, so one source serves every machine:
AVX-512 (``__AVX512F__``: MR x NR = 6 x 64 float, 6 x 32 double), AVX2 with FMA
(6 x 16, 6 x 8), or portable C with ``#pragma omp simd`` (4 x 16, 4 x 8); ``vectorize=False``
selects the portable one everywhere.  Block sizes come from :func:`polyc.schedule.tiling.cache_sizes`
(KC so that a B sliver and an A sliver fill part of L1, MC so that the A panel fills half of L2,
NC so that the B panel fills half of L3, capped); ``options.tile_sizes`` with three or more
entries overrides them as ``(MC, NC, KC)`` (rounded to multiples of MR and NR).

Threads: with ``parallel=True``, batches are shared out when there are enough of them, else
the rows (or, for short and wide products, the column slivers) of each product.  Packing
buffers are allocated once per call with ``aligned_alloc`` and freed before returning.  The
function returns 0, or 2 when memory for the buffers could not be allocated.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from polyc.codegen.c import _C_KEYWORDS, _combine, _extent_name, GeneratedKernel
from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_type
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options
from polyc.schedule import tiling
from polyc.schedule.contraction import Contraction

#: The return value when packing buffers or offset tables cannot be allocated.
STATUS_OUT_OF_MEMORY = 2

#: Below this many multiply-adds a contraction runs on one thread (a parallel region costs more).
_PARALLEL_THRESHOLD = 96 * 96 * 96


@dataclass(frozen=True)
class MicroKernelShape:
    """The register block of one instruction set: MR rows by ``vectors`` vectors of ``lanes``."""

    isa: str
    guard: str
    lanes: int
    mr: int
    vectors: int

    @property
    def nr(self) -> int:
        return self.lanes * self.vectors


def micro_kernel_shapes(dtype: np.dtype) -> tuple[MicroKernelShape, ...]:
    """The instruction sets a kernel supports, best first, with their register blocks."""
    per_512_bits = 64 // np.dtype(dtype).itemsize  # elements in 512 bits: 16 float, 8 double
    return (
        MicroKernelShape("avx512", "defined(__AVX512F__)", per_512_bits, 6, 4),
        MicroKernelShape("avx2", "defined(__AVX2__) && defined(__FMA__)", per_512_bits // 2, 6, 2),
        MicroKernelShape("portable", "1", per_512_bits // 2, 4, 2),
    )


def block_sizes(shape: MicroKernelShape, itemsize: int, tile_sizes: tuple[int, ...] | None) -> tuple[int, int, int]:
    """(MC, NC, KC) for a register block: from ``tile_sizes`` (MC, NC, KC) when it has three
    entries, else from the cache model (see the module docstring)."""
    mr, nr = shape.mr, shape.nr
    if tile_sizes is not None and len(tile_sizes) >= 3:
        mc, nc, kc = tile_sizes[:3]
    else:
        # The A sliver (MR x KC) takes a quarter of L1, the A panel (MC x KC) a quarter of L2
        # (the streamed B sliver and C blocks share the rest), the B panel half of L3.
        caches = tiling.cache_sizes()
        l1, l2, l3 = caches.get(1, 32 * 1024), caches.get(2, 1 << 20), caches.get(3, 8 << 20)
        kc = max(64, (l1 // 4) // (mr * itemsize) // 16 * 16)
        mc = (l2 // 4) // (kc * itemsize)
        nc = min(4096, (l3 // 2) // (kc * itemsize))
    mc = max(mr, mc // mr * mr)
    nc = max(nr, nc // nr * nr)
    return mc, nc, max(1, kc)


def generate_gemm(program: PolyProgram, contraction: Contraction, options: Options) -> GeneratedKernel:
    """The C translation unit computing ``program`` (one contraction and its epilogues)."""
    return _GemmWriter(program, contraction, options).write()


class _GemmWriter:
    def __init__(self, program: PolyProgram, contraction: Contraction, options: Options):
        self.program = program
        self.definition = program.definition
        self.contraction = contraction
        self.options = options
        self.specialised = program.size_values is not None
        self.dtype = contraction.dtype
        self.ctype = c_type(self.dtype)
        tensor_names = {t.name for t in self.definition.tensors}
        self.size_c = {p: (f"{p}_size" if p in tensor_names or p in _C_KEYWORDS else p) for p in program.params}

    # ------------------------------------------------------------------ top level
    def write(self) -> GeneratedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [self.header(), PRELUDE, self.configuration(), self.context_struct(), _packing(self.ctype),
                 self.micro_kernels(), self.epilogue_function(), _driver_loops(self.ctype, self.options.parallel),
                 self.entry_function(name, sizes), ""]
        return GeneratedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes)

    def header(self) -> str:
        o = self.options
        c = self.contraction
        sizes = ", ".join(f"{k}={v}" for k, v in self.program.size_values.items()) if self.specialised \
            else "parametric"
        lines = [f"polyc gemm kernel for def '{self.definition.name}' (BLIS structure: packing, "
                 f"cache blocks, register micro-kernel)",
                 f"sizes: {sizes}",
                 f"options: tile_sizes={o.tile_sizes} parallel={o.parallel} vectorize={o.vectorize} "
                 f"specialize={o.specialize}",
                 f"contraction: {c.describe()}"]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */"

    def configuration(self) -> str:
        """Includes, and the register block and cache blocks of each instruction set."""
        lines = ["#ifdef _OPENMP", "#include <omp.h>", "#endif"] if self.options.parallel else []
        if not self.options.vectorize:
            lines.append("#define POLYC_GEMM_PORTABLE 1")
        for position, shape in enumerate(micro_kernel_shapes(self.dtype)):
            guard = shape.guard if shape.isa == "portable" else f"!defined(POLYC_GEMM_PORTABLE) && {shape.guard}"
            keyword = "#if" if position == 0 else "#elif" if shape.isa != "portable" else "#else"
            lines.append(keyword if keyword == "#else" else f"{keyword} {guard}")
            if shape.isa != "portable":
                lines.append("#include <immintrin.h>")
            mc, nc, kc = block_sizes(shape, self.dtype.itemsize, self.options.tile_sizes)
            lines += [f'#define POLYC_GEMM_ISA "{shape.isa}"',
                      f"#define POLYC_GEMM_{shape.isa.upper()} 1",
                      f"#define POLYC_MR {shape.mr}", f"#define POLYC_NR {shape.nr}",
                      f"#define POLYC_MC {mc}", f"#define POLYC_NC {nc}", f"#define POLYC_KC {kc}"]
        lines.append("#endif")
        return "\n".join(lines)

    # ------------------------------------------------------------------ the context record
    def epilogue_tensors(self) -> list[str]:
        """Tensors the epilogue reads or writes, in signature order."""
        used = {self.contraction.target.tensor} if self.contraction.epilogues else set()
        for statement in self.contraction.epilogues:
            used |= {read.tensor for read in ir.reads(statement.rhs)}
        return [t.name for t in self.definition.tensors if t.name in used]

    def multi_index_groups(self) -> list[tuple[str, ...]]:
        c = self.contraction
        return [g for g in (c.batch, c.m, c.n) if len(g) > 1] if c.epilogues else []

    def context_struct(self) -> str:
        t = self.ctype
        fields = [f"const {t} *a", f"const {t} *b", f"{t} *c",
                  "int64_t m, n, k, nbatch",
                  "const int64_t *a_m, *a_k, *b_k, *b_n, *c_m, *c_n, *a_batch, *b_batch, *c_batch",
                  "const unsigned char *a_m_unit, *b_n_unit, *c_n_unit",
                  "int a_k_unit, b_k_unit"]
        for name in self.epilogue_tensors():
            tensor = self.definition.tensor(name)
            qualifier = "const " if tensor.role is ir.Role.INPUT else ""
            fields.append(f"{qualifier}{c_type(tensor.dtype)} *t_{name}")
        if self.contraction.epilogues and not self.specialised:
            fields += [f"int64_t s_{self.size_c[s]}" for s in self.definition.sizes]
        for group in self.multi_index_groups():
            fields += [f"const int64_t *ix_{index}" for index in group]
        body = "\n".join(f"    {f};" for f in fields)
        return ("/* Everything the loops need: operands, flattened extents, and for each flat index of a\n"
                "   group its offset in each tensor (a_m[m]: offset in A of row m, ...). */\n"
                f"typedef struct {{\n{body}\n}} polyc_gemm_t;")

    # ------------------------------------------------------------------ micro-kernels
    def micro_kernels(self) -> str:
        pieces = []
        for position, shape in enumerate(micro_kernel_shapes(self.dtype)):
            if shape.isa == "portable":
                pieces += ["#else", _portable_micro_kernel(self.ctype)]
            else:
                pieces += [f"{'#if' if position == 0 else '#elif'} defined(POLYC_GEMM_{shape.isa.upper()})",
                           _vector_micro_kernel(shape, self.dtype)]
        pieces.append("#endif")
        return _typed(_SCATTER, self.ctype) + "\n" + "\n".join(pieces)

    # ------------------------------------------------------------------ epilogue
    def epilogue_function(self) -> str:
        c = self.contraction
        if not c.epilogues:
            return "#define POLYC_HAS_EPILOGUE 0\n" \
                   "static void polyc_epilogue(const polyc_gemm_t *g, int64_t bt, int64_t m0, int64_t mr, " \
                   "int64_t n0, int64_t nr) { (void)g; (void)bt; (void)m0; (void)mr; (void)n0; (void)nr; }"
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
        inner = values(c.n, "polyc_nj")
        for statement in c.epilogues:
            inner.append(self.epilogue_statement(statement) + ";")
        simd = ["#pragma omp simd"] if self.options.vectorize else []
        body += ["for (int64_t polyc_mi = polyc_m0; polyc_mi < polyc_m0 + polyc_mr; polyc_mi++) {",
                 *("    " + line for line in values(c.m, "polyc_mi")),
                 *("    " + line for line in simd),
                 "    for (int64_t polyc_nj = polyc_n0; polyc_nj < polyc_n0 + polyc_nr; polyc_nj++) {",
                 *("        " + line for line in inner),
                 "    }", "}"]
        return ("#define POLYC_HAS_EPILOGUE 1\n"
                "/* The statements after the contraction, on one finished block of the target. */\n"
                "static void polyc_epilogue(const polyc_gemm_t *polyc_g, int64_t polyc_bt, int64_t polyc_m0, "
                "int64_t polyc_mr, int64_t polyc_n0, int64_t polyc_nr)\n{\n" + "\n".join("    " + line for line in body) + "\n}")

    def epilogue_statement(self, statement: ir.CheckedStatement) -> str:
        c = self.contraction
        index_c = {mine: f"polyc_ix_{theirs}" for mine, theirs in zip(statement.indices, c.target.indices)}
        target = self.definition.tensor(statement.target)
        lhs = self.element(statement.target, [index_c[i] for i in statement.indices])
        printer = CExpressionPrinter(
            access=lambda read, subscripts: self.element(read.tensor, subscripts),
            index=lambda n: index_c[n] if n in index_c else self.size_c[n],
            size=lambda value: value.to_c(lambda n: self.size_c[n]),
        )
        value = printer.to_c(statement.rhs)
        if statement.op == "=":
            return f"{lhs} = {value}"
        return f"{lhs} = {_combine(statement.op, target.dtype, lhs, value, c_type(target.dtype))}"

    def element(self, tensor_name: str, subscripts: list[str]) -> str:
        tensor = self.definition.tensor(tensor_name)
        if tensor.rank == 0:
            return f"{tensor_name}[0]"
        offset = ""
        for dim, subscript in enumerate(subscripts):
            offset = f"({subscript})" if dim == 0 else f"({offset} * {_extent_name(tensor_name, dim)} + ({subscript}))"
        return f"{tensor_name}[{offset}]"

    def size_declarations(self, parametric_value) -> list[str]:
        """``const int64_t`` declarations of the sizes and of every tensor extent."""
        lines = []
        for s in self.definition.sizes:
            value = self.program.size_values[s] if self.specialised else parametric_value(s)
            if value is not None:
                lines.append(f"const int64_t {self.size_c[s]} = {value};")
        for t in self.definition.tensors:
            for dim, extent in enumerate(t.shape):
                lines.append(f"const int64_t {_extent_name(t.name, dim)} = {self.size_expr(extent)};")
        lines += [f"(void){_extent_name(t.name, dim)};" for t in self.definition.tensors for dim in range(t.rank)]
        return lines

    def size_expr(self, value: Affine) -> str:
        return value.to_c(lambda name: self.size_c[name])

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        d, c = self.definition, self.contraction
        arguments = []
        for t in d.tensors:
            qualified = f"const {c_type(t.dtype)}" if t.role is ir.Role.INPUT else c_type(t.dtype)
            arguments.append(f"{qualified} *restrict {t.name}")
        arguments += [f"int64_t {self.size_c[s]}" for s in sizes]
        body = self.size_declarations(lambda s: None)

        def product(group: tuple[str, ...]) -> str:
            return " * ".join(f"({self.size_expr(c.extent(i))})" for i in group) or "1"

        groups = {"batch": c.batch, "m": c.m, "n": c.n, "k": c.k}
        tables = {"batch": ("a_batch", "b_batch", "c_batch"), "m": ("a_m", "c_m"), "n": ("b_n", "c_n"),
                  "k": ("a_k", "b_k")}
        operand_of = {"a": c.a, "b": c.b, "c": c.target}
        for group in groups:
            body.append(f"const int64_t polyc_{group} = {product(groups[group])};")
        body += ["if (polyc_batch == 0 || polyc_m == 0 || polyc_n == 0) return 0;"]
        # One allocation holds every offset table; index value tables for the epilogue follow.
        layout = [(table, group) for group in groups for table in tables[group]]
        layout += [(f"ix_{index}", group) for group in ("batch", "m", "n") for index in groups[group]
                   if groups[group] in self.multi_index_groups()]
        total = " + ".join(f"polyc_{group}" for _, group in layout)
        body += [f"int64_t *polyc_tables = (int64_t *)malloc(sizeof(int64_t) * (size_t)({total}));",
                 "unsigned char *polyc_units = (unsigned char *)malloc((size_t)(polyc_m / POLYC_MR + "
                 "2 * (polyc_n / POLYC_NR) + 3));",
                 f"if (polyc_tables == NULL || polyc_units == NULL) {{ free(polyc_tables); free(polyc_units); "
                 f"return {STATUS_OUT_OF_MEMORY}; }}",
                 "int64_t *polyc_next = polyc_tables;"]
        for table, group in layout:
            body += [f"int64_t *polyc_{table} = polyc_next;", f"polyc_next += polyc_{group};"]
        for group, indices in groups.items():
            body += self.fill_tables(group, indices, tables[group], operand_of)
        body += [
            "polyc_gemm_t polyc_g;",
            "memset(&polyc_g, 0, sizeof polyc_g);",
            "polyc_g.a = " + c.a.tensor + "; polyc_g.b = " + c.b.tensor + "; polyc_g.c = " + c.target.tensor + ";",
            "polyc_g.m = polyc_m; polyc_g.n = polyc_n; polyc_g.k = polyc_k; polyc_g.nbatch = polyc_batch;",
        ]
        body += [f"polyc_g.{table} = polyc_{table};" for table, _ in layout]
        body += [
            "unsigned char *polyc_a_m_unit = polyc_units, *polyc_b_n_unit = polyc_units + polyc_m / POLYC_MR + 1;",
            "unsigned char *polyc_c_n_unit = polyc_b_n_unit + polyc_n / POLYC_NR + 1;",
            "polyc_mark_unit(polyc_a_m, polyc_m, POLYC_MR, polyc_a_m_unit);",
            "polyc_mark_unit(polyc_b_n, polyc_n, POLYC_NR, polyc_b_n_unit);",
            "polyc_mark_unit(polyc_c_n, polyc_n, POLYC_NR, polyc_c_n_unit);",
            "polyc_g.a_m_unit = polyc_a_m_unit; polyc_g.b_n_unit = polyc_b_n_unit; polyc_g.c_n_unit = polyc_c_n_unit;",
            "polyc_g.a_k_unit = polyc_is_unit(polyc_a_k, polyc_k); polyc_g.b_k_unit = polyc_is_unit(polyc_b_k, polyc_k);",
        ]
        for tensor in self.epilogue_tensors():
            body.append(f"polyc_g.t_{tensor} = {tensor};")
        if c.epilogues and not self.specialised:
            body += [f"polyc_g.s_{self.size_c[s]} = {self.size_c[s]};" for s in d.sizes]
        body += [f"const int polyc_status = polyc_gemm_run(&polyc_g, {1 if c.init else 0});",
                 "free(polyc_tables);", "free(polyc_units);", "return polyc_status;"]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    def fill_tables(self, group: str, indices: tuple[str, ...], tables: tuple[str, ...], operand_of) -> list[str]:
        """C filling the offset tables of one group (and its index value tables)."""
        c = self.contraction
        if not indices:
            return [f"polyc_{table}[0] = 0;" for table in tables]
        lines = [f"for (int64_t polyc_f = 0; polyc_f < polyc_{group}; polyc_f++) {{"]
        if len(indices) == 1:
            lines.append(f"    const int64_t polyc_v_{indices[0]} = polyc_f;")
        else:
            lines.append("    int64_t polyc_rest = polyc_f;")
            for index in reversed(indices[1:]):
                extent = self.size_expr(c.extent(index))
                lines += [f"    const int64_t polyc_v_{index} = polyc_rest % ({extent});",
                          f"    polyc_rest /= ({extent});"]
            lines.append(f"    const int64_t polyc_v_{indices[0]} = polyc_rest;")
        for table in tables:
            operand = operand_of[table[0]]
            terms = [f"polyc_v_{index} * {self.stride(operand.tensor, operand.indices.index(index))}"
                     for index in indices]
            lines.append(f"    polyc_{table}[polyc_f] = {' + '.join(terms)};")
        if len(indices) > 1 and indices in self.multi_index_groups():
            lines += [f"    polyc_ix_{index}[polyc_f] = polyc_v_{index};" for index in indices]
        lines.append("}")
        return lines

    def stride(self, tensor_name: str, dim: int) -> str:
        tensor = self.definition.tensor(tensor_name)
        factors = [_extent_name(tensor_name, d) for d in range(dim + 1, tensor.rank)]
        return "(" + " * ".join(factors) + ")" if factors else "1"


# ----------------------------------------------------------------------------- fixed C text
def _typed(template: str, ctype: str) -> str:
    """``template`` with the element type for every word ``T``."""
    return re.sub(r"\bT\b", ctype, template)


_SCATTER = r"""
/* Whether offsets[i] == offsets[0] + i over each run of `width` (one flag per run). */
static void polyc_mark_unit(const int64_t *offsets, int64_t count, int64_t width, unsigned char *flags)
{
    for (int64_t s = 0; s * width < count; s++) {
        const int64_t start = s * width, end = polyc_min(count, start + width);
        unsigned char unit = 1;
        for (int64_t i = start + 1; i < end; i++)
            unit &= offsets[i] == offsets[start] + (i - start);
        flags[s] = unit;
    }
}

static int polyc_is_unit(const int64_t *offsets, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (offsets[i] != i) return 0;
    return 1;
}

/* Writes an mr x nr block (row stride POLYC_NR in `block`) to C at offsets c_m[i] + c_n[j]. */
static void polyc_scatter(const T *restrict block, T *restrict c, const int64_t *restrict c_m,
                          const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta)
{
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            T *restrict p = c + c_m[i] + c_n[j];
            *p = beta ? *p + block[i * POLYC_NR + j] : block[i * POLYC_NR + j];
        }
}
"""


def _packing(ctype: str) -> str:
    return _typed(r"""
/* A[ic:ic+mc, pc:pc+kc] into MR-tall slivers: sliver s holds rows ic+s*MR.., element (i, k) at
   [s*MR*kc + k*MR + i]; rows past the end are zero. */
static void polyc_pack_a(const polyc_gemm_t *restrict g, const T *restrict a, int64_t ic, int64_t mc,
                         int64_t pc, int64_t kc, T *restrict dst)
{
    const int64_t *restrict a_k = g->a_k + pc;
    for (int64_t ir = 0; ir < mc; ir += POLYC_MR, dst += POLYC_MR * kc) {
        const int64_t rows = polyc_min(POLYC_MR, mc - ir);
        const int64_t *restrict a_m = g->a_m + ic + ir;
        if (rows == POLYC_MR && g->a_m_unit[(ic + ir) / POLYC_MR]) {
            const T *restrict src = a + a_m[0];
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = 0; i < POLYC_MR; i++)
                    dst[k * POLYC_MR + i] = src[a_k[k] + i];
            continue;
        }
        if (g->a_k_unit) {
            for (int64_t i = 0; i < rows; i++) {
                const T *restrict src = a + a_m[i] + pc;
                for (int64_t k = 0; k < kc; k++)
                    dst[k * POLYC_MR + i] = src[k];
            }
        } else {
            for (int64_t k = 0; k < kc; k++)
                for (int64_t i = 0; i < rows; i++)
                    dst[k * POLYC_MR + i] = a[a_m[i] + a_k[k]];
        }
        for (int64_t k = 0; k < kc; k++)
            for (int64_t i = rows; i < POLYC_MR; i++)
                dst[k * POLYC_MR + i] = 0;
    }
}

/* B[pc:pc+kc, j0:j0+cols] (cols <= NR) into one NR-wide sliver: element (k, j) at [k*NR + j];
   columns past the end are zero. */
static void polyc_pack_b(const polyc_gemm_t *restrict g, const T *restrict b, int64_t pc, int64_t kc,
                         int64_t j0, int64_t cols, T *restrict dst)
{
    const int64_t *restrict b_k = g->b_k + pc;
    const int64_t *restrict b_n = g->b_n + j0;
    if (cols == POLYC_NR && g->b_n_unit[j0 / POLYC_NR]) {
        const T *restrict src = b + b_n[0];
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < POLYC_NR; j++)
                dst[k * POLYC_NR + j] = src[b_k[k] + j];
        return;
    }
    if (g->b_k_unit) {
        for (int64_t j = 0; j < cols; j++) {
            const T *restrict src = b + b_n[j] + pc;
            for (int64_t k = 0; k < kc; k++)
                dst[k * POLYC_NR + j] = src[k];
        }
    } else {
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < cols; j++)
                dst[k * POLYC_NR + j] = b[b_k[k] + b_n[j]];
    }
    for (int64_t k = 0; k < kc; k++)
        for (int64_t j = cols; j < POLYC_NR; j++)
            dst[k * POLYC_NR + j] = 0;
}
""", ctype)


_VECTOR_SPELLINGS = {
    # isa, element size -> vector type, intrinsic prefix, suffix
    ("avx512", 4): ("__m512", "_mm512", "ps"),
    ("avx512", 8): ("__m512d", "_mm512", "pd"),
    ("avx2", 4): ("__m256", "_mm256", "ps"),
    ("avx2", 8): ("__m256d", "_mm256", "pd"),
}


def _vector_micro_kernel(shape: MicroKernelShape, dtype: np.dtype) -> str:
    """An MR x NR micro-kernel in AVX-512 or AVX2 intrinsics, unrolled over the register block.

    The block accumulates in MR x ``vectors`` registers; the write-back uses masked vector
    loads and stores per row when the block's columns are contiguous in C (``unit``), else it
    goes through a buffer and :c:func:`polyc_scatter`.
    """
    itemsize = np.dtype(dtype).itemsize
    ctype = c_type(dtype)
    vec, pre, suffix = _VECTOR_SPELLINGS[(shape.isa, itemsize)]
    mr, nv, lanes = shape.mr, shape.vectors, shape.lanes
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(mr)]
    lines = [f"static inline void polyc_micro_kernel(int64_t kc, const {ctype} *restrict ap, const {ctype} *restrict bp,",
             f"                                      {ctype} *restrict c, const int64_t *restrict c_m,",
             "                                      const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta,",
             "                                      int unit)",
             "{"]
    for row in acc:
        lines.append(f"    {vec} " + ", ".join(f"{name} = {pre}_setzero_{suffix}()" for name in row) + ";")
    # The block of C is read after the loop: start fetching its rows now (C may be far in memory).
    lines += ["    if (unit)",
              "        for (int64_t i = 0; i < mr; i++) {",
              f"            _mm_prefetch((const char *)(c + c_n[0] + c_m[i]), _MM_HINT_T0);",
              f"            _mm_prefetch((const char *)(c + c_n[0] + c_m[i] + nr - 1), _MM_HINT_T0);",
              "        }"]
    lines += ["    for (int64_t k = 0; k < kc; k++, ap += POLYC_MR, bp += POLYC_NR) {",
              f"        const {vec} " + ", ".join(f"b{v} = {pre}_load_{suffix}(bp + {v * lanes})" for v in range(nv)) + ";",
              f"        {vec} a;"]
    for i in range(mr):
        fmas = " ".join(f"{acc[i][v]} = {pre}_fmadd_{suffix}(a, b{v}, {acc[i][v]});" for v in range(nv))
        lines.append(f"        a = {pre}_set1_{suffix}(ap[{i}]); {fmas}")
    lines += ["    }", "    if (unit) {", f"        {ctype} *restrict base = c + c_n[0];"]
    if shape.isa == "avx512":
        mask_type = "__mmask16" if lanes == 16 else "__mmask8"
        lines += [f"        const {mask_type} k{v} = ({mask_type})polyc_lane_mask(nr - {v * lanes}, {lanes});"
                  for v in range(nv)]
        load = f"{pre}_maskz_loadu_{suffix}(k{{v}}, row + {{offset}})"
        store = f"{pre}_mask_storeu_{suffix}(row + {{offset}}, k{{v}}, {{value}});"
    else:
        bits = 32 if lanes == 8 else 64
        set1 = "_mm256_set1_epi32((int)" if bits == 32 else "_mm256_set1_epi64x((long long)"
        iota = f"_mm256_setr_epi32({', '.join(map(str, range(8)))})" if bits == 32 else "_mm256_setr_epi64x(0, 1, 2, 3)"
        lines += [f"        const __m256i k{v} = _mm256_cmpgt_epi{bits}({set1}polyc_max(0, polyc_min({lanes}, nr - {v * lanes}))), "
                  f"{iota});" for v in range(nv)]
        load = f"{pre}_maskload_{suffix}(row + {{offset}}, k{{v}})"
        store = f"{pre}_maskstore_{suffix}(row + {{offset}}, k{{v}}, {{value}});"
    for i in range(mr):
        guard = "" if i == 0 else f"if (mr > {i}) "
        body = [f"{ctype} *restrict row = base + c_m[{i}];"]
        body += [f"if (beta) {acc[i][v]} = {pre}_add_{suffix}({load.format(v=v, offset=v * lanes)}, {acc[i][v]});"
                 for v in range(nv)]
        body += [store.format(v=v, offset=v * lanes, value=acc[i][v]) for v in range(nv)]
        lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    lines += ["    } else {", f"        {ctype} block[POLYC_MR * POLYC_NR] __attribute__((aligned(64)));"]
    for i in range(mr):
        lines.append("        " + " ".join(f"{pre}_store_{suffix}(block + {i * shape.nr + v * lanes}, {acc[i][v]});"
                                           for v in range(nv)))
    lines += ["        polyc_scatter(block, c, c_m, c_n, mr, nr, beta);", "    }", "}"]
    helpers = r"""
/* The lowest min(max(n, 0), lanes) bits set. */
static inline uint32_t polyc_lane_mask(int64_t n, int lanes)
{
    return n >= lanes ? (uint32_t)((1ull << lanes) - 1) : n <= 0 ? 0u : (uint32_t)((1u << n) - 1);
}
"""
    return helpers + "\n".join(lines)


def _portable_micro_kernel(ctype: str) -> str:
    return _typed(r"""
static inline void polyc_micro_kernel(int64_t kc, const T *restrict ap, const T *restrict bp,
                                      T *restrict c, const int64_t *restrict c_m,
                                      const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta,
                                      int unit)
{
    (void)unit;
    T block[POLYC_MR * POLYC_NR] __attribute__((aligned(64)));
    for (int64_t x = 0; x < POLYC_MR * POLYC_NR; x++) block[x] = 0;
    for (int64_t k = 0; k < kc; k++, ap += POLYC_MR, bp += POLYC_NR)
        for (int64_t i = 0; i < POLYC_MR; i++) {
            const T a = ap[i];
            #pragma omp simd
            for (int64_t j = 0; j < POLYC_NR; j++)
                block[i * POLYC_NR + j] += a * bp[j];
        }
    polyc_scatter(block, c, c_m, c_n, mr, nr, beta);
}""", ctype)


def _driver_loops(ctype: str, parallel: bool) -> str:
    """The loops around the micro-kernel; without ``parallel``, no OpenMP in them."""
    text = _typed(r"""
static int64_t polyc_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

static T *polyc_alloc(int64_t elements)
{
    size_t bytes = (size_t)polyc_round_up(elements > 0 ? elements : 1, 64) * sizeof(T);
    bytes = (bytes + 63) / 64 * 64;
    return (T *)aligned_alloc(64, bytes);
}

/* How one product is shared among nthr threads: rows [m_lo, m_hi) and, within each NC block,
   column slivers [s_lo, s_hi) of thread tid.  Rows are split when that balances as well as
   splitting the slivers (it needs no duplicated packing of A). */
typedef struct { int split_n; int64_t m_lo, m_hi; } polyc_share_t;

static polyc_share_t polyc_share(const polyc_gemm_t *g, int tid, int nthr)
{
    polyc_share_t share = {0, 0, g->m};
    if (nthr <= 1) return share;
    const int64_t m_slivers = (g->m + POLYC_MR - 1) / POLYC_MR;
    const int64_t n_slivers = (polyc_min(g->n, POLYC_NC) + POLYC_NR - 1) / POLYC_NR;
    const int64_t m_rounds = (m_slivers + nthr - 1) / nthr, n_rounds = (n_slivers + nthr - 1) / nthr;
    /* Compare the longest thread's share of each split, in MR x NR blocks. */
    share.split_n = n_rounds * m_slivers < m_rounds * n_slivers;
    if (!share.split_n) {
        share.m_lo = polyc_min(g->m, tid * m_rounds * POLYC_MR);
        share.m_hi = polyc_min(g->m, (tid + 1) * m_rounds * POLYC_MR);
    }
    return share;
}

/* One product (batch point bt) computed by thread tid of nthr; with nthr > 1 every thread of
   the team must call it.  When rows are shared, so is bpack: the threads pack it together,
   between barriers.  When column slivers are shared, each thread packs its own slivers into
   its own bpack (threads may be in different KC or NC blocks: they must not share it). */
static void polyc_gemm_product(const polyc_gemm_t *restrict g, int64_t bt, int init, T *restrict bpack,
                               T *restrict apack, int tid, int nthr)
{
    const T *restrict a = g->a + g->a_batch[bt];
    const T *restrict b = g->b + g->b_batch[bt];
    T *restrict c = g->c + g->c_batch[bt];
    const polyc_share_t share = polyc_share(g, tid, nthr);
    const int64_t stride = POLYC_NR * polyc_min(POLYC_KC, g->k);  /* between slivers in bpack */
    for (int64_t jc = 0; jc < g->n; jc += POLYC_NC) {
        const int64_t nc = polyc_min(POLYC_NC, g->n - jc);
        const int64_t slivers = (nc + POLYC_NR - 1) / POLYC_NR;
        int64_t s_lo = 0, s_hi = slivers;
        if (share.split_n) {
            const int64_t per = (slivers + nthr - 1) / nthr;
            s_lo = polyc_min(slivers, tid * per);
            s_hi = polyc_min(slivers, s_lo + per);
        }
        for (int64_t pc = 0; pc < g->k; pc += POLYC_KC) {
            const int64_t kc = polyc_min(POLYC_KC, g->k - pc);
            const int beta = pc > 0 || !init;
            const int last = pc + kc >= g->k;
            /* Split rows: the threads pack the shared panel together.  Split slivers: each packs its own. */
            const int64_t first = share.split_n ? s_lo : tid, step = share.split_n ? 1 : nthr;
            const int64_t end = share.split_n ? s_hi : slivers;
            for (int64_t s = first; s < end; s += step)
                polyc_pack_b(g, b, pc, kc, jc + s * POLYC_NR, polyc_min(POLYC_NR, nc - s * POLYC_NR),
                             bpack + s * stride);
#if defined(_OPENMP)
            if (nthr > 1 && !share.split_n) {
                #pragma omp barrier
            }
#endif
            for (int64_t ic = share.m_lo; ic < share.m_hi; ic += POLYC_MC) {
                const int64_t mc = polyc_min(POLYC_MC, share.m_hi - ic);
                polyc_pack_a(g, a, ic, mc, pc, kc, apack);
                for (int64_t s = s_lo; s < s_hi; s++) {
                    const int64_t jr = s * POLYC_NR, nr = polyc_min(POLYC_NR, nc - jr);
                    for (int64_t ir = 0; ir < mc; ir += POLYC_MR) {
                        const int64_t mr = polyc_min(POLYC_MR, mc - ir);
                        polyc_micro_kernel(kc, apack + ir * kc, bpack + s * stride, c, g->c_m + ic + ir,
                                           g->c_n + jc + jr, mr, nr, beta, g->c_n_unit[(jc + jr) / POLYC_NR]);
                        if (POLYC_HAS_EPILOGUE && last)
                            polyc_epilogue(g, bt, ic + ir, mr, jc + jr, nr);
                    }
                }
            }
#if defined(_OPENMP)
            if (nthr > 1 && !share.split_n) {
                #pragma omp barrier
            }
#endif
        }
    }
}

/* Every product; 0, or STATUS when the packing buffers cannot be allocated. */
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
    const int64_t a_elements = polyc_round_up(polyc_min(POLYC_MC, g->m), POLYC_MR) * polyc_min(POLYC_KC, g->k);
    const int64_t b_elements = polyc_round_up(polyc_min(POLYC_NC, g->n), POLYC_NR) * polyc_min(POLYC_KC, g->k);
    int nthr = 1;
#if defined(_OPENMP)
    if ((double)g->nbatch * (double)g->m * (double)g->n * (double)g->k >= THRESHOLD)
        nthr = omp_get_max_threads();
#endif
    if (nthr <= 1) {
        T *apack = polyc_alloc(a_elements), *bpack = polyc_alloc(b_elements);
        if (apack == NULL || bpack == NULL) { free(apack); free(bpack); return STATUS; }
        for (int64_t bt = 0; bt < g->nbatch; bt++)
            polyc_gemm_product(g, bt, init, bpack, apack, 0, 1);
        free(apack);
        free(bpack);
        return 0;
    }
#if defined(_OPENMP)
    /* Whole products per thread when there are enough of them to balance; else share each one. */
    const int by_batch = g->nbatch >= nthr && (g->nbatch % nthr == 0 || g->nbatch >= 4 * nthr);
    T *apacks = polyc_alloc(a_elements * nthr);
    T *bpacks = polyc_alloc(b_elements * nthr);
    if (apacks == NULL || bpacks == NULL) { free(apacks); free(bpacks); return STATUS; }
    if (by_batch) {
        #pragma omp parallel for num_threads(nthr) schedule(static)
        for (int64_t bt = 0; bt < g->nbatch; bt++) {
            const int tid = omp_get_thread_num();
            polyc_gemm_product(g, bt, init, bpacks + b_elements * tid, apacks + a_elements * tid, 0, 1);
        }
    } else {
        #pragma omp parallel num_threads(nthr)
        {
            const int tid = omp_get_thread_num(), team = omp_get_num_threads();
            const int split_n = polyc_share(g, tid, team).split_n;
            for (int64_t bt = 0; bt < g->nbatch; bt++)
                polyc_gemm_product(g, bt, init, bpacks + (split_n ? b_elements * tid : 0),
                                   apacks + a_elements * tid, tid, team);
        }
    }
    free(apacks);
    free(bpacks);
#endif
    return 0;
}
""", ctype)
    if not parallel:
        text = re.sub(r"#if defined\(_OPENMP\)\n.*?#endif\n", "", text, flags=re.DOTALL)
    return text.replace("STATUS", str(STATUS_OUT_OF_MEMORY)).replace("THRESHOLD", f"{float(_PARALLEL_THRESHOLD)!r}")
