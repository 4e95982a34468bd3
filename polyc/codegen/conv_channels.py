"""The direct convolution kernel's second form: output channels vectorised, for layouts whose
output channels are the innermost dimension (NHWC: ``O(n, h, w, f)``).

:mod:`polyc.codegen.conv` vectorises along the output points, which are contiguous in NCHW.
In NHWC the points are a whole pixel (all its channels) apart, so that form would gather every
tile of the image into a panel first; here the register block is instead ``NFV`` vectors of
consecutive output channels x ``RQ`` points::

    for each reduction step r:   w_v = W[r][f0 + v * LANES ..]          (NFV vector loads)
                                 for each point j: b = I[point j][r]   (one broadcast)
                                                   acc[j][v] += w_v * b

the matrix product ``O[q, f] = B[q, r] * W[r, f]`` with W's rows as vectors, as oneDNN's and
MLAS's blocked-channel kernels do.  Each point of the block is read through its own pointer
(``ip[j]``, the image at that point) plus the step's offset ``in_r[r]``, so the points may be
anywhere in the image: strides, dilations and rows crossed inside a block need no packing.  A
block's stores are whole vectors of one output pixel's channels (the last under a lane mask
when the channels are not a multiple of the vector).  Tiles of RQ points cover every output
point of a group in order, across images and rows (the batch is a point index here); the last
tile repeats its last point and drops the copies.

Zero padding in the statement's condition (:mod:`polyc.schedule.convolution`: the products of
positions outside a box are not in the sum).  The kernel reads the image itself, with no padded
copy: it tabulates once per size, for each tile and kernel tap, which of the tile's points read
the tap inside the box.  A call of the register block runs *pieces*: runs of steps (taps) with
the same points, those whose products count; the steps of a piece that is not every point's add
each point's products under a mask (AVX-512: an FMA under a whole-vector mask; else a branch per
point), so the others add nothing, not even 0 * weight (NaN for an infinite weight), and read
through the pointer of a point in the mask (nothing outside the image is read); taps no point of
the tile reads inside the box are skipped, as onnxruntime's NCHWc kernels skip the padding.  (A
zero-padded copy of the image, made every call, had cost a few percent of resnet18's 3x3 layers:
``python -m benchmarks.onnx_segments resnet18``.)

Weights whose output channels are consecutive within each block of NF (``W(kh, kw, c, f)``, or
blocked ``W(f / B, kh, kw, c, f % B)`` for a multiple B of NF) and whose reduction rows are
evenly spaced are read in place, as the vectors of each step; others are packed once per call
into ``[group][channel block][r][NF]`` (zero columns pad the last block).  Blocked weights are
what an ONNX session gives this kernel (:mod:`polyc.frontends.onnx.channels_last`): a block's
rows are then consecutive, where ``W(kh, kw, c, f)``'s are F apart, which an Intel core's
prefetchers follow poorly: resnet18's 512 -> 512 3x3 layer at 7 x 7 ran much faster with its
rows consecutive than 2 KB apart (``python -m benchmarks.onnx_segments resnet18``).

Work.  A work item is (group, chunk of channel blocks, run of tiles); within it the reduction
is cut into chunks whose slice of the weights (``rchunk`` rows x the item's channels) fits a
share of L2, and every tile and channel block of the item is done for one chunk before the
next (the output block is accumulated in memory between chunks), so the weights come from
memory once per run, not once per tile (512 -> 512 3x3 filters are 9.4 MB).  How many chunks
and runs: the split with the least memory traffic (each run reads its chunk's weights, each
chunk reads the image) among those with an item per thread, or more items (up to 4 per thread)
for at most 5% more traffic.  Each kernel call also prefetches, a line per step, its share of
the weights the next chunk (or the next item) will read, which a model's weights need: they come
from memory.  The epilogue is applied to the accumulators of the last chunk before their store
when :mod:`polyc.codegen.register_epilogue` covers it (bias, scale, residual, ReLU, Clip,
Sigmoid); else it runs on each tile after its last chunk, vectorised along the channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.codegen.c_expr import c_type
from polyc.codegen.gemm import _VECTOR_SPELLINGS
from polyc.codegen.pattern_kernel import typed
from polyc.codegen.register_epilogue import RegisterEpilogue
from polyc.codegen.templates import c_template

#: Channel vectors (NFV) per register block, per instruction set, at most.
MAX_CHANNEL_VECTORS = {"avx512": 4, "avx2": 2, "portable": 1}

#: Points per register block (RQ) by the block's channel vectors: NFV x RQ accumulators, NFV
#: weight vectors and one broadcast fit the registers (32 with AVX-512, 16 with AVX2).
_POINTS = {"avx512": {4: 6, 3: 8, 2: 12, 1: 12}, "avx2": {2: 6, 1: 12}, "portable": {1: 4}}

#: Points per register block whose pointers the general registers hold beside the loop's own;
#: blocks of more points read evenly spaced points through one pointer where they can.
_POINTER_POINTS = 8

#: FLOPs a thread does in the time the memory moves a byte, roughly (a current x86 core's peak
#: FMA rate against its share of the memory bandwidth): a split of the work costs the longer of
#: its busiest thread's arithmetic and its memory traffic at this rate.
FLOPS_PER_BYTE = 4.0

#: Reduction steps per chunk from which a tile prefetches the output lines of a tile ahead (see
#: ``polyc_conv_work``): a tile's steps then take far longer than its prefetches.
OUTPUT_PREFETCH_STEPS = 128

#: Most runs of consecutive image elements per reduction chunk for which a tile prefetches the
#: image rows of a tile ahead (see ``polyc_conv_work``): two prefetches a run and tile.
IMAGE_ROW_RUNS = 32

#: Bytes of the weights a reduction chunk may use (rchunk x NF elements): a share of L2 on
#: every x86 core polyc targets (512 KiB on Zen 3, 1-2 MiB on Zen 5 and Xeons).
WEIGHT_SLICE_BYTES = 256 * 1024


@dataclass(frozen=True)
class ChannelBlock:
    """``vectors`` vectors of ``lanes`` output channels x ``points`` points.  ``half_tail``:
    the vectors of the last channel block when its last vector holds at most half a vector's
    lanes and AVX-512 computes that one in a 256-bit vector (see :func:`vector_kernel`), else 0."""

    isa: str
    lanes: int
    vectors: int
    points: int
    half_tail: int = 0

    @property
    def nf(self) -> int:
        return self.lanes * self.vectors


#: Where AVX-512's 256-bit vectors have lane masks too (the ``_half`` kernels need them).
HALF_GUARD = "#if defined(__AVX512VL__)"

#: Independent accumulators a register block needs to hide the FMA's latency (two FMA units x
#: about four cycles on the x86 cores polyc targets): fewer points per block leave them idle.
_LATENCY_ACCUMULATORS = 8


def channel_block(isa: str, dtype: np.dtype, channels: int | None, points: int | None = None) -> ChannelBlock:
    """The register block of ``isa`` for ``channels`` output channels and ``points`` output
    points (None: unknown).  With the points known, a block of fewer points than the most the
    registers hold, when the last tile would otherwise be mostly copies: a 7 x 7 image at batch
    1 is 49 points, 9 tiles of 6 (54 computed) or 10 of 5 (50), for a tenth of the time of
    resnet18's and mobilenet_v2's last layers."""
    itemsize = np.dtype(dtype).itemsize
    lanes = {"avx512": 64, "avx2": 32, "portable": 128}[isa] // itemsize
    most = MAX_CHANNEL_VECTORS[isa]
    vectors = most if not channels else max(1, min(most, -(-channels // lanes)))
    half_tail = 0
    if isa == "avx512" and channels:
        last_block = channels - (channels - 1) // (lanes * vectors) * (lanes * vectors)
        last_vectors = -(-last_block // lanes)
        if last_block - (last_vectors - 1) * lanes <= lanes // 2:
            half_tail = last_vectors
    return ChannelBlock(isa, lanes, vectors, _block_points(_POINTS[isa][vectors], vectors, points), half_tail)


def _block_points(most: int, vectors: int, points: int | None) -> int:
    """Points per register block: of 1..most, the least time for ``points`` points, counting
    each tile's points (the last tile's copies too), at least the accumulators that hide the
    FMA's latency, and half a point for a tile's own cost (its pointers, its stores); the most
    points of those that tie."""
    if not points:
        return most
    floor = -(-_LATENCY_ACCUMULATORS // vectors)

    def cost(rq: int) -> float:
        return -(-points // rq) * (max(rq, floor) + 0.5)

    return min(range(most, 0, -1), key=cost)


_ARGUMENTS = (
    "const int64_t *restrict pieces, int64_t npieces, const T *restrict wp, int64_t w_step, const T *const *restrict ip, "
    "const int64_t *restrict roff, T *restrict out, const int64_t *restrict oo, int beta, int64_t tail, "
    "const char *pf, int64_t pf_step, int64_t npf, const char *ipf, int64_t nipf, "
    "const polyc_conv_t *restrict g, int64_t f0, int last_chunk"
)


def mask_type(isa: str, lanes: int) -> str:
    """The C type of ``isa``'s lane mask ``km`` for vectors of ``lanes`` lanes."""
    return ("__mmask16" if lanes == 16 else "__mmask8") if isa == "avx512" else "__m256i"


