"""The figures the documentation states about the tests are the tests' own: the corpus size, the
number of malformed sources and of semantic errors (docs/testing.md), and the ulp bounds of
polyc's vectorised math (docs/language.md; ``ULP_BOUNDS``, which tests/test_vector_math.py
enforces).  A change on either side that leaves the other behind fails here instead of drifting.
(These figures were stated in README.md until the reference moved to docs/.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from polyc.codegen import vector_math
from polyc.codegen.vector_math import ULP_BOUNDS
from tests.kernels import CASES
from tests.lang.test_malformed import MALFORMED_CASES
from tests.lang.test_semantic_errors import SEMANTIC_CASES

# The pages that state the figures, read as one text (each figure must be stated once in all of them).
STATED_IN = ("docs/testing.md", "docs/language.md")
README = "\n".join((Path(__file__).resolve().parents[1] / page).read_text() for page in STATED_IN)


def stated(pattern: str) -> str:
    """The one match of ``pattern``'s group in the pages of ``STATED_IN``, as one line."""
    matches = re.findall(pattern, " ".join(README.split()))
    assert len(matches) == 1, f"{', '.join(STATED_IN)}: {len(matches)} matches of {pattern!r}"
    return matches[0]


def test_corpus_size():
    assert int(stated(r"on a corpus of (\d+) kernels")) == len(CASES)


def test_malformed_source_count():
    assert int(stated(r"including (\d+) malformed sources")) == len(MALFORMED_CASES)


def test_semantic_error_count():
    assert int(stated(r"\((\d+) located semantic errors\)")) == len(SEMANTIC_CASES)


def readme_ulp_bounds() -> dict[tuple[str, str], float]:
    """``(builtin, dtype) -> bound`` from docs/language.md's "float32 (...): 1.1 (exp, log), ...;
    float64 (...): ..." sentence."""
    sentence = stated(r"(float32 \(measured over all inputs\):.*?)\. The other builtins")
    bounds = {}
    for part in sentence.split(";"):
        dtype = re.match(r"\s*(float32|float64)", part).group(1)
        for bound, names in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?) \(([a-z0-9, ]+)\)", part):
            for name in names.split(","):
                assert (name.strip(), dtype) not in bounds, f"the docs name {name} {dtype} twice"
                bounds[name.strip(), dtype] = float(bound)
    return bounds


def test_ulp_bounds_are_the_tests_bounds():
    assert readme_ulp_bounds() == ULP_BOUNDS


def test_measured_errors_in_the_module_table_are_within_the_bounds():
    rows = re.findall(r"^(\w+) +(\d\.\d+|libm)[^\n]*? +(\d\.\d+|libm)$", vector_math.__doc__, re.MULTILINE)
    assert {name for name, _, _ in rows} == {name for name, _ in ULP_BOUNDS}
    for name, *measured in rows:
        for dtype, value in zip(("float32", "float64"), measured):
            if value == "libm":
                assert (name, dtype) not in ULP_BOUNDS
            else:
                assert float(value) <= ULP_BOUNDS[name, dtype], f"{name} {dtype}: measured {value}"


@pytest.mark.parametrize(
    "check, old, new",
    [
        (test_corpus_size, "corpus of 64 kernels", "corpus of 60 kernels"),
        (test_ulp_bounds_are_the_tests_bounds, "1.5 (expm1, log1p)", "1.5 (expm1), 2.0 (log1p)"),
        (test_ulp_bounds_are_the_tests_bounds, "1.1 (exp, log, tanh)", "1.5 (exp, log, tanh)"),
    ],
    ids=["corpus", "log1p", "float32-exp"],
)
def test_a_drifted_figure_is_caught(monkeypatch, check, old, new):
    # Negative control: the pages with a figure as the README read before these tests, or a bound moved.
    text = " ".join(README.split())
    assert old in text
    monkeypatch.setattr(sys.modules[__name__], "README", text.replace(old, new))
    with pytest.raises(AssertionError):
        check()
