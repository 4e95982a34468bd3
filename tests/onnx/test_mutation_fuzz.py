"""The ONNX mutation fuzzer (``tests/onnx/mutation_fuzz.py``, issue 81) on a few hundred mutants:
no raw exception, crash, hang, wrong answer or modified input.  ``POLYC_MUTATION_FUZZ_MUTANTS``
sets how many (default 300), ``POLYC_MUTATION_FUZZ_SEED`` the seed.  ``python -m tests.onnx.mutation_fuzz --mutants 1000``
runs a longer one and prints a table of the outcomes."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from tests.onnx import mutation_fuzz  # noqa: E402

MUTANTS = int(os.environ.get("POLYC_MUTATION_FUZZ_MUTANTS", "300"))
SEED = int(os.environ.get("POLYC_MUTATION_FUZZ_SEED", "81"))


def test_mutants_are_refused_with_a_polyc_error_or_agree_with_onnxruntime():
    records = mutation_fuzz.run_mutants(range(MUTANTS), SEED, timeout=300.0, jobs=1)
    failures = [
        f"mutant {r.mutant.index} ({r.mutant.seed_model}: {'; '.join(r.mutant.mutations)}): {r.outcome}\n{r.detail}"
        for r in records
        if r.outcome in mutation_fuzz.FAILURES
    ]
    print(mutation_fuzz.summary(records))
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("name", list(mutation_fuzz.SEEDS))
def test_the_seed_models_agree_with_onnxruntime(name):
    """Unmutated, every seed model runs in both and agrees (a mutant's 'agreed' means something)."""
    model = mutation_fuzz.SEEDS[name]()
    item = mutation_fuzz.Mutant(
        -1, name, [], model.SerializeToString(), mutation_fuzz._feeds(model, np.random.default_rng(0))
    )
    worker = mutation_fuzz.Worker()
    try:
        outcome, detail = mutation_fuzz.classify(*worker.run(item, timeout=300.0))
    finally:
        worker.stop()
    assert outcome == "agreed", detail


def test_mutants_are_reproducible():
    first, again = mutation_fuzz.mutant(7, 3), mutation_fuzz.mutant(7, 3)
    assert first.model == again.model and first.mutations == again.mutations
    assert all(np.array_equal(first.feeds[n], again.feeds[n]) for n in first.feeds)


def test_a_hang_and_a_crash_are_caught():
    """The worker's timeout and death are outcomes, not a stuck or dead test run."""
    item = mutation_fuzz.mutant(0, 0)
    # (the stuck worker's timeout is short; the dying one's leaves it time to start and die)
    for target, timeout, outcome in (
        (mutation_fuzz._stuck_worker, 5.0, "hang"),
        (mutation_fuzz._dying_worker, 120.0, "crash"),
    ):
        worker = mutation_fuzz.Worker(target)
        try:
            assert mutation_fuzz.classify(*worker.run(item, timeout))[0] == outcome
        finally:
            worker.stop()
