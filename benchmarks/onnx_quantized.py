"""Quantized and float16 models through polyc beside onnxruntime.

    python -m benchmarks.onnx_quantized [--variants resnet18:qdq,encoder:dynamic] [--batch 1,8]
                                        [--repeat 10] [--top1 100] [--threads 2] [--json PATH]

The float models of ``benchmarks/onnx_models`` are made into the variants a user deploys, with
onnxruntime's own tools, cached in ``$POLYC_QUANTIZED_CACHE`` (default
``~/.cache/polyc/quantized``) under onnxruntime's version:

- ``qdq``: ``quant_pre_process`` (shape inference, constant folding), then ``quantize_static`` in the QDQ format (QuantizeLinear/DequantizeLinear pairs around
  float operators), per-channel int8 weights, uint8 activations, calibrated on
  :data:`CALIBRATION_INPUTS` random inputs from a fixed seed;
- ``qop``: the same in the QOperator format (QLinearConv, QLinearMatMul and onnxruntime's
  ``com.microsoft`` operators: QLinearAdd, QLinearGlobalAveragePool, ...);
- ``dynamic``: ``quant_pre_process``, then ``quantize_dynamic`` (DynamicQuantizeLinear + MatMulInteger, or
  DynamicQuantizeMatMul), int8 weights;
- ``fp16``: ``onnxruntime.transformers.float16.convert_float_to_float16``, weights and
  activations in float16.

Each variant and batch runs in a new process sharing one kernel cache: polyc's session is built
(the compile time, cold for the first batch of a variant) and its outputs are compared with
onnxruntime's on the same feeds. The comparison is said in the output's quantization steps where
the output is a DequantizeLinear's (how many elements differ, by how many steps at most), else
relative to the output's range; and, at batch 1, the share of ``--top1`` random inputs whose
top-1 class (argmax over the last axis) agrees. Then both run ``--repeat`` times in interleaved
rounds (:func:`benchmarks.measure.time_interleaved`), onnxruntime on ``--threads`` threads. The
ratio is onnxruntime's time over polyc's: above 1, polyc is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: The variants of issue 82's acceptance: (model, kind).
VARIANTS = (
    "resnet18:qdq",
    "resnet18:qop",
    "mobilenet_v2:qdq",
    "mobilenet_v2:qop",
    "encoder:dynamic",
    "resnet18:fp16",
    "encoder:fp16",
)
KINDS = ("qdq", "qop", "dynamic", "fp16")

#: Random inputs the static quantization is calibrated on.
CALIBRATION_INPUTS = 8
SEED = 82
#: The encoder's sequence length (as in benchmarks.onnx_bench).
SEQUENCE = 128


def input_shape(model: str, batch: int) -> tuple[int, ...]:
    return (batch, SEQUENCE, 768) if model == "encoder" else (batch, 3, 224, 224)


def random_input(model: str, batch: int, rng):
    import numpy as np

    return rng.standard_normal(input_shape(model, batch)).astype(np.float32)


def cache_directory() -> Path:
    import onnxruntime as ort

    root = Path(os.environ.get("POLYC_QUANTIZED_CACHE") or Path.home() / ".cache" / "polyc" / "quantized")
    return root / f"onnxruntime-{ort.__version__}-seed{SEED}"


def prepare(variant: str, directory: Path) -> Path:
    """The variant's model file, made with onnxruntime's tools unless it is cached."""
    model, kind = variant.split(":")
    path = directory / f"{model}_{kind}.onnx"
    if path.exists():
        return path
    import numpy as np
    import onnx
    from onnxruntime import quantization as q

    from benchmarks.onnx_models import load

    directory.mkdir(parents=True, exist_ok=True)
    float_model = load(model)
    with tempfile.TemporaryDirectory(prefix="polyc-quantize-") as scratch:
        source = Path(scratch) / "float.onnx"
        onnx.save(float_model, str(source))
        partial = Path(scratch) / "out.onnx"
        if kind in ("qdq", "qop", "dynamic"):
            # onnxruntime's recommended first step: shapes inferred, constants folded (the
            # quantizer wants biases as initializers, not Identity outputs).
            from onnxruntime.quantization.shape_inference import quant_pre_process

            prepared = Path(scratch) / "prepared.onnx"
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
            source = prepared
        if kind in ("qdq", "qop"):
            rng = np.random.default_rng(SEED)
            name = float_model.graph.input[0].name
            samples = iter([{name: random_input(model, 1, rng)} for _ in range(CALIBRATION_INPUTS)])

            class Reader(q.CalibrationDataReader):
                def get_next(self):
                    return next(samples, None)

            q.quantize_static(
                str(source),
                str(partial),
                Reader(),
                quant_format=q.QuantFormat.QDQ if kind == "qdq" else q.QuantFormat.QOperator,
                per_channel=True,
                activation_type=q.QuantType.QUInt8,
                weight_type=q.QuantType.QInt8,
            )
        elif kind == "dynamic":
            q.quantize_dynamic(str(source), str(partial), weight_type=q.QuantType.QInt8)
        elif kind == "fp16":
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=False), str(partial))
        else:
            raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
        partial.replace(path)
    return path


_MEASURE_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
from benchmarks.onnx_quantized import measure
print(json.dumps(measure({model!r}, {name!r}, {batch}, {repeat}, {threads}, {top1})))
"""


