"""The pictures of every notebook kernel (notebooks/*.ipynb) at three sizes, opened in headless
Chromium (issue 84): none is blank, none draws more than ``ARROWS_PER_100_POINTS`` arrows per
100 points, and the axes are named after the indices with ticks that are the index values of
the points drawn at them (the static plot's SVG and the interactive view's canvas alike).

``POLYC_SCREENSHOT_DIR=dir`` keeps the screenshots for a look by eye.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.browser import headless_browser, inked_fraction, javascript_errors

pytest.importorskip("matplotlib")

import polyc  # noqa: E402
import polyc.viz  # noqa: E402
from polyc.viz.instances import ARROWS_PER_100_POINTS  # noqa: E402

MM = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
SHIFTED = """def shifted(float(N) A) -> (C) {
    B(i) = A(i) * 2 where i in 0:N
    C(i) = B(i + 1) + B(i) where i in 0:N-1
}"""
STENCIL = """def stencil(float(N, M) A) -> (C) {
    B(i, j) = A(i, j) * 2 where i in 0:N, j in 0:M
    C(i, j) = B(i + 1, j) + B(i, j + 1) + B(i, j) where i in 0:N-1, j in 0:M-1
}"""
# The onnx notebook's softmax, written in TC (its kernel comes from an ONNX model there).
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
    M(n) max=! X(n, r_d)
    S(n) +=! exp(X(n, r_d) - M(n))
    Y(n, d) = exp(X(n, d) - M(n)) / S(n)
}"""
WAVEFRONT = "[N, M] -> { S0[i, j] -> [i + j, j, 0]; S1[i, j] -> [i + j + 2, j, 1] }"
IN_ORDER = "[N, M] -> { S0[i, j] -> [i, j, 0]; S1[i, j] -> [i, j, 1] }"  # violates C's reads
UNSHIFTED = "[N] -> { S0[i] -> [i, 0]; S1[i] -> [i, 1] }"  # the visual tour's: C(i) reads B(i + 1)


