"""polyc.einsum against numpy.einsum: hand-picked forms, random problems (hypothesis), errors."""

from __future__ import annotations

import string

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyc.errors import PolycError, UnsupportedError
from polyc.frontends.einsum import (
    Contraction,
    EinsumError,
    EinsumPathError,
    EinsumTypeError,
    einsum,
    lower_to_tc,
    lowered_kernel,
    parse_subscripts,
    plan_contraction,
)
from polyc.options import Options

#: The backend the tests run on: compiled C, the default of polyc.einsum.  The hand-picked forms
#: run with einsum's default options (their problems are small, so einsum builds one kernel per
#: contraction and dtype for all shapes); the random problems ask for such shared kernels too.
BACKEND = "c"


def run(subscripts, *operands, **kwargs):
    return einsum(subscripts, *operands, backend=BACKEND, **kwargs)


def assert_matches_numpy(subscripts: str, arrays: list[np.ndarray], got) -> None:
    """``got`` equals numpy's einsum: same dtype and shape; exact for integers and bool; for
    floats within the classic bound for a sum of products, on either side of the exact value:
    ``|error| <= (terms + operands) * eps * sum(|products|)``, doubled for numpy's own error."""
    expected = np.asarray(np.einsum(subscripts, *arrays))
    got = np.asarray(got)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if expected.dtype.kind != "f":
        np.testing.assert_array_equal(got, expected)
        return
    if expected.size == 0:
        return
    eps = np.finfo(expected.dtype).eps
    magnitude = np.einsum(subscripts, *(np.abs(a).astype(np.float64) for a in arrays))
    terms = np.einsum(subscripts, *(np.ones(a.shape) for a in arrays)).max()
    bound = 2 * (terms + len(arrays)) * eps * magnitude + np.finfo(expected.dtype).tiny
    error = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    assert np.all(error <= bound), f"{subscripts}: error {error.max()} above bound {np.max(bound)}"


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-3 if dtype.kind == "i" else 0, 4, size=shape).astype(dtype)
    return rng.uniform(-1.0, 1.0, size=shape).astype(dtype)


# ----------------------------------------------------------------------------- hand-picked forms
FORMS = [
    # (subscripts, operand shapes)
    ("ij,jk->ik", [(3, 4), (4, 5)]),  # matmul
    ("ij,jk", [(3, 4), (4, 5)]),  # matmul, implicit output
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),  # batched matmul
    ("ii", [(4, 4)]),  # trace, implicit
    ("ii->", [(4, 4)]),  # trace
    ("ii->i", [(4, 4)]),  # diagonal
    ("iji->j", [(3, 2, 3)]),  # diagonal summed, other label kept
    ("ij->ji", [(3, 4)]),  # transpose
    ("ji", [(3, 4)]),  # transpose, implicit (output "ij")
    ("ijk->kij", [(2, 3, 4)]),
    ("i,j->ij", [(3,), (4,)]),  # outer product
    ("i,i->", [(5,), (5,)]),  # dot
    ("i,i", [(5,), (5,)]),
    ("i,i->i", [(5,), (5,)]),  # elementwise
    ("ij->", [(3, 4)]),  # sum everything
    ("ij->j", [(3, 4)]),  # column sums
    ("ijk,jkl->il", [(2, 3, 4), (3, 4, 5)]),  # tensordot over two axes
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),  # chain of three
    ("ij,jk,kl,lm->mi", [(2, 3), (3, 2), (2, 3), (3, 2)]),  # four operands
    ("i,i,i->i", [(4,), (4,), (4,)]),
    ("ab,cd,ef->abcdef", [(2, 1), (1, 2), (2, 2)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),  # broadcasting batch
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # size-1 and missing batch dims
    ("...ij,...jk", [(2, 1, 3, 4), (5, 4, 2)]),  # implicit: '...' first
    ("i...,...j", [(2, 3, 4), (3, 4, 5)]),
    ("...,...", [(2, 3), (3,)]),
    ("...->...", [()]),
    ("i->...i", [(3,)]),  # '...' in the output only: no dims
    ("...i->...", [(2, 3)]),
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # labelled size-1 broadcasting
    ("ij,j->i", [(2, 3), (1,)]),
    ("ii,i->i", [(3, 3), (1,)]),
    ("ii,i->i", [(1, 1), (3,)]),
    ("i,->i", [(3,), ()]),  # scalar operand
    (",->", [(), ()]),
    ("->", [()]),
    ("Ba,aC", [(2, 3), (3, 4)]),  # upper case sorts first, as in ASCII
    ("Zz->zZ", [(2, 3)]),
    (" i j , j k -> i k ", [(2, 3), (3, 2)]),  # spaces
    ("i,i->i", [(0,), (1,)]),  # empty result
    ("ij,jk->ik", [(2, 0), (0, 3)]),  # empty sum is 0
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("subscripts,shapes", FORMS)
def test_form_matches_numpy(subscripts, shapes, dtype):
    rng = np.random.default_rng(len(subscripts))
    arrays = [random_array(rng, shape, dtype) for shape in shapes]
    assert_matches_numpy(subscripts, arrays, run(subscripts, *arrays))


@pytest.mark.parametrize(
    "subscripts,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("i->", [(6,)]),
        ("ii->i", [(3, 3)]),
        ("i,j->ij", [(2,), (3,)]),
        ("...i,...i->...", [(2, 3), (3,)]),
        ("ij,jk,kl->", [(2, 2), (2, 2), (2, 2)]),
    ],
)
def test_bool_is_logical_or_of_ands(subscripts, shapes):
    rng = np.random.default_rng(7)
    for _ in range(5):
        arrays = [random_array(rng, shape, np.bool_) for shape in shapes]
        assert_matches_numpy(subscripts, arrays, run(subscripts, *arrays))


