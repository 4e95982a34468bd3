"""The generic path: any def, as the loop nest of its schedule, tiled and marked for the CPU
(:mod:`polyc.schedule.transform`) and printed from isl's AST (:mod:`polyc.codegen.c`)."""

from __future__ import annotations

import itertools

from polyc.codegen.c import generate_c
from polyc.options import Options
from polyc.paths.base import Config, KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning

#: The tile sizes searched per member of the outermost band.
GENERIC_TILES = (16, 32, 64, 128, 256)

#: The register tiles searched (rows x columns; "auto": the model's, "off": none).
REGISTER_TILES = ("auto", "off", "4x16", "6x16", "8x16", "4x32", "8x32", "12x32", "6x8", "12x8")


def recognise(request: PathRequest):
    return True


def generate(request: PathRequest, match) -> PathKernel:
    return PathKernel(generate_c(request.built_program, request.optimized_schedule(), request.options))


def explain(stages) -> list[str]:
    return []  # the loops themselves are explained (polyc.viz.explain)


class LoopNestTuning(Tuning):
    """The tile sizes of the outermost band (or no tiling), the order of its loops (``loop_order``:
    the scheduler's, or a permutation of the largest statement's first three indices), the fusion
    strategy (where there is more than one statement to schedule), the register tile of a
    reduction (:data:`REGISTER_TILES`), the unroll factor and vectorisation."""

    def knobs(self, request: SpaceRequest) -> tuple[tuple[Knob, ...], Config]:
        depth = min(3, len(request.extents))
        knobs = [Knob("t0", (-1, 0, *GENERIC_TILES))] if depth else []
        knobs += [Knob(f"t{i}", GENERIC_TILES) for i in range(1, depth)]
        ordered = depth >= 2 and request.options.loop_order is None  # not where the def's options fix it
        if ordered:
            # "": the scheduler's order; "k,i,j": those indices outermost first (the rest follow).
            orders = itertools.permutations(request.indices[:depth])
            knobs.append(Knob("loop_order", ("", *(",".join(order) for order in orders)), numeric=False))
        # The fusion strategy only groups the scheduled statements: with one (an assignment, or a
        # reduction into the target's existing values) every strategy compiles to the same code,
        # and a search would measure each candidate three times over.
        scheduled = sum(2 if s.has_init_statement else 1 for s in request.definition.statements)
        if scheduled > 1:
            knobs.append(Knob("fusion", ("min", "smart", "max"), numeric=False))
        reduces = any(s.reduction_indices for s in request.definition.statements)
        if reduces and request.options.register_tiles is None:
            knobs.append(Knob("register_tiles", REGISTER_TILES, numeric=False))
        knobs += [Knob("unroll", (1, 2, 4, 8)), Knob("vectorize", (True, False), numeric=False)]
        default: Config = {"unroll": 1, "vectorize": True, **({"fusion": "smart"} if scheduled > 1 else {})}
        if reduces and request.options.register_tiles is None:
            default["register_tiles"] = "auto"
        if depth:
            default.update({"t0": 0, **{f"t{i}": 64 for i in range(1, depth)}})
        if ordered:
            default["loop_order"] = ""
        return tuple(knobs), default

    def option_changes(self, config: Config) -> dict:
        changes: dict[str, object] = {}
        tiles = [int(config[f"t{i}"]) for i in range(3) if f"t{i}" in config]
        if tiles and tiles[0] == -1:
            changes["loop_tiles"] = []
        elif tiles and tiles[0] != 0:
            changes["loop_tiles"] = tiles
        if config.get("loop_order"):
            changes["loop_order"] = str(config["loop_order"]).split(",")
        registers = str(config.get("register_tiles", "auto"))
        if registers == "off":
            changes["register_tiles"] = ()
        elif registers != "auto":
            changes["register_tiles"] = tuple(int(part) for part in registers.split("x"))
        for name in ("fusion", "unroll", "vectorize"):
            if name in config and config[name] != getattr(Options(), name):
                changes[name] = config[name]
        return changes

    def unused(self, config, knobs) -> set[str]:
        if "t0" in config and int(config["t0"]) <= 0:
            return {k.name for k in knobs if k.name[0] == "t" and k.name[1:].isdigit() and k.name != "t0"}
        return set()

    def block_bytes(self, config, itemsize, extents):
        if "t0" not in config or int(config["t0"]) <= 0:
            return None
        block = itemsize
        for i, extent in enumerate(extents[:3]):
            block *= min(int(config[f"t{i}"]), extent)
        return block, block, block


PATH = KernelPath(
    "generic",
    ("c",),
    recognise,
    generate,
    explain,
    tuning=LoopNestTuning(),
    runs_schedule_loops=True,
    sequential_loops=True,
    options=(
        "fusion",
        "loop_tiles",
        "register_tiles",
        "loop_order",
        "parallel",
        "vectorize",
        "unroll",
        "specialize",
        "threads",
    ),
    tile_alias=lambda sizes: {"loop_tiles": sizes},
)
