"""Run the benchmark suite: polyc beside numpy, einsum, gcc -O3 and clang+Polly on naive C.

    python -m benchmarks [--quick] [--filter REGEX] [--repeat N] [--json PATH] [--tuned | --tune SECONDS]

For each case, polyc compiles the TC def (in a fresh kernel cache, so the C compiler's time is
counted), every implementation is checked against a float64 numpy reference, then each is timed:
one warm-up call, then the median of ``--repeat`` calls (fewer, but at least 3, when they would
take longer than ``--max-seconds``).  The calls are timed in blocks, one implementation at a
time, so the OpenMP and OpenBLAS thread pools do not compete for the two cores, and in three
interleaved rounds, so a change of the machine's load during a case reaches every
implementation alike.

The polyc column is polyc untuned (its defaults, ``tuning=False``).  ``--tuned`` adds a column
for polyc with this machine's tuning records (``polyc.tune``), ``--tune SECONDS`` first tunes
each case with that budget (its tuning time is reported) and then does the same.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import cases as suite
from benchmarks import native, report
from benchmarks.measure import ROUNDS, as_tuple, compare, time_interleaved

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a few cases at small sizes (smoke test)")
    parser.add_argument("--filter", metavar="REGEX", help="only cases whose 'name size' or group matches")
    parser.add_argument("--repeat", type=int, default=10, metavar="N", help="timed runs per measurement (10)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=20.0,
        metavar="S",
        help="time budget per measurement; slow ones run fewer times, at least 3 (20)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        default=RESULTS_DIR / "last.json",
        help="where to write the raw results (benchmarks/results/last.json)",
    )
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit")
    parser.add_argument(
        "--polly-flags",
        default="",
        metavar="FLAGS",
        help="extra flags for clang+Polly, e.g. '-mllvm -polly-position=early'",
    )
    tuning = parser.add_mutually_exclusive_group()
    tuning.add_argument(
        "--tuned", action="store_true", help="also time polyc with this machine's tuning records (a 'tuned' column)"
    )
    tuning.add_argument(
        "--tune",
        type=float,
        metavar="SECONDS",
        help="tune each case with this budget first (polyc.tune), then as --tuned",
    )
    parser.add_argument(
        "--records",
        type=Path,
        metavar="FILE",
        help="the tuning records (default: $POLYC_TUNING_FILE, else in the user's kernel cache)",
    )
    parser.add_argument(
        "--keep-blas-env",
        action="store_true",
        help="keep OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (cleared by default, see __main__)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.tune is not None and args.tune <= 0:
        parser.error("--tune needs a positive number of seconds")
    args.tuned = args.tuned or args.tune is not None
    return args


def select_onnx_models(args) -> list[tuple[str, int]]:
    """(model, batch) of the "onnx" group (benchmarks.onnx_bench) that ``--filter`` selects;
    none with ``--quick``."""
    if args.quick:
        return []
    from benchmarks.onnx_models import MODELS

    pairs = [(name, batch) for name in MODELS for batch in (1, 8)]
    if args.filter:
        pattern = re.compile(args.filter)
        pairs = [(n, b) for n, b in pairs if pattern.search(f"{n} batch {b}") or pattern.search("onnx")]
    return pairs


def select_gpu_cases(args) -> list[str]:
    """Kernels of the "gpu" group (benchmarks.gpu_bench) that ``--filter`` selects; none with
    ``--quick``."""
    if args.quick:
        return []
    from benchmarks.gpu_bench import GPU_CASES

    names = [name for name, _, _ in GPU_CASES]
    if args.filter:
        pattern = re.compile(args.filter)
        names = [n for n in names if pattern.search(f"gpu {n}")]
    return names


def select_integer_shapes(args) -> list[tuple[int, int, int]]:
    """Shapes of the "integer" group (benchmarks.integer_bench) that ``--filter`` selects; none
    with ``--quick``."""
    if args.quick:
        return []
    from benchmarks.integer_bench import SHAPES, shape_label

    if not args.filter:
        return list(SHAPES)
    pattern = re.compile(args.filter)
    return [shape for shape in SHAPES if pattern.search(f"integer {shape_label(shape)}")]


def select_cases(args) -> list[suite.Case]:
    cases = suite.quick_suite() if args.quick else suite.full_suite()
    if args.filter:
        pattern = re.compile(args.filter)
        cases = [c for c in cases if pattern.search(c.title) or pattern.search(c.group)]
    return cases


# ---- one case ------------------------------------------------------------------------------


def make_inputs(case: suite.Case, definition, rng: np.random.Generator) -> tuple:
    """Inputs in the def's order: random values in [-1, 1) of each tensor's type and shape."""
    inputs = []
    for name in definition.inputs:
        tensor = definition.tensor(name)
        shape = tensor.concrete_shape(case.sizes)
        if shape == ():
            inputs.append(np.array(case.scalars[name], dtype=tensor.dtype))
        else:
            inputs.append(rng.uniform(-1.0, 1.0, size=shape).astype(tensor.dtype))
    return tuple(inputs)


def _prepare_polyc(kernel, inputs: tuple):
    """The first call compiles (and runs) the kernel: its time is part of polyc's compile time."""
    start = time.perf_counter()
    outputs = kernel(*inputs)
    return (lambda: kernel(*inputs)), outputs, time.perf_counter() - start


