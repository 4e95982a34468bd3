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
    if in_registers:
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


PORTABLE_KERNEL = r"""
/* FBLOCK channels x RQ points in portable C (the compiler vectorises the channel loops); the
   contract of the vector kernels, nfv 1 and tail channels. */
static inline void polyc_convc_block(int64_t nfv, const int64_t *restrict pieces, int64_t npieces,
    const T *restrict wp, int64_t w_step,
    const T *const *restrict ip, const int64_t *restrict roff, T *restrict out, const int64_t *restrict oo, int beta,
    int64_t tail, const char *pf, int64_t pf_step, int64_t npf, const char *ipf, int64_t nipf,
    const polyc_conv_t *restrict g, int64_t f0, int last_chunk)
{
    (void)nfv; (void)g; (void)f0; (void)last_chunk;
    T acc[POLYC_NR][POLYC_FBLOCK] __attribute__((aligned(64)));
    for (int64_t j = 0; j < POLYC_NR; j++)
        for (int64_t i = 0; i < POLYC_FBLOCK; i++) acc[j][i] = 0;
    for (int64_t k = 0; k < npieces; k++) {
        const uint64_t mask = (uint64_t)pieces[3 * k + 2];
        const T *restrict wq = wp + pieces[3 * k] * w_step;
        for (int64_t r = pieces[3 * k]; r < pieces[3 * k + 1]; r++, wq += w_step) {
            const int64_t o = roff[r];
            if (r < npf) POLYC_PREFETCH_LINE(pf, pf_step, r);
            if (r < nipf) __builtin_prefetch(ipf + 64 * r, 0, 3);
            for (int64_t j = 0; j < POLYC_NR; j++) {
                if (!(mask >> j & 1)) continue;
                const T b = ip[j][o];
                #pragma omp simd
                for (int64_t i = 0; i < tail; i++) acc[j][i] += wq[i] * b;
            }
        }
    }
    for (int64_t j = 0; j < POLYC_NR; j++) {
        if (oo[j] < 0) continue;
        T *restrict q = out + oo[j];
        for (int64_t i = 0; i < tail; i++) q[i] = beta ? q[i] + acc[j][i] : acc[j][i];
    }
}
"""

