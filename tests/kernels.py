"""A corpus of TC kernels with random inputs and hand-written numpy references.

Every back end is tested against the same corpus: the reference interpreter now, compiled code
later.  An entry is a :class:`KernelCase`: TC source, the def to call, a function that makes
random inputs for a set of sizes, and a numpy reference written directly (never through polyc),
computing in float64 (int64 for integers) and rounding once to the output dtype.

    case = CASES["matmul"]
    kernel = polyc.define(case.source, backend="interpreter")[case.entry]
    for sizes in case.size_sets:
        check_kernel(case, kernel, sizes)

Tolerances are those TC's tests used: ``|error| <= ops * eps(dtype) * max|input|`` where ``ops``
is the reduction length (a small constant for elementwise kernels); see :func:`assert_close`.
Integer and bool outputs must match exactly.

Test files in ``tests/`` import this module as ``kernels`` (pytest puts their folder on
``sys.path``); from the repository root it is also ``tests.kernels``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import special

Sizes = Mapping[str, int]


# ----------------------------------------------------------------------------- the record
@dataclass(frozen=True)
class KernelCase:
    """One kernel of the corpus.

    - ``make_inputs(rng, sizes)`` returns the inputs in signature order (arrays, or numpy
      scalars for 0-d inputs).
    - ``reference(*inputs, *initial_outputs)`` returns the expected outputs in declared order,
      with the dtypes polyc must produce.
    - ``make_outputs(rng, sizes)``, when set, returns arrays passed as ``outputs=[...]``: the
      kernel accumulates into them (statements without ``!``); the reference receives copies.
    - ``ops(sizes)`` is the tolerance's operation count: one int, or one per output.
    - ``size_sets`` are the small problem sizes the kernel is tested at.
    """

    name: str
    source: str
    entry: str
    make_inputs: Callable[[np.random.Generator, Sizes], tuple]
    reference: Callable[..., tuple]
    size_sets: tuple[Sizes, ...]
    ops: Callable[[Sizes], int | tuple[int, ...]] = lambda sizes: 4
    tags: frozenset[str] = field(default_factory=frozenset)
    make_outputs: Callable[[np.random.Generator, Sizes], tuple] | None = None

    def __str__(self) -> str:
        return self.name


# ----------------------------------------------------------------------------- checking
def assert_close(actual, expected, ops: int, dtype, inputs=()) -> None:
    """Assert ``|actual - expected| <= ops * eps(dtype) * max|input|`` elementwise (TC's rule).

    ``max|input|`` is taken over the floating-point arrays of ``inputs`` (index arrays would
    only inflate it); without any, over ``expected``, and at least 1 when both are zero.  NaNs
    and infinities must occur at the same places.  Integer and bool dtypes must match exactly.
    """
    dtype = np.dtype(dtype)
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if dtype.kind in "biu":
        mismatch = actual != expected
        assert not np.any(mismatch), (
            f"{int(np.sum(mismatch))} element(s) differ; first at {np.argwhere(mismatch)[0].tolist()}: "
            f"{actual[mismatch][0]!r} != {expected[mismatch][0]!r}"
        )
        return
    actual64, expected64 = actual.astype(np.float64), expected.astype(np.float64)
    same_special = (np.isnan(actual64) & np.isnan(expected64)) | (np.isinf(expected64) & (actual64 == expected64))
    floats = [
        np.abs(np.asarray(x, dtype=np.float64))
        for x in inputs
        if np.asarray(x).dtype.kind == "f" and np.asarray(x).size
    ]
    finite_expected = np.abs(expected64[np.isfinite(expected64)])
    if floats:
        scale = max(float(np.max(x)) for x in floats)
    else:
        scale = float(np.max(finite_expected)) if finite_expected.size else 0.0
    scale = scale or 1.0
    tolerance = ops * np.finfo(dtype).eps * scale
    error = np.where(same_special, 0.0, np.abs(actual64 - expected64))
    error = np.where(np.isnan(error), np.inf, error)  # a NaN on one side only is a failure
    worst = float(np.max(error)) if error.size else 0.0
    if worst > tolerance:
        at = np.unravel_index(int(np.argmax(error)), error.shape)
        raise AssertionError(
            f"max error {worst:.3g} > tolerance {tolerance:.3g} "
            f"({ops} ops * eps({dtype.name}) * {scale:.3g}); at {list(at)}: "
            f"got {actual64[at]!r}, expected {expected64[at]!r}"
        )


def case_inputs(case: KernelCase, sizes: Sizes, seed: int = 0) -> tuple[tuple, tuple | None]:
    """The inputs and the initial outputs (or None) of ``case`` for ``sizes``, from ``seed``."""
    rng = np.random.default_rng(seed)
    inputs = tuple(case.make_inputs(rng, sizes))
    outputs = tuple(case.make_outputs(rng, sizes)) if case.make_outputs else None
    return inputs, outputs


def check_kernel(case: KernelCase, kernel: Callable, sizes: Sizes, seed: int = 0) -> None:
    """Run ``kernel`` (a polyc Kernel, or any callable with its calling convention) on random
    inputs for ``sizes`` and compare every output with the reference; also check that the
    inputs were left untouched and that caller-supplied outputs were updated in place."""
    inputs, initial = case_inputs(case, sizes, seed)
    input_copies = [np.array(x, copy=True) for x in inputs]
    expected = case.reference(*inputs, *(np.array(o, copy=True) for o in initial or ()))
    if initial is None:
        result = kernel(*inputs)
    else:
        result = kernel(*inputs, outputs=list(initial))
    actual = result if isinstance(result, tuple) else (result,)
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    if initial is not None:
        assert all(a is o for a, o in zip(actual, initial, strict=True)), "outputs= arrays must be returned"
    for position, (got, want) in enumerate(zip(actual, expected, strict=True)):
        want = np.asarray(want)
        assert np.asarray(got).dtype == want.dtype, (
            f"{case.name} output {position}: dtype {np.asarray(got).dtype} != {want.dtype}"
        )
        ops = case.ops(sizes)
        ops = ops[position] if isinstance(ops, tuple) else ops
        try:
            assert_close(got, want, ops, want.dtype, inputs)
        except AssertionError as failure:
            raise AssertionError(f"{case.name} output {position} at sizes {dict(sizes)}: {failure}") from None
    for position, (before, after) in enumerate(zip(input_copies, inputs, strict=True)):
        np.testing.assert_array_equal(np.asarray(after), before, err_msg=f"{case.name}: input {position} was modified")


# ----------------------------------------------------------------------------- input helpers
def uniform(rng: np.random.Generator, shape, lo: float = -1.0, hi: float = 1.0, dtype=np.float32):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def integers(rng: np.random.Generator, shape, lo: int, hi: int, dtype=np.int32):
    """Integers in [lo, hi)."""
    return rng.integers(lo, hi, size=shape).astype(dtype)


def f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def _conv2d(image, weights, stride: int = 1):
    """Valid cross-correlation: O[n,f,h,w] = sum_{c,kh,kw} I[n,c,s*h+kh,s*w+kw] * W[f,c,kh,kw]."""
    n, c, h, w = image.shape
    f, _, kh, kw = weights.shape
    out_h, out_w = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, f, out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            patch = image[:, :, i : i + stride * (out_h - 1) + 1 : stride, j : j + stride * (out_w - 1) + 1 : stride]
            out += np.einsum("nchw,fc->nfhw", patch, weights[:, :, i, j])
    return out


def _windows(image, k: int, stride: int):
    """All k x k windows of the last two axes at ``stride``: shape (..., out_h, out_w, k, k)."""
    h, w = image.shape[-2:]
    out_h, out_w = (h - k) // stride + 1, (w - k) // stride + 1
    windows = np.empty(image.shape[:-2] + (out_h, out_w, k, k), dtype=image.dtype)
    for i in range(k):
        for j in range(k):
            windows[..., i, j] = image[
                ..., i : i + stride * (out_h - 1) + 1 : stride, j : j + stride * (out_w - 1) + 1 : stride
            ]
    return windows


# ----------------------------------------------------------------------------- the corpus
KERNELS: list[KernelCase] = []


def kernel(name: str, source: str, *, sizes, ops=None, tags=(), entry: str | None = None, outputs=None):
    """Register a case whose ``make_inputs`` and ``reference`` are given as a pair:
    ``@kernel(...)`` decorates a function returning ``(make_inputs, reference)``."""

    def register(build):
        make_inputs, reference = build()
        KERNELS.append(
            KernelCase(
                name=name,
                source=source,
                entry=entry or name,
                make_inputs=make_inputs,
                reference=reference,
                size_sets=tuple(sizes),
                ops=ops if ops is not None else (lambda s: 4),
                tags=frozenset(tags),
                make_outputs=outputs,
            )
        )
        return build

    return register


# --- linear algebra ---------------------------------------------------------------------------
@kernel(
    "matmul",
    """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}""",
    sizes=[dict(M=5, K=7, N=3), dict(M=1, K=1, N=1), dict(M=8, K=16, N=6)],
    ops=lambda s: s["K"],
    tags={"contraction"},
)
def _matmul():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["K"])), uniform(rng, (s["K"], s["N"]))),
        lambda A, B: (_f32(np.matmul(*f64(A, B))),),
    )


@kernel(
    "matmul_at_b",
    """
