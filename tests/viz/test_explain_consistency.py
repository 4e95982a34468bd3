"""``explain()`` against the C it explains (issue 84): on the generic path, every loop the
explanation calls parallel or vectorised carries that OpenMP pragma in the generated C, and
every OpenMP pragma of the C is on a loop the explanation calls so.

The C side is read here, independently of polyc, from the kernel function's text: each
``for (int64_t NAME = ...`` line is a loop, ``#pragma omp parallel for`` (with ``collapse(k)``:
the k loops nested from it) makes it parallel, ``omp simd`` (or ``parallel for simd``) makes it a
vector loop, and a float sum in blocks (a loop ``NAME_block`` around the vector loop ``NAME``)
counts as the one loop ``NAME`` of the explanation, and a loop written once per value of a
condition it leaves fixed (``if (c) { loop } else { /* polyc: the loop above, for !(c) */
loop }``) is the one loop of its first version.  The two lists must agree loop by loop, in
the order of the text.

Checked over the corpus (tests/kernels.py, every kernel at each of its sizes), over ``SHAPES``
(kernels at sizes that make collapsed loops, sums in blocks, parallel reductions and loops isl
elides) with a few option sets, and over ``FUZZ_EXAMPLES`` random defs of the differential
fuzzer's generator (tests/test_differential_fuzz.py) with its random options and sizes.  Each
def is only scheduled and printed (no C compiler runs): 200 random defs, the issue's number,
take about 20 s of one core, the whole file about 30 s on two.
``POLYC_EXPLAIN_FUZZ_EXAMPLES`` changes the number.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyc
from tests.kernels import CASES
from tests.test_differential_fuzz import (
    MAX_SIZE,
    contraction_problems,
    elementwise_problems,
    multi_statement_problems,
    option_sets,
    reduction_problems,
)

FUZZ_EXAMPLES = int(os.environ.get("POLYC_EXPLAIN_FUZZ_EXAMPLES", "200"))
#: Options that keep every def on the generic path (no dedicated kernel takes it).
GENERIC = {"blas_contractions": False, "direct_convolutions": False, "transpose_kernels": False}

_FOR = re.compile(r"^\s*for \(int64_t (\w+) = ")
_PRAGMA = re.compile(r"^\s*#pragma omp (.*)$")
_FURTHER_VERSION = re.compile(r"^\s*/\* polyc: the loops? above, for ")
#: The loops that load and store a register tile's array (polyc/codegen/c.py): not the schedule's.
_TILE_COPY = re.compile(r"^\s*for \(int64_t polyc_tile_")


def c_loops(source: str, function: str) -> list[tuple[str, bool, bool]]:
    """(iterator, parallel, simd) of each loop of ``function`` in the C text, in text order;
    a blocked sum's two loops (``c3_block`` around ``c3``) are one loop ``c3``."""
    body = source[source.index(f"int {function}(") :]
    loops: list[list] = []
    pending: list[str] = []
    collapsed_left = 0
    version_depth = 0  # inside a further version of a loop written per value of a condition
    for line in body.splitlines():
        if version_depth:
            version_depth += line.count("{") - line.count("}")
            continue
        if _FURTHER_VERSION.match(line):
            version_depth = 1  # the comment opens the version's block, which is one loop of the first
            continue
        pragma = _PRAGMA.match(line)
        if pragma:
            pending.append(pragma.group(1))
            continue
        loop = _FOR.match(line)
        if _TILE_COPY.match(line):
            pending = []
            continue
        if not loop:
            if line.strip():
                pending = []  # a pragma applies to the next statement only
            continue
        parallel = any(p.startswith("parallel for") for p in pending)
        simd = any(p.startswith("simd") or p.startswith("parallel for simd") for p in pending)
        if collapsed_left:
            parallel, collapsed_left = True, collapsed_left - 1
        collapse = next((int(m.group(1)) for p in pending if (m := re.search(r"collapse\((\d+)\)", p))), 1)
        collapsed_left = max(collapsed_left, collapse - 1)
        pending = []
        iterator = loop.group(1)
        if loops and loops[-1][0] == f"{iterator}_block":  # the vector loop inside a blocked sum
            loops[-1] = [iterator, loops[-1][1] or parallel, loops[-1][2] or simd]
        else:
            loops.append([iterator, parallel, simd])
    return [tuple(loop) for loop in loops]  # type: ignore[misc]


