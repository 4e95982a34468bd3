"""The schedule on the points: tiles, parallel iterations and a user's schedule with the
dependences it violates, in the static plot and in the interactive view's data, each checked
against isl's relations and polyc's own band decisions."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import islpy as isl
import pytest

pytest.importorskip("matplotlib")

import polyc  # noqa: E402
from polyc.schedule.register_tiling import lex_before  # noqa: E402
from polyc.viz import plot_domain, view_domain  # noqa: E402
from tests.viz.sources import MATMUL, SHIFTED  # noqa: E402

SIZES = {"M": 6, "K": 5, "N": 4}


@pytest.fixture(scope="module")
def tiled():
    return polyc.define(MATMUL, blas_contractions=False, loop_tiles=(4, 2, 4)).mm


def test_tiles_are_the_band_values_divided_by_the_tile_sizes(tiled):
    plot = plot_domain(tiled, SIZES, dims=("m", "r_k"), fixed={"n": 2}, tiles=True)
    instances = plot.instances
    decision = next(d for d in tiled.stages(SIZES).decisions if d.tile_sizes)
    assert instances.tile_sizes == decision.tile_sizes == (4, 2, 4)
    (statement,) = instances.statements
    for point in statement.shown_points():
        m, n, r_k = point
        assert instances.tile[("S0", point)] == (m // 4, n // 2, r_k // 4)
    # Only the arrows joining two tiles are drawn; every one of them does.
    crossing = [a for a in instances.arrows if instances.crosses_tiles(a)]
    assert plot.arrows == crossing and 0 < len(crossing) < len(instances.arrows)
    for _, _source, a, _sink, b in plot.arrows:
        assert a[2] // 4 != b[2] // 4  # the reduction crosses tiles along r_k only here


def test_parallel_iterations_follow_the_parallel_tile_loop(tiled):
    instances = plot_domain(tiled, SIZES, dims=("m", "n"), parallel=True).instances
    assert instances.parallel_loop == "m (tiles of 4)"
    assert {instances.parallel[key] for key in instances.parallel} == {0, 1}
    for (_name, point), iteration in instances.parallel.items():
        assert iteration == point[0] // 4


def test_order_is_the_compiled_schedules(tiled):
    instances = plot_domain(tiled, {"M": 3, "K": 3, "N": 2}, dims=("m", "r_k"), order=True).instances
    schedule = tiled.stages({"M": 3, "K": 3, "N": 2}).optimized_schedule.get_map()
    ranked = sorted(instances.order, key=instances.order.get)
    # Consecutive instances in the order: the schedule maps the earlier one lexicographically first.
    for before, after in zip(ranked, ranked[1:]):
        pair = isl.UnionMap.read_from_str(schedule.get_ctx(), f"{{ S0{list(before[1])} -> S0{list(after[1])} }}")
        times = pair.apply_domain(schedule).apply_range(schedule)
        assert not times.is_empty()
        time = isl.Map.from_union_map(times)
        assert time.is_subset(lex_before(time.get_space()))


def test_a_violating_schedule_is_drawn_with_its_violated_pairs():
    kernel = polyc.define(SHIFTED, fusion="max").shifted
    check = kernel.check_schedule("[N] -> { S0[i] -> [i, 0]; S1[i] -> [i, 1] }", {"N": 6})
    assert not check.valid
    plot = check.plot({"N": 6})
    # C(i) reads B(i + 1): each of those five flow pairs runs sink-first in the user's schedule.
    assert plot.instances.violated == {("S0", (i + 1,), "S1", (i,)) for i in range(5)}
    assert plot.instances.schedule_source == "user" and not plot.instances.tile
    assert plot.order[("S1", (0,))] == 1 and plot.order[("S0", (1,))] == 2
    good = kernel.check_schedule("[N] -> { S0[i] -> [i, 0]; S1[i] -> [i + 1, 1] }", {"N": 6})
    assert good.valid and good.plot({"N": 6}).instances.violated == set()
    data = check.view({"N": 6}).data()
    assert sum(a[4] for a in data["arrows"]) == 5


def test_view_data_and_html(tiled, tmp_path):
    view = view_domain(tiled, SIZES)
    data = view.data()
    stages = tiled.stages(SIZES)
    assert data["dims"] == 3 and len(data["points"]) == stages.program.statement("S0").domain.count_val().to_python()
    assert {tuple(p["c"]) for p in data["points"]} == {(m, n, k) for m in range(6) for n in range(4) for k in range(5)}
    assert sorted(p["order"] for p in data["points"]) == list(range(120))
    assert len(data["arrows"]) == len(view.instances.arrows) == 6 * 4 * 4  # r_k to r_k + 1
    page = view.html()
    parser = HTMLParser()
    parser.feed(page)
    embedded = re.search(r'<script type="application/json" data-role="data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(embedded) == json.loads(json.dumps(data))
    assert len({re.search(r'id="(polyc-view-[^"]+)"', view.html()).group(1) for _ in range(3)}) == 3
    view.save(tmp_path / "v.html")
    assert (tmp_path / "v.html").read_text().startswith("<!DOCTYPE html>")


def test_two_statements_in_rows_at_their_index_values_in_the_view():
    kernel = polyc.define(SHIFTED, fusion="max").shifted
    data = view_domain(kernel, {"N": 5}).data()
    s0 = sorted(p["c"] for p in data["points"] if p["s"] == 0)
    s1 = sorted(p["c"] for p in data["points"] if p["s"] == 1)
    assert s0 == [[i, 0] for i in range(5)] and s1 == [[i, -1] for i in range(4)]  # one row each
    assert data["ticks"][0] == [[float(i), str(i)] for i in range(5)] and data["ticks"][1] == []
    assert all(a[0] == "flow" for a in data["arrows"]) and len(data["arrows"]) == 8


def test_view_ticks_are_the_index_values():
    kernel = polyc.define(
        """def stencil(float(N, M) A) -> (C) {
        B(i, j) = A(i, j) * 2 where i in 0:N, j in 0:M
        C(i, j) = B(i + 1, j) + B(i, j + 1) where i in 1:N-1, j in 0:M-1
    }""",
        fusion="max",
    ).stencil
    data = view_domain(kernel, {"N": 6, "M": 4}).data()
    labels = [dict((position, label) for position, label in axis) for axis in data["ticks"]]
    for point in data["points"]:
        values = [
            int(v)
            for v in point["label"]
            .split("(")[1]
            .rstrip(")")
            .replace(" ", "")
            .replace("i=", "")
            .replace("j=", "")
            .split(",")
        ]
        for d, (value, coordinate) in enumerate(zip(values, point["c"])):
            assert int(coordinate) == value  # nudged by less than a step
            assert labels[d].get(float(value), str(value)) == str(value)
    assert data["axisNames"] == ["i", "j"]


def test_bad_requests(tiled):
    with pytest.raises(polyc.PolycError, match="at most 3 dims"):
        view_domain(tiled, SIZES, dims=("m", "n", "r_k", "m"))
    with pytest.raises(polyc.PolycError, match="unknown dependence kind 'read'"):
        view_domain(tiled, SIZES, kinds=("read",))
    with pytest.raises(polyc.PolycError, match="fixed names q"):
        plot_domain(tiled, SIZES, fixed={"q": 1})
    with pytest.raises(polyc.PolycError, match="not an isl union map"):
        plot_domain(tiled, SIZES, schedule="{ S0[m, n, r_k] -> ")
