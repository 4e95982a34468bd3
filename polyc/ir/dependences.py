"""Dependence analysis with isl: flow, anti and output dependences, and reductions.

Flow dependences are value-based (isl's dataflow analysis: a read depends only on the last write
of the element before it); anti and output dependences are memory-based, which is always safe.
Data-dependent accesses take part as may-accesses over the whole dimension.

A reduction ``C(i) +=! A(i, r)`` makes statement instances that differ only in their reduction
indices depend on each other through the accumulator.  Those self-dependences are the
*reduction dependences*: they order the reduction loop, but the loops over left-hand indices
carry none of them and so stay parallel.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyc.ir.model import PolyProgram, isl_name


@dataclass(frozen=True)
class Dependences:
    """The dependences of a program, as unions of maps between statement instances."""

    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap
    reduction: isl.UnionMap

    @property
    def all(self) -> isl.UnionMap:
        """Every dependence: what a schedule must respect."""
        return self.flow.union(self.anti).union(self.output)

    @property
    def non_reduction(self) -> isl.UnionMap:
        """Every dependence except reduction self-dependences."""
        return self.all.subtract(self.reduction)

    def to_text(self) -> str:
        return "\n".join(
            f"{name}: {getattr(self, name).coalesce()}" for name in ("flow", "anti", "output", "reduction")
        )


def compute_dependences(program: PolyProgram) -> Dependences:
    """Flow (value-based), anti and output (memory-based) dependences, and reduction ones."""
    schedule = program.initial_schedule()
    reads, writes = program.reads, program.writes
    empty = isl.UnionMap.empty(program.context.get_space())

    flow = (
        isl.UnionAccessInfo.from_sink(reads)
        .set_must_source(writes)
        .set_schedule(schedule)
        .compute_flow()
        .get_may_dependence()
    )
    anti = (
        isl.UnionAccessInfo.from_sink(writes)
        .set_must_source(empty)
        .set_may_source(reads)
        .set_schedule(schedule)
        .compute_flow()
        .get_may_dependence()
    )
    output = (
        isl.UnionAccessInfo.from_sink(writes)
        .set_must_source(empty)
        .set_may_source(writes)
        .set_schedule(schedule)
        .compute_flow()
        .get_may_dependence()
    )

    reduction = isl.UnionMap.empty(program.context.get_space())
    for s in program.statements:
        if s.kind != "update":
            continue
        # Instances of the same reduction that agree on the left-hand indices.
        lhs = len(s.source.indices)
        dims = [isl_name(i) for i in s.indices]
        primed = dims[:lhs] + [f"{d}_" for d in dims[lhs:]]
        params = "[" + ", ".join(isl_name(p) for p in program.params) + "]"
        same_target = isl.UnionMap.read_from_str(
            program.ctx, f"{params} -> {{ {s.name}[{', '.join(dims)}] -> {s.name}[{', '.join(primed)}] }}"
        )
        reduction = reduction.union(flow.union(anti).union(output).intersect(same_target))
    return Dependences(flow.coalesce(), anti.coalesce(), output.coalesce(), reduction.coalesce())
