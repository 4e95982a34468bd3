"""Where a model is slower than onnxruntime: the model cut into consecutive segments, each
timed in polyc and onnxruntime.

    python -m benchmarks.onnx_segments MODEL [--batch 1] [--nodes 12] [--repeat 20] [--json PATH]

A whole-model ratio says whether polyc is behind, not where; per-kernel profiles do not
compare either (onnxruntime's profiler costs its kernels more than polyc's timing costs
polyc's, and the two runtimes fuse different nodes).  Here the model (one of
benchmarks/onnx_models, at 224 x 224 or 128 tokens) is cut where a single tensor passes
from one part of the graph to the rest (after a residual block's Add, for instance), into
segments of at least ``--nodes`` nodes, and each segment is an ONNX model of its own, run by
both runtimes on the tensor the segments before it computed (by onnxruntime): the same
work, fused and laid out by each runtime as it would, timed in interleaved rounds
(:func:`benchmarks.measure.time_interleaved`) on the same number of threads.  A segment
starts and ends in ONNX's layout, so both runtimes change the layout at its ends, which a
whole model does only once (polyc's NHWC plans transpose, onnxruntime's NCHWc ones reorder):
the columns "w/o layout" leave those steps out, polyc's by its own profile
(:meth:`polyc.onnx.InferenceSession.profile`), onnxruntime's by their share of its nodes' time
in its profiler (which slows every node, so the share is an estimate).  A segment's weights
stay in the caches between its calls, where a model's come from memory: compare the segments
with each other, not with the whole model's ratio.  polyc's outputs are checked against
onnxruntime's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.measure import time_interleaved  # noqa: E402
from benchmarks.onnx_bench import input_shape  # noqa: E402
from benchmarks.onnx_models import MODELS, load  # noqa: E402


def cut_points(graph) -> list[tuple[int, str]]:
    """(i, tensor): after node i (topological order, as ONNX keeps it) the only value computed
    so far that later nodes or the graph's outputs still read is ``tensor``.  Values computed
    from constants alone (Constant nodes, exporters' Identity of a weight) do not count: every
    segment that reads them carries them."""
    constants = {t.name for t in graph.initializer}
    for node in graph.node:
        if all(name in constants for name in node.input if name):
            constants |= {name for name in node.output if name}
    last_use: dict[str, int] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            if name:
                last_use[name] = position
    for output in graph.output:
        last_use[output.name] = len(graph.node)
    live: set[str] = set()
    points = []
    for position, node in enumerate(graph.node[:-1]):
        live |= {name for name in node.output if name and name not in constants}
        live = {name for name in live if last_use.get(name, -1) > position}
        if len(live) == 1:
            points.append((position, next(iter(live))))
    return points


def segments(model, nodes: int) -> list[tuple[str, str, list]]:
    """The model's segments of at least ``nodes`` nodes: (input tensor, output tensor, nodes)."""
    graph = model.graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise SystemExit("the model must have one input and one output")
    start, begin, parts = inputs[0], 0, []
    for position, tensor in cut_points(graph):
        if position + 1 - begin >= nodes:
            parts.append((start, tensor, list(graph.node[begin : position + 1])))
            start, begin = tensor, position + 1
    parts.append((start, graph.output[0].name, list(graph.node[begin:])))
    return parts


#: onnxruntime's operators that change a tensor's layout (NCHW <-> NCHWc).
ORT_LAYOUT_OPS = ("ReorderInput", "ReorderOutput")


def _ort_layout_share(ort, part, name: str, feed, threads: int, runs: int = 20) -> float:
    """The share of onnxruntime's node time in its layout reorders, by its profiler."""
    import tempfile

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "segment")
        session = ort.InferenceSession(part.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, {name: feed})
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    total = sum(e["dur"] for e in nodes)
    layout = sum(e["dur"] for e in nodes if e.get("args", {}).get("op_name") in ORT_LAYOUT_OPS)
    return layout / total if total else 0.0


