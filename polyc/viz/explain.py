"""``kernel.explain(sizes)``: for every loop polyc generated, what it did and why, with witnesses.

The answers come from the compilation itself, not from a second analysis that could disagree
with it: the kernel path the driver took (:class:`polyc.driver.Stages`), and for the generic
path the loops of the C as the code generator wrote them (:class:`~polyc.codegen.c.LoopFact`:
the indices each runs over, its OpenMP pragmas, collapse, simd, loops isl elided for having one
iteration), each with the reasons of the band it came from, which
:func:`polyc.schedule.transform.optimize_schedule` recorded
(:class:`~polyc.schedule.transform.BandDecision`: tiling, parallel loop or parallel reduction,
simd).  The decisions alone could not say which loop a pragma lands on: the scheduler reorders
a band's loops after recording them, isl elides loops, and the code generator collapses loops
and drops a simd pragma it cannot honour.  Where a loop is not parallel, the explanation adds a *witness* computed with isl from
the dependences and the band's schedule at the given sizes: a concrete pair of statement
instances the loop orders, the kind of dependence, the array element they share and the
distance between them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import islpy as isl

from polyc.codegen.c import COLLAPSE_BELOW
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram
from polyc.paths import kernel_path
from polyc.schedule.transform import clause_text
from polyc.schedule.user import check_user_schedule, parameter_values, written_element

KINDS = ("flow", "anti", "output", "reduction")
_KIND_WORDS = {
    "flow": "reads what the other wrote (flow, read after write)",
    "anti": "overwrites what the other read (anti, write after read)",
    "output": "writes the element the other wrote (output, write after write)",
    "reduction": "accumulates into the element the other accumulated into (reduction)",
}


@dataclass(frozen=True)
class Witness:
    """A dependence a loop carries, at concrete sizes: ``source`` runs before ``sink``."""

    kind: str
    source: str  # statement name
    source_instance: dict
    sink: str
    sink_instance: dict
    element: str  # e.g. "B(3)"
    distance: tuple[int, ...]  # sink minus source in the band's loops, outermost first

    def describe(self) -> str:
        def instance(name, values):
            return f"{name}({', '.join(f'{k}={v}' for k, v in values.items())})"

        return (
            f"{instance(self.sink, self.sink_instance)} {_KIND_WORDS[self.kind]} "
            f"{instance(self.source, self.source_instance)}: element {self.element}, "
            f"distance {self.distance}"
        )


@dataclass
class LoopExplanation:
    """One loop of the generated code (a band member)."""

    statements: tuple[str, ...]
    index: str  # the TC index it runs over (per statement when they differ)
    depth: int
    parallel: bool
    parallel_how: str  # "parallel for", "parallel reduction (+:B)", or ""
    vectorised: bool
    tile_size: int | None
    reasons: list[str] = field(default_factory=list)
    witness: Witness | None = None
    advice: str = ""
    iterator: str = ""  # the loop's iterator in the C ("" for a loop that is not in the C)
    tile_loop: bool = False  # the loop over the tiles (it steps by the tile size)
    elided: bool = False  # a band member with no loop in the C: one iteration at these sizes

    def describe(self) -> str:
        if self.elided:
            lines = [f"loop over {self.index} [{', '.join(self.statements)}]: not in the code"]
            return "\n".join(lines + [f"    - {reason}" for reason in self.reasons])
        flags = [
            ("parallel" + (f" ({self.parallel_how})" if self.parallel_how else ""))
            if self.parallel
            else "not parallel",
            "vectorised" if self.vectorised else "not vectorised",
            f"tiled by {self.tile_size}" if self.tile_size else "not tiled",
        ]
        what = f"loop over the tiles of {self.index}" if self.tile_loop else f"loop over {self.index}"
        lines = [f"{what} [{', '.join(self.statements)}] ({self.iterator}): {', '.join(flags)}"]
        lines += [f"    - {reason}" for reason in self.reasons]
        if self.witness is not None:
            lines.append(f"    - witness: {self.witness.describe()}")
        if self.advice:
            lines.append(f"    - {self.advice}")
        return "\n".join(lines)


@dataclass
class Explanation:
    """What polyc did with a def at some sizes; ``str()`` or a notebook's display shows it."""

    name: str
    sizes: dict
    path: str  # the kernel path's name (polyc.paths.KERNEL_PATHS)
    summary: list[str]
    loops: list[LoopExplanation]
    parts: list[Explanation] = field(default_factory=list)

    def loop(self, index: str, statement: str | None = None) -> LoopExplanation:
        """The explanation of the (first) loop over ``index`` (of ``statement``, if given)."""
        for loop in self.loops + [l for p in self.parts for l in p.loops]:
            if (index == loop.index or index in loop.index.split("/")) and (
                statement is None or statement in loop.statements
            ):
                return loop
        raise KeyError(f"no loop over {index!r}" + (f" of {statement}" if statement else ""))

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items()) or "no sizes"
        lines = [f"def {self.name} at {sizes}: {self.path} path"] + [f"  {s}" for s in self.summary]
        lines += ["  " + line for loop in self.loops for line in loop.describe().splitlines()]
        for part in self.parts:
            lines += ["  " + line for line in str(part).splitlines()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        def badge(ok: bool, yes: str, no: str) -> str:
            colour = "#2e7d32" if ok else "#b71c1c"
            return f'<span style="color:{colour};font-weight:bold">{html.escape(yes if ok else no)}</span>'

        rows = []
        for loop in self.loops + [l for p in self.parts for l in p.loops]:
            details = "".join(f"<li>{html.escape(r)}</li>" for r in loop.reasons)
            if loop.witness is not None:
                details += f"<li><i>witness</i>: {html.escape(loop.witness.describe())}</li>"
            if loop.advice:
                details += f"<li>{html.escape(loop.advice)}</li>"
            where = "not in the code" if loop.elided else loop.iterator
            what = f"tiles of {loop.index}" if loop.tile_loop else loop.index
            rows.append(
                f"<tr><td><code>{html.escape(what)}</code></td><td><code>{html.escape(where)}</code></td>"
                f"<td>{html.escape(', '.join(loop.statements))}</td>"
                f"<td>{badge(loop.parallel, 'parallel', 'sequential')}</td>"
                f"<td>{badge(loop.vectorised, 'simd', 'scalar')}</td>"
                f"<td>{loop.tile_size or ''}</td><td><ul>{details}</ul></td></tr>"
            )
        summary = "".join(f"<li>{html.escape(s)}</li>" for s in self.summary)
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        return (
            f"<div><b>def {html.escape(self.name)}</b> at {html.escape(sizes)}: {html.escape(self.path)} path"
            f"<ul>{summary}</ul><table><tr><th>loop</th><th>in the C</th><th>statements</th><th>parallel</th><th>vector</th>"
            f"<th>tile</th><th>why</th></tr>{''.join(rows)}</table></div>"
        )


def explain(kernel, sizes: dict) -> Explanation:
    """The explanation of ``kernel`` (a :class:`polyc.Kernel`) compiled for ``sizes``."""
    stages = kernel.stages(sizes)
    return _explain_stages(kernel.definition.name, stages, dict(sizes))


def _explain_stages(name: str, stages, sizes: dict) -> Explanation:
    """What the kernel path that compiled ``stages`` says of itself; where the code that runs is
    the schedule's loop nest, each loop explained; a def in segments, each segment too."""
    path = kernel_path(stages.path)
    parts = [_explain_stages(f"{name} segment {k}", part, sizes) for k, part in enumerate(stages.segments)]
    if path.runs_schedule_loops:
        explanation = _explain_generic(name, stages, sizes)
        explanation.path = path.name
        explanation.summary[:0] = path.explain(stages)
        explanation.parts = parts
        return explanation
    return Explanation(name, sizes, path.name, path.explain(stages), [], parts)


def _explain_generic(name: str, stages, sizes: dict) -> Explanation:
    """One entry per loop of the C (the facts the code generator recorded as it wrote each,
    :class:`~polyc.codegen.c.LoopFact`), with the reasons of the band it came from; and one per
    band member that has no loop in the C (isl elides a loop of one iteration)."""
    program: PolyProgram = stages.program
    options = stages.options
    summary = []
    bands = list(stages.decisions)
    nests = [d for d in bands if d.depth == 0]
    if len(nests) > 1:
        fusion = options.fusion if options is not None else "smart"
        kept = ", ".join("{" + ", ".join(d.statements) + "}" for d in nests)
        why = {
            "min": "fusion='min' keeps every statement in a loop nest of its own",
            "smart": "fusion='smart' fuses loop nests only where the fused nest keeps a parallel outer loop",
            "max": "the dependences do not allow one nest",
        }.get(fusion, "")
        summary.append(f"{len(nests)} loop nests, run one after the other: {kept}" + (f" ({why})" if why else ""))
    facts = list(stages.kernel.loops)
    params = parameter_values(program, sizes)
    owners = [_band_of(fact, bands) for fact in facts]
    loops = [
        _explain_loop(position, facts, owners, stages.dependences, program, params) for position in range(len(facts))
    ]
    for decision in bands:
        for member, elided in _elided_members(decision, facts, owners):
            entry = _elided_loop(decision, member, elided, facts, owners)
            later = [p for p, owner in enumerate(owners) if owner is decision and facts[p].depth > entry.depth]
            earlier = [p for p, owner in enumerate(owners) if owner is decision]
            at = later[0] if later else (earlier[-1] + 1 if earlier else len(loops))
            # positions in ``loops`` shift by the entries already inserted before them
            at += sum(1 for loop in loops[: at + 1] if loop.elided and loop is not entry)
            loops.insert(min(at, len(loops)), entry)
    if options is not None and options.threads is not None and any(f.parallel for f in facts):
        summary.append(f"each parallel loop runs on at most {options.threads} threads (threads={options.threads})")
    for decision in bands:
        shifts = _shifts(decision)
        if shifts:
            summary.append(shifts)
    return Explanation(name, sizes, "generic", summary, loops)


def _real(statements) -> list[str]:
    """The statements that compute (not a ``!`` initialisation), or all when there are none."""
    return [s for s in statements if not s.endswith("_init")] or list(statements)


def _band_of(fact, bands):
    """The band decision whose members ``fact``'s loop runs (a tile or point loop of a tiled band),
    the innermost such band; None when none is recorded."""
    found = None
    for decision in bands:
        span = decision.members * (2 if decision.tile_sizes else 1)
        if decision.depth <= fact.depth < decision.depth + span and set(fact.statements) <= set(decision.statements):
            if found is None or decision.depth > found.depth:
                found = decision
    return found


def _member_of(fact, decision) -> int | None:
    """The member of ``decision`` whose index ``fact``'s loop runs over (matched by index, since
    the band's members were reordered after the decision was recorded)."""
    moved = dict(fact.indices)
    for member, indices in enumerate(decision.member_indices):
        real = {s: i for s, i in indices.items() if s in moved}
        if real and all(i in moved[s] for s, i in real.items() if moved[s] or not s.endswith("_init")):
            if any(i in moved[s] for s, i in real.items()):
                return member
    return None


def _index_name(fact) -> str:
    moved = dict(fact.indices)
    names = sorted({i for s in _real(moved) for i in moved[s]})
    return "/".join(names) or "/".join(sorted({i for found in moved.values() for i in found})) or fact.iterator


def _enclosing(position: int, facts) -> list[int]:
    """Positions of the loops around ``facts[position]``, innermost first."""
    chain, parent = [], facts[position].enclosing
    while parent is not None:
        chain.append(parent)
        parent = facts[parent].enclosing
    return chain


def _explain_loop(position: int, facts, owners, dependences, program, params) -> LoopExplanation:
    fact, decision = facts[position], owners[position]
    member = _member_of(fact, decision) if decision is not None else None
    index = _index_name(fact)
    around = _enclosing(position, facts)
    # A tiled band's first members are the loops over the tiles, the next ones the loops in a tile.
    tiled = decision is not None and decision.tile_sizes is not None and member is not None
    tile_loop = tiled and fact.depth < decision.depth + decision.members
    tile_size = decision.tile_sizes[member] if tiled else None
    over_tiles = (
        tiled
        and not tile_loop
        and any(
            owners[p] is decision
            and facts[p].depth < decision.depth + decision.members
            and _member_of(facts[p], decision) == member
            for p in around
        )
    )
    if fact.collapsed_into is not None:
        how = f"collapsed into the parallel loop over {_index_name(facts[fact.collapsed_into])}"
    elif fact.parallel_reductions and fact.parallel:
        how = f"parallel reduction ({clause_text(fact.parallel_reductions)})"
    elif fact.parallel:
        how = "parallel for" + (f", collapse({fact.collapse})" if fact.collapse > 1 else "")
    else:
        how = ""
    loop = LoopExplanation(
        tuple(sorted(fact.statements)),
        index,
        fact.depth,
        fact.parallel,
        how,
        fact.simd,
        tile_size,
        iterator=fact.iterator,
        tile_loop=tile_loop,
    )
    if len(_real(fact.statements)) > 1:
        loop.reasons.append(f"fused: statements {', '.join(sorted(fact.statements))} share this loop")
    band_positions = [p for p, owner in enumerate(owners) if owner is decision and decision is not None]
    first_of_band = bool(band_positions) and band_positions[0] == position
    if decision is not None and first_of_band and decision.tile_sizes is None and decision.tiling:
        loop.reasons.append(f"not tiled: {decision.tiling}")
    if tiled and not tile_loop and not over_tiles and tile_size is not None and tile_size > 1:
        # (tiles of 1 leave the loop over the tiles and elide the loop in a tile)
        loop.reasons.append(
            f"one tile of {tile_size} covers all {fact.trip_count or 'its'} iterations: "
            "no loop over the tiles in the code"
        )
    if fact.collapsed_into is not None:
        outer = facts[fact.collapsed_into]
        loop.reasons.append(
            f"OpenMP shares it out with the loop around it (collapse({outer.collapse})): that loop has fewer "
            f"than {COLLAPSE_BELOW} iterations"
        )
    elif fact.collapse > 1:
        loop.reasons.append(
            f"collapse({fact.collapse}): its {fact.trip_count} iterations are fewer than {COLLAPSE_BELOW}, so OpenMP "
            f"shares out the iterations of the {fact.collapse} loops together"
        )
    if fact.dropped:
        loop.reasons.append(f"no OpenMP pragma: {fact.dropped}")
    if not fact.parallel:
        parallel_around = next((p for p in around if facts[p].parallel), None)
        if parallel_around is not None:
            loop.reasons.append(
                f"not parallel: the loop over {_index_name(facts[parallel_around])} around it is parallel "
                "(OpenMP loops are not nested)"
            )
        elif decision is not None and decision.parallel is None and first_of_band:
            if decision.parallel_reason:
                loop.reasons.append(f"not parallel: {decision.parallel_reason}")
        elif (
            decision is not None
            and decision.parallel is not None
            and not any(facts[p].parallel for p in band_positions)
        ):
            loop.reasons.append(
                "not parallel: the loop polyc chose for the threads has one iteration at these sizes, so it is "
                "not in the code and nothing is shared out"
            )
        elif decision is not None and member is not None and decision.coincident[member]:
            loop.reasons.append("carries no dependence, but is not the outermost loop of the band")
        if decision is not None and member is not None:
            witness = _witness(decision, member, dependences, program, params)
            if witness is not None and not (decision.coincident[member] and witness.kind == "reduction"):
                loop.witness = witness
                if (
                    witness.kind == "reduction"
                    and member == 0
                    and not decision.parallel
                    and decision.parallel_reason.startswith("every loop of the band carries")
                ):
                    loop.advice = (
                        "it is a reduction index: polyc parallelises the loops over the output's indices "
                        "when there are any; a parallel reduction needs an operator OpenMP combines "
                        "as polyc does (+, *, integer min/max) and a target small enough to copy per thread"
                    )
    innermost = not any(f.enclosing == position for f in facts)
    if fact.register_tile is not None:
        tensor, rows, columns = fact.register_tile
        loop.reasons.append(
            f"a register tile: a block of {rows} x {columns} elements of {tensor} stays in registers while this "
            "loop and the loops in it run (loaded before it, stored after it; the rows unrolled, the columns "
            "vectorised)"
        )
    if fact.simd:
        clauses = clause_text(fact.simd_reductions or fact.parallel_reductions)
        loop.reasons.append(
            ("innermost, vectorised" if innermost else "vectorised")
            + (f" with simd reductions ({clauses})" if clauses else "")
            + (f", summed in blocks of {fact.sum_block} iterations (two loops in the C)" if fact.blocked else "")
            + (
                f", written once per value of {' and '.join(fact.versioned_on)}, which it leaves fixed "
                "(the selects on them decided outside the vector loop)"
                if fact.versioned_on
                else ""
            )
        )
    elif innermost and decision is not None and not fact.dropped:
        if decision.simd_reason:
            loop.reasons.append(f"not vectorised: {decision.simd_reason}")
        elif decision.innermost is not None:
            loop.reasons.append(
                "not vectorised: the loop polyc marked for vectors has one iteration at these sizes, so it is "
                "not in the code"
            )
    return loop


def _elided_members(decision, facts, owners):
    """(member, statement -> index) of the members of ``decision`` that no loop of the C runs over."""
    for member, indices in enumerate(decision.member_indices):
        real = {s: i for s, i in indices.items() if not s.endswith("_init")} or indices
        if not real:
            continue
        covered = any(
            owner is decision and any(i in dict(fact.indices).get(s, ()) for s, i in real.items())
            for fact, owner in zip(facts, owners)
        )
        if not covered:
            yield member, real


def _elided_loop(decision, member: int, indices: dict, facts, owners) -> LoopExplanation:
    loop = LoopExplanation(
        tuple(sorted(decision.statements)),
        "/".join(sorted(set(indices.values()))),
        decision.depth + member,
        False,
        "",
        False,
        None,
        elided=True,
    )
    loop.reasons.append("no loop in the code: it has one iteration at these sizes (isl prints it as an assignment)")
    if decision.parallel is not None and member == 0:
        loop.reasons.append("polyc chose it for the threads, so nothing in this loop nest runs in parallel")
    return loop


def carried_dependences(decision, member: int, dependences: Dependences, kind: str) -> isl.UnionMap:
    """The dependences of ``kind`` between statements of the band that ``member`` carries: same
    enclosing loops, same outer members of the band, different values of this one."""
    union = getattr(dependences, kind)
    domain = None
    for statement_map in decision.member_maps[:1]:
        domain = statement_map.domain()
    union = union.intersect_domain(domain).intersect_range(domain)
    same = decision.prefix.apply_range(decision.prefix.reverse())
    for outer in decision.member_maps[:member]:
        same = same.intersect(outer.apply_range(outer.reverse()))
    this = decision.member_maps[member]
    return union.intersect(same).subtract(this.apply_range(this.reverse()))


def _witness(decision, member: int, dependences: Dependences, program: PolyProgram, params) -> Witness | None:
    found = {}
    reductions = carried_dependences(decision, member, dependences, "reduction")
    for kind in KINDS:
        carried = carried_dependences(decision, member, dependences, kind)
        if kind != "reduction":  # a reduction's self-dependences are reported as such
            carried = carried.subtract(reductions)
        if params is not None:
            carried = carried.intersect_params(params)
        if not carried.is_empty():
            found[kind] = carried
    if not found:
        return None
    # Prefer a dependence between the computing statements: one from a `!` initialisation is
    # real but says less (the initialisation runs at the loop's first value).
    candidates = []
    for rank, kind in enumerate(("flow", "anti", "output", "reduction")):
        maps: list[isl.Map] = []
        if kind in found:
            found[kind].foreach_map(maps.append)
        for relation in maps:
            touches_init = any(
                relation.get_tuple_name(t).endswith("_init") for t in (isl.dim_type.in_, isl.dim_type.out)
            )
            candidates.append((touches_init, rank, kind, relation))
    _, _, kind, relation = min(candidates, key=lambda c: (c[0], c[1]))
    point = relation.wrap().sample_point()
    n_in = relation.dim(isl.dim_type.in_)
    n_out = relation.dim(isl.dim_type.out)
    values = [point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n_in + n_out)]
    source_name, sink_name = relation.get_tuple_name(isl.dim_type.in_), relation.get_tuple_name(isl.dim_type.out)
    source = program.statement(source_name)
    sink = program.statement(sink_name)
    source_values, sink_values = values[:n_in], values[n_in:]
    # The element both touch: what the source wrote (for an anti dependence: what the sink writes).
    element = written_element(sink, sink_values) if kind == "anti" else written_element(source, source_values)
    distance = tuple(
        _member_value(m, sink_name, sink_values) - _member_value(m, source_name, source_values)
        for m in decision.member_maps
    )
    return Witness(
        kind,
        source_name,
        dict(zip(source.indices, source_values)),
        sink_name,
        dict(zip(sink.indices, sink_values)),
        element,
        distance,
    )


