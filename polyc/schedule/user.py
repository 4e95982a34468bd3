"""Schedules users write: checking them against the dependences, and the tree code is generated from.

A user's schedule is a union map from statement instances to time vectors (isl text such as
``"{ S0[m, n, r_k] -> [m, n, K - r_k]; S0_init[m, n] -> [m, n, 0] }"``, an ``isl.UnionMap`` or
an ``isl.Schedule``), as Polly's JSCoP files and PPCG's ``--load-schedule`` take them.  Time
vectors of different lengths are compared as if the shorter were padded with zeros at the end.

It is *legal* when every dependence runs its source strictly before its sink.  A reduction
(``+``, ``*``, ``min``, ``max`` updates of an accumulator) may run its updates of one element in
any order, as polyc's own vectorised and parallel reductions do: the dependences among those
updates are then dropped, while a statement that reads the reduced element must wait for every
update of it (not only for the one that was last in source order).  ``strict=True`` keeps the
source order of the updates too (floating-point sums are then bit-for-bit polyc's).

:func:`user_schedule` checks a schedule and builds the tree code is generated from: one band per
time dimension, a member *coincident* (a parallel loop) exactly when no dependence is carried
at that dimension; :func:`polyc.schedule.transform.optimize_schedule` then marks it as it marks
the scheduler's trees (it tiles no band of one member and reorders none).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from polyc.errors import IllegalScheduleError, PolycError
from polyc.ir.dependences import Dependences
from polyc.ir.model import PolyProgram, PolyStatement

#: The dependence kinds a schedule is checked against, in the order violations are reported.
KINDS = ("flow", "anti", "output", "reduction")


@dataclass(frozen=True)
class Violation:
    """A dependence a schedule breaks, at concrete sizes: ``source`` should run before ``sink``."""

    kind: str
    source: str  # statement name
    source_instance: dict
    sink: str
    sink_instance: dict
    element: str  # the element they share, e.g. "A(2, 3)"
    distance: tuple[int, ...]  # sink minus source, when both are instances of one statement

    def describe(self) -> str:
        def instance(name: str, values: dict) -> str:
            return f"{name}({', '.join(f'{k}={v}' for k, v in values.items())})"

        return (
            f"{instance(self.source, self.source_instance)} -> {instance(self.sink, self.sink_instance)} "
            f"through {self.element}"
        )


@dataclass(frozen=True)
class UserSchedule:
    """A checked schedule: its ``relation`` (instances -> time vectors of one length), the
    dependences it must respect per kind (``required``), those it breaks (``violations``, with
    witnesses; ``violated``: every such pair, at every size) and the dependences that decide
    which loops run in parallel (``parallel_dependences``: reductions included)."""

    relation: isl.UnionMap
    required: dict
    violations: tuple[Violation, ...]
    violated: isl.UnionMap
    parallel_dependences: Dependences

    @property
    def legal(self) -> bool:
        return not self.violations


def schedule_relation(program: PolyProgram, schedule) -> isl.UnionMap:
    """``schedule`` (isl text, an isl.UnionMap or an isl.Schedule) as a union map over
    ``program``'s parameters, every time vector padded with zeros to the longest one."""
    if isinstance(schedule, isl.Schedule):
        schedule = schedule.get_map()
    try:
        relation = isl.UnionMap.read_from_str(program.ctx, str(schedule))
    except isl.Error as error:
        raise PolycError(f"the schedule is not an isl union map: {str(schedule)!r} ({error})") from error
    relation = relation.align_params(program.context.get_space())
    maps: list[isl.Map] = []
    relation.foreach_map(maps.append)
    known = {s.name for s in program.statements}
    for relation_map in maps:
        name = relation_map.get_tuple_name(isl.dim_type.in_)
        if name not in known:
            raise PolycError(
                f"the schedule times {name!r}, which is no statement of {program.definition.name}; "
                f"the statements are {', '.join(sorted(known))}"
            )
    length = max((m.dim(isl.dim_type.out) for m in maps), default=0)
    padded = isl.UnionMap.empty(relation.get_space())
    for relation_map in maps:
        extra = length - relation_map.dim(isl.dim_type.out)
        relation_map = relation_map.reset_tuple_id(isl.dim_type.out).add_dims(isl.dim_type.out, extra)
        for position in range(length - extra, length):
            relation_map = relation_map.fix_val(isl.dim_type.out, position, isl.Val.zero(program.ctx))
        padded = padded.union(isl.UnionMap.from_map(relation_map))
    return padded


