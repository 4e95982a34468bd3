"""Tensor contractions through the BLIS-style back end (polyc/schedule/contraction.py,
polyc/codegen/gemm.py).

- recognition: which statements are contractions, how their indices are classified, and
  which defs (a contraction plus elementwise epilogues) take the gemm path;
- numbers against numpy at sizes that are not multiples of the register block or the cache
  blocks, for permuted and multi-index layouts, batches, accumulation into given outputs,
  epilogues, an empty reduction, every thread-sharing mode and every micro-kernel (AVX-512,
  AVX2 and portable builds of the same source);
- AddressSanitizer/UBSan builds of the kernels at edge sizes; a C export built without OpenMP.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest
from builds import builds
from kernels import assert_close
from sanitizers import ISA_FLAG_SETS, run_sanitized

import polyc
from polyc.lang.sema import check_source
from polyc.schedule.contraction import recognise_contraction, recognise_gemm_def

TESTS_DIR = Path(__file__).resolve().parent


def checked(source: str):
    return check_source(source)[0]


def contraction_of(source: str):
    definition = checked(source)
    return recognise_contraction(definition.statements[0], definition)


# ----------------------------------------------------------------------------- recognition
MATMUL = "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"

#: source -> (A, B, batch, M, N, K) as recognised; A holds M, B holds N (C's innermost group).
POSITIVE = {
    "matmul": (MATMUL, ("A", "B", (), ("m",), ("n",), ("r_k",))),
    "tmm": (
        "def f(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "at_bt": (
        "def f(float(K, M) A, float(N, K) B) -> (C) { C(m, n) +=! A(r_k, m) * B(n, r_k) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "transposed_output": (
        "def f(float(M, K) A, float(K, N) B) -> (C) { C(n, m) +=! A(m, r_k) * B(r_k, n) }",
        ("B", "A", (), ("n",), ("m",), ("r_k",)),
    ),
    "batched": (
        "def f(float(B, N, M) X, float(B, M, K) Y) -> (Z) { Z(b, n, k) +=! X(b, n, r_m) * Y(b, r_m, k) }",
        ("X", "Y", ("b",), ("n",), ("k",), ("r_m",)),
    ),
    "tensordot": (
        "def f(float(N, C1, C2, H, W) I0, float(N, C2, C3, H, W) I1) -> (O) {"
        " O(n, c1, c3, h, w) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, c3, h, w) }",
        ("I0", "I1", ("n", "h", "w"), ("c1",), ("c3",), ("r_c2",)),
    ),
    "kronecker_step1": (
        "def f(float(D2, N2) W2, float(M, N0, N1, N2) X) -> (XW2) {"
        " XW2(m, n0, n1, d2) +=! X(m, n0, n1, r_n2) * W2(d2, r_n2) }",
        ("X", "W2", (), ("m", "n0", "n1"), ("d2",), ("r_n2",)),
    ),
    "kronecker_step2": (
        "def f(float(D1, N1) W1, float(M, N0, N1, D2) XW2) -> (Y) {"
        " Y(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1) }",
        ("W1", "XW2", (), ("d1",), ("m", "n0", "d2"), ("r_n1",)),
    ),
    "conv1x1": (
        "def f(float(N, C, H, W) I, float(F, C) W1) -> (O) { O(n, f, h, w) +=! I(n, r_c, h, w) * W1(f, r_c) }",
        ("W1", "I", (), ("f",), ("n", "h", "w"), ("r_c",)),
    ),
    "fully_connected": (
        "def f(float(B, M) I, float(N, M) W1) -> (O) { O(b, n) +=! I(b, r_m) * W1(n, r_m) }",
        ("I", "W1", (), ("b",), ("n",), ("r_m",)),
    ),
    "multi_k": (
        "def f(float(M, K1, K2) A, float(K2, K1, N) B) -> (C) { C(m, n) +=! A(m, r_a, r_b) * B(r_b, r_a, n) }",
        ("A", "B", (), ("m",), ("n",), ("r_a", "r_b")),
    ),
    "same_tensor_twice": (
        "def f(float(N, K) A) -> (C) { C(i, j) +=! A(i, r_k) * A(j, r_k) }",
        ("A", "A", (), ("i",), ("j",), ("r_k",)),
    ),
    "accumulating": (
        "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) += A(m, r_k) * B(r_k, n) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "double": (
        "def f(double(M, K) A, double(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "scaled": (
        "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! 2 * A(m, r_k) * B(r_k, n) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "scaled_by_scalars": (
        "def f(float a, float b, float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! a * A(m, r_k) * b * B(r_k, n) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
    "guarded": (
        "def f(float(N, K) A) -> (C) { C(i, j) +=! j <= i ? A(i, r_k) * A(j, r_k) : 0"
        " where i in 0:N, j in 0:N, r_k in 0:K }",
        ("A", "A", (), ("i",), ("j",), ("r_k",)),
    ),
    "same_type_casts": (
        "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! float(A(m, r_k)) * float32(B(r_k, n)) }",
        ("A", "B", (), ("m",), ("n",), ("r_k",)),
    ),
}

NEGATIVE = {
    "strided_conv": "def f(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {"
    " O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 2 * w + r_kw) * W1(f, r_c, r_kh, r_kw) }",
    "conv3x3": "def f(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {"
    " O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw) }",
    "diagonal": "def f(float(M, K) A, float(K, K) B) -> (C) { C(m) +=! A(m, r_k) * B(r_k, r_k) }",
    "trace": "def f(float(N, N) A) -> (T) { T +=! A(r_i, r_i) }",
    "three_operands": "def f(float(M, K) A, float(K, N) B, float(M, N) E) -> (D) {"
    " D(m, n) +=! A(m, r_k) * B(r_k, n) * E(m, n) }",
    "guard_on_reduction_index": "def f(float(N, N) A, float(N, N) B) -> (C) {"
    " C(i, j) +=! r_k <= i ? A(i, r_k) * B(r_k, j) : 0 where i in 0:N, j in 0:N, r_k in 0:N }",
    "guard_with_or": "def f(float(N, N) A, float(N, N) B) -> (C) {"
    " C(i, j) +=! (j <= i || i == 0) ? A(i, r_k) * B(r_k, j) : 0 where i in 0:N, j in 0:N, r_k in 0:N }",
    "guard_else_not_zero": "def f(float(N, N) A, float(N, N) B) -> (C) {"
    " C(i, j) +=! j <= i ? A(i, r_k) * B(r_k, j) : 1 where i in 0:N, j in 0:N, r_k in 0:N }",
    "guard_on_multi_index_group": "def f(float(N, N, K) A, float(K, N) B) -> (C) {"
    " C(i, h, j) +=! h <= j ? A(i, h, r_k) * B(r_k, j) : 0"
    " where i in 0:N, h in 0:N, j in 0:N, r_k in 0:K }",
    "scale_from_a_vector": "def f(float(M, K) A, float(K, N) B, float(K) s) -> (C) {"
    " C(m, n) +=! s(r_k) * A(m, r_k) * B(r_k, n) }",
    "min_reduction": "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) min=! A(m, r_k) * B(r_k, n) }",
    "int32": "def f(int32(M, K) A, int32(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
    "float16_inputs": "def f(float16(M, K) A, float16(K, N) B) -> (C) {"
    " C(m, n) +=! float(A(m, r_k)) * float(B(r_k, n)) }",
    "mixed_precision": "def f(double(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
    "dot": "def f(float(N) A, float(N) B) -> (C) { C +=! A(r_i) * B(r_i) }",
    "offset": "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k + 1) * B(r_k, n) }",
    "partial_range": "def f(float(M, K) A, float(K, N) B) -> (C) {"
    " C(m, n) +=! A(m, r_k) * B(r_k, n) where r_k in 0:K/2 }",
    "reduced_in_one_operand": "def f(float(M, K, J) A, float(K, N) B) -> (C) {"
    " C(m, n) +=! A(m, r_k, r_j) * B(r_k, n) }",
    "outer_product": "def f(float(M) a, float(N) b) -> (C) { C(i, j) = a(i) * b(j) }",
}


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_recognises_contractions(name):
    source, (a, b, batch, m, n, k) = POSITIVE[name]
    c = contraction_of(source)
    assert c is not None, name
    assert (c.a.tensor, c.b.tensor, c.batch, c.m, c.n, c.k) == (a, b, batch, m, n, k)
    assert c.init == (name != "accumulating")


def test_matrix_vector_products_are_contractions_only_when_asked():
    definition = checked("def f(float(M, N) A, float(N) x) -> (y) { y(m) +=! A(m, r_n) * x(r_n) }")
    assert recognise_contraction(definition.statements[0], definition) is None
    c = recognise_contraction(definition.statements[0], definition, matvec=True)
    assert c.is_matvec and (c.a.tensor, c.b.tensor, c.m, c.n, c.k) == ("A", "x", ("m",), (), ("r_n",))


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_rejects_what_is_not_a_contraction(name):
    assert contraction_of(NEGATIVE[name]) is None
    assert recognise_gemm_def(checked(NEGATIVE[name])) is None


MLP = """def mlp(float(M, K) I, float(K, N) W, float(N) bias) -> (O) {
    O(i, j) +=! I(i, r_k) * W(r_k, j)
    O(a, b) = fmax(O(a, b) + bias(b), 0)
}"""


def test_def_with_epilogues_is_one_gemm():
    c = recognise_gemm_def(checked(MLP))
    assert c is not None and len(c.epilogues) == 1
    assert "epilogue" in c.describe()


@pytest.mark.parametrize(
    "second",
    [
        "O(i, j) = O(i, j) + bias(L(j))",  # a data-dependent read
        "P(i, j) = O(i, j) * 2",  # writes another tensor
        "O(i, j) = O(i, j) + bias(j) where i in 0:M/2",  # part of the target only
        "O(i, j) += I(i, r_x)",  # a reduction, not element by element
    ],
)
def test_defs_that_are_not_one_gemm(second):
    source = f"""def f(float(M, M) I, float(M, M) W, float(M) bias, int32(M) L) -> (O) {{
        O(i, j) +=! I(i, r_k) * W(r_k, j)
        {second}
    }}"""
    definition = checked(source)
    assert recognise_contraction(definition.statements[0], definition) is not None
    assert recognise_gemm_def(definition) is None


def test_two_contractions_are_not_one_gemm():
    source = """def mlp2(float(B, M) I, float(N, M) W1, float(P, N) W2) -> (O2) {
        H(b, n) +=! I(b, r_m) * W1(n, r_m)
        O2(b, p) +=! H(b, r_n) * W2(p, r_n)
    }"""
    assert recognise_gemm_def(checked(source)) is None


def test_batch_innermost_contractions_stay_generic():
    """TC's tensordot vectorises best along its innermost dimension, a batch index."""
    kernel = polyc.define(POSITIVE["tensordot"][0]).f
    assert kernel.stages(dict(N=1, C1=2, C2=3, C3=4, H=5, W=6)).contraction is None


