"""C for a 1 x 1 convolution whose result only a depthwise convolution reads, in channels-last
layouts: the expansion and depthwise layers of an inverted-residual block (mobilenet_v2,
efficientnet), without storing the expanded tensor.

The form (:func:`polyc.schedule.convolution.recognise_pointwise_depthwise_def`)::

    T(n.., h, w, f) +=! X(n.., h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)    (1 x 1)
    T(n.., h, w, f) = ..T(n.., h, w, f).. B(f)..                                     (epilogues)
    O(n.., h, w, c) +=! (box) ? T(n.., sh*h + dh*r_kh + oh, sw*w + dw*r_kw + ow, c) * W2(r_kh, r_kw, c) : 0
    O(n.., h, w, c) = ..                                                              (epilogues)

``T`` has six times the channels of ``X`` in mobilenet_v2: written by one kernel and read
back by the next, it was most of both kernels' time where it does not fit in the caches
(the 96-channel layer at 112 x 112 is 4.8 MB an image, 38.5 MB at batch 8: the depthwise
layer read it from the L3 or from memory).  Here each thread computes the rows of ``T`` the
depthwise layer's next output row needs, for its block of channels, into a ring buffer of
``dh * (kh - 1) + 1`` rows (129 KB for that layer), and the depthwise rows of
:mod:`polyc.codegen.depthwise` read them from there, in the L2.  A work item is one image
and one block of channel vectors: its threads split the channels, not the rows, so no row
of ``T`` is computed twice (an image's items split the channels when there are fewer images
than threads).

The 1 x 1 rows are register blocks of pixels x channel vectors (each weight vector loaded
once per block, each pixel's input channel broadcast once per block), their epilogues on
the accumulators (:mod:`polyc.codegen.register_epilogue`) or, when those are not covered
(an exp other than the logistic function), in a pass over the finished row.  The instruction
set is the C preprocessor's choice as in the other kernels: AVX-512, AVX2 with FMA, or
portable C.
"""

from __future__ import annotations

from polyc.codegen.conv import ISA_GUARDS
from polyc.codegen.conv_channels import masked_access
from polyc.codegen.depthwise import _PARALLEL_THRESHOLD, _DepthwiseWriter
from polyc.codegen.pattern_kernel import DedicatedKernel
from polyc.codegen.register_epilogue import RegisterEpilogue
from polyc.ir.model import PolyProgram
from polyc.options import Options
from polyc.schedule.convolution import PointwiseDepthwise

#: Per instruction set: pixels per register block and the most channel vectors per block of
#: the 1 x 1 rows (accumulators, a step's weight vectors and a broadcast pixel in registers:
#: 21 + 3 + 1 of AVX-512's 32, 12 + 2 + 1 of AVX2's 16).  Seven pixels divide mobilenet's
#: rows (112, 56, 28, 14, 7).
POINTWISE_BLOCK = {"avx512": (7, 3), "avx2": (6, 2)}

#: Work items per thread the split aims at (see ``work_split``): enough that a thread running
#: slower takes fewer of them.
ITEMS_PER_THREAD = 4

#: Channels of a block of one image's channel vectors, at least (rounded up to whole register
#: blocks): on mobilenet_v2's expansion layers blocks of two AVX2 vectors ran slower than halves
#: of the rows, blocks of six faster (``python -m benchmarks.onnx_segments mobilenet_v2``).
BLOCK_CHANNELS = 48

#: Bands of output rows an image is split into, at most.
MAX_BANDS = 16


def generate_pointwise_depthwise(program: PolyProgram, chain: PointwiseDepthwise, options: Options) -> DedicatedKernel:
    """The kernel of a def recognised as a :class:`PointwiseDepthwise`."""
    return _PointwiseDepthwiseWriter(program, chain, options).write()


