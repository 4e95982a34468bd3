"""polyc.tune: the search, its records, resuming, Ctrl-C, records from other machines, Dask.

Searches here are tiny (a few trials on 64-element kernels): these tests check what the tuner
does with its measurements, not how fast anything is (benchmarks/ measure that).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polyc
from polyc.runtime import tuning_records as records_module
from polyc.runtime.machine import MachineFingerprint, cpu_identity, microarchitecture, this_machine
from polyc.runtime.tuning_records import (
    SCHEMA_VERSION,
    TuningKey,
    TuningRecord,
    append_record,
    best_options,
    chosen_record,
    merge_records,
    read_records,
)

MATMUL = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}"""
ROWSUM = """
def rowsum(float(M, N) A) -> (B) {
    B(m) +=! A(m, r_n) * 2
}"""
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def matmul_args():
    rng = np.random.default_rng(0)
    return rng.random((64, 48), dtype=np.float32), rng.random((48, 80), dtype=np.float32)


@pytest.fixture
def records(tmp_path, monkeypatch):
    """A private records file, also the default one (what define() reads)."""
    path = tmp_path / "records.jsonl"
    monkeypatch.setenv("POLYC_TUNING_FILE", str(path))
    return path


def test_tune_records_every_trial_and_define_uses_the_best(records, matmul_args):
    kernel = polyc.define(MATMUL).matmul
    result = polyc.tune(kernel, *matmul_args, trials=5, progress=False, seed=1)
    assert result.trials == 5 and result.space.path == "gemm" and not result.interrupted
    lines = read_records(records)
    trials = [r for r in lines if not r.confirmed]
    assert len(trials) == 5 and all(r.key == result.key for r in lines)
    assert lines[0].options == {}, "polyc's defaults are measured first"
    # Where the search's best is not the defaults, the two were timed against each other after
    # it, and that confirmation chose.
    confirmed = [r for r in lines if r.confirmed]
    best_trial = min((r for r in trials if r.status == "ok"), key=lambda r: r.seconds)
    assert [r.options for r in confirmed] == ([{}, best_trial.options] if best_trial.options else [])
    chosen = chosen_record(lines)
    assert result.best_seconds == chosen.seconds and result.best_options == chosen.options
    assert result.default_seconds == (confirmed or lines)[0].seconds
    # Every record names its machine; the best options apply to a fresh define() of the same def
    # (formatted differently: the key is the def's meaning, not its text).
    assert lines[0].machine == this_machine().to_json() and lines[0].key.machine == this_machine().id
    assert best_options(result.key) == result.best_options
    fresh = polyc.define(MATMUL.replace("    ", "  ") + "\n# same def\n").matmul
    sizes = {"M": 64, "K": 48, "N": 80}
    tuned = {name: tuple(v) if isinstance(v, list) else v for name, v in result.best_options.items()}
    assert fresh.c_source(sizes) == polyc.define(MATMUL, tuning=False, **tuned).matmul.c_source(sizes)
    out = fresh(*matmul_args)
    np.testing.assert_allclose(out, matmul_args[0].astype(np.float64) @ matmul_args[1], rtol=1e-5, atol=1e-5)
    # tuning=False ignores the records.
    untuned = polyc.define(MATMUL, tuning=False).matmul
    assert untuned.stages(sizes).kernel.source == polyc.define(MATMUL, tuning=False).matmul.c_source(sizes)


def test_records_keep_only_options_left_at_their_defaults(records, matmul_args):
    kernel = polyc.define(MATMUL).matmul
    key = TuningKey.for_call(
        kernel.definition,
        {"M": 64, "K": 48, "N": 80},
        polyc.tuning.search.record_target(kernel.options.replace(tuning=False)),
    )
    # A record written before the block options had names of their own holds tile_sizes: it is
    # read as the path's option (gemm_blocks here), without the warning a user's tile_sizes gets.
    append_record(TuningRecord(key, {"tile_sizes": [48, 128, 64]}, "ok", 1e-6), records)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert "128" in kernel.c_source({"M": 64, "K": 48, "N": 80})
    assert polyc.define(MATMUL).matmul.stages({"M": 64, "K": 48, "N": 80}).kernel.source == polyc.define(
        MATMUL, gemm_blocks=(48, 128, 64)
    ).matmul.c_source({"M": 64, "K": 48, "N": 80})
    mine = polyc.define(MATMUL, gemm_blocks=(24, 256, 32)).matmul
    assert mine.stages({"M": 64, "K": 48, "N": 80}).kernel.source == polyc.define(
        MATMUL, gemm_blocks=(24, 256, 32), tuning=False
    ).matmul.c_source({"M": 64, "K": 48, "N": 80})