def test_stages_and_escape_hatch():
    kernel = polyc.define(MATMUL).f
    stages = kernel.stages(dict(M=8, K=8, N=8))
    assert stages.contraction is not None
    assert "polyc gemm kernel" in stages.kernel.source
    assert stages.optimized_schedule is not None  # still computed, for inspection
    generic = polyc.define(MATMUL, blas_contractions=False).f.stages(dict(M=8, K=8, N=8))
    assert generic.contraction is None and "gemm" not in generic.kernel.source
    with pytest.raises(polyc.PolycError, match="blas_contractions"):
        polyc.define(MATMUL, blas_contractions="yes")


# ----------------------------------------------------------------------------- numbers
def rand(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def check(kernel, inputs, expected, ops, outputs=None, scale_with=()):
    """``kernel``'s outputs against ``expected`` (float64) by TC's rule, ``max|input|`` taken
    over ``inputs`` and ``scale_with``."""
    result = kernel(*inputs) if outputs is None else kernel(*inputs, outputs=outputs)
    result = result if isinstance(result, tuple) else (result,)
    for got, want in zip(result, expected, strict=True):  # want: computed in float64
        assert got.dtype == inputs[0].dtype
        assert_close(got, want.astype(got.dtype), max(ops, 4), got.dtype, (*inputs, *scale_with))


# (M, K, N): not multiples of the register blocks (6..12 x 16..64) nor of the cache blocks;
# the last ones are large enough to run on several threads.
MATMUL_SIZES = [(1, 1, 1), (7, 5, 3), (33, 129, 257), (257, 33, 129), (129, 257, 33), (61, 700, 67), (300, 200, 310)]


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_matmul_against_numpy(dtype):
    kernel = polyc.define(MATMUL.replace("float", dtype), specialize=False).f
    rng = np.random.default_rng(0)
    np_dtype = np.float32 if dtype == "float" else np.float64
    for m, k, n in MATMUL_SIZES:
        a, b = rand(rng, (m, k), np_dtype), rand(rng, (k, n), np_dtype)
        check(kernel, (a, b), [a.astype(np.float64) @ b], k)


def test_specialised_matmul_with_options():
    rng = np.random.default_rng(1)
    a, b = rand(rng, (133, 270)), rand(rng, (270, 71))
    expected = a.astype(np.float64) @ b
    for options in [
        {},
        dict(parallel=False),
        dict(vectorize=False),
        dict(gemm_blocks=(1, 1, 1)),
        dict(gemm_blocks=(12, 64, 16)),
        dict(gemm_blocks=(3, 2, 5)),
        dict(fusion="min", unroll=4),
    ]:
        check(polyc.define(MATMUL, **options).f, (a, b), [expected], 270)


@builds("avx2", "portable")
def test_every_micro_kernel(cflags):
    """The same source built without AVX-512 (AVX2 kernel) and without any vector extension."""
    kernel = polyc.define(MATMUL, specialize=False, cflags=cflags, gemm_blocks=(24, 64, 32)).f
    rng = np.random.default_rng(2)
    for m, k, n in [(1, 1, 1), (7, 5, 3), (37, 70, 41), (140, 100, 150)]:
        a, b = rand(rng, (m, k)), rand(rng, (k, n))
        check(kernel, (a, b), [a.astype(np.float64) @ b], k)
    double = polyc.define(MATMUL.replace("float", "double"), cflags=cflags).f
    a, b = rand(rng, (37, 70), np.float64), rand(rng, (70, 41), np.float64)
    check(double, (a, b), [a @ b], 70)


@pytest.mark.parametrize("dtype", ["float", "double"])
@builds("native", "avx2", "portable")
def test_rows_of_a_along_k_packed_without_offset_tables(cflags, dtype):
    """A row-major A is packed without the offset tables: by register transposes on x86 (float
    8 x 8, double 4 x 4), in plain C elsewhere.  K blocks that are and are not multiples of the
    transposes' blocks (a float sliver's last column is stored value by value), slivers with
    fewer rows than the register block (zero rows), and the contraction's scale."""
    if cflags is not None and cflags != "-O2" and platform.machine() != "x86_64":
        pytest.skip("AVX2 is an x86 instruction set")
    rng = np.random.default_rng(12)
    np_dtype = np.float32 if dtype == "float" else np.float64
    plain = MATMUL.replace("float", dtype)
    scaled = plain.replace("A(m, r_k)", "0.5 * A(m, r_k)")
    for source, factor in ((plain, 1.0), (scaled, 0.5)):
        for blocks in ((24, 64, 16), (12, 48, 13), None):
            options = dict(cflags=cflags, specialize=False)
            kernel = polyc.define(source, **options, **({} if blocks is None else dict(gemm_blocks=blocks))).f
            assert "polyc_pack_rows_along_k(a + " in kernel.c_source()
            assert ("#define POLYC_HAS_SCALE 1" in kernel.c_source()) == (factor != 1.0)
            # (A is read in place where the wide register blocks' A sliver fits a quarter of L1:
            # the scaled def, and the long K blocks of the last size, are packed everywhere.)
            for m, k, n in [
                (1, 1, 70),
                (5, 7, 70),
                (6, 8, 70),
                (13, 9, 70),
                (50, 16, 70),
                (31, 23, 70),
                (97, 40, 100),
                (64, 250, 130),
                (20, 700, 40),
            ]:
                a, b = rand(rng, (m, k), np_dtype), rand(rng, (k, n), np_dtype)
                check(kernel, (a, b), [factor * (a.astype(np.float64) @ b)], k)


@builds("native", "portable")
def test_threads_with_partial_blocks_repeatedly(cflags):
    """Many small blocks of uneven sizes, rows shared (first shape) or column slivers shared
    (second): run repeatedly, since a race between threads shows only now and then."""
    kernel = polyc.define(MATMUL, specialize=False, cflags=cflags, gemm_blocks=(24, 64, 32)).f
    rng = np.random.default_rng(9)
    for m, k, n in [(300, 100, 150), (140, 100, 150)]:
        a, b = rand(rng, (m, k)), rand(rng, (k, n))
        expected = a.astype(np.float64) @ b
        for _ in range(40):
            check(kernel, (a, b), [expected], k)


@builds("native", "avx2", "portable")
def test_b_packed_in_runs_just_before_its_first_use(cflags):
    """A thread alone on its column slivers packs them just before its first row block uses
    them, a run of slivers (256 bytes of each row of B) at a time: runs cut short by the end of
    a thread's share or of an NC block, runs that hold the partial last sliver, B's columns not
    contiguous (blocked weights: runs of 20), slivers read in place (few rows of A) beside
    packed ones, several K panels, one thread and two."""
    rng = np.random.default_rng(21)
    blocked = "def blocked(float(M, K) A, float(NB, K, R) W) -> (O) { O(i, nb, nr) +=! A(i, r_k) * W(nb, r_k, nr) }"
    for threads in (1, 2):
        for blocks in (None, (24, 80, 32)):
            options = dict(cflags=cflags, specialize=False, threads=threads)
            if blocks is not None:
                options["gemm_blocks"] = blocks
            kernel = polyc.define(MATMUL, **options).f
            for m, k, n in [(3, 9, 200), (10, 40, 70), (20, 100, 333), (128, 70, 520)]:
                a, b = rand(rng, (m, k)), rand(rng, (k, n))
                check(kernel, (a, b), [a.astype(np.float64) @ b], k)
            a, w = rand(rng, (30, 50)), rand(rng, (7, 50, 20))
            check(
                polyc.define(blocked, **options).blocked,
                (a, w),
                [np.einsum("ik,bkr->ibr", a.astype(np.float64), w)],
                50,
            )


def test_packing_workspace_and_tables_kept_between_calls_of_any_size():
    """The packing buffers are one block the kernel keeps from call to call (``KEPT_WORKSPACE_C``),
    and the offset tables of the first call's sizes are kept for later calls of those sizes
    (``kept_tables``): calls whose products need more than the kept block, less, and the same,
    in turn from four threads at once (so that calls find the block taken, and give theirs back
    second), each against numpy.  A block used by two calls at once, or kept when too small, or
    tables used for other sizes, give wrong numbers."""
    from concurrent.futures import ThreadPoolExecutor

    kernel = polyc.define(MATMUL, specialize=False, gemm_blocks=(24, 64, 32)).f
    assert "polyc_workspace_take" in kernel.c_source() and "polyc_kept" in kernel.c_source()
    rng = np.random.default_rng(10)
    cases = []
    for m, k, n in [(40, 30, 50), (300, 100, 400), (7, 5, 3), (200, 170, 90)]:
        a, b = rand(rng, (m, k)), rand(rng, (k, n))
        cases.append((a, b, a.astype(np.float64) @ b))

    def run(start: int) -> None:
        for call in range(12):
            a, b, expected = cases[(start + call) % len(cases)]
            check(kernel, (a, b), [expected], a.shape[1])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(4)))