def matmul_at_b(float(K, M) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(r_k, m) * B(r_k, n)
}""",
    sizes=[dict(M=4, K=6, N=5), dict(M=7, K=3, N=2)],
    ops=lambda s: s["K"],
    tags={"contraction"},
)
def _matmul_at_b():
    return (
        lambda rng, s: (uniform(rng, (s["K"], s["M"])), uniform(rng, (s["K"], s["N"]))),
        lambda A, B: (_f32(f64(A)[0].T @ f64(B)[0]),),
    )


@kernel(
    "tmm",
    """
# TC's tmm benchmark: C = A * B^T
def tmm(float(M, K) A, float(N, K) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(n, r_k)
}""",
    sizes=[dict(M=4, K=6, N=5), dict(M=3, K=9, N=1)],
    ops=lambda s: s["K"],
    tags={"contraction"},
)
def _tmm():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["K"])), uniform(rng, (s["N"], s["K"]))),
        lambda A, B: (_f32(f64(A)[0] @ f64(B)[0].T),),
    )


@kernel(
    "batch_matmul",
    """
def batch_matmul(float(B, N, M) X, float(B, M, K) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, r_m) * Y(b, r_m, k)
}""",
    sizes=[dict(B=3, N=4, M=5, K=2), dict(B=1, N=2, M=8, K=3)],
    ops=lambda s: s["M"],
    tags={"contraction"},
)
def _batch_matmul():
    return (
        lambda rng, s: (uniform(rng, (s["B"], s["N"], s["M"])), uniform(rng, (s["B"], s["M"], s["K"]))),
        lambda X, Y: (_f32(np.matmul(*f64(X, Y))),),
    )


@kernel(
    "tbmm",
    """
# TC's tbmm benchmark: batched A * B^T
def tbmm(float(B, N, M) X, float(B, K, M) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, r_m) * Y(b, k, r_m)
}""",
    sizes=[dict(B=2, N=3, M=6, K=4), dict(B=4, N=1, M=3, K=2)],
    ops=lambda s: s["M"],
    tags={"contraction"},
)
def _tbmm():
    return (
        lambda rng, s: (uniform(rng, (s["B"], s["N"], s["M"])), uniform(rng, (s["B"], s["K"], s["M"]))),
        lambda X, Y: (_f32(np.einsum("bnm,bkm->bnk", *f64(X, Y))),),
    )


@kernel(
    "matvec",
    """
def matvec(float(M, N) A, float(N) x) -> (y) {
    y(m) +=! A(m, r_n) * x(r_n)
}""",
    sizes=[dict(M=6, N=9), dict(M=1, N=4)],
    ops=lambda s: s["N"],
    tags={"contraction"},
)
def _matvec():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["N"])), uniform(rng, (s["N"],))),
        lambda A, x: (_f32(f64(A)[0] @ f64(x)[0]),),
    )


@kernel(
    "dot",
    """
def dot(float(N) A, float(N) B) -> (C) {
    C +=! A(r_i) * B(r_i)
}""",
    sizes=[dict(N=17), dict(N=1)],
    ops=lambda s: s["N"],
    tags={"contraction", "0-d"},
)
def _dot():
    return (lambda rng, s: (uniform(rng, (s["N"],)), uniform(rng, (s["N"],))), lambda A, B: (_f32(np.dot(*f64(A, B))),))


@kernel(
    "sum_all",
    """
def sum_all(float(M, N) A) -> (C) {
    C() +=! A(r_i, r_j)
}""",
    sizes=[dict(M=5, N=7), dict(M=1, N=3)],
    ops=lambda s: s["M"] * s["N"],
    tags={"reduction", "0-d"},
)
def _sum_all():
    return (lambda rng, s: (uniform(rng, (s["M"], s["N"])),), lambda A: (_f32(np.sum(f64(A)[0])),))


@kernel(
    "outer",
    """
def outer(float(M) a, float(N) b) -> (C) {
    C(i, j) = a(i) * b(j)
}""",
    sizes=[dict(M=4, N=6), dict(M=1, N=2)],
    ops=lambda s: 1,
    tags={"elementwise"},
)
def _outer():
    return (
        lambda rng, s: (uniform(rng, (s["M"],)), uniform(rng, (s["N"],))),
        lambda a, b: (_f32(np.outer(*f64(a, b))),),
    )


@kernel(
    "tensordot",
    """
# TC's tensordot benchmark
def tensordot(float(N, C1, C2, H, W) I0, float(N, C2, C3, H, W) I1) -> (O) {
    O(n, c1, c3, h, w) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, c3, h, w)
}""",
    sizes=[dict(N=2, C1=3, C2=4, C3=2, H=3, W=2), dict(N=1, C1=1, C2=5, C3=3, H=1, W=4)],
    ops=lambda s: s["C2"],
    tags={"contraction"},
)
def _tensordot():
    return (
        lambda rng, s: (
            uniform(rng, (s["N"], s["C1"], s["C2"], s["H"], s["W"])),
            uniform(rng, (s["N"], s["C2"], s["C3"], s["H"], s["W"])),
        ),
        lambda I0, I1: (_f32(np.einsum("nabhw,nbchw->nachw", *f64(I0, I1))),),
    )


@kernel(
    "kronecker3_1",
    """
# TC's Kronecker benchmark, first step: X times W2 along the last mode
def kronecker3_1(float(D2, N2) W2, float(M, N0, N1, N2) X) -> (XW2) {
    XW2(m, n0, n1, d2) +=! X(m, n0, n1, r_n2) * W2(d2, r_n2)
}""",
    sizes=[dict(D2=3, N2=4, M=2, N0=3, N1=2), dict(D2=1, N2=5, M=1, N0=2, N1=3)],
    ops=lambda s: s["N2"],
    tags={"contraction"},
)
def _kronecker3_1():
    return (
        lambda rng, s: (uniform(rng, (s["D2"], s["N2"])), uniform(rng, (s["M"], s["N0"], s["N1"], s["N2"]))),
        lambda W2, X: (_f32(np.einsum("mabk,dk->mabd", *f64(X, W2))),),
    )


@kernel(
    "kronecker3",
    """
