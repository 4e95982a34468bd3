"""Does the tuner's cost model earn its place?  Guided against random search, trial by trial.

    python -m benchmarks.tuning_search [--trials 40] [--seeds 20] [--filter REGEX] [--json PATH]

First every configuration of each kernel's search space is measured once (and kept in
``--table``, so a later run reuses it), each with the kernel's own build timed right after it
to correct for the machine's speed at that minute (:func:`_correct_drift`), and the fastest
CONFIRMED of them are timed again against one another (:func:`_confirm_fastest`).  Then both
strategies run ``--trials`` trials from many seeds, reading their measurements from that
table, so they are compared on identical times: the difference between them is the search,
not the machine's noise.  The figure of merit is the number of trials a search needs
before its best time is within 5% of the best time in the table (95% of the best speed); the
table gives its median over the seeds (a search that never gets there counts as trials + 1).

A table holds the times of one machine and one set of C compiler flags: with
``POLYC_CFLAGS="-O3 -march=znver3"`` an AVX-512 machine builds AVX2 code, and its times go
into a table of their own (the run starts one where ``--table`` holds another's).

Measuring a space takes a while: about 500 configurations for a contraction (sgemm, mlp, tmm:
5-10 minutes each on two cores) and about 650 for the generic path's transpose-add, whose
candidates compile more slowly (20-30 minutes).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from pathlib import Path

import numpy as np

import polyc
from polyc.runtime.compiler import CompilerOptions
from polyc.target import DEFAULT_OPTIMISATION_FLAGS, LANGUAGE_FLAGS
from polyc.tuning import search

#: The flags of the tables written before they recorded theirs: polyc's defaults.
DEFAULT_FLAGS = " ".join(DEFAULT_OPTIMISATION_FLAGS + LANGUAGE_FLAGS)

KERNELS = {
    "sgemm 512": (
        "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
        "sgemm",
        {"A": (512, 512), "B": (512, 512)},
    ),
    "mlp 128x2000x128": (
        "def mlp(float(B, K) I, float(K, N) W, float(N) bias) -> (O) {\n"
        "  O(b, n) +=! I(b, r_k) * W(r_k, n)\n  O(b, n) = fmax(O(b, n) + bias(n), 0)\n}",
        "mlp",
        {"I": (128, 2000), "W": (2000, 128), "bias": (128,)},
    ),
    "tmm 128x1024x1024": (
        "def tmm(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
        "tmm",
        {"A": (128, 1024), "B": (1024, 1024)},
    ),
    "softmax 1024x2048": (
        "def softmax(float(N, D) X) -> (O) {\n  M(n) max=! X(n, r_d)\n"
        "  O(n, d) = exp(X(n, d) - M(n))\n  S(n) +=! O(n, r_d)\n  O(n, d) = O(n, d) / S(n)\n}",
        "softmax",
        {"X": (1024, 2048)},
    ),
    "transpose-scale 2048": (
        "def tscale(float(N, N) A) -> (B) { B(i, j) = A(j, i) * 2 }",
        "tscale",
        {"A": (2048, 2048)},
    ),
    "mvt 4096 (loop nests)": (
        "def mvt(float(N) y1, float(N) y2, float(N, N) A) -> (x1, x2) {\n"
        "  x1(i) +=! A(i, r_j) * y1(r_j)\n  x2(i) +=! A(r_j, i) * y2(r_j)\n}",
        "mvt",
        {"y1": (4096,), "y2": (4096,), "A": (4096, 4096)},
        {"blas_contractions": False},
    ),
    "jacobi-2d 4096": (
        "def jacobi(float(N, N) A) -> (B) {\n"
        "  B(i, j) = 0.2 * (A(i, j) + A(i-1, j) + A(i+1, j) + A(i, j-1) + A(i, j+1))"
        " where i in 1:N-1, j in 1:N-1\n}",
        "jacobi",
        {"A": (4096, 4096)},
    ),
    "symmetrise 2048": (
        "def sym(float(N, N) A) -> (B) { B(i, j) = 0.5 * (A(i, j) + A(j, i)) }",
        "sym",
        {"A": (2048, 2048)},
    ),
    "transpose-add 1024": (
        "def tadd(float(N, N) A, float(N, N) B) -> (C) {\n"
        "  C(i, j) = A(j, i) + B(i, j)\n  C(i, j) = C(i, j) * 2 + A(i, j)\n}",
        "tadd",
        {"A": (1024, 1024), "B": (1024, 1024)},
    ),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tuning_search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=40, help="trials per search (40)")
    parser.add_argument("--seeds", type=int, default=20, help="searches per strategy and kernel (20)")
    parser.add_argument("--filter", default="", help="only kernels whose title matches this regular expression")
    parser.add_argument(
        "--table",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "tuning_tables.json",
        help="measured spaces, reused (and completed) by later runs",
    )
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "tuning_search.json")
    args = parser.parse_args(argv)

    machine = polyc.tuning.this_machine()
    # The C compiler's flags belong to the measurement as much as the machine: $POLYC_CFLAGS
    # can build AVX2 code on an AVX-512 machine, whose times are another table's.
    flags = " ".join(CompilerOptions().flags)
    tables = json.loads(args.table.read_text()) if args.table.exists() else {}
    if (tables.get("machine"), tables.get("cflags", DEFAULT_FLAGS)) != (machine.id, flags):
        tables = {"machine": machine.id, "kernels": {}}
    tables["cflags"] = flags  # also into a table of the default flags written without them
    print(f"machine: {machine.describe()}\nC flags: {flags}")
    # A run over some of the kernels (--filter) keeps the others' results from the same machine.
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    if (results.get("machine"), results.get("cflags", DEFAULT_FLAGS)) != (machine.to_json(), flags):
        results = {"machine": machine.to_json(), "kernels": {}}
    results["cflags"] = flags
    print(
        f"{'kernel':<20} {'space':>6} {'best ms':>9} {'within 5%':>9} {'random: trials to 95%':>22} "
        f"{'guided':>7} {'ratio':>6}"
    )
    for title, (source, entry, shapes, *options) in KERNELS.items():
        if not re.search(args.filter, title):
            continue
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, size=shape).astype(np.float32) for shape in shapes.values()]
        kernel = polyc.define(source, tuning=False, **(options[0] if options else {}))[entry]
        table = tables["kernels"].setdefault(title, {})
        candidates = _measure_space(kernel, inputs, table, args.table, tables)
        typical = _correct_drift(table, candidates)
        _confirm_fastest(kernel, inputs, table, candidates, typical, args.table, tables)
        # The table may hold more (a space that was larger when it was measured): only this one's.
        times = {k: _seconds(table[k]) for k in candidates if table[k].get("status") == "ok"}
        best = min(times.values())
        curves = {
            strategy: [_replay(kernel, inputs, table, strategy, seed, args.trials) for seed in range(args.seeds)]
            for strategy in ("random", "model")
        }

        def trials_to_95(run: list) -> int:
            for trial, value in enumerate(run, 1):
                if value is not None and value <= best / 0.95:
                    return trial
            return args.trials + 1

        needed = {s: statistics.median(trials_to_95(run) for run in runs) for s, runs in curves.items()}
        near = sum(t <= best / 0.95 for t in times.values())
        print(
            f"{title:<20} {len(candidates):>6} {best * 1e3:>9.3f} {near:>9} {needed['random']:>22} "
            f"{needed['model']:>7} {needed['model'] / needed['random']:>6.2f}"
        )
        results["kernels"][title] = {
            "space_size": len(candidates),
            "best_seconds": best,
            "configs_within_5pc": near,
            "trials": args.trials,
            "seeds": args.seeds,
            "trials_to_95": needed,
            "curves": curves,
        }
        # Written after each kernel: a run stopped during the next keeps this one's result.
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.json}")
    return 0


def _measure_space(kernel, inputs, table: dict, path: Path, tables: dict) -> set[str]:
    """Measure every candidate of the kernel's space not yet in ``table`` (saved as it goes);
    returns the space's candidates (their identities)."""
    from polyc.runtime.arguments import bind_arguments

    call = bind_arguments(kernel.definition, tuple(inputs))
    space = search.space_for(kernel.definition, call.sizes, kernel.options)
    reference = search._reference(kernel, tuple(inputs), call.sizes, kernel.options)
    terms = search._tolerance_terms(kernel.definition, call.sizes)
    # One configuration per candidate: configurations that compile to the same options are one.
    candidates = {space.identity(c): c for c in space.configs()}
    todo = [config for identity, config in candidates.items() if identity not in table]
    jobs = [{**_job(kernel, space.options(config)), "terms": terms, "limit": float("inf")} for config in todo]
    _compile_ahead(jobs, inputs)
    own = _job(kernel, {})
    baseline = polyc.define(own["source"], **search.plain_options(own["options"]))[own["name"]]
    for number, (config, job) in enumerate(zip(todo, jobs), 1):
        entry = search.measure_candidate(job, tuple(inputs), reference)
        entry["baseline_seconds"] = _timed(baseline, inputs)
        table[space.identity(config)] = entry
        if number % 20 == 0 or number == len(todo):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(tables) + "\n")
            print(f"  measured {number}/{len(todo)} configurations of {kernel.definition.name}", flush=True)
    return set(candidates)


