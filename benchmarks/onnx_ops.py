"""The data-dependent ONNX operators of detectors, one node each, beside onnxruntime.

    python -m benchmarks.onnx_ops [--repeat 9] [--quick] [--json PATH]

A detector's post-processing is where a compiler of fixed shapes meets data: TopK over the
scores above a threshold, NonZero finding them, NonMaxSuppression over the boxes, the running
sums behind them.  Each case is one node at the size a torchvision detector gives it
(RetinaNet's thousand best of 200,000 scores, SSDlite's 300 of 3,234 per class over 90
classes, 27,000 boxes in 90 class groups moved apart as torchvision's batched NMS moves them,
1.3 million flags).  polyc's outputs must equal onnxruntime's exactly before a time counts.
Implementations alternate run by run (onnxruntime's threads spin after its calls, so each
implementation's block starts after a pause); the medians are printed with onnxruntime's time
over polyc's (above 1: polyc faster), both on the machine's threads.  ``--quick``: sizes a
tenth as large, one run (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import polyc
import polyc.onnx


def _model(node, inputs: dict, outputs: list, initializers=()):
    from onnx import TensorProto, helper

    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.bool_): TensorProto.BOOL}
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info(n, types[a.dtype], list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cases(scale: float, rng: np.random.Generator) -> dict:
    """Name -> (model, feeds)."""
    from onnx import TensorProto, helper, numpy_helper

    def size(n):
        return max(int(n * scale), 1)

    found = {}
    for rows, n, k in ((1, size(200_000), min(1000, size(200_000))), (90, size(3234), size(300))):
        x = rng.random((rows, n), dtype=np.float32)
        x[:, ::7] = np.round(x[:, ::7] * 50) / 50  # ties
        node = helper.make_node("TopK", ["x", "k"], ["values", "indices"])
        found[f"TopK {k} of {n} x {rows}"] = (
            _model(
                node,
                {"x": x},
                [("values", TensorProto.FLOAT), ("indices", TensorProto.INT64)],
                [numpy_helper.from_array(np.array([k], np.int64), "k")],
            ),
            {"x": x},
        )
    boxes_count, groups = size(27_000), 90
    corner = rng.random((boxes_count, 2), dtype=np.float32) * 300
    extent = rng.random((boxes_count, 2), dtype=np.float32) * 60 + 1
    offset = (np.arange(boxes_count) * groups // boxes_count).astype(np.float32)[:, None] * 400
    boxes = np.concatenate([corner + offset, corner + extent + offset], 1)[None]
    scores = rng.random((1, 1, boxes_count), dtype=np.float32)
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["selected"])
    found[f"NonMaxSuppression {boxes_count} boxes"] = (
        _model(
            node,
            {"boxes": boxes, "scores": scores},
            [("selected", TensorProto.INT64)],
            [
                numpy_helper.from_array(np.array([boxes_count], np.int64), "limit"),
                numpy_helper.from_array(np.array([0.55], np.float32), "iou"),
            ],
        ),
        {"boxes": boxes, "scores": scores},
    )
    flags = rng.random(size(1_310_400)) < 0.156
    found[f"NonZero {flags.size} flags"] = (
        _model(helper.make_node("NonZero", ["x"], ["y"]), {"x": flags}, [("y", TensorProto.INT64)]),
        {"x": flags},
    )
    values = rng.random((1, size(200_000)), dtype=np.float32)
    node = helper.make_node("CumSum", ["x", "axis"], ["y"])
    found[f"CumSum {values.size}"] = (
        _model(
            node, {"x": values}, [("y", TensorProto.FLOAT)], [numpy_helper.from_array(np.array(1, np.int64), "axis")]
        ),
        {"x": values},
    )
    return found


def _same(ours: list, theirs: list, name: str) -> bool:
    if name.startswith("CumSum"):  # sums in another order: to rounding
        return all(np.allclose(a, b, rtol=1e-5, atol=1e-3) for a, b in zip(ours, theirs))
    return all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def measure(name: str, model, feeds: dict, repeat: int) -> dict:
    import onnxruntime

    started = time.perf_counter()
    ours = polyc.onnx.InferenceSession(model)
    ours.run(None, feeds)
    first = time.perf_counter() - started
    theirs = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ok = _same(ours.run(None, feeds), theirs.run(None, feeds), name)
    times = {"polyc": [], "onnxruntime": []}
    for _ in range(repeat):
        for implementation, session in (("polyc", ours), ("onnxruntime", theirs)):
            time.sleep(0.15)  # onnxruntime's threads spin for a while after its calls
            session.run(None, feeds)
            started = time.perf_counter()
            session.run(None, feeds)
            times[implementation].append(time.perf_counter() - started)
    medians = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "name": name,
        "ok": ok,
        "first_run_seconds": first,
        "runs": times,
        "median": medians,
        "onnxruntime_over_polyc": medians["onnxruntime"] / medians["polyc"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_ops", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=9, help="timed runs per implementation and case")
    parser.add_argument("--quick", action="store_true", help="sizes a tenth as large, one run")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "onnx_ops.json")
    args = parser.parse_args(argv)
    repeat = 1 if args.quick else args.repeat
    machine = polyc.tuning.this_machine()
    print(f"machine: {machine.describe()}")
    results = {"machine": machine.to_json(), "repeat": repeat, "quick": args.quick, "cases": []}
    print(f"{'case':<36} {'polyc ms':>9} {'ort ms':>9} {'ort/polyc':>9}  check  (first run s)")
    failed = False
    for name, (model, feeds) in cases(0.1 if args.quick else 1.0, np.random.default_rng(0)).items():
        result = measure(name, model, feeds, repeat)
        results["cases"].append(result)
        failed |= not result["ok"]
        m = result["median"]
        print(
            f"{name:<36} {m['polyc'] * 1e3:>9.3f} {m['onnxruntime'] * 1e3:>9.3f} "
            f"{result['onnxruntime_over_polyc']:>8.2f}x  {'ok' if result['ok'] else 'MISMATCH'}  "
            f"({result['first_run_seconds']:.1f})"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"raw results: {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
