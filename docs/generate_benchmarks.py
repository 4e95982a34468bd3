"""Write the benchmarks page from ``benchmarks/results/*.json``: one table per results file.

The measurements live in the JSON files; this page only renders them, so no figure is typed by
hand.  ``docs/conf.py`` calls :func:`write` at every build; ``python docs/generate_benchmarks.py``
prints the page.  Each results file's format is the one its benchmark writes:

- ``python -m benchmarks`` (``cases`` and ``summary``): per case, polyc's median time and the
  ratios baseline time / polyc time (above 1, polyc is faster);
- ``benchmarks.onnx_bench`` (``rows``): per model and batch, onnxruntime's time over polyc's, the
  gain of graph fusion and the compile times;
- ``benchmarks.onnx_zoo`` (``"benchmark": "onnx_zoo"``): per zoo model and batch, the same
  ratio, the compile times, the check or the error, and the operators polyc's time goes to;
- ``benchmarks.integer_bench`` (``"benchmark": "integer_gemm"``): per shape, polyc's int8 time
  and the other implementations' times over it, and which results were exact;
- ``benchmarks.generic_path`` (``"benchmark": "generic_path"``): per case, the default path's
  time and the generic loop nest's, and their ratio;
- ``benchmarks.onnx_export`` (``"benchmark": "onnx_export"``): per model, the exported C
  project's time beside its session's and onnxruntime's, its sizes and peak memory;
- ``benchmarks.tuning_search`` (``kernels``): trials a guided and a random search need to reach
  95% of the best speed;
- ``benchmarks.tail_latency`` (``settings`` or ``runs``): per run, the call-time percentiles;
- ``benchmarks.onnx_ops`` (``cases``) and ``benchmarks.onnx_segments`` (``rows``): per operator
  or segment, onnxruntime's time over polyc's.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

# The file name's prefix names the processor (the VMs' own model strings often say only "AMD EPYC").
CPU_BY_PREFIX = [
    ("xeon_m167_", "Intel Xeon, family 6 model 167 (AVX-512, AMX)"),
    ("xeon_", "Intel Xeon (Emerald Rapids)"),
    ("zen1_", "AMD EPYC Zen 1"),
    ("zen3_", "AMD EPYC Zen 3"),
    ("zen4_", "AMD EPYC Zen 4"),
    ("zen5_", "AMD EPYC Zen 5"),
    ("tuning_search_xeon", "Intel Xeon (Emerald Rapids)"),
    ("tuning_search_zen4", "AMD EPYC Zen 4"),
    ("tuning_search", "AMD EPYC Zen 5"),
]


def cpu_name(path: Path, machine: dict | None) -> str:
    for prefix, name in CPU_BY_PREFIX:
        if path.name.startswith(prefix):
            return name
    machine = machine or {}
    return machine.get("cpu") or machine.get("cpu_model") or "not recorded"


def machine_line(path: Path, machine: dict | None) -> str:
    """The processor, its cores and caches, as the file records them."""
    machine = machine or {}
    parts = [cpu_name(path, machine)]
    if machine.get("cpu_id"):
        parts.append(f"`{machine['cpu_id']}`")
    cores = machine.get("cores") or machine.get("usable_cpus")
    if cores:
        parts.append(f"{cores} cores")
    caches = machine.get("caches")
    if caches:
        parts.append("caches " + " / ".join(_bytes(c) for c in caches))
    return ", ".join(parts)


def _bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def _ms(seconds) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3g}"


def _x(ratio) -> str:
    return "" if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)) else f"{ratio:.2f}x"


def _g(value) -> str:
    return "" if value is None else f"{value:g}"


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


def suite_table(data: dict) -> list[str]:
    """``python -m benchmarks``: one row per case, then the geometric means per group."""
    baselines = [
        b
        for b in ("numpy", "einsum", "best_numpy", "gcc", "polly", "tuned_speedup", "tuned_vs_best_numpy")
        if any(b in (case.get("ratios") or {}) for case in data["cases"])
    ]
    rows = []
    for case in data["cases"]:
        ratios = case.get("ratios") or {}
        polyc = (case.get("times") or {}).get("polyc") or {}
        rows.append(
            [f"{case['name']} {case.get('size', '')}".strip(), case.get("group", ""), _ms(polyc.get("median"))]
            + [_x(ratios.get(b)) for b in baselines]
        )
    for group, means in ((data.get("summary") or {}).get("geomean_ratios") or {}).items():
        rows.append(
            [f"**geometric mean** ({means.get('cases', '?')} cases)", group, ""] + [_x(means.get(b)) for b in baselines]
        )
    names = {
        "numpy": "numpy / polyc",
        "einsum": "einsum / polyc",
        "best_numpy": "better of numpy/einsum / polyc",
        "gcc": "gcc -O3 naive / polyc",
        "polly": "clang Polly / polyc",
        "tuned_speedup": "polyc / tuned polyc",
        "tuned_vs_best_numpy": "better of numpy/einsum / tuned polyc",
    }
    return table(["case", "group", "polyc ms"] + [names[b] for b in baselines], rows)


def onnx_table(data: dict) -> list[str]:
    """``benchmarks.onnx_bench``: onnxruntime's time over polyc's, fusion's gain, compile times."""
    rows = []
    for row in data["rows"]:
        polyc, ort = row.get("polyc"), row.get("ort")
        unfused = row.get("polyc_unfused")
        rows.append(
            [
                row.get("model"),
                row.get("batch"),
                _ms(polyc),
                _ms(ort),
                _x(ort / polyc if ort and polyc else None),
                _x(unfused / polyc if unfused and polyc else None),
                "" if row.get("cold_compile") is None else f"{row['cold_compile']:.1f}",
                "" if row.get("warm_compile") is None else f"{row['warm_compile']:.2f}",
            ]
        )
    return table(
        [
            "model",
            "batch",
            "polyc ms",
            "onnxruntime ms",
            "onnxruntime / polyc",
            "unfused / fused",
            "cold compile s",
            "warm compile s",
        ],
        rows,
    )


