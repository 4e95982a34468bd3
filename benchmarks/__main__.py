"""``python -m benchmarks``: see :mod:`benchmarks.run`.

OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE may be set on this machine (older OpenBLAS builds need
them on its processor); they make a current numpy pick a slower kernel.  They are cleared here,
for this process only and before numpy is imported, so numpy is measured at its best; their
original values and the BLAS kernel then in use go into the JSON results.  ``--keep-blas-env``
leaves them as they are (the smoke test does: tests do not change them).
"""

import os
import sys

BLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
original = {name: os.environ.get(name) for name in BLAS_VARIABLES}
if "--keep-blas-env" not in sys.argv[1:]:
    for name in BLAS_VARIABLES:
        os.environ.pop(name, None)
if "numpy" in sys.modules:  # cannot happen under `python -m benchmarks`; say so if it does
    print("warning: numpy was imported before the OpenBLAS variables were cleared", file=sys.stderr)

from benchmarks.run import main  # noqa: E402  (numpy is imported only now)

sys.exit(main(blas_environment=original))
