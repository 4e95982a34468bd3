"""Latency percentiles of small kernels on an idle machine and beside a busy process.

    python -m benchmarks.tail_latency [--calls 400] [--json PATH]

An inference server cares about the slow calls, not the median: on a machine with other work,
a parallel kernel whose thread lost its core waits a scheduler slice for it.  For each case
(sgemm 256, the MLP layer 128x2000x128 with bias and ReLU), polyc and numpy (OpenBLAS) are
timed call by call, first on the machine as it is, then with one competing process that spins
on the CPU (started here, so every run has the same competitor), and the 50th, 90th and 99th
percentiles are printed with polyc's p90 over numpy's.  Calls are spaced by 1 ms, as requests
are, so thread pools go idle between them.  Implementations alternate in blocks of 100 calls so
that a change of the machine's load reaches both alike, with a pause of 0.3 s before each block
(OpenBLAS's threads spin for about 0.1 s after its last call and would take the cores from the
next block's implementation).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import polyc
from polyc.runtime.compiler import CompilerOptions

SGEMM = "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
MLP = """def mlp1(float(B, M) I, float(M, N) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, r_m) * W1(r_m, n)
    O1(b, n) = fmax(O1(b, n) + B1(n), 0)
}"""
BLOCK = 100
PAUSE = 0.3


def cases(rng: np.random.Generator) -> dict:
    A, B = rng.random((256, 256), dtype=np.float32), rng.random((256, 256), dtype=np.float32)
    I, W, b = (
        rng.random((128, 2000), dtype=np.float32),
        rng.random((2000, 128), dtype=np.float32),
        rng.random(128, dtype=np.float32),
    )
    sgemm = polyc.define(SGEMM, tuning=False).sgemm
    mlp = polyc.define(MLP, tuning=False).mlp1
    return {
        "sgemm 256": {"polyc": lambda: sgemm(A, B), "numpy": lambda: A @ B},
        "mlp 128x2000x128": {"polyc": lambda: mlp(I, W, b), "numpy": lambda: np.maximum(I @ W + b, 0)},
    }


def measure(functions: dict, calls: int) -> dict:
    times = {name: [] for name in functions}
    for function in functions.values():
        for _ in range(5):
            function()
    while any(len(t) < calls for t in times.values()):
        for name, function in functions.items():
            time.sleep(PAUSE)
            for _ in range(min(BLOCK, calls - len(times[name]))):
                start = time.perf_counter()
                function()
                times[name].append(time.perf_counter() - start)
                time.sleep(0.001)
    return {
        name: {
            "p50": float(np.percentile(t, 50)),
            "p90": float(np.percentile(t, 90)),
            "p99": float(np.percentile(t, 99)),
            "calls": len(t),
        }
        for name, t in times.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tail_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--calls", type=int, default=400, help="timed calls per implementation and setting")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "tail_latency.json")
    args = parser.parse_args(argv)
    machine = polyc.tuning.this_machine()
    # The C flags belong to the figures ($POLYC_CFLAGS can build AVX2 code on an AVX-512 machine).
    flags = " ".join(CompilerOptions().flags)
    print(f"machine: {machine.describe()}; load {os.getloadavg()[0]:.2f}\nC flags: {flags}")
    results = {"machine": machine.to_json(), "cflags": flags, "calls": args.calls, "settings": {}}
    all_cases = cases(np.random.default_rng(0))
    for setting in ("idle", "one busy process"):
        busy = None
        if setting != "idle":
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            time.sleep(0.5)
        try:
            results["settings"][setting] = {
                title: measure(functions, args.calls) for title, functions in all_cases.items()
            }
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        print(f"\n{setting}:")
        print(f"  {'case':<18} {'impl':<6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
        for title, by_impl in results["settings"][setting].items():
            for name, p in by_impl.items():
                print(f"  {title:<18} {name:<6} {p['p50'] * 1e3:>8.3f} {p['p90'] * 1e3:>8.3f} {p['p99'] * 1e3:>8.3f}")
            ratio = by_impl["polyc"]["p90"] / by_impl["numpy"]["p90"]
            by_impl["p90_polyc_over_numpy"] = ratio
            print(f"  {title:<18} polyc p90 / numpy p90: {ratio:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nraw results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
