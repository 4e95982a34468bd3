"""C for integer depthwise convolutions with their requantization
(:class:`~polyc.schedule.integer_depthwise.IntegerDepthwise`: QLinearConv with one filter per
channel, NCHW, as quantized MobileNets have them).

The work items are the (image, channel) planes, shared among the threads.  Each plane is
copied once into an int16 buffer, shifted by the image's zero point and 0 where the padding
is, its columns dealt into ``stride`` phases, so that the taps of a strided row read
consecutive values and the kernel's inner loop runs along the output row with no gather
(``templates/integer_depthwise_plane.c``).  The outputs go in blocks (:func:`block_for`) whose
int32 sums stay in vector registers through every tap, then are requantized (the bias in int32,
one float32 multiplication per value, rounding halves to even, saturation to bounds that a
folded Relu or Clip narrows) and stored as bytes once.  A row's blocks stop at its end; a plane
of short rows (mobilenet_v2's 7 x 7 and 14 x 14) goes instead as one run whose blocks continue
through the rows' ends, the outputs past each end computed and dropped, where that takes fewer
blocks.

The planes, not the channels, are vectorised along: the quantized graph stays NCHW (the
channels-last rewrite, :mod:`polyc.frontends.onnx.channels_last`, takes float convolutions
only), and an NCHW row is contiguous where a vector of channels is not.  The vectors are those
of the compiler's vector extension (``vector_size``), so one source serves AVX-512, AVX2 and
NEON; the requantization's are the machine's width (``POLYC_QDW_LANES``, from the C
preprocessor).  The sums are exact: the shifted image and weights fit 16 bits, and a window's
sum of their products fits int32 for any filter of fewer than 2^15 taps.
"""

from __future__ import annotations

from polyc.codegen.c import c_comment
from polyc.codegen.c_expr import PRELUDE, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter
from polyc.codegen.templates import c_template
from polyc.ir.model import PolyProgram
from polyc.options import Options
from polyc.schedule.integer_depthwise import IntegerDepthwise

#: The blocks of outputs along a row whose int32 sums stay in registers (the longest: two
#: AVX-512 vectors, four AVX2 ones); a row gets the shortest that covers it, else the longest.
BLOCKS = (16, 32)

#: Values of a strided row dealt into a phase at once (whole vectors; at most the block, the
#: margin each phase's rows have past their end).
DEAL = 16


def block_for(width: int | None) -> int:
    """The block of outputs for rows ``width`` long (None: known only at run time): a short
    row (mobilenet_v2's last layers are 7 and 14 wide) in one block without idle lanes."""
    if width is None:
        return BLOCKS[-1]
    return next((block for block in BLOCKS if block >= width), BLOCKS[-1])


#: Below this many multiply-adds the kernel runs on one thread.
_PARALLEL_THRESHOLD = 64 * 64 * 64


def generate_integer_depthwise(program: PolyProgram, depthwise: IntegerDepthwise, options: Options) -> DedicatedKernel:
    """The kernel of ``depthwise`` (:mod:`polyc.paths.integer_depthwise` recognised it)."""
    return _Writer(program, depthwise, options).write()


