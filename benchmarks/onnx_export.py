"""Exported models (``session.export``) beside the session that made them and onnxruntime.

    python -m benchmarks.onnx_export [--models resnet18,mobilenet_v2,encoder,resnet18:qdq]
                                     [--batch 1] [--threads 2] [--repeat 30] [--rounds 3]
                                     [--json PATH]

For each model (a float model of ``benchmarks/onnx_models``, or ``model:kind`` for a quantized
or float16 variant made with onnxruntime's tools as :mod:`benchmarks.onnx_quantized` makes
them) at the batch size: the session exports it for the host, ``make`` builds it (the build's
seconds), and the demo runs on a random input saved as ``.npy``.  Its outputs are compared
with the session's (the same kernels: expected equal) and with onnxruntime's (relative to the
output's range).  Then, in ``--rounds`` interleaved rounds, each in a process of its own: the
demo (``-r REPEAT -t THREADS``), a Python process running the polyc session and one running
onnxruntime (``intra_op_num_threads=THREADS``), each timing ``--repeat`` runs after a warm-up.
A row gives the medians over rounds of each round's median, the ratio of the session's time
over the export's (above 1: the export is faster), and the sizes a deployment cares about:
the kernels' objects (``model*.o`` and the thread pool's), ``model.bin``, the arena's bytes per
instance and the peak resident memory of each process (the Python processes' include the
interpreter and the libraries they import).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: The models of issue 83's acceptance, and an int8 and a float16 variant.
MODELS = ("resnet18", "mobilenet_v2", "encoder", "resnet18:qdq", "resnet18:fp16")

_PROBE = """
import resource, sys, time
import numpy as np
sys.path.insert(0, {repo!r})
feeds = {{{input!r}: np.load({x!r})}}
if {engine!r} == "polyc":
    import polyc.onnx
    session = polyc.onnx.InferenceSession({model!r})
else:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = {threads}
    session = ort.InferenceSession({model!r}, options, providers=["CPUExecutionProvider"])
session.run(None, feeds)
times = []
for _ in range({repeat}):
    started = time.perf_counter()
    session.run(None, feeds)
    times.append(time.perf_counter() - started)