class _PointwiseDepthwiseWriter(_DepthwiseWriter):
    def __init__(self, program: PolyProgram, chain: PointwiseDepthwise, options: Options):
        super().__init__(program, chain.depthwise, options)
        self.chain = chain
        self.pointwise = chain.pointwise
        (wh, _) = self.conv.windows
        self.ring_rows_c = f"({wh.dilation} * ({self.kh_c} - 1) + 1)"
        in_channels = self.known_extent(self.pointwise.extent(self.pointwise.channels[0]))
        self.in_channels_c = "g->xc" if in_channels is None else str(in_channels)
        self.pointwise_epilogue = (
            RegisterEpilogue.of(
                self.pointwise.epilogues, self.definition, self.pointwise.target_indices, self.pointwise.f[0]
            )
            if options.vectorize
            else None
        )

    def title(self) -> str:
        return (
            f"polyc pointwise + depthwise conv kernel for def '{self.definition.name}' (the 1 x 1 "
            f"convolution's rows computed into a ring buffer the depthwise rows read, {self.kh_c} x "
            f"{self.kw_c} taps)"
        )

    def described(self) -> str:
        return f"convolutions: {self.chain.describe()}"

    def decisions(self) -> dict:
        """The depthwise writer's decisions and the 1 x 1 convolution's, for the fused pair
        (:attr:`DedicatedKernel.decisions`): the temporary never stored and its channels, the
        ring of its rows, the 1 x 1 rows' register blocks, and the work split's constants (the
        split itself is chosen per call, from the thread count)."""
        (wh, _) = self.conv.windows
        pointwise_blocks: dict[str, dict] = {}
        for isa in ISA_GUARDS:
            lanes = (64 if isa == "avx512" else 32) // self.dtype.itemsize if isa != "portable" else None
            pixels, vectors = POINTWISE_BLOCK.get(isa, (1, 1))
            pointwise_blocks[isa] = {"pixels": pixels, "vectors": vectors, "lanes": lanes}
        return {
            **super().decisions(),
            "kernel": "pointwise_depthwise",
            "convolution": self.chain.describe(),
            "temporary": self.chain.temporary,
            "expanded_channels": self.known_extent(self.conv.extent(self.channel)),
            "in_channels": self.known_extent(self.pointwise.extent(self.pointwise.channels[0])),
            "ring_rows": None if self.kh is None else wh.dilation * (self.kh - 1) + 1,
            "pointwise_blocks": pointwise_blocks,
            "pointwise_epilogue_in_registers": self.pointwise_epilogue is not None,
            "work_item": "one image, one block of channel vectors, one band of output rows",
            "block_channels": BLOCK_CHANNELS,
            "items_per_thread": ITEMS_PER_THREAD,
            "max_bands": MAX_BANDS,
        }

    def context_fields(self) -> list[str]:
        """The depthwise record's fields, and the 1 x 1 convolution's: its image and weights,
        its input channels, the vectors its epilogue reads."""
        t = self.ctype
        return (
            super().context_fields()
            + [f"const {t} *x", f"const {t} *w1", "int64_t xc"]
            + [self.tensor_field(name) for name in self.pointwise_epilogue_tensors()]
        )

    def pointwise_epilogue_tensors(self) -> list[str]:
        """The tensors the 1 x 1 convolution's epilogue reads that the depthwise one's does not
        (not T, which it updates in registers or in the ring)."""
        depthwise = set(self.tensors_of_epilogues(self.conv.target, self.conv.epilogues))
        return [
            name
            for name in self.tensors_of_epilogues(self.pointwise.target, self.pointwise.epilogues)
            if name != self.pointwise.target and name not in depthwise
        ]

    # ------------------------------------------------------------------ the rows
    def instruction_sets(self) -> str:
        """The depthwise rows, then per instruction set the 1 x 1 rows ``polyc_pw_row``."""
        pieces = [super().instruction_sets()]
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            if isa == "portable":
                pieces += [
                    "#define POLYC_PW_REGISTER_EPILOGUE 0",
                    "#define POLYC_PW_VECTORS 1",
                    self.portable_pointwise_row(),
                ]
                continue
            lanes = (64 if isa == "avx512" else 32) // self.dtype.itemsize
            in_registers = self.pointwise_epilogue is not None
            pieces += [
                f"#define POLYC_PW_REGISTER_EPILOGUE {int(in_registers)}",
                f"#define POLYC_PW_VECTORS {POINTWISE_BLOCK[isa][1]}",
            ]
            if in_registers:
                _, _, _, _, load_full, _, load_last, _ = masked_access(isa, self.dtype, lanes, "tail")
                mask = "__mmask16" if lanes == 16 else "__mmask8" if isa == "avx512" else "__m256i"
                pieces += [
                    self.pointwise_epilogue.function(
                        self.definition, isa, load, *masking, context="polyc_dw_t", name="polyc_pw_epilogue_vector"
                    )
                    for load, masking in ((load_full, ()), (load_last, (mask,)))
                ]
            pieces.append(self.vector_pointwise_row(isa, lanes))
        pieces.append("#endif")
        return "\n".join(pieces)

    def vector_pointwise_row(self, isa: str, lanes: int) -> str:
        """``polyc_pw_row(g, x, t, v0, v1)``: the 1 x 1 convolution's row ``t`` (every pixel,
        channel vectors v0..v1-1, the last possibly partial) from the image row ``x``."""
        pixels, most = POINTWISE_BLOCK[isa]
        block = lambda count, vectors, masked: self.pointwise_block(isa, lanes, count, vectors, masked)  # noqa: E731
        lines = [
            f"/* T's row t (pixels 0..iw-1, channel vectors v0..v1-1) from X's row x; {pixels} pixels x up to "
            f"{most} vectors per register block. */",
            # not inlined: in the item loop of the parallel region, gcc kept fewer of the
            # accumulators in registers (AVX2 code on mobilenet_v2's 64 -> 384 channel layer)
            f"static __attribute__((noinline)) void polyc_pw_row(const polyc_dw_t *restrict g, const {self.ctype} *restrict x, "
            f"{self.ctype} *restrict t, int64_t v0, int64_t v1)",
            "{",
            f"    const int64_t C = {self.in_channels_c}, E = {self.channels_c}, L = {lanes};",
            f"    const {self.ctype} *restrict w1 = g->w1;",
            "    const int64_t whole = polyc_min(v1, E / L);  /* the vectors with every lane a channel */",
            "    int64_t v = v0;",
        ]
        for vectors in range(most, 0, -1):
            lines += [
                f"    for (; v + {vectors} <= whole; v += {vectors}) {{",
                "        const int64_t e = v * L;",
                "        int64_t w = 0;",
                f"        for (; w + {pixels} <= g->iw; w += {pixels})",
                *block(pixels, vectors, False),
                *self.last_pixels(pixels, lambda count: block(count, vectors, False)),
                "    }",
            ]
        lines += [
            "    if (v < v1) {  /* the last, partial vector */",
            "        const int64_t e = v * L, tail = E - e;",
            f"        {masked_access(isa, self.dtype, lanes, 'tail')[3]}",
            "        int64_t w = 0;",
            f"        for (; w + {pixels} <= g->iw; w += {pixels})",
            *block(pixels, 1, True),
            *self.last_pixels(pixels, lambda count: block(count, 1, True)),
            "    }",
            "}",
        ]
        return "\n".join(lines)

    def last_pixels(self, pixels: int, block) -> list[str]:
        """C of the row's last ``g->iw % pixels`` pixels as one register block (of as many
        pixels as are left when the width is known as the C is written, else one per count):
        one pixel at a time, its two accumulators waited on the FMAs' latency, and the last
        pixels of a short row took a large share of its time (AVX2 code)."""
        width = self.known_extent(self.definition.tensor(self.pointwise.target).shape[-2])
        counts = range(1, pixels) if width is None else [width % pixels] if width % pixels else []
        lines = []
        if counts:
            lines.append("        switch (g->iw - w) {")
            for count in counts:
                lines += [f"        case {count}:", *block(count), "            break;"]
            lines += ["        default:", "            break;", "        }"]
        return lines

    def pointwise_block(
        self, isa: str, lanes: int, pixels: int, vectors: int, masked: bool, indent: str = "            "
    ) -> list[str]:
        """C of one register block: ``pixels`` pixels from w, ``vectors`` channel vectors from e
        (one, under the lane mask ``km``, when ``masked``)."""
        vec, pre, suffix, _, load_full, store_full, load_last, store_last = masked_access(
            isa, self.dtype, lanes, "tail" if masked else None
        )
        load, store = (load_last, store_last) if masked else (load_full, store_full)
        accumulators = [f"a{i}_{j}" for i in range(pixels) for j in range(vectors)]
        lines = [
            "{",
            f"    {vec} " + ", ".join(f"{a} = {pre}_setzero_{suffix}()" for a in accumulators) + ";",
            f"    const {self.ctype} *restrict xp = x + w * C;",
            "    for (int64_t c = 0; c < C; c++) {",
            f"        const {vec} "
            + ", ".join(f"b{j} = {load.format(ptr=f'w1 + c * E + e + {j * lanes}')}" for j in range(vectors))
            + ";",
        ]
        for i in range(pixels):
            lines.append(
                f"        {{ const {vec} s = {pre}_set1_{suffix}(xp[{i} * C + c]); "
                + " ".join(f"a{i}_{j} = {pre}_fmadd_{suffix}(s, b{j}, a{i}_{j});" for j in range(vectors))
                + " }"
            )
        lines.append("    }")
        for i in range(pixels):
            for j in range(vectors):
                a = f"a{i}_{j}"
                if self.pointwise_epilogue is not None:
                    call = "polyc_pw_epilogue_vector_masked" if masked else "polyc_pw_epilogue_vector"
                    lines.append(f"    {a} = {call}(g, {a}, e + {j * lanes}, 0{', km' if masked else ''});")
                lines.append("    " + store.format(ptr=f"t + (w + {i}) * E + e + {j * lanes}", value=a))
        lines.append("}")
        return [indent + line for line in lines]

    def portable_pointwise_row(self) -> str:
        t = self.ctype
        return "\n".join(
            [
                "/* T's row t (pixels 0..iw-1, channels of vectors v0..v1-1) from X's row x, in portable C. */",
                f"static void polyc_pw_row(const polyc_dw_t *restrict g, const {t} *restrict x, {t} *restrict t, "
                "int64_t v0, int64_t v1)",
                "{",
                f"    const int64_t C = {self.in_channels_c}, E = {self.channels_c};",
                "    const int64_t e0 = v0 * POLYC_DW_LANES, e1 = polyc_min(E, v1 * POLYC_DW_LANES);",
                "    for (int64_t w = 0; w < g->iw; w++) {",
                f"        {t} *restrict tw = t + w * E;",
                "        for (int64_t e = e0; e < e1; e++) tw[e] = 0;",
                "        for (int64_t c = 0; c < C; c++) {",
                f"            const {t} s = x[w * C + c], *restrict wc = g->w1 + c * E;",
                "            #pragma omp simd",
                "            for (int64_t e = e0; e < e1; e++) tw[e] += s * wc[e];",
                "        }",
                "    }",
                "}",
            ]
        )

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        conv, pointwise = self.conv, self.pointwise
        arguments = self.pointer_arguments(sizes)
        extent = lambda index: f"({self.size_expr(conv.extent(index))})"  # noqa: E731
        (wh, _) = conv.windows
        images = " * ".join(extent(i) for i in conv.batch) or "1"
        body = self.size_declarations(lambda s: None) + self.record("NULL")  # (each thread's: its ring)
        body += [
            f"g.x = {pointwise.image}; g.w1 = {pointwise.weights}; "
            f"g.xc = ({self.size_expr(pointwise.extent(pointwise.channels[0]))});"
        ]
        body += [
            f"g.t_{tensor} = {tensor};"
            for tensor in self.tensors_of_epilogues(conv.target, conv.epilogues) + self.pointwise_epilogue_tensors()
        ]
        ring = self.ring_rows_c.replace("g->", "g.")
        body += [
            f"const int64_t polyc_images = {images};",
            "const int64_t polyc_vectors = (g.c + POLYC_DW_LANES - 1) / POLYC_DW_LANES;",
            f"const int polyc_init = {1 if conv.init else 0};",
            "/* One thread's ring buffer: rows of T at the whole row's pitch (a thread fills its channels). */",
            f"const size_t polyc_ring = (size_t)(({ring} * g.iw * g.c + 15) / 16 * 16);",
        ]
        item = self.item_lines(wh)
        work = (
            "((double)polyc_images * (double)g.ih * (double)g.iw * (double)g.xc"
            " + (double)polyc_images * (double)g.oh * (double)g.ow * (double)polyc_max(g.kh * g.kw, 1)) * (double)g.c"
        )
        allocate = [
            *self.work_split(wh),
            "const int64_t polyc_items = polyc_images * polyc_bands * polyc_blocks;",
            f"polyc_workspace_t *polyc_work = polyc_workspace_take((size_t)polyc_nthr * polyc_ring * sizeof({self.ctype}));",
            "if (polyc_work == NULL) return 2;",
        ]
        thread = lambda number: [  # noqa: E731
            "polyc_dw_t polyc_gt = g;",
            f"{self.ctype} *const polyc_t = ({self.ctype} *)polyc_work->memory + (size_t)({number}) * polyc_ring;",
            "polyc_gt.in = polyc_t;",
        ]
        serial = [
            *thread("0"),
            "for (int64_t polyc_x = 0; polyc_x < polyc_items; polyc_x++) {",
            *("    " + line for line in item),
            "}",
        ]
        region = [
            *thread("omp_get_thread_num()"),
            "#pragma omp for schedule(dynamic, 1)",
            "for (int64_t polyc_x = 0; polyc_x < polyc_items; polyc_x++) {",
            *("    " + line for line in item),
            "}",
        ]
        body += self.workspace_region(work, _PARALLEL_THRESHOLD, allocate, region, serial) + ["return 0;"]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    def work_split(self, wh) -> list[str]:
        """C choosing the work items, which the threads take as they come free (static halves
        of one image made the threads wait for each other whenever one virtual processor ran
        slower than the other, as on a shared machine, where mobilenet_v2's expansion layers
        then left one thread idle for much of the call):

        * the images, whole while they make ITEMS_PER_THREAD items per thread (whole images
          write whole lines of a large output: blocks of channels ran slower at batch 8);
        * else each image's channel vectors in blocks of at least BLOCK_CHANNELS channels (a
          block reads the image's rows of X again, a few KB each, and computes nothing twice);
        * and its output rows in the bands that cost least: the busiest thread's share of the
          items times the rows of T computed (a band recomputes those that the previous band's
          last output row also read, and starts its ring); of the splits within 1% of the
          least, the one of most items, up to ITEMS_PER_THREAD per thread.

        One thread takes the whole image, by rows."""
        # A band's rows of T computed twice, and one more for starting its ring (two bands of
        # mobilenet_v2's 112 x 112 stride-2 layer cost 2-4% where their one row predicted 1%).
        halo = (
            f"(double)(polyc_max(({wh.dilation} * (g.kh - 1) + 1) - {wh.stride}, 0) + 1) / (double)polyc_max(g.ih, 1)"
        )
        return [
            "int64_t polyc_bands = 1, polyc_blocks = 1;",
            "if (polyc_nthr > 1 && polyc_images > 0) {  /* (no images: no items) */",
            f"    const int64_t wanted = {ITEMS_PER_THREAD} * (int64_t)polyc_nthr;",
            f"    const int64_t least_vectors = (({BLOCK_CHANNELS} + POLYC_DW_LANES - 1) / POLYC_DW_LANES + POLYC_PW_VECTORS - 1)",
            "                                  / POLYC_PW_VECTORS * POLYC_PW_VECTORS;",
            "    polyc_blocks = polyc_min(polyc_max(1, polyc_vectors / least_vectors), (wanted + polyc_images - 1) / polyc_images);",
            "    const int64_t items = polyc_images * polyc_blocks;",
            "    double least = -1;",
            "    int chosen = 0;",
            "    for (int pass = 0; pass < 2; pass++)",
            f"        for (int64_t b = 1; b <= polyc_min(g.oh, {MAX_BANDS}); b++) {{",
            "            const int64_t n = items * b;",
            "            const double busiest = (double)((n + polyc_nthr - 1) / polyc_nthr) / (double)n;",
            f"            const double cost = busiest * (1.0 + (double)(b - 1) * {halo});",
            "            if (pass == 0 && (least < 0 || cost < least)) least = cost;",
            "            if (pass == 1 && cost <= 1.01 * least && (!chosen || items * polyc_bands < wanted)) {",
            "                polyc_bands = b;",
            "                chosen = 1;",
            "            }",
            "        }",
            "}",
        ]

    def item_lines(self, wh) -> list[str]:
        """C of one work item ``polyc_x``: image ``polyc_b``, channel vectors ``polyc_v0..polyc_v1-1``,
        every output row, each after the rows of T it needs and has not yet."""
        ring = self.ring_rows_c.replace("g->", "g.")
        lines = [
            "const int64_t polyc_b = polyc_x / (polyc_bands * polyc_blocks);",
            "const int64_t polyc_band = polyc_x / polyc_blocks % polyc_bands, polyc_block = polyc_x % polyc_blocks;",
            "const int64_t polyc_v0 = polyc_vectors * polyc_block / polyc_blocks;",
            "const int64_t polyc_v1 = polyc_vectors * (polyc_block + 1) / polyc_blocks;",
            f"const {self.ctype} *const polyc_image = g.x + polyc_b * g.ih * g.iw * g.xc;",
            "int64_t polyc_next = g.lo_h;  /* T's rows below it are in the ring (or not needed) */",
            "for (int64_t polyc_oh = g.oh * polyc_band / polyc_bands; polyc_oh < g.oh * (polyc_band + 1) / polyc_bands; polyc_oh++) {",
            f"    const int64_t polyc_top = {wh.stride} * polyc_oh + ({wh.offset});",
            f"    const int64_t polyc_end = polyc_min(g.hi_h, polyc_top + {wh.dilation} * (g.kh - 1) + 1);",
            "    for (int64_t polyc_p = polyc_max(polyc_next, polyc_top); polyc_p < polyc_end; polyc_p++) {",
            f"        {self.ctype} *const polyc_row = polyc_t + (polyc_p % {ring}) * g.iw * g.c;",
            "        polyc_pw_row(&g, polyc_image + polyc_p * g.iw * g.xc, polyc_row, polyc_v0, polyc_v1);",
        ]
        if self.pointwise.epilogues:
            lines += [
                "        if (!POLYC_PW_REGISTER_EPILOGUE) {",
                *("            " + line for line in self.pointwise_scalar_epilogue()),
                "        }",
            ]
        lines += [
            "    }",
            "    polyc_next = polyc_max(polyc_next, polyc_end);",
            "    for (int64_t polyc_v = polyc_v0; polyc_v < polyc_v1; polyc_v++) {",
            "        const int64_t polyc_c0 = polyc_v * POLYC_DW_LANES;",
            "        const int64_t polyc_tail = polyc_min(POLYC_DW_LANES, g.c - polyc_c0);",
            "#if defined(POLYC_DW_PORTABLE_ROWS)",
            "        polyc_dw_row_portable(&polyc_gt, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "#else",
            "        if (polyc_tail == POLYC_DW_LANES) polyc_dw_row_full(&polyc_gt, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "        else polyc_dw_row_masked(&polyc_gt, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "#endif",
        ]
        if self.conv.epilogues:
            lines += [
                "        if (!POLYC_DW_REGISTER_EPILOGUE) {",
                *("            " + line for line in self.scalar_epilogue()),
                "        }",
            ]
        lines += ["    }", "}"]
        return lines

    def pointwise_scalar_epilogue(self) -> list[str]:
        """The 1 x 1 convolution's epilogue statements on a finished row of T in the ring
        (``polyc_row``, channels of vectors polyc_v0..polyc_v1-1), element by element."""
        pointwise, f = self.pointwise, self.pointwise.f[0]
        return [
            "for (int64_t polyc_w = 0; polyc_w < g.iw; polyc_w++) {",
            "    #pragma omp simd",
            f"    for (int64_t polyc_ix_{f} = polyc_v0 * POLYC_DW_LANES; "
            f"polyc_ix_{f} < polyc_min(g.c, polyc_v1 * POLYC_DW_LANES); polyc_ix_{f}++) {{",
            *(
                f"        {self.epilogue_assignment(s, pointwise.target_indices, lhs=f'polyc_row[polyc_w * g.c + polyc_ix_{f}]')};"
                for s in pointwise.epilogues
            ),
            "    }",
            "}",
        ]
