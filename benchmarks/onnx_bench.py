"""The real models through polyc beside onnxruntime: latency and compile times.

    python -m benchmarks.onnx_bench [--models resnet18,encoder] [--batches 1,8] [--repeat 10] [--json PATH]
                                    [--tuned | --tune SECONDS] [--float16]

For each model (benchmarks/onnx_models) and batch size (224x224 images; 128-token sequences
for the encoder): polyc's median latency with graph fusion and without (``graph_fusion=False``),
onnxruntime's with its default graph optimisations and with them off, all on the same number
of threads (the machine's cores; onnxruntime's ``intra_op_num_threads`` set to match), and
polyc's compile time cold (an empty kernel cache, in a new process) and warm (a new process
whose kernels are all in the cache): from the session's creation, the model in memory, to the end
of its first run.  The four are timed in interleaved rounds
(:func:`benchmarks.measure.time_interleaved`), medians of ``--repeat`` calls each.  polyc's
outputs are compared with onnxruntime's first.  Ratios are onnxruntime time / polyc time: above 1, polyc is faster.

polyc runs with its defaults (``tuning=False``: no tuning records).  ``--tuned`` adds a column
for polyc with this machine's tuning records; ``--tune SECONDS`` first tunes each model's
session at each batch with that budget (``polyc.tune(session, feeds)``: every kernel, the
budget shared by their times) and reports the tuning time, then as ``--tuned``.

``--float16`` runs each model converted to float16 (weights, activations, input and output)
by onnxruntime's ``convert_float_to_float16``, as onnxconverter-common makes them, in both; the
check is then onnxruntime's float16 accuracy: polyc's output within 8 float16 roundings
(8 x 2^-11) of the output's range from onnxruntime's, and for the image models the same top-1
class.  The JSON then records ``"float16": true``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.measure import time_interleaved  # noqa: E402
from benchmarks.onnx_models import MODELS, load  # noqa: E402

_COMPILE_SCRIPT = """
import sys, time, numpy as np
sys.path.insert(0, {repo!r})
from benchmarks.onnx_models import load
from benchmarks.onnx_bench import prepared
import polyc.onnx
model = prepared(load({name!r}), {float16!r})  # the test weights made from their seeds: not compiling
start = time.perf_counter()
session = polyc.onnx.InferenceSession(model, tuning=False)
session.run(None, {{"input": np.zeros({shape!r}, np.float16 if {float16!r} else np.float32)}})
print(time.perf_counter() - start)
"""


def input_shape(name: str, batch: int) -> tuple[int, ...]:
    return (batch, 128, 768) if name == "encoder" else (batch, 3, 224, 224)


def prepared(model, float16: bool):
    """``model``, or its float16 conversion (onnxruntime's, input and output included)."""
    if not float16:
        return model
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(model, keep_io_types=False)


def agrees(got: np.ndarray, expected: np.ndarray, float16: bool) -> bool:
    """Whether polyc's output matches onnxruntime's: float32 within 1e-3 relative; float16
    within 8 float16 roundings of the output's range, and the same top-1 class of a classifier."""
    if not float16:
        return bool(np.allclose(got, expected, rtol=1e-3, atol=1e-4))
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    close = np.abs(got - expected).max() <= 8 * 2.0**-11 * np.ptp(expected)
    same_class = got.ndim != 2 or bool((got.argmax(axis=1) == expected.argmax(axis=1)).all())
    return bool(close and same_class)


def compile_seconds(name: str, shape, cache: str, float16: bool = False) -> float:
    script = _COMPILE_SCRIPT.format(repo=str(REPO), name=name, shape=tuple(shape), float16=float16)
    # With Python's bytecode cache, as an installed package runs: where PYTHONDONTWRITEBYTECODE
    # is set, every new process would compile polyc's modules from source (0.1-0.2 s of a warm
    # start), which is not polyc's compiling.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**environment, "POLYC_CACHE_DIR": cache},
        timeout=3600,
    )
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed")
    return float(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "onnx_last.json")
    parser.add_argument("--float16", action="store_true", help="the models converted to float16, in both")
    tuning = parser.add_mutually_exclusive_group()
    tuning.add_argument("--tuned", action="store_true", help="also time polyc with this machine's tuning records")
    tuning.add_argument(
        "--tune",
        type=float,
        metavar="SECONDS",
        help="tune each model's session with this budget first, then as --tuned",
    )
    args = parser.parse_args(argv)
    if args.tune is not None and args.tune <= 0:
        parser.error("--tune needs a positive number of seconds")
    pairs = [(name, int(batch)) for name in args.models.split(",") for batch in args.batches.split(",")]
    results = run_models(pairs, args.repeat, args.tuned or args.tune is not None, args.tune, args.float16)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.json}")
    return 1 if any(not row.get(key, True) for row in results["rows"] for key in CHECKS) else 0