def test_wrong_failed_and_foreign_records_are_never_used(records, matmul_args):
    kernel = polyc.define(MATMUL).matmul
    key = TuningKey.for_call(kernel.definition, {"M": 64, "K": 48, "N": 80}, "c 000")
    other_machine = TuningKey(key.definition, key.sizes, key.dtypes, key.target, "another-machine")
    append_record(TuningRecord(key, {"tile_sizes": [24, 128, 64]}, "ok", 2e-3), records)
    append_record(TuningRecord(key, {"tile_sizes": [48, 128, 64]}, "wrong", 1e-6, message="differs"), records)
    append_record(TuningRecord(key, {"tile_sizes": [72, 128, 64]}, "error", None), records)
    append_record(TuningRecord(key, {"tile_sizes": [96, 128, 64]}, "pruned", None, runs=(1.0,)), records)
    append_record(TuningRecord(other_machine, {"tile_sizes": [120, 128, 64]}, "ok", 1e-9), records)
    assert best_options(key) == {"tile_sizes": [24, 128, 64]}
    assert best_options(TuningKey(*key.__dict__.values())) == {"tile_sizes": [24, 128, 64]}


def test_records_from_another_machine_are_a_starting_point_only(records, tmp_path, matmul_args):
    kernel = polyc.define(MATMUL).matmul
    foreign = tmp_path / "from-the-cluster.jsonl"
    sizes = {"M": 64, "K": 48, "N": 80}
    target = polyc.tuning.search.record_target(kernel.options.replace(tuning=False))
    there = TuningKey(
        TuningKey.for_call(kernel.definition, sizes, target).definition,
        tuple(sizes.items()),
        ("float32", "float32"),
        target,
        "a-xeon-somewhere",
    )
    append_record(TuningRecord(there, {"tile_sizes": [48, 256, 128]}, "ok", 1e-7), foreign)
    assert merge_records([foreign], records) == 1 and merge_records([foreign], records) == 0
    assert kernel.c_source(sizes) == polyc.define(MATMUL, tuning=False).matmul.c_source(sizes)
    result = polyc.tune(kernel, *matmul_args, trials=2, start_from=foreign, progress=False)
    # (The search's trials; a confirmation follows where the foreign options were the faster.)
    measured_here = [r for r in read_records(records) if r.key.machine == this_machine().id and not r.confirmed]
    assert [r.options for r in measured_here] == [{}, {"tile_sizes": [48, 256, 128]}]
    assert result.measured == 2


def test_processors_that_share_a_model_name_have_different_fingerprints():
    """Virtual machines call a Zen 3, a Zen 4 and a Zen 5 all "AMD EPYC": their family and
    model numbers tell them apart, so a record measured on one is not used on another."""
    epyc = replace(
        this_machine(),
        machine="x86_64",
        cpu_model="AMD EPYC",
        isa=("avx2", "avx512f", "fma"),
        caches=(32768, 1048576, 33554432),
        cores=2,
        cpu_id="",
    )
    zen3, zen4 = replace(epyc, cpu_id="AuthenticAMD 25/1/1"), replace(epyc, cpu_id="AuthenticAMD 25/17/1")
    assert zen3.id != zen4.id != epyc.id
    assert (zen3.microarchitecture, zen4.microarchitecture) == ("Zen 3", "Zen 4")
    assert zen4.describe().startswith("AMD EPYC [Zen 4, AuthenticAMD 25/17/1] (x86_64;")
    assert MachineFingerprint.from_json(zen4.to_json()) == zen4
    # A fingerprint written before the identity was recorded reads back with the digest it had.
    old = {k: v for k, v in epyc.to_json().items() if k != "cpu_id"}
    assert MachineFingerprint.from_json(old).id == epyc.id and epyc.to_json() == old


def test_the_identity_numbers_come_from_cpuinfo():
    assert (
        cpu_identity({"vendor_id": "GenuineIntel", "cpu family": "6", "model": "207", "stepping": "2"})
        == "GenuineIntel 6/207/2"
    )
    assert microarchitecture("GenuineIntel 6/207/2") == "Emerald Rapids"
    assert (
        microarchitecture("AuthenticAMD 26/2/0") == "Zen 5" and microarchitecture("AuthenticAMD 23/1/2") == "Zen/Zen+"
    )
    assert (
        cpu_identity({"CPU implementer": "0x41", "CPU part": "0xd0c", "CPU variant": "0x3", "CPU revision": "1"})
        == "arm 0x41/0xd0c/0x3/1"
    )
    assert cpu_identity({"model name": "something"}) == "" and microarchitecture("") == ""
    assert microarchitecture("AuthenticAMD 99/1/1") == "" and microarchitecture("GenuineIntel x/y/z") == ""
    here = this_machine()
    assert here.cpu_id or here.machine not in ("x86_64", "aarch64")