print(sorted(times)[len(times) // 2], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


#: Runs a command and prints its peak resident memory.  A process's peak counts the memory of the
#: process it was started from until its exec (Linux keeps the larger), so the commands are
#: started from this small interpreter, not from the benchmark's own (hundreds of MiB).
_LAUNCHER = """
import resource, subprocess, sys
code = subprocess.call(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def run_measured(command: list[str], cwd: Path, environment: dict, timeout: float) -> tuple[str, str, int]:
    """stdout, stderr and the peak resident memory (KiB) of ``command`` run to its end."""
    launcher = [sys.executable, "-I", "-S", "-c", _LAUNCHER, *command]
    run = subprocess.run(launcher, cwd=cwd, capture_output=True, text=True, env=environment, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with {run.returncode}: {run.stderr.strip()[-500:]}")
    stderr, _, peak = run.stderr.rstrip().rpartition("\n")
    return run.stdout, stderr, int(peak)


def model_file(entry: str, directory: Path) -> Path:
    """The ONNX file of ``entry``: a float model saved into ``directory``, or a variant made
    (and cached) by :func:`benchmarks.onnx_quantized.prepare`."""
    if ":" in entry:
        from benchmarks.onnx_quantized import cache_directory, prepare

        return prepare(entry, cache_directory())
    import onnx

    from benchmarks.onnx_models import load

    path = directory / f"{entry}.onnx"
    onnx.save(load(entry), str(path))
    return path


def measure(entry: str, batch: int, args, scratch: Path, environment: dict) -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort

    import polyc.onnx
    from benchmarks.onnx_quantized import input_shape

    name = entry.split(":")[0]
    row: dict = {"model": entry, "batch": batch}
    path = model_file(entry, scratch)
    graph = onnx.load(str(path), load_external_data=False).graph
    input_name = graph.input[0].name
    element = onnx.helper.tensor_dtype_to_np_dtype(graph.input[0].type.tensor_type.elem_type)
    x = np.random.default_rng(83).standard_normal(input_shape(name, batch)).astype(element)
    directory = scratch / f"{entry.replace(':', '_')}_b{batch}"
    session = polyc.onnx.InferenceSession(str(path))
    started = time.perf_counter()
    exported = session.export(directory, target="host", shapes={input_name: x.shape})
    row["export_s"] = time.perf_counter() - started
    started = time.perf_counter()
    build = subprocess.run(["make", "-j2"], cwd=directory, capture_output=True, text=True, env=environment)
    if build.returncode != 0:
        raise RuntimeError(f"make failed: {build.stderr.strip()[-500:]}")
    row["build_s"] = time.perf_counter() - started
    np.save(directory / "x.npy", x)
    outputs = directory / "outputs"
    outputs.mkdir()
    run_measured(["./model_demo", "x.npy", "-o", "outputs"], directory, environment, args.timeout)
    output_name = graph.output[0].name
    from_export = np.load(outputs / f"{output_name}.npy").astype(np.float64)
    from_session = np.asarray(session.run(None, {input_name: x})[0], dtype=np.float64)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    reference = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    from_ort = np.asarray(reference.run(None, {input_name: x})[0], dtype=np.float64)
    scale = float(np.abs(from_ort).max()) or 1.0
    row["max_difference_to_session"] = float(np.abs(from_export - from_session).max())
    row["max_difference_to_ort_relative"] = float(np.abs(from_export - from_ort).max()) / scale
    row["arena_bytes"] = exported.arena_bytes
    row["weights_bytes"] = (directory / "model.bin").stat().st_size
    row["objects_bytes"] = sum(p.stat().st_size for p in directory.glob("*.o") if p.name != "main.o")
    row["kernels"] = len(exported.kernels)
    del session, reference

    rounds: dict[str, list[float]] = {"export": [], "polyc": [], "onnxruntime": []}
    peaks: dict[str, int] = {}
    for _ in range(args.rounds):
        demo = ["./model_demo", "x.npy", "-o", "outputs", "-r", str(args.repeat), "-t", str(args.threads)]
        _, stderr, peak = run_measured(demo, directory, environment, args.timeout)
        rounds["export"].append(float(re.search(r"median of \d+ runs: ([0-9.eE+-]+) s", stderr).group(1)))
        peaks["export"] = max(peaks.get("export", 0), peak)
        for engine in ("polyc", "onnxruntime"):
            probe = _PROBE.format(
                repo=str(REPO),
                input=input_name,
                x=str(directory / "x.npy"),
                engine=engine,
                model=str(path),
                threads=args.threads,
                repeat=args.repeat,
            )
            stdout, _, peak = run_measured([sys.executable, "-c", probe], directory, environment, args.timeout)
            seconds, _ = stdout.split()
            rounds[engine].append(float(seconds))
            peaks[engine] = max(peaks.get(engine, 0), peak)
    for engine, times in rounds.items():
        row[f"{engine}_s"] = statistics.median(times)
        row[f"{engine}_rounds_s"] = times
        row[f"{engine}_peak_rss_kib"] = peaks[engine]
    return row


HEADER = (
    f"{'model':<16} {'batch':>5} {'export ms':>9} {'session ms':>10} {'session/export':>14} {'ort ms':>8} "
    f"{'objects':>8} {'model.bin':>9} {'arena':>8} {'peak RSS export/session/ort':>28}  agreement"
)


def _megabytes(count: float) -> str:
    return f"{count / 2**20:.1f}M"


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['model']:<16} {row['batch']:>5} ERROR {row['error']}"
    peaks = "/".join(f"{row[f'{e}_peak_rss_kib'] / 1024:.0f}" for e in ("export", "polyc", "onnxruntime"))
    return (
        f"{row['model']:<16} {row['batch']:>5} {row['export_s'] * 1e3:>9.2f} {row['polyc_s'] * 1e3:>10.2f} "
        f"{row['polyc_s'] / row['export_s']:>13.2f}x {row['onnxruntime_s'] * 1e3:>8.2f} "
        f"{_megabytes(row['objects_bytes']):>8} {_megabytes(row['weights_bytes']):>9} "
        f"{_megabytes(row['arena_bytes']):>8} {peaks + ' MiB':>28}  "
        f"session {row['max_difference_to_session']:.1e}, ort {row['max_difference_to_ort_relative']:.1e} of range"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--models", help=f"comma-separated models or model:kind (default: {','.join(MODELS)})")
    parser.add_argument("--batch", type=int, default=1, help="the batch size (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the export, the session and onnxruntime")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs in each process (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three (default 3)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for each process")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "onnx_export.json")
    args = parser.parse_args(argv)
    entries = args.models.split(",") if args.models else list(MODELS)
    from benchmarks.onnx_models import MODELS as FLOAT_MODELS
    from benchmarks.onnx_quantized import KINDS

    wrong = [e for e in entries if e.split(":")[0] not in FLOAT_MODELS or (":" in e and e.split(":")[1] not in KINDS)]
    if wrong:
        parser.error(
            f"unknown models: {', '.join(wrong)} (models: {', '.join(FLOAT_MODELS)}; kinds: {', '.join(KINDS)})"
        )

    import onnxruntime as ort

    import polyc
    from benchmarks.onnx_zoo import cpu, machine_fingerprint

    results = {
        "benchmark": "onnx_export",
        "command": "python -m benchmarks.onnx_export " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {**machine_fingerprint().to_json(), "cpu": cpu(), "platform": platform.platform()},
        "threads": args.threads,
        "polyc_cflags": os.environ.get("POLYC_CFLAGS") or "polyc's default (-O3 -march=native)",
        "versions": {"polyc": getattr(polyc, "__version__", "?"), "onnxruntime": ort.__version__},
        "rows": [],
    }
    print(f"machine: {results['machine']['cpu']}; {args.threads} threads each; batch {args.batch}")
    print(HEADER + "\n" + "-" * len(HEADER), flush=True)
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="polyc-export-bench-") as scratch:
        for entry in entries:
            try:
                row = measure(entry, args.batch, args, Path(scratch), environment)
            except Exception as error:  # one model's failure is its row's result; the others still run
                row = {"model": entry, "batch": args.batch, "error": f"{type(error).__name__}: {error}"}
            results["rows"].append(row)
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1) + "\n")
            print(format_row(row), flush=True)
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
