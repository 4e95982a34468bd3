"""The ONNX zoo benchmark without torch: its model list agrees with the export script's, a
model whose export fails becomes a row with its error (the run goes on and writes its JSON),
and the benchmarks page renders a zoo results file with its geometric means."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from benchmarks import onnx_zoo

REPO = Path(__file__).resolve().parent.parent


def test_the_zoo_lists_the_export_scripts_models():
    tree = ast.parse(onnx_zoo.EXPORT_SCRIPT.read_text())
    zoo = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and "ZOO" in [getattr(t, "id", None) for t in getattr(node, "targets", [getattr(node, "target", None)])]
    )
    assert tuple(ast.literal_eval(key) for key in zoo.keys) == onnx_zoo.MODELS
    assert set(onnx_zoo.QUICK) <= set(onnx_zoo.MODELS)


def test_a_failed_export_is_a_row_with_its_error(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("POLYC_ZOO_CACHE", str(tmp_path / "zoo"))
    output = tmp_path / "zoo.json"
    no_torch = sys.executable + "-that-does-not-exist"
    arguments = ["--models", "resnet34,lstm_lm", "--batch", "1", "--torch-python", no_torch, "--json", str(output)]
    assert onnx_zoo.main(arguments) == 0
    results = json.loads(output.read_text())
    assert results["benchmark"] == "onnx_zoo" and results["machine"]["cpu"]
    assert [(row["model"], row["batch"]) for row in results["rows"]] == [("resnet34", 1), ("lstm_lm", 1)]
    assert all(row["error"].startswith(f"export: cannot run {no_torch}") for row in results["rows"])
    assert results["summary"]["geomean_ort_over_polyc"] is None and len(results["summary"]["failures"]) == 2
    assert "ERROR" in capsys.readouterr().out


def test_the_benchmarks_page_renders_a_zoo_file(tmp_path):
    sys.path.insert(0, str(REPO / "docs"))
    import generate_benchmarks

    rows = [
        {"model": "resnet34", "batch": 1, "polyc": 0.02, "ort": 0.01, "match": True, "cold_compile": 20.0},
        {"model": "lstm_lm", "batch": 1, "polyc": 0.01, "ort": 0.02, "match": True, "time_by_first_op": {"LSTM": 0.9}},
        {"model": "swin_t", "batch": 1, "error": "polyc: UnsupportedError: Roll"},
    ]
    data = {"benchmark": "onnx_zoo", "machine": {"cpu": "AMD EPYC Zen 5"}, "rows": rows}
    data["summary"] = onnx_zoo.summary(rows)
    assert data["summary"]["geomean_ort_over_polyc"] == pytest.approx(1.0)
    (tmp_path / "onnx_zoo.json").write_text(json.dumps(data))
    page = generate_benchmarks.render(tmp_path)
    assert "`python -m benchmarks.onnx_zoo`" in page and "AMD EPYC Zen 5" in page
    assert "| resnet34 | 1 | 20 | 10 | 0.50x | 20.0 |" in page
    assert "error: polyc: UnsupportedError: Roll" in page and "LSTM 90%" in page
    assert "| **geometric mean** (2 rows) |" in page
