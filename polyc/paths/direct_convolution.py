"""The direct convolution path: a def that is one convolution (plus elementwise epilogues)
gets the kernel of :mod:`polyc.codegen.conv`: weights packed in blocks of output channels, work
items of (batch, tile, channel block) taken by the threads as they go.  The Winograd and
depthwise paths, tried before it, take the convolutions of their forms."""

from __future__ import annotations

from dataclasses import replace

from polyc.codegen.conv import generate_direct_conv
from polyc.codegen.winograd import winograd_refusal
from polyc.paths.base import Config, KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning, direct_convolution
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, threads_sentence


def generate(request: PathRequest, convolution) -> PathKernel:
    kernel = generate_direct_conv(request.built_program, convolution, request.options)
    # Why the Winograd path, tried first, left it here: the reason its recogniser applied.
    refusal = winograd_refusal(convolution, request.sizes, request.options)
    kernel = replace(kernel, decisions={**kernel.decisions, "not_winograd": refusal})
    return PathKernel(kernel, convolution=convolution)


def explain(stages) -> list[str]:
    decisions = decisions_of(stages)
    if not decisions:
        return ["a convolution: polyc's direct convolution kernel computes it"]
    items, points = decisions["items"], decisions["points"]
    if decisions["vectorised"] == "output channels":
        layout = "output channels innermost (channels-last, NHWC): vectorised along the output channels"
    else:
        layout = "output channels not innermost (as in NCHW): vectorised along the output points" + (
            ", rows flattened with the image's row pitch" if decisions["flat_rows"] else ""
        )
    lines = [
        f"{decisions['convolution']}: polyc's direct convolution kernel computes it (no im2col copy of the image)",
        f"layout: {layout}; work items of ({', '.join(items) or 'one item'}; a tile of points over "
        f"({', '.join(points)}); a chunk of output-channel blocks), summed over ({', '.join(decisions['reduction'])})",
        "why direct, not Winograd: " + (decisions.get("not_winograd") or "the Winograd kernel does not take it"),
    ]
    isa = built_for(stages)
    lines.append(built_for_sentence(stages, decisions, isa))
    for name, block in decisions["register_blocks"].items():
        if isa is None or name == isa:
            lines.append(
                f"register block ({name}): {block['channels']} output channels x {block['points']} points "
                f"({block['vectors']} vectors of {block['lanes']})"
            )
    blocked = "points" if decisions["vectorised"] == "output channels" else "output channels"
    chunk = (
        f"{decisions['chunk_blocks']} register blocks of {blocked} per work item (conv_block={decisions['conv_block']})"
        if decisions["chunk_blocks"]
        else "every output-channel block in one work item, unless there are fewer than four work items a thread "
        "(decided per call)"
    )
    lines.append(threads_sentence(stages, decisions, None, f"work items taken as threads come free; {chunk}"))
    lines.append("direct_convolutions=False compiles it as a loop nest instead")
    return lines


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
