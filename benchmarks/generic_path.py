"""The "generic" group: polyc's generic loop nest (every dedicated kernel off) beside the kernel
polyc picks by default, on the same def and inputs, in one run (issue 80's bar for the generic
path: at least 0.7x the dedicated path's speed).

    python -m benchmarks.generic_path [--repeat N] [--json PATH] [--cases sgemm,group_conv,...]

Each case (:data:`CASES`) is compiled twice from the same TC: with polyc's defaults (its path,
recorded: gemm, a direct convolution, ...) and with ``blas_contractions=False,
direct_convolutions=False, transpose_kernels=False`` (the generic path: isl's schedule, tiled,
parallel and vectorised).  Both are checked against numpy in float64 (the benchmark suite's
tolerance) and timed in interleaved rounds (:func:`benchmarks.measure.time_interleaved`); the
ratio is the default path's median over the generic path's (above 0.7: the issue's bar met).
The C flags come from ``POLYC_CFLAGS`` (recorded), so a run with ``POLYC_CFLAGS="-O3 -mavx2
-mfma"`` measures AVX2 code; the thread count from ``OMP_NUM_THREADS`` (default: the usable cores).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import polyc
from benchmarks import cases as suite
from benchmarks.integer_bench import _git_commit, machine_record, thread_count
from benchmarks.measure import time_interleaved
from benchmarks.run import as_tuple, compare, make_inputs
from polyc.target import default_optimisation_flags

#: The options that keep a def on the generic path.
GENERIC = {"blas_contractions": False, "direct_convolutions": False, "transpose_kernels": False}

#: The acceptance bar: the generic path's speed over the default path's.
BAR = 0.7


def strided_conv3x3(n: int, c: int, f: int, h: int, w: int, stride: int) -> suite.Case:
    """A 3x3 convolution of stride ``stride`` (a ResNet's downsampling layer), bias added."""
    k = 3
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1

    def numpy_conv(I, W1, B):
        windows = sliding_window_view(I, (k, k), axis=(2, 3))[:, :, ::stride, ::stride][:, :, :oh, :ow]
        out = np.einsum("nchwxy,fcxy->nfhw", windows, W1, optimize=True)
        return out + B[None, :, None, None]

    return suite.Case(
        "strided_conv3x3",
        suite.CONVOLUTION,
        dict(N=n, C=c, F=f, H=h, W=w, KH=k, KW=k),
        f"""
def strided_conv3x3(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B) -> (O) {{
    O(n, f, h, w) +=! I(n, r_c, {stride} * h + r_kh, {stride} * w + r_kw) * W1(f, r_c, r_kh, r_kw)
    O(n, f, h, w)  = O(n, f, h, w) + B(f)
}}""",
        "strided_conv3x3",
        numpy=numpy_conv,
        einsum=None,
        naive_c="",
        flops=2.0 * n * f * oh * ow * (c * k * k + 1),
        reduction=c * k * k + 1,
        note=f"3x3 convolution of stride {stride}, bias added",
    )


def generic_cases() -> list[suite.Case]:
    """The issue's cases: sgemm 1024 and 2048, a grouped convolution, a batched matmul of
    64 x 128x64x128 and a strided 3x3 convolution."""
    return [
        suite.sgemm(1024),
        suite.sgemm(2048),
        suite.group_conv(1, 32, 16, 16, 56, 56, 3),  # 512 channels in groups of 16 (RegNet-like)
        suite.batch_matmul(64, 128, 64, 128),
        strided_conv3x3(1, 128, 128, 57, 57, 2),
    ]


def run_case(case: suite.Case, repeat: int, max_seconds: float) -> dict:
    """Check and time the default and the generic path of one case; a JSON-ready row."""
    kernels = {
        "default": polyc.define(case.source, filename=f"<{case.name}>", tuning=False)[case.entry],
        "generic": polyc.define(case.source, filename=f"<{case.name}>", tuning=False, **GENERIC)[case.entry],
    }
    definition = kernels["default"].definition
    inputs = make_inputs(case, definition, np.random.default_rng(0))
    dtypes = tuple(definition.tensor(name).dtype for name in definition.outputs)
    reference = as_tuple(case.numpy(*(x.astype(np.float64) for x in inputs)))
    sizes = dict(case.sizes)
    sizes = {name: value for name, value in sizes.items() if name in definition.sizes}
    checks, paths, functions = {}, {}, {}
    for name, kernel in kernels.items():
        checks[name] = compare(as_tuple(kernel(*inputs)), reference, dtypes, case.reduction)
        paths[name] = kernel.stages(sizes).path
        functions[name] = lambda kernel=kernel: kernel(*inputs)
    records = time_interleaved(functions, repeat, max_seconds)
    medians = {name: record["median"] for name, record in records.items()}
    return {
        "case": case.name,
        "size": case.size_label,
        "sizes": sizes,
        "paths": paths,
        "median": medians,
        "min": {name: record["min"] for name, record in records.items()},
        "runs": {name: len(record["runs"]) for name, record in records.items()},
        "gflops": {name: case.flops / median / 1e9 for name, median in medians.items()},
        "generic_over_default": medians["default"] / medians["generic"],
        "checks": checks,
        "loadavg_1min": os.getloadavg()[0],
    }


def _row_text(row: dict) -> str:
    ok = all(check["ok"] for check in row["checks"].values())
    return (
        f"{row['case']:<16} {row['size']:<24} {row['paths']['default']:<12} "
        f"{row['median']['default'] * 1e3:9.3f} ms  generic {row['median']['generic'] * 1e3:9.3f} ms  "
        f"{row['generic_over_default']:5.2f}x" + ("" if ok else "  CHECK FAILED")
    )


def run_generic_cases(cases: list[suite.Case], repeat: int, max_seconds: float = 20.0) -> dict:
    """Every case's row, with the machine, flags and thread count of the run."""
    threads = thread_count()
    flags = " ".join(default_optimisation_flags())
    print(
        f"\nThe generic path beside polyc's default path ({threads} thread(s), C flags {flags}; "
        f"ratio: default time / generic time, the bar {BAR}x)"
    )
    rows = []
    for case in cases:
        row = run_case(case, repeat, max_seconds)
        rows.append(row)
        print(_row_text(row), flush=True)
    ratios = [row["generic_over_default"] for row in rows]
    return {
        "benchmark": "generic_path",
        "cflags": flags,
        "threads": threads,
        "bar": BAR,
        "machine": machine_record(),
        "rows": rows,
        "summary": {
            "geomean_generic_over_default": float(np.exp(np.mean(np.log(ratios)))) if ratios else None,
            "below_bar": [f"{row['case']} {row['size']}" for row in rows if row["generic_over_default"] < BAR],
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generic_path", description=__doc__)
    parser.add_argument("--repeat", type=int, default=15, metavar="N", help="timed runs per implementation (15)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="where to write the results")
    parser.add_argument("--cases", metavar="NAME,...", help="only the cases of these names")
    args = parser.parse_args(argv)
    cases = generic_cases()
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [case for case in cases if case.name in wanted]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results = run_generic_cases(cases, args.repeat)
    results["started"] = started
    results["command"] = "python -m benchmarks.generic_path" + (" " + " ".join(argv) if argv else "")
    results["polyc_commit"] = _git_commit()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nresults: {args.json}")
    return 0 if all(check["ok"] for row in results["rows"] for check in row["checks"].values()) else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
