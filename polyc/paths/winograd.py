"""The Winograd path: a channels-last 3 x 3 stride-1 float32 convolution of the form and sizes
where it pays (:func:`polyc.codegen.winograd.winograd_form`) gets the F(2x2, 3x3) kernel of
:mod:`polyc.codegen.winograd`, with the option ``winograd`` on."""

from __future__ import annotations

from polyc.codegen.winograd import generate_winograd, winograd_form
from polyc.paths.base import KernelPath, PathKernel, PathRequest, direct_convolution
from polyc.paths.direct_convolution import ConvolutionTuning
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence


def recognise(request: PathRequest):
    convolution = direct_convolution(request)
    if convolution is None or not winograd_form(convolution, request.sizes, request.options):
        return None
    return convolution


def generate(request: PathRequest, convolution) -> PathKernel:
    return PathKernel(generate_winograd(request.built_program, convolution, request.options), convolution=convolution)


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    if not decisions:
        return ["polyc's Winograd F(2x2, 3x3) kernel computes it"]
    tiles, channels, features = decisions["tiles"], decisions["channels"], decisions["features"]
    lines = [
        f"{decisions['convolution']}: polyc's Winograd {decisions['transform']} kernel computes it: {tiles} tiles of "
        "2 x 2 outputs, each from a 4 x 4 tile of the image transformed (B^T d B); the 3 x 3 weights transformed "
        f"into 16 matrices of {channels} x {features} in every call (G g G^T); 16 matrix products over the "
        f"{channels} input channels; each product's 4 x 4 result transformed back into 2 x 2 outputs (A^T m A)",
        f"why Winograd: a float32 3 x 3 convolution of stride and dilation 1, channels-last, {channels} input and "
        f"{features} output channels (multiples of 16, at most 256) and {tiles} tiles (at least 32), where it does "
        "about half the direct kernel's multiply-adds and pays for its transforms",
    ]
    isa = built_for(stages)
    lines.append(built_for_sentence(stages, decisions, isa))
    for name, block in decisions["register_blocks"].items():
        if isa is None or name == isa:
            lines.append(
                f"register block ({name}): {block['tiles']} tiles x {block['vectors']} vectors of {block['lanes']} "
                f"output channels ({block['channels']} channels per block)"
            )
    half, whole = decisions["tiles_per_chunk"]
    chunk = (
        f"as few chunks as give each thread a work item, at most {whole} tiles (their transformed image in L2: "
        "the transformed weights do not fit half of L2)"
        if decisions["large_weights"]
        else f"chunks of at most {half} tiles (their transformed image in half of L2), at least four work items a thread"
    )
    lines.append(
        threads_sentence(
            stages,
            decisions,
            None,
            f"work items of (chunk of tiles, block of output channels) taken as threads come free; {chunk}",
        )
    )
    lines.append(
        "winograd=False keeps the direct convolution kernel; direct_convolutions=False compiles it as a loop nest"
    )
    return lines


PATH = KernelPath(
    "winograd",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=ConvolutionTuning(winograd_knob=True),
    options=("direct_convolutions", "winograd", "parallel", "vectorize", "threads"),
)