@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.float64),
        (np.int8, np.float32),
        (np.bool_, np.int16),
        (np.uint8, np.int8),
        (np.float16, np.float16),
    ],
)
def test_mixed_dtypes_use_numpy_result_type(dtypes):
    rng = np.random.default_rng(3)
    arrays = [random_array(rng, (3, 4), dtypes[0]), random_array(rng, (4, 2), dtypes[1])]
    result = run("ij,jk->ik", *arrays)
    assert result.dtype == np.result_type(*arrays)
    assert_matches_numpy("ij,jk->ik", arrays, result)


def test_python_scalars_and_lists_are_operands():
    assert_matches_numpy(
        "i,->i", [np.arange(3, dtype=np.float32), np.asarray(2.5)], run("i,->i", np.arange(3, dtype=np.float32), 2.5)
    )
    assert run("i,i", [1, 2], [3, 4]) == 11


def test_zero_dimensional_result_is_a_numpy_scalar():
    result = run("ii", np.eye(3))
    assert isinstance(result, np.float64) and result == 3.0


def test_dtype_argument_and_casting():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    result = run("ij->i", a, dtype=np.float64)
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, [3.0, 12.0])
    with pytest.raises(EinsumError, match="according to the rule 'safe'"):
        run("ij->i", np.ones((2, 3)), dtype=np.float32)
    assert run("ij->i", np.ones((2, 3)), dtype=np.float32, casting="unsafe").dtype == np.float32


def test_operands_are_not_modified():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2)
    a_before, b_before = a.copy(), b.copy()
    run("ij,jk->ik", a, b)
    run("ij,ij->ij", a, b.T, dtype=np.float64)
    np.testing.assert_array_equal(a, a_before)
    np.testing.assert_array_equal(b, b_before)


def test_non_contiguous_and_broadcast_views():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[::2, 1::2]
    b = np.broadcast_to(np.arange(3.0), (5, 3))
    assert_matches_numpy("ij,kj->ik", [a, b], run("ij,kj->ik", a, b))


def test_large_broadcast_operands_are_taken_as_numpy_takes_them(monkeypatch):
    """A kernel call refuses a broadcast input whose copy exceeds BROADCAST_COPY_LIMIT; einsum,
    a drop-in for numpy's, copies it (here with the limit lowered, to keep the arrays small)."""
    from polyc.runtime import arguments

    monkeypatch.setattr(arguments, "BROADCAST_COPY_LIMIT", 64)
    rng = np.random.default_rng(4)
    a = np.broadcast_to(rng.standard_normal((5, 1)), (5, 40))
    b = rng.standard_normal((40, 3))
    assert_matches_numpy("ij,jk->ik", [a, b], run("ij,jk->ik", a, b))