def output_step(model) -> float | None:
    """The quantization step of the model's first output where a DequantizeLinear of one scale
    makes it (None otherwise)."""
    from onnx import numpy_helper

    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.output and node.output[0] == model.graph.output[0].name and node.op_type == "DequantizeLinear":
            scale = constants.get(node.input[1])
            return float(scale.reshape(-1)[0]) if scale is not None and scale.size == 1 else None
    return None


def measure(model_path: str, name: str, batch: int, repeat: int, threads: int, top1: int) -> dict:
    """One variant at one batch, in a process of its own (JSON-ready)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    import polyc.onnx
    from benchmarks.measure import time_interleaved

    model = onnx.load(model_path)
    input_name = model.graph.input[0].name
    dtype = np.float16 if model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else np.float32
    rng = np.random.default_rng(SEED + batch)
    feeds = {input_name: random_input(name, batch, rng).astype(dtype)}

    start = time.perf_counter()
    session = polyc.onnx.InferenceSession(model_path)
    (ours,) = session.run(None, feeds)[:1]
    row: dict = {"compile": time.perf_counter() - start, "kernels": len(session.groups)}

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    reference = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    (theirs,) = reference.run(None, feeds)[:1]
    ours64, theirs64 = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    difference = np.abs(ours64 - theirs64)
    step = output_step(model)
    row["output_range"] = float(np.ptp(theirs64)) if theirs64.size else 0.0
    row["max_abs_difference"] = float(difference.max()) if difference.size else 0.0
    row["max_relative_to_range"] = row["max_abs_difference"] / row["output_range"] if row["output_range"] else 0.0
    if step:
        steps = np.rint(difference / step)
        row.update(
            output_step=step,
            max_steps=int(steps.max()),
            share_differing=float(np.mean(steps > 0)),
            share_over_one_step=float(np.mean(steps > 1)),
        )

    if batch == 1 and top1:
        agree = 0
        for _ in range(top1):
            x = {input_name: random_input(name, 1, rng).astype(dtype)}
            agree += bool(
                np.array_equal(
                    np.argmax(session.run(None, x)[0], axis=-1), np.argmax(reference.run(None, x)[0], axis=-1)
                )
            )
        row["top1_agreement"] = agree / top1

    times = time_interleaved(
        {"polyc": lambda: session.run(None, feeds), "ort": lambda: reference.run(None, feeds)}, repeat, max_seconds=30.0
    )
    row.update({key: record["median"] for key, record in times.items()})
    row["runs"] = {key: len(record["runs"]) for key, record in times.items()}
    row["load_average"] = os.getloadavg()[0]
    try:
        kernels = session.profile(feeds, repeat=3)
    except Exception as error:  # the profile helps read the row; it is not the row
        row["profile_error"] = f"{type(error).__name__}: {error}"
    else:
        total = sum(k.seconds for k in kernels) or 1.0
        row["slowest_kernels"] = [
            {"name": k.name, "share": k.seconds / total, "nodes": list(k.nodes)[:4]}
            for k in sorted(kernels, key=lambda k: -k.seconds)[:5]
        ]
    return row


def run_row(variant: str, path: Path, batch: int, args, cache: str) -> dict:
    model, kind = variant.split(":")
    row: dict = {"variant": variant, "model": model, "kind": kind, "batch": batch}
    script = _MEASURE_SCRIPT.format(
        repo=str(REPO),
        model=str(path),
        name=model,
        batch=batch,
        repeat=args.repeat,
        threads=args.threads,
        top1=args.top1,
    )
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment["POLYC_CACHE_DIR"] = cache
    try:
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {args.timeout:.0f} s"
        return row
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        row["error"] = lines[-1] if lines else f"exit {run.returncode}"
        return row
    row.update(json.loads(run.stdout.strip().splitlines()[-1]))
    return row


HEADER = (
    f"{'variant':<20} {'batch':>5} {'polyc ms':>9} {'ort ms':>9} {'ort/polyc':>9} {'compile s':>9} "
    f"{'top-1':>6}  agreement"
)


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['variant']:<20} {row['batch']:>5} ERROR {row['error']}"
    if "max_steps" in row:
        agreement = (
            f"max {row['max_steps']} step(s), {100 * row['share_differing']:.2f}% differ, "
            f"{100 * row['share_over_one_step']:.3f}% by more than one"
        )
    else:
        agreement = f"max |difference| {row['max_relative_to_range']:.2e} of the output range"
    top1 = f"{100 * row['top1_agreement']:.0f}%" if "top1_agreement" in row else "-"
    return (
        f"{row['variant']:<20} {row['batch']:>5} {row['polyc'] * 1e3:>9.2f} {row['ort'] * 1e3:>9.2f} "
        f"{row['ort'] / row['polyc']:>8.2f}x {row['compile']:>9.1f} {top1:>6}  {agreement}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_quantized",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--variants", help=f"comma-separated model:kind, of: {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs of each, at most (default 10)")
    parser.add_argument("--top1", type=int, default=100, help="random inputs for the top-1 agreement at batch 1")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra_op_num_threads (default 2)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for each row's process")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "onnx_quantized.json")
    args = parser.parse_args(argv)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    from benchmarks.onnx_models import MODELS

    wrong = [v for v in variants if v.count(":") != 1 or v.split(":")[0] not in MODELS or v.split(":")[1] not in KINDS]
    if wrong:
        parser.error(f"not a model:kind: {', '.join(wrong)} (models: {', '.join(MODELS)}; kinds: {', '.join(KINDS)})")
    batches = [int(b) for b in args.batch.split(",")]

    import onnxruntime as ort

    import polyc
    from benchmarks.onnx_zoo import cpu, machine_fingerprint

    directory = cache_directory()
    results = {
        "benchmark": "onnx_quantized",
        "command": "python -m benchmarks.onnx_quantized " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {**machine_fingerprint().to_json(), "cpu": cpu(), "platform": platform.platform()},
        "threads": f"onnxruntime {args.threads} (intra_op_num_threads); polyc its default",
        "polyc_cflags": os.environ.get("POLYC_CFLAGS") or "polyc's default (-O3 -march=native)",
        "versions": {"polyc": getattr(polyc, "__version__", "?"), "onnxruntime": ort.__version__},
        "models": str(directory),
        "rows": [],
    }
    print(f"machine: {results['machine']['cpu']}; {results['threads']}; models in {directory}")
    print(HEADER + "\n" + "-" * len(HEADER), flush=True)
    with tempfile.TemporaryDirectory(prefix="polyc-quantized-") as cache:
        for variant in variants:
            try:
                path = prepare(variant, directory)
            except Exception as error:  # a tool's failure is the row's result; the others still run
                rows = [{"variant": variant, "batch": b, "error": f"preparing: {error}"} for b in batches]
            else:
                rows = [run_row(variant, path, batch, args, cache) for batch in batches]
            for row in rows:
                results["rows"].append(row)
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1) + "\n")
                print(format_row(row), flush=True)
    print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
