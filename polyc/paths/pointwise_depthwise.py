"""The pointwise-depthwise path: a 1 x 1 convolution whose result only a depthwise convolution
reads (an inverted-residual block's expansion and depthwise layers), in channels-last layouts,
gets the fused kernel of :mod:`polyc.codegen.pointwise_depthwise`, which never stores the
expanded tensor."""

from __future__ import annotations

from polyc.codegen.pointwise_depthwise import generate_pointwise_depthwise
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.schedule.convolution import recognise_pointwise_depthwise_def


def recognise(request: PathRequest):
    options = request.options
    if options.backend != "c" or not options.direct_convolutions:
        return None
    return request.memo("pointwise_depthwise", lambda: recognise_pointwise_depthwise_def(request.definition))


def generate(request: PathRequest, chain) -> PathKernel:
    return PathKernel(generate_pointwise_depthwise(request.built_program, chain, request.options))


def explain(stages) -> list[str]:
    return [
        "a 1x1 convolution read only by a depthwise one: polyc's fused kernel computes both (each thread "
        "computes the rows of the 1x1 result that the next depthwise output row needs, for its block of "
        "channels, into a ring buffer that stays in the cache; the expanded tensor is never stored)",
        "direct_convolutions=False compiles it as a loop nest instead",
    ]


# Its blocks follow the registers; the tuner searches its thread count only.
PATH = KernelPath(
    "pointwise_depthwise",
    ("c",),
    recognise,
    generate,
    explain,
    options=("direct_convolutions", "parallel", "vectorize", "threads"),
)