def _polyc_layout_share(session, name: str, feed) -> float:
    """The share of polyc's kernel time in the transposes its NHWC plan adds at the ends."""
    kernels = session.profile({name: feed}, repeat=10)
    total = sum(k.seconds for k in kernels)
    layout = sum(k.seconds for k in kernels if all(n.endswith((" to NHWC", " to NCHW")) for n in k.nodes))
    return layout / total if total else 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_segments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=12, help="nodes per segment, at least")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import onnx
    import onnxruntime as ort
    from onnx.utils import Extractor

    import polyc
    import polyc.onnx

    threads = len(os.sched_getaffinity(0))
    model = onnx.shape_inference.infer_shapes(load(args.model))
    extractor = Extractor(model)
    x = np.random.default_rng(0).standard_normal(input_shape(args.model, args.batch)).astype(np.float32)
    print(
        f"machine: {polyc.tuning.this_machine().describe()}; onnxruntime {ort.__version__} on {threads} threads; "
        f"{args.model} at batch {args.batch}"
    )
    header = (
        f"{'segment':>7} {'nodes':>5} {'ort ms':>8} {'polyc ms':>9} {'ort/polyc':>9} "
        f"{'w/o layout: ort':>8} {'polyc':>9} {'ort/polyc':>9}  operators"
    )
    print(header + "\n" + "-" * (len(header) + 40))
    rows, feed = [], x
    for number, (start, end, nodes) in enumerate(segments(model, args.nodes)):
        part = extractor.extract_model([start], [end])
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        reference = ort.InferenceSession(part.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session = polyc.onnx.InferenceSession(part, tuning=False)
        (expected,) = reference.run(None, {start: feed})
        (got,) = session.run(None, {start: feed})
        ok = bool(np.allclose(got, expected, rtol=1e-3, atol=1e-4))
        times = time_interleaved(
            {"ort": lambda: reference.run(None, {start: feed}), "polyc": lambda: session.run(None, {start: feed})},
            args.repeat,
            max_seconds=20.0,
        )
        operators = Counter(node.op_type for node in nodes)
        row = {
            "segment": number,
            "input": start,
            "output": end,
            "nodes": len(nodes),
            "operators": dict(operators),
            "ort": times["ort"]["median"],
            "polyc": times["polyc"]["median"],
            "ok": ok,
            "ort_layout_share": _ort_layout_share(ort, part, start, feed, threads),
            "polyc_layout_share": _polyc_layout_share(session, start, feed),
        }
        rows.append(row)
        summary = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in operators.most_common())
        ort_work, polyc_work = (row[k] * (1 - row[f"{k}_layout_share"]) for k in ("ort", "polyc"))
        print(
            f"{number:>7} {len(nodes):>5} {row['ort'] * 1e3:>8.3f} {row['polyc'] * 1e3:>9.3f} "
            f"{row['ort'] / row['polyc']:>8.2f}x {ort_work * 1e3:>8.3f} {polyc_work * 1e3:>9.3f} "
            f"{ort_work / polyc_work:>8.2f}x  {summary}{'' if ok else '  MISMATCH'}",
            flush=True,
        )
        feed = expected
    ort_total, polyc_total = sum(r["ort"] for r in rows), sum(r["polyc"] for r in rows)
    ort_work = sum(r["ort"] * (1 - r["ort_layout_share"]) for r in rows)
    polyc_work = sum(r["polyc"] * (1 - r["polyc_layout_share"]) for r in rows)
    print(
        f"{'all':>7} {sum(r['nodes'] for r in rows):>5} {ort_total * 1e3:>8.3f} {polyc_total * 1e3:>9.3f} "
        f"{ort_total / polyc_total:>8.2f}x {ort_work * 1e3:>8.3f} {polyc_work * 1e3:>9.3f} {ort_work / polyc_work:>8.2f}x"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "machine": polyc.tuning.this_machine().to_json(),
                    "threads": threads,
                    "model": args.model,
                    "batch": args.batch,
                    "rows": rows,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"raw results: {args.json}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