def reorderable_reductions(program: PolyProgram) -> list[PolyStatement]:
    """The updates whose order among themselves does not matter: every update's operator
    (``+``, ``*``, ``min``, ``max``) is associative and commutative, unless its right-hand side
    reads the accumulator's tensor itself."""
    return [
        s
        for s in program.statements
        if s.kind == "update" and not any(a.read is not None and a.tensor == s.source.target for a in s.reads)
    ]


def required_dependences(program: PolyProgram, dependences: Dependences, strict: bool = False) -> dict:
    """Per kind (:data:`KINDS`), the dependences a schedule must respect (see the module docstring)."""
    reduction = dependences.reduction
    flow = dependences.flow
    kept_reduction = reduction
    if not strict:
        for statement in reorderable_reductions(program):
            flow = flow.union(_after_every_update(statement, dependences))
            kept_reduction = kept_reduction.subtract_domain(isl.UnionSet.from_set(statement.domain))
    return {
        "flow": flow.subtract(reduction),
        "anti": dependences.anti.subtract(reduction),
        "output": dependences.output.subtract(reduction),
        "reduction": kept_reduction,
    }


def _after_every_update(statement: PolyStatement, dependences: Dependences) -> isl.UnionMap:
    """The flow dependences out of ``statement`` (a reduction) from every update of the element,
    not only from the last one in source order: reordered, any update may be the last."""
    same_element = statement.write.apply_range(statement.write.reverse())
    leaving = dependences.flow.intersect_domain(isl.UnionSet.from_set(statement.domain)).subtract(dependences.reduction)
    return isl.UnionMap.from_map(same_element).apply_range(leaving)


def check_user_schedule(
    program: PolyProgram,
    dependences: Dependences,
    schedule,
    sizes: dict | None = None,
    strict: bool = False,
) -> UserSchedule:
    """Check ``schedule`` against ``dependences``.  It must time every instance (at ``sizes``
    when given, else at every size the program's context allows); a schedule that does not, or
    that is not isl text, is a PolycError.  Violations are found at every size and witnessed at
    ``sizes`` when given (at some size otherwise)."""
    relation = schedule_relation(program, schedule)
    params = parameter_values(program, sizes) if sizes else None
    missing = program.domain.subtract(relation.domain())
    if params is not None:
        missing = missing.intersect_params(params)
    if not missing.is_empty():
        at = f" at {', '.join(f'{k}={v}' for k, v in sizes.items())}" if sizes and params is not None else ""
        raise PolycError(f"the schedule gives no time to some statement instances{at}: {missing.coalesce()}")
    relation = relation.intersect_domain(program.domain)
    if not relation.is_single_valued():
        raise PolycError(f"the schedule gives some statement instance more than one time: {relation}")
    required = required_dependences(program, dependences, strict)
    violations = []
    violated = isl.UnionMap.empty(dependences.flow.get_space())
    for kind in KINDS:
        deps = required[kind]
        times = deps.apply_domain(relation).apply_range(relation)
        bad_times = times.subtract(lex_lt_pairs(times))
        if bad_times.is_empty():
            continue
        bad = deps.intersect(relation.apply_range(bad_times).apply_range(relation.reverse()))
        violated = violated.union(bad)
        if params is not None:
            bad = bad.intersect_params(params)
        if not bad.is_empty():
            violations.append(_witness(program, kind, bad))
    flow = required["flow"].union(dependences.flow)
    parallel = Dependences(flow, dependences.anti, dependences.output, dependences.reduction)
    return UserSchedule(relation, required, tuple(violations), violated, parallel)


def user_schedule(
    program: PolyProgram, dependences: Dependences, schedule, sizes: dict | None = None
) -> tuple[isl.Schedule, Dependences]:
    """The tree of a legal ``schedule`` of ``program`` and the dependences its loops' parallelism
    is decided by (for :func:`~polyc.schedule.transform.optimize_schedule`); an illegal one is an
    :class:`~polyc.errors.IllegalScheduleError` naming the violated dependence and a witness pair."""
    checked = check_user_schedule(program, dependences, schedule, sizes)
    if not checked.legal:
        raise IllegalScheduleError(
            f"{program.definition.name}: the schedule {str(schedule)!r} violates "
            + "; ".join(f"a {v.kind} dependence: {v.describe()}" for v in checked.violations)
            + (f" (at {', '.join(f'{k}={v}' for k, v in sizes.items())})" if sizes else "")
            + " (the sink would run first or at the same time)",
            violations=checked.violations,
        )
    return schedule_tree(program, checked.relation, checked.parallel_dependences), checked.parallel_dependences


