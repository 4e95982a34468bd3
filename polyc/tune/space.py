"""What the tuner may change for one kernel, and the features its cost model sees.

The space depends on the path polyc compiles the def through (:func:`polyc.driver.compile_stages`):

- a contraction compiled as a BLIS-style gemm kernel: the cache blocks ``(MC, NC, KC)``
  (``tile_sizes`` of three entries, rounded by the kernel to its register block) and the
  register block (``micro_kernel``: polyc's choice per call, or one of the instruction set's);
- a matrix-vector product: nothing but the thread count;
- a direct convolution: the output channels per work item (the first entry of ``tile_sizes``),
  and, where the Winograd kernel would compute it (the option ``winograd`` on, as in ONNX
  sessions, and a 3 x 3 convolution of its form), whether to use it;
- anything else (the generic polyhedral path, segments included): the tile sizes of the
  outermost band (or no tiling), the order of its loops (``loop_order``: the scheduler's, or a
  permutation of the largest statement's first three indices), the fusion strategy (where there
  is more than one statement to schedule), the unroll factor and vectorisation.

Every path also searches the thread count (the ``threads`` option): all the cores, or half,
a quarter, ... down to one.  A kernel of a few microseconds can lose more to waking a second
thread and waiting for it than it gains, and a memory-bound one may saturate the memory with
fewer threads than cores.  Not where the user fixed ``threads`` or turned ``parallel`` off.

A configuration is a dict knob -> value; :meth:`SearchSpace.options` turns it into the
``polyc.define`` options it stands for, and :meth:`SearchSpace.features` into numbers for the
cost model (the knobs, and footprints of the blocks they imply relative to the caches).
"""
from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from polyc.lang.checked import CheckedDef
from polyc.options import Options
from polyc.tune.machine import MachineFingerprint, this_machine

Config = dict[str, object]


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple
    numeric: bool = True        # features use log2(value) (each non-positive value: its own flag)