def _instance(name: str, values, ctx: isl.Context) -> isl.Set:
    text = ", ".join(str(v) for v in values)
    return isl.Set(f"{{ {name}[{text}] }}", context=ctx)


def _member_value(member_map: isl.UnionMap, name: str, values) -> int:
    instance = _instance(name, values, member_map.get_ctx()).align_params(member_map.get_space())
    image = member_map.intersect_domain(isl.UnionSet.from_set(instance))
    sets: list[isl.Set] = []
    image.range().foreach_set(sets.append)
    point = sets[0].sample_point()
    return point.get_coordinate_val(isl.dim_type.set, 0).to_python()


def _shifts(decision) -> str | None:
    """'S1 runs shifted by ...' when fused statements are scheduled at different offsets."""
    if len(decision.statements) < 2 or not decision.member_maps:
        return None
    notes = []
    for member, member_map in enumerate(decision.member_maps):
        offsets = {}
        maps: list[isl.Map] = []
        member_map.foreach_map(maps.append)
        for relation in maps:
            name = relation.get_tuple_name(isl.dim_type.in_)
            if name.endswith("_init"):
                continue
            pieces = []
            isl.PwMultiAff.from_map(relation).foreach_piece(lambda s, maff: pieces.append(maff))
            if pieces:
                aff = pieces[0].get_at(0)
                offsets[name] = aff.get_constant_val().to_python()
        if len(set(offsets.values())) > 1:
            notes.append(
                f"loop {decision.depth + member}: "
                + ", ".join(f"{n} at offset {o}" for n, o in sorted(offsets.items()))
            )
    if not notes:
        return None
    return (
        "fused with a shift (a statement reads another's result at a neighbouring point, so the schedule "
        "runs it later in the same loop): " + "; ".join(notes)
    )