def test_unreadable_lines_are_skipped_with_a_warning_and_calls_still_work(records, matmul_args):
    kernel = polyc.define(MATMUL).matmul
    polyc.tune(kernel, *matmul_args, trials=1, progress=False)
    with open(records, "a") as file:
        file.write('{"schema": 1, "key": {"def": "x"')  # a run killed mid-write
        file.write("\nnot json at all\n")
        file.write(json.dumps({"schema": SCHEMA_VERSION + 1, "key": {}}) + "\n")
    with pytest.warns(polyc.PolycWarning) as caught:
        kept = read_records(records)
    assert len(kept) == 1
    messages = " ".join(str(w.message) for w in caught)
    assert f"{records}:2" in messages and f"{records}:3" in messages and "newer than this polyc" in messages
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a call never warns about the records: `polyc tune --list` does
        np.testing.assert_allclose(
            polyc.define(MATMUL).matmul(*matmul_args),
            matmul_args[0].astype(np.float64) @ matmul_args[1],
            rtol=1e-5,
            atol=1e-5,
        )


def test_an_old_schema_is_converted_on_load(tmp_path, monkeypatch):
    path = tmp_path / "old.jsonl"
    current = TuningRecord(TuningKey("d", (("N", 4),), ("float32",), "c x", "m"), {"unroll": 2}, "ok", 0.5)
    old = current.to_json()
    old["schema"] = 0
    old["seconds_ms"] = old.pop("seconds") * 1e3  # a made-up older layout
    path.write_text(json.dumps(old) + "\n")

    def upgrade_0_to_1(data: dict) -> dict:
        data = dict(data, schema=1)
        data["seconds"] = data.pop("seconds_ms") / 1e3
        return data

    monkeypatch.setitem(records_module._UPGRADES, 0, upgrade_0_to_1)
    (loaded,) = read_records(path)
    assert loaded.seconds == 0.5 and loaded.options == {"unroll": 2}


def test_ctrl_c_keeps_what_was_found(records, matmul_args, monkeypatch):
    from polyc.tuning import search

    real, calls = search.measure_candidate, []

    def interrupted_on_the_third(job, inputs, reference):
        calls.append(job)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(job, inputs, reference)

    monkeypatch.setattr(search, "measure_candidate", interrupted_on_the_third)
    result = polyc.tune(polyc.define(MATMUL).matmul, *matmul_args, trials=10, progress=False)
    assert result.interrupted and result.trials == 2 and len(read_records(records)) == 2
    assert result.best_seconds is not None


def test_candidates_are_built_together_then_timed_alone(records, matmul_args, tmp_path, monkeypatch, watched_builds):
    """Locally, as many candidates at a time as there are processors: their libraries built at
    once, then each timed with no compiler running."""
    from polyc.schedule import tiling
    from polyc.tuning import search

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tiling, "usable_cores", lambda: 2)
    real_time, compiles_while_timed = search._time_call, []

    def watched_time(kernel, inputs):
        compiles_while_timed.append(watched_builds.running)
        return real_time(kernel, inputs)

    monkeypatch.setattr(search, "_time_call", watched_time)
    result = polyc.tune(polyc.define(MATMUL).matmul, *matmul_args, trials=5, progress=False)
    assert result.trials == 5 and len(read_records(records)) >= 5
    assert watched_builds.most == 2
    assert compiles_while_timed and not any(compiles_while_timed)


def test_a_killed_run_resumes_from_its_records(records, matmul_args, tmp_path):
    script = tmp_path / "tune_forever.py"
    script.write_text(
        textwrap.dedent(f"""
        import numpy as np, polyc
        rng = np.random.default_rng(0)
        A, B = rng.random((64, 48), dtype=np.float32), rng.random((48, 80), dtype=np.float32)
        polyc.tune(polyc.define({MATMUL!r}).matmul, A, B, trials=500, progress=False)
    """)
    )
    process = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "POLYC_TUNING_FILE": str(records)})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not records.exists() or records.read_text().count("\n") < 3):
            time.sleep(0.1)
        assert process.poll() is None, "the tuning run ended before it could be killed"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    before = read_records(records)
    assert len(before) >= 3 and not any(r.confirmed for r in before)
    result = polyc.tune(polyc.define(MATMUL).matmul, *matmul_args, trials=3, progress=False)
    after = read_records(records)
    trials = [r for r in after if not r.confirmed]
    assert len(trials) == len(before) + 3 and result.measured == len(trials)
    identities = [json.dumps(r.options, sort_keys=True) for r in trials]
    assert len(set(identities)) == len(identities), "a resumed run measures only new candidates"
    assert result.best_seconds == chosen_record(after).seconds


def test_random_and_generic_path(records):
    A = np.random.default_rng(1).random((40, 70), dtype=np.float32)
    kernel = polyc.define(ROWSUM).rowsum
    result = polyc.tune(kernel, A, trials=3, strategy="random", progress=False)
    assert result.space.path == "generic" and result.trials == 3
    assert {k.name for k in result.space.knobs} >= {"t0", "fusion", "unroll", "vectorize"}
    np.testing.assert_allclose(kernel(A), 2 * A.astype(np.float64).sum(axis=1), rtol=1e-5)


