"""C for depthwise convolutions in channels-last layouts: one filter per channel, vectorised
along the channels, each kernel tap's weights loaded once for a block of outputs along the row.

The form (:mod:`polyc.schedule.convolution`, the channel as the only group index, innermost in
all three tensors; zero padding may be the statement's condition)::

    O(n.., h, w, c) +=! (box) ? I(n.., sh*h + dh*r_kh + oh, sw*w + dw*r_kw + ow, c) * W(r_kh, r_kw, c) : 0

Neither of the other kernels suits it: the channel mode of :mod:`polyc.codegen.conv` has one
output channel per group here, and the generic path's loop over the channels loads every
tap's weights and image once per output vector, two loads per FMA.  Here the weights of a
channel vector are loaded once per row, and the image vectors that neighbouring outputs share
once per block of four outputs, which runs mobilenet_v2's 3 x 3 depthwise layers in about half
the generic path's time (measured with ``python -m benchmarks.onnx_segments mobilenet_v2``).

Each work item is one output row of one vector of channels (the last under a lane mask).  The
row's kernel rows that fall outside the box are skipped; its interior outputs (every tap
inside the box) go in blocks of :data:`ROW_BLOCK` (then of 2 and 1) without a test; the
outputs near the edges one at a time, each tap only when it reads inside the box: the
padding's products are not in the sum, not even as 0 x weight, as in the interpreter.
Epilogues (bias, activation, a residual) are applied to the accumulators before their one
store where :mod:`polyc.codegen.register_epilogue` covers them, else in a pass over the
finished row.  The instruction set is the C preprocessor's choice as in the other kernels:
AVX-512, AVX2 with FMA, or portable C whose channel loops the compiler vectorises.  When the window's size is
not known as the C is written (parametric kernels of a def whose window is a size), every
output goes alone, each tap tested.
"""

from __future__ import annotations

import numpy as np

from polyc.codegen.c import c_comment
from polyc.codegen.c_expr import PRELUDE, c_type
from polyc.codegen.conv import ISA_GUARDS
from polyc.codegen.conv_channels import masked_access
from polyc.codegen.pattern_kernel import DedicatedKernel, PatternKernelWriter
from polyc.codegen.register_epilogue import RegisterEpilogue
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.options import Options
from polyc.schedule.convolution import Convolution

#: Outputs along the row per register block where nothing longer fits: their accumulators, a
#: kernel row's weight vectors and the image vectors they read fit the registers (16 with AVX2).
ROW_BLOCK = 4

#: The longest register block tried: eight accumulators keep the two FMA pipes busy through
#: the FMA's latency (four would wait on their own chains: a 7 x 7 filter's interior ran at
#: about half the speed; ``python -m benchmarks --filter depthwise``), where they fit beside a
#: kernel row's weights and image vectors (AVX-512's 32 registers).
LONGEST_BLOCK = 8

#: The blocks of interior outputs after the longest, longest first: the interior outputs a
#: longer block leaves (the 10 of a 14-wide row with a 5 x 5 filter leave 2; a 7-wide row's 3
#: fit none) go in shorter blocks, not one by one with every tap tested.
INTERIOR_BLOCKS = (ROW_BLOCK, 2, 1)

#: Vector registers per instruction set.
_REGISTERS = {"avx512": 32, "avx2": 16}

#: Below this many multiply-adds the kernel runs on one thread.
_PARALLEL_THRESHOLD = 64 * 64 * 64


def generate_depthwise(program: PolyProgram, conv: Convolution, options: Options) -> DedicatedKernel:
    """The kernel of ``conv``, a channels-last depthwise convolution
    (:func:`~polyc.schedule.convolution.depthwise_channels_last`; the depthwise kernel path,
    :mod:`polyc.paths.depthwise`, checks it)."""
    return _DepthwiseWriter(program, conv, options).write()


