"""The README's main job runs and agrees with numpy (the notebooks: tests/notebooks)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_run_examples_main_job(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location("run_examples", ROOT / "examples" / "run_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "speed vs numpy" in out
    assert out.count(" ok") == 5 and "MISMATCH" not in out