def test_out_is_written_and_returned():
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    out = np.full((2, 4), -1.0, np.float32)
    assert run("ij,jk->ik", a, b, out=out) is out
    np.testing.assert_array_equal(out, 3.0)
    wide = np.zeros((2, 4), np.float64)  # float32 -> float64 is a safe cast, as in numpy
    assert run("ij,jk->ik", a, b, out=wide) is wide
    np.testing.assert_array_equal(wide, 3.0)
    scalar = np.zeros((), np.float32)
    assert run("ij,ij->", a, a, out=scalar) is scalar and scalar == 6.0
    strided = np.zeros((4, 4), np.float32)[:, ::2]
    run("ij,jk->ki", a, b, out=strided)
    np.testing.assert_array_equal(strided, 3.0)


def test_out_errors():
    a = np.ones((2, 3))
    with pytest.raises(EinsumError, match="shape"):
        run("ij->i", a, out=np.zeros(3))
    with pytest.raises(EinsumError, match="according to the rule 'safe'"):
        run("ij->i", a, out=np.zeros(2, np.float32))
    with pytest.raises(EinsumTypeError, match="numpy array"):  # a TypeError, as in numpy
        run("ij->i", a, out=[0.0, 0.0])
    read_only = np.zeros(2)
    read_only.flags.writeable = False
    with pytest.raises(EinsumError, match="read-only"):
        run("ij->i", a, out=read_only)


def test_order_and_optimize():
    a = np.ones((2, 3))
    for order in ("F", "f"):
        assert run("ij->ij", a, order=order).flags["F_CONTIGUOUS"]
    for order in ("C", "c", "A", "a", "K", "k"):  # a is C-contiguous
        assert run("ij,j->ij", a, a[0], order=order).flags["C_CONTIGUOUS"]
    assert run("ij,j->ij", np.asfortranarray(a), a[0], order="A").flags["F_CONTIGUOUS"]
    assert run("ij,j->ij", np.asfortranarray(a), a[0], order="K").flags["F_CONTIGUOUS"]  # numpy's layout
    for optimize in (False, True, "greedy", "optimal", ["einsum_path", (0, 1)]):  # accepted, not followed
        np.testing.assert_array_equal(run("ij,jk->ik", a, a.T, optimize=optimize), a @ a.T)
    with pytest.raises(EinsumError, match="order must be one of"):
        run("ij->ij", a, order="W")


def test_explicit_path_is_checked_as_numpy_checks_it():
    a = np.ones((2, 2))
    with pytest.raises(EinsumPathError, match="1 more operands has to be contracted") as info:
        run("ij,jk,kl->il", a, a, a, optimize=["einsum_path", (0, 1)])
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(EinsumPathError, match="does not name distinct operands"):
        run("ij,jk->ik", a, a, optimize=["einsum_path", (0, 2)])


def test_argument_types_are_type_errors():
    a = np.ones(2)
    for call in (
        lambda: run("i", a, dtype="bad_data_type"),
        lambda: einsum(0, 0, backend=BACKEND),
        lambda: run("i", a, out="test"),
        lambda: run("i", a, bad_arg=0),
    ):
        with pytest.raises(EinsumTypeError) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, PolycError)
    with pytest.raises(EinsumError, match="casting must be one of"):
        run("i", a, casting="blah")


def test_pure_transpositions_and_diagonals_are_views():
    a = np.arange(24.0).reshape(2, 3, 4)
    for subscripts, expected in [("ijk->kji", a.transpose(2, 1, 0)), ("...", a), ("i...->...i", np.moveaxis(a, 0, -1))]:
        view = run(subscripts, a)
        assert view.base is a.base and view.flags.writeable
        np.testing.assert_array_equal(view, expected)
    square = np.arange(27).reshape(3, 3, 3)[:, ::-1, :]  # negative strides too
    view = run("jii->ij", square)
    assert view.base is square.base
    np.testing.assert_array_equal(view, [square[:, i, i] for i in range(3)])
    view[0, 0] = -1
    assert square[0, 0, 0] == -1  # it is a view
    read_only = np.arange(4.0).reshape(2, 2)
    read_only.flags.writeable = False
    assert not run("ji", read_only).flags.writeable
    assert not np.shares_memory(run("ji", a[0], dtype=np.float32, casting="same_kind"), a)  # another dtype
    copy = run("ji", a[0], order="C")  # an order the view does not have: a copy
    assert copy.flags["C_CONTIGUOUS"] and not np.shares_memory(copy, a)


