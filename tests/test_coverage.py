"""Outputs written before read (:mod:`polyc.ir.coverage`): only those skip zeroing.

- the analysis on the forms that decide it: `=` and `+=!` over the whole tensor, narrower
  `where` ranges, accumulation without `!`, a read of the old value, several statements;
- the whole corpus, interpreted and compiled, with freshly allocated outputs and temporaries
  poisoned (NaN for floats, a sentinel for integers): a kernel that relied on zeroed memory it
  did not get would show the poison.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernels import KERNELS, check_kernel

import polyc
from polyc.interpreter import run_bound
from polyc.ir.coverage import written_before_read
from polyc.ir.model import build_program
from polyc.runtime import arguments


def defined(source: str) -> list[str]:
    definition = polyc.define(source).f.definition
    return sorted(written_before_read(build_program(definition), definition.outputs))


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f(float(N) A) -> (B) { B(i) = A(i) }", ["B"]),
        ("def f(float(N, M) A) -> (B) { B(i) +=! A(i, j) }", ["B"]),
        ("def f(float(N) A) -> (B) { B(i) += A(i) }", []),  # accumulates into zeros
        ("def f(float(N) A) -> (float(N) B) { B(i) = A(i) where i in 0:N-1 }", []),  # last one stays 0
        ("def f(float(N) A) -> (B) { B(i) = A(i) where i in 1:N\n B(i) += A(i) }", []),
        ("def f(float(N) A) -> (B) { B(i) = A(i)\n B(i) = B(i) + 1 }", ["B"]),  # read after the write
        ("def f(float(N) A) -> (B) { B(i) +=! A(i)\n B(i) += B(i) }", ["B"]),
        ("def f(float(N) A) -> (B, C) { B(i) = A(i)\n C(i) += B(i) }", ["B"]),
        ("def f(float(N) A) -> (B) { B(i) max=! A(i) }", ["B"]),
    ],
)
def test_written_before_read(source, expected):
    assert defined(source) == expected


def test_partly_written_output_keeps_its_zeros():
    kernel = polyc.define("def f(float(N) A) -> (float(N) B) { B(i) = A(i) where i in 0:N-1 }").f
    for _ in range(3):  # freshly allocated memory is not always zero: the call must zero it
        np.testing.assert_array_equal(kernel(np.full(6, 2, np.float32)), [2, 2, 2, 2, 2, 0])


def _poisoned_empty(shape, dtype=float, **kwargs):
    array = np.zeros(shape, dtype=dtype, **kwargs)
    array[...] = np.nan if array.dtype.kind in "fc" else (True if array.dtype.kind == "b" else 77)
    return array


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Outputs and temporaries that skip zeroing start as NaN (or 77), not whatever memory held."""
    monkeypatch.setattr(arguments, "allocate_uninitialised", _poisoned_empty)


def test_poison_shows_when_an_output_is_wrongly_taken_as_written(poisoned_outputs):
    definition = polyc.define("def f(float(N) A) -> (float(N) B) { B(i) = A(i) where i in 0:N-1 }").f.definition
    call = arguments.bind_arguments(definition, (np.ones(4, np.float32),), None, frozenset({"B"}))
    assert np.isnan(run_bound(definition, call)[0][-1])


@pytest.mark.parametrize("case", KERNELS, ids=str)
def test_corpus_with_poisoned_outputs(case, poisoned_outputs):
    kernel = polyc.define(case.source)[case.entry]
    for sizes in case.size_sets:
        check_kernel(case, kernel, sizes)
        interpreted = kernel.definition

        def interpret(*args, outputs=None):
            call = arguments.bind_arguments(interpreted, args, outputs, kernel._written_before_read)
            results = run_bound(interpreted, call)
            return results[0] if len(results) == 1 else results

        check_kernel(case, interpret, sizes)


@pytest.mark.parametrize(
    "source, defined_temporaries, expected",
    [
        ("def f(float(N) A) -> (B) { T(i) = A(i) + 1\n B(i) = T(i) * 2 }", {"T"}, [4, 6, 8]),
        ("def f(float(N) A) -> (B) { T(i) += A(i)\n B(i) = T(i) * 2 }", set(), [2, 4, 6]),  # T's zeros count
    ],
)
def test_temporaries_with_poisoned_memory(poisoned_outputs, source, defined_temporaries, expected):
    kernel = polyc.define(source).f
    assert kernel._written_before_read - {"B"} == defined_temporaries
    np.testing.assert_array_equal(kernel(np.array([1, 2, 3], np.float32)), expected)