def explained_loops(explanation) -> list[tuple[str, bool, bool]]:
    """(iterator, parallel, vectorised) of each loop the explanation says is in the C."""
    return [(loop.iterator, loop.parallel, loop.vectorised) for loop in explanation.loops if not loop.elided]


def disagreements(explanation, stages) -> list[str]:
    """Where ``explanation`` and the C of ``stages`` disagree (empty: they agree)."""
    in_c = c_loops(stages.kernel.source, stages.kernel.function_name)
    said = explained_loops(explanation)
    problems = []
    if len(in_c) != len(said):
        problems.append(f"{len(said)} loops explained, {len(in_c)} in the C")
    for (iterator, parallel, simd), (named, called_parallel, called_simd) in zip(in_c, said):
        if iterator != named:
            problems.append(f"the C's loop {iterator} is explained as {named}")
        if parallel != called_parallel:
            problems.append(f"{iterator}: the C says {'' if parallel else 'not '}parallel, explain the opposite")
        if simd != called_simd:
            problems.append(f"{iterator}: the C says {'' if simd else 'not '}vectorised, explain the opposite")
    # (the function's pragmas: the prelude's declared reductions are on no loop)
    body = stages.kernel.source[stages.kernel.source.index(f"int {stages.kernel.function_name}(") :]
    pragmas = sum(1 for line in body.splitlines() if line.strip().startswith("#pragma omp"))
    if pragmas and not any(parallel or simd for _, parallel, simd in said):
        problems.append(f"the C has {pragmas} OpenMP pragmas, explain none")
    return problems


def check(source: str, entry: str, sizes: dict, **options) -> None:
    kernel = polyc.define(source, **{**GENERIC, **options})[entry]
    stages = kernel.stages(sizes)
    assert stages.path == "generic", stages.path
    explanation = kernel.explain(sizes)
    found = disagreements(explanation, stages)
    assert not found, (
        "\n".join(found) + f"\n{source}\noptions {options}, sizes {sizes}\n{explanation}\n{stages.kernel.source}"
    )


CORPUS = [(name, dict(sizes)) for name, case in sorted(CASES.items()) for sizes in case.size_sets]

#: Kernels at sizes that reach what the corpus' small sizes do not: collapse, sums in blocks of
#: 256 (parallel or not), parallel reductions, loops isl elides, too little work for threads.
SHAPES = [
    ("def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }", {"M": 16, "K": 8, "N": 12}),
    ("def rowmax(float(N, D) X) -> (M) { M(n) max=! X(n, r_d) }", {"N": 1, "D": 64}),
    ("def rowsum(float(M, N) A) -> (B) { B(m) +=! A(m, r_n) }", {"M": 64, "N": 1000}),
    ("def total(float(N) A) -> (B) { B(z) +=! A(r) where z in 0:1 }", {"N": 100000}),
    ("def total(int32(N) A) -> (B) { B(z) max=! A(r) where z in 0:1 }", {"N": 100000}),
    (
        "def firstsum(float(N) A) -> (B) { B(j) = A(j) where j in 0:N\n B(z) += A(r) where z in 0:1, r in 0:N }",
        {"N": 10000},
    ),
    (
        "def softmax(float(N, D) X) -> (Y) { M(n) max=! X(n, r_d)\n S(n) +=! exp(X(n, r_d) - M(n))\n"
        " Y(n, d) = exp(X(n, d) - M(n)) / S(n) }",
        {"N": 8, "D": 16},
    ),
    ("def t(float(A, B, C) X) -> (Y) { Y(c, a, b) = X(a, b, c) }", {"A": 3, "B": 4, "C": 500}),
    ("def colsum(float(N, M) A) -> (B) { B(j) +=! A(r_i, j) }", {"N": 3000, "M": 64}),
]


@pytest.mark.parametrize(("name", "sizes"), CORPUS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CORPUS)])
def test_corpus_explanations_match_the_c(name, sizes):
    case = CASES[name]
    check(case.source, case.entry, sizes)


