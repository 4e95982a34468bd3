"""Models nobody tuned polyc for, beside onnxruntime: the ONNX model zoo benchmark.

    python -m benchmarks.onnx_zoo [--models resnet34,lstm_lm] [--batch 1,8] [--repeat 10] [--quick]
                                  [--json PATH] [--update] [--torch-python PATH]

Each model of :data:`MODELS` (torchvision's classification and segmentation models, transformers,
recurrent and 1-D convolution models, random weights from a fixed seed; see
``benchmarks/zoo_export.py``) is exported with torch at each batch, in a subprocess running a
Python that has torch (``--torch-python``, else ``$POLYC_ZOO_TORCH_PYTHON``, else this Python if
it can import torch): polyc and its tests never need torch.  The exported files are cached in
``$POLYC_ZOO_CACHE`` (default ``~/.cache/polyc/zoo``) under the torch version and a digest of
the export script's syntax tree, so a changed model definition exports again.

Then, for each model and batch:

- polyc's cold compile: a new process, an empty kernel cache, from the session's creation to
  the end of its first run;
- in a second new process whose kernels are all in that cache: the warm compile, measured the
  same way; polyc's outputs compared with onnxruntime's (the ONNX backend tests' tolerance,
  rtol 1e-3 and atol 1e-5); the median times of ``--repeat`` runs of each, in interleaved
  rounds (:func:`benchmarks.measure.time_interleaved`); onnxruntime on ``--threads`` threads
  (``intra_op_num_threads``, default 2), polyc with its defaults; and polyc's slowest kernels
  (:meth:`polyc.onnx.InferenceSession.profile`).

A model that fails (its export, polyc refusing it, a crash, a mismatch, a timeout) is recorded
with its error and the others still run.  The ratio is onnxruntime's time over polyc's (above
1, polyc is faster); the geometric mean is over the rows whose outputs match.  Results go to
``--json`` (default ``benchmarks/results/onnx_zoo.json``), rewritten after each row;
``--update`` keeps the rows of that file that this run does not measure (each run's arguments
and start are listed under ``invocations``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPORT_SCRIPT = REPO / "benchmarks" / "zoo_export.py"

#: The zoo, in the order of issue 80; the names are those of ``zoo_export.ZOO``.
MODELS = (
    "resnet34",
    "resnext50_32x4d",
    "wide_resnet50_2",
    "regnet_x_800mf",
    "densenet169",
    "googlenet",
    "inception_v3",
    "squeezenet1_0",
    "shufflenet_v2_x1_0",
    "mnasnet1_0",
    "mobilenet_v3_large",
    "efficientnet_b1",
    "efficientnet_v2_s",
    "convnext_small",
    "swin_t",
    "maxvit_t",
    "vit_b_32",
    "lraspp_mobilenet_v3_large",
    "transformer_encoder",
    "decoder_only",
    "gru_bidirectional",
    "lstm_lm",
    "audio_conv1d",
)
#: ``--quick``: a few small models of different families, at batch 1.
QUICK = ("squeezenet1_0", "mobilenet_v3_large", "gru_bidirectional", "audio_conv1d")

#: The ONNX backend tests' tolerance (tests/onnx/real_models.py).
RTOL, ATOL = 1e-3, 1e-5

#: polyc's slowest kernels kept per row.
PROFILE_KERNELS = 5


def torch_python(option: str | None) -> str | None:
    """The Python that exports: ``option``, else $POLYC_ZOO_TORCH_PYTHON, else this one if it has
    torch, else None."""
    if option or os.environ.get("POLYC_ZOO_TORCH_PYTHON"):
        return option or os.environ["POLYC_ZOO_TORCH_PYTHON"]
    import importlib.util

    return sys.executable if importlib.util.find_spec("torch") is not None else None


def export_directory(python: str | None) -> Path:
    """Where this exporter's files are cached: under the torch version and a digest of the
    export script (its models' definitions, seeds and export settings)."""
    root = Path(os.environ.get("POLYC_ZOO_CACHE") or Path.home() / ".cache" / "polyc" / "zoo").expanduser()
    # Of the syntax tree, so that a change of layout alone keeps the files.
    digest = hashlib.sha256(ast.dump(ast.parse(EXPORT_SCRIPT.read_text())).encode()).hexdigest()[:12]
    version = "unknown"
    if python is not None:
        try:
            run = subprocess.run(
                [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except OSError:  # said by each export's error
            run = None
        if run is not None and run.returncode == 0:
            version = run.stdout.strip()
    return root / f"torch-{version}" / digest


def export_missing(names: list[str], batch: int, directory: Path, python: str | None) -> dict[str, str]:
    """Export the models of ``names`` not yet in ``directory`` at ``batch``; their errors by name."""
    missing = [name for name in names if not (directory / f"{name}_b{batch}.onnx").exists()]
    if not missing:
        return {}
    if python is None:
        reason = "no Python with torch to export with: give --torch-python or set POLYC_ZOO_TORCH_PYTHON"
        return dict.fromkeys(missing, reason)
    print(f"exporting {', '.join(missing)} at batch {batch} with {python}", flush=True)
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / f"export_b{batch}.log"
    command = [python, str(EXPORT_SCRIPT), "--out", str(directory), "--batch", str(batch), *missing]
    errors = {}
    try:
        with open(log, "a") as stderr:
            run = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=3600)
        reported = {}
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
                reported[result["model"]] = result
        for name in missing:
            result = reported.get(name) or {"error": f"the exporter stopped (exit {run.returncode}); see {log}"}
            if not result.get("ok"):
                errors[name] = "export: " + result["error"]
    except subprocess.TimeoutExpired:
        errors = {name: "export: timed out" for name in missing if not (directory / f"{name}_b{batch}.onnx").exists()}
    except OSError as error:
        errors = dict.fromkeys(missing, f"export: cannot run {python}: {error}")
    return errors


_COLD_SCRIPT = """
import sys, time, numpy as np
import polyc.onnx
feeds = dict(np.load({feeds!r}))
start = time.perf_counter()
session = polyc.onnx.InferenceSession({model!r})
session.run(None, feeds)
print(time.perf_counter() - start)
"""

_MEASURE_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
from benchmarks.onnx_zoo import measure
print(json.dumps(measure({model!r}, {feeds!r}, {repeat!r}, {threads!r})))
"""


def _environment(cache: str) -> dict:
    # With Python's bytecode cache, as an installed package runs: without it every new process
    # compiles polyc's modules from source, which is not polyc's compiling.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**environment, "POLYC_CACHE_DIR": cache}


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run_row(name: str, batch: int, directory: Path, repeat: int, threads: int, timeout: float) -> dict:
    """One model at one batch: the cold compile in a new process, then the warm compile, the
    check and the times in another (:func:`measure`), sharing an empty kernel cache."""
    model, feeds = directory / f"{name}_b{batch}.onnx", directory / f"{name}_b{batch}.npz"
    row: dict = {"model": name, "batch": batch}
    with tempfile.TemporaryDirectory(prefix="polyc-zoo-") as cache:
        environment = _environment(cache)
        try:
            script = _COLD_SCRIPT.format(model=str(model), feeds=str(feeds))
            run = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=timeout
            )
            if run.returncode != 0:
                row["error"] = "polyc: " + (_last_line(run.stderr) or f"exit {run.returncode}")
                return row
            row["cold_compile"] = float(_last_line(run.stdout))
            script = _MEASURE_SCRIPT.format(
                repo=str(REPO), model=str(model), feeds=str(feeds), repeat=repeat, threads=threads
            )
            run = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=timeout
            )
            if run.returncode != 0:
                row["error"] = "measure: " + (_last_line(run.stderr) or f"exit {run.returncode}")
                return row
            row.update(json.loads(_last_line(run.stdout)))
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {timeout:.0f} s" + (" (cold compile)" if "cold_compile" not in row else "")
    return row


def measure(model_path: str, feeds_path: str, repeat: int, threads: int) -> dict:
    """In a process whose kernel cache holds the model's kernels: polyc's warm compile, its
    outputs against onnxruntime's, both medians and polyc's slowest kernels (JSON-ready)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    import polyc.onnx
    from benchmarks.measure import time_interleaved

    feeds = dict(np.load(feeds_path))
    start = time.perf_counter()
    session = polyc.onnx.InferenceSession(model_path)
    got = session.run(None, feeds)
    row: dict = {"warm_compile": time.perf_counter() - start, "kernels": len(session.groups)}

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    reference = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    expected = reference.run(None, feeds)
    errors, scale, match = [], 0.0, len(got) == len(expected)
    for g, e in zip(got, expected):
        g64, e64 = np.asarray(g, np.float64), np.asarray(e, np.float64)
        if g64.shape != e64.shape:
            match = False
            continue
        scale = max(scale, float(np.max(np.abs(e64))) if e64.size else 0.0)
        errors.append(float(np.max(np.abs(g64 - e64))) if e64.size else 0.0)
        match = match and bool(np.allclose(g64, e64, rtol=RTOL, atol=ATOL))
    row.update(match=match, max_abs_error=max(errors, default=None), output_scale=scale)

    times = time_interleaved(
        {"polyc": lambda: session.run(None, feeds), "ort": lambda: reference.run(None, feeds)},
        repeat,
        max_seconds=30.0,
    )
    row.update({key: record["median"] for key, record in times.items()})
    row["min"] = {key: record["min"] for key, record in times.items()}
    row["runs"] = {key: len(record["runs"]) for key, record in times.items()}
    # The machine is shared: how busy it was while the row ran, beside the row's times.
    row["load_average"] = os.getloadavg()[0]

    op_types = {node.name: node.op_type for node in onnx.load(model_path, load_external_data=False).graph.node}
    try:
        kernels = session.profile(feeds, repeat=3)
    except Exception as error:  # the profile is a help to read the row, not the row itself
        row["profile_error"] = f"{type(error).__name__}: {error}"
    else:
        total = sum(k.seconds for k in kernels) or 1.0
        by_op: dict[str, float] = {}
        for k in kernels:
            first = operator(k.nodes[0], op_types) if k.nodes else "?"
            by_op[first] = by_op.get(first, 0.0) + k.seconds / total
        row["time_by_first_op"] = dict(sorted(by_op.items(), key=lambda item: -item[1]))
        row["slowest_kernels"] = [
            {"name": k.name, "ms": k.seconds * 1e3, "ops": [operator(n, op_types) for n in k.nodes]}
            for k in sorted(kernels, key=lambda k: -k.seconds)[:PROFILE_KERNELS]
        ]
    return row


def operator(node: str, op_types: dict[str, str]) -> str:
    """The operator of a kernel's node: its ONNX op type, or "layout" for the NCHW/NHWC
    conversions polyc inserts around channels-last convolutions (named "TENSOR to NHWC")."""
    if node in op_types:
        return op_types[node]
    return "layout" if node.endswith((" to NHWC", " to NCHW")) else node


def machine_fingerprint():
    from polyc.runtime.machine import this_machine

    return this_machine()


def cpu() -> str:
    """The processor as /proc/cpuinfo names it, and its microarchitecture where polyc knows it
    (virtual machines often say only "AMD EPYC")."""
    from polyc.runtime.machine import this_machine

    machine = this_machine()
    return " ".join(filter(None, (machine.cpu_model, machine.microarchitecture)))


def summary(rows: list[dict]) -> dict:
    """The geometric mean of onnxruntime's time over polyc's, over the rows that match, in all
    and per batch; the rows that failed."""

    def geomean(selected):
        ratios = [row["ort"] / row["polyc"] for row in selected]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    measured = [row for row in rows if row.get("match") and row.get("polyc") and row.get("ort")]
    batches = sorted({row["batch"] for row in measured})
    return {
        "geomean_ort_over_polyc": geomean(measured),
        "geomean_by_batch": {str(b): geomean([row for row in measured if row["batch"] == b]) for b in batches},
        "rows_measured": len(measured),
        "failures": [
            {"model": row["model"], "batch": row["batch"], "error": row.get("error") or "mismatch"}
            for row in rows
            if row not in measured
        ],
    }


HEADER = f"{'model':<26} {'batch':>5} {'polyc ms':>9} {'ort ms':>9} {'ort/polyc':>9} {'cold s':>7} {'warm s':>7} check"


def format_row(row: dict) -> str:
    if "error" in row and "polyc" not in row:
        return f"{row['model']:<26} {row['batch']:>5} ERROR {row['error']}"
    check = "ok" if row.get("match") else f"MISMATCH (max |error| {row.get('max_abs_error')})"
    return (
        f"{row['model']:<26} {row['batch']:>5} {row['polyc'] * 1e3:>9.2f} {row['ort'] * 1e3:>9.2f} "
        f"{row['ort'] / row['polyc']:>8.2f}x {row['cold_compile']:>7.1f} {row['warm_compile']:>7.2f} {check}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_zoo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", help=f"comma-separated, of: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs of each, at most (default 10)")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK)} at batch 1")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra_op_num_threads (default 2)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for each process of a row")
    parser.add_argument("--torch-python", help="the Python that exports (has torch, torchvision, onnx)")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "onnx_zoo.json")
    parser.add_argument("--update", action="store_true", help="keep the --json file's rows this run does not measure")
    args = parser.parse_args(argv)
    names = list(QUICK) if args.quick and not args.models else (args.models.split(",") if args.models else list(MODELS))
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"no zoo model named {', '.join(unknown)}; the zoo: {', '.join(MODELS)}")
    batches = [1] if args.quick else [int(b) for b in args.batch.split(",")]

    import onnxruntime as ort

    import polyc

    python = torch_python(args.torch_python)
    directory = export_directory(python)
    kept, invocations = [], []
    if args.update and args.json.exists():
        previous = json.loads(args.json.read_text())
        measured = {(name, batch) for name in names for batch in batches}
        kept = [row for row in previous["rows"] if (row["model"], row["batch"]) not in measured]
        invocations = previous.get("invocations") or [
            {"arguments": previous["command"].removeprefix("python -m benchmarks.onnx_zoo").strip(), "started": started}
            for started in filter(None, [previous.get("started")])
        ]
    invocations.append(
        {
            "arguments": shlex.join(argv if argv is not None else sys.argv[1:]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
    )
    results = {
        "benchmark": "onnx_zoo",
        "command": "python -m benchmarks.onnx_zoo",
        "invocations": invocations,
        "machine": {**machine_fingerprint().to_json(), "cpu": cpu(), "platform": platform.platform()},
        "threads": f"onnxruntime {args.threads} (intra_op_num_threads); polyc its default",
        "polyc_cflags": os.environ.get("POLYC_CFLAGS") or "polyc's default (-O3 -march=native)",
        "versions": {"polyc": getattr(polyc, "__version__", "?"), "onnxruntime": ort.__version__},
        "exports": str(directory),
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "repeat": args.repeat,
        "rows": kept,
    }
    print(f"machine: {results['machine']['cpu']}; {results['threads']}; exports in {directory}")
    print(HEADER + "\n" + "-" * len(HEADER), flush=True)
    for batch in batches:
        export_errors = export_missing(names, batch, directory, python)
        for name in names:
            if name in export_errors:
                row = {"model": name, "batch": batch, "error": export_errors[name]}
            else:
                row = run_row(name, batch, directory, args.repeat, args.threads, args.timeout)
            results["rows"] = [r for r in results["rows"] if (r["model"], r["batch"]) != (name, batch)] + [row]
            results["rows"].sort(key=lambda r: (r["batch"], MODELS.index(r["model"])))
            results["summary"] = summary(results["rows"])
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
            print(format_row(row), flush=True)
    means = results["summary"]
    if means["geomean_ort_over_polyc"] is not None:
        per_batch = ", ".join(f"batch {b}: {m:.2f}x" for b, m in means["geomean_by_batch"].items())
        print(f"geometric mean of onnxruntime / polyc: {means['geomean_ort_over_polyc']:.2f}x ({per_batch})")
    print(f"{len(means['failures'])} failed; results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
