"""``python -m benchmarks.tuning_search`` end to end on a tiny kernel whose space is already in
its table (with made-up times), so nothing is compiled or timed: the table is read, its fastest configurations "confirmed"
(at their table times), the reference is computed, and both strategies are replayed from the
table.  The figures the
benchmark prints need a whole measured space; this checks only that the command runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import polyc
from benchmarks import tuning_search
from polyc.runtime.arguments import bind_arguments
from polyc.runtime.compiler import CompilerOptions
from polyc.tuning import search

SGEMM = "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"


def test_the_search_comparison_replays_a_measured_table(tmp_path, monkeypatch):
    shapes = {"A": (24, 16), "B": (16, 20)}
    monkeypatch.setattr(tuning_search, "KERNELS", {"sgemm 24": (SGEMM, "sgemm", shapes)})
    kernel = polyc.define(SGEMM, tuning=False).sgemm
    inputs = [np.zeros(shape, np.float32) for shape in shapes.values()]
    call = bind_arguments(kernel.definition, tuple(inputs))
    space = search.space_for(kernel.definition, call.sizes, kernel.options)
    # Made-up times: the configuration numbered 7 is the fastest, the others 1 to 3 ms, each
    # with the kernel's own build timed after it at 1 ms (the machine's speed then).
    rng = np.random.default_rng(0)
    measured = {
        space.identity(config): {"status": "ok", "seconds": 1e-3 * (1 + 2 * rng.random()), "baseline_seconds": 1e-3}
        for config in space.configs()
    }
    best = sorted(measured)[7]
    measured[best]["seconds"] = 1e-4
    base = dataclasses.asdict(kernel.options)

    def confirm(jobs, _inputs, rounds=None):
        # Confirmed while the machine runs at half speed: every time doubled, the kernel's own
        # build (the last job) included, so the times come back to the table's scale.
        assert tuning_search.table_key(jobs[-1]["options"], base) == "{}"
        return [
            {"status": "ok", "seconds": 2 * measured[tuning_search.table_key(job["options"], base)]["seconds"]}
            for job in jobs[:-1]
        ] + [{"status": "ok", "seconds": 2e-3}]

    monkeypatch.setattr(search, "confirm_candidates", confirm)
    table, results = tmp_path / "tables.json", tmp_path / "search.json"
    table.write_text(
        json.dumps({"machine": polyc.tuning.this_machine().id, "cflags": _flags(), "kernels": {"sgemm 24": measured}})
    )

    assert tuning_search.main(["--trials", "12", "--seeds", "2", "--table", str(table), "--json", str(results)]) == 0
    entry = json.loads(results.read_text())["kernels"]["sgemm 24"]
    assert entry["space_size"] == len(measured) and entry["best_seconds"] == 1e-4
    assert entry["configs_within_5pc"] == 1 and entry["trials"] == 12 and entry["seeds"] == 2
    assert set(entry["trials_to_95"]) == {"random", "model"}
    assert all(len(curve) == 12 for runs in entry["curves"].values() for curve in runs)
    confirmed = json.loads(table.read_text())["kernels"]["sgemm 24"]
    assert sum("confirmed_seconds" in e for e in confirmed.values()) == min(tuning_search.CONFIRMED, len(measured))
    assert confirmed[best]["confirmed_seconds"] == 1e-4


def _flags() -> str:
    return " ".join(CompilerOptions().flags)


def test_a_table_measured_with_other_compiler_flags_is_measured_again(tmp_path, monkeypatch):
    """Times of code built with other flags ($POLYC_CFLAGS: AVX2 code on an AVX-512 machine)
    belong to another table: the run starts a new one, as for another machine.  Without flags
    recorded, a table is one of polyc's default flags."""
    shapes = {"A": (24, 16), "B": (16, 20)}
    monkeypatch.setattr(tuning_search, "KERNELS", {"sgemm 24": (SGEMM, "sgemm", shapes)})
    seen = []

    class Stop(Exception):
        pass

    def measure_space(_kernel, _inputs, table, _path, tables):
        seen.append((dict(table), tables.get("cflags")))
        raise Stop

    monkeypatch.setattr(tuning_search, "_measure_space", measure_space)
    table = tmp_path / "tables.json"
    machine = polyc.tuning.this_machine().id
    for recorded, reused in (
        ({"cflags": _flags() + " -O1"}, False),
        ({}, _flags() == tuning_search.DEFAULT_FLAGS),
        ({"cflags": _flags()}, True),
    ):
        table.write_text(json.dumps({"machine": machine, **recorded, "kernels": {"sgemm 24": {"c": {"seconds": 1}}}}))
        with pytest.raises(Stop):
            tuning_search.main(["--table", str(table), "--json", str(tmp_path / "search.json")])
        assert seen[-1] == ({"c": {"seconds": 1}} if reused else {}, _flags())


def test_the_replay_reads_each_configuration_its_own_time():
    """Every knob of a space, the loop order and the thread count included, is part of the key
    a replayed candidate's time is read under (a replay that dropped some read another's)."""
    source = "def sym(float(N, N) A) -> (B) { B(i, j) = 0.5 * (A(i, j) + A(j, i)) }"
    kernel = polyc.define(source, tuning=False).sym
    call = bind_arguments(kernel.definition, (np.zeros((64, 64), np.float32),))
    space = search.space_for(kernel.definition, call.sizes, kernel.options)
    assert "loop_order" in {knob.name for knob in space.knobs}
    base = dataclasses.asdict(kernel.options.replace(tuning=False))
    for config in space.configs():
        options = {**base, **space.options(config)}
        assert tuning_search.table_key(options, base) == space.identity(config)


def test_times_are_corrected_for_the_machines_speed_when_they_were_taken():
    """A configuration timed in a minute when the machine ran twice as fast as usual (the
    kernel's own build, timed right after it, took half its usual time) counts at twice its
    timing; failed configurations have no time to correct."""
    table = {
        "fast minute": {"status": "ok", "seconds": 1.0, "baseline_seconds": 1.0},
        "usual": {"status": "ok", "seconds": 1.0, "baseline_seconds": 2.0},
        "slower": {"status": "ok", "seconds": 3.0, "baseline_seconds": 2.0},
        "failed": {"status": "error", "message": "", "baseline_seconds": 2.0},
        "measured before baselines": {"status": "ok", "seconds": 5.0},
    }
    assert tuning_search._correct_drift(table, set(table)) == 2.0
    assert [tuning_search._seconds(table[k]) for k in ("fast minute", "usual", "slower")] == [2.0, 1.0, 3.0]
    assert "corrected_seconds" not in table["failed"]
    assert tuning_search._seconds(table["measured before baselines"]) == 5.0
