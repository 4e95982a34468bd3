"""Fixtures for the runtime tests.  Every test gets a private kernel cache, so the suite never
reads or writes the user's own cache."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from polyc.runtime import get_function, load_library

AXPY_SOURCE = """\
void axpy(long n, float a, const float *x, float *y)
{
    for (long i = 0; i < n; ++i)
        y[i] += a * x[i];
}
"""

FLOAT_P = ctypes.POINTER(ctypes.c_float)


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty cache directory, installed as ``$POLYC_CACHE_DIR``."""
    directory = tmp_path / "kernel-cache"
    monkeypatch.setenv("POLYC_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def axpy_source() -> str:
    """C text of ``y += a * x`` over float arrays."""
    return AXPY_SOURCE


@pytest.fixture
def check_axpy():
    """Load the library at a path, call its ``axpy`` on numpy arrays and compare with numpy."""

    def check(library_path: Path) -> None:
        axpy = get_function(load_library(library_path), "axpy", [ctypes.c_long, ctypes.c_float, FLOAT_P, FLOAT_P])
        rng = np.random.default_rng(0)
        x = rng.standard_normal(1000).astype(np.float32)
        y = rng.standard_normal(1000).astype(np.float32)
        expected = y + np.float32(2.5) * x
        axpy(x.size, 2.5, x.ctypes.data_as(FLOAT_P), y.ctypes.data_as(FLOAT_P))
        # -O3 -march=native may fuse the multiply-add, so allow for one rounding.
        np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)

    return check