#: The fastest configurations of a measured space, timed again against one another (see
#: :func:`_confirm_fastest`).
CONFIRMED = 96


def _seconds(entry: dict) -> float:
    """A configuration's time in the table: its confirmed time where it has one, else its
    time corrected for the machine's speed when it was measured (:func:`_correct_drift`)."""
    return entry.get("confirmed_seconds", entry.get("corrected_seconds", entry["seconds"]))


def _timed(kernel, inputs) -> float:
    """The median of calls of ``kernel`` for about as long as the tuner times a candidate."""
    runs = [search._time_call(kernel, inputs)]
    runs += [search._time_call(kernel, inputs) for _ in range(search.run_count(runs[0]) - 1)]
    return statistics.median(runs)


def _correct_drift(table: dict, candidates: set[str]) -> float:
    """Every measured configuration's time as if the machine had run at its typical speed.

    A space takes ten minutes and more to measure, and the shared machines' speed drifts by 2x
    over half an hour (an Intel Xeon: transpose-scale 2.0 ms in one half hour, 4.5-4.7 in a
    later one): timed one after another, configurations measured in a fast minute look better
    than they are.  So the kernel's own build is timed right after each configuration
    (``baseline_seconds``), and a configuration's ``corrected_seconds`` is its time scaled by
    the baseline's median over the whole space against its baseline at that minute.  Returns
    that median (0 when the table has no baseline times: it was measured before them)."""
    baselines = [table[k]["baseline_seconds"] for k in candidates if "baseline_seconds" in table[k]]
    if not baselines:
        return 0.0
    typical = statistics.median(baselines)
    for identity in candidates:
        entry = table[identity]
        if entry.get("status") == "ok" and "baseline_seconds" in entry:
            entry["corrected_seconds"] = entry["seconds"] * typical / entry["baseline_seconds"]
    return typical


