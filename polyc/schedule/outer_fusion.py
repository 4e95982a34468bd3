"""Outer-loop fusion: loop nests in sequence that share a parallel outer loop become one loop.

isl's clustering fuses two loop nests only if the fused band keeps every coincident member.  A
row-wise kernel (softmax, layer norm, pooling followed by a scale...) is a sequence of nests
that share the row loop but differ inside: a reduction along the row (row loop parallel, the
other not) and elementwise passes (both parallel).  isl keeps them apart, so every nest walks
all rows and each row makes one trip through memory per nest; with fusion=max it fuses them
with inner loops shifted one after the other, which no longer vectorise.

:func:`fuse_outer_loops` finds runs of consecutive children of a sequence (or set) node whose first band
member schedules one index of each statement and carries no dependence among the run, and
rebuilds each run as one parallel loop around the run's statements in source order, each
statement with a band over its other indices (in source order).  Softmax, before and after:

    for n: for d: M(n) max= X(n, d)             for n:                        (parallel)
    for n: for d: O(n, d) = exp(X - M(n))           for d: M(n) max= X(n, d)   (simd reduction)
    for n: for d: S(n) += O(n, d)                   for d: O(n, d) = exp(...)  (simd)
    for n: for d: O(n, d) = O(n, d) / S(n)          for d: S(n) += O(n, d)     (simd reduction)
                                                    for d: O(n, d) = ... / S(n)

Under the outer loop, each statement's next index joins it as a second shared loop when it has
the same range in every statement and carries no dependence among them (a batch loop, then a
channel loop: work plane by plane).

For a fixed outer index the statement instances keep their source order, so the result is
valid whenever no dependence among the run crosses outer iterations.  Fusing gives up tiling
the outer loop and running it innermost, so a run is formed only when neither would pay: every
access of its statements moves with the outer index, or touches a tensor small enough for the
L1 cache; and the outer index is not in the last (stride-1) subscript of an access that another
index moves too.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram, PolyStatement, isl_name
from polyc.lang.symbolic import Affine
from polyc.schedule.isl_helpers import combine_all, sets

_BAND = isl.schedule_node_type.band
_SEQUENCE = isl.schedule_node_type.sequence


class _Unsupported(Exception):
    """The tree holds a node kind the rebuild does not handle (it then changes nothing)."""


@dataclass(frozen=True)
class _OuterLoop:
    """A band member as the outer loop of its statements: its schedule and, per statement, the
    index it runs over."""

    schedule: isl.UnionPwAff
    index_of: dict[str, str]


def fuse_outer_loops(
    schedule: isl.Schedule, program: PolyProgram, dependences: Dependences, caches: dict[int, int]
) -> isl.Schedule:
    """``schedule`` with runs of sequence children sharing a parallel outer loop fused (see the
    module doc); ``schedule`` itself when there is no such run."""
    fuser = _Fuser(program, dependences, caches)
    try:
        rebuilt = fuser.rebuild(schedule.get_root())
    except _Unsupported:
        return schedule
    return rebuilt if fuser.fused_any else schedule


class _Fuser:
    def __init__(self, program: PolyProgram, dependences: Dependences, caches: dict[int, int]):
        self.program = program
        self.dependences = dependences.all
        # The dependence maps by source statement: the checks look at the few maps among the
        # statements at hand, not at the whole program's union for every child and statement.
        self.dependences_from: dict[str, list[isl.Map]] = {}
        self.dependences_to: dict[str, list[isl.Map]] = {}
        for dependence in _maps(self.dependences):
            self.dependences_from.setdefault(dependence.get_tuple_name(isl.dim_type.in_), []).append(dependence)
            self.dependences_to.setdefault(dependence.get_tuple_name(isl.dim_type.out), []).append(dependence)
        self.l1_bytes = caches.get(1, 32 * 1024)
        self.fused_any = False

    # ------------------------------------------------------------------ rebuilding the tree
    def rebuild(self, node: isl.ScheduleNode) -> isl.Schedule:
        """A schedule equal to the subtree at ``node``, over the instances reaching it."""
        kind = node.get_type()
        if kind in (isl.schedule_node_type.domain, isl.schedule_node_type.filter):
            return self.rebuild(node.child(0))
        if kind == isl.schedule_node_type.leaf:
            return isl.Schedule.from_domain(node.get_domain())
        if kind == _BAND and self.shifted_fusion(node):
            self.fused_any = True
            return self.distribute(
                node.get_domain(), self.band_outer_loop(node), node.get_prefix_schedule_multi_union_pw_aff()
            )
        if kind == _BAND:
            coincident = [node.band_member_get_coincident(i) for i in range(node.band_n_member())]
            return _with_band(
                self.rebuild(node.child(0)), node.band_get_partial_schedule(), node.band_get_permutable(), coincident
            )
        if kind == _SEQUENCE:
            return _in_sequence([self.rebuild_run(node, run) for run in self.runs(node)], node.get_domain())
        if kind == isl.schedule_node_type.set:
            # Independent children: fused runs go in sequence, the rest stays a set.
            return combine_all([self.rebuild_run(node, run) for run in self.runs(node)], isl.Schedule.set)
        raise _Unsupported(kind)

    def rebuild_run(self, sequence: isl.ScheduleNode, run: list[int]) -> isl.Schedule:
        if len(run) == 1:
            return self.rebuild(sequence.child(run[0]))
        self.fused_any = True
        return self.distribute(
            _run_domain(sequence, run),
            self.outer_loop(sequence, run),
            sequence.get_prefix_schedule_multi_union_pw_aff(),
        )

    def distribute(self, domain: isl.UnionSet, outer: _OuterLoop, prefix: isl.MultiUnionPwAff) -> isl.Schedule:
        """``domain`` under the loop ``outer`` (and the loops below it that every statement
        shares: see :meth:`shared_loop_below`), inside them each statement in source order
        under a band over its other indices."""
        pieces = {piece.get_tuple_name(): piece for piece in sets(domain)}
        statements = [
            s
            for s in self.program.statements
            if s.name in outer.index_of and s.name in pieces and not pieces[s.name].intersect(s.domain).is_empty()
        ]
        outers = [outer]
        while below := self.shared_loop_below(domain, statements, outers, prefix):
            outers.append(below)
        parts = []
        for statement in statements:
            part_domain = isl.UnionSet.from_set(pieces[statement.name].intersect(statement.domain))
            part = isl.Schedule.from_domain(part_domain)
            inner = [i for i in statement.indices if i not in {o.index_of[statement.name] for o in outers}]
            if inner:
                band = self._statement_band(statement, inner)
                deps = _equal_at(self.dependences_among(part_domain), prefix, [o.schedule for o in outers])
                part = _with_band(part, band, *_band_properties(band, deps))
            parts.append(part)
        loops = isl.MultiUnionPwAff.from_union_pw_aff(outers[0].schedule)
        for below in outers[1:]:
            loops = loops.flat_range_product(isl.MultiUnionPwAff.from_union_pw_aff(below.schedule))
        return _with_band(_in_sequence(parts, domain), loops, True, [True] * len(outers))

    def shared_loop_below(
        self,
        domain: isl.UnionSet,
        statements: list[PolyStatement],
        outers: list[_OuterLoop],
        prefix: isl.MultiUnionPwAff,
    ) -> _OuterLoop | None:
        """A second shared loop under ``outers``: each statement's first index (in source order)
        that they do not run over, when it has the same range in every statement, carries no
        dependence among them for fixed outer indices, and loses no locality (as the outer
        loop's).  mobilenet_v2's depthwise convolutions at batch 8 (a loop over the images,
        and in it the statements for the interior and each edge, each over all channels) then
        run all their statements channel by channel, in the caches, which is faster (``python -m
        benchmarks.onnx_segments mobilenet_v2 --batch 8``).  Only loops of one range in every
        statement are shared so: the row loops of regions (an interior, its edges) would need
        guards."""
        if not statements:  # (an empty domain: nothing runs under the outer loop)
            return None
        index_of = {}
        schedule = None
        ranges = None
        for statement in statements:
            used = {o.index_of[statement.name] for o in outers}
            free = [i for i in statement.indices if i not in used]
            if not free:
                return None
            index_of[statement.name] = free[0]
            position = statement.indices.index(free[0])
            extent = (statement.domain.dim_min(position), statement.domain.dim_max(position))
            if ranges is None:
                ranges = extent
            elif not (ranges[0].is_equal(extent[0]) and ranges[1].is_equal(extent[1])):
                return None
            member = self._statement_band(statement, [free[0]]).get_at(0)
            schedule = member if schedule is None else schedule.union_add(member)
        below = _OuterLoop(schedule, index_of)
        deps = _equal_at(self.dependences_among(domain), prefix, [o.schedule for o in outers])
        if not _agree(deps, schedule) or not self.keeps_locality(below):
            return None
        return below

    def shifted_fusion(self, band: isl.ScheduleNode) -> bool:
        """Whether below the outer member of ``band`` isl fused statements by running them one
        after the other along a loop (``r`` for one, ``D + r`` for the next: a row reduction,
        then one that needs its result), which no longer vectorises.  Then the outer member is
        better kept alone, the statements in sequence inside it."""
        outer = self.band_outer_loop(band)
        if outer is None or not self.keeps_locality(outer):
            return False
        domain = band.get_domain()
        deps = _equal_at(self.dependences_among(domain), band.get_prefix_schedule_multi_union_pw_aff(), [])
        if not _agree(deps, outer.schedule):
            return False  # (the member is coincident, so this is a check)
        members = [band.band_get_partial_schedule().get_at(m) for m in range(1, band.band_n_member())]
        below: list[isl.ScheduleNode] = []
        _collect_bands(band.child(0), below)
        for node in below:
            members += [node.band_get_partial_schedule().get_at(m) for m in range(node.band_n_member())]
        return any(self._runs_statements_one_after_another(member) for member in members)

    def _runs_statements_one_after_another(self, member: isl.UnionPwAff) -> bool:
        """A member over two or more statements (not counting initialisations) that is not
        ``index + constant`` for some of them."""
        pw_affs: list[isl.PwAff] = []
        member.foreach_pw_aff(pw_affs.append)
        statements = {p.get_tuple_id(isl.dim_type.in_).get_name() for p in pw_affs}
        statements = {name for name in statements if self.program.statement(name).kind != "init"}
        if len(statements) < 2:
            return False
        plain = _member_indices(member, self.program, allow_others=True)
        return not statements <= plain.keys()

    def band_outer_loop(self, band: isl.ScheduleNode) -> _OuterLoop | None:
        """The first member of ``band`` as the outer loop of its statements, if it is
        coincident and schedules one index of each of them."""
        if not band.band_member_get_coincident(0):
            return None
        member = band.band_get_partial_schedule().get_at(0)
        indices = _member_indices(member, self.program)
        names = {s.get_tuple_name() for s in sets(band.get_domain())}
        if indices is None or not names <= indices.keys():
            return None
        if any(self.program.statement(name).loop is not None for name in names):
            return None  # the rebuild runs statements one after another, a recurrence's steps interleave them
        return _OuterLoop(member, {name: indices[name] for name in names})

    def _statement_band(self, statement: PolyStatement, indices: list[str]) -> isl.MultiUnionPwAff:
        params = ", ".join(isl_name(p) for p in self.program.params)
        dims = ", ".join(isl_name(i) for i in statement.indices)
        members = ", ".join(isl_name(i) for i in indices)
        text = f"[{params}] -> {{ {statement.name}[{dims}] -> [{members}] }}"
        return isl.MultiUnionPwAff.from_union_map(isl.UnionMap.read_from_str(self.program.ctx, text))

    # ------------------------------------------------------------------ finding runs
    def runs(self, sequence: isl.ScheduleNode) -> list[list[int]]:
        """The children of ``sequence`` (or of a set node) in runs of consecutive positions
        that can be fused: a child joins the run before it when its band starts with an outer
        loop (see :meth:`band_outer_loop`), no dependence among the run crosses outer
        iterations, and no reuse is lost.  The run already passed these checks, so a child is
        checked only against it: the dependences that touch the child, and its own statements'
        accesses (which keeps the search linear in the number of children).  A run's first
        child passes them alone before another may join it: its accesses and the dependences
        within it are the run's too."""
        prefix = sequence.get_prefix_schedule_multi_union_pw_aff()
        runs: list[list[int]] = []
        run_domain = run_outer = None
        for position in range(sequence.n_children()):
            band = sequence.child(position).child(0)
            outer = self.band_outer_loop(band) if band.get_type() == _BAND else None
            domain = band.get_domain()
            if run_outer is not None and outer is not None:
                joined_domain = run_domain.union(domain)
                joined_outer = run_outer.union_add(outer.schedule)
                deps = _equal_at(self.dependences_touching(domain, joined_domain), prefix, [])
                if _agree(deps, joined_outer) and self.keeps_locality(outer):
                    runs[-1].append(position)
                    run_domain, run_outer = joined_domain, joined_outer
                    continue
            runs.append([position])
            run_domain, run_outer = domain, None
            if outer is not None and self.keeps_locality(outer):
                if _agree(_equal_at(self.dependences_among(domain), prefix, []), outer.schedule):
                    run_outer = outer.schedule
        return runs

    def outer_loop(self, sequence: isl.ScheduleNode, run: list[int]) -> _OuterLoop | None:
        """The shared outer loop of the children at ``run``: the first member of the band each
        starts with (see :meth:`band_outer_loop`)."""
        schedule = None
        index_of: dict[str, str] = {}
        for position in run:
            band = sequence.child(position).child(0)
            outer = self.band_outer_loop(band) if band.get_type() == _BAND else None
            if outer is None:
                return None
            index_of.update(outer.index_of)
            schedule = outer.schedule if schedule is None else schedule.union_add(outer.schedule)
        return _OuterLoop(schedule, index_of)

    def dependences_among(self, domain: isl.UnionSet) -> isl.UnionMap:
        """The dependences between instances in ``domain``."""
        return self.dependences_touching(domain, domain)

    def dependences_touching(self, domain: isl.UnionSet, within: isl.UnionSet) -> isl.UnionMap:
        """The dependences between instances in ``within`` (which holds ``domain``) that have
        an end in ``domain``."""
        names = {piece.get_tuple_name() for piece in sets(domain)}
        found = {
            id(dependence): dependence
            for name in names
            for dependence in self.dependences_from.get(name, []) + self.dependences_to.get(name, [])
        }
        touching = combine_all([isl.UnionMap.from_map(dependence) for dependence in found.values()], isl.UnionMap.union)
        if touching is None:
            return isl.UnionMap.empty(self.dependences.get_space())
        touching = touching.intersect_domain(within).intersect_range(within)
        return touching.intersect_domain(domain).union(touching.intersect_range(domain))

    def keeps_locality(self, outer: _OuterLoop) -> bool:
        """Whether the statements lose nothing with ``outer`` alone outside them (see
        :meth:`_keeps_locality`)."""
        return all(self._keeps_locality(self.program.statement(name), index) for name, index in outer.index_of.items())

    def _keeps_locality(self, statement: PolyStatement, outer_index: str) -> bool:
        """True when no access of ``statement`` would be better served by tiling the outer loop
        or by running it innermost.  An access that does not move with ``outer_index`` must be
        to a tensor that fits in the L1 cache (else a tile of the outer loop would reuse it);
        one whose last subscript moves with ``outer_index`` must move with no other index
        (else that inner index would walk it across rows: ``A(r, i)`` in ``x(i) +=! A(r, i)``)."""
        accesses = [(statement.source.target, tuple(Affine.var(i) for i in statement.source.indices))]
        accesses += [(a.tensor, a.read.subscripts) for a in statement.reads if a.read is not None]
        for tensor_name, subscripts in accesses:
            moved_by = [
                set(s.names()) & set(statement.indices) if isinstance(s, Affine) else set(statement.indices)
                for s in subscripts
            ]
            if any(outer_index in names for names in moved_by):
                if subscripts and outer_index in moved_by[-1] and set().union(*moved_by) - {outer_index}:
                    return False
                continue
            tensor = self.program.definition.tensor(tensor_name)
            size = tensor.dtype.itemsize
            for extent in tensor.shape:
                if self.program.size_values is None and not extent.is_constant:
                    return False
                size *= extent.evaluate(self.program.size_values or {})
            if size > self.l1_bytes:
                return False
        return True


# ----------------------------------------------------------------------------- helpers
def _with_band(
    schedule: isl.Schedule, partial: isl.MultiUnionPwAff, permutable: bool, coincident: list[bool]
) -> isl.Schedule:
    """``schedule`` under a new band with the given partial schedule and properties."""
    band = schedule.insert_partial_schedule(partial.intersect_domain(schedule.get_domain())).get_root().child(0)
    band = band.band_set_permutable(int(permutable))
    for member, flag in enumerate(coincident):
        band = band.band_member_set_coincident(member, int(flag))
    return band.get_schedule()


def _in_sequence(parts: list[isl.Schedule], domain: isl.UnionSet) -> isl.Schedule:
    """The parts (schedules of pieces of ``domain``) one after the other."""
    result = combine_all([p for p in parts if not p.get_domain().is_empty()], isl.Schedule.sequence)
    return isl.Schedule.from_domain(domain) if result is None else result


def _run_domain(sequence: isl.ScheduleNode, run: list[int]) -> isl.UnionSet:
    return combine_all([sequence.child(position).child(0).get_domain() for position in run], isl.UnionSet.union)


def _maps(union: isl.UnionMap) -> list[isl.Map]:
    found: list[isl.Map] = []
    union.foreach_map(found.append)
    return found


def _equal_at(deps: isl.UnionMap, prefix: isl.MultiUnionPwAff, loops: list[isl.UnionPwAff]) -> isl.UnionMap:
    """The pairs of ``deps`` whose instances ``prefix`` and each of ``loops`` map to the same
    point (without forming those relations, which pair every two statements under a loop)."""
    deps = deps.eq_at_multi_union_pw_aff(prefix)
    for loop in loops:
        deps = deps.eq_at_multi_union_pw_aff(isl.MultiUnionPwAff.from_union_pw_aff(loop))
    return deps


def _agree(deps: isl.UnionMap, loop: isl.UnionPwAff) -> bool:
    """Whether ``loop`` maps the two instances of every pair in ``deps`` to the same point."""
    return deps.is_subset(_equal_at(deps, isl.MultiUnionPwAff.from_union_pw_aff(loop), []))


def _member_indices(member: isl.UnionPwAff, program: PolyProgram, allow_others: bool = False) -> dict[str, str] | None:
    """Per statement, the index a band member runs over (``index + constant``), or None if the
    member is anything else for some statement (with ``allow_others``: leave those out)."""
    found: dict[str, str] = {}
    pw_affs: list[isl.PwAff] = []
    member.foreach_pw_aff(pw_affs.append)
    for pw_aff in pw_affs:
        statement = program.statement(pw_aff.get_tuple_id(isl.dim_type.in_).get_name())
        affs: list[isl.Aff] = []
        pw_aff.foreach_piece(lambda _set, aff: affs.append(aff))
        if len(affs) != 1:
            if allow_others:
                continue
            return None
        aff = affs[0]
        coefficients = [aff.get_coefficient_val(isl.dim_type.in_, d).to_python() for d in range(len(statement.indices))]
        params = [
            aff.get_coefficient_val(isl.dim_type.param, d).to_python() for d in range(aff.dim(isl.dim_type.param))
        ]
        nonzero = [d for d, c in enumerate(coefficients) if c != 0]
        if len(nonzero) != 1 or coefficients[nonzero[0]] != 1 or any(params):
            if allow_others:
                continue
            return None
        found[statement.name] = statement.indices[nonzero[0]]
    return found


def _collect_bands(node: isl.ScheduleNode, found: list[isl.ScheduleNode]) -> None:
    if node.get_type() == _BAND:
        found.append(node)
    for position in range(node.n_children()):
        _collect_bands(node.child(position), found)


def _band_properties(band: isl.MultiUnionPwAff, deps: isl.UnionMap) -> tuple[bool, list[bool]]:
    """Whether a band over one statement is permutable (``deps`` have no negative distance on
    any member) and which members are coincident (zero distance where the earlier members agree)."""
    n = band.dim(isl.dim_type.set)
    schedule = isl.UnionMap.from_multi_union_pw_aff(band)
    distances = deps.apply_domain(schedule).apply_range(schedule).deltas()
    if distances.is_empty():
        return True, [True] * n
    (distance_set,) = sets(distances)
    zero = isl.Val.zero(distance_set.get_ctx())
    permutable = all(_every(distance_set, member, ">= 0") for member in range(n))
    coincident = []
    earlier_equal = distance_set
    for member in range(n):
        coincident.append(_every(earlier_equal, member, "= 0"))
        earlier_equal = earlier_equal.fix_val(isl.dim_type.set, member, zero)
    return permutable, coincident


def _every(distances: isl.Set, member: int, condition: str) -> bool:
    """Whether coordinate ``member`` of every point of ``distances`` satisfies ``condition``."""
    n = distances.dim(isl.dim_type.set)
    params = ", ".join(distances.get_dim_name(isl.dim_type.param, p) for p in range(distances.dim(isl.dim_type.param)))
    names = ", ".join(f"x{d}" for d in range(n))
    bound = isl.Set.read_from_str(distances.get_ctx(), f"[{params}] -> {{ [{names}] : x{member} {condition} }}")
    return distances.is_subset(bound)