def masked_access(isa: str, dtype: np.dtype, lanes: int, count: str | None):
    """The C spellings of ``isa``'s vectors of ``dtype``: (vector type, intrinsic prefix,
    suffix, the line declaring the lane mask ``km`` or None, load and store formats of a whole
    vector, load and store formats of the last one).  ``count``: C for the number of lanes of
    the last vector in use (loads and stores under the mask ``km``), None: whole vectors.  The
    formats take ``{ptr}`` (and ``{value}``)."""
    vec, pre, suffix = _VECTOR_SPELLINGS[(isa, np.dtype(dtype).itemsize)]
    load_full, store_full = f"{pre}_loadu_{suffix}({{ptr}})", f"{pre}_storeu_{suffix}({{ptr}}, {{value}});"
    if count is None:
        return vec, pre, suffix, None, load_full, store_full, load_full, store_full
    if isa == "avx512":
        mask = mask_type(isa, lanes)
        return (
            vec,
            pre,
            suffix,
            f"const {mask} km = ({mask})polyc_lane_mask({count}, {lanes});",
            load_full,
            store_full,
            f"{pre}_maskz_loadu_{suffix}(km, {{ptr}})",
            f"{pre}_mask_storeu_{suffix}({{ptr}}, km, {{value}});",
        )
    bits = 32 if lanes == 8 else 64
    set1 = "_mm256_set1_epi32((int)" if bits == 32 else "_mm256_set1_epi64x((long long)"
    iota = f"_mm256_setr_epi32({', '.join(map(str, range(8)))})" if bits == 32 else "_mm256_setr_epi64x(0, 1, 2, 3)"
    return (
        vec,
        pre,
        suffix,
        f"const __m256i km = _mm256_cmpgt_epi{bits}({set1}polyc_max(0, polyc_min({lanes}, {count}))), {iota});",
        load_full,
        store_full,
        f"{pre}_maskload_{suffix}({{ptr}}, km)",
        f"{pre}_maskstore_{suffix}({{ptr}}, km, {{value}});",
    )


