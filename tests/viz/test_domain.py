"""polyc.viz.plot_domain: the plotted points are isl's points of the domain, the arrows are the
dependence pairs, the numbers are the compiled schedule's order; pictures save as SVG and PNG."""

from __future__ import annotations

import islpy as isl
import pytest

pytest.importorskip("matplotlib")

import polyc  # noqa: E402
from polyc.viz import plot_domain  # noqa: E402
from polyc.viz.domain import tile_colour  # noqa: E402
from polyc.viz.instances import ARROWS_PER_100_POINTS, thin  # noqa: E402
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


STENCIL = """def stencil(float(N, M) A) -> (C) {
    B(i, j) = A(i, j) * 2 where i in 0:N, j in 0:M
    C(i, j) = B(i + 1, j) + B(i, j + 1) + B(i, j) where i in 1:N-1, j in 0:M-1
}"""


def test_ticks_are_the_index_values_of_the_points_under_them():
    # Before issue 84 each statement was shifted to start at 0 beside the one before while the
    # ticks kept counting positions: C's i = 1 stood under a tick reading 9.
    kernel = polyc.define(STENCIL, fusion="max").stencil
    plot = plot_domain(kernel, {"N": 8, "M": 6})
    labels = dict(plot.ticks)
    for statement in plot.statements:
        for point in statement.shown_points():
            x, y = plot.positions[(statement.name, point)]
            i, j = point
            assert int(x) == i and int(y) == j  # nudged by less than one step
            if float(i) in labels:
                assert labels[float(i)] == str(i)
    axes = plot.figure.axes[0]
    assert [t.get_text() for t in axes.get_xticklabels()] == [label for _, label in plot.ticks]
    assert all(float(t).is_integer() for t in axes.get_yticks())


def test_reduction_arrows_are_the_nearest_pairs():
    # The reduction relation holds every earlier r_j to every later one (15 pairs a row here);
    # the picture draws the chain r_j -> r_j + 1, which orders them the same.
    kernel = polyc.define("def rowsum(float(N, M) A) -> (B) { B(i) +=! A(i, r_j) }").rowsum
    plot = plot_domain(kernel, {"N": 4, "M": 6}, kinds=("reduction",))
    assert sorted(plot.arrows) == sorted(
        ("reduction", "S0", (i, r), "S0", (i, r + 1)) for i in range(4) for r in range(5)
    )


def test_a_violated_stencil_draws_short_arrows_within_the_limit():
    # The stencil's two statements side by side made every arrow cross the picture: the
    # violated view was a solid red band.  Now each arrow joins neighbouring index values.
    kernel = polyc.define(STENCIL, fusion="max").stencil
    sizes = {"N": 8, "M": 8}
    check = kernel.check_schedule("[N, M] -> { S0[i, j] -> [i, j, 0]; S1[i, j] -> [i, j, 1] }", sizes)
    plot = check.plot(sizes)
    assert plot.instances.violated  # C(i, j) reads B(i + 1, j) and B(i, j + 1), run later
    for _, source, a, sink, b in plot.arrows:
        (x0, y0), (x1, y1) = plot.positions[(source, a)], plot.positions[(sink, b)]
        assert abs(x1 - x0) <= 1.5 and abs(y1 - y0) <= 1.5
    assert len(plot.arrows) <= ARROWS_PER_100_POINTS * plot.instances.point_count / 100


def test_violations_of_an_initialisation_are_drawn():
    # The init after the sum: before issue 84 the legend said "violated" and nothing was drawn,
    # as `!` initialisations are left out of the picture.
    kernel = polyc.define(MATMUL, blas_contractions=False).mm
    sizes = {"M": 3, "K": 4, "N": 2}
    check = kernel.check_schedule("[M, N, K] -> { S0[m, n, r_k] -> [m, n, r_k]; S0_init[m, n] -> [m, n, K] }", sizes)
    plot = check.plot(sizes, dims=("m", "r_k"))
    assert [s.name for s in plot.statements] == ["S0", "S0_init"]
    drawn = {(a[1], a[3]) for a in plot.arrows if a[1:] in plot.instances.violated}
    assert drawn == {("S0_init", "S0")}
    for _, source, a, sink, b in plot.arrows:
        assert (source, a) in plot.positions and (sink, b) in plot.positions
    assert plot.instances.violated_elsewhere > 0  # n = 1 is not in the slice
    assert plot.figure.axes  # draws


def test_many_arrows_are_thinned_keeping_every_class():
    arrows = [("flow", "S0", (i,), "S1", (i + d,)) for d in (0, 1, 2) for i in range(100)]
    kept = thin(arrows, 100, keep={("S0", (7,), "S1", (9,))})
    assert len(kept) <= ARROWS_PER_100_POINTS
    assert {a[4][0] - a[2][0] for a in kept} == {0, 1, 2}  # every distance still shown
    assert ("flow", "S0", (7,), "S1", (9,)) in kept  # a violated pair is kept first


def test_tiles_have_distinct_colours_from_their_neighbours():
    for t0 in range(4):
        for t1 in range(4):
            for step in ((1, 0), (0, 1), (1, 1), (1, -1)):
                assert tile_colour((t0, t1)) != tile_colour((t0 + step[0], t1 + step[1]))