def test_float16_accumulates_in_float32_as_numpy_does():
    a = np.arange(48, dtype=np.float16).reshape(3, 16)
    b = np.arange(16, dtype=np.float16)
    result = run("ij,j->i", a, b)
    assert result.dtype == np.float16
    np.testing.assert_array_equal(result, np.einsum("ij,j->i", a, b))


def test_sublist_form():
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(einsum(a, [0, 1], b, [1, 2], [0, 2], backend=BACKEND), a @ b)
    np.testing.assert_array_equal(einsum(a, [27, 0], backend=BACKEND), np.einsum(a, [27, 0]))
    c = np.arange(30.0).reshape(5, 2, 3)
    np.testing.assert_array_equal(
        einsum(c, [Ellipsis, 0, 1], [Ellipsis, 0], backend=BACKEND), np.einsum(c, [Ellipsis, 0, 1], [Ellipsis, 0])
    )
    with pytest.raises(EinsumError, match="valid range"):
        einsum(a, [0, 52], backend=BACKEND)
    with pytest.raises(EinsumError, match="at least one operand"):
        einsum(a, backend=BACKEND)
    with pytest.raises(EinsumTypeError, match="sequences of integers"):
        einsum(a, 3, backend=BACKEND)
    for sublist in (np.array([1, 0]), range(1, -1, -1), (1, 0)):  # any integer sequence
        np.testing.assert_array_equal(einsum(a, sublist, [0, 1], backend=BACKEND), a.T)


# ----------------------------------------------------------------------------- lowering and caching
def _contraction(subscripts, shapes, dtype=np.float32) -> Contraction:
    arrays = [np.zeros(shape, dtype) for shape in shapes]
    return plan_contraction(parse_subscripts(subscripts), arrays, np.dtype(dtype))[0]


def test_lowering_text():
    assert lower_to_tc(_contraction("ij,jk->ik", [(2, 3), (3, 4)])) == (
        "def einsum(float32(S0, S1) I0, float32(S1, S2) I1) -> (Out) {\n    Out(a, c) +=! I0(a, r_b) * I1(r_b, c)\n}\n"
    )
    assert "Out +=! I0(r_a, r_a)" in lower_to_tc(_contraction("ii", [(3, 3)]))
    assert "Out(a) = I0(a, a)" in lower_to_tc(_contraction("ii->i", [(3, 3)]))
    assert "float64 I1" in lower_to_tc(_contraction("i,->i", [(3,), ()], np.float64))
    assert "Out(a, c) max=! I0(a, r_b) && I1(r_b, c)" in lower_to_tc(_contraction("ij,jk", [(2, 2)] * 2, np.bool_))


def test_broadcast_dimensions_are_dropped_not_copied():
    contraction = _contraction("ij,ij->ij", [(1, 3), (2, 3)])  # 'i' dropped from operand 0: j=0, i=1
    assert contraction.inputs == ((0,), (1, 0)) and contraction.output == (1, 0)
    contraction = _contraction("...i,...i->...i", [(1, 3), (4, 3)])
    assert contraction.inputs == ((0,), (1, 0)) and contraction.output == (1, 0)


def test_labels_are_renamed_so_equivalent_problems_share_a_kernel():
    assert _contraction("ij,jk->ik", [(2, 3), (3, 4)]) == _contraction("xy,yz->xz", [(5, 6), (6, 7)])
    assert _contraction("ij,jk->ik", [(2, 3), (3, 4)]) == _contraction("AB,BC", [(5, 6), (6, 7)])
    a, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    run("pq,qr->pr", a, b)
    before = lowered_kernel.cache_info().hits
    run("mn,nk->mk", a, b)
    run("mn,nk->mk", np.ones((5, 6), np.float32), np.ones((6, 1), np.float32))  # implicit 'mn,nk' is '->km'
    assert lowered_kernel.cache_info().hits == before + 2
    options = Options.from_kwargs(backend=BACKEND)
    assert lowered_kernel(_contraction("ij,jk", [(2, 3), (3, 4)]), options) is lowered_kernel(
        _contraction("ab,bc", [(2, 3), (3, 4)]), options
    )