def zoo_table(data: dict) -> list[str]:
    """``benchmarks.onnx_zoo``: per model and batch, onnxruntime's time over polyc's, the compile
    times, the check or the error, and the operators polyc's time goes to; then the geometric
    means over the rows that match."""
    rows = []
    for row in data["rows"]:
        polyc, ort = row.get("polyc"), row.get("ort")
        if "error" in row and polyc is None:
            check = f"error: {row['error']}"
        else:
            check = "match" if row.get("match") else f"MISMATCH (max abs error {row.get('max_abs_error'):.3g})"
        shares = sorted((row.get("time_by_first_op") or {}).items(), key=lambda item: -item[1])[:3]
        rows.append(
            [
                row.get("model"),
                row.get("batch"),
                _ms(polyc),
                _ms(ort),
                _x(ort / polyc if ort and polyc else None),
                "" if row.get("cold_compile") is None else f"{row['cold_compile']:.1f}",
                "" if row.get("warm_compile") is None else f"{row['warm_compile']:.2f}",
                check,
                ", ".join(f"{op} {share:.0%}" for op, share in shares),
                "" if row.get("load_average") is None else f"{row['load_average']:.1f}",
            ]
        )
    summary = data.get("summary") or {}
    for batch, mean in (summary.get("geomean_by_batch") or {}).items():
        rows.append([f"**geometric mean**, batch {batch}", batch, "", "", _x(mean)] + [""] * 5)
    if summary.get("geomean_ort_over_polyc") is not None:
        rows.append(
            [
                f"**geometric mean** ({summary.get('rows_measured')} rows)",
                "",
                "",
                "",
                _x(summary["geomean_ort_over_polyc"]),
            ]
            + [""] * 5
        )
    lines = table(
        [
            "model",
            "batch",
            "polyc ms",
            "onnxruntime ms",
            "onnxruntime / polyc",
            "cold compile s",
            "warm compile s",
            "check",
            "polyc's time by operator",
            "load average",
        ],
        rows,
    )
    runs = "; ".join(
        f"`{run.get('arguments') or '(defaults)'}` ({run.get('started')})" for run in data.get("invocations") or []
    )
    return ([f"Runs: {runs}.", ""] if runs else []) + lines


def tuning_table(data: dict) -> list[str]:
    """``benchmarks.tuning_search``: trials to reach 95% of the best speed (median over seeds)."""
    rows = []
    for name, kernel in data["kernels"].items():
        reach = kernel.get("trials_to_95") or {}
        random, guided = reach.get("random"), reach.get("model")
        rows.append(
            [
                name,
                f"{kernel.get('space_size')} ({kernel.get('configs_within_5pc')})",
                _ms(kernel.get("best_seconds")),
                kernel.get("trials"),
                kernel.get("seeds"),
                _g(random),
                _g(guided),
                f"{guided / random:.2f}" if random and guided else "",
            ]
        )
    return table(
        [
            "kernel",
            "configurations (within 5% of the best)",
            "best ms",
            "trials",
            "seeds",
            "random",
            "guided",
            "guided / random",
        ],
        rows,
    )


