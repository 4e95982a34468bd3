"""Programs from Tensor Comprehensions' own documentation, tests and examples, run as TC ran them:
compiled (and interpreted) against numpy; and the messages polyc gives for TC's common mistakes.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import polyc

TC_PROGRAMS = """
def concat(float(M, N) A, float(M, N) B) -> (O1) {
    O1(n, i, m) = i == 0 ? A(m, n) : B(m, n) where i in 0:2
}
def masked_convolve(float(B, C, H, W) Input, float(F, C, K, K) Weights, uint8(F, C) Mask) -> (Output) {
    Output(b, f, h, w) +=! (Mask(f, r_c) == 1) ?
        fmax(0.0, Input(b, r_c, h + r_k1, w + r_k2)) * Weights(f, r_c, r_k1, r_k2) :
        0.0
}
"""


@pytest.fixture(scope="module", params=["c", "interpreter"])
def programs(request):
    return polyc.define(TC_PROGRAMS, backend=request.param)


def test_concat_stacks_the_transposed_inputs(programs):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(programs.concat(a, b), np.stack([a.T, b.T], axis=1))


@pytest.mark.parametrize(
    "shape", [(2, 3, 7, 6, 4, 3), (1, 1, 3, 3, 1, 3), (3, 2, 5, 9, 2, 1)], ids=lambda s: "x".join(map(str, s))
)
def test_masked_convolve_matches_numpy(programs, shape):
    batch, channels, height, width, filters, k = shape
    rng = np.random.default_rng(sum(shape))
    image = rng.standard_normal((batch, channels, height, width)).astype(np.float32)
    weights = rng.standard_normal((filters, channels, k, k)).astype(np.float32)
    mask = rng.integers(0, 3, (filters, channels)).astype(np.uint8)  # 2 is neither 0 nor 1
    windows = sliding_window_view(np.maximum(image, 0).astype(np.float64), (k, k), axis=(2, 3))
    expected = np.einsum("bchwxy,fcxy->bfhw", windows, weights * (mask == 1)[:, :, None, None])
    result = programs.masked_convolve(image, weights, mask)
    assert result.shape == (batch, filters, height - k + 1, width - k + 1)
    terms = channels * k * k  # TC's rule: rtol = eps(float32) * the reduction length
    np.testing.assert_allclose(
        result,
        expected,
        rtol=terms * np.finfo(np.float32).eps,
        atol=terms * np.finfo(np.float32).eps * np.abs(expected).max(),
    )


def test_equivalence_annotation_is_accepted_and_changes_nothing():
    # TC's '<=> matmul(...)' names a library call the statement is equivalent to
    source = "def fun(float(X, Y) A, float(Y, Z) B) -> (O) {{ O(i, j) +=! A(i, k) * B(k, j){} }}"
    annotated = polyc.define(source.format(" <=> matmul(A(i, k), B(k, j))")).fun
    assert annotated.definition.statements == polyc.define(source.format("")).fun.definition.statements
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(annotated(a, b), a @ b)


def test_c_math_builtins_of_tcs_tests(programs):
    fun = polyc.define(
        "def fun(float(N, N) A, float(N, N) B, float(N) C) -> (O) {\n"
        "    O(n0, n1) = nextafter(C(n0), exp(A(n0, n1))) + log(B(n1, n0))\n}",
        backend=programs.concat.options.backend,
    ).fun
    rng = np.random.default_rng(2)
    a, b, c = rng.standard_normal((5, 5)), rng.uniform(0.5, 2, (5, 5)), rng.standard_normal(5)
    a, b, c = a.astype(np.float32), b.astype(np.float32), c.astype(np.float32)
    expected = np.nextafter(c[:, None], np.exp(a)) + np.log(b.T)
    np.testing.assert_allclose(fun(a, b, c), expected, rtol=4 * np.finfo(np.float32).eps)


@pytest.mark.parametrize(
    "statement, expected",
    [("B +=! A(i)", np.any), ("B *=! A(i)", np.all), ("B max=! A(i)", np.any), ("B min=! A(i)", np.all)],
)
@pytest.mark.parametrize("size", [2, 3, 1000])
def test_bool_reductions_are_logical(programs, statement, expected, size):
    # TC's generated type tests: a bool + is "or" (gcc once combined OpenMP's private copies of a
    # _Bool + reduction modulo 2, so two threads' true gave false)
    kernel = polyc.define(f"def t(bool(N) A) -> (B) {{ {statement} }}", backend=programs.concat.options.backend).t
    for values in (np.ones(size, bool), np.zeros(size, bool), np.arange(size) % 2 == 0, np.arange(size) == size - 1):
        assert kernel(values) == expected(values), values


def test_reduction_without_init_into_a_fresh_tensor_warns():
    with pytest.warns(
        polyc.PolycWarning,
        match=r"column \d+: 'O' is first written by 'O\(i\) \*= A\(i, j\)'.*"
        r"write '\*=!'",
    ) as caught:
        polyc.define("def f(float(N, M) A) -> (O) {\n    O(i) *= A(i, j)\n}", filename="product.tc")
    assert caught[0].filename == "product.tc" and caught[0].lineno == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # += from zero, or accumulating into an earlier statement's value
        polyc.define("def f(float(N, M) A) -> (O) { O(i) += A(i, j) \n O(i) max= A(i, j) }")


def test_guarded_accesses_are_proved_only_where_their_guard_holds():
    # A(i - 1) is outside A at i = 0, where its branch is not taken: no precondition, and the
    # guard is what keeps the read inside (the same read unguarded is refused)
    padded = polyc.define("def shift(float(N) A) -> (O) { O(i) = i > 0 ? A(i - 1) : 0 where i in 0:N }").shift
    assert str(padded.bounds_precondition) == "none"
    np.testing.assert_array_equal(padded(np.arange(1, 5, dtype=np.float32)), [0, 1, 2, 3])
    with pytest.raises(polyc.BoundsError, match="reads A outside its bounds"):
        polyc.define("def shift(float(N) A) -> (O) { O(i) = A(i - 1) where i in 0:N }")


# ----------------------------------------------------------------------------- messages
def test_write_outside_its_tensor_names_the_inferred_range_and_the_fix():
    with pytest.raises(polyc.BoundsError) as error:
        polyc.define("def shift(float(N) A) -> (B) { B(i) = A(i + 1) }")
    message = str(error.value)
    assert "range inference gave 'i' the range -1 <= i < N - 1 because of A(i + 1)" in message
    assert "the write to B needs 0 <= i < N - 1" in message
    clause = re.search(r"add '(where [^']*)'", message).group(1)
    assert clause == "where i in 0:N - 1"
    fixed = polyc.define(f"def shift(float(N) A) -> (B) {{ B(i) = A(i + 1) {clause} }}").shift
    np.testing.assert_array_equal(fixed(np.arange(4, dtype=np.float32)), [1, 2, 3])


def test_write_outside_a_declared_output_names_the_where_clause():
    with pytest.raises(polyc.BoundsError) as error:
        polyc.define("def f(float(N) A) -> (float(N) B) { B(i) = 0 where i in 0:N \n B(i) = A(i) where i in 0:N + 1 }")
    message = str(error.value)
    assert "the where clause gives 'i' the range 0 <= i < N + 1" in message
    assert "add 'where i in 0:N'" in message


@pytest.mark.parametrize("backend", ["c", "interpreter"])
def test_input_in_the_other_byte_order_is_read_through_a_native_copy(backend):
    matmul = polyc.define(
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }", backend=backend
    ).mm
    rng = np.random.default_rng(1)
    swapped = rng.standard_normal((4, 3)).astype(">f4")
    before = swapped.copy()
    b = rng.standard_normal((3, 5)).astype(np.float32)
    for _ in range(3):  # the repeated-call fast path too
        result = matmul(swapped, b)
        assert result.dtype == np.float32
        np.testing.assert_allclose(result, swapped.astype(np.float64) @ b, rtol=3 * np.finfo(np.float32).eps, atol=1e-6)
    assert swapped.dtype == np.dtype(">f4") and np.array_equal(swapped, before)
    with pytest.raises(
        polyc.SignatureError,
        match=r"output 'C' is float32 in big-endian byte order \('>f4'\).*"
        r"numpy\.empty\(\(4, 5\), numpy\.float32\).*astype\('>f4'\)",
    ):
        matmul(swapped, b, outputs=[np.zeros((4, 5), ">f4")])
