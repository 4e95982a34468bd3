"""The reference interpreter against hand-written numpy, on the whole kernel corpus, plus the
calling convention every back end shares: argument checking, caller-supplied outputs, and
bounds errors for data-dependent accesses."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from kernels import CASES, KERNELS, KernelCase, check_kernel, uniform

import polyc


@functools.cache
def interpreted(source: str) -> polyc.Module:
    return polyc.define(source, backend="interpreter")


def kernel_of(case: KernelCase):
    return interpreted(case.source)[case.entry]


def define(source: str):
    """The only def of ``source``, run by the interpreter."""
    module = polyc.define(source, backend="interpreter")
    (name,) = module.names
    return module[name]


# ----------------------------------------------------------------------------- the corpus
CORPUS = [
    pytest.param(case, sizes, id=f"{case.name}-{'-'.join(f'{k}{v}' for k, v in sizes.items())}")
    for case in KERNELS
    for sizes in case.size_sets
]


def test_corpus_is_large_enough():
    assert len(KERNELS) >= 45
    assert sum(len(case.size_sets) >= 2 for case in KERNELS) == len(KERNELS)


@pytest.mark.parametrize("case, sizes", CORPUS)
def test_kernel_matches_numpy(case, sizes):
    check_kernel(case, kernel_of(case), sizes, seed=0)


@pytest.mark.parametrize("case", KERNELS, ids=str)
def test_kernel_matches_numpy_on_other_data(case):
    check_kernel(case, kernel_of(case), case.size_sets[0], seed=1234)


def test_reference_detects_a_wrong_result():
    """The comparison is not vacuous: a result off by a few ulps per element of K fails."""
    case = CASES["matmul"]
    sizes = case.size_sets[0]
    with pytest.raises(AssertionError, match="tolerance"):
        check_kernel(case, lambda A, B: (A @ B) * np.float32(1 + 64 * np.finfo(np.float32).eps), sizes)


# ----------------------------------------------------------------------------- inputs and outputs
def test_inputs_are_never_modified():
    fc = kernel_of(CASES["fcrelu"])
    rng = np.random.default_rng(0)
    I, W, B = uniform(rng, (3, 4)), uniform(rng, (5, 4)), uniform(rng, (5,))
    copies = [I.copy(), W.copy(), B.copy()]
    fc(I, W, B)
    for before, after in zip(copies, (I, W, B)):
        np.testing.assert_array_equal(before, after)


def test_fresh_outputs_are_new_zeroed_arrays():
    stencil = kernel_of(CASES["stencil3"])
    A = np.arange(6, dtype=np.float32)
    first, second = stencil(A), stencil(A)
    assert first is not second
    assert first[0] == 0 and second[0] == 0  # never written: the fresh output's zero remains


def test_outputs_accumulate_without_init():
    matmul_acc = define("""
        def matmul_acc(float(M, K) A, float(K, N) B) -> (C) {
            C(m, n) += A(m, r_k) * B(r_k, n)
        }""")
    rng = np.random.default_rng(1)
    A, B = uniform(rng, (3, 4)), uniform(rng, (4, 2))
    C = np.ones((3, 2), np.float32)
    result = matmul_acc(A, B, outputs=[C])
    assert result is C
    matmul_acc(A, B, outputs=[C])
    np.testing.assert_allclose(C, 1 + 2 * (A.astype(np.float64) @ B), rtol=1e-6)


def test_init_ignores_what_the_output_held():
    matmul = kernel_of(CASES["matmul"])
    A, B = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    C = np.full((2, 2), 100, np.float32)
    matmul(A, B, outputs=[C])
    np.testing.assert_array_equal(C, np.full((2, 2), 3, np.float32))


def test_min_max_product_accumulate_into_outputs():
    kernel = define("""
        def acc(float(N, M) A) -> (Lo, Hi, P) {
            Lo(i) min= A(i, r_j)
            Hi(i) max= A(i, r_j)
            P(i) *= A(i, r_j)
        }""")
    A = np.array([[2, 3], [-1, 5]], np.float32)
    Lo, Hi, P = np.array([0, 0], np.float32), np.array([4, 4], np.float32), np.array([2, 2], np.float32)
    kernel(A, outputs=[Lo, Hi, P])
    np.testing.assert_array_equal(Lo, [0, -1])
    np.testing.assert_array_equal(Hi, [4, 5])
    np.testing.assert_array_equal(P, [12, -10])


def test_several_outputs_are_returned_in_declared_order():
    kernel = kernel_of(CASES["int_divmod"])
    A, B = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)
    Q, R, Q3, R3 = kernel(A, B)
    np.testing.assert_array_equal(Q, [3, -3, -3, 3])
    np.testing.assert_array_equal(R, [1, -1, 1, -1])
    np.testing.assert_array_equal(Q3, [-2, 2, -2, 2])
    np.testing.assert_array_equal(R3, [1, -1, 1, -1])


def test_integer_division_by_zero_gives_zero():
    kernel = define("def f(int32(N) A, int32(N) B) -> (Q, R) { Q(i) = A(i) / B(i)\n R(i) = A(i) % B(i) }")
    Q, R = kernel(np.array([5, -5], np.int32), np.array([0, 0], np.int32))
    np.testing.assert_array_equal(Q, [0, 0])
    np.testing.assert_array_equal(R, [0, 0])


@pytest.mark.parametrize("op, identity", [("+=!", 0.0), ("*=!", 1.0), ("min=!", np.inf), ("max=!", -np.inf)])
def test_empty_reduction_leaves_the_identity(op, identity):
    kernel = define(f"def f(float(N, K) A) -> (O) {{ O(i) {op} A(i, r_k) }}")
    np.testing.assert_array_equal(kernel(np.zeros((3, 0), np.float32)), np.full(3, identity, np.float32))


def test_scalar_input_accepts_python_numbers():
    axpy = kernel_of(CASES["axpy"])
    X, Y = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    np.testing.assert_array_equal(axpy(2, X, Y), [1, 3, 5])
    np.testing.assert_array_equal(axpy(0.5, X, Y), [1, 1.5, 2])


def test_zero_output_extent_is_an_empty_result():
    conv = kernel_of(CASES["conv2d"])
    I, W = np.zeros((1, 1, 2, 4), np.float32), np.zeros((1, 1, 3, 3), np.float32)
    assert conv(I, W).shape == (1, 1, 0, 2)


# ----------------------------------------------------------------------------- signature errors
MATMUL = CASES["matmul"]


@pytest.mark.parametrize(
    "args, message",
    [
        ((np.ones((2, 3), np.float32),), "takes 2 input"),
        ((np.ones((2, 3), np.float32),) * 3, "takes 2 input"),
        ((np.ones((2, 3), np.float64), np.ones((3, 2), np.float32)), "dtype float32"),
        ((np.ones((2, 3), np.int32), np.ones((3, 2), np.float32)), "dtype float32"),
        ((np.ones((2, 3, 1), np.float32), np.ones((3, 2), np.float32)), "2 dimension"),
        ((np.ones(3, np.float32), np.ones((3, 2), np.float32)), "2 dimension"),
        ((np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)), "shape"),
        (([[1.0, 2.0]], np.ones((2, 2), np.float32)), "numpy array"),
    ],
    ids=["too-few", "too-many", "float64", "int32", "rank-3", "rank-1", "K-mismatch", "list"],
)
def test_signature_errors(args, message):
    with pytest.raises(polyc.SignatureError, match=message):
        kernel_of(MATMUL)(*args)


def test_size_used_twice_needs_equal_extents():
    symmetrize = kernel_of(CASES["symmetrize_trace"])
    with pytest.raises(polyc.SignatureError, match="shape"):
        symmetrize(np.ones((3, 4), np.float32))


def test_constant_size_must_match():
    blur = kernel_of(CASES["blur3x3"])
    with pytest.raises(polyc.SignatureError, match="shape"):
        blur(np.ones((5, 5), np.float32), np.ones((3, 2), np.float32))


def test_too_small_input_giving_negative_output_extent():
    conv = kernel_of(CASES["conv2d"])
    with pytest.raises(polyc.SignatureError, match="too small"):
        conv(np.ones((1, 1, 1, 5), np.float32), np.ones((1, 1, 3, 3), np.float32))


def test_wrong_outputs_are_signature_errors():
    matmul_acc = kernel_of(CASES["matmul_acc"])
    A, B = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(polyc.SignatureError, match="output"):
        matmul_acc(A, B, outputs=[np.ones((2, 5), np.float32)])
    with pytest.raises(polyc.SignatureError, match="output"):
        matmul_acc(A, B, outputs=[np.ones((2, 4), np.float64)])
    with pytest.raises(polyc.SignatureError, match="output"):
        matmul_acc(A, B, outputs=[])
    with pytest.raises(polyc.SignatureError, match="overlaps"):
        square = np.ones((3, 3), np.float32)
        kernel_of(MATMUL)(square, square, outputs=[square])


def test_scalar_size_must_not_be_negative():
    resize = kernel_of(CASES["resize"])
    with pytest.raises(polyc.SignatureError, match="negative"):
        resize(np.ones(3, np.float32), np.int32(-1))


def test_scalar_input_refuses_lossy_values():
    resize = kernel_of(CASES["resize"])
    with pytest.raises(polyc.SignatureError):
        resize(np.ones(3, np.float32), 2.5)


# ----------------------------------------------------------------------------- bounds
def test_guarded_access_may_be_out_of_bounds_where_the_guard_is_false():
    shift = kernel_of(CASES["shift_right"])
    np.testing.assert_array_equal(shift(np.array([5], np.float32)), [-1])
    np.testing.assert_array_equal(shift(np.array([5, 6, 7], np.float32)), [-1, 5, 6])


def test_guarded_gather_may_be_out_of_bounds_where_the_guard_is_false():
    gather = define("""
        def gather(float(E) LUT, int32(B) I) -> (O) {
            O(b) = I(b) >= 0 && I(b) < E ? LUT(I(b)) : 0
        }""")
    LUT = np.array([10, 20, 30], np.float32)
    np.testing.assert_array_equal(gather(LUT, np.array([2, -1, 3, 0], np.int32)), [30, 0, 0, 10])


@pytest.mark.parametrize("bad_index", [10, -1])
def test_gather_out_of_bounds_raises(bad_index):
    bag = kernel_of(CASES["embedding_bag"])
    LUT = np.ones((10, 4), np.float32)
    I = np.zeros((2, 3), np.int32)
    I[1, 2] = bad_index
    with pytest.raises(polyc.BoundsError, match="LUT"):
        bag(LUT, I)


def test_take_along_axis_out_of_bounds_raises():
    take = kernel_of(CASES["take_along_axis"])
    with pytest.raises(polyc.BoundsError):
        take(np.ones((2, 3), np.float32), np.array([[0], [3]], np.int64))


# ----------------------------------------------------------------------------- modules
def test_module_holds_every_def():
    module = interpreted(CASES["matmul"].source + CASES["row_sum"].source)
    assert module.names == ("matmul", "row_sum")
    np.testing.assert_array_equal(module.row_sum(np.ones((2, 3), np.float32)), [3, 3])
    with pytest.raises(AttributeError, match="matmul, row_sum"):
        module.conv  # noqa: B018
