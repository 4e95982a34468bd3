"""The Winograd path: a channels-last 3 x 3 stride-1 float32 convolution of the form and sizes
where it pays (:func:`polyc.codegen.winograd.winograd_form`) gets the F(2x2, 3x3) kernel of
:mod:`polyc.codegen.winograd`, with the option ``winograd`` on."""

from __future__ import annotations

from polyc.codegen.winograd import generate_winograd, winograd_form
from polyc.paths.base import KernelPath, PathKernel, PathRequest, direct_convolution
from polyc.paths.direct_convolution import ConvolutionTuning


def recognise(request: PathRequest):
    convolution = direct_convolution(request)
    if convolution is None or not winograd_form(convolution, request.sizes, request.options):
        return None
    return convolution


def generate(request: PathRequest, convolution) -> PathKernel:
    return PathKernel(generate_winograd(request.built_program, convolution, request.options), convolution=convolution)


def explain(stages) -> list[str]:
    return [
        "a 3x3 stride-1 convolution: polyc's Winograd F(2x2, 3x3) kernel computes it (tiles of 2x2 outputs, "
        "16 matrix products over the input channels; work items of (chunk of tiles, block of output "
        "channels) shared among the threads)",
        "winograd=False keeps the direct convolution kernel; direct_convolutions=False compiles it as a loop nest",
    ]


PATH = KernelPath(
    "winograd",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=ConvolutionTuning(winograd_knob=True),
    options=("direct_convolutions", "winograd", "parallel", "vectorize", "threads"),
)