def tail_table(data: dict) -> list[str]:
    """``benchmarks.tail_latency``: per run, setting and case, polyc's percentiles and p90 ratio."""
    runs = data["runs"] if "runs" in data else [data]
    rows = []
    for number, run in enumerate(runs, 1):
        for setting, cases in run.get("settings", {}).items():
            for case, times in cases.items():
                polyc, numpy = times.get("polyc", {}), times.get("numpy", {})
                rows.append(
                    [
                        number,
                        setting,
                        case,
                        _ms(polyc.get("p50")),
                        _ms(polyc.get("p90")),
                        _ms(polyc.get("p99")),
                        _ms(numpy.get("p90")),
                        f"{times['p90_polyc_over_numpy']:.2f}" if "p90_polyc_over_numpy" in times else "",
                    ]
                )
    return table(
        ["run", "setting", "case", "polyc p50 ms", "polyc p90 ms", "polyc p99 ms", "numpy p90 ms", "p90 polyc / numpy"],
        rows,
    )


def ops_table(data: dict) -> list[str]:
    """``benchmarks.onnx_ops``: one node of each data-dependent operator beside onnxruntime."""
    rows = [
        [
            case["name"],
            _ms((case.get("median") or {}).get("polyc")),
            _ms((case.get("median") or {}).get("onnxruntime")),
            _x(case.get("onnxruntime_over_polyc")),
        ]
        for case in data["cases"]
    ]
    return table(["case", "polyc ms", "onnxruntime ms", "onnxruntime / polyc"], rows)


def segments_table(data: dict) -> list[str]:
    """``benchmarks.onnx_segments``: a model cut into segments, each timed as a model of its own."""
    rows = []
    for row in data["rows"]:
        operators = ", ".join(
            f"{op} {n}" for op, n in sorted((row.get("operators") or {}).items(), key=lambda item: -item[1])[:3]
        )
        polyc, ort = row.get("polyc"), row.get("ort")
        rows.append(
            [
                row.get("segment"),
                row.get("nodes"),
                operators,
                _ms(polyc),
                _ms(ort),
                _x(ort / polyc if ort and polyc else None),
            ]
        )
    return table(
        ["segment", "nodes", "operators (most frequent)", "polyc ms", "onnxruntime ms", "onnxruntime / polyc"], rows
    )


def integer_table(data: dict) -> list[str]:
    """``benchmarks.integer_bench``: 8-bit products beside polyc's float sgemm, numpy and onnxruntime."""
    others = ["polyc_int8_zero_point", "polyc_sgemm", "numpy_float32", "onnxruntime_matmulinteger"]
    rows = []
    for row in data["rows"]:
        ratios = row.get("ratios") or {}
        exact = row.get("exact") or {}
        rows.append(
            [row.get("shape"), _ms((row.get("median") or {}).get("polyc_int8"))]
            + [_x(ratios.get(name)) for name in others]
            + [", ".join(name for name, ok in exact.items() if not ok) or "all"]
        )
    header = ["M x N x K", "polyc int8 ms", "int8 with zero point", "polyc sgemm", "numpy float32"]
    return table(header + ["onnxruntime MatMulInteger", "exact"], rows)


def generic_table(data: dict) -> list[str]:
    """``benchmarks.generic_path``: the generic loop nest beside the path polyc picks by default."""
    rows = []
    for row in data["rows"]:
        failed = [name for name, check in (row.get("checks") or {}).items() if not check.get("ok")]
        rows.append(
            [
                row.get("case"),
                row.get("size"),
                (row.get("paths") or {}).get("default"),
                _ms(row["median"]["default"]),
                _ms(row["median"]["generic"]),
                _x(row.get("generic_over_default")),
                ", ".join(failed) or "ok",
            ]
        )
    header = ["case", "size", "default path", "default ms", "generic ms", "generic speed / default"]
    return table(header + ["check"], rows)


def export_table(data: dict) -> list[str]:
    """``benchmarks.onnx_export``: exported models beside their session and onnxruntime."""
    rows = []
    for row in data["rows"]:
        if "error" in row:
            rows.append([row.get("model"), row.get("batch"), row["error"]] + [""] * 7)
            continue
        peaks = " / ".join(f"{row[f'{e}_peak_rss_kib'] / 1024:.0f}" for e in ("export", "polyc", "onnxruntime"))
        rows.append(
            [
                row["model"],
                row["batch"],
                _ms(row["export_s"]),
                _x(row["polyc_s"] / row["export_s"]),
                _x(row["onnxruntime_s"] / row["export_s"]),
                f"{row['objects_bytes'] / 2**20:.1f}",
                f"{row['weights_bytes'] / 2**20:.1f}",
                f"{row['arena_bytes'] / 2**20:.1f}",
                peaks,
                f"{row['max_difference_to_session']:.1e} / {row['max_difference_to_ort_relative']:.1e}",
            ]
        )
    header = ["model", "batch", "export ms", "session / export", "onnxruntime / export", "objects MiB"]
    header += ["model.bin MiB", "arena MiB", "peak RSS MiB: export / session / onnxruntime"]
    return table(header + ["difference: to the session / to onnxruntime (of the range)"], rows)