# ----------------------------------------------------------------------------- errors
ERRORS = [
    ("ij,jk->ik", [(2, 3)], "fewer operands"),
    ("ij->ij", [(2, 3), (3,)], "more operands"),
    ("ijk->i", [(2, 3)], "too many subscripts for operand 0"),
    ("i->i", [(2, 3)], "more dimensions .* no '...' ellipsis"),
    ("...i->i", [(2, 3)], "output has more dimensions"),
    ("ij,jk->ik", [(2, 3), (4, 2)], "'j' has size 3 in operand 0 but 4 in operand 1"),
    ("ii->i", [(2, 3)], "collapsing index 'i' don't match \\(2 != 3\\)"),
    ("ii->i", [(1, 3)], "collapsing index 'i'"),
    ("...,...", [(2, 3), (3, 2)], "dimension 0 of '...' has size 2 in operand 0 but 3"),
    ("ij->k", [(2, 2)], "output subscript 'k' which never appeared in an input"),
    ("ij->ii", [(2, 2)], "output subscript 'i' multiple times"),
    ("i1->i", [(2, 2)], "invalid subscript '1'"),
    ("i$", [(2, 2)], "invalid subscript '\\$'"),
    ("i.j->i", [(2, 2)], "'.' that is not part of an ellipsis"),
    ("..i", [(2,)], "'.' that is not part of an ellipsis"),
    ("...i...", [(2,)], "more than one '...'"),
    ("i->i->i", [(2,)], "more than one '->'"),
    ("i,j->i,j", [(2,), (2,)], "',' in the output"),
]


@pytest.mark.parametrize("subscripts,shapes,message", ERRORS)
def test_errors(subscripts, shapes, message):
    arrays = [np.ones(shape) for shape in shapes]
    with pytest.raises(EinsumError, match=message) as info:
        run(subscripts, *arrays)
    assert isinstance(info.value, PolycError) and isinstance(info.value, ValueError)
    with pytest.raises(ValueError):  # numpy rejects the same calls
        np.einsum(subscripts, *arrays)


def test_no_operands():
    with pytest.raises(EinsumError, match="at least one operand"):
        run("i->i")


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, object, np.longdouble])
def test_unsupported_dtypes(dtype):
    if np.dtype(dtype) == np.float64:  # platforms where long double is double
        pytest.skip("long double is double here")
    with pytest.raises(UnsupportedError):
        run("i,i", np.ones(2, dtype), np.ones(2, dtype))


def test_unknown_option_is_rejected():
    with pytest.raises(PolycError, match="unknown option"):
        einsum("i->", np.ones(2), backend=BACKEND, bogus=1)


# ----------------------------------------------------------------------------- random problems
HYPOTHESIS_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]