@dataclass
class ScheduleCheck:
    """The verdict on a user's schedule: ``valid``, else the dependences it violates."""

    schedule: str
    violations: list[Witness]
    kernel: object = None
    relation: isl.UnionMap | None = None  # the schedule, instances -> time vectors
    violated: isl.UnionMap | None = None  # the dependence pairs it runs sink-first, every size

    @property
    def valid(self) -> bool:
        return not self.violations

    def plot(self, sizes: dict, **options):
        """The instances at ``sizes`` numbered in this schedule's order, with the dependences it
        violates drawn in bold red (:func:`polyc.viz.plot_domain`'s options apply)."""
        from polyc.viz.domain import plot_domain

        options.setdefault("order", True)
        return plot_domain(self.kernel, sizes, schedule=self.relation, violated=self.violated, **options)

    def view(self, sizes: dict, **options):
        """The same as an interactive view (:func:`polyc.viz.view_domain`)."""
        from polyc.viz.view import view_domain

        return view_domain(self.kernel, sizes, schedule=self.relation, violated=self.violated, **options)

    def __str__(self) -> str:
        if self.valid:
            return f"the schedule respects every dependence: {self.schedule}"
        return "the schedule violates dependences:\n" + "\n".join(
            f"  {w.kind}: {w.describe()} (the sink would run first or at the same time)" for w in self.violations
        )

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(str(self)) + "</pre>"


