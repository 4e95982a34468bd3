"""Autotuning: measure candidate options of a kernel on this machine and remember the best.

    result = polyc.tune(mod.matmul, A, B, seconds=60)    # or trials=40
    mod.matmul(A, B)                                     # now compiled with result.best_options

- :mod:`polyc.tuning.space`: what may change for a kernel's compilation path, and its features.
- :mod:`polyc.tuning.cost_model`: gradient-boosted trees ranking unmeasured candidates.
- :mod:`polyc.tuning.search`: the explorer, the measurement, :func:`tune`.
- :mod:`polyc.runtime.tuning_records`: the append-only JSON-lines records, keyed by def, sizes, dtypes,
  compiler, machine fingerprint (:mod:`polyc.runtime.machine`) and polyc version.
- :mod:`polyc.tuning.distributed`: measuring on Dask workers.
"""

from polyc.runtime.machine import MachineFingerprint, this_machine
from polyc.runtime.tuning_records import (
    TuningKey,
    TuningRecord,
    best_options,
    default_records_path,
    merge_records,
    read_records,
)
from polyc.tuning.search import TuningResult, tune

__all__ = [
    "tune",
    "TuningResult",
    "TuningKey",
    "TuningRecord",
    "read_records",
    "merge_records",
    "best_options",
    "default_records_path",
    "MachineFingerprint",
    "this_machine",
]
