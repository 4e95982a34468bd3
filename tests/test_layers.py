"""polyc's layers import one way (the import-linter contracts in pyproject.toml): they hold for
the code as it is, and a deliberate upward import breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    """import-linter on the polyc package under ``tree``, with ``tree``'s pyproject.toml."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layers_import_one_way():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(
    "module, statement, broken",
    [
        ("polyc/lang/upward.py", "from polyc.driver import Stages\n", "polyc.lang.upward -> polyc.driver"),
        ("polyc/codegen/upward.py", "def later():\n    import polyc.api\n", "polyc.codegen.upward -> polyc.api"),
        ("polyc/options_upward.py", "", None),
    ],
    ids=["lang-imports-driver", "codegen-imports-api-in-a-function", "a-new-shared-module"],
)
def test_an_upward_import_breaks_the_contract(tmp_path, module, statement, broken):
    shutil.copytree(ROOT / "polyc", tmp_path / "polyc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / module).write_text(statement)
    result = lint_imports(tmp_path)
    if broken is None:  # the control: a module that imports nothing keeps the contracts
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode != 0 and broken in result.stdout, result.stdout + result.stderr