def test_the_model_sees_the_whole_space_and_only_knobs_that_matter():
    from polyc.tuning.space import space_for

    definition = polyc.define(MATMUL, blas_contractions=False).matmul
    space = space_for(definition.definition, {"M": 64, "K": 48, "N": 80}, definition.options)
    configs = list(space.configs())
    assert len(configs) == space.size and len({json.dumps(c, sort_keys=True) for c in configs}) == space.size
    # Tiling off (t0 = -1) or left to polyc (t0 = 0): the inner tiles change nothing, so the
    # cost model must not see them change; with tiles given, it must.
    base = dict(space.default)
    for t0 in (-1, 0):
        same = [space.features({**base, "t0": t0, "t1": t1}) for t1 in (16, 256)]
        assert same[0] == same[1] and space.identity({**base, "t0": t0, "t1": 16}) == space.identity(
            {**base, "t0": t0, "t1": 256}
        )
    assert space.features({**base, "t0": 64, "t1": 16}) != space.features({**base, "t0": 64, "t1": 256})
    # ... but no tiling and polyc's own tiles are different modes: the model must tell them apart.
    assert space.features({**base, "t0": -1}) != space.features({**base, "t0": 0})


def test_the_loop_order_is_searched_on_the_generic_path(records):
    from polyc.tuning.space import space_for

    kernel = polyc.define(MATMUL, blas_contractions=False).matmul
    sizes = {"M": 64, "K": 48, "N": 80}
    space = space_for(kernel.definition, sizes, kernel.options)
    orders = dict((k.name, k.choices) for k in space.knobs)["loop_order"]
    assert orders[0] == "" and space.default["loop_order"] == "" and "loop_order" not in space.options(space.default)
    assert sorted(orders[1:]) == sorted(",".join(p) for p in itertools.permutations(("m", "n", "r_k")))
    assert space.options({**space.default, "loop_order": "r_k,n,m"})["loop_order"] == ["r_k", "n", "m"]
    assert space.features({**space.default, "loop_order": "r_k,n,m"}) != space.features(space.default)
    # A record's options (JSON: a list) compile, and the kernel computes the product.
    A = np.random.default_rng(7).random((64, 48), dtype=np.float32)
    B = np.random.default_rng(8).random((48, 80), dtype=np.float32)
    chosen = {**space.options({**space.default, "loop_order": "n,r_k,m"}), "register_tiles": ()}
    ordered = polyc.define(MATMUL, blas_contractions=False, tuning=False, **chosen).matmul
    # The loops of the C (no register tile): the tiles of n, r_k and m (one tile each), then n
    # inside a tile, vectorised.
    assert [loop.index for loop in ordered.explain(sizes).loops] == ["n", "r_k", "m", "n"]
    np.testing.assert_allclose(ordered(A, B), A.astype(np.float64) @ B, rtol=1e-5)
    rowsum = polyc.define(ROWSUM).rowsum
    knobs = space_for(rowsum.definition, {"M": 40, "N": 70}, rowsum.options).knobs
    assert dict((k.name, k.choices) for k in knobs)["loop_order"] == ("", "m,r_n", "r_n,m")
    pinned = polyc.define(ROWSUM, loop_order=("r_n",)).rowsum
    assert "loop_order" not in {k.name for k in space_for(pinned.definition, {"M": 40, "N": 70}, pinned.options).knobs}


def test_the_fusion_strategy_is_searched_only_where_it_changes_the_code():
    from polyc.tuning.space import space_for

    symmetrise = "def sym(float(N, N) A) -> (B) { B(i, j) = 0.5 * (A(i, j) + A(j, i)) }"
    # One assignment: every strategy gives the same C (but for the comment naming the options).
    sources = {
        polyc.define(symmetrise, fusion=f).sym.c_source({"N": 64}).replace(f"fusion={f}", "")
        for f in ("min", "smart", "max")
    }
    assert len(sources) == 1
    one = polyc.define(symmetrise).sym
    space = space_for(one.definition, {"N": 64}, one.options)
    assert "fusion" not in {k.name for k in space.knobs} and "fusion" not in space.default
    assert all("fusion" not in space.options(c) for c in space.configs())
    # A reduction that starts from zero is two statements (the zeroing, the sum): fusion counts.
    rowsum = polyc.define(ROWSUM).rowsum
    assert "fusion" in {k.name for k in space_for(rowsum.definition, {"M": 8, "N": 8}, rowsum.options).knobs}


