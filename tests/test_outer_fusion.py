"""The outer-loop fusion (:mod:`polyc.schedule.outer_fusion`) against a straightforward search.

The fusion checks a child of a sequence only against the run before it (the dependences that
touch the child, its own statements' accesses) and pairs instances with ``eq_at`` rather than
with "same point" relations, so that its work grows with the statement count.  Here every
multi-statement def of the kernel corpus is fused both so and by a reference search that checks
each candidate run as a whole with those relations formed explicitly (quadratic, fine for small
defs): the two must give the same schedule, and it must respect every dependence.
"""

from __future__ import annotations

import islpy as isl
import kernels
import pytest

from polyc.driver import Analysis, analyse
from polyc.ir.model import build_program
from polyc.lang.parser import parse
from polyc.lang.sema import check_def
from polyc.schedule import outer_fusion

# Found by the OpenCL tests: S0 reads B(j, l, i), its outer index i in B's last subscript with
# j and l, so S0 must not start a run that S1 (whose accesses are fine) joins.
SPREAD = """
def spread(float(M, 2) A, float(N, 4, N) B) -> (O, T) {
    T(i, k, j, l, r_a) = A(r_a, k) + B(j, l, i)
    O(i, j, k, l) +=! T(i, k, j, l, r_a)
}"""


def _same(schedule: isl.UnionMap) -> isl.UnionMap:
    """Pairs of instances that ``schedule`` maps to the same point."""
    return schedule.apply_range(schedule.reverse())


class _ReferenceFuser(outer_fusion._Fuser):
    """The fuser with a run search that checks every candidate run whole: its statements'
    accesses, and its dependences within one point of the sequence's prefix against the relation
    "same point of the run's outer loop"."""

    def runs(self, sequence: isl.ScheduleNode) -> list[list[int]]:
        same_prefix = _same(sequence.get_prefix_schedule_union_map())
        runs: list[list[int]] = []
        for position in range(sequence.n_children()):
            if runs and self._fusable(sequence, runs[-1] + [position], same_prefix):
                runs[-1].append(position)
            else:
                runs.append([position])
        return runs

    def _fusable(self, sequence: isl.ScheduleNode, run: list[int], same_prefix: isl.UnionMap) -> bool:
        outer = self.outer_loop(sequence, run)
        if outer is None:
            return False
        domain = outer_fusion._run_domain(sequence, run)
        deps = self.dependences.intersect_domain(domain).intersect_range(domain).intersect(same_prefix)
        return deps.is_subset(_same(isl.UnionMap.from_union_pw_aff(outer.schedule))) and self.keeps_locality(outer)


def _cases() -> list[tuple[str, str, str, dict[str, int] | None]]:
    """(name, source, def, sizes) of the corpus's defs of two or more statements, and SPREAD."""
    found = [("spread", SPREAD, "spread", {"M": 8, "N": 4})]
    for case in kernels.KERNELS:
        (tree,) = [d for d in parse(case.source).defs if d.name == case.entry]
        if len(tree.statements) > 1:
            found.append((case.name, case.source, case.entry, dict(case.size_sets[0]) if case.size_sets else None))
    return found


def _analysis(source: str, entry: str, fusion: str) -> Analysis:
    (tree,) = [d for d in parse(source).defs if d.name == entry]
    return analyse(check_def(tree, source), fusion)


def _respects(schedule: isl.Schedule, dependences: isl.UnionMap) -> bool:
    """Whether ``schedule`` runs the source of every dependence among its instances before the
    target."""
    order = schedule.get_map()
    domain = schedule.get_domain()
    deps = dependences.intersect_domain(domain).intersect_range(domain)
    return deps.is_subset(order.lex_lt_union_map(order))


@pytest.mark.parametrize("fusion", ["smart", "max"])
@pytest.mark.parametrize(("name", "source", "entry", "sizes"), _cases(), ids=[case[0] for case in _cases()])
def test_outer_fusion_decides_as_a_whole_run_search(name, source, entry, sizes, fusion, monkeypatch):
    analysis = _analysis(source, entry, fusion)
    programs = [analysis.program]
    if sizes is not None:
        (tree,) = [d for d in parse(source).defs if d.name == entry]
        programs.append(build_program(check_def(tree, source), sizes, ctx=analysis.program.ctx))
    for program in programs:
        fused = outer_fusion.fuse_outer_loops(analysis.schedule, program, analysis.dependences, {})
        with monkeypatch.context() as patch:
            patch.setattr(outer_fusion, "_Fuser", _ReferenceFuser)
            expected = outer_fusion.fuse_outer_loops(analysis.schedule, program, analysis.dependences, {})
        assert fused.get_root().to_str() == expected.get_root().to_str(), program.size_values
        assert _respects(fused, analysis.dependences.all), program.size_values


def test_a_run_starts_only_at_a_child_whose_accesses_keep_their_locality():
    analysis = _analysis(SPREAD, "spread", "smart")
    program = build_program(analysis.program.definition, {"M": 8, "N": 4}, ctx=analysis.program.ctx)
    fused = outer_fusion.fuse_outer_loops(analysis.schedule, program, analysis.dependences, {})
    assert fused is analysis.schedule


def _nodes(node: isl.ScheduleNode) -> list[isl.ScheduleNode]:
    return [node] + [found for c in range(node.n_children()) for found in _nodes(node.child(c))]


@pytest.mark.parametrize("name", ["spread", "softmax", "layernorm", "mlp2", "batchnorm_train"])
def test_equal_at_pairs_the_instances_a_prefix_maps_to_one_point(name):
    # A prefix of no member (a node under no band) has an explicit domain: every pair of
    # instances reaching the node is at one point of it, none is dropped.
    source, entry = (SPREAD, "spread") if name == "spread" else (kernels.CASES[name].source, kernels.CASES[name].entry)
    analysis = _analysis(source, entry, "smart")
    fused = outer_fusion.fuse_outer_loops(analysis.schedule, analysis.program, analysis.dependences, {})
    for schedule in (analysis.schedule, fused):
        for node in _nodes(schedule.get_root()):
            domain = node.get_domain()
            deps = analysis.dependences.all.intersect_domain(domain).intersect_range(domain)
            paired = outer_fusion._equal_at(deps, node.get_prefix_schedule_multi_union_pw_aff(), [])
            assert paired.is_equal(deps.intersect(_same(node.get_prefix_schedule_union_map()))), node.get_type()