# The three Kronecker steps in one def, the intermediate products as temporaries
def kronecker3(float(D0, N0) W0, float(D1, N1) W1, float(D2, N2) W2, float(M, N0, N1, N2) X) -> (Y) {
    XW2(m, n0, n1, d2)   +=! X(m, n0, n1, r_n2) * W2(d2, r_n2)
    XW2W1(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1)
    Y(m, d0, d1, d2)     +=! XW2W1(m, r_n0, d1, d2) * W0(d0, r_n0)
}""",
    sizes=[dict(D0=2, N0=3, D1=3, N1=2, D2=2, N2=4, M=2), dict(D0=1, N0=2, D1=2, N1=3, D2=3, N2=2, M=3)],
    ops=lambda s: s["N0"] * s["N1"] * s["N2"],
    tags={"contraction", "temporaries"},
)
def _kronecker3():
    def reference(W0, W1, W2, X):
        W0, W1, W2, X = f64(W0, W1, W2, X)
        return (_f32(np.einsum("mabc,xa,yb,zc->mxyz", X, W0, W1, W2)),)

    return (
        lambda rng, s: (
            uniform(rng, (s["D0"], s["N0"])),
            uniform(rng, (s["D1"], s["N1"])),
            uniform(rng, (s["D2"], s["N2"])),
            uniform(rng, (s["M"], s["N0"], s["N1"], s["N2"])),
        ),
        reference,
    )


@kernel(
    "axpy",
    """
def axpy(float alpha, float(N) X, float(N) Y) -> (Z) {
    Z(i) = alpha * X(i) + Y(i)
}""",
    sizes=[dict(N=11), dict(N=1)],
    ops=lambda s: 2,
    tags={"elementwise", "scalar-input"},
)
def _axpy():
    return (
        lambda rng, s: (np.float32(rng.uniform(-2, 2)), uniform(rng, (s["N"],)), uniform(rng, (s["N"],))),
        lambda alpha, X, Y: (_f32(np.float64(alpha) * f64(X)[0] + f64(Y)[0]),),
    )


@kernel(
    "symmetrize_trace",
    """
# float(N, N): a size used twice; two outputs
def symmetrize_trace(float(N, N) A) -> (S, T) {
    S(i, j) = (A(i, j) + A(j, i)) * 0.5
    T +=! A(r_i, r_i)
}""",
    sizes=[dict(N=5), dict(N=1)],
    ops=lambda s: (2, s["N"]),
    tags={"multi-output", "0-d"},
)
def _symmetrize_trace():
    def reference(A):
        A = f64(A)[0]
        return _f32((A + A.T) * 0.5), _f32(np.trace(A))

    return lambda rng, s: (uniform(rng, (s["N"], s["N"])),), reference


# --- neural network layers --------------------------------------------------------------------
@kernel(
    "fcrelu",
    """
# TC's fully connected layer: one output written by three statements
def fcrelu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, r_m) * W1(n, r_m)
    O1(b, n)  =  O1(b, n) + B1(n)
    O1(b, n)  =  fmax(O1(b, n), 0)
}""",
    sizes=[dict(B=4, M=8, N=5), dict(B=1, M=3, N=2)],
    ops=lambda s: s["M"] + 1,
    tags={"nn", "multi-statement"},
)
def _fcrelu():
    def reference(I, W1, B1):
        I, W1, B1 = f64(I, W1, B1)
        return (_f32(np.maximum(I @ W1.T + B1, 0)),)

    return (
        lambda rng, s: (uniform(rng, (s["B"], s["M"])), uniform(rng, (s["N"], s["M"])), uniform(rng, (s["N"],))),
        reference,
    )


@kernel(
    "mlp2",
    """
def mlp2(float(B, M) I, float(N, M) W1, float(N) B1, float(P, N) W2, float(P) B2) -> (O2) {
    H1(b, n) +=! I(b, r_m) * W1(n, r_m)
    A1(b, n)  =  fmax(H1(b, n) + B1(n), 0)
    O2(b, p) +=! A1(b, r_n) * W2(p, r_n)
    O2(b, p)  =  O2(b, p) + B2(p)
}""",
    sizes=[dict(B=3, M=6, N=5, P=4), dict(B=2, M=2, N=7, P=1)],
    ops=lambda s: s["M"] * s["N"],
    tags={"nn", "temporaries"},
)
def _mlp2():
    def reference(I, W1, B1, W2, B2):
        I, W1, B1, W2, B2 = f64(I, W1, B1, W2, B2)
        hidden = np.maximum(I @ W1.T + B1, 0)
        return (_f32(hidden @ W2.T + B2),)

    return (
        lambda rng, s: (
            uniform(rng, (s["B"], s["M"])),
            uniform(rng, (s["N"], s["M"])),
            uniform(rng, (s["N"],)),
            uniform(rng, (s["P"], s["N"])),
            uniform(rng, (s["P"],)),
        ),
        reference,
    )


@kernel(
    "syr2k",
    """
# PolyBench's syr2k in float: a guarded (triangular) sum of two scaled products
def syr2k(float alpha, float beta, float(N, N) C, float(N, M) A, float(N, M) B) -> (Cout) {
    Cout(i, j) = j <= i ? beta * C(i, j) : C(i, j) where i in 0:N, j in 0:N
    Cout(i, j) += j <= i ? A(j, r_k) * alpha * B(i, r_k) + B(j, r_k) * alpha * A(i, r_k) : 0
        where i in 0:N, j in 0:N, r_k in 0:M
}""",
    sizes=[dict(N=5, M=3), dict(N=1, M=2), dict(N=9, M=8)],
    ops=lambda s: 2 * s["M"] + 4,
    tags={"contraction", "temporaries"},
)
def _syr2k():
    def reference(alpha, beta, C, A, B):
        alpha, beta, C, A, B = f64(alpha, beta, C, A, B)
        full = alpha * (B @ A.T + A @ B.T) + beta * C
        return (_f32(np.where(np.tri(len(C), dtype=bool), full, C)),)

    return (
        lambda rng, s: (
            uniform(rng, ()),
            uniform(rng, ()),
            uniform(rng, (s["N"], s["N"])),
            uniform(rng, (s["N"], s["M"])),
            uniform(rng, (s["N"], s["M"])),
        ),
        reference,
    )


@kernel(
    "atax",
    """
# PolyBench's atax in float: a matrix-vector product by rows, then one by columns
def atax(float(M, N) A, float(N) x) -> (y) {
    tmp(i) +=! A(i, r_j) * x(r_j)
    y(j) +=! A(r_i, j) * tmp(r_i)
}""",
    sizes=[dict(M=5, N=7), dict(M=1, N=1), dict(M=37, N=19)],
    ops=lambda s: s["M"] * s["N"],
    tags={"contraction", "temporaries"},
)
def _atax():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["N"])), uniform(rng, (s["N"],))),
        lambda A, x: (_f32(f64(A)[0].T @ (f64(A)[0] @ f64(x)[0])),),
    )


@kernel(
    "gesummv",
    """
