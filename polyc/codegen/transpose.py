"""C for a transposition (:class:`~polyc.schedule.transposition.Transposition`): an output that
is an input with its dimensions permuted so that the innermost one moves.

A loop nest in either tensor's order strides through the other one, a cache line per element;
this kernel moves square tiles instead.  First, dimensions that stay neighbours in the same
order (NCHW -> NHWC keeps H before W) are merged into one, so every transposition becomes a set
of *planes*, one per value of the dimensions that are neither the input's innermost (the
planes' columns) nor the output's innermost (their rows): ``O[..., j, ..., i] = A[..., i, ..., j]``.
Each plane is cut into tiles of ``TILE`` x ``TILE`` elements, which fit in L1 twice over; the
tiles of all planes are shared among the threads.  Inside a tile, 8 x 8 blocks (4-byte
elements) or 4 x 4 blocks (8-byte elements) are transposed in vector registers (AVX or NEON
intrinsics), so that every load and store moves a whole vector along a row; other element
sizes, the blocks at the tiles' edges and the portable build copy one element at a time,
writing along the output's rows.

The kernel returns 0; it has no error to report (the shapes are checked before the call).
"""

from __future__ import annotations

import math

import numpy as np

from polyc.codegen.c import GeneratedKernel, _extent_name, c_comment
from polyc.codegen.c_expr import PRELUDE, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter, typed
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.options import Options
from polyc.schedule.transposition import Transposition
from polyc.target import isa_guards

#: The side of the square tiles a plane is cut into: a tile of the input and its image in the
#: output, 64 x 64 elements of 4 bytes, take 32 KiB together, within every L1 data cache polyc
#: targets (measured by ``python -m benchmarks transpose``).
TILE = 64
#: Below this many elements moved a transposition runs on one thread.
_PARALLEL_THRESHOLD = 1 << 15
#: The vector instruction sets with a register transpose, best first, and the portable build.
ISA_GUARDS = isa_guards(("avx2", "neon"), "POLYC_TRANSPOSE_PORTABLE")

# The register transposes, per instruction set and element size: ``polyc_tr_block`` moves the
# BLOCK x BLOCK elements at ``s`` (rows ``sp`` apart) to ``d`` (rows ``dp`` apart), transposed.
_AVX_8x8_FLOAT = c_template("transpose_avx_8x8_float.c")

_AVX_4x4_DOUBLE = c_template("transpose_avx_4x4_double.c")

_NEON_4x4_FLOAT = c_template("transpose_neon_4x4_float.c")

#: The register transposes there are: (instruction set, element bytes) -> C.
_REGISTER_BLOCKS = {("avx2", 4): _AVX_8x8_FLOAT, ("avx2", 8): _AVX_4x4_DOUBLE, ("neon", 4): _NEON_4x4_FLOAT}

# One tile: rows x cols elements of a plane, ``s`` the input's (rows sp apart, columns
# contiguous), ``d`` the output's (the input's columns as rows dp apart).  T is the element type.
_TILE = c_template("transpose_tile.c")


def generate_transpose(program: PolyProgram, transposition: Transposition, options: Options) -> GeneratedKernel:
    """The C translation unit computing ``program``, which is ``transposition`` (the transpose
    kernel path, :mod:`polyc.paths.transpose`, checks it)."""
    return _TransposeWriter(program, transposition, options).write()


