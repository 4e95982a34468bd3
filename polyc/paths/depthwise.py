"""The depthwise path: a channels-last depthwise convolution (one filter per channel) gets the
kernel of :mod:`polyc.codegen.depthwise`, vectorised along the channels."""

from __future__ import annotations

from polyc.codegen.depthwise import generate_depthwise
from polyc.paths.base import KernelPath, PathKernel, PathRequest, direct_convolution
from polyc.paths.direct_convolution import ConvolutionTuning
from polyc.schedule.convolution import depthwise_channels_last


def recognise(request: PathRequest):
    convolution = direct_convolution(request)
    return convolution if convolution is not None and depthwise_channels_last(convolution) else None


def generate(request: PathRequest, convolution) -> PathKernel:
    return PathKernel(generate_depthwise(request.built_program, convolution, request.options), convolution=convolution)


def explain(stages) -> list[str]:
    return [
        "a channels-last depthwise convolution: polyc's depthwise kernel computes it (one output row of one "
        "vector of channels a work item, each tap's weights loaded once per row, blocks of outputs along "
        "the row sharing their image vectors)",
        "direct_convolutions=False compiles it as a loop nest instead",
    ]


PATH = KernelPath(
    "depthwise",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=ConvolutionTuning(),
    options=("direct_convolutions", "parallel", "vectorize", "threads"),
)
