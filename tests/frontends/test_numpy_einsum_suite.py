"""numpy's own einsum tests, run against ``polyc.einsum``.

numpy ships its test modules in the wheel.  This module loads ``numpy/_core/tests/test_einsum.py``
from the installed numpy (nothing of it is copied here) with ``np`` bound, in that module only,
to a stand-in for numpy whose ``einsum`` is :func:`polyc.einsum`; every other name is numpy's
own.  numpy itself is not patched: other tests, and numpy's internals, see the real numpy.
pytest then collects the loaded module's tests as tests of this module.

One rule turns a failure into a skip: polyc declines complex, long double and object
computations by design (README, Python API).  A call that computes in one of those types and is
refused with :class:`polyc.UnsupportedError` -- that class, nothing else -- skips its test with
the error's message as the reason.  Any other error, or an UnsupportedError for another
reason, fails the test as usual.
"""

from __future__ import annotations

import builtins
import importlib.util
import pathlib
import types

import numpy as np
import pytest

import polyc
from polyc.errors import UnsupportedError

NUMPY_TEST_FILE = pathlib.Path(np.__file__).parent / "_core" / "tests" / "test_einsum.py"

#: dtypes polyc refuses to compute in, by design (see the README's einsum bullet).
DECLINED_KINDS = frozenset("cO")


def _declined(dtype: np.dtype) -> bool:
    """Complex, object, or a long double wider than double."""
    return dtype.kind in DECLINED_KINDS or (dtype == np.longdouble and np.dtype(np.longdouble) != np.float64)


def _computed_dtype(operands, dtype) -> np.dtype | None:
    """The dtype a call computes in, as numpy would choose it (None if the operands say nothing)."""
    if dtype is not None:
        try:
            return np.dtype(dtype)
        except TypeError:
            return None
    try:
        return np.result_type(*(np.asarray(op) for op in operands)) if operands else None
    except (TypeError, ValueError):
        return None


def polyc_einsum(*args, **kwargs):
    """:func:`polyc.einsum`, skipping the calling test when polyc declines the dtype by design."""
    try:
        return polyc.einsum(*args, **kwargs)
    except UnsupportedError as error:
        operands = args[1:] if isinstance(args[0], str) else args[0 : len(args) // 2 * 2 : 2]
        dtype = _computed_dtype(operands, kwargs.get("dtype"))
        if dtype is not None and _declined(dtype):
            pytest.skip(f"polyc declines {dtype.name} by design: {error}")
        raise


class _NumpyWithPolycEinsum(types.ModuleType):
    """numpy, except that ``einsum`` is polyc's."""

    def __init__(self):
        super().__init__("numpy", "numpy with polyc.einsum, for numpy's einsum tests")
        self.einsum = polyc_einsum

    def __getattr__(self, name):
        return getattr(np, name)


def _load_numpy_einsum_tests() -> types.ModuleType:
    """numpy's einsum test module, executed with ``import numpy`` giving the stand-in.  Only the
    top-level ``numpy`` import is redirected; ``numpy.testing`` and the rest are the real ones."""
    stand_in = _NumpyWithPolycEinsum()

    def import_with_stand_in(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "numpy" and not fromlist and level == 0:
            return stand_in
        return builtins.__import__(name, globals, locals, fromlist, level)

    spec = importlib.util.spec_from_file_location("numpy_test_einsum_through_polyc", NUMPY_TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = {**vars(builtins), "__import__": import_with_stand_in}
    spec.loader.exec_module(module)
    assert module.np is stand_in
    return module


if not NUMPY_TEST_FILE.is_file():
    pytest.skip(
        f"this numpy ({np.__version__}) does not ship its test modules ({NUMPY_TEST_FILE} is absent)",
        allow_module_level=True,
    )

_numpy_tests = _load_numpy_einsum_tests()
# Collected by pytest as this module's tests: the classes and functions pytest would collect there.
for _name, _value in vars(_numpy_tests).items():
    if (_name.startswith("Test") and isinstance(_value, type)) or (_name.startswith("test_") and callable(_value)):
        globals()[_name] = _value
del _name, _value
