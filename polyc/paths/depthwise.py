"""The depthwise path: a channels-last depthwise convolution (one filter per channel) gets the
kernel of :mod:`polyc.codegen.depthwise`, vectorised along the channels."""

from __future__ import annotations

from polyc.codegen.depthwise import generate_depthwise
from polyc.paths.base import KernelPath, PathKernel, PathRequest, direct_convolution
from polyc.paths.direct_convolution import ConvolutionTuning
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence
from polyc.schedule.convolution import depthwise_channels_last


def recognise(request: PathRequest):
    convolution = direct_convolution(request)
    return convolution if convolution is not None and depthwise_channels_last(convolution) else None


def generate(request: PathRequest, convolution) -> PathKernel:
    return PathKernel(generate_depthwise(request.built_program, convolution, request.options), convolution=convolution)


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    lines = [
        "a channels-last depthwise convolution: polyc's depthwise kernel computes it, vectorised along the "
        "channels (one filter per channel)",
    ]
    if decisions:
        isa = built_for(stages)
        lines.append(built_for_sentence(stages, decisions, isa))
        lines += output_blocks(decisions, isa)
        lines.append(
            threads_sentence(
                stages, decisions, None, f"work items of {decisions['work_item']}, shared among the threads"
            )
        )
    lines.append("direct_convolutions=False compiles it as a loop nest instead")
    return lines


def output_blocks(decisions, isa: str | None) -> list[str]:
    """The depthwise rows' blocks of outputs for the instruction set ``isa`` (all, if unknown),
    as the depthwise writer recorded them."""
    kh, kw = decisions["taps"]
    taps = f"{kh} x {kw}" if kh is not None and kw is not None else "a window known only at run time"
    lines = []
    for name, block in decisions["register_blocks"].items():
        if isa is not None and name != isa:
            continue
        outputs = " then ".join(map(str, block["row_blocks"]))
        lines.append(
            f"block of outputs ({name}): vectors of {block['lanes']} channels; a row's interior outputs in "
            f"blocks of {outputs} along the row, sharing their image vectors; the outputs near the edges one at "
            f"a time; {taps} taps"
            + (
                ", every tap's weights held in registers for the whole row"
                if block.get("weights_in_registers")
                else ", a kernel row's weights loaded once per block"
            )
        )
    return lines


PATH = KernelPath(
    "depthwise",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=ConvolutionTuning(),
    options=("direct_convolutions", "parallel", "vectorize", "threads"),
)
