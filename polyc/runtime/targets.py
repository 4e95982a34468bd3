"""A kernel's self-contained C export for a target (:mod:`polyc.target`).

A :class:`~polyc.target.Target` names the machine generated C is built for: the C compiler (a cross compiler
for aarch64), the optimisation and instruction-set flags, and the vector width.  The C text is
the same C99 + OpenMP for every target; vectorisation is the C compiler's job, steered by the
``#pragma omp simd`` the scheduler puts on vector loops.  For ``neon``,
``aarch64-linux-gnu-gcc -O3 -march=armv8-a+simd`` turns those loops into Advanced SIMD code
(``ldr q``/``ld1`` loads, ``fmla v.4s`` multiply-adds); for ``avx512`` and ``avx2``, gcc uses
``zmm``/``ymm`` registers.  Contraction kernels (:mod:`polyc.codegen.gemm`) also hold register
micro-kernels in intrinsics for AVX-512, AVX2 and NEON, and the C preprocessor keeps the ones
the target's compiler and flags define (``__aarch64__`` and ``__ARM_NEON`` for ``neon``), so
an export needs no target-specific text.

    >>> TARGETS["neon"].compile_command(["main.c", "matmul.c"], "main", "-static")
    ['aarch64-linux-gnu-gcc', '-O3', '-march=armv8-a+simd', '-std=gnu11', '-fno-math-errno', '-fno-trapping-math', '-fopenmp', '-static', '-o', 'main', 'main.c', 'matmul.c', '-lm']

:func:`export_c` turns the stages of one kernel (:class:`polyc.driver.Stages`) into two files a
C project can take without Python: ``NAME.c`` (the prelude and the kernel function) and
``NAME.h`` (its prototype, with a comment giving the arguments in order, their element types
and shapes, and the return value).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from polyc.errors import PolycError
from polyc.ir.bounds import check_bounds
from polyc.lang.checked import CheckedDef, Role, Tensor
from polyc.target import Target, get_target
from polyc.version import __version__

if TYPE_CHECKING:
    from polyc.driver import Stages


#: The target :func:`export_c` builds for when none is named.
DEFAULT_EXPORT_TARGET = "neon"


@dataclass(frozen=True)
class ExportedC:
    """A kernel as two C files: ``NAME.c`` holds everything it needs, ``NAME.h`` its prototype."""

    name: str
    target: Target
    c_source: str
    header: str

    def write(self, directory: str | Path) -> tuple[Path, Path]:
        """Write ``NAME.c`` and ``NAME.h`` into ``directory`` (made if missing); their paths."""
        directory = Path(directory)
        c_path, h_path = directory / f"{self.name}.c", directory / f"{self.name}.h"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            c_path.write_text(self.c_source, encoding="utf-8")
            h_path.write_text(self.header, encoding="utf-8")
        except OSError as error:
            raise PolycError(f"cannot write the exported kernel to {directory}: {error}") from error
        return c_path, h_path


def export_c(stages: Stages, target: str | Target = DEFAULT_EXPORT_TARGET, name: str | None = None) -> ExportedC:
    """``NAME.c`` and ``NAME.h`` for the kernel compiled in ``stages``, built for ``target``.

    ``name`` (default: the def's name) names the files; the function is the generated one,
    ``polyc_<def>``.  Specialised stages give a kernel for their sizes only; parametric ones
    (``Kernel.stages(None)``) take the sizes as trailing ``int64_t`` arguments.
    """
    target = get_target(target)
    definition = stages.program.definition
    kernel = stages.kernel
    sizes = stages.program.size_values
    name = name or definition.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise PolycError(f"export name {name!r} must be a C identifier (it names NAME.c and NAME.h)")

    prototype = kernel_prototype(kernel.source, kernel.function_name)
    c_source = "\n".join(
        [
            f"/* polyc {__version__}: def '{definition.name}' exported for target {target.name}: {target.description}.",
            " * Self-contained: needs a C11 compiler with GNU extensions and libm; without -fopenmp the",
            " * OpenMP pragmas are ignored and the kernel runs on one thread.  Build, for example:",
            f" *   {' '.join([*target.c_compiler().split(), *target.build_flags(), '-c', f'{name}.c'])}",
            " */",
            f'#include "{name}.h"',
            "",
            kernel.source,
        ]
    )
    # Parametric code is in bounds only where the define-time proof says so: state where.
    precondition = str(check_bounds(stages.program)) if sizes is None else ""
    header = _header(definition, kernel, sizes, target, name, prototype, precondition)
    return ExportedC(name, target, c_source, header)


def export_sizes(definition: CheckedDef, sizes: Mapping[str, int] | None) -> dict[str, int] | None:
    """``sizes`` checked to give every size of ``definition`` a value >= 0 (None stays None:
    a parametric export); a missing, unknown or negative size is a PolycError."""
    if sizes is None:
        return None
    missing = [s for s in definition.sizes if s not in sizes]
    unknown = sorted(set(sizes) - set(definition.sizes))
    if missing or unknown:
        problem = f"no value for {', '.join(missing)}" if missing else f"{', '.join(unknown)} is not one of them"
        raise PolycError(
            f"{definition.name}: an export for fixed sizes needs a value for each of its sizes "
            f"({', '.join(definition.sizes) or 'none'}): {problem}; give all of them, or none "
            "for a kernel that takes them as arguments"
        )
    negative = [s for s in definition.sizes if not isinstance(sizes[s], (int, np.integer)) or sizes[s] < 0]
    if negative:
        raise PolycError(
            f"{definition.name}: sizes must be integers >= 0, not " + ", ".join(f"{s}={sizes[s]!r}" for s in negative)
        )
    return {s: int(sizes[s]) for s in definition.sizes}


def kernel_prototype(source: str, function_name: str) -> str:
    """The kernel's declarator line, as the generator printed it."""
    match = re.search(rf"^int {re.escape(function_name)}\((.*)\)$", source, re.MULTILINE)
    if match is None:
        raise PolycError(f"internal: no definition of {function_name} in the generated C")
    return match.group(0)


def _parameter_names(prototype: str) -> list[str]:
    arguments = prototype[prototype.index("(") + 1 : -1]
    return [
        re.findall(r"[A-Za-z_][A-Za-z0-9_]*", argument)[-1] for argument in arguments.split(",") if argument.strip()
    ]


def _header(
    definition: CheckedDef,
    kernel,
    sizes: Mapping[str, int] | None,
    target: Target,
    name: str,
    prototype: str,
    precondition: str,
) -> str:
    guard = f"POLYC_EXPORT_{name.upper()}_H"
    parameters = _parameter_names(prototype)
    size_inputs = {b.tensor: b.size for b in definition.size_bindings if b.dim is None}

    lines = [f"polyc {__version__}: def '{definition.name}' for target {target.name}: {target.description}", ""]
    lines += ["  " + line for line in definition.describe().splitlines()]
    lines.append("")
    if sizes is not None:
        lines.append(
            "Sizes, compiled in (the kernel is valid for these only): "
            + (", ".join(f"{s}={v}" for s, v in sizes.items()) or "none")
        )
    else:
        lines.append("Sizes are the trailing int64_t arguments: values >= 0 that agree with the inputs' shapes.")
        lines.append(
            "Every affine access is proved in bounds for all sizes"
            if precondition == "none"
            else f"Affine accesses stay in bounds only for sizes satisfying: {precondition}"
        )
    lines += [
        "",
        f"Arguments of {kernel.function_name}, in order: pointers to C-contiguous (row-major) arrays",
        "that must not overlap, then the sizes:",
    ]
    width = max((len(p) for p in parameters), default=0)
    for parameter, tensor_name in zip(parameters, kernel.tensor_arguments):
        tensor = definition.tensor(tensor_name)
        lines.append(f"  {parameter:<{width}}  {_tensor_line(tensor, sizes)}")
        note = _role_note(tensor, size_inputs.get(tensor_name))
        if note:
            lines.append(f"  {'':<{width}}    {note}")
    for parameter, size in zip(parameters[len(kernel.tensor_arguments) :], kernel.size_arguments):
        lines.append(f"  {parameter:<{width}}  int64_t, the size {size}")
    lines += [
        "",
        "Returns 0 on success; otherwise the outputs are not valid: 1 when a data-dependent subscript",
        "(an index read from a tensor) fell outside the tensor it indexes (that element was read as",
        "element 0), 2 when the kernel could not allocate its working memory.",
    ]
    comment = "/*\n" + "\n".join(f" * {line}".rstrip() for line in lines).replace("*/", "* /") + "\n */"
    return "\n".join(
        [
            comment,
            f"#ifndef {guard}",
            f"#define {guard}",
            "",
            "#include <stdint.h>",
            "#include <stdbool.h>",
            "",
            "#ifdef __cplusplus",
            'extern "C" {',
            "#endif",
            "",
            prototype + ";",
            "",
            "#ifdef __cplusplus",
            "}",
            "#endif",
            "",
            f"#endif /* {guard} */",
            "",
        ]
    )


def _tensor_line(tensor: Tensor, sizes: Mapping[str, int] | None) -> str:
    """``input  float32[M][K] = [64][64]``: role, element type and shape in the sizes."""
    if tensor.rank == 0:
        shape = " (0-d: one element)"
    else:
        shape = "".join(f"[{extent}]" for extent in tensor.shape)
        if sizes is not None:
            concrete = "".join(f"[{extent}]" for extent in tensor.concrete_shape(sizes))
            if concrete != shape:
                shape += f" = {concrete}"
    return f"{tensor.role.value:<9}  {tensor.dtype.name}{shape}"


def _role_note(tensor: Tensor, bound_size: str | None) -> str:
    if tensor.role is Role.OUTPUT:
        return "updated in place: pass zeros (statements without '!' accumulate into what it holds)"
    if tensor.role is Role.TEMPORARY:
        return "scratch buffer the caller provides, zero-initialised"
    if bound_size is not None:
        return f"holds the value of the size {bound_size}"
    return ""