LAYOUTS = {
    # name: (source, numpy of float64 inputs, input shapes for (m, k, n), terms each element sums)
    "tmm": (POSITIVE["tmm"][0], lambda A, B: A @ B.T, lambda m, k, n: [(m, k), (n, k)], lambda k: k),
    "at_bt": (POSITIVE["at_bt"][0], lambda A, B: A.T @ B.T, lambda m, k, n: [(k, m), (n, k)], lambda k: k),
    "transposed_output": (
        POSITIVE["transposed_output"][0],
        lambda A, B: (A @ B).T,
        lambda m, k, n: [(m, k), (k, n)],
        lambda k: k,
    ),
    "multi_k": (
        POSITIVE["multi_k"][0],
        lambda A, B: np.einsum("mab,ban->mn", A, B),
        lambda m, k, n: [(m, k, 3), (3, k, n)],
        lambda k: 3 * k,
    ),
    "same_tensor_twice": (POSITIVE["same_tensor_twice"][0], lambda A: A @ A.T, lambda m, k, n: [(m, k)], lambda k: k),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_permuted_layouts(name):
    source, reference, shapes, terms = LAYOUTS[name]
    kernel = polyc.define(source, specialize=False).f
    rng = np.random.default_rng(3)
    for m, k, n in [(1, 1, 1), (13, 7, 70), (70, 150, 13), (130, 90, 140)]:
        inputs = [rand(rng, shape) for shape in shapes(m, k, n)]
        expected = reference(*(x.astype(np.float64) for x in inputs))
        # A A^T's diagonal sums k squares: its partial sums grow to the result, so the scale is
        # the result's magnitude, as in the fuzzer's max(|term|, |sum|), not an input's.
        scale_with = [np.diag(expected)] if name == "same_tensor_twice" else []
        check(kernel, inputs, [expected], terms(k), scale_with=scale_with)


def test_batched_matmul_in_every_thread_sharing_mode():
    kernel = polyc.define(POSITIVE["batched"][0], specialize=False).f
    rng = np.random.default_rng(4)
    # one big product (rows shared), three (products shared out unevenly: rows), eight (whole
    # products per thread), many tiny ones, and a short wide product (column slivers shared)
    for b, n, m, k in [(1, 130, 97, 140), (3, 70, 100, 90), (8, 45, 50, 60), (50, 26, 72, 26), (1, 5, 64, 3000)]:
        x, y = rand(rng, (b, n, m)), rand(rng, (b, m, k))
        check(kernel, (x, y), [np.matmul(x.astype(np.float64), y)], m)


def test_multi_index_groups_and_kronecker_steps():
    rng = np.random.default_rng(5)
    # the target's innermost dimension in N, batch indices outside: (h, w) and (c3, h) swapped
    source = (
        "def f(float(N, C1, C2, H, W) I0, float(N, C2, W, H, C3) I1) -> (O) {"
        " O(n, c1, w, h, c3) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, w, h, c3) }"
    )
    batched = polyc.define(source).f
    assert batched.stages(dict(N=1, C1=2, C2=3, C3=4, H=5, W=6)).contraction.batch == ("n", "w", "h")
    i0, i1 = rand(rng, (2, 17, 33, 5, 3)), rand(rng, (2, 33, 3, 5, 19))
    check(batched, (i0, i1), [np.einsum("nabhw,nbwhc->nawhc", i0.astype(np.float64), i1)], 33)
    step1 = polyc.define(POSITIVE["kronecker_step1"][0]).f
    w2, x = rand(rng, (21, 19)), rand(rng, (9, 5, 7, 19))
    check(step1, (w2, x), [np.einsum("mabr,dr->mabd", x.astype(np.float64), w2)], 19)
    step2 = polyc.define(POSITIVE["kronecker_step2"][0], specialize=False).f
    for d1, n1, m, n0, d2 in [(20, 17, 6, 5, 21), (3, 40, 2, 3, 70)]:
        w1, xw2 = rand(rng, (d1, n1)), rand(rng, (m, n0, n1, d2))
        check(step2, (w1, xw2), [np.einsum("mard,er->maed", xw2.astype(np.float64), w1)], n1)


def test_short_rows_of_a_read_in_place_are_fetched_ahead():
    """A Kronecker step reads its 19-float rows of X in place, a few multiply-adds per byte:
    the loops ask for the rows 8 KiB ahead, up to the last row and not beyond (M = 3001 rows,
    not a multiple of any register block, so the last blocks are partial)."""
    step1 = polyc.define(POSITIVE["kronecker_step1"][0]).f
    sizes = dict(D2=16, N2=19, M=3001, N0=1, N1=1)
    source = step1.c_source(sizes)
    assert "polyc_prefetch_rows(a + (ic + ir + a_ahead)" in source
    assert "ic + ir + a_ahead + mr <= g->m" in source
    rng = np.random.default_rng(8)
    w2, x = rand(rng, (16, 19)), rand(rng, (3001, 1, 1, 19))
    check(step1, (w2, x), [np.einsum("mabr,dr->mabd", x.astype(np.float64), w2)], 19)


def test_conv1x1_with_bias_and_relu_epilogue():
    source = """def conv(float(N, C, H, W) I, float(F, C) W1, float(F) bias) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h, w) * W1(f, r_c)
        O(n, f, h, w) = fmax(O(n, f, h, w) + bias(f), 0)
    }"""
    kernel = polyc.define(source, specialize=False).conv
    assert kernel.stages(None).contraction is not None
    rng = np.random.default_rng(6)
    for n, c, h, w, f in [(1, 3, 2, 2, 1), (2, 70, 9, 11, 40), (3, 33, 16, 16, 20)]:
        i, w1, bias = rand(rng, (n, c, h, w)), rand(rng, (f, c)), rand(rng, (f,))
        reference = np.einsum("nchw,fc->nfhw", i.astype(np.float64), w1) + bias[None, :, None, None]
        check(kernel, (i, w1, bias), [np.maximum(reference, 0)], c)


def test_epilogues_and_accumulation():
    rng = np.random.default_rng(7)
    mlp = polyc.define(MLP, specialize=False).mlp
    for m, k, n in [(1, 1, 1), (67, 45, 130), (200, 300, 100)]:
        i, w, bias = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (n,))
        check(mlp, (i, w, bias), [np.maximum(i.astype(np.float64) @ w + bias, 0)], k)

    # without `!`: C += A B (beta = 1), then two epilogues: an update and one with a scalar input
    source = """def f(float(M, K) A, float(K, N) B, float(M, N) D, float alpha) -> (C) {
        C(m, n) += A(m, r_k) * B(r_k, n)
        C(m, n) += D(m, n)
        C(m, n) = alpha * C(m, n)
    }"""
    kernel = polyc.define(source, specialize=False).f
    assert recognise_gemm_def(kernel.definition) is not None
    for m, k, n in [(5, 9, 70), (150, 130, 170)]:
        a, b, d, c0 = rand(rng, (m, k)), rand(rng, (k, n)), rand(rng, (m, n)), rand(rng, (m, n))
        expected = 1.5 * (c0.astype(np.float64) + a.astype(np.float64) @ b + d)
        c = c0.copy()
        check(kernel, (a, b, d, np.float32(1.5)), [expected], k, outputs=[c])