class _Writer(PatternKernelWriter):
    def __init__(self, program: PolyProgram, depthwise: IntegerDepthwise, options: Options):
        super().__init__(program, options)
        self.depthwise = depthwise

    def write(self) -> DedicatedKernel:
        d, q = self.definition, self.depthwise
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        (wh, ww) = q.windows
        width = self.known_extent(q.extent(ww.x))
        block = block_for(width)
        parts = [
            self.header(),
            PRELUDE,
            self.preamble("POLYC_QDW_UNUSED", []),
            f"typedef {c_type(q.image_dtype)} polyc_qx;",
            f"typedef {c_type(q.weight_dtype)} polyc_qw;",
            f"typedef {c_type(q.output_dtype)} polyc_qy;",
            f"#define POLYC_QDW_BLOCK {block}",
            f"#define POLYC_QDW_DEAL {min(DEAL, block)}",
            f"typedef int16_t polyc_qdw_values __attribute__((vector_size({2 * block})));",
            f"typedef int32_t polyc_qdw_sums __attribute__((vector_size({4 * block})));",
            _LANES,
            "typedef float polyc_qdw_floats __attribute__((vector_size(4 * POLYC_QDW_LANES)));",
            "typedef int32_t polyc_qdw_ints __attribute__((vector_size(4 * POLYC_QDW_LANES)));",
            "typedef polyc_qy polyc_qdw_narrow __attribute__((vector_size(POLYC_QDW_LANES)));",
            "typedef int16_t polyc_qdw_pairs __attribute__((vector_size(64)));",
            "typedef int16_t polyc_qdw_halves __attribute__((vector_size(32)));",
            f"#define POLYC_QDW_EVENS {', '.join(str(2 * i) for i in range(16))}",
            f"#define POLYC_QDW_ODDS {', '.join(str(2 * i + 1) for i in range(16))}",
            f"#define POLYC_QDW_ZX ({q.image_zero})",
            f"#define POLYC_QDW_ZY ({q.output_zero})",
            f"#define POLYC_QDW_LOW ({q.low})",
            f"#define POLYC_QDW_HIGH ({q.high})",
            _CONTEXT,
            f"#define POLYC_QDW_TAPS {self.taps()}",
            # (a literal where known: the copies of a short row's outputs are then inlined)
            f"#define POLYC_QDW_OW {width if width is not None else 'g->ow'}",
            c_template("integer_depthwise_plane.c"),
            self.entry_function(name, sizes),
            "",
        ]
        decisions = {
            "kernel": "integer_depthwise",
            "depthwise": q.describe(),
            "block": block,
            "strides": (wh.stride, ww.stride),
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
        }
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), decisions)

    def header(self) -> str:
        o = self.options
        lines = [
            f"polyc integer depthwise kernel for def '{self.definition.name}' (8-bit image, int32 sums, "
            "requantized; planes shared among the threads, rows vectorised)",
            f"sizes: {self.sizes_comment()}",
            f"options: parallel={o.parallel} vectorize={o.vectorize} specialize={o.specialize}",
            f"depthwise: {self.depthwise.describe()}",
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def taps(self) -> str:
        """C of the window's tap count: a literal where the C is written knowing it (the
        compiler then unrolls the taps), else the record's."""
        kh, kw = (self.known_extent(self.depthwise.extent(k)) for k in self.depthwise.kernel)
        return str(kh * kw) if kh is not None and kw is not None else "g->taps"

    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        q = self.depthwise
        n, c, h, w = q.indices
        kh, kw = q.kernel
        (wh, ww) = q.windows

        def extent(index: str) -> str:
            return f"({self.size_expr(q.extent(index))})"

        body = self.size_declarations(lambda s: None)
        body += [
            "polyc_qdw_t g_ = {0}, *const g = &g_;",
            f"g->in = {q.image}; g->w = {q.weights}; g->out = {q.output}; g->scale = {q.scale};",
            f"g->bias = {q.bias if q.bias else 'NULL'}; g->scale_step = {1 if q.per_channel_scale else 0};",
            f"g->c = {extent(c)}; g->oh = {extent(h)}; g->ow = {extent(w)}; g->kh = {extent(kh)}; g->kw = {extent(kw)};",
            f"g->sh = {wh.stride}; g->sw = {ww.stride}; g->dh = {wh.dilation}; g->dw = {ww.dilation};",
            *(line.replace("g.", "g->") for line in self.image_box_fields(q)),
            f"g->first_row = {wh.offset}; g->first_column = {ww.offset};",
            "if (g->oh == 0 || g->ow == 0 || g->c == 0) return 0;",
            "g->rows = g->sh * (g->oh - 1) + g->dh * (g->kh - 1) + 1;",
            "g->columns = g->sw * (g->ow - 1) + g->dw * (g->kw - 1) + 1;",
            # One run through the plane where that takes fewer blocks than row by row (short
            # rows); rows then need no margin for the blocks that run past their end.
            "const int64_t polyc_count = (g->columns + g->sw - 1) / g->sw;",
            "const int64_t polyc_row_blocks = g->oh * ((g->ow + POLYC_QDW_BLOCK - 1) / POLYC_QDW_BLOCK);",
            "const int64_t polyc_span = (g->oh - 1) * g->sh * polyc_count + g->ow;",
            "g->flat = (polyc_span + POLYC_QDW_BLOCK - 1) / POLYC_QDW_BLOCK < polyc_row_blocks;",
            # (a margin of at least 16: the strided rows are dealt 16 values at a time)
            "g->pitch = polyc_count + (g->flat ? 0 : polyc_max(POLYC_QDW_BLOCK, 16));",
            "g->phase = g->rows * g->pitch;",
            "g->taps = g->kh * g->kw;",
            "int64_t *polyc_tap = (int64_t *)malloc(sizeof(int64_t) * (size_t)polyc_max(g->taps, 1));",
            f"if (polyc_tap == NULL) return {STATUS_OUT_OF_MEMORY};",
            "for (int64_t i = 0; i < g->kh; i++)",
            "    for (int64_t j = 0; j < g->kw; j++)",
            "        polyc_tap[i * g->kw + j] = i * g->dh * g->pitch + (j * g->dw % g->sw) * g->phase + j * g->dw / g->sw;",
            "g->tap = polyc_tap;",
            f"const int64_t polyc_planes = {extent(n)} * g->c;",
            # the phases, one row of the image, the margin that whole vectors read past them;
            # then the run's requantized outputs
            "const size_t polyc_shifted_count = (size_t)(g->sw * g->phase + g->columns + g->sw * (POLYC_QDW_DEAL + 1) + "
            "POLYC_QDW_BLOCK + 32);",
            "const size_t polyc_buffer = sizeof(int16_t) * polyc_shifted_count + sizeof(polyc_qy) * (size_t)(g->flat ? "
            "polyc_span + POLYC_QDW_BLOCK : 0);",
            "int polyc_failed = 0;",
        ]
        work = "(double)polyc_planes * (double)(g->oh * g->ow) * (double)(g->kh * g->kw)"
        plane = [
            "int16_t *polyc_shifted = (int16_t *)calloc(1, polyc_buffer);",
            "if (polyc_shifted == NULL) {",
            "    __atomic_store_n(&polyc_failed, 1, __ATOMIC_RELAXED);",
            "} else {",
            "    for (int64_t polyc_x = POLYC_FIRST; polyc_x < polyc_planes; polyc_x += POLYC_STEP)",
            "        polyc_qdw_plane(g, polyc_x / g->c, polyc_x % g->c, polyc_shifted,",
            "                        (polyc_qy *)(polyc_shifted + polyc_shifted_count));",
            "    free(polyc_shifted);",
            "}",
        ]

        def planes(first: str, step: str) -> list[str]:
            return [line.replace("POLYC_FIRST", first).replace("POLYC_STEP", step) for line in plane]

        serial = ["{", *("    " + line for line in planes("0", "1")), "}"]
        if self.options.parallel:
            # Each thread takes every n-th plane: the planes of a layer cost the same.
            body += self.parallel_region(
                work, _PARALLEL_THRESHOLD, planes("omp_get_thread_num()", "omp_get_num_threads()"), serial
            )
        else:
            body += serial
        body += ["free(polyc_tap);", f"return polyc_failed ? {STATUS_OUT_OF_MEMORY} : 0;"]
        signature = f"int {name}({', '.join(self.pointer_arguments(sizes))})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"


#: The requantization's vectors: the machine's width in int32 lanes, as the C preprocessor
#: knows it (wider vectors of the vector extension are split, badly, by gcc).
_LANES = """#if defined(__AVX512F__)
#define POLYC_QDW_LANES 16
#elif defined(__AVX__)
#define POLYC_QDW_LANES 8
#else
#define POLYC_QDW_LANES 4
#endif"""

#: The return value when a plane's buffer cannot be allocated.
STATUS_OUT_OF_MEMORY = 2

_CONTEXT = """/* The convolution: tensors, extents, strides and dilations, the padding box in image positions
   (lo <= p < hi), the image rows and columns the outputs read (from first_row, first_column on),
   the shifted plane's layout (rows of `pitch` values, one set of rows per column phase),
   where each tap of the window reads in it, from the first tap of output column 0, and whether
   the plane's outputs go as one run (flat) or row by row. */
typedef struct {
    const polyc_qx *in;
    const polyc_qw *w;
    const int32_t *bias;
    const float *scale;
    polyc_qy *out;
    int64_t scale_step, c, ih, iw, oh, ow, kh, kw, sh, sw, dh, dw;
    int64_t lo_h, hi_h, lo_w, hi_w, first_row, first_column, rows, columns, pitch, phase, taps, flat;
    const int64_t *tap;
} polyc_qdw_t;"""


__all__ = ["BLOCKS", "block_for", "generate_integer_depthwise"]
