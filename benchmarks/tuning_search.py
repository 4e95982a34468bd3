"""Does the tuner's cost model earn its place?  Guided against random search, trial by trial.

    python -m benchmarks.tuning_search [--trials 40] [--seeds 3] [--json PATH]

For each kernel, both strategies run ``--trials`` trials from several seeds.  Every configuration
is measured once and its outcome memoised, and both strategies read the same memo, so they are
compared on identical times: the difference between them is the search, not the machine's
noise.  The figure of merit is the number of trials a search needs before its best time is
within 5% of the best time any run found for that kernel (95% of the best speed); the table
gives its median over the seeds (a search that never gets there counts as trials + 1).
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np

import polyc
from polyc.tune import search

KERNELS = {
    "sgemm 512": ("def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
                  "sgemm", {"A": (512, 512), "B": (512, 512)}),
    "mlp 128x2000x128": ("def mlp(float(B, K) I, float(K, N) W, float(N) bias) -> (O) {\n"
                         "  O(b, n) +=! I(b, r_k) * W(r_k, n)\n  O(b, n) = fmax(O(b, n) + bias(n), 0)\n}",
                         "mlp", {"I": (128, 2000), "W": (2000, 128), "bias": (128,)}),
    "transpose-add 1024": ("def tadd(float(N, N) A, float(N, N) B) -> (C) {\n"
                           "  C(i, j) = A(j, i) + B(i, j)\n  C(i, j) = C(i, j) * 2 + A(i, j)\n}",
                           "tadd", {"A": (1024, 1024), "B": (1024, 1024)}),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tuning_search", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--filter", default="")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "tuning_search.json")
    args = parser.parse_args(argv)

    memo: dict[str, dict] = {}
    real_measure = search.measure_candidate

    def memoised(job, inputs, reference):
        key = json.dumps({k: v for k, v in job["options"].items()}, sort_keys=True, default=str)
        if key not in memo:
            memo[key] = real_measure(dict(job, limit=float("inf")), inputs, reference)
        return memo[key]

    search.measure_candidate = memoised
    machine = polyc.tune.this_machine()
    print(f"machine: {machine.describe()}")
    results = {"machine": machine.to_json(), "trials": args.trials, "seeds": args.seeds, "kernels": {}}
    print(f"{'kernel':<20} {'space':>6} {'best ms':>9} {'random: trials to 95%':>22} {'guided':>7} {'ratio':>6}")
    for title, (source, entry, shapes) in KERNELS.items():
        if args.filter not in title:
            continue
        memo.clear()
        rng = np.random.default_rng(0)
        inputs = [rng.uniform(-1, 1, size=shape).astype(np.float32) for shape in shapes.values()]
        curves: dict[str, list[list[float]]] = {"random": [], "model": []}
        for strategy in ("random", "model"):
            for seed in range(args.seeds):
                with tempfile.TemporaryDirectory() as directory:
                    kernel = polyc.define(source, tuning=False)[entry]
                    result = polyc.tune(kernel, *inputs, budget=args.trials, strategy=strategy, seed=seed,
                                        records=Path(directory) / "records.jsonl", progress=False)
                curves[strategy].append([best for _, best in result.history])
        best = min(b for runs in curves.values() for run in runs for b in run if b is not None)

        def trials_to_95(run: list) -> int:
            for trial, value in enumerate(run, 1):
                if value is not None and value <= best / 0.95:
                    return trial
            return args.trials + 1
        needed = {s: statistics.median(trials_to_95(run) for run in runs) for s, runs in curves.items()}
        ratio = needed["model"] / needed["random"]
        space = search.space_for(kernel.definition, dict(zip(kernel.definition.sizes, _sizes(kernel, inputs))),
                                 kernel.options)
        print(f"{title:<20} {space.size:>6} {best * 1e3:>9.3f} {needed['random']:>22} {needed['model']:>7} "
              f"{ratio:>6.2f}")
        results["kernels"][title] = {"space": space.path, "space_size": space.size, "best_seconds": best,
                                     "trials_to_95": needed, "curves": curves, "distinct_measured": len(memo)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.json}")
    return 0


def _sizes(kernel, inputs) -> list[int]:
    from polyc.runtime.arguments import bind_arguments
    call = bind_arguments(kernel.definition, tuple(inputs))
    return [call.sizes[name] for name in kernel.definition.sizes]


if __name__ == "__main__":
    raise SystemExit(main())
