"""The pointwise-depthwise path: a 1 x 1 convolution whose result only a depthwise convolution
reads (an inverted-residual block's expansion and depthwise layers), in channels-last layouts,
gets the fused kernel of :mod:`polyc.codegen.pointwise_depthwise`, which never stores the
expanded tensor."""

from __future__ import annotations

from polyc.codegen.pointwise_depthwise import generate_pointwise_depthwise
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.depthwise import output_blocks
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence
from polyc.schedule.convolution import recognise_pointwise_depthwise_def


def recognise(request: PathRequest):
    options = request.options
    if options.backend != "c" or not options.direct_convolutions:
        return None
    return request.memo("pointwise_depthwise", lambda: recognise_pointwise_depthwise_def(request.definition))


def generate(request: PathRequest, chain) -> PathKernel:
    return PathKernel(generate_pointwise_depthwise(request.built_program, chain, request.options))


def explain(stages) -> list[str]:
    """What the fused kernel's writer recorded: the temporary it never stores, the ring of its
    rows, the 1 x 1 rows' and the depthwise rows' register blocks, and the work items."""
    decisions = decisions_of(stages)
    if not decisions:
        return [
            "a 1x1 convolution read only by a depthwise one: polyc's fused kernel computes both without storing "
            "the expanded tensor",
            "direct_convolutions=False compiles it as a loop nest instead",
        ]
    temporary, channels = decisions["temporary"], decisions["expanded_channels"]
    ring = decisions["ring_rows"]
    lines = [
        f"{decisions['convolution']}: a 1x1 convolution whose result {temporary} only a channels-last depthwise "
        f"convolution reads; polyc's fused kernel computes both and never stores {temporary}"
        + (f" ({channels} channels)" if channels is not None else ""),
        f"layout: channels-last (the channels innermost in the image, {temporary} and the output); each work item "
        f"computes the rows of {temporary} its next depthwise output row needs, for its block of channels, into a "
        + (
            f"ring buffer of {ring} rows"
            if ring is not None
            else "ring buffer of dilation x (kernel rows - 1) + 1 rows"
        )
        + f" (a row: every pixel of the image row x the block's channels), which stays in the cache; the depthwise "
        f"rows read {temporary} from there",
    ]
    isa = built_for(stages)
    lines.append(built_for_sentence(stages, decisions, isa))
    epilogue = (
        "its epilogues applied to the accumulators"
        if decisions["pointwise_epilogue_in_registers"]
        else "its epilogues (if any) in a pass over each finished row"
    )
    for name, block in decisions["pointwise_blocks"].items():
        if isa is not None and name != isa:
            continue
        if block["lanes"] is None:
            lines.append(
                f"1x1 rows ({name}): one pixel at a time, the channel loops left to the C compiler; {epilogue}"
            )
        else:
            lines.append(
                f"1x1 rows ({name}): register blocks of {block['pixels']} pixels x {block['vectors']} vectors of "
                f"{block['lanes']} channels (each weight vector loaded once per block, each pixel's input channel "
                f"broadcast once); {epilogue}"
            )
    lines += output_blocks(decisions, isa)
    lines.append(
        threads_sentence(
            stages,
            decisions,
            None,
            f"work items of {decisions['work_item']}, taken as threads come free; chosen per call from the thread "
            f"count: whole images while they make {decisions['items_per_thread']} items a thread, else blocks of at "
            f"least {decisions['block_channels']} channels and up to {decisions['max_bands']} bands of rows (a band "
            f"recomputes the rows of {temporary} its first output row shares with the band before)",
        )
    )
    lines.append("direct_convolutions=False compiles it as a loop nest instead")
    return lines


# Its blocks follow the registers; the tuner searches its thread count only.
PATH = KernelPath(
    "pointwise_depthwise",
    ("c",),
    recognise,
    generate,
    explain,
    options=("direct_convolutions", "parallel", "vectorize", "threads"),
)