def vector_kernel(
    block: ChannelBlock,
    dtype: np.dtype,
    nfv: int,
    masked: bool = True,
    epilogue: bool = False,
    point_stride: int | None = None,
    half: bool = False,
) -> str:
    """``polyc_convc_kernel_<nfv>``: nfv channel vectors x RQ points, unrolled.  The last vector
    holds ``tail`` channels (1..LANES): loaded and stored under a lane mask (``masked=False``,
    AVX2's ``_full`` kernels: all vectors whole, no mask register held through the loop).
    Point j's image is ``ip[j] + roff[r]`` at step r, its output ``out + oo[j]`` (skipped when
    ``oo[j] < 0``); step r's weights are ``wp + r * w_step``.  Step r < npf also prefetches
    line r of the weights to come: ``pf``'s rows ``pf_step`` bytes apart, POLYC_PF_LINES lines
    each; step r < nipf line r of the image a later tile reads (``ipf``, consecutive lines).
    With ``epilogue``, the last chunk's accumulators go through ``polyc_epilogue_vector``
    (:mod:`polyc.codegen.register_epilogue`) before their store.  With ``point_stride``
    (``_uniform`` kernels), point j's image is ``ip[0] + j * point_stride``: one pointer for
    the tile, its points' offsets in the instructions, where twelve pointers and the loop's own
    did not fit the general registers (copies to vector registers and back at every step, far
    from the FMAs' peak on mobilenet_v2's 1x1 layers at 112 x 112).  With ``half`` (AVX-512,
    ``_half`` kernels, for a ``tail`` of at most half the lanes), the last vector is a 256-bit
    one: AMD's Zen 4 does a 512-bit FMA as two 256-bit halves, masked-off lanes included, so
    a 1x1 144 -> 24 layer (a vector and a half of
    channels) cost as much as 144 -> 32; an Intel core's 256-bit FMA takes a port as its
    512-bit one does.  Its accumulators are widened back to 512 bits (upper lanes zero) for
    the stores and the epilogue."""
    ctype = c_type(dtype)
    lanes, rq, last = block.lanes, block.points, nfv - 1
    vec, pre, suffix, mask_line, load_full, store_full, load_last, store_last = masked_access(
        block.isa, dtype, lanes, "tail" if masked else None
    )
    name = (
        f"polyc_convc_kernel_{nfv}{'_half' if half else ''}{'' if masked else '_full'}"
        f"{'' if point_stride is None else '_uniform'}"
    )
    lines = [
        f"/* {nfv} vector(s) of output channels x {rq} points{', the last of 256 bits' if half else ''}. */",
        f"static __attribute__((noinline)) void {name}({typed(_ARGUMENTS, ctype)})",
        "{",
        f"    {mask_line}" if mask_line else "    (void)tail;",
        "    (void)g; (void)f0; (void)last_chunk;",
    ]
    full_vectors = last if half else nfv  # the vectors of the register width
    half_vec, widen = {"ps": ("__m256", "_mm512_zextps256_ps512"), "pd": ("__m256d", "_mm512_zextpd256_pd512")}[suffix]
    # The broadcast: of the register width, its low half for the last vector (free); a
    # 256-bit one when that vector is the only one.
    b_vec, b_pre, narrow = vec, pre, f"_mm512_cast{suffix}512_{suffix}256"
    if half and not full_vectors:
        b_vec, b_pre, narrow = half_vec, "_mm256", ""
    if half:
        lines.append(f"    const __mmask8 kh = (__mmask8)polyc_lane_mask(tail, {lanes // 2});")

    def load(v: int, base: str) -> str:
        return (load_last if v == last else load_full).format(ptr=f"{base} + {v * lanes}")

    def store(v: int, base: str, value: str) -> str:
        return (store_last if v == last else store_full).format(ptr=f"{base} + {v * lanes}", value=value)

    acc = [[f"c{j}_{v}" for v in range(nfv)] for j in range(rq)]
    for row in acc:
        full = [f"{a} = {pre}_setzero_{suffix}()" for a in row[:full_vectors]]
        declarations = [f"{vec} " + ", ".join(full) + ";"] if full else []
        if half:
            declarations.append(f"{half_vec} {row[last]} = _mm256_setzero_{suffix}();")
        lines.append("    " + " ".join(declarations))
    if point_stride is None:
        lines.append("    " + " ".join(f"const {ctype} *restrict p{j} = ip[{j}];" for j in range(rq)))
        point = [f"p{j}[o]" for j in range(rq)]
        # A piece's points outside its mask read through the pointer of its first point inside
        # (a piece has one): their loads are not used, and the image read in place has no
        # padding around it to read.
        masked_point = [f"q{j}[o]" for j in range(rq)]
        redirect = [
            "        const unsigned first = (unsigned)__builtin_ctzll(mask);",
            "        "
            + " ".join(f"const {ctype} *restrict q{j} = mask >> {j} & 1 ? p{j} : ip[first];" for j in range(rq)),
        ]
    else:  # tiles with padding do not call these (POLYC_POINT_STRIDE is 0 then)
        lines.append(f"    const {ctype} *restrict p0 = ip[0];")
        point = masked_point = [f"p0[o + {j * point_stride}]" for j in range(rq)]
        redirect = []

    def steps(masked: bool) -> list[str]:
        """The loop over one piece's steps; ``masked``: point j's products only when bit j of
        the piece's mask is set (an FMA under a whole-vector mask, or a branch)."""
        body = [
            "        for (int64_t r = pieces[3 * k]; r < r1; r++, wq += w_step) {",
            "            const int64_t o = roff[r];",
            "            if (r < npf) POLYC_PREFETCH_LINE(pf, pf_step, r);",
            "            if (r < nipf) __builtin_prefetch(ipf + 64 * r, 0, 3);",
        ]
        if full_vectors:
            body.append(
                f"            const {vec} " + ", ".join(f"w{v} = {load(v, 'wq')}" for v in range(full_vectors)) + ";"
            )
        if half:
            body.append(f"            const {half_vec} w{last} = _mm256_maskz_loadu_{suffix}(kh, wq + {last * lanes});")
        body.append(f"            {b_vec} b;")
        for j in range(rq):
            if masked and block.isa == "avx512":
                fmas = " ".join(
                    f"{acc[j][v]} = {pre}_mask3_fmadd_{suffix}(w{v}, b, {acc[j][v]}, m{j});"
                    for v in range(full_vectors)
                )
                if half:
                    fmas += f" {acc[j][last]} = _mm256_mask3_fmadd_{suffix}(w{last}, {narrow}(b), {acc[j][last]}, (__mmask8)m{j});"
            else:
                fmas = " ".join(
                    f"{acc[j][v]} = {pre}_fmadd_{suffix}(w{v}, b, {acc[j][v]});" for v in range(full_vectors)
                )
                if half:
                    fmas += f" {acc[j][last]} = _mm256_fmadd_{suffix}(w{last}, {narrow}(b), {acc[j][last]});"
                if masked:
                    fmas = f"if (mask >> {j} & 1) {{ {fmas} }}"
            body.append(f"            b = {b_pre}_set1_{suffix}({(masked_point if masked else point)[j]}); {fmas}")
        return body + ["        }"]

    masks = []
    if block.isa == "avx512":
        kind = mask_type(block.isa, lanes)
        masks = [
            f"        const {kind} " + ", ".join(f"m{j} = ({kind})-(int)(mask >> {j} & 1)" for j in range(rq)) + ";"
        ]
    lines += [
        "    for (int64_t k = 0; k < npieces; k++) {",
        "        const int64_t r1 = pieces[3 * k + 1];",
        "        const uint64_t mask = (uint64_t)pieces[3 * k + 2];",
        "        const T *restrict wq = wp + pieces[3 * k] * w_step;".replace("T *", f"{ctype} *"),
        "        if (mask == POLYC_ALL_POINTS) {",
        *("    " + line for line in steps(False)),
        "            continue;",
        "        }",
        *masks,
        *redirect,
        *steps(True),
        "    }",
    ]
    if half:  # the stores and the epilogue take the last accumulators widened
        for j in range(rq):
            acc[j][last] = f"{acc[j][last]}w"
    for j in range(rq):
        body = [f"{ctype} *restrict q = out + oo[{j}];"]
        if half:
            body.append(f"{vec} {acc[j][last]} = {widen}(c{j}_{last});")
        body += [f"if (beta) {acc[j][v]} = {pre}_add_{suffix}({load(v, 'q')}, {acc[j][v]});" for v in range(nfv)]
        if epilogue:
            for v in range(nfv):
                call = "polyc_epilogue_vector_masked" if masked and v == last else "polyc_epilogue_vector"
                extra = ", km" if masked and v == last else ""
                body.append(
                    f"if (last_chunk) {acc[j][v]} = {call}(g, {acc[j][v]}, f0 + {v * lanes}, "
                    f"q - g->out + {v * lanes}{extra});"
                )
        stores = " ".join(store(v, "q", acc[j][v]) for v in range(nfv))
        if dtype in (np.float32, np.float64):
            # Streaming stores (see stream_out in polyc_conv_plan) go past the caches: whole,
            # aligned vectors only, the last one when all its lanes are in use.
            streamed = " ".join(f"{pre}_stream_{suffix}(q + {v * lanes}, {acc[j][v]});" for v in range(nfv))
            if masked:
                streamed = (
                    " ".join(f"{pre}_stream_{suffix}(q + {v * lanes}, {acc[j][v]});" for v in range(last))
                    + f" if (tail == {lanes}) {pre}_stream_{suffix}(q + {last * lanes}, {acc[j][last]}); "
                    f"else {store_last.format(ptr=f'q + {last * lanes}', value=acc[j][last])}"
                )
            # Tested here, after the loop: with a flag set before it, the AVX2 kernels of
            # mobilenet_v2's 1x1 layers at batch 8 ran slower.
            stores = (
                f"if (g->stream_out && last_chunk && !beta && ((uintptr_t)q & {lanes * dtype.itemsize - 1}) == 0) "
                f"{{ {streamed} }} "
                f"else {{ {stores} }}"
            )
        body.append(stores)
        lines.append(f"    if (oo[{j}] >= 0) {{ " + " ".join(body) + " }")
    lines.append("}")
    return "\n".join(lines)