def test_empty_reduction_and_empty_outputs():
    rng = np.random.default_rng(8)
    mlp = polyc.define(MLP, specialize=False).mlp
    bias = rand(rng, (5,))
    out = mlp(np.zeros((3, 0), np.float32), np.zeros((0, 5), np.float32), bias)
    np.testing.assert_array_equal(out, np.broadcast_to(np.maximum(bias, 0), (3, 5)))
    accumulate = polyc.define(POSITIVE["accumulating"][0]).f
    c0 = rand(rng, (4, 6))
    c = c0.copy()
    accumulate(np.zeros((4, 0), np.float32), np.zeros((0, 6), np.float32), outputs=[c])
    np.testing.assert_array_equal(c, c0)
    assert polyc.define(MATMUL).f(np.zeros((0, 3), np.float32), rand(rng, (3, 4))).shape == (0, 4)


def test_special_values_stay_where_they_belong():
    """Padding of partial blocks multiplies zeros by the operands: inf and NaN in B must not leak
    into rows of C that do not exist, nor NaN into other elements."""
    a = np.ones((7, 3), np.float32)
    b = np.ones((3, 5), np.float32)
    b[1, 2] = np.inf
    b[2, 4] = np.nan
    c = polyc.define(MATMUL).f(a, b)
    expected = a.astype(np.float64) @ b
    np.testing.assert_array_equal(np.isnan(c), np.isnan(expected))
    np.testing.assert_array_equal(c[np.isfinite(expected)], expected[np.isfinite(expected)])


