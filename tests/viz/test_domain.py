"""polyc.viz.plot_domain: the plotted points are isl's points of the domain, the arrows are the
dependence pairs, the numbers are the compiled schedule's order; pictures save as SVG and PNG."""

from __future__ import annotations

import islpy as isl
import pytest

pytest.importorskip("matplotlib")

import polyc  # noqa: E402
from polyc.viz import plot_domain  # noqa: E402
from tests.viz.sources import MATMUL, SHIFTED  # noqa: E402


def test_points_are_the_domains_and_arrows_the_dependence_pairs(tmp_path):
    kernel = polyc.define(MATMUL, blas_contractions=False).mm
    sizes = {"M": 4, "K": 5, "N": 3}
    plot = plot_domain(kernel, sizes, dims=("m", "r_k"), fixed={"n": 1})
    (s0,) = plot.statements
    stages = kernel.stages(sizes)
    assert len(s0.points) == stages.program.statement("S0").domain.count_val().to_python() == 60
    assert s0.fixed == {"n": 1} and int(s0.shown.sum()) == 20
    # Arrows: the nearest reduction pairs inside the slice n = 1, r_k to r_k + 1 (C(m, 1)
    # accumulated over r_k; the relation holds every earlier r_k to every later one).
    assert sorted(plot.arrows) == sorted(
        ("reduction", "S0", (m, 1, k), "S0", (m, 1, k + 1)) for m in range(4) for k in range(4)
    )
    relation = stages.dependences.reduction
    for _kind, source, a, sink, b in plot.arrows:
        pair = isl.UnionMap.read_from_str(stages.program.ctx, f"{{ {source}{list(a)} -> {sink}{list(b)} }}")
        assert (
            pair.align_params(relation.get_space())
            .intersect_params(stages.program.context)
            .is_subset(relation.intersect_params(stages.program.context))
        )
    for name in ("d.svg", "d.png"):
        plot.save(tmp_path / name)
        assert (tmp_path / name).stat().st_size > 1000
    assert plot._repr_svg_().lstrip().startswith("<?xml")


def test_order_follows_the_fused_shifted_schedule():
    kernel = polyc.define(SHIFTED, fusion="max").shifted
    plot = plot_domain(kernel, {"N": 6}, order=True)
    assert [s.name for s in plot.statements] == ["S0", "S1"]
    assert {a[0] for a in plot.arrows} == {"flow"} and len(plot.arrows) == 10  # C(i) reads B(i) and B(i+1)
    order = plot.order
    for i in range(5):  # every C(i) runs after the B(i + 1) it reads
        assert order[("S1", (i,))] > order[("S0", (i + 1,))]
    assert sorted(order.values()) == list(range(11))


def test_bad_requests():
    kernel = polyc.define(MATMUL, blas_contractions=False).mm
    with pytest.raises(polyc.PolycError, match="no statement S9"):
        plot_domain(kernel, {"M": 2, "K": 2, "N": 2}, statements=["S9"])
    with pytest.raises(polyc.PolycError, match="no index q"):
        plot_domain(kernel, {"M": 2, "K": 2, "N": 2}, dims=("m", "q"))


def test_statements_of_one_and_two_indices_drawn_together(tmp_path):
    # S0 has one index, S1 two: S0 is drawn as a row at 0 beside S1 (an IndexError before issue 84).
    source = """def mixed(float(N, M) A, float(N) B) -> (S, T) {
        S(i) = B(i) * 2
        T(i, j) = A(i, j) + S(i)
    }"""
    kernel = polyc.define(source).mixed
    for options in ({}, {"order": True}, {"tiles": True}, {"parallel": True}):
        plot = plot_domain(kernel, {"N": 4, "M": 3}, **options)
        plot.save(tmp_path / "mixed.png")
    s0, s1 = plot.statements
    assert len(s0.shown_points()) == 4 and len(s1.shown_points()) == 12
    assert {a[1:4:2] for a in plot.arrows} == {("S0", "S1")}  # flow: S(i) -> T(i, j)
