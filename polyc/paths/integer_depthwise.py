"""The integer depthwise path: a def that is a depthwise convolution of an 8-bit image summed in
int32 and requantized into 8 bits (QLinearConv with one filter per channel, the form of
:mod:`polyc.schedule.integer_depthwise`) gets the kernel of
:mod:`polyc.codegen.integer_depthwise`: planes shared among the threads, each copied once,
shifted and dealt into stride phases, its rows vectorised with their sums in registers.
``direct_convolutions=False`` sends the def to the generic loop nest instead."""

from __future__ import annotations

from polyc.codegen.integer_depthwise import generate_integer_depthwise
from polyc.paths.base import KernelPath, PathKernel, PathRequest
from polyc.paths.explaining import decisions_of, threads_sentence
from polyc.schedule.integer_depthwise import IntegerDepthwise, recognise_integer_depthwise_def


def recognise(request: PathRequest) -> IntegerDepthwise | None:
    options = request.options
    if options.backend != "c" or not options.direct_convolutions:
        return None
    return request.memo("integer_depthwise", lambda: recognise_integer_depthwise_def(request.definition))


def generate(request: PathRequest, depthwise: IntegerDepthwise) -> PathKernel:
    return PathKernel(generate_integer_depthwise(request.built_program, depthwise, request.options))


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    lines = [
        f"{decisions.get('depthwise', stages.program.definition.name)}: an integer depthwise convolution and its "
        "requantization; polyc's integer depthwise kernel computes it exactly (int32 sums, then onnxruntime's "
        "rounding and saturation)",
    ]
    if decisions:
        lines.append(
            f"each (image, channel) plane is copied once, shifted by the image's zero point and dealt into "
            f"{decisions['strides'][1]} column phase(s); each output row in blocks of {decisions['block']} outputs "
            "whose sums stay in vector registers through every tap, requantized and stored once"
        )
        lines.append(threads_sentence(stages, decisions, None, "planes shared among the threads"))
    lines.append("direct_convolutions=False compiles it as a loop nest instead")
    return lines


PATH = KernelPath(
    "integer_depthwise",
    ("c",),
    recognise,
    generate,
    explain,
    options=("direct_convolutions", "parallel", "threads"),
)