# ----------------------------------------------------------------------------- sanitizers, export
_SANITIZED_SCRIPT = """
import sys
import numpy as np
import polyc
from kernels import assert_close
sources = {
    "mm": "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
    "kron": "def f(float(D1, N1) W1, float(M, N0, N1, D2) XW2) -> (Y) {"
            " Y(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1) }",
    "mlp": "def f(float(M, K) I, float(K, N) W, float(N) b) -> (O) {"
           " O(i, j) +=! I(i, r_k) * W(r_k, j)  O(i, j) = fmax(O(i, j) + b(j), 0) }",
    "tmm": "def f(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
}
rng = np.random.default_rng(0)
for flags in sys.argv[1:]:
    mm = polyc.define(sources["mm"], cflags=flags, gemm_blocks=(12, 64, 16), specialize=False).f
    for m, k, n in [(1, 1, 1), (7, 5, 3), (45, 37, 130), (130, 100, 97)]:
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32); b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        assert_close(mm(a, b), a.astype(np.float64) @ b, k, np.float32, (a, b))
    double_mm = polyc.define(sources["mm"].replace("float", "double"), cflags=flags, specialize=False).f
    a = rng.uniform(-1, 1, (45, 37)); b = rng.uniform(-1, 1, (37, 130))
    assert_close(double_mm(a, b), a @ b, 37, np.float64, (a, b))
    kron = polyc.define(sources["kron"], cflags=flags, specialize=False).f
    w1 = rng.uniform(-1, 1, (7, 9)).astype(np.float32); x = rng.uniform(-1, 1, (3, 2, 9, 5)).astype(np.float32)
    assert_close(kron(w1, x), np.einsum("mard,er->maed", x.astype(np.float64), w1), 9, np.float32, (w1, x))
    tmm = polyc.define(sources["tmm"], cflags=flags, specialize=False).f
    for m, k, n in [(5, 40, 130), (70, 33, 64)]:
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32); b = rng.uniform(-1, 1, (n, k)).astype(np.float32)
        assert_close(tmm(a, b), a.astype(np.float64) @ b.T, k, np.float32, (a, b))
    mlp = polyc.define(sources["mlp"], cflags=flags).f
    i = rng.uniform(-1, 1, (13, 200)).astype(np.float32); w = rng.uniform(-1, 1, (200, 70)).astype(np.float32)
    bias = rng.uniform(-1, 1, (70,)).astype(np.float32)
    assert_close(mlp(i, w, bias), np.maximum(i.astype(np.float64) @ w + bias, 0), 200, np.float32, (i, w))
    print("checked", flags.split()[-1], flush=True)
"""