@st.composite
def einsum_problems(draw):
    """A random valid einsum call: subscripts and operands.  Labels are random letters of both
    cases with sizes 1-5; operands have 0-4 labelled dimensions (labels may repeat: diagonals),
    some dimensions are 1 where the label is larger (numpy's broadcasting), some operands carry
    '...' over a broadcast shape; the output is implicit or a random permutation of a subset."""
    pool = draw(st.lists(st.sampled_from(string.ascii_letters), min_size=1, max_size=6, unique=True))
    sizes = {label: draw(st.integers(1, 5)) for label in pool}
    with_ellipsis = draw(st.integers(0, 2)) == 0
    ellipsis_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2))) if with_ellipsis else ()
    n_operands = draw(st.integers(1, 4))
    mixed = draw(st.booleans())
    base_dtype = draw(st.sampled_from(HYPOTHESIS_DTYPES))

    terms, shapes, dtypes = [], [], []
    ellipsis_rank = 0
    for _ in range(n_operands):
        labels = draw(st.lists(st.sampled_from(pool), max_size=4))
        broadcast = draw(st.sets(st.sampled_from(pool))) if draw(st.integers(0, 3)) == 0 else set()
        term = "".join(labels)
        shape = [1 if label in broadcast else sizes[label] for label in labels]
        if with_ellipsis and draw(st.booleans()):
            rank = draw(st.integers(0, len(ellipsis_shape)))
            ellipsis_rank = max(ellipsis_rank, rank)
            dims = [1 if draw(st.integers(0, 3)) == 0 else n for n in ellipsis_shape[len(ellipsis_shape) - rank :]]
            at = draw(st.integers(0, len(labels)))
            term = term[:at] + "..." + term[at:]
            shape = shape[:at] + dims + shape[at:]
        terms.append(term)
        shapes.append(tuple(shape))
        dtypes.append(draw(st.sampled_from(HYPOTHESIS_DTYPES)) if mixed else base_dtype)

    subscripts = ",".join(terms)
    if draw(st.booleans()):
        used = sorted({label for term in terms for label in term if label != "."})
        chosen = draw(st.lists(st.sampled_from(used), unique=True) if used else st.just([]))
        output = "".join(draw(st.permutations(chosen)))
        if ellipsis_rank > 0 or draw(st.integers(0, 3)) == 0:
            at = draw(st.integers(0, len(output)))
            output = output[:at] + "..." + output[at:]
        subscripts += "->" + output
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = [random_array(rng, shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    return subscripts, arrays


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(einsum_problems())
def test_random_problems_match_numpy(problem):
    """Random problems through compiled C; parametric kernels, so one build serves every shape
    of a contraction and dtype."""
    subscripts, arrays = problem
    assert_matches_numpy(subscripts, arrays, run(subscripts, *arrays, specialize=False))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(einsum_problems())
def test_random_problems_on_the_interpreter_match_numpy(problem):
    """The reference interpreter on the same problems (cheap: nothing is compiled)."""
    subscripts, arrays = problem
    assert_matches_numpy(subscripts, arrays, einsum(subscripts, *arrays, backend="interpreter"))


def test_three_operands_are_contracted_pairwise():
    source = lower_to_tc(_contraction("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]))
    assert source.count("+=!") == 2 and "T0(" in source


def test_plans_are_remembered_per_shapes():
    """A repeated call skips the planning; other shapes, and bad shapes, are planned afresh."""
    from polyc.frontends.einsum import _plan_for_shapes

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 1))
    run("ij,jk->ik", a, b)
    hits = _plan_for_shapes.cache_info().hits
    assert_matches_numpy("ij,jk->ik", [a, b], run("ij,jk->ik", a, b))
    assert _plan_for_shapes.cache_info().hits == hits + 1
    wide = rng.standard_normal((4, 5))
    assert_matches_numpy("ij,jk->ik", [a, wide], run("ij,jk->ik", a, wide))
    for _ in range(2):  # an error is not remembered as a plan
        with pytest.raises(EinsumError, match="could not be broadcast"):
            run("ij,ij->ij", a, wide)


@pytest.mark.parametrize("subscripts,shape", [("i->", (1_000_003,)), ("ij->i", (3, 200_001)), ("i,i->", (300_007,))])
def test_long_float_sums_are_accurate(subscripts, shape):
    """Compiled sums add partial sums of blocks (codegen.c.SUM_BLOCK), so float32 sums of up to
    a million terms stay within a few ulp of the exact value, as numpy's pairwise sums do
    (measured: 1.0, 2.2 and 3.4 ulp; numpy 1.8, 8.3 and 1.2; running sums, without the blocks:
    100, 2.2 and 38)."""
    rng = np.random.default_rng(11)
    arrays = [rng.uniform(0.5, 1.0, size=shape).astype(np.float32) for _ in subscripts.split("->")[0].split(",")]
    exact = np.einsum(subscripts, *(a.astype(np.float64) for a in arrays))
    got = run(subscripts, *arrays)
    relative_error = np.max(np.abs(got - exact) / exact)
    assert relative_error < 16 * np.finfo(np.float32).eps, relative_error