#: The agreement checks of a row, one per polyc session.
CHECKS = ("polyc_ok", "polyc_unfused_ok", "polyc_tuned_ok")


def run_models(
    pairs, repeat: int, tuned: bool = False, tune_seconds: float | None = None, float16: bool = False
) -> dict:
    """Measure each (model, batch) of ``pairs``, printing a table row as each finishes; the
    results as JSON-ready data (also what ``python -m benchmarks`` keeps under "onnx").
    ``tuned``: also polyc with this machine's tuning records, after tuning each session for
    ``tune_seconds`` when given; ``float16``: the models converted to float16."""
    import onnxruntime as ort

    import polyc
    import polyc.onnx

    threads = len(os.sched_getaffinity(0))
    machine = polyc.tuning.this_machine()
    print(f"machine: {machine.describe()}; onnxruntime {ort.__version__} on {threads} threads")
    header = (
        f"{'model':<16} {'batch':>5} {'polyc ms':>9} {'unfused':>9} {'ort ms':>8} {'ort noopt':>9} "
        f"{'ort/polyc':>9} {'fusion x':>8} {'cold s':>7} {'warm s':>7}"
        + (f" {'tuned ms':>9} {'ort/tuned':>9} {'tuning s':>8}" if tuned else "")
        + " check"
    )
    print(header + "\n" + "-" * len(header))
    results = {"machine": machine.to_json(), "threads": threads, "float16": float16, "rows": []}
    if os.environ.get("POLYC_CFLAGS"):
        results["polyc_cflags"] = os.environ["POLYC_CFLAGS"]
    for name, batch in pairs:
        model = prepared(load(name), float16)
        data = model.SerializeToString()
        shape = input_shape(name, batch)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float16 if float16 else np.float32)
        row = {"model": name, "batch": batch}
        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            reference = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            expected = reference.run(None, {"input": x})[0]
            plain = ort.SessionOptions()
            plain.intra_op_num_threads = threads
            plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            unoptimised = ort.InferenceSession(data, plain, providers=["CPUExecutionProvider"])
            with tempfile.TemporaryDirectory() as cache:
                row["cold_compile"] = compile_seconds(name, shape, cache, float16)
                row["warm_compile"] = compile_seconds(name, shape, cache, float16)
            runs = {"ort": reference.run, "ort_noopt": unoptimised.run}
            sessions = {"polyc": {"tuning": False}, "polyc_unfused": {"tuning": False, "graph_fusion": False}}
            if tuned:
                sessions["polyc_tuned"] = {}
                if tune_seconds is not None:
                    start = time.perf_counter()
                    polyc.tune(
                        polyc.onnx.InferenceSession(model), {"input": x}, seconds=float(tune_seconds), progress=False
                    )
                    row["tuning_seconds"] = time.perf_counter() - start
            for key, options in sessions.items():
                session = polyc.onnx.InferenceSession(model, **options)
                got = session.run(None, {"input": x})[0]
                row[f"{key}_ok"] = agrees(got, expected, float16)
                runs[key] = session.run
                if key == "polyc":
                    row["kernels"] = len(session.groups)
            # In interleaved rounds, so that a change of the shared machine's load during the
            # row reaches every implementation alike and the ratios hold.
            times = time_interleaved(
                {key: (lambda run=run: run(None, {"input": x})) for key, run in runs.items()}, repeat, max_seconds=60.0
            )
            row.update({key: record["median"] for key, record in times.items()})
        except Exception as error:  # a row that fails says so; the others still run
            row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
        results["rows"].append(row)
        if "error" in row:
            print(f"{name:<16} {batch:>5} ERROR {row['error']}", flush=True)
            continue
        check = "ok" if all(row.get(key, True) for key in CHECKS) else "MISMATCH"
        tuned_columns = ""
        if tuned:
            tuning_time = f"{row['tuning_seconds']:>8.0f}" if "tuning_seconds" in row else f"{'-':>8}"
            tuned_columns = f" {row['polyc_tuned'] * 1e3:>9.2f} {row['ort'] / row['polyc_tuned']:>8.2f}x {tuning_time}"
        print(
            f"{name:<16} {batch:>5} {row['polyc'] * 1e3:>9.2f} {row['polyc_unfused'] * 1e3:>9.2f} "
            f"{row['ort'] * 1e3:>8.2f} {row['ort_noopt'] * 1e3:>9.2f} {row['ort'] / row['polyc']:>8.2f}x "
            f"{row['polyc_unfused'] / row['polyc']:>7.2f}x {row['cold_compile']:>7.1f} "
            f"{row['warm_compile']:>7.2f}{tuned_columns} {check}",
            flush=True,
        )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