@dataclass(frozen=True)
class SearchSpace:
    path: str                   # "gemm", "gemv", "convolution", "pointwise_depthwise" or "generic"
    knobs: tuple[Knob, ...]
    default: Config             # polyc's own choice, always measured first
    itemsize: int
    extents: tuple[int, ...]    # the largest statement's loop extents, outermost first
    caches: tuple[int, int, int]

    @property
    def size(self) -> int:
        return math.prod(len(k.choices) for k in self.knobs)

    def options(self, config: Mapping[str, object]) -> dict:
        """The option changes ``config`` stands for (only those that differ from the defaults)."""
        changes: dict[str, object] = {}
        if self.path == "gemm":
            if config["kc"] != 0:
                changes["tile_sizes"] = [int(config["mc"]), int(config["nc"]), int(config["kc"])]
            if config.get("micro_kernel", 0) != 0:
                changes["micro_kernel"] = int(config["micro_kernel"])
        elif self.path == "convolution":
            if config.get("winograd", True) is False:
                changes["winograd"] = False
            if config["channels"] != 0 and not config.get("winograd", False):
                changes["tile_sizes"] = [int(config["channels"])]
        else:
            tiles = [int(config[f"t{i}"]) for i in range(len(self.extents[:3])) if f"t{i}" in config]
            if tiles and tiles[0] == -1:
                changes["tile_sizes"] = []
            elif tiles and tiles[0] != 0:
                changes["tile_sizes"] = tiles
            if config.get("loop_order"):
                changes["loop_order"] = str(config["loop_order"]).split(",")
            for name in ("fusion", "unroll", "vectorize"):
                if name in config and config[name] != getattr(Options(), name):
                    changes[name] = config[name]
        if config.get("threads", 0) != 0:
            changes["threads"] = int(config["threads"])
        return changes

    def configs(self):
        """Every configuration of the space (:attr:`size` of them)."""
        for values in itertools.product(*(k.choices for k in self.knobs)):
            yield {k.name: v for k, v in zip(self.knobs, values)}

    def random_config(self, rng: random.Random) -> Config:
        return {k.name: rng.choice(k.choices) for k in self.knobs}

    def neighbour(self, config: Mapping[str, object], rng: random.Random) -> Config:
        """``config`` with one knob moved to an adjacent choice (or, rarely, any choice)."""
        knob = rng.choice(self.knobs)
        new = dict(config)
        index = knob.choices.index(config[knob.name])
        if rng.random() < 0.8 and len(knob.choices) > 1:
            index = min(len(knob.choices) - 1, max(0, index + rng.choice((-1, 1))))
        else:
            index = rng.randrange(len(knob.choices))
        new[knob.name] = knob.choices[index]
        return new

    def identity(self, config: Mapping[str, object]) -> str:
        """Configurations that compile to the same options are the same candidate."""
        import json
        return json.dumps(self.options(config), sort_keys=True)

    def features(self, config: Mapping[str, object]) -> list[float]:
        values: list[float] = []
        unused = self._unused(config)
        for knob in self.knobs:
            value = None if knob.name in unused else config[knob.name]
            if knob.numeric:
                # A non-positive choice is a mode, not a size (t0: -1 no tiling, 0 polyc's
                # tiles), so each has a flag of its own, as has a knob that does not apply.
                values.append(math.log2(float(value)) if value is not None and float(value) > 0 else 0.0)
                values += [1.0 if value == choice else 0.0 for choice in knob.choices if float(choice) <= 0]
                values.append(1.0 if value is None else 0.0)
            else:
                values += [1.0 if value == choice else 0.0 for choice in knob.choices]
        values += self._footprints(config)
        return values

    def _unused(self, config: Mapping[str, object]) -> set[str]:
        """Knobs that ``config``'s other knobs make meaningless (as :meth:`options` ignores them):
        the model sees them as absent, not as values that seem to change the time."""
        if self.path == "gemm" and config["kc"] == 0:
            return {"mc", "nc"}
        if self.path == "convolution" and config.get("winograd", False):
            return {"channels"}
        if self.path == "generic" and "t0" in config and int(config["t0"]) <= 0:
            return {k.name for k in self.knobs if k.name[0] == "t" and k.name[1:].isdigit() and k.name != "t0"}
        return set()

    def _footprints(self, config: Mapping[str, object]) -> list[float]:
        """log2 of the bytes a block of the configuration touches, over each cache level."""
        l1, l2, l3 = (max(1, c) for c in self.caches)
        block = None
        if self.path == "gemm" and config["kc"]:
            mc, nc, kc = (int(config[n]) for n in ("mc", "nc", "kc"))
            return [math.log2(16 * kc * self.itemsize / l1), math.log2(mc * kc * self.itemsize / l2),
                    math.log2(kc * nc * self.itemsize / l3)]
        if self.path == "generic" and "t0" in config and int(config["t0"]) > 0:
            tiles = [min(int(config[f"t{i}"]), e) for i, e in enumerate(self.extents[:3])]
            block = math.prod(tiles) * self.itemsize
        if self.path == "convolution" and config["channels"] and not config.get("winograd", False):
            block = int(config["channels"]) * self.itemsize * 64
        if block is None:
            return [0.0, 0.0, 0.0]
        return [math.log2(block / l1), math.log2(block / l2), math.log2(block / l3)]


_GENERIC_TILES = (16, 32, 64, 128, 256)


def thread_counts(cores: int) -> tuple[int, ...]:
    """The thread counts searched on ``cores`` cores: 0 (all of them, polyc's default), then
    half, a quarter, ... down to one."""
    counts, count = [0], cores // 2
    while count >= 1:
        counts.append(count)
        count //= 2
    return tuple(counts)


def built_instruction_set(options: Options, machine: MachineFingerprint) -> str:
    """The instruction set whose register blocks kernels built with ``options`` on ``machine``
    hold: the machine's own with ``-march=native`` (the default), else the one the flags select
    (``cflags="-O3 -mavx2 -mfma"`` builds AVX2 code on an AVX-512 machine, with AVX2's blocks)."""
    from polyc.driver import compiler_options
    from polyc.runtime.compiler import vector_bits
    build = compiler_options(options)
    if any(flag.endswith("=native") for flag in build.flags):
        return machine.instruction_set
    return {512: "avx512", 256: "avx2", 128: "neon"}.get(vector_bits(build), "portable")