#: The work of one item (group, channel block, run of tiles), the weights' packing and the
#: in-place test, in channel mode; the shared loops are conv.py's _RUN.
WORK = r"""
/* The pieces of tile t (n points) for steps r0 <= r < r1 (relative to r0): runs of steps
   with the points whose products they add (bit j: point j); into `pieces` (3 entries each, room
   for one per kernel tap), their number returned.  Without padding, one piece of every point;
   with it, a piece per run of kernel taps that the same points of the tile read inside the box
   (the points that read a tap in the padding add nothing, not even 0 * weight), none for taps
   no point reads there.  The points past the tile's end (copies of its last point, not stored)
   read what the last point reads. */
static int64_t polyc_conv_pieces(const polyc_conv_t *restrict g, int64_t t, int64_t n, int64_t r0, int64_t r1,
                                 int64_t *restrict pieces)
{
    if (g->tap_points == NULL) {
        pieces[0] = 0, pieces[1] = r1 - r0, pieces[2] = POLYC_ALL_POINTS;
        return r1 > r0;
    }
    const uint16_t *restrict points = g->tap_points + t * g->ntaps;
    const uint64_t copies = POLYC_ALL_POINTS & ~(((uint64_t)1 << n) - 1);
    const int64_t nchan = g->nchan;
    int64_t count = 0;
    for (int64_t tap = r0 / nchan; tap < g->ntaps && tap * nchan < r1;) {
        const uint16_t mask = points[tap];
        int64_t end = tap + 1;
        while (end < g->ntaps && end * nchan < r1 && points[end] == mask)
            end++;
        if (mask) {
            pieces[3 * count] = polyc_max(r0, tap * nchan) - r0;
            pieces[3 * count + 1] = polyc_min(r1, end * nchan) - r0;
            pieces[3 * count + 2] = (int64_t)(mask >> (n - 1) & 1 ? mask | copies : mask);
            count++;
        }
        tap = end;
    }
    return count;
}

/* Row 0 of channel block fb's weights for item group b (packed, or in place). */
static const T *polyc_conv_block_weights(const polyc_conv_t *restrict g, int64_t b, int64_t fb)
{
    return g->wpack ? g->wpack + g->wg_b[b] * g->wg_stride + fb * g->nred * POLYC_FBLOCK
                    : g->w + g->w_g[g->wg_b[b]] + g->w_f[fb * POLYC_FBLOCK];
}

/* Work item x: group b, channel blocks fb0 <= fb < fb1 (a chunk of them), tiles t0 <= t < t1
   (a run).  For each chunk of the reduction, every tile of the run is done for every channel
   block of the chunk, so the weights' slice (rchunk rows, the chunk's channels: one stretch of
   each row of W(kh, kw, c, f)) is read from memory once per run and then from L2. */
static void polyc_conv_work(const polyc_conv_t *restrict g, int64_t x, T *restrict panel, int init)
{
    (void)panel;
    const int64_t run = x % g->takes, chunk = x / g->takes % g->fchunks, b = x / g->takes / g->fchunks;
    const int64_t t0 = run * g->take_size, t1 = polyc_min(g->ntiles, t0 + g->take_size);
    const int64_t fb0 = chunk * g->fchunk_size, fb1 = polyc_min(g->nfb, fb0 + g->fchunk_size);
    const T *restrict in = g->in + g->in_b[b];
    const T *ip[POLYC_NR];
    int64_t oo[POLYC_NR];
    int64_t pieces[3 * (g->ntaps + 1)];  /* one per kernel tap at most (a VLA: ntaps is small) */
    /* The item's channels of an output point, and whether they are consecutive (see below). */
    const int64_t f_first = fb0 * POLYC_FBLOCK, f_last = polyc_min(g->nf, fb1 * POLYC_FBLOCK) - 1;
    const int64_t out_bytes = (g->out_f[f_last] - g->out_f[f_first] + 1) * (int64_t)sizeof(T);
    const int out_consecutive = g->out_f[f_last] - g->out_f[f_first] == f_last - f_first;
    int64_t r0 = 0;
    do {  /* at least once: an empty reduction still writes its zeros */
        const int64_t nr = polyc_min(g->rchunk, g->nred - r0);
        /* The weights to come: the next chunk's, or after the last the next item's first
           (taken next by this thread, mostly).  A model's weights come from memory (resnet18's
           512 -> 512 3x3 filters are 9.4 MB), and read only when their chunk starts, each
           chunk's first tile waits on them; so every kernel call prefetches its share of them,
           a line per step, as it computes (a burst of prefetches at each call did nothing). */
        const int64_t ahead_x = r0 + nr < g->nred ? x : x + 1, ahead_r0 = ahead_x == x ? r0 + nr : 0;
        const int64_t ahead_nr = polyc_min(g->rchunk, g->nred - ahead_r0), tiles = t1 - t0;
        const int64_t ahead_b = ahead_x / g->takes / g->fchunks;
        /* A tile whose points each read several lines reads a line of each point in turn, which
           the hardware's prefetchers do not follow: an NHWC 1x1 layer (96 -> 24 channels) whose
           image came from memory ran far below its speed from cache (mobilenet_v2's: python -m
           benchmarks.onnx_segments mobilenet_v2).  So when each step reads the next element (a
           chunk of one tap), more than a line per point, each tile's first kernel call
           prefetches, a line per step, the image of the tile one ahead (two for short chunks,
           whose tiles take less time than memory does) if its points' lines are mostly
           consecutive.  With a line per point the tiles read consecutive lines, and
           prefetching slowed a 16 -> 96 layer (the same command). */
        int64_t rlo = nr > 0 ? g->in_r[r0] : 0, rhi = rlo;  /* the chunk's range of in_r */
        for (int64_t r = r0 + 1; r < r0 + nr; r++)
            rlo = polyc_min(rlo, g->in_r[r]), rhi = polyc_max(rhi, g->in_r[r]);
        const int prefetch_image = nr > 0 && rhi - rlo + 1 == nr && nr * (int64_t)sizeof(T) > 64;
        const int64_t ahead_t = nr >= 64 ? 1 : 2;
        /* An image whose reduction steps read short runs along rows (a 3-channel NCHW image, as an
           image model's first layer reads it: runs of the taps along x, each within a line, one run
           per channel plane and kernel row) reads each tile's few lines from many rows, which the
           hardware's prefetchers do not follow from tile to tile.  So where the chunk has at most
           IMAGE_ROW_RUNS runs and none longer than a line, each tile prefetches the start of every
           run for the first and last point of the tile two ahead.  With its image and output from
           memory, mobilenet_v2's first layer (27 steps: 3 x 3 taps x 3 channels) and
           squeezenet1_1's ran faster so (python -m benchmarks.onnx_segments mobilenet_v2, and
           the same for squeezenet1_1). */
        int64_t row_starts[IMAGE_ROW_RUNS], row_runs = 0, longest_run = 0;
        if (!prefetch_image)
            for (int64_t r = r0, start = r0; r <= r0 + nr && row_runs <= IMAGE_ROW_RUNS; r++) {
                if (r < r0 + nr && r > r0 && g->in_r[r] == g->in_r[r - 1] + 1)
                    continue;
                if (r > r0) {  /* the run start..r-1 ends */
                    longest_run = polyc_max(longest_run, r - start);
                    if (row_runs < IMAGE_ROW_RUNS)
                        row_starts[row_runs] = g->in_r[start];
                    row_runs++;
                }
                start = r;
            }
        const int prefetch_rows = row_runs >= 2 && row_runs <= IMAGE_ROW_RUNS
                                  && longest_run * (int64_t)sizeof(T) <= 64;
        /* A tile's outputs are first written at the end of its first chunk, a burst of stores
           of NR points x the chunk's channels; where their lines come from memory (an early
           layer's output, a large batch's), the burst waits on them.  So with chunks of at least
           OUTPUT_PREFETCH_STEPS steps, whose tiles take far longer than a few prefetches, each
           tile asks, with the intent to write, for the output lines of the tile two ahead,
           which sped up resnet18's first layer (147 steps) at batch 1 and 8 (python -m
           benchmarks.onnx_segments resnet18 --batch 8).  With fewer steps the stores keep up:
           asking slowed a 16 -> 96 1x1 layer, and did not speed a 64 -> 128 one up. */
        const int prefetch_out = r0 == 0 && nr >= OUTPUT_PREFETCH_STEPS && out_consecutive && !g->stream_out;
        const int64_t ahead_fb0 = ahead_x / g->takes % g->fchunks * g->fchunk_size;
        const int64_t ahead_fb1 = polyc_min(g->nfb, ahead_fb0 + g->fchunk_size);
        for (int64_t t = t0; t < t1; t++) {
            const int64_t q0 = t * POLYC_NR, n = polyc_min(POLYC_NR, g->npoints - q0);
            int uniform = POLYC_POINT_STRIDE > 0 && n == POLYC_NR;  /* points POLYC_POINT_STRIDE apart */
            for (int64_t j = 0; j < POLYC_NR; j++) {
                ip[j] = in + g->in_p[q0 + polyc_min(j, n - 1)];
                oo[j] = j < n ? g->out_b[b] + g->out_p[q0 + j] : -1;
                uniform = uniform && ip[j] == ip[0] + j * POLYC_POINT_STRIDE;
            }
            const int64_t npieces = polyc_conv_pieces(g, t, n, r0, r0 + nr, pieces);
            if (prefetch_out && t + 2 < t1) {
                const int64_t qa = (t + 2) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                for (int64_t j = 0; j < na; j++) {
                    if (g->out_p[qa + j] < 0)
                        continue;
                    const char *o = (const char *)(g->out + g->out_f[f_first] + g->out_b[b] + g->out_p[qa + j]);
                    for (int64_t byte = 0; byte < out_bytes; byte += 64)
                        __builtin_prefetch(o + byte, 1, 3);
                }
            }
            if (prefetch_rows && t + 2 < t1) {
                const int64_t qa = (t + 2) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                const T *first = in + g->in_p[qa], *last = in + g->in_p[qa + na - 1];
                for (int64_t run = 0; run < row_runs; run++) {
                    __builtin_prefetch(first + row_starts[run], 0, 3);
                    __builtin_prefetch(last + row_starts[run], 0, 3);
                }
            }
            const char *ipf = NULL;
            int64_t nipf = 0;
            if (prefetch_image && t + ahead_t < t1) {
                const int64_t qa = (t + ahead_t) * POLYC_NR, na = polyc_min(POLYC_NR, g->npoints - qa);
                int64_t plo = g->in_p[qa], phi = g->in_p[qa];
                for (int64_t j = 1; j < na; j++)
                    plo = polyc_min(plo, g->in_p[qa + j]), phi = polyc_max(phi, g->in_p[qa + j]);
                const int64_t span = phi - plo + nr;  /* elements from the first point's to the last's end */
                if (span <= 2 * na * nr) {
                    ipf = (const char *)(in + plo + rlo);
                    nipf = polyc_min(nr, (span * (int64_t)sizeof(T) + 63) / 64);
                }
            }
            for (int64_t fb = fb0; fb < fb1; fb++) {
                const int64_t f0 = fb * POLYC_FBLOCK, nfc = polyc_min(POLYC_FBLOCK, g->nf - f0);
                const int64_t nfv = (nfc + POLYC_LANES - 1) / POLYC_LANES, tail = nfc - (nfv - 1) * POLYC_LANES;
                const T *restrict wp = polyc_conv_block_weights(g, b, fb);
                /* This call's share: the rows of the same block to come, split over the tiles. */
                const int64_t ahead_fb = ahead_fb0 + fb - fb0;
                const char *pf = NULL;
                int64_t npf = 0;
                if (ahead_x < g->nwork && ahead_fb < ahead_fb1) {
                    const int64_t row0 = ahead_nr * (t - t0) / tiles, row1 = ahead_nr * (t - t0 + 1) / tiles;
                    pf = (const char *)(polyc_conv_block_weights(g, ahead_b, ahead_fb) + (ahead_r0 + row0) * g->w_step);
                    npf = (row1 - row0) * POLYC_PF_LINES;
                }
                (uniform ? polyc_convc_block_uniform : polyc_convc_block)(
                    nfv, pieces, npieces, wp + r0 * g->w_step, g->w_step, ip, g->in_r + r0, g->out + g->out_f[f0],
                    oo, !init || r0 > 0, tail, pf, g->w_step * (int64_t)sizeof(T), npf, ipf, fb == fb0 ? nipf : 0,
                    g, f0, r0 + nr >= g->nred);
            }
        }
        r0 += g->rchunk;
    } while (r0 < g->nred);
    if (POLYC_HAS_EPILOGUE && !POLYC_REGISTER_EPILOGUE)
        for (int64_t t = t0; t < t1; t++)
            for (int64_t fb = fb0; fb < fb1; fb++)
                polyc_epilogue(g, b, fb * POLYC_FBLOCK, polyc_min(POLYC_FBLOCK, g->nf - fb * POLYC_FBLOCK),
                               t * POLYC_NR, polyc_min(g->npoints, (t + 1) * POLYC_NR));
}

/* Packs channel block x (over all groups: [group][channel block]) into g->wpack as [r][FBLOCK],
   zero columns past the last channel. */
static void polyc_conv_pack(const polyc_conv_t *restrict g, const T *restrict w, const int64_t *restrict w_g,
                            const int64_t *restrict w_f, const int64_t *restrict w_r, int64_t x)
{
    const int64_t nred = g->nred, wg = x / g->nfb, f0 = x % g->nfb * POLYC_FBLOCK;
    const int64_t nfc = polyc_min(POLYC_FBLOCK, g->nf - f0);
    T *restrict dst = (T *)g->wpack + x * nred * POLYC_FBLOCK;
    for (int64_t r = 0; r < nred; r++)
        for (int64_t i = 0; i < POLYC_FBLOCK; i++)
            dst[r * POLYC_FBLOCK + i] = i < nfc ? w[w_g[wg] + w_f[f0 + i] + w_r[r]] : (T)0;
}

/* The busiest thread's share of the work when the items of a split (chunks of `size` channel
   blocks x `runs` runs of tiles) are taken in order by whichever thread is free first, as the
   dynamic schedule hands them out; in channel vectors x tiles (a chunk with the last, partial
   block has fewer vectors). */
static double polyc_conv_busiest(const polyc_conv_t *restrict g, int64_t size, int64_t runs, int nthr)
{
    const int64_t chunks = (g->nfb + size - 1) / size, take = (g->ntiles + runs - 1) / runs;
    if (g->nitems * chunks * ((g->ntiles + take - 1) / take) > 16 * (int64_t)nthr) {
        /* Many items (a grouped convolution's groups): the busiest share is an even share
           within one item, and the plan, made on every call, need not hand them out. */
        double total = 0, largest = 0;
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t channels = polyc_min(g->nf, (c + 1) * size * POLYC_FBLOCK) - c * size * POLYC_FBLOCK;
            const double vectors = (double)((channels + POLYC_LANES - 1) / POLYC_LANES);
            total += vectors * (double)g->ntiles;
            largest = vectors * (double)take > largest ? vectors * (double)take : largest;
        }
        return total * (double)g->nitems / nthr + largest;
    }
    double load[nthr];
    for (int i = 0; i < nthr; i++)
        load[i] = 0;
    for (int64_t b = 0; b < g->nitems; b++)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t channels = polyc_min(g->nf, (c + 1) * size * POLYC_FBLOCK) - c * size * POLYC_FBLOCK;
            const int64_t vectors = (channels + POLYC_LANES - 1) / POLYC_LANES;
            for (int64_t t0 = 0; t0 < g->ntiles; t0 += take) {
                int free = 0;
                for (int i = 1; i < nthr; i++)
                    free = load[i] < load[free] ? i : free;
                load[free] += (double)vectors * (double)(polyc_min(g->ntiles, t0 + take) - t0);
            }
        }
    double most = 0;
    for (int i = 0; i < nthr; i++)
        most = load[i] > most ? load[i] : most;
    return most;
}

/* Weights whose channels are consecutive within each block and whose reduction rows are evenly
   spaced are read in place (w_step: the rows' spacing); else packed (w_step FBLOCK).  Also
   chooses the work items: chunks of channel blocks x runs of tiles.  A split costs the longer
   of its busiest thread's arithmetic and its memory traffic (each run reads all the weights of
   its chunk, unless they fit in L2, where a thread's runs share them; each chunk reads the
   image once more) at `flops_per_byte`, the machine's balance, roughly.  When the weights come
   from memory (a model's weights do not stay in L3), a run per item on 2 threads of a 512 -> 64
   3x3 convolution at 7 x 7 read them 8 times; split by traffic alone, mobilenet_v2's 960 -> 160
   1x1 layer at 7 x 7 took chunks of 128 and 32 channels, one per thread, and gained little from
   the second thread (python -m benchmarks.onnx_segments mobilenet_v2).  Of the splits with at
   least one item per thread, one within 2% of the least cost and 5% of the least traffic among
   those, with the most items (up to 4 per thread, as threads come free unevenly).  Then the
   reduction chunk.  Returns whether the weights are in place. */
static int polyc_conv_plan(polyc_conv_t *restrict g, int nthr)
{
    const int64_t row = g->nred > 1 ? g->w_r[1] - g->w_r[0] : 0;
    int in_place = g->nred > 0 && g->w_r[0] == 0;
    for (int64_t r = 0; in_place && r < g->nred; r++)
        in_place = g->w_r[r] == r * row;
    for (int64_t f = 0; in_place && f < g->nf; f++)  /* each block's channels consecutive */
        in_place = g->w_f[f] == g->w_f[f - f % POLYC_FBLOCK] + f % POLYC_FBLOCK;
    g->w_step = in_place ? row : POLYC_FBLOCK;
    const double weights = (double)g->nred * (double)g->nf, image = (double)g->image_elements;
    /* FLOPs of a channel vector x tile: RQ points, nred steps, an FMA of LANES lanes each. */
    const double flops = 2.0 * POLYC_NR * POLYC_LANES * (double)polyc_max(1, g->nred);
    const double flops_per_byte = FLOPS_PER_BYTE;
    const int64_t wanted = 4 * (int64_t)nthr;
    int64_t best_chunks = 1, best_runs = 1, best_items = 0;
    double least_cost = -1, least_traffic = -1;
    /* Three passes over the splits: the least cost; the least traffic among those within 2% of
       it (the cost is a rough estimate); the most items near both. */
    for (int pass = 0; pass < 3; pass++) {
        for (int64_t chunks = 1; chunks <= g->nfb; chunks++) {
            const int64_t size = (g->nfb + chunks - 1) / chunks;
            if (chunks > 1 && (g->nfb + size - 1) / size != chunks)
                continue;  /* the same chunks as a smaller count */
            const int64_t per = g->nitems * chunks;
            for (int64_t items = nthr, last_runs = 0; items <= wanted; items += nthr) {
                const int64_t runs = polyc_max(1, polyc_min(g->ntiles, (items + per - 1) / per));
                if (runs == last_runs)
                    continue;  /* the same split as the count before */
                last_runs = runs;
                /* A chunk's weights that fit in L2 stay there between a thread's runs. */
                const int fits = (double)size * POLYC_FBLOCK * (double)g->nred * sizeof(T) <= 2.0 * WEIGHT_SLICE;
                const double reads = fits ? (double)polyc_min(runs, nthr) : (double)runs;
                const double traffic = (reads * weights + (double)chunks * image) * sizeof(T);
                const double busiest = nthr > 1 ? polyc_conv_busiest(g, size, runs, nthr) * flops : 0;
                const double cost = busiest > flops_per_byte * traffic ? busiest : flops_per_byte * traffic;
                const int64_t count = polyc_min(per * runs, wanted);
                if (pass == 0) {
                    if (least_cost < 0 || cost < least_cost)
                        least_cost = cost;
                } else if (cost <= 1.02 * least_cost) {
                    if (pass == 1 && (least_traffic < 0 || traffic < least_traffic))
                        least_traffic = traffic;
                    if (pass == 2 && traffic <= 1.05 * least_traffic && count > best_items) {
                        best_chunks = chunks;
                        best_runs = runs;
                        best_items = count;
                    }
                }
            }
        }
    }
    int64_t take = CHUNK_BLOCKS;
    if (take <= 0)
        take = (g->ntiles + best_runs - 1) / best_runs;
    g->take_size = polyc_max(1, take);
    g->takes = (g->ntiles + g->take_size - 1) / g->take_size;
    g->fchunk_size = (g->nfb + best_chunks - 1) / best_chunks;
    g->fchunks = (g->nfb + g->fchunk_size - 1) / g->fchunk_size;
    g->rchunk = polyc_max(1, WEIGHT_SLICE / ((int64_t)sizeof(T) * POLYC_FBLOCK * g->fchunk_size));
    g->nwork = g->nitems * g->fchunks * g->takes;
    /* An output larger than the last-level cache is written with streaming stores, which go to
       memory without reading its lines first (a third of the traffic of a layer that expands few
       channels into many: mobilenet_v2's 16 -> 96 layer at 112 x 112 writes 38.5 MB at batch 8),
       when its tiles are stored once: the reduction in one chunk, the epilogue in registers. */
    g->stream_out = (!POLYC_HAS_EPILOGUE || POLYC_REGISTER_EPILOGUE) && g->rchunk >= g->nred
        && (double)g->nitems * (double)g->nout * (double)g->nf * sizeof(T) > (double)STREAM_BYTES;
    return in_place;
}
"""
