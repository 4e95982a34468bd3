"""The README's main job and the notebook run and agree with numpy."""
import importlib.util
import json
from pathlib import Path

import numpy as np

from kernels import assert_close

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


def test_quickstart_notebook_cells_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    notebook = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())
    namespace: dict = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            exec(compile(source, "quickstart.ipynb", "exec"), namespace)
    assert namespace["O"].shape == (64, 32)
    # The last cell prints the kernel's largest error against numpy; it must be within TC's
    # tolerance for the K + 1 operations (the reduction, then the bias) of each element.
    I, W, bias, O = (namespace[name] for name in ("I", "W", "bias", "O"))
    printed_error = float(capsys.readouterr().out.split()[-1])
    expected = np.maximum(I.astype(np.float64) @ W + bias, 0)
    assert np.float32(printed_error) == np.abs(O - np.maximum(I @ W + bias, 0)).max()
    assert_close(O, expected, W.shape[0] + 1, np.float32, (I, W, bias))
    assert printed_error <= (W.shape[0] + 1) * np.finfo(np.float32).eps * max(np.abs(x).max() for x in (I, W, bias))