# PolyBench's gesummv in float: two matrix-vector products and an epilogue combining them
def gesummv(float alpha, float beta, float(N, N) A, float(N, N) B, float(N) x) -> (y) {
    tmp(i) +=! A(i, r_j) * x(r_j)
    y(i) +=! B(i, r_j) * x(r_j)
    y(i) = alpha * tmp(i) + beta * y(i)
}""",
    sizes=[dict(N=6), dict(N=1), dict(N=23)],
    ops=lambda s: s["N"] + 4,
    tags={"contraction", "temporaries"},
)
def _gesummv():
    def reference(alpha, beta, A, B, x):
        alpha, beta, A, B, x = f64(alpha, beta, A, B, x)
        return (_f32(alpha * (A @ x) + beta * (B @ x)),)

    return (
        lambda rng, s: (
            uniform(rng, ()),
            uniform(rng, ()),
            uniform(rng, (s["N"], s["N"])),
            uniform(rng, (s["N"], s["N"])),
            uniform(rng, (s["N"],)),
        ),
        reference,
    )


def _conv_inputs(rng, s):
    return (uniform(rng, (s["N"], s["C"], s["H"], s["W"])), uniform(rng, (s["F"], s["C"], s["KH"], s["KW"])))


@kernel(
    "conv2d",
    """
def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
}""",
    sizes=[dict(N=2, C=3, H=6, W=5, F=2, KH=3, KW=2), dict(N=1, C=1, H=3, W=3, F=1, KH=3, KW=3)],
    ops=lambda s: s["C"] * s["KH"] * s["KW"],
    tags={"nn", "conv"},
)
def _conv2d_case():
    return _conv_inputs, lambda I, W1: (_f32(_conv2d(*f64(I, W1))),)


@kernel(
    "conv2d_stride2",
    """
def conv2d_stride2(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 2 * w + r_kw) * W1(f, r_c, r_kh, r_kw)
}""",
    sizes=[dict(N=2, C=2, H=7, W=8, F=3, KH=3, KW=2), dict(N=1, C=3, H=4, W=3, F=2, KH=2, KW=3)],
    ops=lambda s: s["C"] * s["KH"] * s["KW"],
    tags={"nn", "conv", "strided"},
)
def _conv2d_stride2():
    return _conv_inputs, lambda I, W1: (_f32(_conv2d(*f64(I, W1), stride=2)),)


@kernel(
    "group_conv",
    """
# TC's group convolution with bias
def group_conv(float(N, G, C, H, W) I, float(G, F, C, KH, KW) W1, float(G, F) B) -> (O) {
    O(n, g, f, h, w) +=! I(n, g, r_c, h + r_kh, w + r_kw) * W1(g, f, r_c, r_kh, r_kw)
    O(n, g, f, h, w)  =  O(n, g, f, h, w) + B(g, f)
}""",
    sizes=[dict(N=2, G=2, C=3, H=5, W=4, F=2, KH=2, KW=3), dict(N=1, G=3, C=1, H=3, W=3, F=1, KH=1, KW=1)],
    ops=lambda s: s["C"] * s["KH"] * s["KW"] + 1,
    tags={"nn", "conv"},
)
def _group_conv():
    def reference(I, W1, B):
        I, W1, B = f64(I, W1, B)
        groups = [_conv2d(I[:, g], W1[g]) for g in range(I.shape[1])]
        return (_f32(np.stack(groups, axis=1) + B[None, :, :, None, None]),)

    return (
        lambda rng, s: (
            uniform(rng, (s["N"], s["G"], s["C"], s["H"], s["W"])),
            uniform(rng, (s["G"], s["F"], s["C"], s["KH"], s["KW"])),
            uniform(rng, (s["G"], s["F"])),
        ),
        reference,
    )


@kernel(
    "depthwise_conv",
    """
def depthwise_conv(float(N, C, H, W) I, float(C, KH, KW) W1) -> (O) {
    O(n, c, h, w) +=! I(n, c, h + r_kh, w + r_kw) * W1(c, r_kh, r_kw)
}""",
    sizes=[dict(N=2, C=3, H=6, W=5, KH=3, KW=3), dict(N=1, C=2, H=2, W=4, KH=2, KW=1)],
    ops=lambda s: s["KH"] * s["KW"],
    tags={"nn", "conv"},
)
def _depthwise_conv():
    def reference(I, W1):
        I, W1 = f64(I, W1)
        channels = [_conv2d(I[:, c : c + 1], W1[c][None, None]) for c in range(I.shape[1])]
        return (_f32(np.concatenate(channels, axis=1)),)

    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])), uniform(rng, (s["C"], s["KH"], s["KW"]))),
        reference,
    )


@kernel(
    "conv1x1",
    """
def conv1x1(float(N, C, H, W) I, float(F, C) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h, w) * W1(f, r_c)
}""",
    sizes=[dict(N=2, C=5, H=3, W=4, F=3), dict(N=1, C=1, H=1, W=1, F=1)],
    ops=lambda s: s["C"],
    tags={"nn", "conv"},
)
def _conv1x1():
    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])), uniform(rng, (s["F"], s["C"]))),
        lambda I, W1: (_f32(np.einsum("nchw,fc->nfhw", *f64(I, W1))),),
    )


@kernel(
    "conv2d_same_pad",
    """
# 3x3 "same" convolution: the zero padding is a ternary guard around the image access
def conv2d_same_pad(float(N, C, H, W) I, float(F, C, 3, 3) W1) -> (O) {
    O(n, f, h, w) +=! W1(f, r_c, r_kh, r_kw) *
        ((h + r_kh - 1 >= 0 && h + r_kh - 1 < H && w + r_kw - 1 >= 0 && w + r_kw - 1 < W)
            ? I(n, r_c, h + r_kh - 1, w + r_kw - 1) : 0)
        where n in 0:N, h in 0:H, w in 0:W
}""",
    sizes=[dict(N=2, C=2, H=5, W=4, F=3), dict(N=1, C=1, H=1, W=2, F=1)],
    ops=lambda s: 9 * s["C"],
    tags={"nn", "conv", "ternary", "constant-sizes"},
)
def _conv2d_same_pad():
    def reference(I, W1):
        I, W1 = f64(I, W1)
        padded = np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1)))
        return (_f32(_conv2d(padded, W1)),)

    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])), uniform(rng, (s["F"], s["C"], 3, 3))),
        reference,
    )


@kernel(
    "maxpool2x2",
    """
def maxpool2x2(float(N, C, H, W) I) -> (O) {
    O(n, c, h, w) max=! I(n, c, 2 * h + r_kh, 2 * w + r_kw) where r_kh in 0:2, r_kw in 0:2
}""",
    sizes=[dict(N=2, C=3, H=6, W=7), dict(N=1, C=1, H=2, W=3)],
    ops=lambda s: 1,
    tags={"nn", "pooling", "strided"},
)
def _maxpool():
    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])),),
        lambda I: (np.max(_windows(I, 2, 2), axis=(-2, -1)).astype(np.float32),),
    )


@kernel(
    "avgpool3x3s2",
    """
def avgpool3x3s2(float(N, C, H, W) I) -> (O) {
    S(n, c, h, w) +=! I(n, c, 2 * h + r_kh, 2 * w + r_kw) where r_kh in 0:3, r_kw in 0:3
    O(n, c, h, w)  =  S(n, c, h, w) / 9
}""",
    sizes=[dict(N=2, C=2, H=7, W=8), dict(N=1, C=1, H=3, W=4)],
    ops=lambda s: 10,
    tags={"nn", "pooling", "strided", "temporaries"},
)
def _avgpool():
    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])),),
        lambda I: (_f32(np.mean(_windows(f64(I)[0], 3, 2), axis=(-2, -1))),),
    )


@kernel(
    "global_avgpool",
    """
