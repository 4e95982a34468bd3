"""The "integer" group: 8-bit matrix products (u8 x s8 -> int32) on polyc's integer gemm path,
beside polyc's own float32 sgemm of the same shape, numpy's float32 product (OpenBLAS) and
onnxruntime's MatMulInteger, in one run.

    python -m benchmarks --filter integer
    python -m benchmarks.integer_bench [--repeat N] [--json PATH] [--shapes 1024x1024x1024,...]

Each shape M x N x K runs: polyc's integer product without zero points and with one for A (as
onnxruntime's ``quantize_dynamic`` quantizes activations), polyc's float sgemm, numpy's float32
``A @ B`` and onnxruntime's MatMulInteger (with A's zero point) through one
``InferenceSession`` with ``intra_op_num_threads`` set to polyc's thread count.  polyc's results
are checked exactly against numpy's int64 product; onnxruntime's are checked too and the check
recorded (its u8 x s8 kernels are exact on VNNI processors, and saturate 16-bit pair sums
elsewhere).  Times are medians of interleaved rounds (:func:`benchmarks.measure.time_interleaved`);
ratios are the other implementation's time over polyc's integer time, so above 1 the integer
product is faster.  The C flags come from ``POLYC_CFLAGS`` (recorded), so a run with
``POLYC_CFLAGS="-O3 -mavx2 -mfma"`` measures the AVX2 code of both polyc kernels; the thread
count from ``OMP_NUM_THREADS`` (default: the usable cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

import polyc
from benchmarks.measure import time_interleaved
from polyc.target import default_optimisation_flags, host, usable_cores

#: (M, N, K): a square product, and a transformer's at batch 1 with 128 tokens (BERT-base: the
#: attention projections, the feed-forward layer's two products).
SHAPES = ((1024, 1024, 1024), (128, 768, 768), (128, 3072, 768), (128, 768, 3072))

SOURCE = """
def int8(uint8(M, K) A, int8(K, N) B) -> (Y) {
    Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))
}
def int8_zero_point(uint8(M, K) A, int8(K, N) B, uint8 ZA) -> (Y) {
    Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * int32(B(r_k, n))
}
def sgemm(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}
"""

#: The implementation every ratio is taken against.
BASE = "polyc_int8"


def shape_label(shape) -> str:
    return "x".join(str(v) for v in shape)


def thread_count() -> int:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else usable_cores()


def _onnxruntime_call(a, b, a_zero, threads: int):
    """onnxruntime's MatMulInteger of feed ``a`` by constant ``b`` with A's zero point, or None
    when onnx or onnxruntime is not installed."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import helper, numpy_helper
    except ImportError:
        return None
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b", "a_zero"], ["y"])],
        "integer",
        [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, list(a.shape))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, [a.shape[0], b.shape[1]])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.asarray(a_zero), "a_zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"a": a})[0]


def run_shape(module, shape, repeat: int, threads: int, max_seconds: float) -> dict:
    """Check and time every implementation of one shape; a JSON-ready row."""
    m, n, k = shape
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a_zero = np.uint8(rng.integers(0, 256))
    a_float, b_float = a.astype(np.float32), b.astype(np.float32)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    exact_shifted = (a.astype(np.int64) - int(a_zero)) @ b.astype(np.int64)
    functions = {
        "polyc_int8": lambda: module.int8(a, b),
        "polyc_int8_zero_point": lambda: module.int8_zero_point(a, b, a_zero),
        "polyc_sgemm": lambda: module.sgemm(a_float, b_float),
        "numpy_float32": lambda: a_float @ b_float,
    }
    ort_call = _onnxruntime_call(a, b, a_zero, threads)
    if ort_call is not None:
        functions["onnxruntime_matmulinteger"] = ort_call
    checks = {
        "polyc_int8": bool(np.array_equal(module.int8(a, b), exact)),
        "polyc_int8_zero_point": bool(np.array_equal(module.int8_zero_point(a, b, a_zero), exact_shifted)),
        "polyc_sgemm": bool(np.array_equal(module.sgemm(a_float, b_float), exact.astype(np.float32))),
    }
    if ort_call is not None:
        checks["onnxruntime_matmulinteger"] = bool(np.array_equal(ort_call(), exact_shifted))
    records = time_interleaved(functions, repeat, max_seconds)
    medians = {name: record["median"] for name, record in records.items()}
    return {
        "shape": shape_label(shape),
        "M": m,
        "N": n,
        "K": k,
        "median": medians,
        "min": {name: record["min"] for name, record in records.items()},
        "runs": {name: len(record["runs"]) for name, record in records.items()},
        "ratios": {name: medians[name] / medians[BASE] for name in medians if name != BASE},
        "gops_int8": 2.0 * m * n * k / medians[BASE] / 1e9,
        "exact": checks,
        "integer_path": module.int8.stages({"M": m, "N": n, "K": k}).path,
        "loadavg_1min": os.getloadavg()[0],
    }


def _row_text(row: dict) -> str:
    ratios = " ".join(f"{name}={ratio:.2f}x" for name, ratio in row["ratios"].items())
    wrong = [name for name, ok in row["exact"].items() if not ok]
    return f"{row['shape']:>16}  int8 {row['median'][BASE] * 1e3:8.3f} ms  {ratios}" + (
        f"  NOT EXACT: {', '.join(wrong)}" if wrong else ""
    )


def run_integer_cases(shapes, repeat: int, max_seconds: float = 20.0) -> dict:
    """Every shape's row, with the machine, flags and thread count of the run."""
    threads = thread_count()
    flags = " ".join(default_optimisation_flags())
    print(f"\nInteger products u8 x s8 -> int32 ({threads} thread(s), C flags {flags}; ratios: time / polyc int8)")
    module = polyc.define(SOURCE, tuning=False)
    rows = []
    for shape in shapes:
        row = run_shape(module, shape, repeat, threads, max_seconds)
        rows.append(row)
        print(_row_text(row), flush=True)
    return {
        "benchmark": "integer_gemm",
        "cflags": flags,
        "threads": threads,
        "machine": machine_record(),
        "rows": rows,
    }


def machine_record() -> dict:
    """The processor, its caches and vector instruction sets, the usable cores, the load at the
    start and Python's version, for a results file."""
    processor = host()
    return {
        "cpu": processor.model,
        "usable_cpus": usable_cores(),
        "caches": list(processor.caches),
        "isa": sorted(f for f in processor.flags if f.startswith(("avx", "amx")) or f in ("fma", "asimd")),
        "loadavg_start": list(os.getloadavg()),
        "python": platform.python_version(),
    }


def _git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.integer_bench", description=__doc__)
    parser.add_argument("--repeat", type=int, default=30, metavar="N", help="timed runs per implementation (30)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="where to write the results")
    parser.add_argument(
        "--shapes",
        metavar="MxNxK,...",
        help="shapes to run (default: " + ",".join(shape_label(s) for s in SHAPES) + ")",
    )
    args = parser.parse_args(argv)
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in text.split("x")) for text in args.shapes.split(","))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    results = run_integer_cases(shapes, args.repeat)
    results["started"] = started
    results["command"] = "python -m benchmarks.integer_bench" + (" " + " ".join(argv) if argv else "")
    results["polyc_commit"] = _git_commit()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nresults: {args.json}")
    return (
        0 if all(ok for row in results["rows"] for name, ok in row["exact"].items() if name.startswith("polyc")) else 1
    )


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