KINDS = [  # (title, recognises a results file's data, renders it)
    (
        "Kernels beside numpy, einsum and naive C (`python -m benchmarks`)",
        lambda d: "cases" in d and "summary" in d,
        suite_table,
    ),
    (
        "Models nobody tuned for, beside onnxruntime (`python -m benchmarks.onnx_zoo`)",
        lambda d: d.get("benchmark") == "onnx_zoo",
        zoo_table,
    ),
    (
        "Integer products u8 x s8 beside float sgemm, numpy and onnxruntime (`python -m benchmarks.integer_bench`;"
        " time / polyc's int8 time)",
        lambda d: d.get("benchmark") == "integer_gemm",
        integer_table,
    ),
    (
        "The generic path beside polyc's default path (`python -m benchmarks.generic_path`; default time /"
        " generic time, issue 80's bar 0.7x)",
        lambda d: d.get("benchmark") == "generic_path",
        generic_table,
    ),
    (
        "Exported models beside their session and onnxruntime (`python -m benchmarks.onnx_export`)",
        lambda d: d.get("benchmark") == "onnx_export",
        export_table,
    ),
    (
        "ONNX models beside onnxruntime (`python -m benchmarks.onnx_bench`)",
        lambda d: "rows" in d and "model" not in d,
        onnx_table,
    ),
    ("Cost model against random search (`python -m benchmarks.tuning_search`)", lambda d: "kernels" in d, tuning_table),
    ("Tail latency (`python -m benchmarks.tail_latency`)", lambda d: "settings" in d or "runs" in d, tail_table),
    ("Data-dependent ONNX operators (`python -m benchmarks.onnx_ops`)", lambda d: "cases" in d, ops_table),
    (
        "ONNX model segments (`python -m benchmarks.onnx_segments`)",
        lambda d: "rows" in d and "model" in d,
        segments_table,
    ),
]


def summary_table(suites: list[tuple[Path, dict]]) -> list[str]:
    """The geometric means of ``python -m benchmarks`` runs, one row per results file."""
    rows = []
    for path, data in suites:
        means = (data.get("summary") or {}).get("geomean_ratios") or {}
        rows.append(
            [f"`{path.name}`", cpu_name(path, data.get("machine"))]
            + [_x((means.get(group) or {}).get(baseline)) for group, baseline in SUMMARY_COLUMNS]
        )
    return table(
        ["results file", "machine"] + [f"{group}: {baseline} / polyc" for group, baseline in SUMMARY_COLUMNS], rows
    )


SUMMARY_COLUMNS = [
    ("contraction", "best_numpy"),
    ("convolution", "best_numpy"),
    ("normalization", "numpy"),
    ("polybench", "numpy"),
]


def render(results: Path = RESULTS) -> str:
    sections: dict[str, list[str]] = {title: [] for title, _, _ in KINDS}
    suites = []
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        for title, recognises, render_table in KINDS:  # noqa: B007 -- used after the loop
            if recognises(data):
                break
        else:
            continue
        if render_table is suite_table:
            suites.append((path, data))
        machine = data.get("machine") or next(iter(data.get("runs") or []), {}).get("machine")
        block = [f"### `{path.name}`", "", f"Machine: {machine_line(path, machine)}."]
        for key, label in (
            ("command", "Command"),
            ("started", "Started"),
            ("cflags", "C flags"),
            ("note", "Note"),
            ("threads", "Threads"),
        ):
            if data.get(key):
                block.append(f"{label}: `{data[key]}`." if key in ("command", "cflags") else f"{label}: {data[key]}.")
        sections[title] += [" ".join(block[:1]), ""] + [" ".join(block[2:]), ""] + render_table(data)
    lines = [
        "# Benchmarks",
        "",
        "This page is generated from `benchmarks/results/*.json` by `docs/generate_benchmarks.py` at each",
        "build: every figure here is read from the results file named above its table. Ratios are",
        "baseline time / polyc time from the same run (above 1, polyc is faster). The machines are",
        "small shared virtual machines whose speed moves with their load: compare ratios within a",
        "file, not absolute times across files. How the benchmarks run and time is described in",
        "{doc}`guides/benchmarking`.",
        "",
        "## Summary",
        "",
        "Geometric means per group of each full or partial run of `python -m benchmarks` (best_numpy:",
        "the better of numpy and `numpy.einsum(optimize=True)`; an empty cell: the group was not run).",
        "",
    ] + summary_table(suites)
    for title, _, _ in KINDS:
        if sections[title]:
            lines += [f"## {title}", ""] + sections[title]
    return "\n".join(lines).rstrip() + "\n"


def write(target: Path) -> None:
    """Write the page to ``target`` unless it already holds exactly that text."""
    text = render()
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


if __name__ == "__main__":
    sys.stdout.write(render())