# the extents I.2, I.3 give the window size
def global_avgpool(float(N, C, H, W) I) -> (O) {
    S(n, c) +=! I(n, c, r_h, r_w)
    O(n, c)  =  S(n, c) / (I.2 * I.3)
}""",
    sizes=[dict(N=2, C=3, H=4, W=5), dict(N=1, C=2, H=1, W=1)],
    ops=lambda s: s["H"] * s["W"] + 1,
    tags={"nn", "pooling", "extents"},
)
def _global_avgpool():
    return (
        lambda rng, s: (uniform(rng, (s["N"], s["C"], s["H"], s["W"])),),
        lambda I: (_f32(np.mean(f64(I)[0], axis=(2, 3))),),
    )


@kernel(
    "softmax",
    """
def softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, r_d)
    expDistance(n, d) = exp(I(n, d) - maxVal(n))
    expSum(n) +=! expDistance(n, r_d)
    O(n, d) = expDistance(n, d) / expSum(n)
}""",
    sizes=[dict(N=4, D=9), dict(N=1, D=1), dict(N=3, D=2)],
    ops=lambda s: s["D"] + 4,
    tags={"nn", "temporaries", "normalization"},
)
def _softmax():
    def reference(I):
        I = f64(I)[0]
        e = np.exp(I - I.max(axis=1, keepdims=True))
        return (_f32(e / e.sum(axis=1, keepdims=True)),)

    return lambda rng, s: (uniform(rng, (s["N"], s["D"]), -5, 5),), reference


@kernel(
    "log_softmax",
    """
def log_softmax(float(N, D) I) -> (O) {
    mx(n) max=! I(n, r_d)
    s(n) +=! exp(I(n, r_d) - mx(n))
    O(n, d) = I(n, d) - mx(n) - log(s(n))
}""",
    sizes=[dict(N=3, D=8), dict(N=2, D=1)],
    ops=lambda s: s["D"] + 4,
    tags={"nn", "temporaries"},
)
def _log_softmax():
    def reference(I):
        I = f64(I)[0]
        shifted = I - I.max(axis=1, keepdims=True)
        return (_f32(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))),)

    return lambda rng, s: (uniform(rng, (s["N"], s["D"]), -3, 3),), reference


@kernel(
    "layernorm",
    """
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    s(n) +=! X(n, r_d)
    mu(n) = s(n) / X.1
    v(n) +=! (X(n, r_d) - mu(n)) * (X(n, r_d) - mu(n))
    rstd(n) = rsqrt(v(n) / D + 1e-5)
    Y(n, d) = (X(n, d) - mu(n)) * rstd(n) * gamma(d) + beta(d)
}""",
    sizes=[dict(N=3, D=16), dict(N=2, D=3)],
    ops=lambda s: 2 * s["D"] + 8,
    tags={"nn", "temporaries", "normalization", "extents"},
)
def _layernorm():
    def reference(X, gamma, beta):
        X, gamma, beta = f64(X, gamma, beta)
        mu = X.mean(axis=1, keepdims=True)
        var = ((X - mu) ** 2).mean(axis=1, keepdims=True)
        return (_f32((X - mu) / np.sqrt(var + 1e-5) * gamma + beta),)

    return (
        lambda rng, s: (uniform(rng, (s["N"], s["D"])), uniform(rng, (s["D"],)), uniform(rng, (s["D"],))),
        reference,
    )


@kernel(
    "batchnorm_inference",
    """
def batchnorm_inference(float(N, C, H, W) I, float(C) mean, float(C) var, float(C) gamma, float(C) beta)
    -> (O)
{
    O(n, c, h, w) = (I(n, c, h, w) - mean(c)) * rsqrt(var(c) + 1e-5) * gamma(c) + beta(c)
}""",
    sizes=[dict(N=2, C=3, H=4, W=3), dict(N=1, C=1, H=1, W=2)],
    ops=lambda s: 8,
    tags={"nn", "normalization", "elementwise"},
)
def _batchnorm_inference():
    def reference(I, mean, var, gamma, beta):
        I, mean, var, gamma, beta = (
            a if a.ndim == 4 else a[None, :, None, None] for a in f64(I, mean, var, gamma, beta)
        )
        return (_f32((I - mean) / np.sqrt(var + 1e-5) * gamma + beta),)

    return (
        lambda rng, s: (
            uniform(rng, (s["N"], s["C"], s["H"], s["W"])),
            uniform(rng, (s["C"],)),
            uniform(rng, (s["C"],), 0.5, 1.5),
            uniform(rng, (s["C"],)),
            uniform(rng, (s["C"],)),
        ),
        reference,
    )


@kernel(
    "batchnorm_train",
    """
# training mode: the batch statistics are outputs too
def batchnorm_train(float(N, C, H, W) I, float(C) gamma, float(C) beta) -> (O, mean, var) {
    total(c) +=! I(r_n, c, r_h, r_w)
    mean(c)   =  total(c) / (N * H * W)
    sq(c)    +=! (I(r_n, c, r_h, r_w) - mean(c)) * (I(r_n, c, r_h, r_w) - mean(c))
    var(c)    =  sq(c) / (N * H * W)
    O(n, c, h, w) = (I(n, c, h, w) - mean(c)) * rsqrt(var(c) + 1e-5) * gamma(c) + beta(c)
}""",
    sizes=[dict(N=3, C=2, H=3, W=4), dict(N=2, C=1, H=2, W=1)],
    ops=lambda s: 2 * s["N"] * s["H"] * s["W"] + 8,
    tags={"nn", "normalization", "multi-output"},
)
def _batchnorm_train():
    def reference(I, gamma, beta):
        I, gamma, beta = f64(I, gamma, beta)
        mean = I.mean(axis=(0, 2, 3))
        var = I.var(axis=(0, 2, 3))
        bc = lambda v: v[None, :, None, None]  # noqa: E731
        out = (I - bc(mean)) / np.sqrt(bc(var) + 1e-5) * bc(gamma) + bc(beta)
        return _f32(out), _f32(mean), _f32(var)

    return (
        lambda rng, s: (
            uniform(rng, (s["N"], s["C"], s["H"], s["W"])),
            uniform(rng, (s["C"],)),
            uniform(rng, (s["C"],)),
        ),
        reference,
    )


@kernel(
    "groupnorm",
    """
def groupnorm(float(N, G, D, H, W) I, float(G, D) gamma, float(G, D) beta) -> (O) {
    s(n, g) +=! I(n, g, r_d, r_h, r_w)
    mu(n, g) = s(n, g) / (D * H * W)
    ss(n, g) +=! (I(n, g, r_d, r_h, r_w) - mu(n, g)) * (I(n, g, r_d, r_h, r_w) - mu(n, g))
    O(n, g, d, h, w) = gamma(g, d) * (I(n, g, d, h, w) - mu(n, g))
        * rsqrt(ss(n, g) / (D * H * W) + 1e-5) + beta(g, d)
}""",
    sizes=[dict(N=2, G=2, D=3, H=2, W=3), dict(N=1, G=3, D=2, H=1, W=2)],
    ops=lambda s: 2 * s["D"] * s["H"] * s["W"] + 8,
    tags={"nn", "normalization", "temporaries"},
)
def _groupnorm():
    def reference(I, gamma, beta):
        I, gamma, beta = f64(I, gamma, beta)
        mu = I.mean(axis=(2, 3, 4), keepdims=True)
        var = I.var(axis=(2, 3, 4), keepdims=True)
        return (_f32(gamma[None, :, :, None, None] * (I - mu) / np.sqrt(var + 1e-5) + beta[None, :, :, None, None]),)

    return (
        lambda rng, s: (
            uniform(rng, (s["N"], s["G"], s["D"], s["H"], s["W"])),
            uniform(rng, (s["G"], s["D"])),
            uniform(rng, (s["G"], s["D"])),
        ),
        reference,
    )


@kernel(
    "gelu",
    """