def _confirm_fastest(
    kernel, inputs, table: dict, candidates: set[str], typical: float, path: Path, tables: dict
) -> None:
    """Time the CONFIRMED fastest configurations again, all together in interleaved rounds
    (:func:`polyc.tuning.search.confirm_candidates`).  The space is timed one configuration
    after another over ten minutes of a shared machine whose load drifts by 20-30% meanwhile
    (symmetrise on an Intel Xeon: one configuration 2.4 ms in one minute, 3.0-3.1 in a later
    one), so the fastest single timings are mostly those taken in a quiet minute: the best
    to reach would be one lucky timing no search finds again.  Timed in the same rounds, the
    fastest configurations are compared on equal terms.  Both searches read the same table,
    so this changes neither's trials, only the times they reach and the best to reach.
    ``typical``: the baseline's median time over the space (:func:`_correct_drift`; 0: none),
    the scale the confirmed times are put on."""
    if any("confirmed_seconds" in table[k] for k in candidates):
        return  # confirmed in an earlier run
    fastest = sorted((k for k in candidates if table[k].get("status") == "ok"), key=lambda k: _seconds(table[k]))
    todo = fastest[:CONFIRMED]
    # The kernel's own build in the same rounds: the confirmed times on the scale of the rest.
    jobs = [_job(kernel, json.loads(identity)) for identity in todo] + [_job(kernel, {})]
    *confirmed, baseline = search.confirm_candidates(jobs, tuple(inputs))
    scale = typical / baseline["seconds"] if typical else 1.0
    for identity, outcome in zip(todo, confirmed):
        table[identity]["confirmed_seconds"] = outcome["seconds"] * scale
    path.write_text(json.dumps(tables) + "\n")
    print(f"  confirmed the {len(todo)} fastest configurations of {kernel.definition.name}", flush=True)