def test_the_thread_count_is_searched_unless_the_options_fix_it():
    from polyc.tuning.space import space_for, thread_counts

    EIGHT_CORES = replace(this_machine(), cores=8)
    assert thread_counts(1) == (0,) and thread_counts(2) == (0, 1) and thread_counts(12) == (0, 6, 3, 1)
    sizes = {"M": 64, "K": 48, "N": 80}
    for path, options in (("gemm", {}), ("generic", {"blas_contractions": False})):
        kernel = polyc.define(MATMUL, tuning=False, **options).matmul
        space = space_for(kernel.definition, sizes, kernel.options, machine=EIGHT_CORES)
        assert space.path == path and dict((k.name, k.choices) for k in space.knobs)["threads"] == (0, 4, 2, 1)
        assert space.default["threads"] == 0 and "threads" not in space.options(space.default)
        assert space.options({**space.default, "threads": 2})["threads"] == 2
        # ... and the code a count compiles to has that many threads at most.
        source = kernel.stages(sizes, **space.options({**space.default, "threads": 2})).kernel.source
        assert ("#define POLYC_MAX_THREADS 2" if path == "gemm" else "num_threads(2)") in source
        assert space.features({**space.default, "threads": 0}) != space.features({**space.default, "threads": 1})
        for fixed in ({"threads": 3}, {"parallel": False}):
            pinned = polyc.define(MATMUL, tuning=False, **options, **fixed).matmul
            assert "threads" not in {
                k.name for k in space_for(pinned.definition, sizes, pinned.options, machine=EIGHT_CORES).knobs
            }
    # Records of an older polyc, whose space had no thread count (nor register block), left
    # them at their defaults.
    from polyc.tuning.search import _config_in

    old = TuningRecord(None, {"tile_sizes": [48, 128, 64]}, "ok", 1e-3, config={"mc": 48, "nc": 128, "kc": 64})
    matmul = polyc.define(MATMUL).matmul
    gemm_space = space_for(matmul.definition, sizes, matmul.options, machine=EIGHT_CORES)
    assert _config_in(gemm_space, old) == {**gemm_space.default, "mc": 48, "nc": 128, "kc": 64}
    assert gemm_space.default["threads"] == 0
    assert _config_in(gemm_space, TuningRecord(None, {"tile_sizes": [7, 7, 7]}, "ok", 1e-3, config={})) == {}
    # One core: nothing to choose (a matrix-vector product then has no knob at all).
    gemv = polyc.define("def mv(float(M, K) A, float(K) x) -> (y) { y(m) +=! A(m, r_k) * x(r_k) }").mv
    space = space_for(gemv.definition, {"M": 64, "K": 48}, gemv.options, machine=replace(this_machine(), cores=1))
    assert space.path == "gemv" and space.knobs == () and list(space.configs()) == [{}]
    assert [
        k.name
        for k in space_for(
            gemv.definition, {"M": 64, "K": 48}, gemv.options, machine=replace(this_machine(), cores=2)
        ).knobs
    ] == ["threads"]


def test_the_register_block_is_searched_on_the_gemm_path():
    from polyc.codegen.gemm import micro_kernel_shapes
    from polyc.tuning.space import space_for

    kernel = polyc.define(MATMUL, tuning=False).matmul
    sizes = {"M": 64, "K": 48, "N": 80}
    for isa, flags in (("avx512", ("avx2", "avx512f", "fma")), ("avx2", ("avx2", "fma"))):
        machine = replace(this_machine(), machine="x86_64", isa=flags)
        assert machine.instruction_set == isa
        space = space_for(kernel.definition, sizes, kernel.options, machine=machine)
        blocks = len(micro_kernel_shapes(isa, np.dtype(np.float32)))
        assert dict((k.name, k.choices) for k in space.knobs)["micro_kernel"] == tuple(range(blocks + 1))
        assert space.default["micro_kernel"] == 0 and "micro_kernel" not in space.options(space.default)
        assert space.options({**space.default, "micro_kernel": 2})["micro_kernel"] == 2
    pinned = polyc.define(MATMUL, tuning=False, micro_kernel=1).matmul
    assert "micro_kernel" not in {k.name for k in space_for(pinned.definition, sizes, pinned.options).knobs}
    # Flags that name an instruction set build its blocks, whatever the machine has: AVX2
    # code on an AVX-512 machine has AVX2's two blocks to choose from, portable C one (no knob).
    if platform.machine() in ("x86_64", "AMD64"):
        avx512_machine = replace(this_machine(), machine="x86_64", isa=("avx2", "avx512f", "fma"))
        for cflags, isa in (("-O2 -mavx2 -mfma", "avx2"), ("-O2 -mavx512f -mfma", "avx512"), ("-O2", "portable")):
            built = polyc.define(MATMUL, tuning=False, cflags=cflags).matmul
            blocks = len(micro_kernel_shapes(isa, np.dtype(np.float32)))
            knobs = dict(
                (k.name, k.choices)
                for k in space_for(built.definition, sizes, built.options, machine=avx512_machine).knobs
            )
            assert knobs.get("micro_kernel") == (tuple(range(blocks + 1)) if blocks > 1 else None)
    # Each block, named by the option, is the only one in the C of every instruction set, and
    # computes the product (rows and columns that fill no whole block included).
    A = np.random.default_rng(3).random((29, 37), dtype=np.float32)
    B = np.random.default_rng(4).random((37, 71), dtype=np.float32)
    for number in (1, 2, 3, 9):
        forced = polyc.define(MATMUL, tuning=False, micro_kernel=number).matmul
        source = forced.c_source({"M": 29, "K": 37, "N": 71})
        for isa in ("avx512", "avx2"):
            shapes = micro_kernel_shapes(isa, np.dtype(np.float32))
            section = source.split(f'#define POLYC_GEMM_ISA "{isa}"')[1].split("#define POLYC_GEMM_ISA")[0]
            assert set(re.findall(r"Register block (\d+x\d+)", section)) == {shapes[min(number, len(shapes)) - 1].name}
        np.testing.assert_allclose(forced(A, B), A.astype(np.float64) @ B, rtol=1e-5)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(polyc.PolycError, match="micro_kernel"):
            polyc.define(MATMUL, micro_kernel=bad)


