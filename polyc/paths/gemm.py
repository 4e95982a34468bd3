"""The contraction path: a def that is one tensor contraction (a matmul up to index
permutation, plus elementwise epilogues) gets the BLIS-style kernel of
:mod:`polyc.codegen.gemm`: cache blocks (MC, NC, KC) taken by the threads as they go, packed
panels, a register-blocked micro-kernel."""

from __future__ import annotations

import numpy as np

from polyc.codegen.gemm import generate_gemm, micro_kernel_shapes, packing_programs
from polyc.paths.base import Config, KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning, blas_contraction


def recognise(request: PathRequest):
    contraction = blas_contraction(request)
    return contraction if contraction is not None and not contraction.is_matvec else None


def generate(request: PathRequest, contraction) -> PathKernel:
    program, options = request.built_program, request.options
    return PathKernel(
        generate_gemm(program, contraction, options),
        contraction=contraction,
        packing=packing_programs(program, contraction, options),
    )


def explain(stages) -> list[str]:
    return [
        f"{stages.contraction.describe()} is a tensor contraction: polyc's BLIS-style gemm kernel computes it "
        "(blocks of rows and columns taken by the threads as they go, packed panels, a register-blocked "
        "micro-kernel), so the generic loop nest is not used; its reduction index stays sequential inside "
        "each block",
        "blas_contractions=False compiles it as a loop nest instead",
    ]


class GemmTuning(Tuning):
    """The cache blocks (MC, NC, KC) (``gemm_blocks``, rounded by the kernel to
    its register block; KC 0: polyc's blocks for the sizes) and the register block
    (``micro_kernel``: polyc's choice per call, or one of the instruction set's)."""

    def knobs(self, request: SpaceRequest) -> tuple[tuple[Knob, ...], Config]:
        knobs: tuple[Knob, ...] = (
            Knob("mc", (24, 48, 72, 96, 120, 144, 192, 240, 288, 384)),
            Knob("nc", (128, 256, 512, 1024, 2048, 3072, 4096)),
            Knob("kc", (0, 64, 128, 192, 256, 320, 384, 512)),
        )
        default: Config = {"mc": 96, "nc": 1024, "kc": 0}
        if request.options.micro_kernel is None:
            # 0: polyc's choice for the sizes; n: the n-th of the instruction set's blocks.
            dtype = np.dtype(request.definition.tensor(request.match.target.tensor).dtype)
            blocks = len(micro_kernel_shapes(request.instruction_set(), dtype))
            if blocks > 1:
                knobs += (Knob("micro_kernel", tuple(range(blocks + 1)), numeric=False),)
                default["micro_kernel"] = 0
        return knobs, default

    def option_changes(self, config: Config) -> dict:
        changes: dict[str, object] = {}
        if config["kc"] != 0:
            changes["gemm_blocks"] = [int(config["mc"]), int(config["nc"]), int(config["kc"])]
        if config.get("micro_kernel", 0) != 0:
            changes["micro_kernel"] = int(config["micro_kernel"])
        return changes

    def unused(self, config, knobs) -> set[str]:
        return {"mc", "nc"} if config["kc"] == 0 else set()

    def block_bytes(self, config, itemsize, extents):
        if not config["kc"]:
            return None
        mc, nc, kc = (int(config[n]) for n in ("mc", "nc", "kc"))
        # a micro-panel of B in L1, a block of A in L2, a panel of B in L3
        return 16 * kc * itemsize, mc * kc * itemsize, kc * nc * itemsize


PATH = KernelPath(
    "gemm",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=GemmTuning(),
    options=("blas_contractions", "gemm_blocks", "micro_kernel", "parallel", "threads"),
    tile_alias=lambda sizes: {"gemm_blocks": sizes[:3]} if len(sizes) >= 3 else {},
)
