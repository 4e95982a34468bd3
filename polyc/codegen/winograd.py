"""C for 3 x 3 stride-1 convolutions in channels-last layouts by Winograd's minimal filtering
F(2 x 2, 3 x 3): 16 multiplications per 2 x 2 block of outputs and pair of channels instead of 36.

The form (:mod:`polyc.schedule.convolution`; zero padding may be the statement's condition)::

    O(n.., h, w, f) +=[!] (box) ? I(n.., h + r_kh + oh, w + r_kw + ow, r_c) * W(r_kh, r_kw, r_c, f) : 0

with both kernel extents 3, float32, the channels multiples of 16, the sizes known, and the
option ``winograd=True`` (:class:`polyc.options.Options`; ONNX sessions turn it on).  The
output is cut into *tiles* of 2 x 2 points; tile ``t`` reads a 4 x 4 patch ``d`` of the image
(positions outside the box, or past the image, read as 0).  With the constant matrices of
Lavin and Gray (2016)::

    U = G g G^T      (each 3 x 3 filter g -> 4 x 4; once per call, for all channel pairs)
    V = B^T d B      (each tile's patch, per input channel: additions only)
    M[xi] = V[xi] U[xi]   for the 16 positions xi: 16 matrix products over the input channels
    Y = A^T M A      (4 x 4 -> the tile's 2 x 2 outputs: additions only)

so the 9 multiply-adds per output and channel pair become 4 in the products, which are
register-blocked as the other kernels' (R tiles x NV vectors of output channels, the tile's V
broadcast, U's rows loaded as vectors).  On resnet18's 3 x 3 layers up to 256 channels, with
their bias, residual and ReLU, it beats the direct kernel (:mod:`polyc.codegen.conv_channels`),
which runs them near the FMA peak, with AVX-512 and with AVX2 code alike (measured layer by
layer with ``python -m benchmarks.onnx_segments resnet18``, at batch 1 and 8).

Work.  Tiles go in *chunks* of TB tiles (TB: :func:`chunk_limits`); a work item is (chunk,
block of FB output channels), and each thread takes a contiguous run of items.  An item
computes its chunk's V (once for consecutive items of one chunk), then for each position the
product into M (16 x TB x FB floats), then the output transform, the old output added (``+=``)
and the epilogue: in registers where :mod:`polyc.codegen.register_epilogue` covers it (bias,
residual, ReLU, Clip, Sigmoid), else on the item's finished outputs.  The weight transform runs
at the start of every call (the weights are an input like any other), shared by the threads, into
memory the kernel keeps between calls.

Numerics.  The results differ from the direct sum by rounding only (relative errors about
1e-6 of the outputs' magnitude on resnet18's layers), but non-finite values spread: an
infinite input or weight reaches every output of the tiles whose patch holds it, as NaN where
the transforms subtract it from itself, and padding is multiplied as zeros.  Hence an option,
off by default in ``polyc.define``.  Not taken (the direct kernel runs them): other strides,
dilations and kernel sizes, grouped convolutions, channels that are not multiples of 16,
float64, parametric sizes, and layers where it does not pay (:func:`winograd_pays`).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

import numpy as np

from polyc.codegen.c import c_comment
from polyc.codegen.c_expr import PRELUDE
from polyc.codegen.conv import ISA_GUARDS
from polyc.codegen.conv_channels import masked_access
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter
from polyc.codegen.register_epilogue import RegisterEpilogue
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.options import Options
from polyc.schedule.convolution import Convolution
from polyc.schedule.tiling import cache_sizes

#: Per instruction set: floats per vector, tiles per register block (R), output-channel vectors
#: per register block (NV).  R x NV accumulators, NV loaded vectors of U and one broadcast fit
#: the registers (32 with AVX-512, 16 with AVX2).  AVX2's 6 x 2, 4 x 3 and 3 x 4 ran alike on
#: resnet18's 3 x 3 layers built with -mavx2 -mfma (``python -m benchmarks.onnx_segments resnet18``).
_BLOCKS = {"avx512": (16, 6, 4), "avx2": (8, 6, 2), "portable": (4, 4, 2)}

#: Chunks are a multiple of this many tiles (every instruction set's R divides it), so the
#: products never run past a chunk's V.
_TILE_STEP = 12

#: Below this many multiply-adds the kernel runs on one thread.
_PARALLEL_THRESHOLD = 64 * 64 * 64

#: Channels (input and output) must be multiples of this: every vector is whole.
CHANNEL_MULTIPLE = 16


def winograd_form(conv: Convolution, size_values: Mapping[str, int] | None, options: Options) -> bool:
    """Whether ``conv`` at ``size_values`` (None: parametric) has the form this kernel computes
    (see the module doc) and would pay, with the option on."""
    return winograd_refusal(conv, size_values, options) is None


def winograd_refusal(conv: Convolution, size_values: Mapping[str, int] | None, options: Options) -> str | None:
    """Why this kernel does not compute ``conv`` at ``size_values`` (a sentence), or None when
    it does (:func:`winograd_form`)."""
    if not options.winograd:
        besides = winograd_refusal(conv, size_values, options.replace(winograd=True))
        return "the option winograd is off" + (
            f", and besides, {besides}" if besides else " (with winograd=True the Winograd kernel would take it)"
        )
    if size_values is None:
        return "the kernel is parametric (the Winograd kernel is generated for known sizes only)"
    if conv.dtype != np.dtype(np.float32):
        return f"its element type is {np.dtype(conv.dtype).name}, not float32"
    if conv.groups or len(conv.f) != 1 or len(conv.channels) != 1 or len(conv.windows) != 2:
        return "it is not a plain 2-D convolution (groups, several channel indices, or not two windows)"
    wh, ww = conv.windows
    if any(w.k is None or w.stride != 1 or w.dilation != 1 for w in (wh, ww)):
        return "a window has a stride or dilation other than 1"
    (f,), (c,), batch = conv.f, conv.channels, conv.batch
    if (
        conv.target_indices != (*batch, wh.x, ww.x, f)
        or conv.image_plain != (*batch, None, None, c)
        or conv.weight_indices != (wh.k, ww.k, c, f)
    ):
        return "its layout is not channels-last (NHWC output and image, HWCF weights)"
    extent = lambda index: conv.extent(index).evaluate(size_values)  # noqa: E731
    images = int(np.prod([extent(i) for i in batch])) if batch else 1
    return winograd_sizes_refusal(
        conv.dtype,
        (extent(wh.k), extent(ww.k)),
        (1, 1),
        (1, 1),
        extent(c),
        extent(f),
        images,
        (extent(wh.x), extent(ww.x)),
    )


def winograd_sizes(dtype, kernel, strides, dilations, channels: int, features: int, images: int, outputs) -> bool:
    """The sizes' part of :func:`winograd_form`: whether a 2-D convolution of ``images``
    images into ``outputs`` (rows, columns) of ``dtype`` with these kernel extents, strides
    and dilations is one this kernel computes and would pay (the option on)."""
    return winograd_sizes_refusal(dtype, kernel, strides, dilations, channels, features, images, outputs) is None


def winograd_sizes_refusal(
    dtype, kernel, strides, dilations, channels: int, features: int, images: int, outputs
) -> str | None:
    """Why :func:`winograd_sizes` is false (a sentence), or None when it is true."""
    if np.dtype(dtype) != np.dtype(np.float32):
        return f"its element type is {np.dtype(dtype).name}, not float32"
    if tuple(kernel) != (3, 3):
        return f"its kernel is {' x '.join(map(str, kernel))}, not 3 x 3"
    if tuple(strides) != (1, 1) or tuple(dilations) != (1, 1):
        return "a stride or dilation is not 1"
    if channels % CHANNEL_MULTIPLE or features % CHANNEL_MULTIPLE:
        return (
            f"its {channels} input and {features} output channels are not both multiples of {CHANNEL_MULTIPLE} "
            "(the kernel's vectors are whole)"
        )
    tiles = winograd_tiles(images, outputs)
    if not winograd_pays(channels, features, tiles):
        return (
            f"it would not pay: {channels} input and {features} output channels, {tiles} tiles of 2 x 2 outputs "
            "(it pays for at most 256 channels each way and at least 32 tiles)"
        )
    return None


def winograd_tiles(images: int, outputs) -> int:
    """Tiles of 2 x 2 outputs over ``images`` images of ``outputs`` (rows, columns)."""
    return images * -(-outputs[0] // 2) * -(-outputs[1] // 2)


def winograd_pays(channels: int, features: int, tiles: int) -> bool:
    """Whether the kernel beats the direct one: it pays only for up to 256 channels (input and
    output) and at least 32 tiles.  Beyond that its 16 x C x F transformed weights are made and
    read from memory for too few tiles (resnet18's 512-channel layers at 7 x 7 lost to the direct
    kernel; its smaller 3 x 3 layers gained, at batch 1 and 8: measured with
    ``python -m benchmarks.onnx_segments resnet18``)."""
    return channels <= 256 and features <= 256 and tiles >= 32


def chunk_limits(channels: int, features: int, options: Options) -> tuple[int, int, bool]:
    """(TB for V in half of L2, TB for V in all of L2, whether U is large), which the kernel's
    choice of TB at run time takes (``chunking`` in the entry function).

    U (16 x C x F floats) is read once per chunk.  Where it fits half of L2, chunks are sized so
    that a chunk's V (16 x TB x C floats) fits half of L2 too, and there are at least four work
    items a thread.  A larger U comes from L3 for every chunk, so then there are as few chunks
    as give each thread a work item, their V up to all of L2: on resnet18's 256-channel layer at
    14 x 14 (U 4 MiB, larger than an L2), small chunks read U from memory again and again and
    lost most of the kernel's gain, and chunks whose V fills much of L3 lost part of it
    (``python -m benchmarks.onnx_segments resnet18``, at batch 1 and 8)."""
    l2 = cache_sizes(options)[2]
    per_tile = 16 * channels * 4

    def steps(limit: int) -> int:
        return max(_TILE_STEP, limit // per_tile // _TILE_STEP * _TILE_STEP)

    return steps(l2 // 2), steps(l2), 16 * channels * features * 4 > l2 // 2


def generate_winograd(program: PolyProgram, conv: Convolution, options: Options) -> DedicatedKernel:
    """The Winograd kernel of ``conv``, which has this kernel's form (:func:`winograd_form`; the
    Winograd kernel path, :mod:`polyc.paths.winograd`, checks it)."""
    return _WinogradWriter(program, conv, options).write()


class _WinogradWriter(PatternKernelWriter):
    def __init__(self, program: PolyProgram, conv: Convolution, options: Options):
        super().__init__(program, options)
        self.conv = conv
        self.dtype = np.dtype(conv.dtype)
        (self.f,), (self.c,) = conv.f, conv.channels
        assert program.size_values is not None, "Winograd kernels are generated for concrete sizes"
        sizes = program.size_values
        value = lambda index: conv.extent(index).evaluate(sizes)  # noqa: E731
        self.channels, self.features = value(self.c), value(self.f)
        self.tb_half, self.tb_whole, self.large_u = chunk_limits(self.channels, self.features, options)
        self.register_epilogue = (
            RegisterEpilogue.of(conv.epilogues, self.definition, conv.target_indices, self.f)
            if options.vectorize
            else None
        )

    def write(self) -> DedicatedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        parts = [
            self.header(),
            PRELUDE,
            self.preamble("POLYC_CONV_PORTABLE", ["#include <string.h>"]),
            self.context_struct(),
            self.instruction_sets(),
            _TRANSFORMS,
            self.entry_function(name),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), (), (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions`."""
        conv, sizes = self.conv, self.program.size_values
        assert sizes is not None, "Winograd kernels are generated for concrete sizes"
        wh, ww = conv.windows
        images = prod(conv.extent(i).evaluate(sizes) for i in conv.batch)
        outputs = (conv.extent(wh.x).evaluate(sizes), conv.extent(ww.x).evaluate(sizes))
        return {
            "kernel": "winograd",
            "convolution": conv.describe(),
            "transform": "F(2x2, 3x3)",
            "tile": (2, 2),
            "tiles": winograd_tiles(images, outputs),
            "channels": self.channels,
            "features": self.features,
            "instruction_sets": tuple(ISA_GUARDS),
            "register_blocks": {
                isa: {"lanes": lanes, "tiles": rows, "vectors": vectors, "channels": lanes * vectors}
                for isa, (lanes, rows, vectors) in _BLOCKS.items()
                if isa in ISA_GUARDS
            },
            "tiles_per_chunk": (self.tb_half, self.tb_whole),
            "large_weights": self.large_u,
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
        }

    def header(self) -> str:
        o = self.options
        lines = [
            f"polyc Winograd F(2x2, 3x3) conv kernel for def '{self.definition.name}' "
            "(channels-last, tiles of 2 x 2 outputs)",
            f"sizes: {self.sizes_comment()}",
            f"options: parallel={o.parallel} vectorize={o.vectorize} winograd={o.winograd}",
            f"convolution: {self.conv.describe()}",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def context_struct(self) -> str:
        fields = [
            "const float *in",
            "const float *w",
            "float *out",
            "float *u",
            "int64_t oh, ow, ih, iw, c, f, lo_h, hi_h, lo_w, hi_w, off_h, off_w",
            "int64_t th, tw, tiles, tb, fb, fblocks, init",
        ]
        for tensor in self.tensors_of_epilogues(self.conv.target, self.conv.epilogues):
            qualifier = "const " if self.definition.tensor(tensor).role is ir.Role.INPUT else ""
            fields.append(f"{qualifier}float *t_{tensor}")
        body = "\n".join(f"    {field};" for field in fields)
        return (
            "/* The image, the weights (3, 3, C, F), the output and the transformed weights U (16,\n"
            "   F / fb blocks of (C, fb) each: polyc_wg_u_block);\n"
            "   output rows and columns, image rows and columns, channels in and out; the image\n"
            "   positions lo <= p < hi that count (the box within the image), the windows' offsets;\n"
            "   tile rows and columns, tiles, tiles per chunk, output channels per block, blocks;\n"
            "   whether the output starts from zero; the epilogue's tensors. */\n"
            f"typedef struct {{\n{body}\n}} polyc_wg_t;"
        )

    # ------------------------------------------------------------------ per instruction set
    def instruction_sets(self) -> str:
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            lanes, rows, vectors = _BLOCKS[isa]
            pieces += [
                f"#define POLYC_WG_LANES {lanes}",
                f"#define POLYC_WG_R {rows}",
                f"#define POLYC_WG_NV {vectors}",
            ]
            if isa == "portable":
                pieces += [
                    "typedef float polyc_wv __attribute__((vector_size(16)));",
                    "static inline polyc_wv polyc_wv_load(const float *p) { polyc_wv v; memcpy(&v, p, sizeof v); return v; }",
                    "static inline void polyc_wv_store(float *p, polyc_wv v) { memcpy(p, &v, sizeof v); }",
                    "#define WLOAD(p) polyc_wv_load(p)",
                    "#define WSTORE(p, v) polyc_wv_store((p), (v))",
                    "#define WSET1(s) ((polyc_wv){0, 0, 0, 0} + (s))",
                    "#define WADD(a, b) ((a) + (b))",
                    "#define WSUB(a, b) ((a) - (b))",
                    "#define WMUL(a, b) ((a) * (b))",
                    "#define WFMA(a, b, c) ((a) * (b) + (c))",
                    "#define POLYC_WG_REGISTER_EPILOGUE 0",
                ]
                continue
            vec, pre, suffix, _, load, _, _, _ = masked_access(isa, self.dtype, lanes, None)
            pieces += [
                "#include <immintrin.h>",
                f"typedef {vec} polyc_wv;",
                f"#define WLOAD(p) {pre}_loadu_{suffix}(p)",
                f"#define WSTORE(p, v) {pre}_storeu_{suffix}((p), (v))",
                f"#define WSET1(s) {pre}_set1_{suffix}(s)",
                f"#define WADD(a, b) {pre}_add_{suffix}((a), (b))",
                f"#define WSUB(a, b) {pre}_sub_{suffix}((a), (b))",
                f"#define WMUL(a, b) {pre}_mul_{suffix}((a), (b))",
                f"#define WFMA(a, b, c) {pre}_fmadd_{suffix}((a), (b), (c))",
                f"#define POLYC_WG_REGISTER_EPILOGUE {int(self.register_epilogue is not None)}",
            ]
            if self.register_epilogue is not None:
                pieces.append(self.register_epilogue.function(self.definition, isa, load, context="polyc_wg_t"))
        pieces.append("#endif")
        return "\n".join(pieces)

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str) -> str:
        conv = self.conv
        arguments = self.pointer_arguments(())
        extent = lambda index: f"({self.size_expr(conv.extent(index))})"  # noqa: E731
        (wh, ww) = conv.windows
        batch = " * ".join(extent(i) for i in conv.batch) or "1"
        body = self.size_declarations(lambda s: None)
        body += [
            "polyc_wg_t g = {0};",
            f"g.in = {conv.image}; g.w = {conv.weights}; g.out = {conv.target};",
            f"g.oh = {extent(wh.x)}; g.ow = {extent(ww.x)}; g.c = {extent(self.c)}; g.f = {extent(self.f)};",
            *self.image_box_fields(conv),
            f"g.off_h = {wh.offset}; g.off_w = {ww.offset};",
            "g.th = (g.oh + 1) / 2; g.tw = (g.ow + 1) / 2;",
            f"g.tiles = ({batch}) * g.th * g.tw;",
            "g.fb = POLYC_WG_NV * POLYC_WG_LANES; g.fblocks = (g.f + g.fb - 1) / g.fb;",
            f"g.init = {1 if conv.init else 0};",
        ]
        body += [f"g.t_{tensor} = {tensor};" for tensor in self.tensors_of_epilogues(conv.target, conv.epilogues)]
        # TB (see chunk_limits), a multiple of the tile step.
        step = _TILE_STEP
        if self.large_u:
            chunking = [
                "const int64_t polyc_want = polyc_max(1, (2 * polyc_nthr + g.fblocks - 1) / g.fblocks);",
                f"g.tb = polyc_min({self.tb_whole}, (g.tiles + polyc_want - 1) / polyc_want + {step - 1}) "
                f"/ {step} * {step};",
            ]
        else:
            chunking = [
                f"g.tb = polyc_min({self.tb_half}, polyc_max({step}, (g.tiles * g.fblocks + 4 * polyc_nthr - 1)"
                f" / (4 * polyc_nthr) + {step - 1}) / {step} * {step});"
            ]
        chunking += [
            "const int64_t polyc_chunks = (g.tiles + g.tb - 1) / g.tb;",
            "const int64_t polyc_items = polyc_chunks * g.fblocks;",
            "/* U, then each thread's V and M. */",
            "const size_t polyc_u_floats = (size_t)16 * g.c * g.f;",
            "const size_t polyc_v_floats = (size_t)16 * g.tb * g.c, polyc_m_floats = (size_t)16 * g.tb * g.fb;",
        ]
        item = [
            "const int64_t polyc_chunk = polyc_x / g.fblocks, polyc_fblock = polyc_x % g.fblocks;",
            "if (polyc_chunk != polyc_v_chunk) {",
            "    polyc_wg_input(&g, polyc_v, polyc_chunk);",
            "    polyc_v_chunk = polyc_chunk;",
            "}",
            "polyc_wg_products(&g, polyc_v, polyc_m, polyc_chunk, polyc_fblock);",
            "polyc_wg_output(&g, polyc_m, polyc_chunk, polyc_fblock);",
        ]
        if conv.epilogues:
            item += ["if (!POLYC_WG_REGISTER_EPILOGUE) {", *("    " + line for line in self.scalar_epilogue()), "}"]
        work = "(double)g.tiles * 16.0 * (double)g.c * (double)g.f"
        thread = lambda share: [  # noqa: E731
            "float *polyc_v = polyc_space + polyc_u_floats + (size_t)polyc_thread * (polyc_v_floats + polyc_m_floats);",
            "float *polyc_m = polyc_v + polyc_v_floats;",
            "int64_t polyc_v_chunk = -1;",
            *share,
            "for (int64_t polyc_x = polyc_first; polyc_x < polyc_last; polyc_x++) {",
            *("    " + line for line in item),
            "}",
        ]
        serial = [
            "const int polyc_thread = 0;",
            "for (int64_t polyc_c = 0; polyc_c < g.c; polyc_c++) polyc_wg_weights(&g, polyc_c);",
            *thread(["const int64_t polyc_first = 0, polyc_last = polyc_items;"]),
        ]
        allocate = [
            *chunking,
            "polyc_workspace_t *polyc_work = polyc_workspace_take(",
            "    (polyc_u_floats + (size_t)polyc_nthr * (polyc_v_floats + polyc_m_floats)) * sizeof(float));",
            "if (polyc_work == NULL) return 2;",
            "float *polyc_space = (float *)polyc_work->memory;",
            "g.u = polyc_space;",
        ]
        region = []
        if self.options.parallel:
            # Items in contiguous runs per thread, so a thread's consecutive items share a chunk's
            # V; shared by the team OpenMP gave, which may be smaller than asked for (a thread
            # limit, a call from inside a parallel region).
            share = [
                "const int polyc_team = omp_get_num_threads();",
                "const int64_t polyc_first = polyc_items * polyc_thread / polyc_team;",
                "const int64_t polyc_last = polyc_items * (polyc_thread + 1) / polyc_team;",
            ]
            region = [
                "const int polyc_thread = omp_get_thread_num();",
                "#pragma omp for schedule(static)",
                "for (int64_t polyc_c = 0; polyc_c < g.c; polyc_c++) polyc_wg_weights(&g, polyc_c);",
                "/* (the loop's barrier: U is complete) */",
                *thread(share),
            ]
        body += self.workspace_region(work, _PARALLEL_THRESHOLD, allocate, region, serial) + ["return 0;"]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    def scalar_epilogue(self) -> list[str]:
        """The epilogue statements on the item's finished outputs (its chunk's tiles, its block
        of output channels), element by element, in a loop over the channels the compiler vectorises."""
        conv = self.conv
        (wh, ww) = conv.windows
        lines = [
            "const int64_t polyc_t0 = polyc_chunk * g.tb, polyc_t1 = polyc_min(g.tiles, polyc_t0 + g.tb);",
            "const int64_t polyc_f0 = polyc_fblock * g.fb, polyc_f1 = polyc_min(g.f, polyc_f0 + g.fb);",
            "for (int64_t polyc_t = polyc_t0; polyc_t < polyc_t1; polyc_t++) {",
            "    int64_t polyc_image, polyc_ty, polyc_tx;",
            "    polyc_wg_tile(&g, polyc_t, &polyc_image, &polyc_ty, &polyc_tx);",
            *("    " + line for line in self.batch_indices(conv, "polyc_image")),
        ]
        lines += [
            f"    for (int64_t polyc_ix_{wh.x} = 2 * polyc_ty; polyc_ix_{wh.x} < polyc_min(g.oh, 2 * polyc_ty + 2); "
            f"polyc_ix_{wh.x}++)",
            f"    for (int64_t polyc_ix_{ww.x} = 2 * polyc_tx; polyc_ix_{ww.x} < polyc_min(g.ow, 2 * polyc_tx + 2); "
            f"polyc_ix_{ww.x}++) {{",
            "        #pragma omp simd",
            f"        for (int64_t polyc_ix_{self.f} = polyc_f0; polyc_ix_{self.f} < polyc_f1; polyc_ix_{self.f}++) {{",
            *(f"            {self.epilogue_assignment(s, conv.target_indices)};" for s in conv.epilogues),
            "        }",
            "    }",
            "}",
        ]
        return lines


#: The transforms and the products, in the vector operations each instruction set defines
#: above (WLOAD, WFMA, ...), for every kernel of this form alike.
_TRANSFORMS = c_template("winograd_transforms.c")
