"""The environment variables polyc reads (polyc/runtime/environment.py, polyc/runtime/compiler.py):
a bad value is an error or a warning naming the variable, and ``OMP_NUM_THREADS=100000`` (which
crashed the first parallel kernel) is cut to a team OpenMP can start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polyc.errors import CompilationError
from polyc.runtime.compiler import CompilerOptions
from polyc.runtime.environment import capped_omp_num_threads, environment_problems


@pytest.mark.parametrize("variable", ["POLYC_CFLAGS", "POLYC_CC", "CC"])
def test_an_unbalanced_quote_names_the_variable(monkeypatch, variable):
    monkeypatch.delenv("POLYC_CC", raising=False)
    monkeypatch.setenv(variable, 'gcc "-O2' if variable != "POLYC_CFLAGS" else '-O2 "-g')
    with pytest.raises(CompilationError, match=rf"{variable}='.*' cannot be split .*unbalanced quote"):
        CompilerOptions().compiler_words()


@pytest.mark.parametrize(
    ("environment", "problem"),
    [
        ({"POLYC_THREADS": "abc"}, "POLYC_THREADS='abc' is not one of all, pool"),
        ({"POLYC_THREADS": "ALL"}, "POLYC_THREADS='ALL'"),
        ({"POLYC_POOL": "maybe"}, "POLYC_POOL='maybe' is neither off"),
    ],
)
def test_unknown_thread_settings_are_named(environment, problem):
    (found,) = environment_problems(environment)
    assert problem in found


@pytest.mark.parametrize("environment", [{}, {"POLYC_THREADS": "all"}, {"POLYC_THREADS": "pool", "POLYC_POOL": "off"}])
def test_known_thread_settings_pass(environment):
    assert environment_problems(environment) == []


def test_openmp_teams_are_cut_to_what_can_start():
    assert capped_omp_num_threads("100000", 1024) == "1024"
    assert capped_omp_num_threads("100000,4", 1024) == "1024,4"
    assert capped_omp_num_threads("8", 1024) is None
    assert capped_omp_num_threads("abc", 1024) is None


PROGRAM = """
import numpy as np, polyc
module = polyc.define('''
def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }
def add(float(N) X, float(N) Y) -> (Z) { Z(i) = X(i) + Y(i) }
''')
a = np.ones((256, 256), np.float32)
x = np.ones(1 << 20, np.float32)
assert (module.add(x, x) == 2).all()
assert (module.matmul(a, a) == 256).all()
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU OpenMP's crash as seen on Linux")
def test_a_huge_omp_num_threads_does_not_crash_and_bad_settings_are_warned_about():
    environment = {**os.environ, "OMP_NUM_THREADS": "100000", "POLYC_THREADS": "abc"}
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip() == "ok"
    assert "OMP_NUM_THREADS=100000 is more threads than a team can start" in result.stderr
    assert "POLYC_THREADS='abc' is not one of all, pool" in result.stderr