def _prepare_numpy(function, inputs: tuple):
    return (lambda: function(*inputs)), function(*inputs), None


def _prepare_naive(toolchain, case: suite.Case, definition, inputs: tuple, build_dir: Path):
    naive = native.NaiveKernel(toolchain, case.naive_c, dict(case.sizes), build_dir)
    tensors = [definition.tensor(name) for name in definition.outputs]
    outputs = tuple(np.zeros(tensor.concrete_shape(case.sizes), tensor.dtype) for tensor in tensors)
    call = naive.bind(inputs, outputs)
    return call, call(), naive.compile_seconds


def run_case(case: suite.Case, args, toolchains: dict, build_dir: Path) -> dict:
    """Compile, check and time every implementation of ``case``; a JSON-ready record."""
    import polyc

    result = {
        "name": case.name,
        "size": case.size_label,
        "group": case.group,
        "sizes": dict(case.sizes),
        "entry": case.entry,
        "flops": case.flops,
        "note": case.note,
        "loadavg_1min": os.getloadavg()[0],
        "times": {},
        "checks": {},
        "errors": {},
        "compile_seconds": {},
        "gflops": {},
        "ratios": {},
    }
    start = time.perf_counter()
    try:
        kernel = polyc.define(case.source, filename=f"<{case.name}>", tuning=False)[case.entry]
    except Exception as error:  # without the checked def there are no inputs: skip the case
        result["errors"]["polyc"] = f"{type(error).__name__}: {error}"
        return result
    define_seconds = time.perf_counter() - start
    definition = kernel.definition
    inputs = make_inputs(case, definition, np.random.default_rng(0))
    dtypes = tuple(definition.tensor(name).dtype for name in definition.outputs)
    reference = as_tuple(case.numpy(*(x.astype(np.float64) for x in inputs)))

    preparations = {"polyc": functools.partial(_prepare_polyc, kernel, inputs)}
    if args.tuned:
        if args.tune is not None:
            tuning_start = time.perf_counter()
            try:
                found = polyc.tune(
                    polyc.define(case.source, filename=f"<{case.name}>")[case.entry],
                    *inputs,
                    seconds=float(args.tune),
                    progress=False,
                )
                result["tuning"] = {
                    "seconds": time.perf_counter() - tuning_start,
                    "trials": found.trials,
                    "best_options": found.best_options,
                    "space": found.space.path,
                }
            except Exception as error:
                result["errors"]["tuned"] = f"tuning failed: {type(error).__name__}: {error}"
        tuned = polyc.define(case.source, filename=f"<{case.name}>")[case.entry]
        preparations["tuned"] = functools.partial(_prepare_polyc, tuned, inputs)
    for name, function in (("numpy", case.numpy), ("einsum", case.einsum)):
        if function is not None:
            preparations[name] = functools.partial(_prepare_numpy, function, inputs)
    for name, toolchain in toolchains.items():
        preparations[name] = functools.partial(_prepare_naive, toolchain, case, definition, inputs, build_dir)

    callables = {}
    for name, prepare in preparations.items():
        try:
            callables[name], outputs, compile_seconds = prepare()
        except Exception as error:  # shown as ERROR in the table; the other columns still run
            result["errors"][name] = f"{type(error).__name__}: {error}"
            continue
        result["checks"][name] = compare(as_tuple(outputs), reference, dtypes, case.reduction)
        if compile_seconds is not None:
            result["compile_seconds"][name] = compile_seconds

    ordered = {name: callables[name] for name in report.IMPLEMENTATIONS if name in callables}
    result["times"] = time_interleaved(ordered, args.repeat, args.max_seconds)
    for name, times in result["times"].items():
        result["gflops"][name] = case.flops / times["median"] / 1e9

    if "polyc" in result["times"]:  # define + first call, less the run that call included
        first_call = result["compile_seconds"]["polyc"]
        result["compile_seconds"].update(
            polyc_define=define_seconds,
            polyc_first_call=first_call,
            polyc=(define_seconds + max(0.0, first_call - result["times"]["polyc"]["median"])),
        )
    result["ratios"] = report.ratios_of(result["times"], result["checks"])
    return result


# ---- the environment the numbers were taken in ---------------------------------------------


