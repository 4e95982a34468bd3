"""``polyc.tune``: search a kernel's options by measuring candidates on this machine.

The loop (AutoTVM's and Ansor's, at the scale of one kernel):

1. Measure polyc's default options first, then any ``start_from`` records (imported from
   another machine, say): every later candidate is compared with them.
2. Train the cost model (:mod:`polyc.tuning.cost_model`) on everything measured for this key so
   far, earlier runs included (records resume a search).
3. Propose: the model ranks the whole space when it is small (at most ``ENUMERATED_SPACE``
   configurations), else simulated-annealing walks over it (:mod:`polyc.tuning.space`) from the
   best measured configurations, scored by the model; the best unmeasured ones, plus a few
   random ones so the model keeps learning, form the next batch.
4. Measure the batch (:func:`measure_candidate`: compile, check against the reference
   interpreter, time; stop a candidate whose first two runs are ``prune_factor`` times slower
   than the best, as TC's tuner does), append each result to the records file, repeat until
   the budget is spent.  Ctrl-C ends the search and keeps everything measured.

``strategy="random"`` skips the model (the baseline it must beat).  ``client=`` measures on Dask
workers (:mod:`polyc.tuning.distributed`).
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from polyc.errors import PolycError
from polyc.paths import upgraded_options
from polyc.runtime.machine import this_machine
from polyc.runtime.tuning_records import (
    TuningKey,
    TuningRecord,
    append_record,
    chosen_record,
    default_records_path,
    read_records,
    record_target,
)
from polyc.target import usable_cores
from polyc.tuning.cost_model import CostModel, pruning_limit
from polyc.tuning.space import SearchSpace, space_for

if TYPE_CHECKING:
    from polyc.api import Kernel
    from polyc.frontends.onnx.session import InferenceSession
    from polyc.tuning.session import SessionTuningResult

STRATEGIES = ("model", "random")
#: Seconds of repeated runs per candidate (at least MIN_RUNS, at most MAX_RUNS runs).
MEASURE_SECONDS = 0.2
MIN_RUNS, MAX_RUNS = 3, 50
#: Rounds of the confirmation that times the best candidate against the defaults at the end of
#: a search, alternating blocks of runs of each (see :func:`confirm_candidates`).
CONFIRM_ROUNDS = 5
#: Spaces of at most this many configurations are ranked whole by the cost model each round.
ENUMERATED_SPACE = 20000


@dataclass
class TuningResult:
    """What a search found; ``best_options`` go to ``polyc.define`` (or are used automatically)."""

    key: TuningKey
    space: SearchSpace
    best_options: dict
    best_seconds: float | None
    default_seconds: float | None
    trials: int  # candidates measured by this call
    measured: int  # candidates measured for this key, earlier runs included
    interrupted: bool
    records_path: Path
    history: list[tuple[int, float | None]] = field(default_factory=list)  # (trial, best so far)

    @property
    def speedup(self) -> float | None:
        if self.best_seconds and self.default_seconds:
            return self.default_seconds / self.best_seconds
        return None

    def __repr__(self) -> str:
        best = f"{self.best_seconds * 1e3:.3f} ms" if self.best_seconds else "none"
        default = f"{self.default_seconds * 1e3:.3f} ms" if self.default_seconds else "unmeasured"
        return (
            f"<TuningResult {self.space.path}: best {best} with {self.best_options or 'the defaults'} "
            f"(default {default}); {self.trials} trials{' (interrupted)' if self.interrupted else ''}>"
        )


#: How long :func:`tune` searches when given neither ``seconds`` nor ``trials``.
DEFAULT_SECONDS = 60.0


def search_budget(seconds: float | None, trials: int | None, budget: float | int | None = None) -> float | int:
    """The budget a search runs under: seconds as a float, or measured candidates as an int.
    ``budget`` is the deprecated spelling (a float: seconds, an int: trials), warned about."""
    if budget is not None:
        if seconds is not None or trials is not None:
            raise PolycError("budget= is the deprecated spelling of seconds= and trials=: give only one of them")
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
            raise PolycError(f"budget must be a positive number of seconds (float) or trials (int), not {budget!r}")
        instead = f"trials={budget!r}" if isinstance(budget, int) else f"seconds={budget!r}"
        warnings.warn(
            f"budget= is deprecated: budget={budget!r} means {instead}; pass that instead",
            DeprecationWarning,
            stacklevel=3,
        )
        return budget
    if seconds is not None and trials is not None:
        raise PolycError("give seconds= (how long to search) or trials= (how many candidates to measure), not both")
    if trials is not None:
        if isinstance(trials, bool) or not isinstance(trials, int) or trials <= 0:
            raise PolycError(f"trials must be a positive integer (candidates to measure), not {trials!r}")
        return trials
    seconds = DEFAULT_SECONDS if seconds is None else seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < math.inf:
        raise PolycError(f"seconds must be a positive, finite number of seconds to search, not {seconds!r}")
    return float(seconds)


@overload
def tune(
    kernel: InferenceSession,
    feeds: Mapping[str, Any],
    /,
    *,
    seconds: float | None = None,
    trials: int | None = None,
    strategy: str = "model",
    records=None,
    client=None,
    start_from=None,
    progress: bool = True,
    seed: int = 0,
    prune_factor: float = 10.0,
    batch: int = 4,
    budget: float | int | None = None,
) -> SessionTuningResult: ...


@overload
def tune(
    kernel: Kernel,
    *args: Any,
    seconds: float | None = None,
    trials: int | None = None,
    strategy: str = "model",
    records=None,
    client=None,
    start_from=None,
    progress: bool = True,
    seed: int = 0,
    prune_factor: float = 10.0,
    batch: int = 4,
    budget: float | int | None = None,
) -> TuningResult: ...


def tune(
    kernel,
    *args,
    seconds: float | None = None,
    trials: int | None = None,
    strategy: str = "model",
    records=None,
    client=None,
    start_from=None,
    progress: bool = True,
    seed: int = 0,
    prune_factor: float = 10.0,
    batch: int = 4,
    budget: float | int | None = None,
) -> TuningResult | SessionTuningResult:
    """Search the options of ``kernel`` (a :class:`polyc.Kernel`) for the shapes and dtypes of
    ``args`` (the arguments a call would take) on this machine.

    The search runs for ``seconds`` (default 60) or until it has measured ``trials``
    candidates; ``budget`` is their deprecated spelling (a float: seconds, an int: trials).
    ``strategy``: ``"model"`` (a cost model ranks the candidates) or ``"random"``.  ``records``: the JSON-lines
    file of results (default: the user's, in the kernel cache directory); candidates already
    measured there for the same key are not measured again.  ``start_from``: records or a path
    to a records file (from another machine, say) whose options are measured first.
    ``client``: a ``dask.distributed.Client`` to measure on its workers.  Returns a
    :class:`TuningResult`; afterwards, calls of ``kernel`` (and of any kernel for the same def)
    with these shapes use the best options found.

    ``kernel`` may also be a ``polyc.onnx.InferenceSession`` and ``args`` one dict of feeds:
    then every kernel of the model is tuned, the time or trials shared among them
    (:func:`polyc.tuning.session.tune_session`, which returns a ``SessionTuningResult``).
    """
    return search(
        kernel,
        *args,
        budget=search_budget(seconds, trials, budget),
        strategy=strategy,
        records=records,
        client=client,
        start_from=start_from,
        progress=progress,
        seed=seed,
        prune_factor=prune_factor,
        batch=batch,
    )


def search(
    kernel,
    *args,
    budget: float | int,
    strategy: str = "model",
    records=None,
    client=None,
    start_from=None,
    progress: bool = True,
    seed: int = 0,
    prune_factor: float = 10.0,
    batch: int = 4,
):
    """:func:`tune` with its budget settled (:func:`search_budget`): seconds as a float, trials as an int."""
    from polyc.api import Kernel
    from polyc.lang.printer import format_def

    onnx_session = sys.modules.get("polyc.frontends.onnx.session")  # loaded if kernel can be one
    if onnx_session is not None and isinstance(kernel, onnx_session.InferenceSession):
        from polyc.tuning.session import tune_session

        if len(args) != 1:
            raise PolycError(f"tune(session, feeds) takes one dict of feeds, not {len(args)} arguments")
        return tune_session(
            kernel,
            args[0],
            budget=budget,
            progress=progress,
            strategy=strategy,
            records=records,
            client=client,
            start_from=start_from,
            seed=seed,
            prune_factor=prune_factor,
            batch=batch,
        )
    if not isinstance(kernel, Kernel):
        raise PolycError(
            f"tune() takes a polyc kernel (a def of polyc.define) or an ONNX session, not {type(kernel).__name__}"
        )
    if strategy not in STRATEGIES:
        raise PolycError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
        raise PolycError(f"budget must be a positive number of seconds (float) or trials (int), not {budget!r}")
    if kernel.options.backend != "c":
        raise PolycError(f"tune() measures compiled kernels: backend {kernel.options.backend!r} has nothing to tune")
    definition = kernel.definition
    inputs, sizes, key = bound_call(kernel, args)
    base_options = _tunable_base(kernel.options)
    space = space_for(definition, sizes, base_options)
    path = Path(records) if records is not None else default_records_path()
    measure = _Measurer(
        format_def(kernel.syntax),
        definition.name,
        base_options,
        inputs,
        sizes,
        _reference(kernel, inputs, sizes, base_options),
        _tolerance_terms(definition, sizes),
        client,
    )

    session, rng = uuid.uuid4().hex[:12], random.Random(seed)
    measured: dict[str, tuple[dict, TuningRecord]] = {}  # identity -> (config or {}, record)
    for record in read_records(path):
        if record.key == key:
            record = replace(record, options=upgraded_options(space.kernel_path, record.options))
            measured[_identity(record.options)] = (_config_in(space, record), record)
    best = _best(measured)
    default_record = measured.get(_identity(space.options(space.default)), (None, None))[1]
    model = CostModel(seed) if strategy == "model" else None
    queue: list[dict] = [dict(space.default)]
    queue += [{"__options__": dict(r.options)} for r in _start_records(start_from)]
    deadline = time.monotonic() + budget if isinstance(budget, float) else math.inf
    max_trials = budget if isinstance(budget, int) else math.inf
    trials, interrupted, history = 0, False, []
    bar = _progress_bar(progress, budget)
    try:
        while trials < max_trials and time.monotonic() < deadline:
            if not queue:
                queue = _propose(space, measured, model, rng, batch, strategy)
                if not queue:
                    break  # every configuration has been measured
            wanted = min(len(queue), measure.parallelism, int(min(max_trials - trials, 1 << 30)))
            candidates, queue = queue[:wanted], queue[wanted:]
            options_list = [c["__options__"] if "__options__" in c else space.options(c) for c in candidates]
            fresh = [(c, o) for c, o in zip(candidates, options_list) if _identity(o) not in measured]
            if not fresh:
                continue
            limit = pruning_limit(best.seconds if best else None, prune_factor)
            for (config, options), outcome in zip(fresh, measure([o for _, o in fresh], limit)):
                trials += 1
                record = TuningRecord(
                    key,
                    options,
                    outcome["status"],
                    outcome.get("seconds"),
                    tuple(outcome.get("runs", ())),
                    outcome.get("message", ""),
                    tc=measure.source,
                    machine=this_machine().to_json(),
                    session=session,
                    trial=len(measured) + 1,
                    config=None if "__options__" in config else config,
                )
                append_record(record, path)
                measured[_identity(options)] = (config if "__options__" not in config else {}, record)
                if record.status == "ok" and (best is None or record.timed_seconds < best.timed_seconds):
                    best = record
                if _identity(options) == _identity(space.options(space.default)):
                    default_record = measured[_identity(options)][1]
                history.append((trials, best.seconds if best else None))
                if bar is not None:
                    bar.update(1 if isinstance(budget, int) else 0)
                    bar.set_postfix_str(f"best {best.timed_seconds * 1e3:.3f} ms" if best else "no result yet")
            if bar is not None and isinstance(budget, float):
                bar.n = min(budget, round(budget - max(0.0, deadline - time.monotonic()), 1))
                bar.refresh()
        # The best against the defaults, timed in alternating blocks (the search's best time is
        # the luckiest of many single timings); the records of this confirmation decide which
        # options calls use (records.chosen_record).
        if best is not None and best.options and default_record is not None and default_record.status == "ok":
            confirmation = [{}, dict(best.options)]
            for options, outcome in zip(confirmation, measure.confirm(confirmation)):
                record = TuningRecord(
                    key,
                    options,
                    outcome["status"],
                    outcome.get("seconds"),
                    tuple(outcome.get("runs", ())),
                    "confirmation",
                    tc=measure.source,
                    machine=this_machine().to_json(),
                    session=session,
                    config=measured[_identity(options)][0] or None,
                    confirmed=True,
                )
                append_record(record, path)
                measured[_identity(options)] = (measured[_identity(options)][0], record)
            chosen = chosen_record([r for _, r in measured.values()])
            best = chosen if chosen is not None else best
            default_record = measured[_identity({})][1]
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    kernel._forget_compiled()  # later calls compile with the best record
    return TuningResult(
        key,
        space,
        dict(best.options) if best else {},
        best.seconds if best else None,
        default_record.seconds if default_record and default_record.status == "ok" else None,
        trials,
        len(measured),
        interrupted,
        path,
        history,
    )


def bound_call(kernel, args: tuple) -> tuple[tuple, dict[str, int], TuningKey]:
    """The input arrays of a call of ``kernel`` on ``args``, its sizes (checked against the def's
    bounds) and the key its tuning records have."""
    from polyc.runtime.arguments import bind_arguments

    definition = kernel.definition
    call = bind_arguments(definition, tuple(args), None, kernel._written_before_read, {})
    sizes = dict(call.sizes)
    kernel.bounds_precondition.check(sizes, definition.source or None)
    key = TuningKey.for_call(definition, sizes, record_target(_tunable_base(kernel.options)))
    return tuple(call.arrays[name] for name in definition.inputs), sizes, key


def _tunable_base(options):
    """The options candidates start from: the kernel's, without records applied (a search must
    not measure the previous best as 'the default')."""
    return options.replace(tuning=False)


def _config_in(space: SearchSpace, record: TuningRecord) -> dict:
    """The configuration of ``space`` that ``record`` measured, for the cost model to learn
    from; {} where there is none.  A record written when the space had fewer knobs (an older
    polyc) left them at their defaults; one whose options no configuration gives (a start
    from other records) is not a point of this space."""
    if not record.config:
        return {}
    config = {**space.default, **{k: v for k, v in record.config.items() if k in space.default}}
    return config if space.options(config) == upgraded_options(space.kernel_path, record.options) else {}


def _identity(options: Mapping) -> str:
    import json

    return json.dumps(dict(options), sort_keys=True)


def _best(measured) -> TuningRecord | None:
    ok = [r for _, r in measured.values() if r.status == "ok" and r.seconds is not None]
    return min(ok, key=lambda r: r.seconds) if ok else None


def _start_records(start_from) -> list[TuningRecord]:
    if start_from is None:
        return []
    if isinstance(start_from, (str, Path)):
        records = read_records(start_from)
    else:
        records = list(start_from)
    ok = sorted((r for r in records if r.status == "ok" and r.seconds is not None), key=lambda r: r.timed_seconds)
    return ok[:8]


def _propose(
    space: SearchSpace, measured, model: CostModel | None, rng: random.Random, batch: int, strategy: str
) -> list[dict]:
    """The next candidates: unmeasured configurations, best predicted first."""
    seen = set(measured)

    def fresh(config) -> bool:
        return space.identity(config) not in seen

    if strategy == "random" or model is None:
        return _random_unmeasured(space, rng, batch, fresh)
    with_configs = [(c, r) for c, r in measured.values() if c]
    points = [(space.features(c), r.seconds if r.status == "ok" else None) for c, r in with_configs]
    times = [s for _, s in points if s is not None]
    if times:
        # Failed and pruned candidates teach the model too: as much slower as pruning assumes.
        penalty = max(times) * 10
        model.fit([f for f, _ in points], [s if s is not None else penalty for _, s in points])
    if not model.trained:
        return _random_unmeasured(space, rng, batch, fresh)
    pool = (
        _whole_space(space, fresh)
        if space.size <= ENUMERATED_SPACE
        else _annealed(space, with_configs, model, rng, fresh)
    )
    if not pool:
        return _random_unmeasured(space, rng, batch, fresh)
    candidates = list(pool.values())
    # Trees predict the same time for whole regions of the space: ties are broken at random,
    # not by the order the space enumerates its configurations in (which would measure one
    # corner of a region, its last knobs varied, before any other).
    rng.shuffle(candidates)
    predicted = model.predict([space.features(c) for c in candidates])
    ranked = [candidates[i] for i in np.argsort(predicted, kind="stable")]
    explore = max(1, batch // 4)  # epsilon-greedy: some random candidates keep the model honest
    chosen = ranked[: batch - explore]
    chosen += [
        c
        for c in _random_unmeasured(space, rng, explore, fresh)
        if space.identity(c) not in {space.identity(x) for x in chosen}
    ]
    return chosen


def _whole_space(space: SearchSpace, fresh) -> dict[str, dict]:
    """Every unmeasured configuration of a small space: the model ranks them all."""
    pool: dict[str, dict] = {}
    for config in space.configs():
        if fresh(config):
            pool.setdefault(space.identity(config), config)
    return pool


def _annealed(space: SearchSpace, with_configs, model: CostModel, rng: random.Random, fresh) -> dict[str, dict]:
    """Unmeasured configurations met by simulated-annealing walks on the model's predictions,
    from the best measured configurations and from random ones."""
    starts = [
        c
        for c, r in sorted(
            with_configs,
            key=lambda cr: cr[1].seconds if cr[1].status == "ok" and cr[1].seconds is not None else math.inf,
        )[:4]
    ]
    starts += [space.random_config(rng) for _ in range(4)]
    pool: dict[str, dict] = {}
    for start in starts:
        current = dict(start)
        current_score = float(model.predict([space.features(current)])[0])
        temperature = 1.0
        for _ in range(60):
            candidate = space.neighbour(current, rng)
            score = float(model.predict([space.features(candidate)])[0])
            if fresh(candidate):
                pool[space.identity(candidate)] = candidate
            if score < current_score or rng.random() < math.exp((current_score - score) / temperature):
                current, current_score = candidate, score
            temperature *= 0.93
    return pool


def _random_unmeasured(space: SearchSpace, rng: random.Random, count: int, fresh) -> list[dict]:
    chosen: dict[str, dict] = {}
    for _ in range(count * 50):
        if len(chosen) >= count:
            break
        config = space.random_config(rng)
        if fresh(config):
            chosen.setdefault(space.identity(config), config)
    return list(chosen.values())


#: Statement instances up to which candidates are checked against the reference interpreter,
#: whose time is proportional to them (sgemm 2048's 8.6 billion took it longer than a tuning
#: budget); a larger kernel's candidates are checked against polyc's default build of the def
#: (whose code paths the test suite checks against the interpreter at smaller sizes).
INTERPRETED_INSTANCES = 1 << 28


def _reference(kernel, inputs: tuple, sizes: Mapping[str, int], base_options) -> tuple[np.ndarray, ...]:
    """The outputs for ``inputs`` of the reference interpreter (TC semantics), or for a kernel
    of more than INTERPRETED_INSTANCES statement instances, of the def built with
    ``base_options`` (the defaults: no tuning records applied)."""
    if _statement_instances(kernel.definition, sizes) <= INTERPRETED_INSTANCES:
        from polyc.interpreter import interpret

        return tuple(np.asarray(r) for r in interpret(kernel.definition, inputs))
    from polyc.api import Kernel

    outputs = Kernel(kernel.syntax, kernel.definition, base_options)(*inputs)
    return tuple(np.asarray(r) for r in (outputs if isinstance(outputs, tuple) else (outputs,)))


def _range_product(statement, indices, sizes: Mapping[str, int], least: int) -> int:
    """The product of the extents of ``indices`` of ``statement`` at ``sizes``, each at least ``least``."""
    product = 1
    for index in indices:
        r = statement.range_of(index)
        product *= max(least, r.hi.evaluate(sizes) - r.lo.evaluate(sizes))
    return product


def _statement_instances(definition, sizes: Mapping[str, int]) -> int:
    """The statement instances of ``definition`` at ``sizes``: each statement's index ranges multiplied."""
    return sum(_range_product(s, s.all_indices, sizes, 0) for s in definition.statements)