def _pictures():
    """(name, size -> picture) of each picture the notebooks draw."""
    rowsum = polyc.define("def rowsum(float(N, M) A) -> (B) { B(i) +=! A(i, r_j) }").rowsum
    mm2 = polyc.define(MM, blas_contractions=False, loop_tiles=(2, 2, 2)).mm
    mm4 = polyc.define(MM, blas_contractions=False, loop_tiles=(4, 4, 4)).mm
    apart = polyc.define(SHIFTED, fusion="min").shifted
    fused = polyc.define(SHIFTED, fusion="max").shifted
    stencil = polyc.define(STENCIL, fusion="max").stencil
    softmax = polyc.define(SOFTMAX).softmax

    def square(n):
        return {"N": n, "M": n}

    return [
        ("rowsum", lambda n: polyc.viz.plot_domain(rowsum, {"N": n, "M": n + 2}, kinds=("reduction",))),
        ("mm-view", lambda n: polyc.viz.view_domain(mm2, {"M": n, "K": n - 1, "N": n // 2 + 1})),
        ("mm-tiles", lambda n: polyc.viz.plot_domain(mm4, {"M": n, "K": n, "N": n}, dims=("m", "r_k"), tiles=True)),
        ("mm-order", lambda n: polyc.viz.plot_domain(mm2, {"M": n, "K": n, "N": n}, dims=("m", "r_k"), order=True)),
        ("apart", lambda n: polyc.viz.plot_domain(apart, {"N": n}, order=True)),
        ("fused", lambda n: polyc.viz.plot_domain(fused, {"N": n}, order=True)),
        ("fused-check", lambda n: fused.check_schedule(UNSHIFTED, {"N": n}).plot({"N": n})),
        ("stencil-check", lambda n: stencil.check_schedule(IN_ORDER, square(n)).plot(square(n))),
        ("stencil-wavefront", lambda n: stencil.check_schedule(WAVEFRONT, square(n)).view(square(n))),
        ("softmax", lambda n: polyc.viz.plot_domain(softmax, {"N": n, "D": n + 3}, statements=["S1"])),
    ]


SIZES = (4, 8, 16)
PICTURES = [(name, size) for name, _ in _pictures() for size in SIZES]


@pytest.fixture(scope="module")
def browser():
    with headless_browser(1400, 1800) as driver:
        yield driver


@pytest.fixture(scope="module")
def makers():
    return dict(_pictures())


def _point_count(instances) -> int:
    return sum(len(s.shown_points()) for s in instances.statements)


def _index_values_under_ticks(positions: dict, statements, axis: int, ticks) -> None:
    """Every tick's label is the index value of the points drawn at its position."""
    by_name = {s.name: s for s in statements}
    labels = dict(ticks)
    for (name, point), coordinates in positions.items():
        s = by_name[name]
        axes = list(dict.fromkeys(s.dims))
        if axis >= len(axes):
            continue
        value = point[axes[axis]]
        assert int(coordinates[axis]) == value, (name, point, coordinates)
        assert labels.get(float(value), str(value)) == str(value)


def _keep(png: bytes, name: str) -> None:
    keep = os.environ.get("POLYC_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / name).write_bytes(png)


@pytest.mark.parametrize(("name", "size"), PICTURES, ids=[f"{n}-{s}" for n, s in PICTURES])
def test_picture_is_readable(name, size, makers, browser, tmp_path):
    from selenium.webdriver.common.by import By

    picture = makers[name](size)
    instances = picture.instances
    points = _point_count(instances)
    arrows = len(picture.arrows) if hasattr(picture, "figure") else len(picture.data()["arrows"])
    assert points and arrows <= ARROWS_PER_100_POINTS * points / 100, f"{arrows} arrows for {points} points"
    if hasattr(picture, "figure"):  # the static plot, as an SVG image in a page
        axes = picture.figure.axes[0]
        assert [t.get_text() for t in axes.get_xticklabels()] == [label for _, label in picture.ticks]
        _index_values_under_ticks(picture.positions, picture.statements, 0, picture.ticks)
        index_names = {s.indices[s.dims[0]] for s in picture.statements}
        assert set(axes.get_xlabel().split(" / ")) == index_names
        if not picture.flat:
            ticks = list(zip(axes.get_yticks(), (t.get_text() for t in axes.get_yticklabels())))
            _index_values_under_ticks(picture.positions, picture.statements, 1, ticks)
            assert axes.get_ylabel()
        picture.save(tmp_path / "plot.svg")
        page = tmp_path / "plot.html"
        page.write_text('<!DOCTYPE html><html><body style="margin:0"><img id="plot" src="plot.svg"></body></html>')
        browser.get(page.as_uri())
        image = browser.find_element(By.ID, "plot")
        deadline = time.time() + 10
        while time.time() < deadline and not browser.execute_script("return arguments[0].complete", image):
            time.sleep(0.05)
        assert browser.execute_script("return arguments[0].naturalWidth", image) > 100
        shot = image.screenshot_as_png
    else:  # the interactive view
        data = picture.data()
        for axis, ticks in enumerate(data["ticks"]):
            _index_values_under_ticks(
                {key: coordinates for key, coordinates in zip(_keys(instances), (p["c"] for p in data["points"]))},
                instances.statements,
                axis,
                [tuple(t) for t in ticks],
            )
        picture.save(tmp_path / "view.html")
        browser.get((tmp_path / "view.html").as_uri())
        root = browser.find_element(By.CSS_SELECTOR, ".polyc-view")
        deadline = time.time() + 10
        while time.time() < deadline and root.get_attribute("data-polyc-drawn") != "1":
            time.sleep(0.05)
        assert root.get_attribute("data-polyc-drawn") == "1"
        import json

        drawn = json.loads(root.get_attribute("data-polyc-ticks"))
        assert drawn == [[label for _, label in axis] for axis in data["ticks"]]
        assert [name for name in data["axisNames"] if name]
        shot = root.find_element(By.TAG_NAME, "canvas").screenshot_as_png
    assert javascript_errors(browser) == []
    _keep(shot, f"{name}-{size}.png")
    assert inked_fraction(shot) > 0.01, f"{name} at {size} is blank"


def _keys(instances):
    """The (statement, point) of each point of a view's data, in its order."""
    return [(s.name, p) for s in instances.statements for p in s.shown_points()]


BMM = "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, r_k) * Y(b, r_k, n) }"


@pytest.mark.parametrize(
    "name",
    ["mm-256-generic", "mm-256-gemm", "bmm-flattened"],
)
def test_large_and_flattened_pictures_render(name, browser, tmp_path):
    """A 256 x 256 matmul's picture (aggregated: blocks with counts, on the generic and the gemm
    path) and a batched matmul's over its flattened M and N, opened in Chromium: not blank, the
    ticks integer index values inside the drawn range, the title saying what is drawn."""
    from selenium.webdriver.common.by import By

    sizes = {"M": 256, "N": 256, "K": 256}
    if name == "mm-256-generic":
        picture = polyc.viz.plot_domain(polyc.define(MM, blas_contractions=False).mm, sizes, order=True)
        assert "drawn aggregated in blocks of 16 x 16" in picture.title
    elif name == "mm-256-gemm":
        picture = polyc.viz.plot_domain(polyc.define(MM, gemm_blocks=(64, 128, 64)).mm, sizes, tiles=True)
        assert "the gemm kernel's cache blocks" in picture.title
    else:
        kernel = polyc.define(BMM, gemm_blocks=(6, 16, 4)).bmm
        picture = polyc.viz.plot_domain(kernel, {"B": 2, "M": 12, "K": 4, "N": 40}, tiles=True)
        assert "drawn over the flattened index groups" in picture.title
        assert picture.instances.tile and picture.arrows == []
    axes = picture.figure.axes[0]
    for labels, limit in ((axes.get_xticklabels(), 255), (axes.get_yticklabels(), 255)):
        values = [int(t.get_text()) for t in labels]
        assert values and values == sorted(values) and 0 <= values[0] and values[-1] <= limit
    picture.save(tmp_path / "plot.svg")
    page = tmp_path / "plot.html"
    page.write_text('<!DOCTYPE html><html><body style="margin:0"><img id="plot" src="plot.svg"></body></html>')
    browser.get(page.as_uri())
    image = browser.find_element(By.ID, "plot")
    deadline = time.time() + 10
    while time.time() < deadline and not browser.execute_script("return arguments[0].complete", image):
        time.sleep(0.05)
    assert browser.execute_script("return arguments[0].naturalWidth", image) > 100
    shot = image.screenshot_as_png
    assert javascript_errors(browser) == []
    _keep(shot, f"{name}.png")
    assert inked_fraction(shot) > 0.01, f"{name} is blank"
