"""Sphinx configuration of polyc's documentation.

Build it from the repository root (CI does, with warnings as errors):

    pip install '.[docs]'
    python -m sphinx -W -b html docs docs/_build/html
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # document the checkout's polyc, not an older installed copy
sys.path.insert(0, str(DOCS))

import generate_benchmarks  # noqa: E402

import polyc  # noqa: E402

# Generated at every build, not committed: the benchmarks page from benchmarks/results/*.json and
# the gallery's copies of notebooks/*.ipynb (Sphinx reads sources only under docs/).
generate_benchmarks.write(DOCS / "benchmarks.md")
(DOCS / "notebooks").mkdir(exist_ok=True)
for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    target = DOCS / "notebooks" / notebook.name
    if not target.exists() or target.read_bytes() != notebook.read_bytes():
        shutil.copyfile(notebook, target)

project = "polyc"
author = "the polyc developers"
copyright = "2026, the polyc developers"
release = polyc.__version__
version = release

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**.ipynb_checkpoints"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}

# The notebooks are not executed here: the test suite runs them (tests/notebooks), and CI's time counts.
nb_execution_mode = "off"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

html_theme = "furo"
html_title = f"polyc {release}"
html_static_path = ["_static"]
html_css_files = ["tables.css"]
