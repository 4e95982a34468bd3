"""The contraction path: a def that is one tensor contraction (a matmul up to index
permutation, plus elementwise epilogues) gets the BLIS-style kernel of
:mod:`polyc.codegen.gemm`: cache blocks (MC, NC, KC) taken by the threads as they go, packed
panels, a register-blocked micro-kernel."""

from __future__ import annotations

import numpy as np

from polyc.codegen.gemm import generate_gemm, micro_kernel_shapes, packing_programs
from polyc.paths.base import Config, KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning, blas_contraction
from polyc.paths.explaining import built_for, built_for_sentence, decisions_of, kib, threads_sentence


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
    decisions = decisions_of(stages)
    lines = [
        f"{stages.contraction.describe()} is a tensor contraction: polyc's BLIS-style gemm kernel computes it "
        "(cache blocks taken by the threads as they go, packed panels, a register-blocked micro-kernel), so the "
        "generic loop nest is not used; its reduction index stays sequential inside each block",
    ]
    if decisions:
        isa = built_for(stages)
        lines.append(built_for_sentence(stages, decisions, isa))
        lines += _blocks(stages, decisions, isa)
        lines.append(
            "packing, in every call (constant operands are not packed ahead of time): B's KC x NC panel into "
            "NR-wide slivers (the threads share it), each thread's MC x KC block of A into MR-tall slivers; a B "
            "sliver already laid out as packed, or used by few rows of A, and an A block few B slivers use or "
            "whose rows run along K, are read in place (decided per call)"
        )
        lines.append(
            threads_sentence(
                stages,
                decisions,
                decisions.get("multiply_adds"),
                "whole products per thread when there are at least two per thread, else blocks of MC rows of each "
                "product (or, for short and wide products, its NR-wide column slivers), taken as threads come free",
            )
        )
    lines.append("blas_contractions=False compiles it as a loop nest instead")
    return lines


def cache_blocks(stages) -> dict | None:
    """The register block and cache blocks (``mr``, ``nr``, ``mc``, ``nc``, ``kc``, ``isa``) the
    build of ``stages``' gemm kernel runs with, as its code generator recorded them (the first
    printed for the instruction set the build runs, or for the first in the source when that is
    unknown); None for a kernel that records none."""
    blocks = decisions_of(stages).get("register_blocks", ())
    if not blocks:
        return None
    isa = built_for(stages)
    return next((b for b in blocks if b["isa"] == isa), blocks[0])


def _blocks(stages, decisions, isa: str | None) -> list[str]:
    """The register and cache blocks of the instruction set the build runs (all, if unknown),
    and where the cache blocks came from."""
    blocks = [b for b in decisions["register_blocks"] if isa is None or b["isa"] == isa] or list(
        decisions["register_blocks"]
    )
    shapes = ", ".join(f"{b['mr']} x {b['nr']}" + ("" if isa else f" ({b['isa']})") for b in blocks)
    lines = [
        f"register block (micro-kernel, MR x NR accumulators in vector registers): {shapes}; "
        f"{decisions['register_block_choice']}"
    ]
    given = decisions["gemm_blocks"]
    requested = stages.requested if stages.requested is not None else stages.options
    if given is None:
        caches = decisions["cache_sizes"]
        source = (
            "from polyc's cache model ("
            + ", ".join(f"L{level} {kib(size)}" for level, size in sorted(caches.items()))
            + ": an MR x KC sliver of A in a quarter of L1, the MC x KC block of A in a quarter of L2 "
            "(three eighths on AVX2), the KC x NC panel of B in half of L3)"
        )
    elif requested is not None and requested.gemm_blocks is None and requested.tile_sizes is None:
        source = f"from a tuning record (gemm_blocks={list(given)}, rounded to multiples of MR and NR)"
    else:
        source = f"from the option gemm_blocks={list(given)} (rounded to multiples of MR and NR)"
    for b in blocks:
        lines.append(
            f"cache blocks of the {b['mr']} x {b['nr']} block: MC={b['mc']} rows, NC={b['nc']} columns, "
            f"KC={b['kc']} steps of the reduction, {source}"
            + ("; KC grows up to 4 KC in a call whose C fits in an eighth of L2" if decisions["kc_grows"] else "")
        )
    return lines


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
