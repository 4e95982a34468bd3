"""Measuring tuning candidates on Dask workers.

Tuning is embarrassingly parallel across machines of one kind: each candidate is compiled and
timed by one worker, and the results come back as ordinary records.  Rules:

- Only workers whose machine fingerprint (:mod:`polyc.runtime.machine`) equals the target's measure:
  a time taken on another kind of processor would be a wrong record.  Others are left idle, and
  a client with no matching worker is an error that lists what the workers are.
- One measurement per machine at a time: :func:`polyc.tuning.search.measure_candidate` holds a
  machine-wide lock while timing (compilation runs in parallel), so two workers on one machine
  (a ``LocalCluster``) do not disturb each other's timings.  Start workers with one thread each
  (``dask worker --nthreads 1``) so that a worker never runs two candidates at once.
- The inputs and the reference outputs are sent to each worker once (``scatter``), not per task.
"""

from __future__ import annotations

import itertools

from polyc.errors import PolycError
from polyc.runtime.machine import this_machine


def _worker_fingerprint() -> dict:
    from polyc.runtime.machine import this_machine as here

    return {"id": here().id, "describe": here().describe()}


def _measure_on_worker(job: dict, data: tuple, target_machine: str) -> dict:
    from polyc.runtime.machine import this_machine as here
    from polyc.tuning.search import measure_candidate

    if here().id != target_machine:  # the scheduler should not send it here; never time it anyway
        return {"status": "error", "message": f"worker machine {here().describe()} is not the target"}
    inputs, reference = data
    return measure_candidate(job, inputs, reference)


def _confirm_on_worker(jobs: list, data: tuple, target_machine: str) -> list:
    from polyc.runtime.machine import this_machine as here
    from polyc.tuning.search import confirm_candidates

    if here().id != target_machine:
        raise PolycError(f"worker machine {here().describe()} is not the target")
    return confirm_candidates(jobs, data[0])


class DaskMeasurer:
    """Runs the measurer's jobs on the matching workers of a ``dask.distributed.Client``."""

    def __init__(self, client, measurer, target_machine: str | None = None):
        self.client = client
        self.target = target_machine or this_machine().id
        fingerprints = client.run(_worker_fingerprint)
        self.workers = sorted(address for address, f in fingerprints.items() if f["id"] == self.target)
        if not self.workers:
            kinds = sorted({f["describe"] for f in fingerprints.values()}) or ["no workers"]
            raise PolycError(
                "no Dask worker runs on the machine being tuned for "
                f"({this_machine().describe()}); the workers are: {'; '.join(kinds)}"
            )
        self.parallelism = len(self.workers)
        self._data = client.scatter((measurer.inputs, measurer.reference), workers=self.workers, broadcast=True)

    def measure(self, jobs: list[dict]) -> list[dict]:
        futures = [
            self.client.submit(
                _measure_on_worker,
                job,
                self._data,
                self.target,
                workers=[worker],
                allow_other_workers=False,
                pure=False,
            )
            for job, worker in zip(jobs, itertools.cycle(self.workers))
        ]
        return self.client.gather(futures)

    def confirm(self, jobs: list[dict]) -> list[dict]:
        """:func:`polyc.tuning.search.confirm_candidates` on one matching worker."""
        return self.client.submit(
            _confirm_on_worker,
            jobs,
            self._data,
            self.target,
            workers=self.workers[:1],
            allow_other_workers=False,
            pure=False,
        ).result()
