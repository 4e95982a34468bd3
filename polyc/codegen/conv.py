"""C for convolutions: a direct kernel, vectorised along output pixels, register-blocked over
output channels, with no im2col copy of the image.

For a :class:`~polyc.schedule.convolution.Convolution` this module prints one translation unit
whose function has the same signature as the generic back end's (:mod:`polyc.codegen.c`).
Every convolution is written as a sum of products of offsets that the kernel tabulates once
per call::

    O[out_b[b] + out_f[f] + out_p[q]] (+)= sum over r of I[in_b[b] + in_p[q] + in_r[r]] * W[w_g[g(b)] + w_f[f] + w_r[r]]

where ``b`` runs over *items* (batch indices, group indices and the outer spatial indices),
``f`` over the output channels (the F indices, flattened), ``q`` over the *points* (the inner
spatial indices) and ``r`` over the reduction (input channels and kernel offsets, in W's
order).  A window ``s*x + d*k + o`` splits into ``s*x`` (in ``in_b`` or ``in_p``) and
``d*k + o`` (in ``in_r``), which is what makes this form exact for any strides, dilations,
groups and layouts.  It is a matrix product ``O[f, q] = W[f, r] * B[r, q]`` whose B (the
im2col matrix) is never built: row r of B at points q0.. is the image itself at
``in_b[b] + in_p[q0] + in_r[r]`` when the points are consecutive in the image.

Which dimension is vectorised.  The register block holds RF output channels x RV vectors of
consecutive points: each step of the reduction loads RV vectors of the image (one row of B),
broadcasts RF packed weights, and does RF x RV fused multiply-adds.  Vectorising along the
points (rather than along the output channels, with W packed in channel blocks and the image
broadcast) is chosen because in the layouts convolutions come in (NCHW: ``O(n, f, h, w)``,
``I(n, c, h + kh, w + kw)``) the output width ``w`` is the stride-1 dimension of both the
output and, at stride 1, of the image, so the loads and the stores are plain contiguous vector
accesses, while the output channels are a whole plane apart in O (vectorising along them would
scatter every store).  Weights in the usual layout (``W(F, C, KH, KW)``: each channel's
reduction points consecutive, the channels' rows evenly spaced) are read in place, the
broadcasts of a block reading RF rows side by side (a block's rows past the last channel read
row 0 and are dropped); other layouts are packed once per call into blocks of RF channels,
``[group][channel block][r][RF]`` (zero rows pad the last block), so the broadcasts read one
contiguous stream.

The points.  When the two innermost dimensions of O are spatial indices ``h, w`` whose windows
have stride 1 on the two innermost dimensions of I (``I(.., h + d*kh, w + d*kw)``), the points
are flattened with the image's row pitch: ``q = h * IW + w`` over ``[0, (OH - 1) * IW + OW)``,
so that every run of NR points is one contiguous run of the image, across rows.  Points with
``w >= OW`` (``(KW - 1) * d`` per row) are computed and dropped (``out_p[q] < 0``): for 56-wide
3x3 layers that is 4 % of the work, while cutting each row into whole vectors would waste 16 %
(54 = 3 x 16 + 6), and for 14-wide images far more.  The last point stays inside the image,
so nothing is read out of bounds.  Otherwise the points are the spatial indices in O's order
(or, with a strided innermost window, all of them), and when they are not consecutive in the
image (strided convolutions, NHWC layouts) each run of NR points is packed into a panel
``[r][NR]`` first, shared by all the channel blocks of the run (an im2col of one tile, in
cache, never of the whole image).

Edges and write-back.  A tile of NR points ends early at the last point: its last vector
loads and stores under a lane mask (AVX-512 ``maskz_loadu``/``mask_storeu``, AVX2
``maskload``/``maskstore``), and shorter tiles use kernels with fewer vectors (one per count
1..RV), so no lane beyond the last point is read and little is computed on padding.  A tile
whose outputs are consecutive in O is stored straight from the registers.  A flattened tile
that crosses the end of a row has its dropped points in between; its output points are still
consecutive in O once those are left out, so AVX-512 compresses each vector's kept lanes
together (``vcompressps``) and stores them under a mask, from the registers too.  Otherwise
(AVX2 and portable builds of such tiles, NHWC and other layouts) the block goes through a
buffer, point by point.  Nothing outside the tensors is read or written.

Register blocks.  The instruction set is chosen by the C preprocessor, so one source serves
every machine: AVX-512 (``__AVX512F__``), AVX2 with FMA, or portable C whose loops the compiler
vectorises (``vectorize=False`` selects the portable code everywhere; it is also what an aarch64
export builds).  RF is chosen from the number of output channels when the sizes are known (4;
1 or 2 for depthwise and other few-channel filters, whose register block then holds more
vectors of points), RV from the registers: AVX-512 4 x 6 (24 accumulators), AVX2 4 x 3.

Epilogues (bias, activation) run on each finished block of RF channels x NR points while it is
in L1, after its write-back, as a loop over the block's output points (consecutive ones: a
plain loop the compiler vectorises: min/max are the prelude's branch-free ``polyc_fmaxf`` and
the like, with C's semantics, not calls into libm).  Threads (``parallel=True``, enough work): OpenMP shares out
(item, tile of points, chunk of channel blocks) triples dynamically; a chunk is all the channel
blocks unless there are fewer than four triples per thread.  The ``conv_block``
option sets the channels per chunk (rounded to a multiple of RF).
Packed weights and input panels live in a block of memory the kernel keeps from call to call
(:data:`polyc.codegen.pattern_kernel.KEPT_WORKSPACE_C`).  The function returns 0, or 2 when
memory for its tables and buffers could not be allocated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod

import numpy as np

from polyc.codegen import conv_channels
from polyc.codegen.c import _extent_name, c_comment
from polyc.codegen.c_expr import PRELUDE, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter, typed
from polyc.codegen.register_epilogue import RegisterEpilogue
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.options import Options
from polyc.schedule import tiling
from polyc.schedule.convolution import Convolution
from polyc.target import isa_guards

#: The return value when tables or buffers cannot be allocated (as the gemm kernel's).
STATUS_OUT_OF_MEMORY = 2

#: Marks the generated source (the driver reads it to report allocation failures).
CONV_KERNEL_MARK = "polyc conv kernel"

#: Below this many multiply-adds a convolution runs on one thread.
_PARALLEL_THRESHOLD = 64 * 64 * 64

#: The C preprocessor condition of each instruction set, best first (portable: the rest).
ISA_GUARDS = isa_guards(("avx512", "avx2"), "POLYC_CONV_PORTABLE")

#: Vectors of points per register block, per instruction set and channel rows RF: RF x RV
#: accumulators, RV loaded vectors and one broadcast fit the registers (32 with AVX-512, 16
#: with AVX2).  With one row each loaded vector is used once (a memory operand of the FMA).
_VECTORS = {
    "avx512": {1: 8, 2: 10, 4: 6},
    "avx2": {1: 6, 2: 5, 4: 3},
}

#: Relative speed of each RF on full blocks (fewer rows: fewer FMAs per load).  More than 4
#: rows would only pad more channels, at the same ratio of loads to FMAs.
_ROW_EFFICIENCY = {4: 1.0, 2: 0.8, 1: 0.55}


@dataclass(frozen=True)
class BlockShape:
    """RF channel rows x ``vectors`` vectors of ``lanes`` points."""

    isa: str
    rf: int
    lanes: int
    vectors: int

    @property
    def nr(self) -> int:
        return self.lanes * self.vectors


def choose_rows(channels: int | None) -> int:
    """RF for a number of output channels (None: unknown, parametric): the best
    ``efficiency x useful rows``, where the last block of channels is padded to RF rows."""
    if not channels:
        return 4
    return max(_ROW_EFFICIENCY, key=lambda rf: _ROW_EFFICIENCY[rf] * channels / (-(-channels // rf) * rf))


def block_shape(isa: str, dtype: np.dtype, rf: int) -> BlockShape:
    """The register block of ``isa`` for ``rf`` channel rows; portable: one buffer of 32 bytes x 4."""
    itemsize = np.dtype(dtype).itemsize
    if isa == "portable":
        return BlockShape(isa, rf, 128 // itemsize, 1)
    lanes = (64 if isa == "avx512" else 32) // itemsize
    return BlockShape(isa, rf, lanes, _VECTORS[isa][rf])


def generate_direct_conv(program: PolyProgram, conv: Convolution, options: Options) -> DedicatedKernel:
    """The C translation unit computing ``program`` (one convolution and its epilogues) with the
    direct convolution kernel.  The Winograd and depthwise kernels, which take convolutions of
    their own forms, are other kernel paths (:mod:`polyc.paths`)."""
    return _ConvWriter(program, conv, options).write()


@dataclass(frozen=True)
class _Layout:
    """How the kernel enumerates the convolution: which target indices are items and points,
    whether the points are flattened rows (``flat``: the last two indices, image row pitch) or
    a plain product, and which dimension is vectorised (``channels``: the output channels,
    :mod:`polyc.codegen.conv_channels`; else the points)."""

    items: tuple[str, ...]
    points: tuple[str, ...]
    flat: bool
    reduction: tuple[str, ...]
    channels: bool = False


def _layout(conv: Convolution, image_rank: int) -> _Layout:
    reduction = tuple(i for i in conv.weight_indices if i in conv.channels or i in conv.kernel)
    inner = conv.target_indices[-1]
    if conv.f and conv.f == conv.target_indices[-len(conv.f) :]:
        # Output channels innermost (NHWC; several indices: a blocked layout's (f / B, f % B),
        # numbered as one channel): vectorised along them; every other index but the groups
        # is a point, the batch included, so that tiles run on across images.
        items = tuple(i for i in conv.target_indices if i in conv.groups)
        points = tuple(i for i in conv.target_indices if i not in conv.f and i not in items)
        return _Layout(items, points, False, reduction, channels=True)
    if inner in conv.spatial and conv.window_of(inner).stride == 1 and conv.window_of(inner).dim == image_rank - 1:
        outer = conv.target_indices[-2] if len(conv.target_indices) >= 2 else None
        if outer in conv.spatial and conv.window_of(outer).stride == 1 and conv.window_of(outer).dim == image_rank - 2:
            points, flat = (outer, inner), True
        else:
            points, flat = (inner,), False
    else:
        points, flat = conv.spatial, False
    items = tuple(i for i in conv.target_indices if i not in conv.f and i not in points)
    return _Layout(items, points, flat, reduction)


class _ConvWriter(PatternKernelWriter):
    def __init__(self, program: PolyProgram, conv: Convolution, options: Options):
        super().__init__(program, options)
        self.conv = conv
        self.dtype = conv.dtype
        self.ctype = c_type(self.dtype)
        self.layout = _layout(conv, self.definition.tensor(conv.image).rank)
        known = [self.known_extent(conv.extent(i)) for i in conv.f]
        channels = None if None in known else prod(known)
        self.rf = choose_rows(channels)
        points = None
        if self.specialised and self.layout.channels:
            points = prod(conv.extent(i).evaluate(program.size_values) for i in self.layout.points)
        self.channel_blocks = {
            isa: conv_channels.channel_block(isa, self.dtype, channels, points) for isa in ISA_GUARDS
        }
        # Channel mode applies what it can of the epilogue to the accumulators, in registers.
        self.register_epilogue = (
            RegisterEpilogue.of(conv.epilogues, self.definition, conv.target_indices, conv.f)
            if self.layout.channels and options.vectorize
            else None
        )

    # ------------------------------------------------------------------ top level
    def write(self) -> DedicatedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [
            self.header(),
            PRELUDE,
            self.includes(),
            typed(_COMMON, self.ctype),
            self.context_struct(),
            self.instruction_sets(),
            self.epilogue_function(),
            self.driver(),
            self.entry_function(name, sizes),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions`."""
        lay = self.layout
        if lay.channels:
            blocks = {
                isa: {"channels": b.nf, "vectors": b.vectors, "lanes": b.lanes, "points": b.points}
                for isa, b in self.channel_blocks.items()
            }
        else:
            blocks = {}
            for isa in ISA_GUARDS:
                shape = block_shape(isa, self.dtype, self.rf)
                blocks[isa] = {"channels": shape.rf, "vectors": shape.vectors, "lanes": shape.lanes, "points": shape.nr}
        return {
            "kernel": "direct_convolution",
            "convolution": self.conv.describe(),
            "vectorised": "output channels" if lay.channels else "output points",
            "items": lay.items,
            "points": lay.points,
            "flat_rows": lay.flat,
            "reduction": lay.reduction,
            "instruction_sets": tuple(ISA_GUARDS),
            "register_blocks": blocks,
            "conv_block": self.options.conv_block,
            "chunk_blocks": self.chunk_blocks(),
            "padded_copy": self.copies_padding,
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
        }

    def chunk_blocks(self) -> int:
        """Register blocks per work item the ``conv_block`` option asks for (0: the kernel's
        choice per call: every channel block, unless there are fewer than four work items a thread)."""
        if not self.options.conv_block:
            return 0
        per = self.channel_blocks["avx512"].points if self.layout.channels else self.rf
        return max(1, self.options.conv_block // per)

    def header(self) -> str:
        o, lay = self.options, self.layout
        sizes = self.sizes_comment()
        if lay.channels:
            block = self.channel_blocks["avx512"]
            form = (
                f"output channels vectorised, up to {block.vectors} vectors of channels x {block.points} "
                "points per AVX-512 register block"
            )
        else:
            form = f"points vectorised, {self.rf} output channels per register block"
        lines = [
            f"{CONV_KERNEL_MARK} for def '{self.definition.name}' (direct convolution: {form})",
            f"sizes: {sizes}",
            f"options: conv_block={o.conv_block} parallel={o.parallel} vectorize={o.vectorize} "
            f"specialize={o.specialize}",
            f"convolution: {self.conv.describe()}",
            f"items: ({', '.join(lay.items)}); points: ({', '.join(lay.points)})"
            + (" flattened with the image's row pitch" if lay.flat else "")
            + f"; reduction: ({', '.join(lay.reduction)})",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def includes(self) -> str:
        return self.preamble("POLYC_CONV_PORTABLE", [])

    # ------------------------------------------------------------------ the context record
    def epilogue_tensors(self) -> list[str]:
        return self.tensors_of_epilogues(self.conv.target, self.conv.epilogues)

    def context_struct(self) -> str:
        t = self.ctype
        fields = [
            f"const {t} *in",
            f"{t} *out",
            f"const {t} *wpack",
            f"const {t} *w",
            "int64_t nitems, nf, nfb, npoints, nout, nred, ntiles, wg_stride, w_step, w_row",
            "const int64_t *w_g, *w_f, *w_r",
            "int64_t ngroups",
            "const int64_t *in_b, *out_b, *wg_b, *out_f, *in_r, *in_p, *out_p, *out_c, *tile_p, *panel_r",
            "const unsigned char *unit",
            "const uint32_t *vmask",
            "const unsigned char *vstep",
            "int direct, packed_out, dense_out, stream_out",
            "int64_t take_size, takes, nwork, rchunk, fchunk_size, fchunks, image_elements",
            f"int64_t key[{self.key_length()}]",
        ]
        rank = self.definition.tensor(self.conv.image).rank
        fields += [
            f"const {t} *image",
            f"int64_t pad_elements, pad_shape[{rank}], pad_base[{rank}], pad_lo[{rank}], pad_hi[{rank}]",
            f"int64_t image_stride[{rank}]",
            "int64_t nchan, ntaps",
            "const uint16_t *tap_points",
        ]
        for name in self.epilogue_tensors():
            tensor = self.definition.tensor(name)
            qualifier = "const " if tensor.role is ir.Role.INPUT else ""
            fields.append(f"{qualifier}{c_type(tensor.dtype)} *t_{name}")
        if self.conv.epilogues:
            if not self.specialised:
                fields += [f"int64_t s_{self.size_c[s]}" for s in self.definition.sizes]
            fields += [f"const int64_t *ix_{index}" for index in self.conv.target_indices]
        body = "\n".join(f"    {f};" for f in fields)
        return (
            "/* Everything the loops need: the image, the output, the packed weights ([group][channel\n"
            "   block][r][RF]); per item b the offsets in_b (image), out_b (output) and wg_b (packed weight\n"
            "   group); per channel f out_f; per reduction point r in_r; per point q in_p and out_p (-1: a\n"
            "   flattened point outside the output); per output point p (the points q with out_p[q] >= 0,\n"
            "   in order) out_c; tile_p[t]: the first output point of tile t (t <= ntiles); panel_r[r] =\n"
            "   r * NR; per tile unit (its outputs are consecutive); per vector of LANES points vmask (its\n"
            "   lanes with out_p >= 0) and vstep (1 or 2: its points' image offsets step by that, else 0); direct: in_p[q] == in_p[0] + q for every q (the image is read in\n"
            "   place, else tiles are packed); packed_out: out_c[p] == out_c[0] + p (the outputs of a tile\n"
            "   are consecutive once the dropped points are left out); dense_out: and out_c[0] == 0;\n"
            "   ix_*: index values for the epilogue (of the points: per output point p); w_g, w_f, w_r:\n"
            "   the weights' offsets per group, channel and reduction point; work items (set per call):\n"
            "   nwork of them, `takes` per item and tile (or channel block) of `take_size` channel blocks\n"
            "   (or tiles), rchunk: reduction steps per chunk (channel mode); key: the sizes the tables\n"
            "   were built for; with zero padding, pad_lo <= p < pad_hi is the box in the coordinates of\n"
            "   the padded image (shape pad_shape; element p is the image at pad_base + p inside the box,\n"
            "   else zero), which points mode copies (pad_elements > 0: in is that copy) and channel mode\n"
            "   does not (pad_elements == 0: in is the image); tap_points[t * ntaps + tap] (NULL: no\n"
            "   padding) the points of tile t that read\n"
            "   the tap inside the box (bit j: point j); the reduction is ntaps taps of nchan steps. */\n"
            f"#define POLYC_IMAGE_RANK {rank}\n"
            f"typedef struct {{\n{body}\n}} polyc_conv_t;"
        )

    # ------------------------------------------------------------------ register blocks
    def instruction_sets(self) -> str:
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            if isa != "portable":
                pieces.append("#include <immintrin.h>")
            if self.layout.channels:
                pieces.append(f'#define POLYC_CONV_ISA "{isa}"')
                pieces += conv_channels.instruction_set(
                    self.channel_blocks[isa], self.dtype, self.register_epilogue, self.definition, self.point_stride()
                )
                continue
            shape = block_shape(isa, self.dtype, self.rf)
            pieces += [
                f'#define POLYC_CONV_ISA "{isa}"',
                f"#define POLYC_RF {shape.rf}",
                f"#define POLYC_FBLOCK {shape.rf}",
                "#define POLYC_PANELS 1",
                f"#define POLYC_COMPRESS {1 if isa == 'avx512' else 0}",
                f"#define POLYC_NR {shape.nr}",
                f"#define POLYC_LANES {shape.lanes}",
            ]
            pieces.append(_STEPPED_PACKING.get((isa, self.ctype), "#define POLYC_PACK_STEPPED 0"))
            if isa == "portable":
                pieces.append(typed(_PORTABLE_KERNEL, self.ctype))
            else:
                pieces += [_vector_kernel(shape, self.dtype, nv) for nv in range(1, shape.vectors + 1)]
                if isa == "avx2":
                    pieces += [
                        _vector_kernel(shape, self.dtype, nv, masked=False) for nv in range(1, shape.vectors + 1)
                    ]
                pieces.append(_dispatch(shape, self.ctype))
        pieces.append("#endif")
        return "\n".join(pieces)

    def point_stride(self) -> int | None:
        """The image's distance (elements) between neighbouring output points of a row, when
        the sizes are known and the kernel reads the image itself (not a padded copy)."""
        conv = self.conv
        if not self.specialised or conv.box:
            return None
        window = next((w for w in conv.windows if w.x == self.layout.points[-1]), None)
        if window is None:
            return None
        extents = [e.evaluate(self.program.size_values) for e in self.definition.tensor(conv.image).shape]
        return window.stride * prod(extents[window.dim + 1 :])

    # ------------------------------------------------------------------ epilogue
    def epilogue_function(self) -> str:
        conv = self.conv
        if not conv.epilogues:
            return (
                "#define POLYC_HAS_EPILOGUE 0\n"
                "static void polyc_epilogue(const polyc_conv_t *g, int64_t b, int64_t f0, int64_t rows,\n"
                "                           int64_t p0, int64_t p1)\n"
                "{ (void)g; (void)b; (void)f0; (void)rows; (void)p0; (void)p1; }"
            )
        lay = self.layout
        body = self.size_declarations(lambda s: f"polyc_g->s_{self.size_c[s]}")
        for name in self.epilogue_tensors():
            tensor = self.definition.tensor(name)
            qualifier = "const " if tensor.role is ir.Role.INPUT else ""
            body.append(f"{qualifier}{c_type(tensor.dtype)} *restrict {name} = polyc_g->t_{name};")
        body += [f"const int64_t polyc_ix_{i} = polyc_g->ix_{i}[polyc_b];" for i in lay.items]
        body += ["(void)polyc_b;", "const int64_t polyc_ob = polyc_g->out_b[polyc_b];"]
        statements = [self.epilogue_statement(s) + ";" for s in conv.epilogues]
        simd = ["#pragma omp simd"] if self.options.vectorize else []
        if lay.channels:  # per point, a loop over consecutive channels the compiler vectorises
            body += [
                "for (int64_t polyc_p = polyc_p0; polyc_p < polyc_p1; polyc_p++) {",
                *(f"    const int64_t polyc_ix_{i} = polyc_g->ix_{i}[polyc_p];" for i in lay.points),
                "    const int64_t polyc_op = polyc_ob + polyc_g->out_p[polyc_p];",
                *("    " + line for line in simd),
                "    for (int64_t polyc_f = polyc_f0; polyc_f < polyc_f0 + polyc_rows; polyc_f++) {",
                "        const int64_t polyc_o = polyc_op + polyc_f;",
                # one channel index is the channel number; several (a blocked layout) come from tables
                *(
                    f"        const int64_t polyc_ix_{i} = "
                    f"{'polyc_f' if len(conv.f) == 1 else f'polyc_g->ix_{i}[polyc_f]'};"
                    for i in conv.f
                ),
                *("        " + line for line in statements),
                "    }",
                "}",
            ]
            return self._epilogue_text(body)

        def point_loop(offset: str) -> list[str]:
            return [
                *simd,
                "for (int64_t polyc_p = polyc_p0; polyc_p < polyc_p1; polyc_p++) {",
                *(f"    const int64_t polyc_ix_{i} = polyc_g->ix_{i}[polyc_p];" for i in lay.points),
                f"    const int64_t polyc_o = polyc_of + {offset};",
                *("    " + line for line in statements),
                "}",
            ]

        body += [
            "for (int64_t polyc_f = polyc_f0; polyc_f < polyc_f0 + polyc_rows; polyc_f++) {",
            *(f"    const int64_t polyc_ix_{i} = polyc_g->ix_{i}[polyc_f];" for i in conv.f),
            "    const int64_t polyc_of = polyc_ob + polyc_g->out_f[polyc_f];",
            "    if (polyc_g->dense_out) {  /* consecutive outputs: a plain loop the compiler vectorises */",
            *("        " + line for line in point_loop("polyc_p")),
            "    } else {",
            *("        " + line for line in point_loop("polyc_g->out_c[polyc_p]")),
            "    }",
            "}",
        ]
        return self._epilogue_text(body)

    @staticmethod
    def _epilogue_text(body: list[str]) -> str:
        return (
            "#define POLYC_HAS_EPILOGUE 1\n"
            + "/* The statements after the convolution, on one finished block: item b, channels f0..,\n"
            "   output points p0 <= p < p1. */\n"
            "static void polyc_epilogue(const polyc_conv_t *polyc_g, int64_t polyc_b, int64_t polyc_f0,\n"
            "                           int64_t polyc_rows, int64_t polyc_p0, int64_t polyc_p1)\n{\n"
            + "\n".join("    " + line for line in body)
            + "\n}\n"
        )

    def epilogue_statement(self, statement: ir.CheckedStatement) -> str:
        """One epilogue statement at output point ``polyc_o`` (the target read there too)."""
        return self.epilogue_assignment(statement, self.conv.target_indices, lhs=f"{self.conv.target}[polyc_o]")

    # ------------------------------------------------------------------ the loops
    def driver(self) -> str:
        channels = self.layout.channels
        text = typed((conv_channels.WORK if channels else _POINTS_WORK) + _RUN, self.ctype)
        if not self.options.parallel:
            text = re.sub(r"#if defined\(_OPENMP\)\n.*?#endif\n", "", text, flags=re.DOTALL)
        # conv_block: output channels per work item (points mode), or output points per work
        # item (channel mode).
        take = self.chunk_blocks()
        return (
            text.replace("STATUS", str(STATUS_OUT_OF_MEMORY))
            .replace("THRESHOLD", f"{float(_PARALLEL_THRESHOLD)!r}")
            .replace("WEIGHT_SLICE", str(conv_channels.WEIGHT_SLICE_BYTES))
            .replace("FLOPS_PER_BYTE", f"{conv_channels.FLOPS_PER_BYTE!r}")
            .replace("OUTPUT_PREFETCH_STEPS", str(conv_channels.OUTPUT_PREFETCH_STEPS))
            .replace("IMAGE_ROW_RUNS", str(conv_channels.IMAGE_ROW_RUNS))
            .replace("CHUNK_BLOCKS", str(take))
            .replace("STREAM_BYTES", str(tiling.cache_sizes(self.options).get(3, 32 << 20)))
        )

    # ------------------------------------------------------------------ the entry point
    def image_term(self, index: str) -> str | None:
        """The image offset of ``index`` (as C in ``polyc_v_<index>``), or None when absent."""
        conv = self.conv
        v = f"polyc_v_{index}"
        if index in conv.image_plain:
            return f"{v} * {self.image_stride(conv.image_plain.index(index))}"
        for w in conv.windows:
            if w.x == index:
                return f"{v} * {w.stride} * {self.image_stride(w.dim)}"
            if w.k == index:
                return f"{v} * {w.dilation} * {self.image_stride(w.dim)}"
        return None

    @property
    def copies_padding(self) -> bool:
        """Whether the kernel reads a zero-padded copy of the image: with padding, in points mode
        (the points of a tile are consecutive elements of the image, read as vectors across
        the padding).  Channel mode reads the image itself (see :mod:`polyc.codegen.conv_channels`:
        a point reads only the taps it reads inside the box)."""
        return bool(self.conv.box) and not self.layout.channels

    def image_stride(self, dim: int) -> str:
        """The stride of the image the kernel reads: its zero-padded copy's, if it reads one."""
        return f"polyc_pad_stride{dim}" if self.copies_padding else self.stride(self.conv.image, dim)

    def padding(self) -> list[str]:
        """With zero padding: C declaring the padded image's extents ``polyc_pad_extent<d>``
        (every position a window reaches, from its offset on), the box ``polyc_pad_lo<d>``/
        ``polyc_pad_hi<d>`` in its coordinates (the image's bounds with the statement's
        condition), and the strides of its copy when the kernel reads one."""
        conv = self.conv
        rank = self.definition.tensor(conv.image).rank
        bounds = {b.dim: b for b in conv.box}
        lines = []
        for dim in range(rank):
            image_extent = _extent_name(conv.image, dim)
            window = next((w for w in conv.windows if w.dim == dim), None)
            if window is None:
                extent, base, lo, hi = image_extent, "0", "0", image_extent
            else:
                reach = f"{window.stride} * (({self.size_expr(conv.extent(window.x))}) - 1)"
                if window.k is not None:
                    reach += f" + {window.dilation} * (({self.size_expr(conv.extent(window.k))}) - 1)"
                extent, base = f"polyc_max(1, {reach} + 1)", str(window.offset)
                bound = bounds.get(dim)
                lo = "0" if bound is None or bound.lo is None else f"polyc_max(0, {self.size_expr(bound.lo)})"
                hi = (
                    image_extent
                    if bound is None or bound.hi is None
                    else f"polyc_min({image_extent}, {self.size_expr(bound.hi)})"
                )
                lo, hi = f"{lo} - ({base})", f"{hi} - ({base})"
            lines.append(
                f"const int64_t polyc_pad_extent{dim} = {extent}, polyc_pad_base{dim} = {base}, "
                f"polyc_pad_lo{dim} = {lo}, polyc_pad_hi{dim} = {hi};"
            )
        for dim in range(rank if self.copies_padding else 0):
            later = [f"polyc_pad_extent{d}" for d in range(dim + 1, rank)]
            lines.append(f"const int64_t polyc_pad_stride{dim} = {' * '.join(later) or '1'};")
        return lines

    def tap_points(self) -> list[str]:
        """C filling ``polyc_tap_points`` (per tile, per kernel tap): bit j set when point j of
        the tile reads the tap inside the box along every window dimension (its products are in
        the sum).  The reduction is the taps, each a run of the channels (the recognition asks
        for W(kh, kw, c, f)), so a tap is ``nchan`` consecutive steps."""
        conv = self.conv
        checks = [f"polyc_px{n}[polyc_q0 + polyc_j] + polyc_kx{n}[polyc_r]" for n in range(len(conv.windows))]
        inside = " && ".join(
            f"{c} >= polyc_pad_lo{w.dim} && {c} < polyc_pad_hi{w.dim}" for c, w in zip(checks, conv.windows)
        )
        return [
            "polyc_g.ntaps = polyc_ntaps; polyc_g.nchan = polyc_ntaps > 0 ? polyc_nred / polyc_ntaps : 0;",
            "if (polyc_g.nchan > 0) {",
            "    uint16_t *polyc_points = (uint16_t *)polyc_tap_points;",
            "    for (int64_t polyc_t = 0; polyc_t < polyc_ntiles; polyc_t++) {",
            "        const int64_t polyc_q0 = polyc_t * POLYC_NR, polyc_n = polyc_min(POLYC_NR, polyc_npoints - polyc_q0);",
            "        for (int64_t polyc_tap = 0; polyc_tap < polyc_ntaps; polyc_tap++) {",
            "            const int64_t polyc_r = polyc_tap * polyc_g.nchan;",
            "            unsigned polyc_bits = 0;",
            "            for (int64_t polyc_j = 0; polyc_j < polyc_n; polyc_j++)",
            f"                polyc_bits |= (unsigned)({inside}) << polyc_j;",
            "            polyc_points[polyc_t * polyc_ntaps + polyc_tap] = (uint16_t)polyc_bits;",
            "        }",
            "    }",
            "    polyc_g.tap_points = polyc_points;",
            "}",
        ]

    def points_by_padding(self, epilogue: bool) -> list[str]:
        """C putting the points in order of the taps they read in the padding (those that read
        none first), so that a tile's points mostly read the same taps there and skip them
        together: in the image's order, a 14-wide row's tiles of 6 points nearly all hold an
        edge point, whose taps in the padding the tile's other points read inside.  The key of a
        point: per window, how many of the kernel's first and last offsets fall outside the
        box (a window's valid offsets are a run).  Every table of the points is permuted."""
        conv, lay = self.conv, self.layout
        key = ["uint64_t polyc_key = 0;  /* wraps past 40 offsets: the order is only a heuristic */"]
        for n, w in enumerate(conv.windows):
            taps = self.size_expr(conv.extent(w.k)) if w.k else "1"
            step = w.dilation if w.k else 0
            key += [
                f"for (int64_t polyc_k = 0, polyc_taps = {taps}; polyc_k < polyc_taps; polyc_k++) {{",
                f"    const int64_t polyc_at = polyc_px{n}[polyc_x] + {step} * polyc_k;",
                f"    polyc_key = polyc_key * 3 + (polyc_at < polyc_pad_lo{w.dim} ? 1 : "
                f"polyc_at >= polyc_pad_hi{w.dim} ? 2 : 0);",
                "}",
            ]
        tables = ["in_p", "out_p", "out_c"] + [f"px{n}" for n in range(len(conv.windows))]
        tables += [f"ix_{i}" for i in lay.points] if epilogue else []
        return [
            "{",
            "    polyc_sort_t *polyc_order = (polyc_sort_t *)malloc(sizeof(polyc_sort_t) * (size_t)polyc_npoints);",
            "    int64_t *polyc_old = (int64_t *)malloc(sizeof(int64_t) * (size_t)polyc_npoints);",
            "    if (polyc_order != NULL && polyc_old != NULL) {",
            "        for (int64_t polyc_x = 0; polyc_x < polyc_npoints; polyc_x++) {",
            *("            " + line for line in key),
            "            polyc_order[polyc_x].key = polyc_key;",
            "            polyc_order[polyc_x].index = polyc_x;",
            "        }",
            "        qsort(polyc_order, (size_t)polyc_npoints, sizeof *polyc_order, polyc_sort_compare);",
            *(f"        polyc_permute(polyc_{table}, polyc_old, polyc_order, polyc_npoints);" for table in tables),
            "    }",
            "    free(polyc_order);",
            "    free(polyc_old);",
            "}",
        ]

    def target_term(self, index: str) -> str:
        return f"polyc_v_{index} * {self.stride(self.conv.target, self.conv.target_indices.index(index))}"

    def weight_term(self, index: str) -> str:
        return f"polyc_v_{index} * {self.stride(self.conv.weights, self.conv.weight_indices.index(index))}"

    def loop_nest(self, indices: tuple[str, ...], assignments: list[str]) -> list[str]:
        """A loop nest over ``indices`` (outermost first) counting the flat index ``polyc_x``
        and running ``assignments`` (C statements in ``polyc_v_*`` and ``polyc_x``)."""
        lines = ["{", "    int64_t polyc_x = 0;"]
        for depth, index in enumerate(indices):
            extent = self.size_expr(self.conv.extent(index))
            lines.append(
                "    " * (depth + 1) + f"for (int64_t polyc_v_{index} = 0; polyc_v_{index} < ({extent}); "
                f"polyc_v_{index}++) {{"
            )
        inner = "    " * (len(indices) + 1)
        lines += [inner + a for a in assignments]
        lines.append(f"{inner}polyc_x++;")
        lines += ["    " * (depth + 1) + "}" for depth in reversed(range(len(indices)))]
        lines += ["    (void)polyc_x;", "}"]
        return lines

    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        d, conv, lay = self.definition, self.conv, self.layout
        arguments = []
        for t in d.tensors:
            qualified = f"const {c_type(t.dtype)}" if t.role is ir.Role.INPUT else c_type(t.dtype)
            arguments.append(f"{qualified} *__restrict__ {t.name}")  # as the generic back end: C++ reads it
        arguments += [f"int64_t {self.size_c[s]}" for s in sizes]
        body = self.size_declarations(lambda s: None)

        def count(indices) -> str:
            return " * ".join(f"({self.size_expr(conv.extent(i))})" for i in indices) or "1"

        def terms(parts: list[str | None]) -> str:
            return " + ".join(p for p in parts if p) or "0"

        epilogue = bool(conv.epilogues)
        body += [
            f"const int64_t polyc_nitems = {count(lay.items)};",
            f"const int64_t polyc_ngroups = {count(conv.groups)};",
            f"const int64_t polyc_nf = {count(conv.f)};",
            f"const int64_t polyc_nred = {count(lay.reduction)};",
        ]
        if lay.flat:
            h, w = lay.points
            oh, ow = (self.size_expr(conv.extent(i)) for i in (h, w))
            pitch = _extent_name(conv.image, d.tensor(conv.image).rank - 1)
            body += [
                f"const int64_t polyc_oh = {oh}, polyc_ow = {ow}, polyc_pitch = {pitch};",
                "/* Points flattened with the image's row pitch when there is a reduction (then the\n"
                "   pitch is at least the output width); else one point per output element. */",
                "const int polyc_flat = polyc_nred > 0 && polyc_oh > 0 && polyc_ow > 0;",
                "const int64_t polyc_npoints = polyc_flat ? (polyc_oh - 1) * polyc_pitch + polyc_ow"
                " : polyc_oh * polyc_ow;",
            ]
        else:
            body.append(f"const int64_t polyc_npoints = {count(lay.points)};")
        padded = bool(conv.box)
        if padded:
            body += self.padding()
        body += [
            "if (polyc_nitems == 0 || polyc_nf == 0 || polyc_npoints == 0) return 0;",
            "const int64_t polyc_nfb = (polyc_nf + POLYC_FBLOCK - 1) / POLYC_FBLOCK;",
            "const int64_t polyc_ntiles = (polyc_npoints + POLYC_NR - 1) / POLYC_NR;",
        ]
        if padded:
            taps = " * ".join(f"({self.size_expr(conv.extent(i))})" for i in lay.reduction if i in conv.kernel)
            body += [
                f"const int64_t polyc_ntaps = {taps or '1'};",
                "const int64_t polyc_tap_words = (polyc_ntiles * polyc_ntaps + 3) / 4;  /* uint16 each */",
            ]
        tables = [
            ("in_b", "nitems"),
            ("out_b", "nitems"),
            ("wg_b", "nitems"),
            ("w_g", "ngroups"),
            ("out_f", "nf"),
            ("w_f", "nf"),
            ("in_r", "nred"),
            ("w_r", "nred"),
            ("panel_r", "nred"),
            ("in_p", "npoints"),
            ("out_p", "npoints"),
            ("out_c", "npoints"),
            ("tile_p", "ntiles + 1"),
        ]
        if epilogue:
            tables += [(f"ix_{i}", "nitems") for i in lay.items] + [(f"ix_{i}", "nf") for i in conv.f]
            tables += [(f"ix_{i}", "npoints") for i in lay.points]
        if padded:  # per window: its points' and its reduction steps' share of the position
            tables += [(f"px{n}", "npoints") for n in range(len(conv.windows))]
            tables += [(f"kx{n}", "nred") for n in range(len(conv.windows))] + [("tap_points", "tap_words")]
        total = " + ".join(f"polyc_{count_name}" for _, count_name in tables)
        build = [
            "const int64_t polyc_nvec = (polyc_npoints + POLYC_LANES - 1) / POLYC_LANES;",
            f"polyc_tables = (int64_t *)malloc(sizeof(int64_t) * (size_t)({total}) + "
            "sizeof(uint32_t) * (size_t)polyc_nvec + (size_t)polyc_ntiles + (size_t)polyc_nvec);",
            f"if (polyc_tables == NULL) return {STATUS_OUT_OF_MEMORY};",
            "int64_t *polyc_next = polyc_tables;",
        ]
        for table, count_name in tables:
            build += [f"int64_t *polyc_{table} = polyc_next;", f"polyc_next += polyc_{count_name};"]
        build += [
            "uint32_t *polyc_vmask = (uint32_t *)polyc_next;",
            "unsigned char *polyc_unit = (unsigned char *)(polyc_vmask + polyc_nvec);",
            "unsigned char *polyc_vstep = polyc_unit + polyc_ntiles;",
        ]

        # items: image and output offsets, packed weight group, index values
        group_flat = []
        for position, g in enumerate(conv.groups):
            later = [f"({self.size_expr(conv.extent(o))})" for o in conv.groups[position + 1 :]]
            group_flat.append(" * ".join([f"polyc_v_{g}", *later]))
        item_lines = [
            f"polyc_in_b[polyc_x] = {terms([self.image_term(i) for i in lay.items])};",
            f"polyc_out_b[polyc_x] = {terms([self.target_term(i) for i in lay.items])};",
            f"polyc_wg_b[polyc_x] = {terms(group_flat)};",
        ]
        if epilogue:
            item_lines += [f"polyc_ix_{i}[polyc_x] = polyc_v_{i};" for i in lay.items]
        build += self.loop_nest(lay.items, item_lines)
        build += self.loop_nest(
            conv.groups, [f"polyc_w_g[polyc_x] = {terms([self.weight_term(g) for g in conv.groups])};"]
        )
        f_lines = [
            f"polyc_out_f[polyc_x] = {terms([self.target_term(i) for i in conv.f])};",
            f"polyc_w_f[polyc_x] = {terms([self.weight_term(i) for i in conv.f])};",
        ]
        if epilogue:
            f_lines += [f"polyc_ix_{i}[polyc_x] = polyc_v_{i};" for i in conv.f]
        build += self.loop_nest(conv.f, f_lines)
        # The padded copy starts at each window's offset; the image itself is read at it.
        offset = (
            "0"
            if self.copies_padding
            else terms([f"({w.offset}) * {self.stride(conv.image, w.dim)}" for w in conv.windows if w.offset])
        )
        reduction_lines = [
            f"polyc_in_r[polyc_x] = {terms([self.image_term(i) for i in lay.reduction])} + {offset};",
            f"polyc_w_r[polyc_x] = {terms([self.weight_term(i) for i in lay.reduction])};",
            "polyc_panel_r[polyc_x] = polyc_x * POLYC_NR;",
        ]
        if padded:
            reduction_lines += [
                f"polyc_kx{n}[polyc_x] = {f'{w.dilation} * polyc_v_{w.k}' if w.k else '0'};"
                for n, w in enumerate(conv.windows)
            ]
        build += self.loop_nest(lay.reduction, reduction_lines)
        # points: image and output offsets, output points (compact), index values of the output points
        point_lines = [
            f"polyc_in_p[polyc_x] = {terms([self.image_term(i) for i in lay.points])};",
            f"polyc_out_p[polyc_x] = polyc_out_c[polyc_x] = {terms([self.target_term(i) for i in lay.points])};",
        ]
        if epilogue:
            point_lines += [f"polyc_ix_{i}[polyc_x] = polyc_v_{i};" for i in lay.points]
        if padded:
            point_lines += [f"polyc_px{n}[polyc_x] = {w.stride} * polyc_v_{w.x};" for n, w in enumerate(conv.windows)]
        build.append("int64_t polyc_nout = polyc_npoints;")
        if lay.flat:
            h, w = lay.points
            flat_lines = [
                f"const int64_t polyc_v_{h} = polyc_x / polyc_pitch, polyc_v_{w} = polyc_x % polyc_pitch;",
                "polyc_in_p[polyc_x] = polyc_x;",
                f"polyc_out_p[polyc_x] = polyc_v_{w} < polyc_ow ? {self.target_term(h)} + {self.target_term(w)} : -1;",
                f"if (polyc_v_{w} < polyc_ow) {{",
                "    polyc_out_c[polyc_nout] = polyc_out_p[polyc_x];",
                *(f"    polyc_ix_{i}[polyc_nout] = polyc_v_{i};" for i in lay.points if epilogue),
                "    polyc_nout++;",
                "}",
            ]
            build += [
                "if (polyc_flat) {",
                "    polyc_nout = 0;",
                "    for (int64_t polyc_x = 0; polyc_x < polyc_npoints; polyc_x++) {",
                *("        " + line for line in flat_lines),
                "    }",
                "} else",
            ]
        build += self.loop_nest(lay.points, point_lines)
        if padded:
            build += self.points_by_padding(epilogue)
        build += [
            "/* Per tile: its first output point, and whether its outputs are consecutive; per vector:\n"
            "   its lanes that are output points. */",
            "for (int64_t polyc_t = 0, polyc_p = 0; polyc_t <= polyc_ntiles; polyc_t++) {",
            "    const int64_t polyc_q0 = polyc_t * POLYC_NR;",
            "    const int64_t polyc_n = polyc_min(POLYC_NR, polyc_npoints - polyc_q0);",
            "    polyc_tile_p[polyc_t] = polyc_p;",
            "    if (polyc_t == polyc_ntiles) break;",
            "    polyc_unit[polyc_t] = polyc_out_p[polyc_q0] >= 0"
            " && polyc_steps_by_one(polyc_out_p + polyc_q0, polyc_n);",
            "    for (int64_t polyc_j = 0; polyc_j < polyc_n; polyc_j++)",
            "        polyc_p += polyc_out_p[polyc_q0 + polyc_j] >= 0;",
            "}",
            "for (int64_t polyc_v = 0; polyc_v < polyc_nvec; polyc_v++) {",
            "    uint32_t polyc_bits = 0;",
            "    for (int64_t polyc_j = 0; polyc_j < POLYC_LANES && polyc_v * POLYC_LANES + polyc_j < polyc_npoints;"
            " polyc_j++)",
            "        polyc_bits |= (uint32_t)(polyc_out_p[polyc_v * POLYC_LANES + polyc_j] >= 0) << polyc_j;",
            "    polyc_vmask[polyc_v] = polyc_bits;",
            "    const int64_t *polyc_q = polyc_in_p + polyc_v * POLYC_LANES;",
            "    int polyc_step = polyc_v * POLYC_LANES + POLYC_LANES <= polyc_npoints ? (int)(polyc_q[1] - polyc_q[0]) : 0;",
            "    for (int64_t polyc_j = 1; polyc_j < POLYC_LANES && polyc_step; polyc_j++)",
            "        polyc_step = polyc_q[polyc_j] - polyc_q[polyc_j - 1] == polyc_step ? polyc_step : 0;",
            "    polyc_vstep[polyc_v] = (unsigned char)(polyc_step == 1 || polyc_step == 2 ? polyc_step : 0);",
            "}",
        ]
        build += [
            "polyc_g.nitems = polyc_nitems; polyc_g.nf = polyc_nf; polyc_g.nfb = polyc_nfb;",
            "polyc_g.npoints = polyc_npoints; polyc_g.nred = polyc_nred; polyc_g.ntiles = polyc_ntiles;",
            "polyc_g.nout = polyc_nout; polyc_g.out_c = polyc_out_c; polyc_g.tile_p = polyc_tile_p;",
            "polyc_g.vmask = polyc_vmask; polyc_g.vstep = polyc_vstep;",
            "polyc_g.packed_out = polyc_steps_by_one(polyc_out_c, polyc_nout);",
            "polyc_g.dense_out = polyc_g.packed_out && (polyc_nout == 0 || polyc_out_c[0] == 0);",
            "polyc_g.in_b = polyc_in_b; polyc_g.out_b = polyc_out_b; polyc_g.wg_b = polyc_wg_b;",
            "polyc_g.out_f = polyc_out_f; polyc_g.in_r = polyc_in_r; polyc_g.in_p = polyc_in_p;",
            "polyc_g.out_p = polyc_out_p; polyc_g.panel_r = polyc_panel_r; polyc_g.unit = polyc_unit;",
            "polyc_g.direct = polyc_steps_by_one(polyc_in_p, polyc_npoints);",
            "polyc_g.ngroups = polyc_ngroups; polyc_g.w_g = polyc_w_g; polyc_g.w_f = polyc_w_f;"
            " polyc_g.w_r = polyc_w_r;",
        ]
        if epilogue:
            build += [f"polyc_g.ix_{i} = polyc_ix_{i};" for i in conv.target_indices]
        rank = d.tensor(conv.image).rank
        if padded:
            build += self.tap_points()
            for dim in range(rank):
                build.append(
                    f"polyc_g.pad_shape[{dim}] = polyc_pad_extent{dim}; "
                    f"polyc_g.pad_base[{dim}] = polyc_pad_base{dim}; polyc_g.pad_lo[{dim}] = polyc_pad_lo{dim}; "
                    f"polyc_g.pad_hi[{dim}] = polyc_pad_hi{dim}; "
                    f"polyc_g.image_stride[{dim}] = {self.stride(conv.image, dim)};"
                )
            build.append(
                "polyc_g.pad_elements = "
                + (" * ".join(f"polyc_pad_extent{dim}" for dim in range(rank)) if self.copies_padding else "0")
                + ";"
            )
        body += self.kept_tables("polyc_conv_t", build)
        body.append(f"polyc_g.in = polyc_g.image = {conv.image}; polyc_g.out = {conv.target};")
        image_extents = [
            f"polyc_pad_extent{dim}" if self.copies_padding else _extent_name(conv.image, dim) for dim in range(rank)
        ]
        body.append(f"polyc_g.image_elements = {' * '.join(image_extents) or '1'};")
        for tensor in self.epilogue_tensors():
            body.append(f"polyc_g.t_{tensor} = {tensor};")
        if epilogue and not self.specialised:
            body += [f"polyc_g.s_{self.size_c[s]} = {self.size_c[s]};" for s in d.sizes]
        body += [
            f"const int polyc_status = polyc_conv_run(&polyc_g, {conv.weights}, {1 if conv.init else 0});",
            "free(polyc_tables);",
            "return polyc_status;",
        ]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"


# ----------------------------------------------------------------------------- micro-kernels

_KERNEL_ARGUMENTS = (
    "int64_t nred, const T *restrict wp, int64_t w_step, int64_t w_row, const T *restrict bp, "
    "const int64_t *restrict roff, "
    "int64_t n, T *restrict out, const int64_t *restrict row_off, int64_t rows, int beta, "
    "int mode, const uint32_t *restrict vmask, T *restrict block"
)


def _vector_kernel(shape: BlockShape, dtype: np.dtype, nv: int, masked: bool = True) -> str:
    """The RF x nv-vector block in AVX-512 or AVX2 intrinsics, unrolled.

    ``masked=False`` (``polyc_conv_kernel_<nv>_full``): for a tile of exactly nv whole vectors,
    with plain loads and stores.  AVX2 needs it: its lane mask lives in a vector register, and
    the 4 x 3 block already uses all 16 (12 accumulators, 3 rows of B, one broadcast), so
    holding the mask through the reduction made gcc spill an accumulator inside the loop
    and slowed a 3x3 64-channel convolution at 56 x 56 markedly (measured with
    ``python -m benchmarks --filter conv3x3``).  AVX-512's masks are k registers.

    The kernels are not inlined: inlined into the loop over channel blocks, gcc kept a
    constant of the epilogue (relu's zero) in a vector register across the reduction and
    spilled an accumulator for it.  A call per block of ``nred`` steps costs nothing.

    Row r of B (the image or a packed panel) is ``bp + roff[r]``; the packed weights of step r
    are ``wp[r * RF + i]``.  Lanes past ``n`` are not loaded (the last vector is loaded under a
    mask).  Row i of the block is written at ``out + row_off[i]`` (``beta``: added to what is
    there) by ``mode``: 1, the tile's outputs are consecutive: stores under the same mask; 2
    (AVX-512), its output points are consecutive once the dropped lanes are left out: each
    vector's lanes in ``vmask[v]`` are compressed together and stored under a mask; 0: the block
    goes to ``block`` (RF x NR) for the caller to scatter.
    """
    ctype = c_type(dtype)
    rf, lanes, nr = shape.rf, shape.lanes, shape.nr
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(rf)]
    last = nv - 1
    vec, pre, suffix, mask_line, load_full, store_full, load_last, store_last = conv_channels.masked_access(
        shape.isa, dtype, lanes, f"n - {last * lanes}" if masked else None
    )
    lines = [
        f"/* {rf} channels x {nv} {'' if masked else 'whole '}vector(s) of points. */",
        f"static __attribute__((noinline)) void polyc_conv_kernel_{nv}{'' if masked else '_full'}"
        f"({typed(_KERNEL_ARGUMENTS, ctype)})",
        "{",
        f"    {mask_line}" if mask_line else "    (void)n;",
    ]

    def load(v: int, base: str) -> str:
        return (load_last if v == last else load_full).format(ptr=f"{base} + {v * lanes}")

    def store(v: int, base: str, value: str) -> str:
        return (store_last if v == last else store_full).format(ptr=f"{base} + {v * lanes}", value=value)

    for row in acc:
        lines.append(f"    {vec} " + ", ".join(f"{name} = {pre}_setzero_{suffix}()" for name in row) + ";")
    lines += [
        f"    const {ctype} *restrict w{i} = wp + {'0' if i == 0 else f'(rows > {i} ? {i} * w_row : 0)'};"
        for i in range(rf)
    ]
    lines += [
        "    for (int64_t r = 0, k = 0; r < nred; r++, k += w_step) {",
        f"        const {ctype} *restrict row = bp + roff[r];",
        f"        const {vec} " + ", ".join(f"b{v} = {load(v, 'row')}" for v in range(nv)) + ";",
        f"        {vec} w;",
    ]
    for i in range(rf):
        fmas = " ".join(f"{acc[i][v]} = {pre}_fmadd_{suffix}(w, b{v}, {acc[i][v]});" for v in range(nv))
        lines.append(f"        w = {pre}_set1_{suffix}(w{i}[k]); {fmas}")
    lines += ["    }", "    if (mode == 1) {"]
    for i in range(rf):
        guard = "" if i == 0 else f"if (rows > {i}) "
        body = [f"{ctype} *restrict o = out + row_off[{i}];"]
        body += [f"if (beta) {acc[i][v]} = {pre}_add_{suffix}({load(v, 'o')}, {acc[i][v]});" for v in range(nv)]
        body += [store(v, "o", acc[i][v]) for v in range(nv)]
        lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    if shape.isa == "avx512":
        mask_type = "__mmask16" if lanes == 16 else "__mmask8"
        lines += [
            "    } else if (mode == 2) {",
            f"        {mask_type} " + ", ".join(f"m{v} = ({mask_type})vmask[{v}]" for v in range(nv)) + ";",
            "        int " + ", ".join(f"s{v} = __builtin_popcount((unsigned)m{v})" for v in range(nv)) + ";",
            f"        {mask_type} "
            + ", ".join(f"l{v} = ({mask_type})polyc_lane_mask(s{v}, {lanes})" for v in range(nv))
            + ";",
        ]
        for i in range(rf):
            guard = "" if i == 0 else f"if (rows > {i}) "
            body = [f"{ctype} *restrict o = out + row_off[{i}];"]
            for v in range(nv):
                body += [
                    f"if (beta) {acc[i][v]} = {pre}_add_{suffix}({pre}_maskz_expand_{suffix}(m{v}, "
                    f"{pre}_maskz_loadu_{suffix}(l{v}, o)), {acc[i][v]});",
                    f"{pre}_mask_storeu_{suffix}(o, l{v}, {pre}_maskz_compress_{suffix}(m{v}, {acc[i][v]}));",
                    f"o += s{v};",
                ]
            lines.append(f"        {guard}{{ " + " ".join(body) + " }")
    else:
        lines.append("        (void)vmask;")
    lines += ["    } else {"]
    for i in range(rf):
        lines.append(
            "        "
            + " ".join(f"{pre}_storeu_{suffix}(block + {i * nr + v * lanes}, {acc[i][v]});" for v in range(nv))
        )
    lines += ["    }", "}"]
    return "\n".join(lines)


def _dispatch(shape: BlockShape, ctype: str) -> str:
    arguments = "(nred, wp, w_step, w_row, bp, roff, n, out, row_off, rows, beta, mode, vmask, block)"
    if shape.isa == "avx2":  # whole vectors: the kernels without a lane mask
        cases = "\n".join(
            f"    case {nv}: if (n == {nv * shape.lanes}) polyc_conv_kernel_{nv}_full{arguments}; "
            f"else polyc_conv_kernel_{nv}{arguments}; break;"
            for nv in range(1, shape.vectors + 1)
        )
    else:
        cases = "\n".join(
            f"    case {nv}: polyc_conv_kernel_{nv}{arguments}; break;" for nv in range(1, shape.vectors + 1)
        )
    return (
        f"/* The block for n points (1 <= n <= NR): the kernel with as many vectors as they need. */\n"
        f"static inline void polyc_conv_block({typed(_KERNEL_ARGUMENTS, ctype)})\n"
        "{\n"
        f"    switch ((n + {shape.lanes - 1}) / {shape.lanes}) {{\n{cases}\n    default: break;\n    }}\n"
        "}"
    )


#: Per instruction set and element type: polyc_pack_stepped(dst, src, step), which copies one
#: vector of points whose image elements are ``step`` (1 or 2) apart, the last one read being
#: the last point's (the second half of a stride-2 vector is loaded under a mask).  Gathers
#: were a large share of resnet18's 7 x 7 stride-2 stem convolution (AVX-512).
_STEPPED_PACKING = {
    ("avx512", "float"): """#define POLYC_PACK_STEPPED 1
static inline void polyc_pack_stepped(float *restrict dst, const float *restrict src, int step)
{
    if (step == 1) {
        _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
        return;
    }
    const __m512 low = _mm512_loadu_ps(src), high = _mm512_maskz_loadu_ps((__mmask16)0x7fff, src + 16);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    _mm512_storeu_ps(dst, _mm512_permutex2var_ps(low, even, high));
}""",
    ("avx2", "float"): """#define POLYC_PACK_STEPPED 1
static inline void polyc_pack_stepped(float *restrict dst, const float *restrict src, int step)
{
    if (step == 1) {
        _mm256_storeu_ps(dst, _mm256_loadu_ps(src));
        return;
    }
    const __m256 low = _mm256_loadu_ps(src);
    const __m256 high = _mm256_maskload_ps(src + 8, _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, -1, 0));
    /* (0 2 8 10 | 4 6 12 14), then the 64-bit pairs in order: 0 2 4 6 8 10 12 14 */
    const __m256 pairs = _mm256_shuffle_ps(low, high, _MM_SHUFFLE(2, 0, 2, 0));
    _mm256_storeu_ps(dst, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), _MM_SHUFFLE(3, 1, 2, 0))));
}""",
}

_PORTABLE_KERNEL = c_template("conv_portable_kernel.c")


# Helpers used before the register blocks.
_COMMON = c_template("conv_common.c")

# The points mode's tiles, packing and work items; CHUNK_BLOCKS (channel blocks per work item,
# 0: chosen here) is replaced.
_POINTS_WORK = c_template("conv_points_work.c")

# The loops around the work items, in both modes (each defines polyc_conv_plan, _work and _pack);
# THRESHOLD and STATUS are replaced.
_RUN = c_template("conv_run.c")