def test_a_confirmation_decides_and_a_lucky_timing_does_not():
    """The search's best is the luckiest of many single timings; the best and the defaults are
    timed against each other after the search, and the latest confirmation chooses."""

    def record(options, seconds, session="s", confirmed=False):
        return TuningRecord(None, options, "ok", seconds, session=session, confirmed=confirmed)

    tiles = {"tile_sizes": [48, 128, 64]}
    trials = [record({}, 1.0), record(tiles, 0.9), record({"micro_kernel": 2}, 0.95)]
    assert chosen_record(trials).options == tiles  # no confirmation: the fastest
    within_margin = [record({}, 1.0, "a", True), record(tiles, 0.99, "a", True)]
    assert chosen_record(trials + within_margin).options == {}  # 1% is within the noise
    faster = [record({}, 1.0, "b", True), record(tiles, 0.9, "b", True)]
    assert chosen_record(trials + within_margin + faster).options == tiles  # the latest decides
    assert chosen_record(trials + faster + within_margin).options == {}


def test_a_search_whose_best_was_lucky_keeps_the_defaults(records, matmul_args, monkeypatch):
    from polyc.tuning import search

    def timing(kernel, inputs):  # the search sees the defaults twice as slow as any other candidate
        options = kernel.options
        return 2e-4 if (options.tile_sizes, options.micro_kernel, options.threads) == (None, None, None) else 1e-4

    monkeypatch.setattr(search, "_time_call", timing)
    monkeypatch.setattr(
        search,
        "confirm_candidates",
        lambda jobs, inputs, rounds=search.CONFIRM_ROUNDS: [
            {"status": "ok", "seconds": 1e-4, "runs": [1e-4]} for _ in jobs
        ],
    )  # ... and the confirmation alike
    result = polyc.tune(polyc.define(MATMUL).matmul, *matmul_args, trials=3, progress=False)
    confirmed = [r for r in read_records(records) if r.confirmed]
    assert len(confirmed) == 2 and confirmed[0].options == {} and confirmed[1].options
    assert result.best_options == {} and best_options(result.key) == {}


def test_a_candidate_is_pruned_only_when_two_runs_are_slow(matmul_args, monkeypatch):
    """TC's pruning, minus a busy machine's scheduler slice: one slow run is timed again."""
    from polyc.tuning import search

    job = {"source": MATMUL, "name": "matmul", "options": {}, "terms": 48, "limit": 1e-3}
    reference = (matmul_args[0] @ matmul_args[1],)
    for times, status in (([5e-3, 1e-4], "ok"), ([5e-3, 4e-3], "pruned"), ([1e-4], "ok")):
        clock = iter(times + [1e-4] * 100)
        monkeypatch.setattr(search, "_time_call", lambda kernel, inputs: next(clock))
        outcome = search.measure_candidate(job, matmul_args, reference)
        assert outcome["status"] == status, (times, outcome)
        assert outcome["runs"][: len(times)] == times
        if status == "ok":
            assert outcome["seconds"] == 1e-4 and len(outcome["runs"]) == search.MAX_RUNS


def test_tune_is_a_function_with_seconds_and_trials():
    import inspect

    from polyc.tuning.search import search_budget

    assert inspect.isfunction(polyc.tune)
    parameters = inspect.signature(polyc.tune).parameters
    assert {"seconds", "trials", "strategy", "records"} <= set(parameters)
    assert search_budget(None, None) == 60.0 and isinstance(search_budget(None, None), float)
    assert search_budget(5, None) == 5.0 and isinstance(search_budget(5, None), float)  # 5 seconds, not 5 trials
    assert search_budget(None, 40) == 40 and isinstance(search_budget(None, 40), int)
    # The old budget= still works, and says what it means now.
    with pytest.warns(DeprecationWarning, match=r"budget=20 means trials=20"):
        assert search_budget(None, None, 20) == 20
    with pytest.warns(DeprecationWarning, match=r"budget=2.5 means seconds=2.5"):
        assert search_budget(None, None, 2.5) == 2.5


