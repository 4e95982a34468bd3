"""Timing and checking: medians of repeated calls, and results compared with a numpy reference."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

#: Every measurement runs at least this many timed calls (unless --repeat is smaller).
MIN_RUNS = 3

#: Pause before each measurement.  Thread pools keep their idle threads spinning for a while
#: after a call (OpenBLAS for about 0.1 s, measured: a polyc matmul 512 run within 50 ms of a
#: numpy one took 4-9x as long), and on two cores those threads take the processors from the
#: next implementation's threads; after the pause they sleep.
SETTLE_SECONDS = 0.3


def settle() -> None:
    """Let the thread pools of the implementation measured before go idle."""
    time.sleep(SETTLE_SECONDS)


#: Timed calls are split into up to this many rounds, each timing a block of every
#: implementation in turn.  The machines here change speed in phases of a few seconds (on an
#: Intel Xeon, sgemm 1024 blocks of numpy ran at 7.3 ms, then 11.3 ms, then 7.5 ms), so an
#: implementation timed in three blocks sees three phases, and its median is whichever it met
#: twice: numpy against numpy's own einsum (the same OpenBLAS call) measured 0.79-1.29x in
#: four runs of 15 calls in three rounds, 0.93-0.99x in ten rounds.
ROUNDS = 10

#: Calls at least this long are timed in at most LONG_CALL_ROUNDS blocks, spread over the
#: rounds: one block of them spans a phase anyway, and each block costs a warm-up call.
LONG_CALL_SECONDS = 0.25
LONG_CALL_ROUNDS = 3


#: Untimed calls start each block until this long has passed (see :func:`warm_up_block`).
BLOCK_WARM_UP_SECONDS = 0.02


def warm_up_block(function: Callable[[], object], call_seconds: float) -> None:
    """Untimed calls at the start of a block.  After the pause the processors and the idle
    threads have gone to sleep, and the first calls pay for waking them: measured here, a
    0.2 ms matmul took 10 ms on the first call after a pause, 4 ms on the second and still
    twice its time on the third.  So calls run for BLOCK_WARM_UP_SECONDS (at least one);
    calls of 2 s or more, where this is noise (naive loop nests), get none."""
    if call_seconds >= 2.0:
        return
    start = time.perf_counter()
    function()
    while time.perf_counter() - start < BLOCK_WARM_UP_SECONDS:
        function()


def time_interleaved(
    functions: dict[str, Callable[[], object]], repeat: int, max_seconds: float, rounds: int = ROUNDS
) -> dict[str, dict]:
    """Median of timed calls of each function, taken in interleaved rounds.

    Each function gets one untimed warm-up call, then ``repeat`` timed calls, or fewer when
    they would take longer than ``max_seconds`` in all (never fewer than MIN_RUNS), so the
    slowest naive loop nests do not dominate the suite.  The calls are split into up to
    ``rounds`` blocks (long calls: see LONG_CALL_ROUNDS), and each round times its block of
    every function in turn, each after a pause
    (:func:`settle`) and untimed warm-up calls (:func:`warm_up_block`): a function's calls
    stay together, so thread pools do not compete, while a change of the machine's load during
    the case (a shared machine's other users) reaches every function alike instead of the one
    timed at that moment, and the ratios hold.
    """
    plans, records = {}, {}
    for name, function in functions.items():
        settle()
        start = time.perf_counter()
        function()
        warm_up = time.perf_counter() - start
        runs = max(min(repeat, int(max_seconds / max(warm_up, 1e-9))), min(repeat, MIN_RUNS))
        most_blocks = rounds if warm_up < LONG_CALL_SECONDS else min(rounds, LONG_CALL_ROUNDS)
        blocks = min(most_blocks, runs)
        # block b in round b * rounds // blocks: fewer blocks than rounds spread over all of them
        plans[name] = {block * rounds // blocks: runs // blocks + (block < runs % blocks) for block in range(blocks)}
        records[name] = {"runs": [], "warm_up": warm_up, "rounds": blocks}
    for round_ in range(rounds):
        for name, function in functions.items():
            if round_ not in plans[name]:
                continue
            settle()
            warm_up_block(function, records[name]["warm_up"])
            for _ in range(plans[name][round_]):
                start = time.perf_counter()
                function()
                records[name]["runs"].append(time.perf_counter() - start)
    for record in records.values():
        record.update(median=statistics.median(record["runs"]), min=min(record["runs"]))
    return records


def median_time(function: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``function`` in seconds over ``repeat`` calls after one warm-up
    (the GPU group, whose calls are long enough not to need interleaving)."""
    function()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def compare(outputs: tuple, reference: tuple, dtypes: tuple, reduction: int) -> dict:
    """Compare ``outputs`` with a float64 ``reference``, output by output.

    An output passes when ``max|out - ref| <= (reduction + 8) * eps(dtype) * max|ref|``: the
    worst-case rounding of a sum of ``reduction`` terms, relative to the result's magnitude.
    A wrong kernel is off by O(1) of that magnitude, far above this bound.  Returns whether all
    outputs pass and the worst relative error with its tolerance.
    """
    worst, tolerance, ok = 0.0, 0.0, len(outputs) == len(reference)
    for got, want, dtype in zip(outputs, reference, dtypes):
        got, want = np.asarray(got), np.asarray(want, dtype=np.float64)
        bound = (reduction + 8) * float(np.finfo(dtype).eps)
        if got.shape != want.shape:
            return {
                "ok": False,
                "relative_error": None,
                "tolerance": bound,
                "detail": f"shape {got.shape} != {want.shape}",
            }
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        error = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
        relative = error / scale if scale > 0 else error
        if not np.isfinite(relative):
            return {"ok": False, "relative_error": None, "tolerance": bound, "detail": "non-finite values"}
        ok = ok and relative <= bound
        worst, tolerance = max(worst, relative), max(tolerance, bound)
    return {"ok": bool(ok), "relative_error": worst, "tolerance": tolerance}