def merged_dimensions(permutation: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """The input's dimensions grouped where they stay neighbours in the output, and the
    permutation of the groups: ``(groups, order)`` with ``groups`` in the input's order (each a
    run of consecutive input dimensions) and output group ``e`` holding input group ``order[e]``.

    >>> merged_dimensions((0, 2, 3, 1))  # NCHW -> NHWC: H and W move together
    (((0,), (1,), (2, 3)), (0, 2, 1))
    """
    runs: list[list[int]] = []
    for dim in permutation:
        if runs and dim == runs[-1][-1] + 1:
            runs[-1].append(dim)
        else:
            runs.append([dim])
    groups = sorted(tuple(run) for run in runs)
    order = tuple(groups.index(tuple(run)) for run in runs)
    return tuple(groups), order


class _TransposeWriter(PatternKernelWriter):
    def __init__(self, program: PolyProgram, transposition: Transposition, options: Options):
        super().__init__(program, options)
        self.transposition = transposition
        self.dtype = np.dtype(program.definition.tensor(transposition.source).dtype)
        self.ctype = c_type(self.dtype)
        self.groups, self.order = merged_dimensions(transposition.permutation)

    def write(self) -> DedicatedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [
            self.header(),
            PRELUDE,
            self.preamble("POLYC_TRANSPOSE_PORTABLE", []),
            self.register_blocks(),
            typed(_TILE, self.ctype),
            self.entry_function(name, sizes),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions`: the merged groups of
        dimensions, which are each plane's rows and columns, the tile, the register transpose
        per instruction set (None: element by element), and the counts known as the C is written."""
        t = self.transposition
        count = len(self.groups)
        rows, columns = self.order[-1], count - 1

        def product(values: list[int | None]) -> int | None:
            known_values = [v for v in values if v is not None]
            return math.prod(known_values) if len(known_values) == len(values) else None

        known = [product([self.known_extent(t.extents[dim]) for dim in group]) for group in self.groups]
        planes = product([known[g] for g in range(count) if g not in (rows, columns)])
        row_count, column_count = known[rows], known[columns]
        tiles = (
            None
            if planes is None or row_count is None or column_count is None
            else planes * -(-row_count // TILE) * -(-column_count // TILE)
        )
        block = {4: 8, 8: 4}.get(self.dtype.itemsize)
        return {
            "kernel": "transpose",
            "transposition": t.describe(),
            "groups": self.groups,
            "order": self.order,
            "rows": self.groups[rows],  # the input's dimensions that become the output's innermost
            "columns": self.groups[columns],  # the input's innermost dimensions
            "extents": tuple(known),
            "planes": planes,
            "tiles": tiles,
            "tile": TILE,
            "element_bytes": self.dtype.itemsize,
            "instruction_sets": tuple(ISA_GUARDS),
            "register_blocks": {
                isa: (block if (isa, self.dtype.itemsize) in _REGISTER_BLOCKS else None) for isa in ISA_GUARDS
            },
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
        }

    def header(self) -> str:
        o = self.options
        t = self.transposition
        groups = " x ".join("(" + ", ".join(str(dim) for dim in group) + ")" for group in self.groups)
        lines = [
            f"polyc transpose kernel for def '{self.definition.name}' ({TILE} x {TILE} tiles, register "
            "transposes inside them)",
            f"sizes: {self.sizes_comment()}",
            f"options: parallel={o.parallel} vectorize={o.vectorize} specialize={o.specialize}",
            f"transposition: {t.describe()}",
            f"dimensions of {t.source} merged: {groups}, in the order {self.order} in {t.target}",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def register_blocks(self) -> str:
        """The preprocessor choice of a register transpose for this element size (none: the
        tiles copy one element at a time)."""
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            if guard is None:
                pieces.append("#else")
                pieces.append("/* portable: the tiles copy one element at a time */")
                continue
            pieces.append(f"{'#if' if position == 0 else '#elif'} {guard}")
            block = _REGISTER_BLOCKS.get((isa, self.dtype.itemsize))
            pieces.append(block if block is not None else f"/* {isa}: no register transpose of {self.ctype} */")
        pieces.append("#endif")
        return "\n".join(pieces)

    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        t = self.transposition
        groups, order = self.groups, self.order
        arguments = self.pointer_arguments(sizes)
        extent = [" * ".join(_extent_name(t.source, dim) for dim in group) for group in groups]
        count = len(groups)
        body = self.size_declarations(lambda s: None)
        body += [f"const int64_t polyc_e{g} = {extent[g]};" for g in range(count)]
        # Strides of each input group in the input, and in the output (where it sits at order.index(g)).
        for g in range(count):
            inner = [f"polyc_e{h}" for h in range(g + 1, count)]
            body.append(f"const int64_t polyc_in{g} = {' * '.join(inner) or '1'};")
        for g in range(count):
            position = order.index(g)
            inner = [f"polyc_e{order[k]}" for k in range(position + 1, count)]
            body.append(f"const int64_t polyc_out{g} = {' * '.join(inner) or '1'};")
        columns, rows = count - 1, order[-1]
        outer = [g for g in range(count) if g not in (rows, columns)]
        body += [
            f"const int64_t polyc_rows = polyc_e{rows}, polyc_cols = polyc_e{columns};",
            f"const int64_t polyc_sp = polyc_in{rows}, polyc_dp = polyc_out{columns};",
            f"const int64_t polyc_rt = (polyc_rows + {TILE - 1}) / {TILE}, polyc_ct = (polyc_cols + {TILE - 1}) / {TILE};",
            f"const int64_t polyc_planes = {' * '.join(f'polyc_e{g}' for g in outer) or '1'};",
            "const int64_t polyc_items = polyc_planes * polyc_rt * polyc_ct;",
        ]
        # A tile: its plane (the outer groups' indices, the last fastest), then its row of tiles
        # and its column of tiles (the fastest: neighbouring tiles read neighbouring input rows).
        item = [
            "const int64_t polyc_tile = polyc_x % (polyc_rt * polyc_ct);",
            "int64_t polyc_plane = polyc_x / (polyc_rt * polyc_ct);",
            "int64_t polyc_from = 0, polyc_to = 0;",
        ]
        for g in reversed(outer):
            item += [
                f"polyc_from += polyc_plane % polyc_e{g} * polyc_in{g};",
                f"polyc_to += polyc_plane % polyc_e{g} * polyc_out{g};",
                f"polyc_plane /= polyc_e{g};",
            ]
        item += [
            f"const int64_t polyc_i = polyc_tile / polyc_ct * {TILE}, polyc_j = polyc_tile % polyc_ct * {TILE};",
            f"polyc_tr_tile({t.source} + polyc_from + polyc_i * polyc_sp + polyc_j, "
            f"{t.target} + polyc_to + polyc_j * polyc_dp + polyc_i, polyc_min({TILE}, polyc_rows - polyc_i), "
            f"polyc_min({TILE}, polyc_cols - polyc_j), polyc_sp, polyc_dp);",
        ]
        serial = [
            "for (int64_t polyc_x = 0; polyc_x < polyc_items; polyc_x++) {",
            *("    " + line for line in item),
            "}",
        ]
        work = "(double)polyc_planes * (double)polyc_rows * (double)polyc_cols"
        if self.options.parallel:
            body += self.parallel_region(
                work, _PARALLEL_THRESHOLD, ["#pragma omp for schedule(static)", *serial], serial
            )
        else:
            body += serial
        body.append("return 0;")
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"


__all__ = ["ISA_GUARDS", "TILE", "generate_transpose", "merged_dimensions"]