def gelu(float(N, M) X) -> (Y) {
    Y(i, j) = 0.5 * X(i, j) * (1 + erf(X(i, j) * 0.7071067811865476))
}""",
    sizes=[dict(N=4, M=6), dict(N=1, M=1)],
    ops=lambda s: 8,
    tags={"nn", "elementwise", "math"},
)
def _gelu():
    def reference(X):
        X = f64(X)[0]
        return (_f32(0.5 * X * (1 + special.erf(X / np.sqrt(2)))),)

    return lambda rng, s: (uniform(rng, (s["N"], s["M"]), -3, 3),), reference


@kernel(
    "activations",
    """
# an elementwise chain: sigmoid by formula, tanh, softplus, and a let-bound intermediate
def activations(float(N) X) -> (Sig, Th, Swish, Softplus) {
    Sig(i) = 1 / (1 + exp(-X(i)))
    Th(i) = tanh(X(i)) * 2 - 1
    Swish(i) = X(i) * Sig(i)
    Softplus(i) = log(1 + exp(x)) where x = X(i)
}""",
    sizes=[dict(N=13), dict(N=1)],
    ops=lambda s: 8,
    tags={"elementwise", "math", "multi-output"},
)
def _activations():
    def reference(X):
        X = f64(X)[0]
        sig = 1 / (1 + np.exp(-X))
        return _f32(sig), _f32(np.tanh(X) * 2 - 1), _f32(X * sig), _f32(np.log1p(np.exp(X)))

    return lambda rng, s: (uniform(rng, (s["N"],), -4, 4),), reference


# --- gathers, permutations, stencils ----------------------------------------------------------
@kernel(
    "embedding_bag",
    """
# a data-dependent gather: sum the embeddings of L indices per bag
def embedding_bag(float(E, D) LUT, int32(B, L) I) -> (O) {
    O(b, d) +=! LUT(I(b, r_l), d)
}""",
    sizes=[dict(E=10, D=4, B=3, L=5), dict(E=1, D=2, B=2, L=1)],
    ops=lambda s: s["L"],
    tags={"gather"},
)
def _embedding_bag():
    return (
        lambda rng, s: (uniform(rng, (s["E"], s["D"])), integers(rng, (s["B"], s["L"]), 0, s["E"])),
        lambda LUT, I: (_f32(f64(LUT)[0][I].sum(axis=1)),),
    )


@kernel(
    "take_along_axis",
    """
def take_along_axis(float(N, M) A, int64(N, K) I) -> (O) {
    O(i, k) = A(i, I(i, k))
}""",
    sizes=[dict(N=4, M=6, K=3), dict(N=1, M=1, K=4)],
    ops=lambda s: 1,
    tags={"gather"},
)
def _take_along_axis():
    return (
        lambda rng, s: (uniform(rng, (s["N"], s["M"])), integers(rng, (s["N"], s["K"]), 0, s["M"], np.int64)),
        lambda A, I: (np.take_along_axis(A, I, axis=1),),
    )


@kernel(
    "permute",
    """
def permute(float(P, Q, R, S) X, float(P, Q) M) -> (Y, T) {
    Y(s, p, r, q) = X(p, q, r, s)
    T(q, p) = M(p, q)
}""",
    sizes=[dict(P=2, Q=3, R=4, S=5), dict(P=1, Q=2, R=1, S=1)],
    ops=lambda s: 1,
    tags={"elementwise", "multi-output"},
)
def _permute():
    return (
        lambda rng, s: (uniform(rng, (s["P"], s["Q"], s["R"], s["S"])), uniform(rng, (s["P"], s["Q"]))),
        lambda X, M: (np.ascontiguousarray(X.transpose(3, 0, 2, 1)), np.ascontiguousarray(M.T)),
    )


@kernel(
    "blur3x3",
    """
# constant sizes in the signature
def blur3x3(float(H, W) I, float(3, 3) K) -> (O) {
    O(h, w) +=! I(h + r_i, w + r_j) * K(r_i, r_j)
}""",
    sizes=[dict(H=6, W=5), dict(H=3, W=3)],
    ops=lambda s: 9,
    tags={"conv", "constant-sizes"},
)
def _blur3x3():
    def reference(I, K):
        I, K = f64(I, K)
        return (_f32(np.einsum("hwij,ij->hw", _windows(I, 3, 1), K)),)

    return lambda rng, s: (uniform(rng, (s["H"], s["W"])), uniform(rng, (3, 3))), reference


@kernel(
    "stencil3",
    """
# where gives the range; the output's extent is the range's end, element 0 is never written
def stencil3(float(N) A) -> (B) {
    B(i) = 0.25 * A(i - 1) + 0.5 * A(i) + 0.25 * A(i + 1) where i in 1:N-1
}""",
    sizes=[dict(N=9), dict(N=3), dict(N=2)],
    ops=lambda s: 4,
    tags={"stencil", "where"},
)
def _stencil3():
    def reference(A):
        A = f64(A)[0]
        out = np.zeros(len(A) - 1)
        out[1:] = 0.25 * A[:-2] + 0.5 * A[1:-1] + 0.25 * A[2:]
        return (_f32(out),)

    return lambda rng, s: (uniform(rng, (s["N"],)),), reference


@kernel(
    "jacobi2d",
    """
def jacobi2d(float(H, W) A) -> (B) {
    B(i, j) = 0.2 * (A(i, j) + A(i - 1, j) + A(i + 1, j) + A(i, j - 1) + A(i, j + 1))
        where i in 1:H-1, j in 1:W-1
}""",
    sizes=[dict(H=6, W=7), dict(H=3, W=4)],
    ops=lambda s: 6,
    tags={"stencil", "where"},
)
def _jacobi2d():
    def reference(A):
        A = f64(A)[0]
        out = np.zeros((A.shape[0] - 1, A.shape[1] - 1))
        out[1:, 1:] = 0.2 * (A[1:-1, 1:-1] + A[:-2, 1:-1] + A[2:, 1:-1] + A[1:-1, :-2] + A[1:-1, 2:])
        return (_f32(out),)

    return lambda rng, s: (uniform(rng, (s["H"], s["W"])),), reference


@kernel(
    "window_sum",
    """
# exists: the window length comes from Wt, which the statement does not read
def window_sum(float(N) A, float(K) Wt) -> (O) {
    O(i) +=! A(i + r_k) where exists Wt(r_k)
}""",
    sizes=[dict(N=10, K=3), dict(N=4, K=4)],
    ops=lambda s: s["K"],
    tags={"where"},
)
def _window_sum():
    def reference(A, Wt):
        A = f64(A)[0]
        k = len(Wt)
        return (_f32(np.array([A[i : i + k].sum() for i in range(len(A) - k + 1)])),)

    return lambda rng, s: (uniform(rng, (s["N"],)), uniform(rng, (s["K"],))), reference


@kernel(
    "let_poly",
    """
def let_poly(float(N) X, float(N) Y) -> (O) {
    O(i) = t * t - 2 * t + u where t = X(i) - Y(i), u = t * X(i) * 3
}""",
    sizes=[dict(N=8), dict(N=1)],
    # the outputs reach 14 * max|input|, so each rounding counts about 14 times over
    ops=lambda s: 8 * 14,
    tags={"where", "let", "elementwise"},
)
def _let_poly():
    def reference(X, Y):
        X, Y = f64(X, Y)
        t = X - Y
        return (_f32(t * t - 2 * t + t * X * 3),)

    return lambda rng, s: (uniform(rng, (s["N"],)), uniform(rng, (s["N"],))), reference


@kernel(
    "half_row_sum",
    """
