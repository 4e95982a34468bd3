"""Every notebook in notebooks/ runs top to bottom (nbclient, a real Jupyter kernel), and its
static HTML export (nbconvert) opens in headless Chromium without JavaScript errors, with every
interactive view drawn: not blank, redrawn when dragged, tile hulls drawn when ticked, and
stepping when played.

``POLYC_SCREENSHOT_DIR=dir`` keeps the screenshots (one PNG per view) for a look by eye.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.browser import headless_browser, inked_fraction, javascript_errors

nbformat = pytest.importorskip("nbformat", reason="nbformat, nbclient and ipykernel are in the test extra")
nbclient = pytest.importorskip("nbclient", reason="nbformat, nbclient and ipykernel are in the test extra")
pytest.importorskip("ipykernel", reason="nbformat, nbclient and ipykernel are in the test extra")
pytest.importorskip("matplotlib")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
# Views and what marks them as drawn (their scripts set the attribute once wired and drawn).
VIEW_SELECTORS = (".polyc-view", ".polyc-tree")
# Notebooks whose pictures are all static (SVG figures and HTML tables), with no view to drag.
STATIC_ONLY = {"onnx.ipynb", "gpu_mapping.ipynb"}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """name -> the executed notebook; each runs once, in a scratch copy of notebooks/ so the
    files it writes stay out of the checkout."""
    workdir = tmp_path_factory.mktemp("notebooks")
    cache: dict = {}

    def run(name):
        if name not in cache:
            shutil.copy(NOTEBOOKS / name, workdir / name)
            notebook = nbformat.read(workdir / name, as_version=4)
            nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                    resources={"metadata": {"path": str(workdir)}}).execute()
            cache[name] = notebook
        return cache[name]
    return run


def test_the_notebooks_are_there():
    expected = {"quickstart.ipynb", "visual_tour.ipynb", "onnx.ipynb", "user_schedule.ipynb", "gpu_mapping.ipynb"}
    assert expected <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, executed):
    notebook = executed(name)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert code_cells and all(c.execution_count for c in code_cells)
    errors = [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    assert not errors
    # Rich displays made it into the notebook: HTML views, tables, SVG pictures.
    kinds = {key for c in code_cells for o in c.outputs for key in o.get("data", {})}
    assert "text/html" in kinds


def _export(notebook, path: Path) -> Path:
    from nbconvert import HTMLExporter
    # The export links require.js and MathJax from a CDN, which a machine without the internet
    # cannot load (a console error that is not the page's); the views need neither.
    exporter = HTMLExporter(mathjax_url="data:text/javascript,", require_js_url="data:text/javascript,")
    body, _ = exporter.from_notebook_node(notebook)
    path.write_text(body, encoding="utf-8")
    return path


def _wait_drawn(driver, roots, seconds=15.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if all(root.get_attribute("data-polyc-drawn") == "1" for root in roots):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("name", NAMES)
def test_exported_html_in_a_browser(name, executed, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    page = _export(executed(name), tmp_path / (Path(name).stem + ".html"))
    keep = os.environ.get("POLYC_SCREENSHOT_DIR")
    with headless_browser() as driver:
        driver.get(page.as_uri())
        roots = driver.find_elements(By.CSS_SELECTOR, ", ".join(VIEW_SELECTORS))
        assert _wait_drawn(driver, roots), "a view's script did not finish drawing"
        assert javascript_errors(driver) == []
        views = driver.find_elements(By.CSS_SELECTOR, ".polyc-view")
        trees = driver.find_elements(By.CSS_SELECTOR, ".polyc-tree")
        assert views or trees or name in STATIC_ONLY
        for number, picture in enumerate(driver.find_elements(By.CSS_SELECTOR, ".jp-RenderedSVG img")):
            driver.execute_script("arguments[0].scrollIntoView();", picture)
            assert driver.execute_script("return arguments[0].naturalWidth", picture) > 0, f"SVG {number} of {name}"
            shot = picture.screenshot_as_png
            assert inked_fraction(shot) > 0.01, f"SVG picture {number} of {name} is blank"
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"{Path(name).stem}-svg{number}.png").write_bytes(shot)
        for number, view in enumerate(views):
            canvas = view.find_element(By.TAG_NAME, "canvas")
            driver.execute_script("arguments[0].scrollIntoView();", canvas)
            before = canvas.screenshot_as_png
            assert inked_fraction(before) > 0.01, f"view {number} of {name} is blank"
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                (Path(keep) / f"{Path(name).stem}-view{number}.png").write_bytes(before)
            # Dragging rotates (3-D) or at least redraws the same points (2-D).
            ActionChains(driver).move_to_element(canvas).click_and_hold().move_by_offset(60, 25).release().perform()
            after = canvas.screenshot_as_png
            assert inked_fraction(after) > 0.01
            hulls = view.find_elements(By.CSS_SELECTOR, '[data-role="hulls"]')
            if hulls:   # the compiled schedule's tiles, drawn as hulls around their points
                plain = canvas.screenshot_as_png
                hulls[0].click()
                assert canvas.screenshot_as_png != plain and inked_fraction(canvas.screenshot_as_png) > 0.01
            step = view.find_element(By.CSS_SELECTOR, '[data-role="step"]')
            total = int(step.get_attribute("max"))
            view.find_element(By.CSS_SELECTOR, '[data-role="play"]').click()
            time.sleep(0.5)
            assert 0 < int(step.get_attribute("value")) <= total
            assert "instances run" in view.find_element(By.CSS_SELECTOR, '[data-role="step-text"]').text
        for number, tree in enumerate(trees):
            driver.execute_script("arguments[0].scrollIntoView();", tree)
            shot = tree.screenshot_as_png
            assert inked_fraction(shot) > 0.01, f"schedule tree {number} of {name} is blank"
            if keep:
                (Path(keep) / f"{Path(name).stem}-tree{number}.png").write_bytes(shot)
        assert javascript_errors(driver) == []