def check_schedule(kernel, schedule, sizes: dict | None = None, strict: bool = False) -> ScheduleCheck:
    """Whether ``schedule`` (isl text of a union map from statement instances to time vectors,
    e.g. ``"{ S0[m, n, r_k] -> [r_k, m, n]; S0_init[m, n] -> [-1, m, n] }"``, an isl.UnionMap or
    an isl.Schedule) runs every dependence's source before its sink.  Violations come with a
    witness pair at ``sizes`` (when given) or at some sizes.  With ``sizes`` the schedule need
    only give a time to the instances at those sizes (a schedule written for them, without the
    size parameters, is checked there); without, to every instance at every size.

    The updates of one element by a reduction (``+=``, ``*=``, ``min=``, ``max=``) may run in any
    order, as polyc's own vectorised and parallel reductions run them, while a statement reading
    the reduced element waits for all of them; ``strict=True`` keeps their source order too
    (:mod:`polyc.schedule.user`).  A schedule this accepts compiles with
    ``polyc.define(..., schedule=...)``."""
    from polyc.driver import analyse

    analysis = analyse(kernel.definition, kernel.options.fusion)
    checked = check_user_schedule(analysis.program, analysis.dependences, schedule, sizes, strict)
    violations = [
        Witness(v.kind, v.source, v.source_instance, v.sink, v.sink_instance, v.element, v.distance)
        for v in checked.violations
    ]
    return ScheduleCheck(str(schedule), violations, kernel, checked.relation, checked.violated)
