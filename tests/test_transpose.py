"""The transpose kernel path (polyc/paths/transpose.py, polyc/codegen/transpose.py): which defs
it takes, and its results against numpy for every element size, rank and permutation form, on
every instruction-set branch (native, AVX2, portable), one thread and two, specialised and
parametric, under AddressSanitizer and UBSan."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from builds import builds
from sanitizers import ISA_FLAG_SETS, assert_clean, checked_lines, run_sanitized

import polyc
from polyc.codegen.transpose import merged_dimensions
from polyc.lang.sema import check_source
from polyc.schedule.transposition import recognise_transposition

TESTS_DIR = Path(__file__).resolve().parent
KERNEL = "polyc transpose kernel"
LETTERS = "abcde"


def transposition_source(order: tuple[int, ...], dtype: str = "float", name: str = "t") -> str:
    """``O`` = ``X`` with output dimension ``e`` holding input dimension ``order[e]``."""
    rank = len(order)
    indices = LETTERS[:rank]
    sizes = ", ".join(letter.upper() for letter in indices)
    written = ", ".join(indices[d] for d in order)
    return f"def {name}({dtype}({sizes}) X) -> (O) {{ O({written}) = X({', '.join(indices)}) }}"


def define(source: str, **options):
    module = polyc.define(source, **options)
    return getattr(module, module.names[0])


def random_array(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def check(order, shape, dtype="float32", tc_type="float", rng=None, **options):
    rng = rng or np.random.default_rng(0)
    kernel = define(transposition_source(order, tc_type), **options)
    x = random_array(rng, shape, dtype)
    sizes = dict(zip(LETTERS.upper(), shape, strict=False))
    assert kernel.stages(sizes).path == "transpose"
    np.testing.assert_array_equal(kernel(x), np.ascontiguousarray(x.transpose(order)))
    return kernel


# ----------------------------------------------------------------------------- which defs it takes
@pytest.mark.parametrize(
    "source, permutation",
    [
        ("def t(float(M, N) A) -> (B) { B(n, m) = A(m, n) }", (1, 0)),
        ("def t(float(N, C, H, W) A) -> (B) { B(n, h, w, c) = A(n, c, h, w) }", (0, 2, 3, 1)),
        ("def t(float(N, H, W, C) A) -> (B) { B(n, c, h, w) = A(n, h, w, c) }", (0, 3, 1, 2)),
        ("def t(int8(B, S, H, D) A) -> (O) { O(b, h, d, s) = A(b, s, h, d) }", (0, 2, 3, 1)),
    ],
)
def test_transpositions_are_recognised(source, permutation):
    (definition,) = check_source(source)
    found = recognise_transposition(definition)
    assert found is not None and found.permutation == permutation
    assert (found.source, found.target) == (definition.inputs[0], definition.outputs[0])


@pytest.mark.parametrize(
    "source",
    [
        # the innermost dimension stays: whole rows are copied, at memory speed as a loop nest
        "def t(float(B, S, H, D) A) -> (O) { O(b, h, s, d) = A(b, s, h, d) }",
        "def t(float(M, N) A) -> (B) { B(m, n) = A(m, n) }",
        # not a plain copy
        "def t(float(M, N) A) -> (B) { B(n, m) = 2 * A(m, n) }",
        "def t(float(M, N) A) -> (B) { B(n, m) = A(m, n) + 1 }",
        # a conversion, a diagonal, part of the input, a reduction, a second statement
        "def t(float(M, N) A) -> (B) { B(n, m) = int32(A(m, n)) }",
        "def t(float(N, N) A) -> (B) { B(n) = A(n, n) }",
        "def t(float(M, N) A) -> (B) { B(n, m) = A(m, n) where m in 0:M - 1 }",
        "def t(float(M, N) A) -> (B) { B(n) +=! A(r_m, n) }",
        "def t(float(M, N) A) -> (B, C) { B(n, m) = A(m, n)\n C(m, n) = A(m, n) }",
        # a shifted read
        "def t(float(M, N) A) -> (B) { B(n, m) = A(m + 1, n) where m in 0:M - 1 }",
    ],
)
def test_defs_outside_the_form_are_not_transpositions(source):
    try:
        definitions = check_source(source)
    except polyc.PolycError:
        return  # not even a def: certainly not taken
    assert recognise_transposition(definitions[0]) is None


def test_dimensions_that_stay_neighbours_are_merged():
    assert merged_dimensions((1, 0)) == (((0,), (1,)), (1, 0))
    assert merged_dimensions((0, 2, 3, 1)) == (((0,), (1,), (2, 3)), (0, 2, 1))
    assert merged_dimensions((0, 3, 1, 2)) == (((0,), (1, 2), (3,)), (0, 2, 1))
    assert merged_dimensions((2, 3, 0, 1)) == (((0, 1), (2, 3)), (1, 0))
    assert merged_dimensions((2, 0, 4, 3, 1)) == (((0,), (1,), (2,), (3,), (4,)), (2, 0, 4, 3, 1))


def test_the_option_off_compiles_a_loop_nest_with_the_same_result():
    source = transposition_source((1, 0))
    x = np.random.default_rng(1).standard_normal((70, 45)).astype(np.float32)
    on, off = define(source), define(source, transpose_kernels=False)
    sizes = {"A": 70, "B": 45}
    assert on.stages(sizes).path == "transpose" and KERNEL in on.c_source(sizes)
    assert off.stages(sizes).path == "generic" and KERNEL not in off.c_source(sizes)
    np.testing.assert_array_equal(on(x), off(x))
    explanation = on.explain(sizes)
    assert explanation.path == "transpose"
    assert "transpose_kernels=False" in str(explanation)


def test_other_back_ends_do_not_take_it():
    kernel = define(transposition_source((1, 0)), backend="interpreter")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(kernel(x), x.T)


# ----------------------------------------------------------------------------- results
@pytest.mark.parametrize(
    "dtype, tc_type",
    [
        ("float32", "float"),
        ("float64", "double"),
        ("float16", "float16"),
        ("int8", "int8"),
        ("uint16", "uint16"),
        ("int32", "int32"),
        ("int64", "int64"),
        ("bool", "bool"),
    ],
)
@builds("native", "avx2", "portable")
def test_every_element_size_on_every_branch(dtype, tc_type, cflags):
    # sizes around the 64-element tiles and the 8- and 4-element register blocks
    options = {} if cflags is None else {"cflags": tuple(cflags.split())}
    for shape in [(67, 130), (8, 8), (1, 9), (129, 3)]:
        check((1, 0), shape, dtype, tc_type, **options)
    check((0, 2, 3, 1), (2, 19, 5, 7), dtype, tc_type, **options)


@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_every_permutation_that_moves_the_innermost_dimension(rank):
    rng = np.random.default_rng(rank)
    shape = (9, 17, 5, 12, 3)[:rank]
    orders = [p for p in itertools.permutations(range(rank)) if p[-1] != rank - 1]
    if rank == 5:
        orders = orders[::7]  # a sample: 96 permutations move the innermost of five
    for order in orders:
        check(order, shape, rng=rng)


@pytest.mark.parametrize(
    "options",
    [
        {"parallel": False},
        {"vectorize": False},
        {"threads": 1},
        {"specialize": False},
        {"specialize": False, "vectorize": False},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_options(options):
    # large enough for the threads (and several tiles a plane), with partial tiles at the edges
    check((0, 2, 3, 1), (2, 70, 23, 31), **options)
    check((1, 0), (300, 517), **options)


def test_one_parametric_kernel_serves_every_size():
    kernel = define(transposition_source((0, 3, 1, 2)), specialize=False)
    rng = np.random.default_rng(5)
    for shape in [(1, 7, 7, 64), (3, 2, 9, 5), (1, 1, 1, 1), (2, 56, 56, 24)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(kernel(x), np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def test_empty_tensors():
    kernel = define(transposition_source((1, 0)), specialize=False)
    for shape in [(0, 5), (5, 0)]:
        x = np.zeros(shape, np.float32)
        assert kernel(x).shape == shape[::-1]


def test_sizes_given_as_an_array_are_a_clear_error():
    kernel = define(transposition_source((1, 0)))
    with pytest.raises(polyc.PolycError, match="sizes must be a mapping"):
        kernel.c_source(np.zeros((3, 4), np.float32))


def test_into_a_given_output():
    kernel = define(transposition_source((1, 0)))
    x = np.random.default_rng(2).standard_normal((40, 33)).astype(np.float32)
    out = np.full((33, 40), np.nan, np.float32)
    assert kernel(x, outputs=(out,)) is out
    np.testing.assert_array_equal(out, x.T)


# ----------------------------------------------------------------------------- sanitizers
_SANITIZED_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_transpose import KERNEL, define, random_array, transposition_source
rng = np.random.default_rng(0)
for flags in sys.argv[2:]:
    # partial tiles and register blocks on every side, both element sizes with a register
    # transpose and one without, a parametric kernel, two threads
    for order, shape, dtype, tc_type, specialize in [
        ((1, 0), (67, 130), "float32", "float", True),
        ((0, 2, 3, 1), (2, 19, 5, 7), "float64", "double", True),
        ((0, 3, 1, 2), (1, 9, 11, 70), "int16", "int16", False),
        ((2, 0, 1), (66, 3, 129), "float32", "float", False),
    ]:
        kernel = define(transposition_source(order, tc_type), cflags=tuple(flags.split()), specialize=specialize)
        x = random_array(rng, shape, dtype)
        assert KERNEL in kernel.c_source(dict(zip("ABCDE", shape)))
        got = kernel(x)
        if not np.array_equal(got, np.ascontiguousarray(x.transpose(order))):
            raise SystemExit(f"wrong result: {order} {shape} {dtype} {flags}")
    print("checked", flags.split()[-1], flush=True)
"""


def test_sanitized(tmp_path):
    result = run_sanitized(_SANITIZED_SCRIPT, str(TESTS_DIR), *ISA_FLAG_SETS, cache_dir=tmp_path, timeout=900)
    assert_clean(result)
    assert result.stdout.split() == checked_lines(ISA_FLAG_SETS), result.stdout
