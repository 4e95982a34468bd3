"""Tuning a whole ONNX session: every kernel of its plan for the given feeds.

    result = polyc.tune(session, {"input": images}, seconds=600)
    session.run(None, {"input": images})     # now with each tuned kernel's best options

A model is tens of kernels whose times differ by orders of magnitude, so the budget is shared
by what each kernel costs in a run: the kernels are timed once with polyc's defaults, and each
distinct kernel (kernels of one def and one set of sizes are tuned once, their times added) gets
the share of the budget its time has of the run's.  A kernel whose share is below
``MIN_SECONDS`` (or ``MIN_TRIALS``) is not tuned and its share goes to the others: a few trials
teach the search nothing, and such a kernel is too small a part of the run to matter.  A time
budget is a deadline (from when the session has been planned and compiled for the feeds'
shapes): each kernel's search gets its share of the time left when it starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from polyc.errors import PolycError
from polyc.runtime.tuning_records import TuningKey
from polyc.tuning.search import TuningResult, _time_call, bound_call, search

#: The least budget worth a search of one kernel: seconds, or trials.
MIN_SECONDS, MIN_TRIALS = 5.0, 4


@dataclass
class KernelTuning:
    """One distinct kernel of the session: the groups that call it and its search."""

    groups: list[str]
    seconds: float  # its time in one run with the defaults (all its calls)
    budget: float | int | None  # its share; None: too small to tune
    result: TuningResult | None = None


@dataclass
class SessionTuningResult:
    kernels: list[KernelTuning] = field(default_factory=list)  # the costliest first
    interrupted: bool = False

    @property
    def default_seconds(self) -> float:
        """The kernels' time in one run, with polyc's defaults (as timed before the search)."""
        return sum(k.seconds for k in self.kernels)

    @property
    def tuned_seconds(self) -> float:
        """The same with each tuned kernel's best time (the default's where the search found
        nothing better, or did not run): an estimate from the searches' own measurements."""
        total = 0.0
        for kernel in self.kernels:
            result = kernel.result
            if result is not None and result.best_seconds and result.default_seconds:
                total += kernel.seconds * min(1.0, result.best_seconds / result.default_seconds)
            else:
                total += kernel.seconds
        return total

    def __repr__(self) -> str:
        tuned = sum(k.result is not None for k in self.kernels)
        return (
            f"<SessionTuningResult: {tuned} of {len(self.kernels)} distinct kernels tuned; their time in a "
            f"run {self.default_seconds * 1e3:.3f} -> {self.tuned_seconds * 1e3:.3f} ms (estimated from the "
            f"searches){' (interrupted)' if self.interrupted else ''}>"
        )


def tune_session(
    session, feeds: dict, *, budget: float | int = 600.0, progress: bool = True, **search_options
) -> SessionTuningResult:
    """Tune every kernel of ``session``'s plan for ``feeds`` (as :meth:`run` takes them), the
    ``budget`` (seconds as a float, trials as an int) shared as the module docstring says;
    ``search_options`` go to :func:`polyc.tuning.tune` for each kernel.  Afterwards the session's
    runs use the best options found."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise PolycError(f"budget must be a positive number of seconds (float) or trials (int), not {budget!r}")
    if not isinstance(feeds, dict):
        raise PolycError(
            f"tune(session, feeds): feeds must be a dict of input name -> array, not {type(feeds).__name__}"
        )
    session.run(None, feeds)  # plans and compiles for these shapes; bad feeds fail here
    started = time.monotonic()  # a time budget counts from here: timing the kernels is part of it
    calls = session.kernel_inputs(feeds)
    if any(not group.kernel.options.tuning for group, _ in calls):
        raise PolycError("the session was made with tuning=False: its kernels would not use what tuning finds")

    distinct: dict[TuningKey, tuple[KernelTuning, object, list]] = {}
    for group, inputs in calls:
        kernel = group.kernel
        _, _, key = bound_call(kernel, inputs)
        kernel(*inputs)  # compiled before it is timed
        seconds = float(np.median([_time_call(kernel, inputs) for _ in range(5)]))
        if key in distinct:
            distinct[key][0].groups.append(group.name)
            distinct[key][0].seconds += seconds
        else:
            distinct[key] = (KernelTuning([group.name], seconds, None), kernel, inputs)
    entries = sorted(distinct.values(), key=lambda e: -e[0].seconds)
    _share(entries, budget)

    result = SessionTuningResult([entry for entry, _, _ in entries])
    # A time budget is a deadline: each kernel gets its share of what is left (the references
    # computed and the last candidates' overrun come out of it too).
    deadline = started + budget if isinstance(budget, float) else None
    try:
        for number, (entry, kernel, inputs) in enumerate(entries):
            if entry.budget is None:
                continue
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break  # the others keep polyc's defaults
                left = sum(e.seconds for e, _, _ in entries[number:] if e.budget is not None)
                entry.budget = remaining * entry.seconds / left
            if progress:
                print(
                    f"tuning {', '.join(entry.groups)} ({entry.seconds * 1e3:.3f} ms of a run; "
                    f"budget {_describe(entry.budget)})",
                    flush=True,
                )
            entry.result = search(kernel, *inputs, budget=entry.budget, progress=progress, **search_options)
            if entry.result.interrupted:
                result.interrupted = True
                break
    finally:
        for each in session.plans():
            each.forget_resolved_calls()
    return result


def _share(entries: list, budget: float | int) -> None:
    """Gives each entry its share of ``budget`` by its time, leaving out (budget None) the
    cheapest entries while their share is below the minimum."""
    least = MIN_TRIALS if isinstance(budget, int) else MIN_SECONDS
    kept = list(entries)  # costliest first: the last has the smallest share

    def share(entry: KernelTuning) -> float:
        return budget * entry.seconds / (sum(e.seconds for e, _, _ in kept) or 1.0)

    while len(kept) > 1 and share(kept[-1][0]) < least:
        kept.pop()
    for entry, _, _ in kept:  # all of a budget too small to share goes to the costliest
        entry.budget = min(budget, max(least, int(share(entry)))) if isinstance(budget, int) else share(entry)


def _describe(budget: float | int) -> str:
    return f"{budget} trials" if isinstance(budget, int) else f"{budget:.1f} s"
