"""The direct convolution path: a def that is one convolution (plus elementwise epilogues)
gets the kernel of :mod:`polyc.codegen.conv`: weights packed in blocks of output channels, work
items of (batch, tile, channel block) taken by the threads as they go.  The Winograd and
depthwise paths, tried before it, take the convolutions of their forms."""

from __future__ import annotations

from polyc.codegen.conv import generate_direct_conv
from polyc.paths.base import Config, KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning, direct_convolution


def generate(request: PathRequest, convolution) -> PathKernel:
    return PathKernel(
        generate_direct_conv(request.built_program, convolution, request.options), convolution=convolution
    )


def explain(stages) -> list[str]:
    return [
        "a convolution: polyc's direct convolution kernel computes it (weights packed in blocks of output "
        "channels, work items of (batch, tile, channel block) taken by the threads as they go)",
        "direct_convolutions=False compiles it as a loop nest instead",
    ]


class ConvolutionTuning(Tuning):
    """The output channels per work item (``conv_block``; 0: polyc's choice), and,
    with ``winograd_knob``, whether the Winograd kernel or the direct one computes the
    convolution: which is faster depends on the machine's caches and vectors."""

    def __init__(self, winograd_knob: bool = False):
        self.winograd_knob = winograd_knob

    def knobs(self, request: SpaceRequest) -> tuple[tuple[Knob, ...], Config]:
        knobs: tuple[Knob, ...] = (Knob("channels", (0, 8, 16, 24, 32, 48, 64, 96, 128)),)
        default: Config = {"channels": 0}
        if self.winograd_knob:
            knobs += (Knob("winograd", (True, False), numeric=False),)
            default["winograd"] = True
        return knobs, default

    def option_changes(self, config: Config) -> dict:
        changes: dict[str, object] = {}
        if config.get("winograd", True) is False:
            changes["winograd"] = False
        if config["channels"] != 0 and not config.get("winograd", False):
            changes["conv_block"] = int(config["channels"])
        return changes

    def unused(self, config, knobs) -> set[str]:
        return {"channels"} if config.get("winograd", False) else set()

    def block_bytes(self, config, itemsize, extents):
        if not config["channels"] or config.get("winograd", False):
            return None
        block = int(config["channels"]) * itemsize * 64
        return block, block, block


PATH = KernelPath(
    "direct_convolution",
    ("c",),
    direct_convolution,
    generate,
    explain,
    tuning=ConvolutionTuning(),
    options=("direct_convolutions", "conv_block", "parallel", "vectorize", "threads"),
    tile_alias=lambda sizes: {"conv_block": sizes[0]} if sizes else {},
)