def test_bad_requests_are_polyc_errors(matmul_args):
    kernel = polyc.define(MATMUL).matmul
    for bad, message in (
        ({"seconds": 0}, "seconds must be a positive"),
        ({"seconds": float("inf")}, "seconds must be a positive, finite"),
        ({"trials": 2.5}, "trials must be a positive integer"),
        ({"trials": True}, "trials must be a positive integer"),
        ({"seconds": 5, "trials": 3}, "not both"),
        ({"budget": 0}, "budget"),
        ({"budget": True}, "budget"),
        ({"budget": 3, "trials": 3}, "give only one"),
        ({"strategy": "genetic"}, "strategy"),
    ):
        with pytest.raises(polyc.PolycError, match=message):
            polyc.tune(kernel, *matmul_args, progress=False, **bad)
    with pytest.raises(polyc.PolycError, match="tune.. takes a polyc kernel"):
        polyc.tune(lambda a, b: a @ b, *matmul_args)
    with pytest.raises(polyc.PolycError, match="nothing to tune"):
        polyc.tune(polyc.define(MATMUL, backend="interpreter").matmul, *matmul_args)
    with pytest.raises(polyc.SignatureError):
        polyc.tune(kernel, matmul_args[0], matmul_args[0], trials=1)


def test_dask_local_cluster_gives_the_same_records(records, tmp_path, matmul_args):
    distributed = pytest.importorskip("dask.distributed")
    local = polyc.tune(
        polyc.define(MATMUL).matmul, *matmul_args, trials=2, records=tmp_path / "local.jsonl", progress=False
    )
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        remote = polyc.tune(polyc.define(MATMUL).matmul, *matmul_args, trials=4, client=client, progress=False)
    assert remote.key == local.key and remote.trials == 4
    local_lines = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    remote_lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert all(set(line) == set(local_lines[0]) for line in remote_lines)
    assert remote_lines[0]["key"] == local_lines[0]["key"] and remote_lines[0]["options"] == {}
    assert remote.best_options == best_options(remote.key) or remote.best_seconds is None
    # The confirmation (best against defaults) ran on a worker too, where there was one to make.
    trials = [line for line in remote_lines if not line["confirmed"]]
    best_trial = min((line for line in trials if line["status"] == "ok"), key=lambda line: line["seconds"])
    assert len(remote_lines) - len(trials) == (2 if best_trial["options"] else 0)


def test_command_line_tunes_lists_and_merges(tmp_path, capsys):
    from polyc.cli import main

    records, other = tmp_path / "records.jsonl", tmp_path / "other.jsonl"
    tc = tmp_path / "rowsum.tc"
    tc.write_text(ROWSUM)
    assert main(["tune", str(tc), "--shape", "M=16,N=24", "--budget", "2", "--records", str(records)]) == 0
    written = read_records(records)
    assert len([r for r in written if not r.confirmed]) == 2
    assert main(["tune", "--merge", str(records), "--records", str(other)]) == 0
    assert len(read_records(other)) == len(written)
    assert main(["tune", "--list", "--records", str(other)]) == 0
    # A record measured elsewhere lists the machine it was measured on, not only its digest.  One
    # core more than here keeps it foreign when the tests themselves run on a Zen 3 EPYC.
    here = this_machine()
    zen3 = replace(here, cpu_model="AMD EPYC", cpu_id="AuthenticAMD 25/1/1", cores=here.cores + 1)
    assert zen3.id != here.id
    foreign = replace(written[0], key=replace(written[0].key, machine=zen3.id), machine=zen3.to_json())
    damaged = replace(
        written[0],
        key=replace(written[0].key, machine="elsewhere", sizes=(("M", 8), ("N", 8))),
        machine={"cpu_model": "no other fields"},
    )
    append_record(foreign, other)
    append_record(damaged, other)
    capsys.readouterr()
    assert main(["tune", "--list", "--records", str(other)]) == 0
    listed = capsys.readouterr().out
    assert f"machine {zen3.id}: AMD EPYC [Zen 3, AuthenticAMD 25/1/1] (" in listed
    assert "machine elsewhere (not used here)" in listed and "[this machine]" in listed
    assert main(["tune", "--records", str(other)]) == 2  # no file: a usage error
    assert main(["tune", str(tc), "--shape", "M=16", "--records", str(records)]) != 0  # N missing
    assert main(["tune", str(tc), "--shape", "M=16,N=24", "--budget", "0"]) == 2