def blas_info() -> dict:
    """Which BLAS numpy calls and with which kernel: threadpoolctl if installed, else numpy's config."""
    np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)  # make sure the BLAS is loaded
    try:
        import threadpoolctl

        return {"source": "threadpoolctl", "libraries": threadpoolctl.threadpool_info()}
    except ImportError:
        config = np.show_config(mode="dicts") if np.lib.NumpyVersion(np.__version__) >= "1.26.0" else {}
        return {
            "source": "numpy.show_config (threadpoolctl not installed)",
            "blas": config.get("Build Dependencies", {}).get("blas"),
        }


def numpy_blas(libraries: list[dict]) -> dict | None:
    """numpy's own BLAS among the loaded ones (threadpoolctl's entries).  scipy's wheels bring
    an OpenBLAS of their own, listed first once scipy was imported before numpy's was loaded:
    numpy's is the one shipped in its own directories (``numpy.libs`` in a wheel); a BLAS
    installed elsewhere (conda, Debian) is the first listed."""
    blas = [library for library in libraries if library.get("user_api") == "blas"]
    numpy_dir = Path(np.__file__).resolve().parent
    homes = (numpy_dir, numpy_dir.with_name(numpy_dir.name + ".libs"))
    for library in blas:
        path = Path(library.get("filepath", "")).resolve()
        if any(path.is_relative_to(home) for home in homes):
            return library
    return blas[0] if blas else None


def blas_summary(info: dict) -> str:
    library = numpy_blas(info.get("libraries", []))
    if library is not None:
        return (
            f"{library.get('internal_api')} {library.get('version')}, kernel "
            f"{library.get('architecture')}, {library.get('num_threads')} threads"
        )
    blas = info.get("blas") or {}
    return f"{blas.get('name', 'unknown BLAS')} {blas.get('version', '')} (kernel unknown)"