class _DepthwiseWriter(PatternKernelWriter):
    def __init__(self, program: PolyProgram, conv: Convolution, options: Options):
        super().__init__(program, options)
        self.conv = conv
        self.dtype = np.dtype(conv.dtype)
        self.ctype = c_type(self.dtype)
        self.channel = conv.groups[0]
        # The kernel's rows and columns, and the channels (the image's and the output's pixel
        # pitch): literals when known (the window's loops then unrolled), else the record's (the
        # outputs then go one at a time).
        self.kh, self.kw = (self.known_extent(conv.extent(w.k)) for w in conv.windows)
        self.kh_c, self.kw_c = (str(t) if t is not None else f"g->{n}" for t, n in ((self.kh, "kh"), (self.kw, "kw")))
        channels = self.known_extent(conv.extent(self.channel))
        self.channels_c = "g->c" if channels is None else str(channels)
        self.register_epilogue = (
            RegisterEpilogue.of(conv.epilogues, self.definition, conv.target_indices, self.channel)
            if options.vectorize
            else None
        )
        #: Where a row's image rows are: None, the image's (of image b); else the C expression
        #: of the number of rows a ring buffer at ``g->in`` holds (image row p at p % rows), for
        #: :mod:`polyc.codegen.pointwise_depthwise`, whose image is computed row by row.
        self.ring_rows_c: str | None = None

    def write(self) -> DedicatedKernel:
        d = self.definition
        name = f"polyc_{d.name}"
        sizes = () if self.specialised else tuple(d.sizes)
        parts = [
            self.header(),
            PRELUDE,
            self.preamble("POLYC_CONV_PORTABLE", ["#include <string.h>"]),
            self.context_struct(),
            self.instruction_sets(),
            self.entry_function(name, sizes),
            "",
        ]
        return DedicatedKernel(name, "\n".join(parts), tuple(t.name for t in d.tensors), sizes, (), self.decisions())

    def decisions(self) -> dict:
        """What this writer chose, for :attr:`DedicatedKernel.decisions`."""
        blocks: dict[str, dict] = {}
        for isa in ISA_GUARDS:
            if isa == "portable":
                blocks[isa] = {"lanes": 128 // self.dtype.itemsize, "row_blocks": (1,)}
                continue
            lanes = (64 if isa == "avx512" else 32) // self.dtype.itemsize
            row_blocks = self.row_blocks(isa) if self.kw is not None else (1,)
            hoisted = self.kw is not None and self.weights_in_registers(isa, row_blocks)
            blocks[isa] = {"lanes": lanes, "row_blocks": row_blocks, "weights_in_registers": hoisted}
        return {
            "kernel": "depthwise",
            "convolution": self.conv.describe(),
            "taps": (self.kh, self.kw),
            "channels": self.known_extent(self.conv.extent(self.channel)),
            "work_item": "one output row of one vector of channels",
            "instruction_sets": tuple(ISA_GUARDS),
            "register_blocks": blocks,
            "epilogue_in_registers": self.register_epilogue is not None,
            "parallel": self.options.parallel,
            "parallel_threshold": _PARALLEL_THRESHOLD,
        }

    def title(self) -> str:
        """The kernel's name and form, the first line of its header."""
        return (
            f"polyc depthwise conv kernel for def '{self.definition.name}' (channels vectorised, "
            f"blocks of outputs along a row in registers, {self.kh_c} x {self.kw_c} taps)"
        )

    def described(self) -> str:
        """The header's line on what the kernel computes."""
        return f"convolution: {self.conv.describe()}"

    def header(self) -> str:
        o = self.options
        lines = [
            self.title(),
            f"sizes: {self.sizes_comment()}",
            f"options: parallel={o.parallel} vectorize={o.vectorize} specialize={o.specialize}",
            self.described(),
        ]
        lines += [f"  {s.name}: {s.text}" for s in self.definition.statements]
        return c_comment(lines)

    def context_fields(self) -> list[str]:
        """The fields of the kernel's record ``polyc_dw_t``."""
        t = self.ctype
        fields = [
            f"const {t} *in",
            f"const {t} *w",
            f"{t} *out",
            "int64_t oh, ow, c, ih, iw, kh, kw, lo_h, hi_h, lo_w, hi_w, ow_lo, ow_hi",
        ]
        for name in self.tensors_of_epilogues(self.conv.target, self.conv.epilogues):
            fields.append(self.tensor_field(name))
        return fields

    def tensor_field(self, name: str) -> str:
        tensor = self.definition.tensor(name)
        qualifier = "const " if tensor.role is ir.Role.INPUT else ""
        return f"{qualifier}{c_type(tensor.dtype)} *t_{name}"

    def image_start(self) -> str:
        """C of the start of image b's channels c0.. (in a row function)."""
        return "g->in + b * g->ih * g->iw * g->c + c0" if self.ring_rows_c is None else "g->in + c0"

    def image_row(self, row: str) -> str:
        """C of the offset of image row ``row`` from :meth:`image_start`."""
        return f"{row} * g->iw * C" if self.ring_rows_c is None else f"({row} % {self.ring_rows_c}) * g->iw * C"

    def context_struct(self) -> str:
        body = "\n".join(f"    {f};" for f in self.context_fields())
        return (
            "/* The image, the weights (KH, KW, C) and the output; output rows and columns, channels,\n"
            "   image rows and columns; the box (image positions lo <= p < hi whose products count);\n"
            "   the interior columns ow_lo <= ow < ow_hi (every tap inside the box); the epilogue's\n"
            "   tensors. */\n"
            f"typedef struct {{\n{body}\n}} polyc_dw_t;\n\n"
            "/* ceil(a / b) for b > 0. */\n"
            "static inline int64_t polyc_dw_ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }\n\n"
            "/* The lowest min(max(n, 0), lanes) bits set (the lane mask of a channel vector's tail). */\n"
            "static inline __attribute__((unused)) uint32_t polyc_lane_mask(int64_t n, int lanes)\n"
            "{\n"
            "    return n >= lanes ? (uint32_t)((1ull << lanes) - 1) : n <= 0 ? 0u : (uint32_t)((1u << n) - 1);\n"
            "}"
        )

    # ------------------------------------------------------------------ the rows
    def instruction_sets(self) -> str:
        pieces = []
        for position, (isa, guard) in enumerate(ISA_GUARDS.items()):
            pieces.append("#else" if guard is None else f"{'#if' if position == 0 else '#elif'} {guard}")
            if isa == "portable":
                pieces += [
                    "#define POLYC_DW_REGISTER_EPILOGUE 0",
                    f"#define POLYC_DW_LANES {128 // self.dtype.itemsize}",
                    "#define POLYC_DW_PORTABLE_ROWS 1",
                    self.portable_row(),
                ]
                continue
            lanes = (64 if isa == "avx512" else 32) // self.dtype.itemsize
            in_registers = self.register_epilogue is not None
            pieces += [
                "#include <immintrin.h>",
                f"#define POLYC_DW_REGISTER_EPILOGUE {int(in_registers)}",
                f"#define POLYC_DW_LANES {lanes}",
            ]
            if in_registers:
                _, _, _, _, load_full, _, load_last, _ = masked_access(isa, self.dtype, lanes, "tail")
                mask = "__mmask16" if lanes == 16 else "__mmask8" if isa == "avx512" else "__m256i"
                pieces += [
                    self.register_epilogue.function(self.definition, isa, load_full, context="polyc_dw_t"),
                    self.register_epilogue.function(self.definition, isa, load_last, mask, context="polyc_dw_t"),
                ]
            pieces += [self.vector_row(isa, lanes, masked) for masked in (False, True)]
        pieces.append("#endif")
        return "\n".join(pieces)

    def vector_row(self, isa: str, lanes: int, masked: bool) -> str:
        """``polyc_dw_row_full``/``_masked``: output row ``oh`` of image ``b`` at channels
        c0.. (``tail`` of them under a lane mask in the masked form)."""
        vec, pre, suffix, mask_line, load_full, store_full, load_last, store_last = masked_access(
            isa, self.dtype, lanes, "tail" if masked else None
        )
        load, store = (load_last, store_last) if masked else (load_full, store_full)
        conv, kh, kw = self.conv, self.kh_c, self.kw_c
        (wh, ww) = conv.windows
        sw, dw, ow_off = ww.stride, ww.dilation, ww.offset
        fma = f"{pre}_fmadd_{suffix}"
        epilogue = ""
        if self.register_epilogue is not None:
            call = "polyc_epilogue_vector_masked" if masked else "polyc_epilogue_vector"
            epilogue = f"a = {call}(g, a, c0, q - g->out{', km' if masked else ''});"
        lines = [
            f"/* Output row oh of image b, channels c0.. ({'the first `tail` under a lane mask' if masked else 'whole vectors'}). */",
            f"static void polyc_dw_row_{'masked' if masked else 'full'}(const polyc_dw_t *restrict g, int64_t b, "
            f"int64_t oh, int64_t c0, int64_t tail, int init)",
            "{",
            *self.row_prefetch(),
            f"    {mask_line}" if mask_line else "    (void)tail;",
            f"    const {self.ctype} *restrict image = {self.image_start()};",
            f"    const {self.ctype} *restrict wc = g->w + c0;",
            f"    {self.ctype} *restrict row_out = g->out + (b * g->oh + oh) * g->ow * g->c + c0;",
            f"    const int64_t C = {self.channels_c};",
            f"    const {self.ctype} *rows[{kh} > 0 ? {kh} : 1];  /* each kernel row's image row, NULL outside the box */",
            f"    for (int64_t k = 0; k < {kh}; k++) {{",
            f"        const int64_t p = {wh.stride} * oh + {wh.dilation} * k + {wh.offset};",
            f"        rows[k] = p >= g->lo_h && p < g->hi_h ? image + {self.image_row('p')} : NULL;",
            "    }",
            "    /* The accumulators of output ow: the old output added (+=), the epilogue, one store. */",
            f"#define POLYC_DW_FINISH(a, ow) do {{ {self.ctype} *restrict q = row_out + (ow) * C; "
            f"if (!init) a = {pre}_add_{suffix}({load.format(ptr='q')}, a); {epilogue} "
            f"{store.format(ptr='q', value='a')} }} while (0)",
            "    int64_t ow = 0;",
            "    while (ow < g->ow) {",
        ]
        if self.kw is not None:  # the interior in blocks of outputs, the kernel row unrolled
            blocks = self.row_blocks(isa)
            # Every tap's weights in registers for the whole row, when they fit beside the
            # accumulators and a kernel row's image vectors (a 3 x 3 filter with AVX-512):
            # loaded once per row, not once per block of outputs.
            hoist = self.weights_in_registers(isa, blocks)
            for block in blocks:
                lines += self.interior_block(block, hoist, vec, pre, suffix, load, fma)
                if isa == "avx512" and block > 1:
                    lines += self.edge_block(block, hoist, vec, pre, suffix, lanes, masked)
            if hoist:
                weights = [
                    f"w{k}_{t} = {load.format(ptr=f'wc + {k * self.kw + t} * C')}"
                    for k in range(self.kh)
                    for t in range(self.kw)
                ]
                if weights:
                    lines.insert(lines.index("    int64_t ow = 0;"), f"    const {vec} " + ", ".join(weights) + ";")
        lines += [
            f"        {vec} a = {pre}_setzero_{suffix}();  /* an output near an edge: the taps inside the box */",
            f"        for (int64_t k = 0; k < {kh}; k++) {{",
            "            if (rows[k] == NULL) continue;",
            f"            for (int64_t t = 0; t < {kw}; t++) {{",
            f"                const int64_t p = {sw} * ow + {dw} * t + {ow_off};",
            "                if (p >= g->lo_w && p < g->hi_w)",
            f"                    a = {fma}({load.format(ptr=f'wc + (k * {kw} + t) * C')}, "
            f"{load.format(ptr='rows[k] + p * C')}, a);",
            "            }",
            "        }",
            "        POLYC_DW_PREFETCH(pf_block / " + str(ROW_BLOCK) + " + 1);",
            "        POLYC_DW_FINISH(a, ow);",
            "        ow++;",
            "    }",
            "    POLYC_DW_PREFETCH(g->iw);  /* what the blocks left */",
            "#undef POLYC_DW_FINISH",
            "#undef POLYC_DW_PREFETCH",
            "}",
        ]
        return "\n".join(lines)

    def weights_in_registers(self, isa: str, blocks: tuple[int, ...]) -> bool:
        """Whether every tap's weights stay in registers for a whole row beside the accumulators
        of the longest block and a kernel row's image vectors (the window's size known)."""
        return (
            self.kh is not None
            and self.kw is not None
            and self.kh * self.kw + blocks[0] + len(self.image_offsets(blocks[0])) + 1 <= _REGISTERS[isa]
        )

    def row_blocks(self, isa: str) -> tuple[int, ...]:
        """The register blocks of outputs along a row, longest first: :data:`LONGEST_BLOCK`
        where its accumulators, a kernel row's weights and the image vectors they read fit
        ``isa``'s registers, then :data:`INTERIOR_BLOCKS`."""
        longest = LONGEST_BLOCK
        if longest + (self.kw or 0) + len(self.image_offsets(longest)) + 1 > _REGISTERS[isa]:
            longest = ROW_BLOCK
        width = self.known_extent(self.conv.extent(self.conv.windows[1].x))
        if isa == "avx512" and width:
            # With edge blocks, the row splits into blocks of one length (a 14-wide row into
            # two of 7, not 8 + 4 + 2, whose short blocks wait on their few chains).
            blocks = -(-width // longest)
            longest = min(longest, -(-width // blocks))
        return tuple(sorted({longest, *INTERIOR_BLOCKS}, reverse=True))

    def edge_block(
        self, size: int, hoist: bool, vec: str, pre: str, suffix: str, lanes: int, masked: bool
    ) -> list[str]:
        """The C of ``size`` outputs from ``ow`` on, some of them near an edge (AVX-512): each
        image column that falls outside the box is neither loaded nor multiplied (its lane mask
        is empty), so the sum has exactly the taps inside the box, as one output at a time has;
        the block costs what an interior block costs, where one output at a time tested every
        tap on one chain of FMAs."""
        (_, ww) = self.conv.windows
        sw, dw, ow_off = ww.stride, ww.dilation, ww.offset
        offsets = self.image_offsets(size)
        mask = "__mmask16" if lanes == 16 else "__mmask8"
        every = "km" if masked else f"({mask})-1"
        head = [
            f"        if (ow + {size} <= g->ow) {{  /* near an edge: columns outside the box masked off */",
            f"            const int64_t col = {sw} * ow + {ow_off};",
            f"            const {mask} "
            + ", ".join(f"m{s} = col + {s} >= g->lo_w && col + {s} < g->hi_w ? {every} : ({mask})0" for s in offsets)
            + ";",
        ]
        fmas = [
            f"a{j} = {pre}_mask3_fmadd_{suffix}(w{{k}}_{t}, x{sw * j + dw * t}, a{j}, m{sw * j + dw * t});"
            for j in range(size)
            for t in range(self.kw)
        ]
        images = (
            f"const {vec} " + ", ".join(f"x{s} = {pre}_maskz_loadu_{suffix}(m{s}, p + {s} * C)" for s in offsets) + ";"
        )
        load = f"{pre}_maskz_loadu_{suffix}(km, {{ptr}})" if masked else f"{pre}_loadu_{suffix}({{ptr}})"
        # p may point before the image row (col < 0): only columns inside the box are read.
        return self.register_block(
            head,
            size,
            hoist,
            vec,
            pre,
            suffix,
            load,
            f"const {self.ctype} *p",
            "col * C",
            images,
            fmas,
            f"pf_block * {size} / {ROW_BLOCK} + 1",
        )

    def image_offsets(self, size: int) -> list[int]:
        """The image columns, from a block's first one, that ``size`` outputs read."""
        ww = self.conv.windows[1]
        return sorted({ww.stride * j + ww.dilation * t for j in range(size) for t in range(self.kw)})

    def interior_block(self, size: int, hoist: bool, vec: str, pre: str, suffix: str, load: str, fma: str) -> list[str]:
        """The C of ``size`` interior outputs from ``ow`` on, when they are all interior: each
        kernel row's image vectors loaded once for the block, its weights from the registers
        (``hoist``) or loaded once per kernel row."""
        (_, ww) = self.conv.windows
        sw, dw, ow_off = ww.stride, ww.dilation, ww.offset
        offsets = self.image_offsets(size)
        head = [f"        if (ow >= g->ow_lo && ow + {size} <= g->ow_hi) {{"]
        fmas = [f"a{j} = {fma}(w{{k}}_{t}, x{sw * j + dw * t}, a{j});" for j in range(size) for t in range(self.kw)]
        images = (
            f"const {vec} " + ", ".join(f"x{s} = {load.format(ptr=f'p + {s} * C')}" for s in offsets) + ";"
            if self.kw
            else ""
        )
        prefetched = "pf_block" if size == ROW_BLOCK else f"pf_block * {size} / {ROW_BLOCK} + 1"
        return self.register_block(
            head,
            size,
            hoist,
            vec,
            pre,
            suffix,
            load,
            f"const {self.ctype} *restrict p",
            f"({sw} * ow + {ow_off}) * C",
            images,
            fmas,
            prefetched,
        )

    def register_block(
        self,
        head: list[str],
        size: int,
        hoist: bool,
        vec: str,
        pre: str,
        suffix: str,
        load: str,
        pointer: str,
        column: str,
        images: str,
        fmas: list[str],
        prefetched: str,
    ) -> list[str]:
        """A block of ``size`` outputs (interior or edge): ``head`` (its condition and what it
        computes first), its accumulators, each kernel row's image vectors (``images``, read
        from ``pointer`` = the row's start plus ``column``) and multiply-adds (``fmas``, with
        ``{k}`` for the kernel row) with the weights from the registers (``hoist``) or loaded
        (``load``) once per kernel row, then the stores."""
        kh, kw = self.kh_c, self.kw_c
        lines = [
            *head,
            f"            {vec} " + ", ".join(f"a{j} = {pre}_setzero_{suffix}()" for j in range(size)) + ";",
        ]
        if hoist:
            for k in range(self.kh):
                lines += [
                    f"            if (rows[{k}] != NULL) {{",
                    f"                {pointer} = rows[{k}] + {column};",
                    f"                {images}",
                    *(f"                {line.format(k=k)}" for line in fmas),
                    "            }",
                ]
        else:
            lines += [
                *(["            #pragma GCC unroll 8"] if self.kh is not None else []),
                f"            for (int64_t k = 0; k < {kh}; k++) {{",
                "                if (rows[k] == NULL) continue;",
                f"                {pointer} = rows[k] + {column};",
                f"                const {self.ctype} *restrict wk = wc + k * {kw} * C;",
            ]
            if self.kw:
                lines.append(
                    f"                const {vec} "
                    + ", ".join(f"wk_{t} = {load.format(ptr=f'wk + {t} * C')}" for t in range(self.kw))
                    + ";"
                )
                lines.append(f"                {images}")
            lines += [f"                {line.format(k='k')}" for line in fmas]
            lines.append("            }")
        return lines + [
            f"            POLYC_DW_PREFETCH({prefetched});",
            *(f"            POLYC_DW_FINISH(a{j}, ow + {j});" for j in range(size)),
            f"            ow += {size};",
            "            continue;",
            "        }",
        ]

    def row_prefetch(self) -> list[str]:
        """The start of a vector row: the image lines of this channel vector that the next
        output row reads and this one does not (its new image rows, up to two), to be
        prefetched a few per block of outputs (``POLYC_DW_PREFETCH``).

        An item reads one line (a channel vector) of each pixel of its image rows, 9 lines
        apart for 144 channels, and the items of a row's other channel vectors the lines between:
        a stride the hardware's prefetchers do not run far enough ahead on.  At batch 8 the
        expansion layers' outputs do not fit in the caches (mobilenet_v2's 144-channel layers at
        56 x 56 are 14.5 MB), and the depthwise layers after them waited on memory."""
        if self.ring_rows_c is not None:  # the rows are in the caches already
            return ["#define POLYC_DW_PREFETCH(n) do { } while (0)"]
        (wh, _) = self.conv.windows
        kh = self.kh_c
        return [
            "    /* The next row's new image rows (see row_prefetch in polyc/codegen/depthwise.py). */",
            f"    const {self.ctype} *pf_rows[2] = {{NULL, NULL}};",
            "    if (oh + 1 < g->oh) {",
            "        int64_t found = 0;",
            f"        for (int64_t k = {kh} - 1; k >= 0 && found < 2; k--) {{",
            f"            if ({wh.dilation} * k <= {wh.dilation} * ({kh} - 1) - {wh.stride})",
            "                break;  /* read by this row too */",
            f"            const int64_t p = {wh.stride} * (oh + 1) + {wh.dilation} * k + {wh.offset};",
            "            if (p >= g->lo_h && p < g->hi_h)",
            "                pf_rows[found++] = g->in + ((b * g->ih + p) * g->iw) * g->c + c0;",
            "        }",
            "    }",
            "    int64_t pf_next = 0;",
            f"    const int64_t pf_block = (g->iw * {ROW_BLOCK} + g->ow - 1) / polyc_max(g->ow, 1);",
            "#define POLYC_DW_PREFETCH(n) do { \\",
            "        for (const int64_t pf_end = polyc_min(g->iw, pf_next + (n)); pf_next < pf_end; pf_next++) { \\",
            "            if (pf_rows[0] != NULL) __builtin_prefetch(pf_rows[0] + pf_next * g->c, 0, 3); \\",
            "            if (pf_rows[1] != NULL) __builtin_prefetch(pf_rows[1] + pf_next * g->c, 0, 3); \\",
            "        } \\",
            "    } while (0)",
        ]

    def portable_row(self) -> str:
        """The rows in portable C: per output, the taps inside the box, a loop over the channels."""
        conv, kh, kw, t = self.conv, self.kh_c, self.kw_c, self.ctype
        (wh, ww) = conv.windows
        return "\n".join(
            [
                "/* Output row oh of image b, channels c0 .. c0 + tail - 1, in portable C. */",
                "static void polyc_dw_row_portable(const polyc_dw_t *restrict g, int64_t b, int64_t oh, int64_t c0, "
                "int64_t tail, int init)",
                "{",
                f"    const {t} *restrict image = {self.image_start()};",
                f"    const {t} *restrict wc = g->w + c0;",
                f"    {t} *restrict row_out = g->out + (b * g->oh + oh) * g->ow * g->c + c0;",
                f"    const int64_t C = {self.channels_c};",
                "    for (int64_t ow = 0; ow < g->ow; ow++) {",
                f"        {t} acc[POLYC_DW_LANES];",
                "        for (int64_t i = 0; i < tail; i++) acc[i] = 0;",
                f"        for (int64_t k = 0; k < {kh}; k++) {{",
                f"            const int64_t ph = {wh.stride} * oh + {wh.dilation} * k + {wh.offset};",
                "            if (ph < g->lo_h || ph >= g->hi_h) continue;",
                f"            for (int64_t s = 0; s < {kw}; s++) {{",
                f"                const int64_t pw = {ww.stride} * ow + {ww.dilation} * s + {ww.offset};",
                "                if (pw < g->lo_w || pw >= g->hi_w) continue;",
                f"                const {t} *restrict x = image + {self.image_row('ph')} + pw * C, *restrict wt = wc + (k * {kw} + s) * C;",
                "                #pragma omp simd",
                "                for (int64_t i = 0; i < tail; i++) acc[i] += wt[i] * x[i];",
                "            }",
                "        }",
                f"        {t} *restrict q = row_out + ow * C;",
                "        for (int64_t i = 0; i < tail; i++) q[i] = init ? acc[i] : q[i] + acc[i];",
                "    }",
                "}",
            ]
        )

    # ------------------------------------------------------------------ the entry point
    def entry_function(self, name: str, sizes: tuple[str, ...]) -> str:
        conv = self.conv
        arguments = self.pointer_arguments(sizes)
        extent = lambda index: f"({self.size_expr(conv.extent(index))})"  # noqa: E731
        (wh, ww) = conv.windows
        batch = " * ".join(extent(i) for i in conv.batch) or "1"
        body = self.size_declarations(lambda s: None) + self.record(conv.image)
        body += [f"g.t_{tensor} = {tensor};" for tensor in self.tensors_of_epilogues(conv.target, conv.epilogues)]
        body += [
            f"const int64_t polyc_rows = ({batch}) * g.oh;",
            "const int64_t polyc_vectors = (g.c + POLYC_DW_LANES - 1) / POLYC_DW_LANES;",
            "const int64_t polyc_items = polyc_rows * polyc_vectors;",
            f"const int polyc_init = {1 if conv.init else 0};",
        ]
        item = [
            "const int64_t polyc_row = polyc_x / polyc_vectors, polyc_c0 = polyc_x % polyc_vectors * POLYC_DW_LANES;",
            "const int64_t polyc_b = polyc_row / g.oh, polyc_oh = polyc_row % g.oh;",
            "const int64_t polyc_tail = polyc_min(POLYC_DW_LANES, g.c - polyc_c0);",
            "#if defined(POLYC_DW_PORTABLE_ROWS)",
            "polyc_dw_row_portable(&g, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "#else",
            "if (polyc_tail == POLYC_DW_LANES) polyc_dw_row_full(&g, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "else polyc_dw_row_masked(&g, polyc_b, polyc_oh, polyc_c0, polyc_tail, polyc_init);",
            "#endif",
        ]
        if conv.epilogues:
            item += ["if (!POLYC_DW_REGISTER_EPILOGUE) {", *("    " + line for line in self.scalar_epilogue()), "}"]
        work = "(double)polyc_items * (double)g.ow * (double)polyc_max(g.kh * g.kw, 1) * POLYC_DW_LANES"
        serial = [
            "for (int64_t polyc_x = 0; polyc_x < polyc_items; polyc_x++) {",
            *("    " + line for line in item),
            "}",
        ]
        if not self.options.parallel:
            body += serial + ["return 0;"]
        else:
            # Guided: long runs of consecutive rows first, shorter ones as the rows run out, so
            # that a thread on a slower virtual processor takes fewer (see pointwise_depthwise).
            body += self.parallel_region(
                work, _PARALLEL_THRESHOLD, ["#pragma omp for schedule(guided)", *serial], serial
            ) + ["return 0;"]
        signature = f"int {name}({', '.join(arguments)})"
        return signature + "\n{\n" + "\n".join("    " + line for line in body) + "\n}"

    def record(self, image: str) -> list[str]:
        """C declaring the record ``g`` of the depthwise convolution, its image at ``image``."""
        conv = self.conv
        extent = lambda index: f"({self.size_expr(conv.extent(index))})"  # noqa: E731
        (wh, ww) = conv.windows
        return [
            "polyc_dw_t g = {0};",
            f"g.in = {image}; g.w = {conv.weights}; g.out = {conv.target};",
            f"g.oh = {extent(wh.x)}; g.ow = {extent(ww.x)}; g.c = {extent(self.channel)};",
            *self.image_box_fields(conv),
            f"g.kh = {extent(wh.k)}; g.kw = {extent(ww.k)};",
            # the interior columns: every tap of the row inside [lo_w, hi_w)
            f"g.ow_lo = polyc_min(g.ow, polyc_max(0, polyc_dw_ceil_div(g.lo_w - ({ww.offset}), {ww.stride})));",
            f"g.ow_hi = polyc_max(g.ow_lo, polyc_min(g.ow, polyc_dw_ceil_div(g.hi_w - {ww.dilation} * "
            f"polyc_max(g.kw - 1, 0) - ({ww.offset}), {ww.stride})));",
        ]

    def scalar_epilogue(self) -> list[str]:
        """The epilogue statements on the item's finished outputs, element by element."""
        conv = self.conv
        lines = self.batch_indices(conv, "polyc_b")
        lines += [
            f"const int64_t polyc_ix_{conv.windows[0].x} = polyc_oh;",
            f"for (int64_t polyc_ix_{conv.windows[1].x} = 0; polyc_ix_{conv.windows[1].x} < g.ow; "
            f"polyc_ix_{conv.windows[1].x}++) {{",
            "    #pragma omp simd",
            f"    for (int64_t polyc_ix_{self.channel} = polyc_c0; polyc_ix_{self.channel} < polyc_c0 + polyc_tail; "
            f"polyc_ix_{self.channel}++) {{",
            *(f"        {self.epilogue_assignment(s, conv.target_indices)};" for s in conv.epilogues),
            "    }",
            "}",
        ]
        return lines