# where overrides what inference would find (0:K)
def half_row_sum(float(M, K) A) -> (O) {
    O(i) +=! A(i, r_j) where r_j in 0:K/2
}""",
    sizes=[dict(M=3, K=8), dict(M=2, K=5), dict(M=2, K=1)],
    ops=lambda s: max(s["K"] // 2, 1),
    tags={"where", "reduction"},
)
def _half_row_sum():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["K"])),),
        lambda A: (_f32(f64(A)[0][:, : A.shape[1] // 2].sum(axis=1)),),
    )


@kernel(
    "triu_mask",
    """
def triu_mask(float(N, M) A) -> (O) {
    O(i, j) = i <= j ? A(i, j) : 0 where exists A(i, j)
}""",
    sizes=[dict(N=4, M=5), dict(N=3, M=1)],
    ops=lambda s: 1,
    tags={"ternary", "elementwise"},
)
def _triu_mask():
    return lambda rng, s: (uniform(rng, (s["N"], s["M"])),), lambda A: (np.triu(A),)


@kernel(
    "shift_right",
    """
# A(i - 1) is out of bounds at i = 0, where the guard is false
def shift_right(float(N) A) -> (O) {
    O(i) = i > 0 ? A(i - 1) : -1 where i in 0:N
}""",
    sizes=[dict(N=6), dict(N=1)],
    ops=lambda s: 1,
    tags={"ternary", "where"},
)
def _shift_right():
    def reference(A):
        out = np.empty_like(A)
        out[0] = -1
        out[1:] = A[:-1]
        return (out,)

    return lambda rng, s: (uniform(rng, (s["N"],)),), reference


@kernel(
    "add_prefix",
    """
# i is bounded by both inputs: its range is 0:min(M, N)
def add_prefix(float(N) A, float(M) B) -> (O) {
    O(i) = A(i) + B(i)
}""",
    sizes=[dict(N=5, M=3), dict(N=2, M=6), dict(N=4, M=4)],
    ops=lambda s: 1,
    tags={"elementwise"},
)
def _add_prefix():
    def reference(A, B):
        n = min(len(A), len(B))
        return (_f32(f64(A)[0][:n] + f64(B)[0][:n]),)

    return lambda rng, s: (uniform(rng, (s["N"],)), uniform(rng, (s["M"],))), reference


@kernel(
    "resize",
    """
# a 0-d integer input used as a size: the first K elements, doubled, zero-padded past N
def resize(float(N) A, int32 K) -> (O) {
    O(i) = i < N ? A(i) * 2 : 0 where i in 0:K
}""",
    sizes=[dict(N=7, K=4), dict(N=3, K=5), dict(N=2, K=0)],
    ops=lambda s: 1,
    tags={"scalar-input", "where", "ternary"},
)
def _resize():
    def reference(A, K):
        out = np.zeros(int(K), dtype=np.float32)
        n = min(len(A), int(K))
        out[:n] = A[:n] * np.float32(2)
        return (out,)

    return lambda rng, s: (uniform(rng, (s["N"],)), np.int32(s["K"])), reference


# --- reductions -------------------------------------------------------------------------------
@kernel(
    "row_sum",
    """
def row_sum(float(M, N) A) -> (S) {
    S(m) +=! A(m, r_n)
}""",
    sizes=[dict(M=4, N=11), dict(M=1, N=1)],
    ops=lambda s: s["N"],
    tags={"reduction"},
)
def _row_sum():
    return lambda rng, s: (uniform(rng, (s["M"], s["N"])),), lambda A: (_f32(f64(A)[0].sum(axis=1)),)


@kernel(
    "row_mean",
    """
# mean = sum / A.1
def row_mean(float(M, N) A) -> (Mean) {
    S(m) +=! A(m, r_n)
    Mean(m) = S(m) / A.1
}""",
    sizes=[dict(M=4, N=7), dict(M=2, N=1)],
    ops=lambda s: s["N"] + 1,
    tags={"reduction", "extents"},
)
def _row_mean():
    return lambda rng, s: (uniform(rng, (s["M"], s["N"])),), lambda A: (_f32(f64(A)[0].mean(axis=1)),)


@kernel(
    "row_max",
    """
def row_max(float(M, N) A) -> (Mx) {
    Mx(m) max=! A(m, r_n)
}""",
    sizes=[dict(M=5, N=6), dict(M=1, N=1)],
    ops=lambda s: 1,
    tags={"reduction"},
)
def _row_max():
    return lambda rng, s: (uniform(rng, (s["M"], s["N"])),), lambda A: (A.max(axis=1),)


@kernel(
    "col_min",
    """
def col_min(float(M, N) A) -> (Mn) {
    Mn(n) min=! A(r_m, n)
}""",
    sizes=[dict(M=5, N=6), dict(M=1, N=3)],
    ops=lambda s: 1,
    tags={"reduction"},
)
def _col_min():
    return lambda rng, s: (uniform(rng, (s["M"], s["N"])),), lambda A: (A.min(axis=0),)


@kernel(
    "row_prod",
    """
def row_prod(float(M, N) A) -> (P) {
    P(m) *=! A(m, r_n)
}""",
    sizes=[dict(M=3, N=8), dict(M=2, N=1)],
    ops=lambda s: s["N"],
    tags={"reduction"},
)
def _row_prod():
    return (lambda rng, s: (uniform(rng, (s["M"], s["N"]), 0.8, 1.25),), lambda A: (_f32(f64(A)[0].prod(axis=1)),))


@kernel(
    "max_all",
    """
def max_all(float(M, N, K) A) -> (Mx, Mn) {
    Mx max=! A(r_m, r_n, r_k)
    Mn() min=! A(r_m, r_n, r_k)
}""",
    sizes=[dict(M=2, N=3, K=4), dict(M=1, N=1, K=1)],
    ops=lambda s: 1,
    tags={"reduction", "0-d", "multi-output"},
)
def _max_all():
    return lambda rng, s: (uniform(rng, (s["M"], s["N"], s["K"])),), lambda A: (A.max(), A.min())


# --- types ------------------------------------------------------------------------------------
@kernel(
    "int_rowsum",
    """
def int_rowsum(int32(M, N) A) -> (S, S64) {
    S(m) +=! A(m, r_n)
    S64(m) +=! int64(A(m, r_n)) * A(m, r_n)
}""",
    sizes=[dict(M=4, N=9), dict(M=1, N=1)],
    tags={"integer", "reduction"},
)
def _int_rowsum():
    def reference(A):
        A = A.astype(np.int64)
        return A.sum(axis=1).astype(np.int32), (A * A).sum(axis=1)

    return lambda rng, s: (integers(rng, (s["M"], s["N"]), -50000, 50000),), reference


@kernel(
    "int_divmod",
    """
# integer / and % truncate toward zero, as in C
def int_divmod(int32(N) A, int32(N) B) -> (Q, R, Q3, R3) {
    Q(i) = A(i) / B(i)
    R(i) = A(i) % B(i)
    Q3(i) = A(i) / -3
    R3(i) = A(i) % 3
}""",
    sizes=[dict(N=20), dict(N=1)],
    tags={"integer"},
)
def _int_divmod():
    def c_div(a, b):
        return np.trunc(a.astype(np.float64) / b).astype(np.int32)

    def reference(A, B):
        q, q3 = c_div(A, B), c_div(A, np.full_like(A, -3))
        return q, (A - q * B).astype(np.int32), q3, (A - c_div(A, np.full_like(A, 3)) * 3).astype(np.int32)

    def make_inputs(rng, s):
        A = integers(rng, (s["N"],), -100, 100)
        B = integers(rng, (s["N"],), 1, 9) * rng.choice(np.array([-1, 1], np.int32), size=s["N"])
        return A, B.astype(np.int32)

    return make_inputs, reference


@kernel(
    "casts",
    """