def dispatch(block: ChannelBlock, ctype: str, uniform: bool = False) -> str:
    """``polyc_convc_block`` (``_uniform``: of the kernels whose points are evenly spaced): the
    kernel for ``nfv`` vectors (AVX2: without a mask when whole)."""
    arguments = (
        "(pieces, npieces, wp, w_step, ip, roff, out, oo, beta, tail, pf, pf_step, npf, ipf, nipf, g, f0, last_chunk)"
    )
    kind = "_uniform" if uniform else ""
    cases = []
    for nfv in range(1, block.vectors + 1):
        if block.isa == "avx2":
            cases.append(
                f"    case {nfv}: if (tail == {block.lanes}) polyc_convc_kernel_{nfv}_full{kind}{arguments}; "
                f"else polyc_convc_kernel_{nfv}{kind}{arguments}; break;"
            )
        elif nfv == block.half_tail:
            cases.append(
                f"    case {nfv}:\n{HALF_GUARD}\n"
                f"        if (tail <= {block.lanes // 2}) {{ polyc_convc_kernel_{nfv}_half{kind}{arguments}; break; }}\n"
                f"#endif\n        polyc_convc_kernel_{nfv}{kind}{arguments}; break;"
            )
        else:
            cases.append(f"    case {nfv}: polyc_convc_kernel_{nfv}{kind}{arguments}; break;")
    return (
        "/* One block: nfv vectors of channels (the last holding `tail`) x RQ points. */\n"
        f"static inline void polyc_convc_block{kind}(int64_t nfv, {typed(_ARGUMENTS, ctype)})\n"
        "{\n    switch (nfv) {\n" + "\n".join(cases) + "\n    default: break;\n    }\n}"
    )


