"""The printed table and the summary: times, GFLOP/s, ratios and their geometric means per group.

A ratio is a baseline's median time over polyc's, from the same run: above 1, polyc is faster.
"""

from __future__ import annotations

import math
import statistics

#: The implementations timed for each case, in column order; "polyc" (with its default options,
#: no tuning records) is the one compared.  "tuned" is polyc with this machine's tuning records
#: (``--tuned`` / ``--tune``), compared with the better of numpy and einsum in its own column.
IMPLEMENTATIONS = ("polyc", "tuned", "numpy", "einsum", "gcc", "polly")
BASELINES = ("numpy", "einsum", "gcc", "polly")
#: The ratios of the tuned column: best of numpy/einsum over tuned, and untuned over tuned.
TUNED_VS_NUMPY, TUNED_SPEEDUP = "tuned_vs_best_numpy", "tuned_speedup"
HEADINGS = {"numpy": "numpy", "einsum": "einsum", "gcc": "gcc -O3", "polly": "clang+Polly"}
#: The best of numpy and einsum(optimize=True), the bar issue 4 sets for contractions.
BEST_NUMPY = "best_numpy"

COLUMNS = (
    ("case", 13, "<"),
    ("size", 22, "<"),
    ("polyc ms", 10, ">"),
    ("GFLOP/s", 8, ">"),
    ("numpy ms", 10, ">"),
    ("einsum ms", 10, ">"),
    ("gcc ms", 10, ">"),
    ("polly ms", 10, ">"),
    ("/numpy", 7, ">"),
    ("/einsum", 7, ">"),
    ("/gcc", 7, ">"),
    ("/polly", 7, ">"),
    ("check", 0, "<"),
)
#: Inserted before "check" when tuned polyc is measured too.
TUNED_COLUMNS = (("tuned ms", 10, ">"), ("tuned/np", 8, ">"), ("tune s", 7, ">"))


def _columns(tuned: bool):
    return COLUMNS[:-1] + TUNED_COLUMNS + COLUMNS[-1:] if tuned else COLUMNS


def _row(cells, tuned: bool = False) -> str:
    return " ".join(
        f"{cell:{align}{width}}" if width else str(cell) for cell, (_, width, align) in zip(cells, _columns(tuned))
    )


def header(tuned: bool = False) -> str:
    line = _row([name for name, _, _ in _columns(tuned)], tuned)
    return line + "\n" + "-" * len(line)


def _ms(timing) -> str:
    return f"{timing['median'] * 1e3:.3f}" if timing else "-"


def _ratio(value) -> str:
    return f"{value:.2f}x" if value else "-"


def check_text(case: dict) -> str:
    """'ok', or which implementations failed their check (MISMATCH) or did not run (ERROR)."""
    problems = []
    for name in IMPLEMENTATIONS:
        check = case["checks"].get(name)
        if name in case["errors"]:
            problems.append(f"{name} ERROR")
        elif check is not None and not check["ok"]:
            problems.append(f"{name} MISMATCH")
    return ", ".join(problems) if problems else "ok"


def row(case: dict, tuned: bool = False) -> str:
    times, ratios = case["times"], case["ratios"]
    polyc_gflops = case["gflops"].get("polyc")
    tuning = case.get("tuning") or {}
    extra = (
        [
            _ms(times.get("tuned")),
            _ratio(ratios.get(TUNED_VS_NUMPY)),
            f"{tuning['seconds']:.0f}" if tuning.get("seconds") is not None else "-",
        ]
        if tuned
        else []
    )
    return _row(
        [
            case["name"],
            case["size"],
            _ms(times.get("polyc")),
            f"{polyc_gflops:.1f}" if polyc_gflops else "-",
            *(_ms(times.get(name)) for name in BASELINES),
            *(_ratio(ratios.get(name)) for name in BASELINES),
            *extra,
            check_text(case),
        ],
        tuned,
    )


def ratios_of(times: dict, checks: dict) -> dict:
    """Baseline median over polyc median for each baseline that ran and passed its check, and
    for the better of numpy and einsum; none at all when polyc's own check failed."""

    def passed(name: str) -> bool:
        return name in times and bool(checks.get(name, {}).get("ok"))

    if not passed("polyc"):
        return {}
    polyc = times["polyc"]
    ratios = {name: times[name]["median"] / polyc["median"] for name in BASELINES if passed(name)}
    numpy_like = [times[name]["median"] for name in ("numpy", "einsum") if passed(name)]
    if numpy_like:
        ratios[BEST_NUMPY] = min(numpy_like) / polyc["median"]
    if passed("tuned"):
        ratios[TUNED_SPEEDUP] = polyc["median"] / times["tuned"]["median"]
        if numpy_like:
            ratios[TUNED_VS_NUMPY] = min(numpy_like) / times["tuned"]["median"]
    return ratios


def geometric_mean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(cases: list[dict], groups: tuple[str, ...]) -> dict:
    """Geometric means of the ratios per group (over cases whose checks passed), compile times."""
    means = {}
    for group in groups:
        members = [c for c in cases if c["group"] == group and c["ratios"]]
        if not members:
            continue
        means[group] = {"cases": len(members)}
        for baseline in (*BASELINES, BEST_NUMPY, TUNED_VS_NUMPY, TUNED_SPEEDUP):
            means[group][baseline] = geometric_mean(c["ratios"].get(baseline) for c in members)
    compile_medians = {}
    for name in ("polyc", "gcc", "polly"):
        values = [c["compile_seconds"][name] for c in cases if c["compile_seconds"].get(name) is not None]
        compile_medians[name] = statistics.median(values) if values else None
    return {
        "geomean_ratios": means,
        "compile_seconds_median": compile_medians,
        "mismatches": [f"{c['name']} {c['size']}: {check_text(c)}" for c in cases if check_text(c) != "ok"],
    }


def summary_text(summary: dict) -> str:
    lines = ["", "Geometric means of the ratios (baseline time / polyc time; above 1: polyc faster):"]
    lines.append(
        f"  {'group':<14} {'cases':>5} "
        + " ".join(f"{HEADINGS.get(b, 'best np/einsum'):>15}" for b in (*BASELINES, BEST_NUMPY))
    )
    for group, means in summary["geomean_ratios"].items():
        cells = " ".join(f"{_ratio(means.get(b)):>15}" for b in (*BASELINES, BEST_NUMPY))
        lines.append(f"  {group:<14} {means['cases']:>5} {cells}")
    tuned_groups = {g: m for g, m in summary["geomean_ratios"].items() if m.get(TUNED_SPEEDUP)}
    if tuned_groups:
        lines.append("")
        lines.append("Tuned polyc (this machine's tuning records): geometric means per group")
        lines.append(f"  {'group':<14} {'tuned vs best np/einsum':>24} {'tuned vs untuned':>17}")
        for group, means in tuned_groups.items():
            lines.append(
                f"  {group:<14} {_ratio(means.get(TUNED_VS_NUMPY)):>24} {_ratio(means.get(TUNED_SPEEDUP)):>17}"
            )
    compile_seconds = summary["compile_seconds_median"]
    lines.append("")
    lines.append(
        "Median compile time per kernel: "
        + ", ".join(
            f"{label} {compile_seconds[name]:.2f} s"
            for name, label in (
                ("polyc", "polyc (define + first-call compile, C compiler included)"),
                ("gcc", "gcc"),
                ("polly", "clang+Polly"),
            )
            if compile_seconds.get(name) is not None
        )
    )
    if summary["mismatches"]:
        lines.append("")
        lines.append("Problems: " + "; ".join(summary["mismatches"]))
    return "\n".join(lines)
