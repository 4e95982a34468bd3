"""polyc.viz.plot_gpu_mapping and block_footprints: each point's colour is the block the GPU
plan runs it on, its label the thread, the shared tiles the promoted boxes; the footprints are
the elements a block's instances touch, counted here again with numpy.  No GPU is needed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import polyc  # noqa: E402
from polyc.errors import PolycError  # noqa: E402
from polyc.viz import block_footprints, plot_gpu_mapping, tile_footprints  # noqa: E402
from polyc.viz.gpu import BLOCK_COLOURS  # noqa: E402
from tests.viz.sources import MATMUL  # noqa: E402

SIZES = {"M": 8, "N": 16, "K": 8}


def _matmul():
    # A named device and tiles: the mapping is the same on every machine (no device query).
    return polyc.define(MATMUL, backend="opencl", device="sm_80", block=(2, 2), gpu_tiles=(4, 4, 4)).mm


def _expected_ids(loop, value):
    """Block and thread of the member value ``value`` by the MappedLoop's own formula
    ``offset + span * (block + grid * round) + thread + block_size * register``."""
    relative = value - loop.offset
    return (relative // loop.span) % loop.grid, relative % loop.block


def test_colours_are_the_plans_blocks_and_labels_its_threads(tmp_path):
    kernel = _matmul()
    plot = plot_gpu_mapping(kernel, SIZES, fixed={"r_k": 3})
    (launch,) = kernel.gpu_stages(SIZES, "opencl").gpu.launches
    assert plot.grid == launch.grid == (4, 2) and plot.block == launch.block == (2, 2)
    assert plot.loops == {"x": "n", "y": "m"}
    assert "grid (4, 2)" in plot.title and "n -> x" in plot.title and "m -> y" in plot.title
    points = plot.statement.shown_points()
    assert len(points) == 8 * 16 and all(p[2] == 3 for p in points)
    position = {index: i for i, index in enumerate(plot.statement.indices)}
    for point in points:
        ids = [_expected_ids(loop, point[position[loop.indices["S0"]]]) for loop in launch.loops]
        assert plot.block_of[("S0", point)] == tuple(b for b, _ in ids)
        assert plot.thread_of[("S0", point)] == tuple(t for _, t in ids)
        linear = ids[0][0] + launch.grid[0] * ids[1][0]
        assert plot.colours[("S0", point)] == BLOCK_COLOURS[linear]
    # Eight blocks, eight colours.
    assert len(set(plot.colours.values())) == 8
    # Shared tiles: the promoted boxes, A's rows and B's columns of each block, slice 0 of r_k.
    promotion = launch.promotion
    assert promotion is not None and {t.tensor for t in plot.tiles} == {a.tensor for a in promotion.arrays}
    for tile in plot.tiles:
        bx, by = tile.block
        expected = (4 * by, 0) if tile.tensor == "A" else (0, 4 * bx)
        assert tile.low == expected and tile.sizes == (4, 4)
    plot.save(tmp_path / "mapping.png")
    assert plot._repr_svg_().lstrip().startswith("<?xml")


def test_footprints_match_a_numpy_count():
    kernel = _matmul()
    footprints = block_footprints(kernel, SIZES)
    (launch,) = kernel.gpu_stages(SIZES, "opencl").gpu.launches
    x, y = launch.loops
    M, N, K = SIZES["M"], SIZES["N"], SIZES["K"]
    masks: dict = {}
    for m in range(M):
        for n in range(N):
            block = (_expected_ids(x, n)[0], _expected_ids(y, m)[0])
            a, b, c = (
                masks.setdefault((block, t), np.zeros(shape, bool))
                for t, shape in (("A", (M, K)), ("B", (K, N)), ("C", (M, N)))
            )
            a[m, :] = True
            b[:, n] = True
            c[m, n] = True
    rows = {(row.tile, row.tensor): row for row in footprints.rows}
    assert set(rows) == set(masks)
    for (block, tensor), mask in masks.items():
        row = rows[block, tensor]
        assert row.elements == mask.sum()
        assert row.written == (mask.sum() if tensor == "C" else 0)
        for d, name in enumerate(("x+1", "y+1")):
            neighbour = tuple(v + (d == e) for e, v in enumerate(block))
            if (neighbour, tensor) in masks:
                assert row.shared[name] == (mask & masks[neighbour, tensor]).sum()
            else:
                assert name not in row.shared
    assert footprints.totals()["A"] == (8 * 4 * K, M * K)
    html = footprints._repr_html_()
    assert "<table>" in html and "shared with x+1" in html
    assert footprints.to_list()[0]["tensor"] == "A"


def test_a_reduction_over_one_block():
    kernel = polyc.define("def total(float(N) X) -> (Y) { Y() +=! X(r_i) }", backend="opencl", device="sm_80").total
    plot = plot_gpu_mapping(kernel, {"N": 8})
    (launch,) = kernel.gpu_stages({"N": 8}, "opencl").gpu.launches
    assert launch.reduction is not None
    # One block; its threads deal the reduction loop, each running r_i mod threads.
    assert set(plot.block_of.values()) == {(0,)}
    threads = launch.reduction.threads
    assert {p[0] % threads: t for (_, p), t in plot.thread_of.items()} == {i: (i,) for i in range(min(8, threads))}


def test_refusals():
    prefix = polyc.define(
        "def prefix(float(N) X) -> (Y) {\n Y(i) = X(i) where i in 0:1\n Y(i) = Y(i - 1) + X(i) where i in 1:N\n}",
        backend="opencl",
        device="sm_80",
    ).prefix
    with pytest.raises(PolycError, match="prefix has no GPU mapping.*one thread"):
        plot_gpu_mapping(prefix, {"N": 8})
    with pytest.raises(PolycError, match="no GPU mapping"):
        block_footprints(prefix, {"N": 8})
    with pytest.raises(PolycError, match="no statement S9"):
        plot_gpu_mapping(_matmul(), SIZES, statement="S9")
    with pytest.raises(PolycError, match="slice 5 out of range"):
        plot_gpu_mapping(_matmul(), SIZES, slice=5)


def test_cpu_tile_footprints_match_a_numpy_count():
    kernel = polyc.define(MATMUL, blas_contractions=False, loop_tiles=(4, 4, 4)).mm
    sizes = {"M": 8, "N": 8, "K": 8}
    footprints = tile_footprints(kernel, sizes)
    assert footprints.unit == "tile" and "tiles 4 x 4 x 4 of m, n, r_k" in footprints.where
    rows = {(row.tile, row.tensor): row for row in footprints.rows}
    tiles = [(a, b, c) for a in range(2) for b in range(2) for c in range(2)]

    def mask(tensor, tile):
        m, n, k = (slice(4 * t, 4 * t + 4) for t in tile)
        shape, where = {"A": ((8, 8), (m, k)), "B": ((8, 8), (k, n)), "C": ((8, 8), (m, n))}[tensor]
        result = np.zeros(shape, bool)
        result[where] = True
        return result

    assert set(rows) == {(t, tensor) for t in tiles for tensor in "ABC"}
    for tile in tiles:
        for tensor in "ABC":
            row = rows[tile, tensor]
            assert row.elements == mask(tensor, tile).sum() == 16
            for d, name in enumerate(("m+1", "n+1", "r_k+1")):
                neighbour = tuple(v + (d == e) for e, v in enumerate(tile))
                if neighbour in tiles:
                    assert row.shared[name] == (mask(tensor, tile) & mask(tensor, neighbour)).sum()
    with pytest.raises(PolycError, match="no tiled band"):
        tile_footprints(polyc.define(MATMUL, blas_contractions=False, loop_tiles=()).mm, sizes)