def machine_info() -> dict:
    from polyc.runtime.machine import this_machine

    fingerprint = this_machine()
    return {
        "cpu": fingerprint.cpu_model,
        "cpu_id": fingerprint.cpu_id,
        "microarchitecture": fingerprint.microarchitecture,
        "isa": list(fingerprint.isa),
        "caches": list(fingerprint.caches),
        "fingerprint": fingerprint.id,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def _git(directory: Path, *arguments: str) -> str | None:
    try:
        run = subprocess.run(["git", "-C", str(directory), *arguments], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def polyc_info() -> dict:
    """Which polyc was measured: version, source directory, git commit and whether polyc/ had
    uncommitted changes, and the C compiler its kernels are built with."""
    import polyc
    from polyc.runtime.compiler import CompilerOptions

    package = Path(polyc.__file__).resolve().parent
    status = _git(package.parent, "status", "--porcelain", "--", "polyc")
    compiler = CompilerOptions(openmp=True)
    return {
        "version": polyc.__version__,
        "source": str(package),
        "git_commit": _git(package.parent, "rev-parse", "HEAD"),
        "uncommitted_changes": None if status is None else bool(status),
        "cc": compiler.cc,
        "cflags": " ".join(compiler.flags),
        "options": "defaults: polyc.define(source)",
    }


# ---- main ----------------------------------------------------------------------------------


def find_toolchains(args) -> tuple[dict, list[str]]:
    """The naive-C baselines that can be built here, and notes on those that cannot."""
    toolchains, notes = {}, []
    gcc = native.gcc_toolchain()
    if gcc:
        toolchains["gcc"] = gcc
    else:
        notes.append("gcc not found: the gcc -O3 column is skipped")
    polly, reason = native.polly_toolchain(tuple(args.polly_flags.split()))
    if polly:
        toolchains["polly"] = polly
    else:
        notes.append(reason)
    return toolchains, notes


def describe_run(args, argv, toolchains: dict, notes: list[str], blas_environment: dict | None) -> dict:
    """Everything about the run but the cases: settings, machine, BLAS, compilers."""
    current = {name: os.environ.get(name) for name in BLAS_VARIABLES}
    return {
        "schema": 1,
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            "quick": args.quick,
            "filter": args.filter,
            "repeat": args.repeat,
            "max_seconds": args.max_seconds,
            "warm_up_calls": 1,
            "rounds": ROUNDS,
            "block_warm_up": "untimed calls for 20 ms (at least one) unless a call takes 2 s",
        },
        "machine": {**machine_info(), "loadavg_start": list(os.getloadavg())},
        "environment": {
            "blas_variables_before": current if blas_environment is None else blas_environment,
            "blas_variables_during": current,
        },
        "blas": blas_info(),
        "toolchains": {"polyc": polyc_info(), **{name: t.describe() for name, t in toolchains.items()}},
        "notes": notes,
        "cases": [],
    }


def print_preamble(results: dict, args, count: int) -> None:
    polyc_source = results["toolchains"]["polyc"]
    print(
        f"polyc {polyc_source['version']} ({polyc_source['source']}, commit "
        f"{(polyc_source['git_commit'] or 'unknown')[:10]}"
        f"{', with uncommitted changes' if polyc_source['uncommitted_changes'] else ''}): "
        f"{count} case(s), median of up to {args.repeat} runs (at most ~{args.max_seconds:g} s each)"
    )
    machine = results["machine"]
    identity = ", ".join(filter(None, (machine.get("microarchitecture"), machine.get("cpu_id"))))
    print(
        f"machine: {machine['cpu']}{f' [{identity}]' if identity else ''} ({' '.join(machine['isa'])}), "
        f"{results['machine']['usable_cpus']} cpu(s), "
        f"load {results['machine']['loadavg_start'][0]:.2f}; BLAS: {blas_summary(results['blas'])}"
    )
    for name, toolchain in results["toolchains"].items():
        if name != "polyc":
            print(f"{name}: {toolchain['command']} ({toolchain['version']})")
    for note in results["notes"]:
        print(f"note: {note}")


def main(argv=None, blas_environment: dict | None = None) -> int:
    """Run the suite; 1 if any implementation gave a wrong result or failed, else 0."""
    args = parse_args(argv)
    selected = select_cases(args)
    onnx_models = select_onnx_models(args)
    gpu_cases = select_gpu_cases(args)
    integer_shapes = select_integer_shapes(args)
    if args.list or not (selected or onnx_models or gpu_cases or integer_shapes):
        for case in selected:
            print(f"{case.group:<14} {case.title}")
        for name, batch in onnx_models:
            print(f"{'onnx':<14} {name} batch {batch}")
        for name in gpu_cases:
            print(f"{'gpu':<14} {name}")
        for shape in integer_shapes:
            print(f"{'integer':<14} {'x'.join(map(str, shape))}")
        if not (selected or onnx_models or gpu_cases or integer_shapes):
            print("no case matches --filter", file=sys.stderr)
        return 0 if args.list else 2

    toolchains, notes = find_toolchains(args)
    results = describe_run(args, argv, toolchains, notes, blas_environment)
    print_preamble(results, args, len(selected))
    print(report.header(args.tuned))
    if args.tuned:  # the records stay where they are when the kernel cache moves below
        from polyc.runtime.tuning_records import default_records_path

        os.environ["POLYC_TUNING_FILE"] = str(args.records or default_records_path())
        results["settings"]["tuning_records"] = os.environ["POLYC_TUNING_FILE"]
        results["settings"]["tune_seconds"] = args.tune
    with (
        tempfile.TemporaryDirectory(prefix="polyc-bench-cache-") as cache,
        tempfile.TemporaryDirectory(prefix="polyc-bench-naive-") as build_dir,
    ):
        os.environ["POLYC_CACHE_DIR"] = cache  # a fresh cache: compile times include the C compiler
        for case in selected:
            record = run_case(case, args, toolchains, Path(build_dir))
            results["cases"].append(record)
            print(report.row(record, args.tuned), flush=True)
        if onnx_models:
            results["onnx"] = run_onnx_models(onnx_models, args.repeat, args.tuned, args.tune)
        if gpu_cases:
            from benchmarks.gpu_bench import run_gpu_cases

            results["gpu"] = run_gpu_cases(args.repeat, gpu_cases)
        if integer_shapes:
            from benchmarks.integer_bench import run_integer_cases

            results["integer"] = run_integer_cases(integer_shapes, args.repeat, args.max_seconds)

    results["machine"]["loadavg_end"] = list(os.getloadavg())
    results["summary"] = report.summarize(results["cases"], suite.GROUPS)
    if selected:
        print(report.summary_text(results["summary"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nraw results: {args.json}")
    from benchmarks.onnx_bench import CHECKS

    onnx_mismatch = any(not row.get(key, True) for row in results.get("onnx", {}).get("rows", []) for key in CHECKS)
    return 1 if results["summary"]["mismatches"] or onnx_mismatch else 0


def run_onnx_models(pairs, repeat: int, tuned: bool = False, tune_seconds: float | None = None) -> dict:
    """The "onnx" group: the real models through polyc and onnxruntime (benchmarks.onnx_bench)."""
    print("\nONNX models: polyc sessions beside onnxruntime (benchmarks.onnx_bench; ratios ort/polyc)")
    import importlib.util

    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"skipped: {' and '.join(missing)} not installed (pip install 'polyc[test]')")
        return {"skipped": f"{' and '.join(missing)} not installed"}
    from benchmarks.onnx_bench import run_models

    return run_models(pairs, repeat, tuned, tune_seconds)
