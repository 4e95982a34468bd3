"""``python -m benchmarks.tuning_search`` end to end on a tiny kernel whose space is already in
its table (with made-up times), so nothing is compiled or timed: the table is read, the
reference is computed, and both strategies are replayed from the table.  The figures the
benchmark prints need a whole measured space; this checks only that the command runs."""
from __future__ import annotations

import json

import numpy as np

import polyc
from benchmarks import tuning_search
from polyc.runtime.arguments import bind_arguments
from polyc.tune import search

SGEMM = "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


def test_the_search_comparison_replays_a_measured_table(tmp_path, monkeypatch):
    shapes = {"A": (24, 16), "B": (16, 20)}
    monkeypatch.setattr(tuning_search, "KERNELS", {"sgemm 24": (SGEMM, "sgemm", shapes)})
    kernel = polyc.define(SGEMM, tuning=False).sgemm
    inputs = [np.zeros(shape, np.float32) for shape in shapes.values()]
    call = bind_arguments(kernel.definition, tuple(inputs))
    space = search.space_for(kernel.definition, call.sizes, kernel.options)
    # Made-up times: the configuration numbered 7 is the fastest, the others 1 to 3 ms.
    rng = np.random.default_rng(0)
    measured = {space.identity(config): {"status": "ok", "seconds": 1e-3 * (1 + 2 * rng.random())}
                for config in space.configs()}
    best = sorted(measured)[7]
    measured[best]["seconds"] = 1e-4
    table, results = tmp_path / "tables.json", tmp_path / "search.json"
    table.write_text(json.dumps({"machine": polyc.tune.this_machine().id, "kernels": {"sgemm 24": measured}}))

    assert tuning_search.main(["--trials", "12", "--seeds", "2", "--table", str(table), "--json", str(results)]) == 0
    entry = json.loads(results.read_text())["kernels"]["sgemm 24"]
    assert entry["space_size"] == len(measured) and entry["best_seconds"] == 1e-4
    assert entry["configs_within_5pc"] == 1 and entry["trials"] == 12 and entry["seeds"] == 2
    assert set(entry["trials_to_95"]) == {"random", "model"}
    assert all(len(curve) == 12 for runs in entry["curves"].values() for curve in runs)
