"""Autotuning: measure candidate options of a kernel on this machine and remember the best.

    result = polyc.tune(mod.matmul, A, B, budget=60.0)   # seconds (float) or trials (int)
    mod.matmul(A, B)                                     # now compiled with result.best_options

- :mod:`polyc.tune.space`: what may change for a kernel's compilation path, and its features.
- :mod:`polyc.tune.cost_model`: gradient-boosted trees ranking unmeasured candidates.
- :mod:`polyc.tune.search`: the explorer, the measurement, :func:`tune`.
- :mod:`polyc.runtime.tuning_records`: the append-only JSON-lines records, keyed by def, sizes, dtypes,
  compiler, machine fingerprint (:mod:`polyc.runtime.machine`) and polyc version.
- :mod:`polyc.tune.distributed`: measuring on Dask workers.
"""

import sys
import types

from polyc.runtime.machine import MachineFingerprint, this_machine
from polyc.runtime.tuning_records import (
    TuningKey,
    TuningRecord,
    best_options,
    default_records_path,
    merge_records,
    read_records,
)
from polyc.tune.search import TuningResult, tune

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


class _CallableModule(types.ModuleType):
    """``polyc.tune`` is both this package and the function: ``polyc.tune(kernel, *args)``."""

    def __call__(self, *args, **kwargs):
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
