"""load_library and get_function: one CDLL per library, and clear errors."""

from __future__ import annotations

import ctypes
import os

import pytest

from polyc.errors import CacheError, CompilationError
from polyc.runtime import get_function, get_or_build, load_library


def test_same_path_gives_same_library(tmp_path, axpy_source, monkeypatch):
    library_path = get_or_build(axpy_source)
    first = load_library(library_path)
    assert load_library(str(library_path)) is first
    monkeypatch.chdir(library_path.parent)
    assert load_library("kernel.so") is first
    assert load_library(library_path.parent / ".." / library_path.parent.name / "kernel.so") is first


def test_functions_are_typed_independently(axpy_source):
    library = load_library(get_or_build(axpy_source))
    as_floats = get_function(library, "axpy", [ctypes.c_long, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p])
    as_ints = get_function(library, "axpy", [ctypes.c_int], ctypes.c_int)
    assert as_floats.argtypes[1] is ctypes.c_float and as_floats.restype is None
    assert as_ints.argtypes == [ctypes.c_int]


def test_missing_file(tmp_path):
    with pytest.raises(CacheError, match="does not exist"):
        load_library(tmp_path / "gone.so")


def test_file_that_is_not_a_library(tmp_path):
    fake = tmp_path / "fake.so"
    fake.write_bytes(os.urandom(256))
    with pytest.raises(CompilationError, match="cannot load compiled kernel library"):
        load_library(fake)


def test_missing_function(axpy_source):
    library = load_library(get_or_build(axpy_source))
    with pytest.raises(CompilationError, match="no function 'gemm'"):
        get_function(library, "gemm", [])