def space_for(definition: CheckedDef, sizes: Mapping[str, int], options: Options,
              machine: MachineFingerprint | None = None) -> SearchSpace:
    """The search space of ``definition`` compiled with ``options`` for ``sizes`` on ``machine``
    (None: this one), whose cores and instruction set give the thread counts and register blocks."""
    from polyc.driver import find_blas_contraction, find_convolution, find_pointwise_depthwise
    from polyc.schedule.tiling import cache_sizes as option_caches

    caches = option_caches(options)
    cache_triple = (caches.get(1, 32 << 10), caches.get(2, 1 << 20), caches.get(3, 8 << 20))
    statement = max(definition.statements, key=lambda s: len(s.all_indices))
    extents = tuple(max(1, r.hi.evaluate(sizes) - r.lo.evaluate(sizes)) for _, r in statement.ranges)
    itemsize = max(np.dtype(t.dtype).itemsize for t in definition.tensors)
    machine = machine or this_machine()
    threads = thread_counts(machine.cores) if options.threads is None and options.parallel else (0,)
    # Knob and default value of the thread count, where there is more than one count to try.
    thread_knob = (Knob("threads", threads),) if len(threads) > 1 else ()
    thread_default = {"threads": 0} if thread_knob else {}

    def space(path: str, knobs: tuple, default: Config) -> SearchSpace:
        return SearchSpace(path, knobs + thread_knob, {**default, **thread_default}, itemsize, extents,
                           cache_triple)

    contraction = find_blas_contraction(definition, options)
    if contraction is not None and contraction.is_matvec:
        return space("gemv", (), {})
    if contraction is not None:
        knobs = (Knob("mc", (24, 48, 72, 96, 120, 144, 192, 240, 288, 384)),
                 Knob("nc", (128, 256, 512, 1024, 2048, 3072, 4096)),
                 Knob("kc", (0, 64, 128, 192, 256, 320, 384, 512)))
        default = {"mc": 96, "nc": 1024, "kc": 0}
        if options.micro_kernel is None:
            # 0: polyc's choice for the sizes; n: the n-th of the instruction set's blocks.
            from polyc.codegen.gemm import micro_kernel_shapes
            blocks = len(micro_kernel_shapes(built_instruction_set(options, machine), np.dtype(
                definition.tensor(contraction.target.tensor).dtype)))
            if blocks > 1:
                knobs += (Knob("micro_kernel", tuple(range(blocks + 1)), numeric=False),)
                default["micro_kernel"] = 0
        return space("gemm", knobs, default)
    convolution = find_convolution(definition, options)
    if convolution is not None:
        knobs: tuple = (Knob("channels", (0, 8, 16, 24, 32, 48, 64, 96, 128)),)
        default = {"channels": 0}
        from polyc.codegen.winograd import winograd_form
        if winograd_form(convolution, sizes, options):
            # polyc's choice, the Winograd kernel, or the direct one (whose channels per item
            # are the other knob): which is faster depends on the machine's caches and vectors.
            knobs += (Knob("winograd", (True, False), numeric=False),)
            default["winograd"] = True
        return space("convolution", knobs, default)
    if find_pointwise_depthwise(definition, options) is not None:
        return space("pointwise_depthwise", (), {})  # its blocks follow the registers; the threads remain
    depth = min(3, len(extents))
    knobs = [Knob("t0", (-1, 0, *_GENERIC_TILES))] if depth else []
    knobs += [Knob(f"t{i}", _GENERIC_TILES) for i in range(1, depth)]
    ordered = depth >= 2 and options.loop_order is None    # not where the def's options fix it
    if ordered:
        # "": the scheduler's order; "k,i,j": those indices outermost first (the rest follow).
        orders = itertools.permutations(statement.all_indices[:depth])
        knobs.append(Knob("loop_order", ("", *(",".join(order) for order in orders)), numeric=False))
    # The fusion strategy only groups the scheduled statements: with one (an assignment, or a
    # reduction into the target's existing values) every strategy compiles to the same code,
    # and a search would measure each candidate three times over.
    scheduled = sum(2 if s.has_init_statement else 1 for s in definition.statements)
    if scheduled > 1:
        knobs.append(Knob("fusion", ("min", "smart", "max"), numeric=False))
    knobs += [Knob("unroll", (1, 2, 4, 8)), Knob("vectorize", (True, False), numeric=False)]
    default: Config = {"unroll": 1, "vectorize": True, **({"fusion": "smart"} if scheduled > 1 else {})}
    if depth:
        default.update({"t0": 0, **{f"t{i}": 64 for i in range(1, depth)}})
    if ordered:
        default["loop_order"] = ""
    return space("generic", tuple(knobs), default)
