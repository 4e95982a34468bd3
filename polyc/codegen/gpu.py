"""GPU code generation: one printer, two dialects (OpenCL C and CUDA C).

A mapped def (:class:`polyc.schedule.gpu_mapping.GpuPlan`) becomes one translation unit with one
kernel function per launch.  Each kernel takes every tensor of the def (inputs ``const``) and a
status word, reads its block and thread ids into the parameters the mapping named, and runs the
isl AST of its thread's instances, printed by the C back end's writer (statements, expressions
and their exact semantics are the CPU's: :mod:`polyc.codegen.c_expr`).  The dialects differ
only in spelling:

============  ==============================  ===================================
              OpenCL C                        CUDA C
============  ==============================  ===================================
kernel        ``__kernel void``               ``extern "C" __global__ void``
pointers      ``__global T *restrict``        ``T *__restrict__``
ids           ``get_group_id``/``get_local_id``  ``blockIdx``/``threadIdx``
helpers       ``static inline``               ``static __device__ inline``
============  ==============================  ===================================

The CPU prelude is reused with its ``#include`` lines replaced by each dialect's header:
OpenCL C has the C99 integer types under other names and its math functions overloaded
without the ``f`` suffix.  float16 is CUDA's ``__half``; in OpenCL C, whose ``half`` values need an
extension (PoCL's CPU device lacks it), float16 tensors are float buffers (the runtime converts)
and every float16 result is rounded through ``vstore_half_rte``/``vload_half``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cgen
import islpy as isl

from polyc.codegen.c import _STATUS, _combine, _extent_name, _KernelWriter, aff_c, c_comment
from polyc.codegen.c_expr import PRELUDE, c_constant, c_type
from polyc.errors import PolycError
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.builtins import BUILTINS
from polyc.options import Options
from polyc.schedule.gpu_mapping import BLOCK_ID, THREAD_ID, GpuLaunch, GpuPlan
from polyc.schedule.gpu_promotion import BARRIER, COPY, LOAD, STORE, SharedArray
from polyc.schedule.gpu_reduction import FINAL, PARTIAL_INIT, PARTIAL_STORE, TREE
from polyc.types import identity

_REDUCTION_STATEMENTS = (PARTIAL_INIT, PARTIAL_STORE, TREE, FINAL)

DIALECTS = ("opencl", "cuda")

#: The kernel argument the status (1: a data-dependent subscript fell outside its tensor) goes to.
STATUS_ARGUMENT = "polyc_status_out"

_MATH_FUNCTIONS = sorted(
    {b.c_name for b in BUILTINS.values() if not b.integer_only}
    | {"fabs", "fmin", "fmax", "sqrt", "trunc", "fmod", "floor", "ceil", "round", "rint", "nearbyint"}
)

_OPENCL_HEADER = "\n".join(
    [
        "/* ---- OpenCL C spellings of what the C prelude takes from <stdint.h> and <math.h> ---- */",
        "#pragma OPENCL EXTENSION cl_khr_fp64 : enable",
        "typedef char int8_t; typedef short int16_t; typedef int int32_t; typedef long int64_t;",
        "typedef uchar uint8_t; typedef ushort uint16_t; typedef uint uint32_t; typedef ulong uint64_t;",
        "#define INT64_C(x) ((long)(x##L))",
        "#define UINT64_C(x) ((ulong)(x##UL))",
        "#define INT32_MIN (-2147483647 - 1)",
        "#define INT64_MIN (-9223372036854775807L - 1)",
        "#define _Bool bool",
        # OpenCL's math functions are overloaded on float and double: C's float32 names map to them.
        *(f"#define {name}f {name}" for name in _MATH_FUNCTIONS),
        "#define POLYC_FN static inline",
        # float16 without cl_khr_fp16 (PoCL's CPU device lacks it): values and buffers are float,
        # every result rounded to float16 by a store and load of half bits, so a float16 def computes
        # what it computes elsewhere; the runtime converts float16 arrays on the way in and out
        "#define _Float16 float",
        "POLYC_FN float polyc_round_half(float x)",
        "{ ushort bits; vstore_half_rte(x, 0, (__private half *)&bits); return vload_half(0, (__private half *)&bits); }",
        "POLYC_FN float polyc_round_half_double(double x)",
        "{ ushort bits; vstore_half_rte(x, 0, (__private half *)&bits); return vload_half(0, (__private half *)&bits); }",
        "#define POLYC_F16(x) polyc_round_half(x)",
        "#define POLYC_F16_DOUBLE(x) polyc_round_half_double(x)",
        "#define polyc_round_float16(x) polyc_round_half(x)",
    ]
)

_CUDA_HEADER = "\n".join(
    [
        "/* ---- CUDA C++ spellings of C99 ---- */",
        "#pragma nv_diag_suppress 177  /* a prelude helper the kernel does not use */",
        "#include <stdint.h>",
        "#include <math.h>",
        "#define restrict __restrict__",
        "#define _Bool bool",
        "#define POLYC_FN static __device__ inline",
        "#include <cuda_fp16.h>",  # float16 is __half, computed in float and rounded once per operation
        "#define _Float16 __half",
        "#define POLYC_F16(x) __float2half_rn(x)",
        "#define POLYC_F16_DOUBLE(x) __double2half(x)",
        "#define polyc_round_float16(x) __half2float(__float2half_rn(x))",
    ]
)

_STATUS_HELPER = """
POLYC_FN int64_t polyc_checked_index(int64_t index, int64_t extent, int *status)
{
    if (index >= 0 && index < extent) return index;
    *status = 1;
    return 0;
}
"""


@dataclass(frozen=True)
class LaunchConfig:
    """A kernel function of a GPU translation unit and its launch: blocks per grid and threads
    per block, x first (CUDA's gridDim/blockDim; OpenCL's global size is their product)."""

    function_name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def global_size(self) -> tuple[int, ...]:
        return tuple(g * b for g, b in zip(self.grid, self.block))


@dataclass(frozen=True)
class GpuKernelSource:
    """A def as GPU code: the source, its dialect, the launches in order, and the tensors each
    kernel takes (in argument order; then the status word)."""

    dialect: str
    source: str
    launches: tuple[LaunchConfig, ...]
    tensor_arguments: tuple[str, ...]


def device_prelude(dialect: str) -> str:
    """The C prelude for device code in ``dialect``."""
    header = _OPENCL_HEADER if dialect == "opencl" else _CUDA_HEADER
    body = "\n".join(line for line in PRELUDE.splitlines() if not line.startswith("#include"))
    return header + "\n" + body.replace("static inline", "POLYC_FN") + _STATUS_HELPER


def generate_gpu(program: PolyProgram, plan: GpuPlan, options: Options, dialect: str) -> GpuKernelSource:
    """The translation unit of ``plan`` in ``dialect`` (``opencl`` or ``cuda``)."""
    if dialect not in DIALECTS:
        raise PolycError(f"unknown GPU dialect {dialect!r}; the dialects are: {', '.join(DIALECTS)}")
    definition = program.definition
    functions, launches = [], []
    for launch in plan.launches:
        writer = _GpuKernelWriter(program, options, launch, dialect)
        functions.append(writer.function())
        launches.append(LaunchConfig(launch.name, launch.grid, launch.block))
    header = c_comment(
        [
            f"polyc {dialect} kernels for def '{definition.name}'",
            "sizes: " + ", ".join(f"{k}={v}" for k, v in program.size_values.items()),
            *(f"  {s.name}: {s.text}" for s in definition.statements),
            *([plan.device.describe()] if plan.device is not None else []),
            "launches, in order:",
            *(f"  {l.function_name}: grid {l.grid}, block {l.block}" for l in launches),
        ]
    )
    source = "\n".join([header, device_prelude(dialect), *functions, ""])
    return GpuKernelSource(dialect, source, tuple(launches), tuple(t.name for t in definition.tensors))


class _GpuKernelWriter(_KernelWriter):
    """The C back end's statement and loop printer, writing the kernel of one launch."""

    def __init__(self, program: PolyProgram, options: Options, launch: GpuLaunch, dialect: str):
        super().__init__(program, None, options)
        self.launch = launch
        self.dialect = dialect
        self.promotion = launch.promotion
        self.private = launch.private
        self.current: tuple | None = None  # (statement, index C texts) while a statement is printed

    def function(self) -> str:
        d = self.definition
        opencl = self.dialect == "opencl"
        arguments = []
        for t in d.tensors:
            ctype = "uchar" if opencl and t.dtype.kind == "b" else c_type(t.dtype)
            qualified = f"const {ctype}" if t.role is ir.Role.INPUT else ctype
            if opencl:
                arguments.append(f"__global {qualified} *restrict {self._argument_name(t)}")
            else:
                arguments.append(f"{qualified} *restrict {t.name}")
        arguments.append(f"{'__global ' if opencl else ''}int *{STATUS_ARGUMENT}")
        body: list = []
        for t in d.tensors:  # OpenCL has no bool pointers as arguments: its bool is one byte here
            if opencl and t.dtype.kind == "b":
                const = "const " if t.role is ir.Role.INPUT else ""
                body.append(
                    cgen.Statement(
                        f"__global {const}bool *restrict {t.name} = (__global {const}bool *){self._argument_name(t)}"
                    )
                )
        for s in d.sizes:
            body.append(cgen.Statement(f"const int64_t {self.size_c[s]} = {self.program.size_values[s]}"))
        for t in d.tensors:
            for dim, extent in enumerate(t.shape):
                body.append(cgen.Statement(f"const int64_t {_extent_name(t.name, dim)} = {self.size_expr(extent)}"))
        for dim in range(self.launch.block_dims):
            block = f"get_group_id({dim})" if opencl else f"blockIdx.{'xyz'[dim]}"
            body.append(cgen.Statement(f"const int64_t {BLOCK_ID}{dim} = (int64_t){block}"))
        for dim in range(self.launch.thread_dims):
            thread = f"get_local_id({dim})" if opencl else f"threadIdx.{'xyz'[dim]}"
            body.append(cgen.Statement(f"const int64_t {THREAD_ID}{dim} = (int64_t){thread}"))
        body.append(cgen.Statement(f"int {_STATUS} = 0"))
        shared_qualifier = "__local" if opencl else "__shared__"
        for array in self.promotion.arrays if self.promotion else ():
            body.append(cgen.Statement(f"{shared_qualifier} {c_type(array.dtype)} {array.name}[{array.allocated}]"))
        for array in self.private.arrays if self.private else ():
            body.append(cgen.Statement(f"{c_type(array.dtype)} {array.name}[{array.elements}]"))
        reduction = self.launch.reduction
        for tree in reduction.trees if reduction else ():
            ctype = c_type(self.definition.tensor(tree.tensor).dtype)
            body.append(cgen.Statement(f"{ctype} {reduction.partial(tree.statement)}[1]"))
            body.append(
                cgen.Statement(f"{shared_qualifier} {ctype} {reduction.shared(tree.statement)}[{reduction.threads}]")
            )
        body.append(self.node(self.launch.build_ast()))
        body.append(cgen.If(_STATUS, cgen.Statement(f"*{STATUS_ARGUMENT} = 1")))
        qualifier = "__kernel void" if opencl else 'extern "C" __global__ void'
        signature = f"{qualifier} {self.launch.name}({', '.join(arguments)})"
        text = str(cgen.FunctionBody(cgen.Line(signature), cgen.Block(body)))
        # the CPU writer passes the status by address to its (atomic) helper; here it is private
        return c_comment(self.launch.describe().splitlines()) + "\n" + text

    def user_node(self, call: isl.AstExpr):
        name = call.get_op_arg(0).get_id().get_name()
        arguments = [self.expr(call.get_op_arg(i + 1)) for i in range(call.get_op_n_arg() - 1)]
        reduction = self.launch.reduction
        if reduction is not None and name.startswith(_REDUCTION_STATEMENTS):
            return cgen.Statement(self.reduction_statement(reduction, name))
        if name.startswith(BARRIER):
            if self.dialect == "cuda":
                return cgen.Statement("__syncthreads()")  # orders the block's global memory accesses too
            # a block reduction's statements read global memory other threads wrote
            fences = "CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE" if reduction is not None else "CLK_LOCAL_MEM_FENCE"
            return cgen.Statement(f"barrier({fences})")
        if name.startswith(LOAD) or name.startswith(STORE):
            array = self.private.array(name[len(LOAD) if name.startswith(LOAD) else len(STORE) :])
            private = f"{array.name}[{self.private_index(array, arguments)}]"
            global_element = super().element(array.tensor, arguments)
            return cgen.Statement(
                f"{private} = {global_element}" if name.startswith(LOAD) else f"{global_element} = {private}"
            )
        if name.startswith(COPY):
            return self.copy(self.promotion.array(name[len(COPY) :]), *arguments)
        statement = self.program.statement(name)
        self.current = (statement, dict(zip(statement.indices, arguments)))
        try:
            return super().user_node(call)
        finally:
            self.current = None

    def copy(self, array: SharedArray, slice_text: str, copy_text: str) -> cgen.Block:
        """Copy ``copy_text`` of slice ``slice_text`` into ``array``: its element (or group of
        ``array.vector`` floats, loaded with one vector load, 16-byte aligned as the promotion
        proved, and stored one by one: padded shared rows are not aligned) from the copy's
        number, as the promotion numbers the box's units (gpu_promotion's ``_copy_elements``)."""
        statements = [cgen.Statement(f"const int64_t polyc_copy = {copy_text}")]
        elements = []
        for d, (size, stride, offset) in enumerate(zip(array.copy_sizes, array.copy_strides, array.offsets)):
            unit = "polyc_copy" if stride == 1 else f"(polyc_copy / {stride})"
            unit = unit if d == 0 else f"({unit} % {size})"  # copy < copies: the first needs no modulus
            if d == len(array.sizes) - 1 and array.vector > 1:
                unit = f"({unit} * {array.vector})"
            elements.append(f"({aff_c(offset, [slice_text], self.param_names)} + {unit})")
        source = super().element(array.tensor, elements)
        first = self.local_index(array, slice_text, elements)
        if array.vector == 1:
            return cgen.Block(statements + [cgen.Statement(f"{array.name}[{first}] = {source}")])
        width = array.vector
        load = f"vload{width}(0, &{source})" if self.dialect == "opencl" else f"*(const float{width} *)(&{source})"
        statements.append(cgen.Statement(f"const float{width} polyc_vector = {load}"))
        for k, lane in enumerate("xyzw"[:width]):
            statements.append(cgen.Statement(f"{array.name}[{first} + {k}] = polyc_vector.{lane}"))
        return cgen.Block(statements)

    def reduction_statement(self, reduction, name: str) -> str:
        """A statement of a block reduction: partials, the tree's steps, the final combine."""
        thread = f"{THREAD_ID}0"
        for prefix in (PARTIAL_INIT, PARTIAL_STORE, FINAL, TREE):
            if name.startswith(prefix):
                statement, step = name[len(prefix) :], None
                if prefix == TREE:
                    statement, step = statement.rsplit("_", 1)
                break
        tree = reduction.tree(statement)
        if tree is None:
            raise PolycError(f"internal: unknown block-reduction statement {name}")
        dtype = self.definition.tensor(tree.tensor).dtype
        partial, shared, ctype = f"{reduction.partial(statement)}[0]", reduction.shared(statement), c_type(dtype)
        if prefix == PARTIAL_INIT:
            return f"{partial} = {c_constant(identity(tree.op, dtype).item(), dtype)}"
        if prefix == PARTIAL_STORE:
            return f"{shared}[{thread}] = {partial}"
        if prefix == FINAL:
            target = super().element(tree.tensor, [aff_c(aff, [], self.param_names) for aff in tree.subscripts])
            return f"{target} = {_combine(tree.op, dtype, target, f'{shared}[0]', ctype)}"
        mine = f"{shared}[{thread}]"
        other = f"{shared}[{thread} + {reduction.tree_stride(int(step))}]"
        return f"{mine} = {_combine(tree.op, dtype, mine, other, ctype)}"

    def element(self, tensor_name: str, subscripts: list[str], checked: bool = False) -> str:
        reduction = self.launch.reduction
        tree = reduction.tree(self.current[0].name) if reduction is not None and self.current else None
        if tree is not None and tensor_name == tree.tensor:  # a tree's update accumulates into its partial
            return f"{reduction.partial(tree.statement)}[0]"
        private = self.private.array(tensor_name) if self.private and self.current else None
        if private is not None:
            return f"{private.name}[{self.private_index(private, subscripts)}]"
        array = self.promotion.array(tensor_name) if self.promotion and self.current else None
        if array is None:
            return super().element(tensor_name, subscripts, checked)
        statement, index_c = self.current
        member = aff_c(
            self.promotion.member_affs[statement.name], [index_c[i] for i in statement.indices], self.param_names
        )
        slice_text = f"polyc_floord({member} - {self.promotion.low}, {self.promotion.slice_size})"
        return f"{array.name}[{self.local_index(array, slice_text, subscripts)}]"

    def private_index(self, array, elements: list[str]) -> str:
        """C text of an element's place in a thread's private array."""
        terms = []
        for element, offset, stride, step in zip(
            elements, array.offsets, array.strides, array.steps or (1,) * len(elements)
        ):
            term = f"(({element}) - ({aff_c(offset, [], self.param_names)}))"
            term = term if step == 1 else f"({term} / {step})"  # exact: the elements are step apart
            terms.append(term if stride == 1 else f"{term} * {stride}")
        return " + ".join(terms)

    def local_index(self, array: SharedArray, slice_text: str, elements: list[str]) -> str:
        """C text of element ``elements`` of slice ``slice_text`` in the shared box."""
        terms = []
        for element, offset, stride in zip(elements, array.offsets, array.strides):
            offset_text = aff_c(offset, [slice_text], self.param_names)
            term = f"(({element}) - ({offset_text}))"
            terms.append(term if stride == 1 else f"{term} * {stride}")
        if array.buffers > 1:  # slice s in buffer s mod buffers (slices count from 0)
            terms.append(f"(({slice_text}) % {array.buffers}) * {array.elements}")
        return " + ".join(terms)

    @staticmethod
    def _argument_name(tensor) -> str:
        return f"{tensor.name}_bytes" if tensor.dtype.kind == "b" else tensor.name