@pytest.mark.parametrize(
    ("source", "sizes"), SHAPES, ids=[s.split("(")[0][4:] + str(i) for i, (s, _) in enumerate(SHAPES)]
)
@pytest.mark.parametrize("options", [{}, {"threads": 4}, {"vectorize": False}, {"loop_tiles": ()}], ids=str)
def test_shapes_explanations_match_the_c(source, sizes, options):
    check(source, source.split("(")[0][4:], sizes, **options)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_defs_explanations_match_the_c(data):
    problem = data.draw(
        st.one_of(contraction_problems(), reduction_problems(), elementwise_problems(), multi_statement_problems()),
        label="problem",
    )
    options = {**data.draw(option_sets(), label="options"), **GENERIC}
    tiles = options.pop("tile_sizes")  # the fuzzer's deprecated spelling of loop_tiles
    if tiles is not None:
        options["loop_tiles"] = tiles
    # The fuzzer's small sizes (SHAPES has the long loops: larger sizes made isl's AST take 5x longer).
    sizes = data.draw(st.fixed_dictionaries({n: st.integers(1, MAX_SIZE) for n in problem.size_names()}), label="sizes")
    check(problem.source(), problem.name, sizes, **options)


def test_a_wrong_explanation_is_caught():
    """The negative control: explanations made wrong on purpose disagree with the C."""
    source = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
    kernel = polyc.define(source, **GENERIC, register_tiles=()).mm  # the plain nest (a collapsed loop)
    sizes = {"M": 16, "K": 8, "N": 12}
    stages, explanation = kernel.stages(sizes), kernel.explain(sizes)
    assert not disagreements(explanation, stages)
    # What explain said before issue 84: r_k (the loop around the vector loop) vectorised.
    loops = list(explanation.loops)
    vector = next(p for p, loop in enumerate(loops) if loop.vectorised)
    loops[vector] = replace(loops[vector], vectorised=False)
    loops[vector - 1] = replace(loops[vector - 1], vectorised=True)
    assert any("vectorised" in d for d in disagreements(replace(explanation, loops=loops), stages))
    # ... and collapsed loops "not parallel".
    loops = [
        replace(loop, parallel=False) if loop.parallel_how.startswith("collapsed") else loop
        for loop in explanation.loops
    ]
    assert any("parallel" in d for d in disagreements(replace(explanation, loops=loops), stages))
    # ... and a loop that is not in the C.
    ghost = replace(explanation.loops[0], iterator="c9")
    assert disagreements(replace(explanation, loops=[ghost, *explanation.loops]), stages)


def test_a_marked_loop_that_isl_splits_keeps_its_pragma_in_every_piece():
    """isl prints a marked member's loop as a block of loops when a statement runs in part of
    its range only (a random def of the fuzzer): before, the pragma went on a bare loop only, so
    both pieces lost their ``omp simd`` and explain called the loop one of one iteration."""
    source = """def fuzz(double(N, N, N, N) A, double(N, N, N) B) -> (O) {
        O(l, j, i, k) = (tanh(fmax(j, A(k, j, i, l))) - (exp((1.0 * A(k, j, i, l))) - j))
        T(i, k, j, l) = ((j - tanh((1.0 * B(l, k, j)))) + O(j, j, i, j))
        O(l, j, i, k) = tanh((T(i, k, j, l) + j))
    }"""
    sizes = {"N": 20}
    options = {**GENERIC, "fusion": "max", "unroll": 4}
    kernel = polyc.define(source, **options).fuzz
    lines = kernel.c_source(sizes).splitlines()
    vector_loops = [n for n, line in enumerate(lines) if line.lstrip().startswith("for (int64_t c7 ")]
    assert len(vector_loops) > 2 and all("omp simd" in lines[n - 1] for n in vector_loops)
    explanation = kernel.explain(sizes)
    assert "one iteration" not in str(explanation)
    check(source, "fuzz", sizes, fusion="max", unroll=4)
    # The pieces compute what the same def without vector loops computes.
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((20,) * 4), rng.standard_normal((20,) * 3)]
    scalar = polyc.define(source, **options, vectorize=False).fuzz
    # Elementwise: a few roundings of each of six operations apart at most, whatever the vector
    # math functions do.
    np.testing.assert_allclose(kernel(*inputs), scalar(*inputs), rtol=32 * np.finfo(np.float64).eps, atol=1e-12)
