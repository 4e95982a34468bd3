"""Per-operator tally of onnx's backend node tests on polyc.onnx: passed, skipped (with the
reasons) and failed, for the closing note of the ONNX work and for anyone adding an operator.

    python -m tests.onnx.node_table [--ops Conv,MatMul,...] [--jobs 2] [--json PATH]

Runs the same cases and checks as ``tests/onnx/test_node_suite_*.py`` (``node_suite.run_case``),
outside pytest, in ``--jobs`` processes (each case compiles its own kernels: about 5 minutes
on two cores from a cold kernel cache).  Without ``--ops`` every operator with a case is listed.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import sys
import warnings
from pathlib import Path

import pytest

from tests.onnx import node_suite

#: The operators issue 11 asks for, in its order (`--ops issue`).
ISSUE_OPS = (
    "Conv ConvTranspose MatMul Gemm Relu LeakyRelu PRelu Sigmoid Tanh Gelu Erf HardSwish Clip "
    "Softmax LogSoftmax LayerNormalization BatchNormalization MaxPool AveragePool "
    "GlobalAveragePool GlobalMaxPool Add Sub Mul Div Pow Sqrt Exp Log Neg Reciprocal Abs Where "
    "Equal Less Greater Cast ReduceMean ReduceSum ReduceMax ReduceMin ArgMax Reshape Transpose "
    "Flatten Squeeze Unsqueeze Concat Split Slice Gather Expand Pad Shape Constant "
    "ConstantOfShape Range Identity Dropout Einsum Resize"
).split()


def outcome(name: str) -> tuple[str, str, str]:
    """(name, 'passed' | 'skipped' | 'failed', the reason or the error's first line)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            node_suite.run_case(name)
        except pytest.skip.Exception as skip:
            return name, "skipped", str(skip.msg).split(" (")[0]
        except Exception as error:  # noqa: BLE001 - a tally records every kind of failure
            first = (str(error).strip().splitlines() or [""])[0]
            return name, "failed", f"{type(error).__name__}: {first}"[:200]
    return name, "passed", ""


def tally(results, ops) -> dict:
    table = {
        op: {"passed": 0, "skipped": 0, "failed": 0, "reasons": collections.Counter(), "failures": []} for op in ops
    }
    for name, status, why in results:
        op = node_suite.operator_under_test(name)
        if op not in table:
            continue
        row = table[op]
        row[status] += 1
        if status == "skipped":
            row["reasons"][why] += 1
        elif status == "failed":
            row["failures"].append(f"{name}: {why}")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.onnx.node_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ops", default="", help="comma-separated operators, or 'issue' for issue 11's list")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    names = sorted(node_suite.cases())
    ops = (
        ISSUE_OPS
        if args.ops == "issue"
        else tuple(args.ops.split(","))
        if args.ops
        else sorted({node_suite.operator_under_test(n) for n in names})
    )
    wanted = [n for n in names if node_suite.operator_under_test(n) in ops]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = list(pool.imap_unordered(outcome, wanted, chunksize=4))
    table = tally(results, ops)
    print("| operator | passed | skipped | failed | skip reasons |\n|---|---|---|---|---|")
    for op, row in table.items():
        reasons = "; ".join(f"{count}x {why}" for why, count in row["reasons"].most_common())
        print(f"| {op} | {row['passed']} | {row['skipped']} | {row['failed']} | {reasons} |")
    totals = {s: sum(r[s] for r in table.values()) for s in ("passed", "skipped", "failed")}
    print(f"| all {len(table)} | {totals['passed']} | {totals['skipped']} | {totals['failed']} | |")
    for op, row in table.items():
        for failure in row["failures"]:
            print(f"FAILED {op}: {failure}")
    if args.json:
        args.json.write_text(
            json.dumps({op: {**row, "reasons": dict(row["reasons"])} for op, row in table.items()}, indent=1)
        )
    return 1 if totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