def schedule_tree(program: PolyProgram, relation: isl.UnionMap, dependences: Dependences) -> isl.Schedule:
    """A tree running ``program``'s instances in the order of ``relation`` (one length of time
    vector): one band of one member per time dimension, coincident where no dependence of
    ``dependences`` is carried (its source and sink equal in the outer dimensions, not in this)."""
    domain = program.domain
    node = isl.Schedule.from_domain(domain).get_root().child(0)
    maps: list[isl.Map] = []
    relation.foreach_map(maps.append)
    length = maps[0].dim(isl.dim_type.out) if maps else 0
    if length == 0:
        return node.get_schedule()
    node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(relation))
    carried = _carried_dimensions(relation, dependences.all, length)
    for position in range(length):
        node = node.band_set_permutable(0).band_member_set_coincident(0, position not in carried)
        if position + 1 < length:
            node = node.band_split(1).child(0)
    return node.get_schedule()


def _carried_dimensions(relation: isl.UnionMap, dependences: isl.UnionMap, length: int) -> set[int]:
    """The time dimensions at which some dependence is carried under ``relation``."""
    times = dependences.apply_domain(relation).apply_range(relation)
    carried = set()
    pairs: list[isl.Map] = []
    times.foreach_map(pairs.append)
    for pair in pairs:
        prefix_equal = pair
        for position in range(length):
            equal_here = prefix_equal.equate(isl.dim_type.in_, position, isl.dim_type.out, position)
            if not prefix_equal.subtract(equal_here).is_empty():
                carried.add(position)
            prefix_equal = equal_here
    return carried


def lex_lt_pairs(times: isl.UnionMap) -> isl.UnionMap:
    """The pairs of ``times`` whose first time vector is lexicographically before the second."""
    result = isl.UnionMap.empty(times.get_space())
    maps: list[isl.Map] = []
    times.foreach_map(maps.append)
    for relation in maps:
        if relation.dim(isl.dim_type.in_) != relation.dim(isl.dim_type.out):
            continue
        space = relation.get_space().domain()
        earlier = isl.Map.lex_lt(space).intersect_domain(relation.domain()).intersect_range(relation.range())
        result = result.union(isl.UnionMap.from_map(relation.intersect(earlier)))
    return result


def _witness(program: PolyProgram, kind: str, bad: isl.UnionMap) -> Violation:
    maps: list[isl.Map] = []
    bad.foreach_map(maps.append)
    point = maps[0].wrap().sample_point()
    n_in, n_out = maps[0].dim(isl.dim_type.in_), maps[0].dim(isl.dim_type.out)
    values = [point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(n_in + n_out)]
    source = program.statement(maps[0].get_tuple_name(isl.dim_type.in_))
    sink = program.statement(maps[0].get_tuple_name(isl.dim_type.out))
    element = written_element(sink, values[n_in:]) if kind == "anti" else written_element(source, values[:n_in])
    distance = tuple(b - a for a, b in zip(values[:n_in], values[n_in:])) if source is sink else ()
    return Violation(
        kind,
        source.name,
        dict(zip(source.indices, values[:n_in])),
        sink.name,
        dict(zip(sink.indices, values[n_in:])),
        element,
        distance,
    )


def written_element(statement: PolyStatement, values) -> str:
    """The element ``statement`` writes at the instance ``values``."""
    access = statement.write
    fixed = access
    for i, value in enumerate(values):
        fixed = fixed.fix_input_si(i, value)
    point = fixed.range().sample_point()
    tensor = access.get_tuple_name(isl.dim_type.out)
    count = access.dim(isl.dim_type.out)
    coordinates = [point.get_coordinate_val(isl.dim_type.set, i).to_python() for i in range(count)]
    return f"{tensor}({', '.join(map(str, coordinates))})"


def parameter_values(program: PolyProgram, sizes: dict) -> isl.Set | None:
    """The parameter set fixing ``program``'s sizes to ``sizes`` (None: no size is given)."""
    if not program.params:
        return None
    names = ", ".join(program.params)
    constraints = " and ".join(f"{p} = {int(sizes[p])}" for p in program.params if p in sizes)
    return isl.Set(f"[{names}] -> {{ : {constraints} }}", context=program.ctx) if constraints else None