def _job(kernel, changes: dict) -> dict:
    """A measurement job (as :func:`polyc.tuning.search.measure_candidate` takes it) for the
    kernel built with its own options and ``changes``."""
    import dataclasses

    return {
        "source": polyc.lang.printer.format_def(kernel.syntax),
        "name": kernel.definition.name,
        "options": {**dataclasses.asdict(kernel.options), **changes},
    }


def _compile_ahead(jobs: list, inputs) -> None:
    """Compile every candidate into the kernel cache on all cores first: the measurements then
    load them, and run one at a time on a machine that compiles nothing meanwhile."""
    import concurrent.futures
    import os

    if not jobs:
        return
    import multiprocessing

    # spawned, not forked: a fork of a process whose OpenMP threads ran can hang in the child
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=spawn) as pool:
        list(pool.map(_compile_one, jobs, [inputs] * len(jobs), chunksize=4))
    print(f"  compiled {len(jobs)} configurations", flush=True)


def _compile_one(job: dict, inputs) -> None:
    try:
        polyc.define(job["source"], **search.plain_options(job["options"]))[job["name"]](*inputs)
    except polyc.PolycError:
        pass  # measured (and reported) as an error later


def _replay(kernel, inputs, table: dict, strategy: str, seed: int, trials: int) -> list:
    """A search that reads its measurements from ``table``: its best time after each trial."""
    import dataclasses

    base = dataclasses.asdict(kernel.options.replace(tuning=False))  # as the tuner's jobs start

    def from_table(job, _inputs, _reference):
        found = table[table_key(job["options"], base)]
        return {**found, "seconds": _seconds(found)} if found.get("status") == "ok" else found

    def confirm_from_table(jobs, _inputs, rounds=None):
        return [from_table(job, None, None) for job in jobs]

    real = search.measure_candidate, search.confirm_candidates
    search.measure_candidate, search.confirm_candidates = from_table, confirm_from_table
    try:
        with tempfile.TemporaryDirectory() as directory:
            result = polyc.tune(
                kernel,
                *inputs,
                trials=trials,
                strategy=strategy,
                seed=seed,
                records=Path(directory) / "records.jsonl",
                progress=False,
            )
    finally:
        search.measure_candidate, search.confirm_candidates = real
    return [best for _, best in result.history]


def table_key(options: dict, base: dict) -> str:
    """The table's key of a job's ``options``: those that differ from the kernel's own
    ``base`` options, as :meth:`polyc.tuning.space.SearchSpace.identity` writes them."""

    def plain(value):
        return tuple(value) if isinstance(value, list) else value

    changes = {k: list(v) if isinstance(v, tuple) else v for k, v in options.items() if plain(v) != plain(base[k])}
    return json.dumps(changes, sort_keys=True)


def _sizes(kernel, inputs) -> list[int]:
    from polyc.runtime.arguments import bind_arguments

    call = bind_arguments(kernel.definition, tuple(inputs))
    return [call.sizes[name] for name in kernel.definition.sizes]


if __name__ == "__main__":
    raise SystemExit(main())
