"""What the tuner may change for one kernel, and the features its cost model sees.

The space is the knobs of the kernel path that compiles the def (:mod:`polyc.paths`: each
path's :class:`~polyc.paths.base.Tuning`): the gemm path's cache and register blocks, the
convolution paths' output channels per work item (and, on the Winograd path, whether to keep
it), the generic path's tiles, loop order, fusion, unrolling and vectorisation; the gemv and
fused pointwise-depthwise paths have none of their own.

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
from polyc.paths import KernelPath, PathRequest, SpaceRequest, choose_path, kernel_path
from polyc.paths.base import Config, Knob
from polyc.runtime.machine import MachineFingerprint, this_machine

__all__ = ["Config", "Knob", "SearchSpace", "space_for", "thread_counts", "built_instruction_set"]


@dataclass(frozen=True)
class SearchSpace:
    path: str  # the kernel path's name (polyc.paths.KERNEL_PATHS)
    knobs: tuple[Knob, ...]
    default: Config  # polyc's own choice, always measured first
    itemsize: int
    extents: tuple[int, ...]  # the largest statement's loop extents, outermost first
    caches: tuple[int, int, int]

    @property
    def kernel_path(self) -> KernelPath:
        return kernel_path(self.path)

    @property
    def size(self) -> int:
        return math.prod(len(k.choices) for k in self.knobs)

    def options(self, config: Config) -> dict:
        """The option changes ``config`` stands for (only those that differ from the defaults)."""
        changes = self.kernel_path.tuning.option_changes(config)
        if config.get("threads", 0) != 0:
            changes["threads"] = int(config["threads"])
        return changes

    def configs(self):
        """Every configuration of the space (:attr:`size` of them)."""
        for values in itertools.product(*(k.choices for k in self.knobs)):
            yield {k.name: v for k, v in zip(self.knobs, values)}

    def random_config(self, rng: random.Random) -> Config:
        return {k.name: rng.choice(k.choices) for k in self.knobs}

    def neighbour(self, config: Config, rng: random.Random) -> Config:
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

    def identity(self, config: Config) -> str:
        """Configurations that compile to the same options are the same candidate."""
        import json

        return json.dumps(self.options(config), sort_keys=True)

    def features(self, config: Config) -> list[float]:
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

    def _unused(self, config: Config) -> set[str]:
        """Knobs that ``config``'s other knobs make meaningless (as :meth:`options` ignores them):
        the model sees them as absent, not as values that seem to change the time."""
        return self.kernel_path.tuning.unused(config, self.knobs)

    def _footprints(self, config: Config) -> list[float]:
        """log2 of the bytes the blocks of the configuration touch, over each cache level."""
        blocks = self.kernel_path.tuning.block_bytes(config, self.itemsize, self.extents)
        if blocks is None:
            return [0.0, 0.0, 0.0]
        return [math.log2(block / max(1, cache)) for block, cache in zip(blocks, self.caches)]


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
    from polyc.runtime.compiler import compiler_options, vector_bits

    build = compiler_options(options)
    if any(flag.endswith("=native") for flag in build.flags or ()):
        return machine.instruction_set
    return {512: "avx512", 256: "avx2", 128: "neon"}.get(vector_bits(build), "portable")


def space_for(
    definition: CheckedDef, sizes: Mapping[str, int], options: Options, machine: MachineFingerprint | None = None
) -> SearchSpace:
    """The search space of ``definition`` compiled with ``options`` for ``sizes`` on ``machine``
    (None: this one), whose cores and instruction set give the thread counts and register blocks:
    the knobs of the kernel path that compiles it (:class:`polyc.paths.base.Tuning`), and the
    thread count."""
    from polyc.schedule.tiling import cache_sizes as option_caches

    caches = option_caches(options)
    cache_triple = (caches.get(1, 32 << 10), caches.get(2, 1 << 20), caches.get(3, 8 << 20))
    statement = max(definition.statements, key=lambda s: len(s.all_indices))
    extents = tuple(max(1, r.hi.evaluate(sizes) - r.lo.evaluate(sizes)) for _, r in statement.ranges)
    itemsize = max(np.dtype(t.dtype).itemsize for t in definition.tensors)
    machine = machine or this_machine()
    threads = thread_counts(machine.cores) if options.threads is None and options.parallel else (0,)
    path, match = choose_path(PathRequest(definition, options, sizes if options.specialize else None))
    knobs, default = path.tuning.knobs(
        SpaceRequest(
            definition,
            sizes,
            options,
            match,
            tuple(statement.all_indices),
            extents,
            lambda: built_instruction_set(options, machine),
        )
    )
    if len(threads) > 1:  # the thread count, where there is more than one to try
        knobs += (Knob("threads", threads),)
        default = {**default, "threads": 0}
    return SearchSpace(path.name, knobs, default, itemsize, extents, cache_triple)