def instruction_set(
    block: ChannelBlock,
    dtype: np.dtype,
    epilogue: RegisterEpilogue | None = None,
    definition=None,
    point_stride: int | None = None,
) -> list[str]:
    """The macros and kernels of one instruction set; ``epilogue``: the kernel's epilogue in
    vector form (of ``definition``), applied by the vector kernels; ``point_stride``: the
    image's distance between consecutive points when known (``_uniform`` kernels for the tiles
    whose points are that far apart, with more points per block than the general registers
    hold pointers for)."""
    ctype = c_type(dtype)
    assert block.points <= 16  # a tile's points are the bits of a uint16_t (tap_points)
    lines = [
        f"#define POLYC_NR {block.points}",
        f"#define POLYC_LANES {block.lanes}",
        f"#define POLYC_ALL_POINTS {(1 << block.points) - 1}u",
        f"#define POLYC_FBLOCK {block.nf}",
        "#define POLYC_PANELS 0",
        f"#define POLYC_PF_LINES {max(1, block.nf * np.dtype(dtype).itemsize // 64)}",
        "#define POLYC_PREFETCH_LINE(pf, step, r) \\\n"
        "    __builtin_prefetch((pf) + (r) / POLYC_PF_LINES * (step) + (r) % POLYC_PF_LINES * 64, 0, 2)",
    ]
    uniform = point_stride is not None and block.isa != "portable" and block.points > _POINTER_POINTS
    lines.append(f"#define POLYC_POINT_STRIDE {point_stride if uniform else 0}")
    if not uniform:
        lines.append("#define polyc_convc_block_uniform polyc_convc_block")
    if block.isa == "portable":
        return lines + ["#define POLYC_REGISTER_EPILOGUE 0", typed(PORTABLE_KERNEL, ctype)]
    in_registers = epilogue is not None
    lines += [f"#define POLYC_REGISTER_EPILOGUE {int(in_registers)}", "#define POLYC_STREAM_FENCE() _mm_sfence()"]
    if epilogue is not None:
        _, _, _, _, load_full, _, load_last, _ = masked_access(block.isa, dtype, block.lanes, "tail")
        lines += [
            epilogue.function(definition, block.isa, load_full),
            epilogue.function(definition, block.isa, load_last, mask_type(block.isa, block.lanes)),
        ]
    kernels = []
    for stride in [None] + [point_stride] * uniform:
        kernels += [
            vector_kernel(block, dtype, nfv, epilogue=in_registers, point_stride=stride)
            for nfv in range(1, block.vectors + 1)
        ]
        if block.half_tail:
            kernels += [
                HALF_GUARD,
                vector_kernel(block, dtype, block.half_tail, epilogue=in_registers, point_stride=stride, half=True),
                "#endif",
            ]
        if block.isa == "avx2":
            kernels += [
                vector_kernel(block, dtype, nfv, masked=False, epilogue=in_registers, point_stride=stride)
                for nfv in range(1, block.vectors + 1)
            ]
    return lines + kernels + [dispatch(block, ctype)] + [dispatch(block, ctype, uniform=True)] * uniform


PORTABLE_KERNEL = c_template("conv_channels_portable_kernel.c")

#: The work of one item (group, channel block, run of tiles), the weights' packing and the
#: in-place test, in channel mode; the shared loops are conv.py's _RUN.
WORK = c_template("conv_channels_work.c")