def test_a_dense_picture_is_thinned_and_says_so():
    # Five reads a point: 180 nearest arrows over 100 points, more than the limit allows.
    kernel = polyc.define(
        """def five(float(N, M) A) -> (C) {
        B(i, j) = A(i, j) * 2 where i in 0:N, j in 0:M
        C(i, j) = B(i - 1, j) + B(i + 1, j) + B(i, j - 1) + B(i, j + 1) + B(i, j) where i in 1:N-1, j in 1:M-1
    }"""
    ).five
    plot = plot_domain(kernel, {"N": 8, "M": 8})
    instances = plot.instances
    assert instances.point_count == 100 and instances.nearest_arrows == 180
    assert len(plot.arrows) <= ARROWS_PER_100_POINTS and instances.thinned
    distances = {tuple(y - x for x, y in zip(a, b)) for _, _, a, _, b in plot.arrows}
    assert distances == {(1, 0), (-1, 0), (0, 1), (0, -1), (0, 0)}  # every read still drawn
    assert "of 180 nearest dependences drawn" in plot.figure.texts[0].get_text()


# ----------------------------------------------------------------------------- large and grouped
BIG_MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


def test_a_slice_of_more_than_max_points_is_drawn_aggregated_in_blocks_with_counts():
    from polyc.viz.instances import CELLS_PER_AXIS, MAX_POINTS

    kernel = polyc.define(BIG_MM, blas_contractions=False).mm
    plot = plot_domain(kernel, {"M": 256, "N": 256, "K": 256}, tiles=True, order=True)
    (s0,) = plot.statements
    assert s0.aggregated and s0.count == 256 * 256 > MAX_POINTS and s0.fixed == {"r_k": 0}
    assert s0.cell_sizes == (256 // CELLS_PER_AXIS,) * 2 and len(s0.cells) == CELLS_PER_AXIS**2
    assert sum(s0.cells.values()) == s0.count and set(s0.cells.values()) == {16 * 16}
    assert "S0: 65536 instances at r_k=0, more than 20000: drawn aggregated in blocks of 16 x 16" in plot.title
    assert plot.instances.order == {} and plot.instances.tile == {} and plot.arrows == []
    axes = plot.figure.axes[0]
    assert len(axes.patches) == CELLS_PER_AXIS**2 and "256" in {t.get_text() for t in axes.texts}
    labels = [int(t.get_text()) for t in axes.get_xticklabels()]
    assert labels[0] == 0 and labels[-1] <= 255 and labels == sorted(labels)


def test_the_interactive_view_refuses_a_slice_too_large_naming_plot_domain():
    from polyc.viz import view_domain

    kernel = polyc.define(BIG_MM, blas_contractions=False).mm
    with pytest.raises(
        polyc.PolycError, match="524288 instances in the slice drawn, more than 20000.*plot_domain draws it aggregated"
    ):
        view_domain(kernel, {"M": 256, "N": 256, "K": 8})


def test_on_the_gemm_path_the_blocks_of_a_large_picture_are_the_cache_blocks():
    from polyc.paths import gemm as gemm_path

    kernel = polyc.define(BIG_MM, gemm_blocks=(64, 128, 64)).mm
    sizes = {"M": 256, "N": 256, "K": 256}
    blocks = gemm_path.cache_blocks(kernel.stages(sizes))
    plot = plot_domain(kernel, sizes, tiles=True)
    (s0,) = plot.statements
    assert s0.cell_sizes == (blocks["mc"], blocks["nc"]) and "the gemm kernel's cache blocks" in plot.title
    mc, nc = blocks["mc"], blocks["nc"]
    assert s0.cells == {
        (i, j): (min(256, (i + 1) * mc) - i * mc) * (min(256, (j + 1) * nc) - j * nc)
        for i in range(-(-256 // mc))
        for j in range(-(-256 // nc))
    }


def test_a_batched_contraction_on_the_gemm_path_is_drawn_over_flattened_m_and_n():
    from polyc.paths import gemm as gemm_path

    source = "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, r_k) * Y(b, r_k, n) }"
    kernel = polyc.define(source, gemm_blocks=(6, 16, 4)).bmm
    sizes = {"B": 2, "M": 12, "K": 4, "N": 40}
    stages = kernel.stages(sizes)
    assert stages.path == "gemm" and stages.contraction.batch == ("b",)
    blocks = gemm_path.cache_blocks(stages)
    plot = plot_domain(kernel, sizes, tiles=True)
    (s0,) = plot.statements
    assert s0.indices == ("M=(m)", "N=(n)") and s0.fixed == {"b": 0, "r_k": 0}
    assert "drawn over the flattened index groups" in plot.title and "at b = lowest" in plot.title
    assert sorted(s0.shown_points()) == [(m, n) for m in range(12) for n in range(40)]
    for (_, (m, n)), tile in plot.instances.tile.items():
        assert tile == (m // blocks["mc"], n // blocks["nc"])
    assert plot.figure.axes[0].get_xlabel() == "M=(m)"


def test_a_two_index_m_group_is_flattened_row_major_as_the_kernel_flattens_it():
    from polyc.paths import gemm as gemm_path

    source = "def mm2(float(P, Q, K) A, float(K, N) B) -> (C) { C(p, q, n) +=! A(p, q, r_k) * B(r_k, n) }"
    kernel = polyc.define(source, gemm_blocks=(6, 16, 4)).mm2
    sizes = {"P": 3, "Q": 5, "K": 8, "N": 20}
    stages = kernel.stages(sizes)
    assert stages.path == "gemm" and stages.contraction.m == ("p", "q")
    blocks = gemm_path.cache_blocks(stages)
    plot = plot_domain(kernel, sizes, tiles=True)
    (s0,) = plot.statements
    assert s0.indices == ("M=(p, q)", "N=(n)")
    assert sorted(s0.shown_points()) == [(p * 5 + q, n) for p in range(3) for q in range(5) for n in range(20)]
    assert {tile for tile in plot.instances.tile.values()} == {
        (m // blocks["mc"], n // blocks["nc"]) for m in range(15) for n in range(20)
    }
    assert "M = (p, q) and N = (n) flattened row-major" in plot.title