def _tolerance_terms(definition, sizes: Mapping[str, int]) -> int:
    """The longest chain of accumulated terms in any statement, for the comparison's bound."""
    return max([1] + [_range_product(s, s.reduction_indices, sizes, 1) for s in definition.statements])


def outputs_match(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], terms: int) -> str:
    """'' when every output matches the reference within the rounding of ``terms`` accumulated
    terms (``(terms + 8) * eps * max|reference|``; integers exactly), else what differs."""
    if len(outputs) != len(reference):
        return f"{len(outputs)} outputs, expected {len(reference)}"
    for position, (got, want) in enumerate(zip(outputs, reference)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"output {position}: shape {got.shape}, expected {want.shape}"
        if want.dtype.kind in "biu":
            if not np.array_equal(got, want):
                return f"output {position}: {int(np.sum(got != want))} element(s) differ"
            continue
        g, w = got.astype(np.float64), want.astype(np.float64)
        both_nan = np.isnan(g) & np.isnan(w)
        scale = float(np.max(np.abs(w[np.isfinite(w)]))) if np.isfinite(w).any() else 1.0
        bound = (terms + 8) * float(np.finfo(want.dtype).eps) * (scale or 1.0)
        error = np.where(both_nan | (g == w), 0.0, np.abs(g - w))
        worst = float(np.max(np.where(np.isnan(error), np.inf, error))) if error.size else 0.0
        if worst > bound:
            return f"output {position}: max error {worst:.3g} > {bound:.3g}"
    return ""


class _Measurer:
    """Measures candidates here, or on Dask workers when a client is given.  Here, as many
    candidates at a time as there are processors: their libraries built at once (a candidate's
    C compile takes far longer than its timing), then each checked and timed in turn, nothing
    else running meanwhile."""

    def __init__(
        self, source: str, name: str, base_options, inputs, sizes: Mapping[str, int], reference, terms: int, client
    ):
        import dataclasses

        self.source, self.name = source, name
        self.base = {k: v for k, v in dataclasses.asdict(base_options).items()}
        self.inputs, self.sizes, self.reference, self.terms = inputs, dict(sizes), reference, terms
        self.client = client
        self.parallelism = usable_cores()
        if client is not None:
            from polyc.tuning.distributed import DaskMeasurer

            self._dask = DaskMeasurer(client, self)
            self.parallelism = self._dask.parallelism

    def job(self, options: Mapping, limit: float) -> dict:
        return {
            "source": self.source,
            "name": self.name,
            "options": {**self.base, **options},
            "terms": self.terms,
            "limit": limit,
        }

    def __call__(self, options_list: list[dict], limit: float) -> Iterable[dict]:
        """Each candidate's outcome, in order; here as each is measured, so that an
        interrupted batch keeps the outcomes before."""
        if self.client is not None:
            return self._dask.measure([self.job(o, limit) for o in options_list])
        return self._measured_here([self.job(o, limit) for o in options_list])

    def _measured_here(self, jobs: list[dict]) -> Iterator[dict]:
        if len(jobs) > 1:
            from polyc.driver import build_ahead

            # (no bar of its own: the search shows its progress)
            build_ahead(((kernel, self.sizes) for kernel in _candidate_kernels(jobs)), progress=False)
        for job in jobs:
            yield measure_candidate(job, self.inputs, self.reference)

    def confirm(self, options_list: list[dict]) -> list[dict]:
        jobs = [self.job(o, math.inf) for o in options_list]
        if self.client is not None:
            return self._dask.confirm(jobs)
        return confirm_candidates(jobs, self.inputs)


def candidate_kernel(job: Mapping):
    """``job``'s def defined with its options (JSON's lists made tuples again)."""
    from polyc.api import define

    options = dict(job["options"])
    for name in ("tile_sizes", "loop_tiles", "gemm_blocks", "gpu_tiles", "cflags", "cache_sizes"):
        if isinstance(options.get(name), list):
            options[name] = tuple(options[name])
    return define(job["source"], **options)[job["name"]]


def _candidate_kernels(jobs: list):
    """The kernels of those ``jobs`` that define (the others fail in measure_candidate)."""
    for job in jobs:
        try:
            yield candidate_kernel(job)
        except PolycError:
            continue


def measure_candidate(job: Mapping, inputs: tuple, reference: tuple) -> dict:
    """Compile ``job``'s def with its options, check it against ``reference``, time it.  Runs in
    this process or on a Dask worker (``job`` is plain data).  Timing holds a machine-wide lock,
    so two measurements on one machine (two workers of a LocalCluster) never overlap."""
    try:
        kernel = candidate_kernel(job)
        started = time.perf_counter()
        outputs = kernel(*inputs)  # compiles, or loads what _Measurer built ahead
        compile_seconds = time.perf_counter() - started
    except PolycError as error:
        return {"status": "error", "message": str(error)[:500]}
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    problem = outputs_match(outputs, reference, job["terms"])
    if problem:
        return {"status": "wrong", "message": problem}
    with _measurement_lock():
        runs = [_time_call(kernel, inputs)]
        # Pruned only when a second run is slow too: on a busy machine one run of a fast
        # candidate can wait a scheduler slice, milliseconds, many times a small kernel's time.
        if runs[0] > job["limit"]:
            runs.append(_time_call(kernel, inputs))
        quickest = min(runs)
        if quickest > job["limit"]:
            return {
                "status": "pruned",
                "runs": runs,
                "compile_seconds": compile_seconds,
                "message": f"first runs {', '.join(f'{r * 1e3:.3f}' for r in runs)} ms > {job['limit'] * 1e3:.3f} ms",
            }
        count = run_count(quickest)
        runs += [_time_call(kernel, inputs) for _ in range(count - len(runs))]
    return {
        "status": "ok",
        "seconds": statistics.median(runs),
        "runs": runs,
        "compile_seconds": compile_seconds,
        "machine": this_machine().id,
    }


def confirm_candidates(jobs: list, inputs: tuple, rounds: int = CONFIRM_ROUNDS) -> list[dict]:
    """Time already checked candidates against one another: ``rounds`` rounds, each a block of
    runs of every candidate in turn (the order reversed every other round), so that a change of
    the machine's load reaches all alike; each one's time is the median of its blocks' medians.
    The search's best is the fastest of many candidates each timed once, and so, on a noisy
    machine, often one whose timing was lucky: the confirmation decides (:mod:`polyc.runtime.tuning_records`)."""
    from polyc.api import define

    kernels = []
    for job in jobs:
        kernel = define(job["source"], **plain_options(job["options"]))[job["name"]]
        kernel(*inputs)  # compiled (from the cache) before any timing
        kernels.append(kernel)
    blocks: list[list[float]] = [[] for _ in jobs]
    runs: list[list[float]] = [[] for _ in jobs]
    with _measurement_lock():
        quickest = min(_time_call(kernel, inputs) for kernel in kernels)
        count = run_count(quickest)
        for round_number in range(rounds):
            order = range(len(kernels)) if round_number % 2 == 0 else reversed(range(len(kernels)))
            for position in order:
                block = [_time_call(kernels[position], inputs) for _ in range(count)]
                runs[position] += block
                blocks[position].append(statistics.median(block))
    return [{"status": "ok", "seconds": statistics.median(b), "runs": r} for b, r in zip(blocks, runs)]


def run_count(quickest: float) -> int:
    """Timed calls of a candidate whose quickest call took ``quickest`` seconds: about
    MEASURE_SECONDS of them, within MIN_RUNS..MAX_RUNS."""
    return int(min(MAX_RUNS, max(MIN_RUNS, MEASURE_SECONDS / max(quickest, 1e-7))))


def plain_options(options: Mapping) -> dict:
    """A job's options as polyc.define takes them (JSON's lists back to tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def _time_call(kernel, inputs) -> float:
    started = time.perf_counter()
    kernel(*inputs)
    return time.perf_counter() - started


class _measurement_lock:
    """An exclusive lock on a file in the temporary directory: one measurement per machine."""

    def __enter__(self):
        self._file = open(Path(tempfile.gettempdir()) / "polyc-tune-measure.lock", "a")
        try:
            import fcntl

            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        except ImportError:
            pass
        return self

    def __exit__(self, *exc):
        self._file.close()  # releases the lock
        return False


def _progress_bar(progress: bool, budget):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    if isinstance(budget, int):
        return tqdm(total=budget, desc="polyc.tune", unit="trial")
    return tqdm(total=budget, desc="polyc.tune", unit="s", bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s {postfix}")