def test_sanitized_gemm_kernels(tmp_path):
    flag_sets = ISA_FLAG_SETS
    result = run_sanitized(_SANITIZED_SCRIPT, *flag_sets, cache_dir=tmp_path, timeout=600, build_first=True)
    report = f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
    assert result.returncode == 0 and "runtime error" not in result.stderr, report
    assert result.stdout.count("checked") == len(flag_sets), report


def test_exported_gemm_builds_without_openmp(tmp_path):
    kernel = polyc.define(MLP).mlp
    c_path, _ = kernel.export_c(tmp_path, dict(M=10, K=20, N=30), target="generic")
    command = [
        "gcc",
        "-O2",
        "-std=gnu11",
        "-Wall",
        "-Werror",
        "-Wno-unknown-pragmas",
        "-c",
        str(c_path),
        "-o",
        str(tmp_path / "mlp.o"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- cache models
def test_block_sizes_follow_the_cache_model():
    from polyc.codegen.gemm import block_sizes, micro_kernel_shapes

    shape = micro_kernel_shapes("neon", np.dtype(np.float32))[0]  # 8 x 12
    small = block_sizes(shape, 4, None, {1: 32 * 1024, 2: 512 * 1024, 3: 2 << 20})
    large = block_sizes(shape, 4, None, {1: 64 * 1024, 2: 2 << 20, 3: 32 << 20})
    assert small == (128, 1020, 256)  # KC: a quarter of L1 for the A sliver; MC: a quarter of L2
    assert all(s < l for s, l in zip(small, large))
    assert block_sizes(shape, 4, (50, 100, 30), {1: 1}) == (48, 96, 30)  # given sizes, rounded
    # AVX2's half-width blocks take three eighths of L1 and L2 (an AMD Zen 3's 32 KiB and 512 KiB).
    zen3 = {1: 32 * 1024, 2: 512 * 1024, 3: 32 << 20}
    assert block_sizes(micro_kernel_shapes("avx2", np.dtype(np.float32))[0], 4, None, zen3) == (96, 4096, 512)
    assert block_sizes(micro_kernel_shapes("avx2", np.dtype(np.float64))[0], 8, None, zen3) == (96, 4096, 256)
    assert block_sizes(micro_kernel_shapes("avx512", np.dtype(np.float32))[0], 4, None, zen3) == (96, 4096, 336)


def test_cache_sizes_option_is_validated():
    for bad in [(1, 2), (0, 1, 2), (1.5, 2, 3), "32K", (True, 2, 3)]:
        with pytest.raises(polyc.PolycError, match="cache_sizes"):
            polyc.define(MATMUL, cache_sizes=bad)
    assert polyc.define(MATMUL, cache_sizes=[1 << 15, 1 << 19, 1 << 21]).f.options.cache_sizes == (
        1 << 15,
        1 << 19,
        1 << 21,
    )


def test_neon_export_is_blocked_for_aarch64_caches():
    """The export takes its block sizes from the target's cache model, not from this machine."""
    from polyc.target import TARGETS

    kernel = polyc.define(MATMUL).f
    sizes = {"M": 300, "K": 300, "N": 300}
    exported = kernel.exported_c(sizes, "neon").c_source
    assert exported.endswith(kernel.stages(sizes, cache_sizes=TARGETS["neon"].cache_sizes).kernel.source)
    assert not exported.endswith(kernel.stages(sizes, cache_sizes=(1 << 16, 4 << 20, 64 << 20)).kernel.source)
    rng = np.random.default_rng(3)  # and a kernel blocked for other caches still computes the same
    a, b = rand(rng, (300, 300)), rand(rng, (300, 300))
    check(polyc.define(MATMUL, cache_sizes=(4096, 65536, 1 << 20)).f, (a, b), [a.astype(np.float64) @ b], 300)


@pytest.mark.parametrize(
    "entry, source, sizes",
    [
        (
            "tmm",
            "def tmm(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
            dict(M=96, N=256, K=64),
        ),
        (
            "mm",
            "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }",
            dict(M=96, N=256, K=64),
        ),
        (
            "conv",
            "def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B1) -> (O) {\n"
            "  O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)\n"
            "  O(n, f, h, w) = fmax(O(n, f, h, w) + B1(f), 0.0)\n}",
            dict(N=1, C=16, H=20, W=20, F=32, KH=3, KW=3),
        ),
    ],
    ids=["transposed-b", "matmul", "convolution"],
)
def test_the_avx512_path_compiles_on_any_x86_machine(entry, source, sizes, tmp_path):
    # An AVX2 machine cannot run the AVX-512 micro-kernels and register transposes, but it can
    # compile them: a change to the shared templates must not break the other instruction set.
    if subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout.strip() != "x86_64":
        pytest.skip("AVX-512 is an x86-64 instruction set")
    kernel = polyc.define(source, tuning=False)[entry]
    c_file = tmp_path / "kernel.c"
    c_file.write_text(kernel.c_source(sizes))
    for flags in ("-mavx512f -mavx512vl -mfma", "-mavx2 -mfma"):
        built = subprocess.run(
            [
                "gcc",
                "-O2",
                "-std=gnu11",
                "-fopenmp",
                "-Wall",
                "-Werror=implicit-function-declaration",
                *flags.split(),
                "-c",
                str(c_file),
                "-o",
                str(tmp_path / "kernel.o"),
            ],
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stderr[-2000:]
        symbols = subprocess.run(["nm", str(tmp_path / "kernel.o")], capture_output=True, text=True).stdout
        assert "polyc_" in symbols
        if entry == "conv":  # the direct kernel, and AVX2's unmasked blocks for whole vectors
            assert "polyc conv kernel" in c_file.read_text()
            assert ("polyc_conv_kernel_3_full" in symbols) == flags.startswith("-mavx2")


def test_row_blocks_shared_by_a_team_come_in_multiples_of_its_size(tmp_path):
    """Threads take shared row blocks in turn: a count that is not a multiple of the team leaves
    one thread computing the last block alone (512 rows in 126-row blocks: 5 blocks for 2
    threads).  polyc_team_step never makes the longest thread's share longer than
    polyc_balanced_step's, and for the sizes of that case makes every share equal."""
    import re

    from polyc.codegen.gemm import _COMMON

    # polyc_round_up, polyc_balanced_step and polyc_team_step, in this order in the C text
    functions = re.search(
        r"static int64_t polyc_round_up\(.*?static int64_t polyc_team_step\(.*?\n}\n", _COMMON, re.S
    ).group(0)
    program = tmp_path / "steps.c"
    program.write_text(
        "#include <stdint.h>\n#include <stdio.h>\n"
        "#define polyc_min(a, b) ((a) < (b) ? (a) : (b))\n#define polyc_max(a, b) ((a) > (b) ? (a) : (b))\n"
        + functions
        + "\nint main(void) {\n"
        "    for (int64_t total = 1; total <= 2100; total += total < 700 ? 7 : 1)\n"
        "        for (int64_t most = 6; most <= 300; most += 6)\n"
        "            for (int nthr = 1; nthr <= 4; nthr++)\n"
        "                if (total <= 700 || total == 2048 || total == 512)\n"
        "                    printf(\"%ld %ld %d %ld %ld\\n\", (long)total, (long)most, nthr,\n"
        "                           (long)polyc_balanced_step(total, most, 6),\n"
        "                           (long)polyc_team_step(total, most, 6, nthr));\n"
        "    return 0;\n}\n"
    )
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "steps"), str(program)], check=True, capture_output=True)
    output = subprocess.run([str(tmp_path / "steps")], capture_output=True, text=True, check=True).stdout

    def longest_share(total, step, nthr):  # rows of the thread that takes the most blocks
        blocks = -(-total // step)
        return min(total, -(-blocks // nthr) * step)

    for line in output.splitlines():
        total, most, nthr, balanced, team = map(int, line.split())
        assert team % 6 == 0 and team <= max(most, 6), line
        assert longest_share(total, team, nthr) <= longest_share(total, balanced, nthr), line
    for total, nthr, blocks in [(512, 2, 6), (2048, 2, 18)]:
        step = next(int(l.split()[4]) for l in output.splitlines() if l.split()[:3] == [str(total), "126", str(nthr)])
        assert -(-total // step) == blocks


@builds("native", "avx2", "portable")
def test_epilogue_over_several_n_indices(cflags):
    """A product by blocked weights, O(i, nb, nr), with a bias read at 10 * nb + nr and an
    activation: the epilogue runs along the runs of the block where only nr moves, blocks
    (tile sizes) cutting those runs anywhere."""
    source = """def blocked(float(M, K) A, float(NB, K, R) W, float(N) B) -> (O) {
        O(i, nb, nr) +=! A(i, r_k) * W(nb, r_k, nr)
        O(i, nb, nr) = fmax(O(i, nb, nr) + B(10 * nb + nr), 0.0)
    }"""
    rng = np.random.default_rng(12)
    a, w, bias = rand(rng, (37, 20)), rand(rng, (3, 20, 10)), rand(rng, (30,))
    expected = np.maximum(np.einsum("ik,bkr->ibr", a.astype(np.float64), w) + bias.reshape(3, 10), 0)
    for blocks in (None, (8, 7, 16)):
        options = dict(cflags=cflags) if blocks is None else dict(cflags=cflags, gemm_blocks=blocks)
        kernel = polyc.define(source, **options).blocked
        assert kernel.stages(dict(M=37, K=20, NB=3, R=10, N=30)).contraction.n == ("nb", "nr")
        check(kernel, (a, w, bias), [expected], 21)