def casts(float(N) A) -> (F, T, Big, Back) {
    F(i) = float(i) * A(i)
    T(i) = int32(A(i) * 10)
    Big(i) = int64(i) * 3000000000 where i in 0:N
    Back(i) = float(int32(A(i) * 10)) / 10
}""",
    sizes=[dict(N=9), dict(N=1)],
    ops=lambda s: (s["N"], 1, 1, 2),
    tags={"cast", "integer"},
)
def _casts():
    def reference(A):
        i = np.arange(len(A))
        truncated = np.trunc(A * np.float32(10)).astype(np.int32)
        return (_f32(i * f64(A)[0]), truncated, i.astype(np.int64) * 3000000000, _f32(truncated / 10.0))

    return lambda rng, s: (uniform(rng, (s["N"],), -3, 3),), reference


@kernel(
    "double_norm",
    """
def double_norm(double(M, N) A, double(N) x) -> (y, nrm) {
    y(m) +=! A(m, r_n) * x(r_n)
    nrm +=! y(r_m) * y(r_m)
    nrm = sqrt(nrm)
}""",
    sizes=[dict(M=5, N=7), dict(M=1, N=1)],
    ops=lambda s: (s["N"], s["N"] * s["M"] * 4),
    tags={"double", "multi-output", "0-d"},
)
def _double_norm():
    def reference(A, x):
        y = A @ x
        return y, np.float64(np.sqrt(np.sum(y * y)))

    return (
        lambda rng, s: (uniform(rng, (s["M"], s["N"]), dtype=np.float64), uniform(rng, (s["N"],), dtype=np.float64)),
        reference,
    )


@kernel(
    "half_axpby",
    """
# weak literals keep float16
def half_axpby(float16(N) X, float16(N) Y) -> (Z, S) {
    Z(i) = 2 * X(i) + Y(i) * 0.5
    S +=! Z(r_i)
}""",
    sizes=[dict(N=16), dict(N=1)],
    ops=lambda s: (3, 3 * s["N"]),
    tags={"float16", "0-d"},
)
def _half_axpby():
    def reference(X, Y):
        Z = (2 * X.astype(np.float64) + Y.astype(np.float64) * 0.5).astype(np.float16)
        return Z, np.float16(Z.astype(np.float64).sum())

    return (
        lambda rng, s: (uniform(rng, (s["N"],), dtype=np.float16), uniform(rng, (s["N"],), dtype=np.float16)),
        reference,
    )


@kernel(
    "compare",
    """
# comparisons give bool; bool converts to int or float where used as a number
def compare(float(N, M) A, float(N, M) B) -> (G, Cnt, Mx, Both) {
    G(i, j) = float(A(i, j) > B(i, j))
    Cnt(i) +=! int32(A(i, r_j) >= 0)
    Mx(i, j) = (A(i, j) < B(i, j)) * B(i, j) + (A(i, j) >= B(i, j)) * A(i, j)
    Both(i, j) = A(i, j) > 0 && B(i, j) > 0
}""",
    sizes=[dict(N=4, M=6), dict(N=1, M=1)],
    ops=lambda s: 1,
    tags={"bool", "multi-output"},
)
def _compare():
    def reference(A, B):
        return ((A > B).astype(np.float32), (A >= 0).sum(axis=1).astype(np.int32), np.maximum(A, B), (A > 0) & (B > 0))

    return lambda rng, s: (uniform(rng, (s["N"], s["M"])), uniform(rng, (s["N"], s["M"]))), reference


# --- accumulation into caller-supplied outputs ------------------------------------------------
@kernel(
    "matmul_acc",
    """
# no '!': C accumulates into what the caller passes
def matmul_acc(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) += A(m, r_k) * B(r_k, n)
}""",
    sizes=[dict(M=4, K=5, N=3), dict(M=1, K=2, N=2)],
    ops=lambda s: s["K"] + 1,
    tags={"contraction", "accumulate"},
    outputs=lambda rng, s: (uniform(rng, (s["M"], s["N"])),),
)
def _matmul_acc():
    return (
        lambda rng, s: (uniform(rng, (s["M"], s["K"])), uniform(rng, (s["K"], s["N"]))),
        lambda A, B, C: (_f32(f64(C)[0] + f64(A)[0] @ f64(B)[0]),),
    )


@kernel(
    "running_max",
    """
def running_max(float(N, M) A) -> (O) {
    O(i) max= A(i, r_j)
}""",
    sizes=[dict(N=6, M=4), dict(N=2, M=1)],
    ops=lambda s: 1,
    tags={"reduction", "accumulate"},
    outputs=lambda rng, s: (uniform(rng, (s["N"],)),),
)
def _running_max():
    return (lambda rng, s: (uniform(rng, (s["N"], s["M"])),), lambda A, O: (np.maximum(O, A.max(axis=1)),))


@kernel(
    "extended_by_a_second_write",
    """
def extended_by_a_second_write(float(N) X) -> (A, B) {
    A(i) = X(0) where i in 0:1
    B(i) = A(i) + 1
    A(i) = X(i) * 2 where i in 1:N
}""",
    sizes=[dict(N=7), dict(N=1)],
    ops=lambda s: 2,
    tags={"elementwise", "where"},
)
def _extended_by_a_second_write():
    # A tensor's extent is the largest upper bound of the ranges that write it: the second
    # write extends A to N elements; B, read from A while it held one, keeps one (issue 84).
    def reference(X):
        A = f64(X)[0] * 2
        A[0] = X[0]
        return _f32(A), _f32(np.array([X[0] + 1.0]))

    return (lambda rng, s: (uniform(rng, (s["N"],)),), reference)


#: The corpus by name.
CASES: dict[str, KernelCase] = {case.name: case for case in KERNELS}
assert len(CASES) == len(KERNELS), "kernel names must be unique"


#: Found by the OpenCL fuzzer (seed 2958232869), for tests/gpu: at these sizes and blocks (M=14,
#: N=7, fusion "min", block (5, 3)) isl hoisted the guards of the last launch's private loads and
#: stores above its slice loop and printed that loop, with its barrier, once per guard; PoCL
#: compiled the divergent barriers into writes past O's end, and freeing the buffers aborted.
DIVERGENT_BARRIERS_DEF = """
def fuzz(float(N, M) A, float(M, N) B, float(N, N, M, M) C) -> (O) {
    O(j, l, i) +=! ((B(i, j) < i) ? fmax(B(i, j), A(l, r_a)) : B(i, j) * fmin(B(i, j), tanh(B(i, j) + 0.5))) + A(l, r_a)
    O(j, l, i) += C(j, l, r_a, i)
    O(j, l, i) = ((B(i, j) <= -0.5) ? tanh(O(j, l, i)) : i) + O(j, l, i)
}"""


#: float16 defs: every operation rounded to float16 as on the CPU (OpenCL: float buffers and a
#: rounding through half bits; CUDA: __half).
FLOAT16_DEFS = """
def elementwise(float16(N) X, float16(N) Y, double(N) D, int32(N) I) -> (Z) {
    Z(i) = exp(X(i)) / (Y(i) + 3) - sqrt(fabs(X(i))) * tanh(Y(i)) + float16(D(i)) + float16(I(i))
}
def matmul(float16(M, K) A, float16(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }
def softmax(float16(N, D) X) -> (Y) {
    M(n) max=! X(n, r_d)
    E(n, d) = exp(X(n, d) - M(n))
    S(n) +=! E(n, r_d)
    Y(n, d) = E(n, d) / S(n)
}
"""
