"""What the writers of hand-structured kernels share: the contraction (:mod:`polyc.codegen.gemm`),
matrix-vector (:mod:`polyc.codegen.gemv`) and convolution (:mod:`polyc.codegen.conv`) kernels.

They print C for one recognised statement plus the elementwise *epilogue* statements after it,
with the generic back end's conventions (:mod:`polyc.codegen.c`): row-major tensors whose
extents are ``const int64_t`` locals named like the generic back end's, sizes as constants when
specialised or as arguments, and epilogue statements printed through the same expression
printer, so that they compute exactly what the interpreter does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from polyc.codegen.c import _C_KEYWORDS, GeneratedKernel, _combine, _extent_name
from polyc.codegen.c_expr import CExpressionPrinter, c_type
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options

#: How many threads a parallel call uses: all of them unless the machine is busier than its cores.
#: Each kernel library keeps its own record; a kernel calls polyc_threads() for its thread count,
#: each thread of the region wraps its work in polyc_thread_start/_stop, and the calling thread
#: then passes the count of slow threads to polyc_threads_after().
THREAD_POLICY_C = c_template("pattern_kernel_thread_policy_c.c")


#: Scratch memory a kernel keeps from one call to the next (the contraction kernel's packing
#: buffers).  Allocated and freed in every call, blocks of megabytes let the C library give the
#: memory back to the system and fault it in again in the next call, or not, by the allocator's
#: state, so sgemm 2048's time varied from process to process (``python -m benchmarks
#: --filter sgemm``; with glibc's allocation thresholds fixed, it did not).  A call takes the
#: kept block, or allocates its own when another call holds it or it is too small; the block
#: given back first is kept and the
#: others freed, so a kernel holds at most one block, of the size one of its calls needed
#: (untouched pages of it cost no memory), for as long as its library is loaded.
KEPT_WORKSPACE_C = c_template("pattern_kernel_kept_workspace_c.c")


@dataclass(frozen=True)
class DedicatedKernel(GeneratedKernel):
    """A hand-structured kernel and the choices its writer made as it printed it (``decisions``:
    register blocks, cache blocks, layout, work items, ... by name, as the writer filled its
    templates), which explanations and pictures read instead of the C text.  Choices the C
    makes per call (from run-time values) are not here: the writer names them as such."""

    decisions: Mapping[str, Any] = field(default_factory=dict)


def typed(template: str, ctype: str) -> str:
    """``template`` with the element type for every word ``T``."""
    return re.sub(r"\bT\b", ctype, template)


class PatternKernelWriter:
    """Sizes, extents, element addresses and epilogue statements in C, for a kernel of
    ``program`` (specialised to its sizes, or parametric)."""

    def __init__(self, program: PolyProgram, options: Options):
        self.program = program
        self.definition = program.definition
        self.options = options
        self.specialised = program.size_values is not None
        tensor_names = {t.name for t in self.definition.tensors}
        self.size_c = {p: (f"{p}_size" if p in tensor_names or p in _C_KEYWORDS else p) for p in program.params}

    def known_extent(self, extent: Affine) -> int | None:
        """An extent's value when the C is written: a literal, or the sizes' when specialised;
        None when it is only known at run time."""
        if extent.is_constant:
            return extent.constant
        sizes = self.program.size_values
        return extent.evaluate(sizes) if sizes is not None else None

    def sizes_comment(self) -> str:
        """The sizes for the generated source's header: ``N=1, H=56`` or "parametric"."""
        sizes = self.program.size_values
        if sizes is None:
            return "parametric"
        return ", ".join(f"{k}={v}" for k, v in sizes.items())

    def preamble(self, portable_macro: str, includes: list[str]) -> str:
        """``includes``, <omp.h> when parallel, and ``#define portable_macro 1`` when not
        vectorising (the kernel's preprocessor then picks its portable C)."""
        lines = list(includes)
        if self.options.parallel:
            lines += ["#ifdef _OPENMP", "#include <omp.h>", "#endif"]
        if self.options.threads is not None:
            lines.append(f"#define POLYC_MAX_THREADS {self.options.threads}")
        lines += [THREAD_POLICY_C, KEPT_WORKSPACE_C]
        if not self.options.vectorize:
            lines.append(f"#define {portable_macro} 1")
        return "\n".join(lines)

    def size_expr(self, value: Affine) -> str:
        return value.to_c(lambda name: self.size_c[name])

    def key_length(self) -> int:
        """Entries of the key that tells the sizes a kernel's tables were built for (see
        :meth:`kept_tables`): one per size, or a single 0 when the sizes are literal."""
        return 1 if self.specialised else max(1, len(self.definition.sizes))

    def kept_tables(self, record: str, build: list[str]) -> list[str]:
        """C lines that give ``polyc_g`` (of struct type ``record``, with a ``key`` field) the
        tables of this call's sizes: ``build`` (lines that fill ``polyc_g`` and may set
        ``polyc_tables`` to the memory they allocate, freed by the caller at the end of the call)
        runs on a kernel's first call, whose record is then kept for every later call with the
        same sizes.  Built on every call, the point tables of a 1 x 1 convolution at 112 x 112
        took as long as the convolution (mobilenet_v2), and freeing them
        made the kernel interrupt its other threads' processors.  Calls with other sizes build
        their own; the kept record lives as long as the library."""
        sizes = [self.size_c[s] for s in self.definition.sizes] if not self.specialised else []
        key = ", ".join(sizes) if sizes else "0"
        return [
            f"const int64_t polyc_key[{self.key_length()}] = {{{key}}};",
            f"static {record} *polyc_kept;",
            f"{record} polyc_g;",
            "int64_t *polyc_tables = NULL;",
            f"{record} *const polyc_found = __atomic_load_n(&polyc_kept, __ATOMIC_ACQUIRE);",
            "if (polyc_found != NULL && memcmp(polyc_found->key, polyc_key, sizeof polyc_key) == 0) {",
            "    polyc_g = *polyc_found;",
            "} else {",
            "    memset(&polyc_g, 0, sizeof polyc_g);",
            *("    " + line for line in build),
            "    memcpy(polyc_g.key, polyc_key, sizeof polyc_key);",
            f"    {record} *polyc_keep = polyc_found == NULL ? ({record} *)malloc(sizeof *polyc_keep) : NULL;",
            f"    {record} *polyc_none = NULL;",
            "    if (polyc_keep != NULL) {",
            "        *polyc_keep = polyc_g;",
            "        if (__atomic_compare_exchange_n(&polyc_kept, &polyc_none, polyc_keep, 0, __ATOMIC_RELEASE,",
            "                                        __ATOMIC_RELAXED))",
            "            polyc_tables = NULL;  /* the kept record owns them now */",
            "        else",
            "            free(polyc_keep);",
            "    }",
            "}",
        ]

    def size_declarations(self, parametric_value: Callable[[str], str | None]) -> list[str]:
        """``const int64_t`` declarations of the sizes (``parametric_value(size)`` when not
        specialised; None: it is a function argument) and of every tensor extent."""
        lines = []
        sizes = self.program.size_values
        for s in self.definition.sizes:
            value = sizes[s] if sizes is not None else parametric_value(s)
            if value is not None:
                lines.append(f"const int64_t {self.size_c[s]} = {value};")
        for t in self.definition.tensors:
            for dim, extent in enumerate(t.shape):
                lines.append(f"const int64_t {_extent_name(t.name, dim)} = {self.size_expr(extent)};")
        lines += [f"(void){_extent_name(t.name, dim)};" for t in self.definition.tensors for dim in range(t.rank)]
        return lines

    def element(self, tensor_name: str, subscripts: list[str]) -> str:
        """C lvalue of an element (row-major, like :mod:`polyc.codegen.c`)."""
        tensor = self.definition.tensor(tensor_name)
        if tensor.rank == 0:
            return f"{tensor_name}[0]"
        offset = ""
        for dim, subscript in enumerate(subscripts):
            offset = f"({subscript})" if dim == 0 else f"({offset} * {_extent_name(tensor_name, dim)} + ({subscript}))"
        return f"{tensor_name}[{offset}]"

    def pointer_arguments(self, sizes: tuple[str, ...]) -> list[str]:
        """The kernel function's parameters: every tensor's pointer (const for the inputs), in
        signature order, then the ``sizes`` (a parametric kernel's)."""
        arguments = []
        for tensor in self.definition.tensors:
            qualified = f"const {c_type(tensor.dtype)}" if tensor.role is ir.Role.INPUT else c_type(tensor.dtype)
            arguments.append(f"{qualified} *__restrict__ {tensor.name}")
        return arguments + [f"int64_t {self.size_c[s]}" for s in sizes]

    @staticmethod
    def parallel_region(
        work: str, threshold: float, region: list[str], serial: list[str], prologue: tuple[str, ...] = ()
    ) -> list[str]:
        """C lines that run ``region`` in an OpenMP parallel region under the thread policy
        (:data:`THREAD_POLICY_C`: ``polyc_nthr`` threads, one when ``work`` is below
        ``threshold``), ``prologue`` first once ``polyc_nthr`` is known; ``serial`` where
        OpenMP is off."""
        return [
            "#if defined(_OPENMP)",
            "int polyc_nthr = 1, polyc_most = 1, polyc_slow = 0;",
            f"if ({work} >= {float(threshold)!r}) {{",
            "    polyc_most = polyc_most_threads();",
            "    polyc_nthr = polyc_threads(polyc_most);",
            "}",
            *prologue,
            "const double polyc_started = polyc_call_start();",
            "#pragma omp parallel num_threads(polyc_nthr) if(polyc_nthr > 1)",
            "{",
            "    polyc_thread_clock_t polyc_clock;",
            "    if (polyc_nthr > 1) polyc_thread_start(&polyc_clock, polyc_started);",
            *("    " + line for line in region),
            "    if (polyc_nthr > 1) polyc_thread_stop(&polyc_clock, &polyc_slow);",
            "}",
            "polyc_threads_after(polyc_nthr, polyc_most, polyc_slow);",
            "#else",
            *serial,
            "#endif",
        ]

    def workspace_region(
        self, work: str, threshold: float, allocate: list[str], region: list[str], serial: list[str]
    ) -> list[str]:
        """C lines that run ``region`` under :meth:`parallel_region` (``serial`` without OpenMP
        or without the ``parallel`` option) with the kept workspace ``polyc_work`` that
        ``allocate`` takes once ``polyc_nthr`` is known, and give it back."""
        alone = ["const int polyc_nthr = 1;", *allocate, "{", *("    " + line for line in serial), "}"]
        lines = (
            self.parallel_region(work, threshold, region, alone, prologue=tuple(allocate))
            if self.options.parallel
            else alone
        )
        return lines + ["polyc_workspace_give_back(polyc_work);"]

    def batch_indices(self, conv, image: str) -> list[str]:
        """C declarations of ``polyc_ix_<index>`` for a convolution's batch indices, from the
        flat number ``image`` (C) of the image they make together (row-major)."""
        lines = [f"int64_t polyc_rest = {image};"]
        for index in reversed(conv.batch):
            extent = self.size_expr(conv.extent(index))
            lines.append(f"const int64_t polyc_ix_{index} = polyc_rest % ({extent}); polyc_rest /= ({extent});")
        return lines + ["(void)polyc_rest;"]

    def image_box_fields(self, conv) -> list[str]:
        """C assignments to the record ``g`` of a 2-D convolution (:class:`~polyc.schedule.convolution.
        Convolution`) of the image's rows and columns (``ih, iw``) and of the positions
        ``lo <= p < hi`` whose products count (``lo_h, hi_h, lo_w, hi_w``: the padding box
        within the image)."""
        box = {b.dim: b for b in conv.box}

        def bound(dim: int, side: str, default: str) -> str:
            value = getattr(box[dim], side) if dim in box else None
            if value is None:
                return default
            value = f"({self.size_expr(value)})"
            return f"polyc_max({value}, 0)" if side == "lo" else f"polyc_min({value}, {default})"

        (wh, ww) = conv.windows
        image_h, image_w = (self.size_expr(self.definition.tensor(conv.image).shape[w.dim]) for w in conv.windows)
        return [
            f"g.ih = {image_h}; g.iw = {image_w};",
            f"g.lo_h = {bound(wh.dim, 'lo', '0')}; g.hi_h = {bound(wh.dim, 'hi', 'g.ih')};",
            f"g.lo_w = {bound(ww.dim, 'lo', '0')}; g.hi_w = {bound(ww.dim, 'hi', 'g.iw')};",
        ]

    def tensors_of_epilogues(self, target: str, epilogues: tuple[ir.CheckedStatement, ...]) -> list[str]:
        """The tensors epilogue statements on ``target`` read or write, in signature order."""
        used = {target} if epilogues else set()
        for statement in epilogues:
            used |= {read.tensor for read in ir.reads(statement.rhs)}
        return [t.name for t in self.definition.tensors if t.name in used]

    def stride(self, tensor_name: str, dim: int) -> str:
        """C of the distance between neighbours along dimension ``dim`` of a tensor."""
        tensor = self.definition.tensor(tensor_name)
        factors = [_extent_name(tensor_name, d) for d in range(dim + 1, tensor.rank)]
        return "(" + " * ".join(factors) + ")" if factors else "1"

    def epilogue_assignment(
        self, statement: ir.CheckedStatement, kernel_indices: tuple[str, ...], lhs: str | None = None
    ) -> str:
        """C of one epilogue statement at one point of the target.  The statement's indices
        are the kernel statement's ``kernel_indices`` by position, whose values are in
        ``polyc_ix_<index>``; ``lhs`` is the target element's lvalue (default: its address
        from those values), also used for reads of the target (always at the same point)."""
        index_c = {mine: f"polyc_ix_{theirs}" for mine, theirs in zip(statement.indices, kernel_indices)}
        target = self.definition.tensor(statement.target)
        lhs = lhs or self.element(statement.target, [index_c[i] for i in statement.indices])

        own_point = tuple(Affine.var(i) for i in statement.indices)

        def access(read: ir.Read, subscripts: list[str]) -> str:
            if read.tensor == statement.target:
                return lhs
            # A tensor of the target's shape read at the target's own point is at the target's
            # offset: one stream like the target's, where an address from the per-point index
            # tables was gathered element by element (a residual added in a convolution's
            # epilogue: it slowed resnet18's layer-1 blocks at batch 8).
            if (
                read.subscripts == own_point
                and lhs.startswith(f"{statement.target}[")
                and self.definition.tensor(read.tensor).shape == target.shape
            ):
                return read.tensor + lhs[len(statement.target) :]
            return self.element(read.tensor, subscripts)

        printer = CExpressionPrinter(
            access=access,
            index=lambda n: index_c[n] if n in index_c else self.size_c[n],
            size=lambda value: value.to_c(lambda n: self.size_c[n]),
        )
        value = printer.to_c(statement.rhs)
        if statement.op == "=":
            return f"{lhs} = {value}"
        return f"{lhs} = {_combine(statement.op, target.dtype, lhs, value, c_type(target.dtype))}"
