"""The benchmark suite runs end to end: ``python -m benchmarks --quick`` on two tiny cases, one run
each, prints its table and writes JSON of the documented shape.  Not a performance test: no
timing is compared.  clang+Polly may be absent; its column is then skipped with a note.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_quick_mode_prints_the_table_and_writes_json(tmp_path):
    output = tmp_path / "results.json"
    # --keep-blas-env: tests leave OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as the machine sets them
    command = [
        sys.executable,
        "-m",
        "benchmarks",
        "--quick",
        "--filter",
        "^(sgemm|softmax) ",
        "--repeat",
        "1",
        "--keep-blas-env",
        "--json",
        str(output),
    ]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "polyc ms" in run.stdout and "Geometric means" in run.stdout
    assert "MISMATCH" not in run.stdout and "ERROR" not in run.stdout

    results = json.loads(output.read_text())
    assert results["settings"]["quick"] is True and results["settings"]["repeat"] == 1
    for key in ("machine", "environment", "blas", "toolchains", "notes", "summary"):
        assert key in results
    assert {"polyc", "gcc"} <= set(results["toolchains"])
    assert [(case["name"], case["size"]) for case in results["cases"]] == [
        ("sgemm", "128x128x128"),
        ("softmax", "256x512"),
    ]
    for case in results["cases"]:
        assert case["checks"]["polyc"]["ok"] and case["checks"]["numpy"]["ok"] and case["checks"]["gcc"]["ok"]
        assert not case["errors"]
        polyc_time = case["times"]["polyc"]
        assert len(polyc_time["runs"]) == 1 and polyc_time["median"] > 0
        assert case["ratios"]["numpy"] > 0 and case["ratios"]["gcc"] > 0
        assert case["compile_seconds"]["polyc"] > 0 and case["gflops"]["polyc"] > 0
        expected_columns = {"polyc", "numpy", "gcc"} | ({"einsum"} if case["name"] == "sgemm" else set())
        assert expected_columns <= set(case["times"])
    assert "sgemm" not in [c["name"] for c in results["cases"] if "einsum" not in c["times"]]
    summary = results["summary"]
    assert set(summary["geomean_ratios"]) == {"contraction", "normalization"}
    assert summary["geomean_ratios"]["contraction"]["numpy"] > 0
    assert summary["compile_seconds_median"]["polyc"] > 0
    assert summary["mismatches"] == []


def test_onnx_operators_benchmark_checks_and_writes_json(tmp_path):
    """``python -m benchmarks.onnx_ops --quick``: every case checked against onnxruntime, a row
    each, JSON with the medians."""
    import pytest

    pytest.importorskip("onnxruntime")
    output = tmp_path / "onnx_ops.json"
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.onnx_ops", "--quick", "--json", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "MISMATCH" not in run.stdout
    results = json.loads(output.read_text())
    names = [case["name"].split()[0] for case in results["cases"]]
    assert names == ["TopK", "TopK", "NonMaxSuppression", "NonZero", "CumSum"]
    for case in results["cases"]:
        assert case["ok"] and case["median"]["polyc"] > 0 and case["median"]["onnxruntime"] > 0


def test_the_blas_line_names_numpys_blas_when_scipy_brought_another():
    # scipy's wheels load an OpenBLAS of their own; listed first, it was once reported as numpy's.
    import numpy as np

    from benchmarks.run import blas_summary

    numpy_libs = Path(np.__file__).resolve().parent.with_name("numpy.libs")
    scipy_libs = Path(np.__file__).resolve().parent.with_name("scipy.libs")
    libraries = [
        {
            "user_api": "blas",
            "internal_api": "openblas",
            "version": "0.3.30",
            "architecture": "Haswell",
            "num_threads": 2,
            "filepath": str(scipy_libs / "libscipy_openblas.so"),
        },
        {
            "user_api": "blas",
            "internal_api": "openblas",
            "version": "0.3.31",
            "architecture": "SkylakeX",
            "num_threads": 2,
            "filepath": str(numpy_libs / "libscipy_openblas64_.so"),
        },
    ]
    assert blas_summary({"libraries": libraries}) == "openblas 0.3.31, kernel SkylakeX, 2 threads"
    # A BLAS installed outside numpy's directories (conda, Debian): the first listed.
    elsewhere = [dict(library, filepath=f"/usr/lib/libopenblas{n}.so") for n, library in enumerate(libraries)]
    assert blas_summary({"libraries": elsewhere}) == "openblas 0.3.30, kernel Haswell, 2 threads"


def test_integer_group_checks_exactly_and_writes_json(tmp_path):
    from benchmarks import integer_bench

    path = tmp_path / "integer.json"
    assert integer_bench.main(["--repeat", "3", "--shapes", "9x40x33", "--json", str(path)]) == 0
    results = json.loads(path.read_text())
    (row,) = results["rows"]
    assert results["benchmark"] == "integer_gemm" and row["integer_path"] == "integer_gemm"
    assert row["exact"]["polyc_int8"] and row["exact"]["polyc_int8_zero_point"]
    assert {"polyc_sgemm", "numpy_float32"} <= set(row["ratios"])


def test_generic_path_group_runs_both_paths_and_checks_them():
    from benchmarks import cases, generic_path

    results = generic_path.run_generic_cases(
        [cases.sgemm(64), generic_path.strided_conv3x3(1, 8, 8, 17, 17, 2)], repeat=3, max_seconds=2.0
    )
    assert results["benchmark"] == "generic_path"
    for row in results["rows"]:
        assert row["paths"]["generic"] == "generic" and row["paths"]["default"] != "generic", row["paths"]
        assert all(check["ok"] for check in row["checks"].values()), row["checks"]
        assert row["generic_over_default"] > 0


def test_export_benchmark_builds_runs_and_compares(tmp_path):
    """``python -m benchmarks.onnx_export`` on squeezenet1_1, one short round: the export built by
    make gives the session's outputs exactly, and the row holds the sizes and peaks."""
    import pytest

    pytest.importorskip("onnxruntime")
    output = tmp_path / "onnx_export.json"
    command = [sys.executable, "-m", "benchmarks.onnx_export", "--models", "squeezenet1_1"]
    run = subprocess.run(
        command + ["--repeat", "2", "--rounds", "1", "--json", str(output)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    (row,) = json.loads(output.read_text())["rows"]
    assert "error" not in row, row
    assert row["max_difference_to_session"] == 0.0
    assert row["max_difference_to_ort_relative"] < 1e-4
    assert row["arena_bytes"] > 0 and row["weights_bytes"] > 4_000_000 and row["objects_bytes"] > 0
    # the demo's peak is its own, not the benchmark process's (which imports onnxruntime and polyc)
    assert 0 < row["export_peak_rss_kib"] < row["onnxruntime_peak_rss_kib"]