def test_threads_option_limits_every_kind_of_kernel():
    sizes = {"M": 64, "K": 48, "N": 80}
    gemm = polyc.define(MATMUL, threads=1, tuning=False).matmul
    assert "#define POLYC_MAX_THREADS 1" in gemm.c_source(sizes)
    assert "POLYC_MAX_THREADS" not in polyc.define(MATMUL, tuning=False).matmul.c_source(sizes).split("#ifdef")[0]
    generic = polyc.define(ROWSUM, threads=3, tuning=False).rowsum
    source = generic.c_source({"M": 4000, "N": 64})
    assert "omp parallel for" in source and all(
        "num_threads(3)" in line for line in source.splitlines() if "#pragma omp parallel for" in line
    )
    A = np.random.default_rng(2).random((4000, 64), dtype=np.float32)
    np.testing.assert_allclose(generic(A), 2 * A.astype(np.float64).sum(axis=1), rtol=1e-5)
    for bad in (0, -2, True, 1.5):
        with pytest.raises(polyc.PolycError, match="threads"):
            polyc.define(MATMUL, threads=bad)


def test_large_kernels_are_checked_against_the_default_build(records, matmul_args, monkeypatch):
    # The interpreter runs about 85 million instances a second: sgemm 2048 took 101 s of a 60 s
    # budget.  Above INTERPRETED_INSTANCES the reference is polyc's default build, and a
    # candidate that disagrees with it is still 'wrong'.
    from polyc import interpreter
    from polyc.tuning import search

    interpreted = []
    monkeypatch.setattr(interpreter, "interpret", lambda *a: interpreted.append(a) or pytest.fail("interpreted"))
    monkeypatch.setattr(search, "INTERPRETED_INSTANCES", 64 * 48 * 80 - 1)
    kernel = polyc.define(MATMUL).matmul
    reference = search._reference(kernel, matmul_args, {"M": 64, "K": 48, "N": 80}, kernel.options)
    np.testing.assert_allclose(reference[0], matmul_args[0] @ matmul_args[1], rtol=1e-5)
    # No pruning: on a machine busy with the rest of the suite, a candidate's first run of a few
    # microseconds can wait scheduler slices, and then it is pruned, not checked (a CI run
    # failed here; under three busy processes: "pruned: first run 8.155 ms > 0.112 ms").
    result = polyc.tune(kernel, *matmul_args, trials=3, progress=False, seed=2, prune_factor=math.inf)
    assert not interpreted and result.trials == 3
    statuses = [(r.status, r.message) for r in read_records(records)]
    assert all(status == "ok" for status, _ in statuses), statuses
    wrong = (reference[0] + 1,)
    outcome = search.measure_candidate(
        {"source": MATMUL, "name": "matmul", "options": {}, "terms": 48, "limit": float("inf")}, matmul_args, wrong
    )
    assert outcome["status"] == "wrong"


WINOGRAD_CONV = """def conv(float(1, 16, 16, 16) I, float(3, 3, 16, 32) W1) -> (O) {
    O(n, h, w, f) +=! (h + r_kh >= 1 && h + r_kh < 17 && w + r_kw >= 1 && w + r_kw < 17)
        ? I(n, h + r_kh - 1, w + r_kw - 1, r_c) * W1(r_kh, r_kw, r_c, f) : 0 where h in 0:16, w in 0:16, r_kh in 0:3, r_kw in 0:3
}"""


def test_where_the_winograd_kernel_is_allowed_the_tuner_may_turn_it_off(records):
    from polyc.tuning.space import space_for

    allowed = polyc.define(WINOGRAD_CONV, winograd=True).conv
    space = space_for(allowed.definition, {}, allowed.options)
    assert space.path == "winograd" and dict((k.name, k.choices) for k in space.knobs)["winograd"] == (True, False)
    assert space.default["winograd"] is True and space.options(space.default) == {}
    direct = {**space.default, "winograd": False, "channels": 16}
    assert space.options(direct) == {"winograd": False, "conv_block": 16}
    # With the Winograd kernel the channels per item mean nothing: the same candidate, the same features.
    assert space.identity({**space.default, "channels": 16}) == space.identity(space.default)
    assert space.features({**space.default, "channels": 16}) == space.features(space.default)
    # Not offered where the user did not allow it.
    plain = polyc.define(WINOGRAD_CONV).conv
    assert "winograd" not in {k.name for k in space_for(plain.definition, {}, plain.options).knobs}
    # A record may turn it off for a kernel that allows it (never on for one that does not).
    assert "Winograd F(2x2, 3x3)" in allowed.c_source({})
    key = TuningKey.for_call(
        allowed.definition, {}, polyc.tuning.search.record_target(allowed.options.replace(tuning=False))
    )
    append_record(TuningRecord(key, {"winograd": False, "conv_block": 16}, "ok", 1e-6), records)
    assert "Winograd F(2x2, 3x3)" not in polyc.define(WINOGRAD_CONV, winograd=True).conv.stages({}).kernel.source
    append_record(TuningRecord(key, {"winograd": True}, "ok", 1e-7), records)
    assert "Winograd F(2x2, 3x3)" not in polyc.define(WINOGRAD_CONV).conv.stages({}).kernel.source
