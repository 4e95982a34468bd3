"""The benchmark cases: each one a TC def for polyc, a numpy formulation, an einsum formulation
where the computation is a contraction, and a hand-written naive C loop nest (``naive/*.c``).

A case's inputs are made from the checked TC signature (random floats in [-1, 1); 0-d inputs
such as PolyBench's ``alpha`` and ``beta`` take the values in ``Case.scalars``).  The numpy and
einsum functions take the inputs in the def's order and return its outputs in declared order.
The naive C file defines ``void kernel(inputs..., outputs...)`` over fixed-size arrays whose
extents are the size names, passed as ``-D`` macros.

Sizes follow TC's benchmarks (tc/benchmarks/*.cc and the TC README) and PolyBench/C 4.2's
LARGE_DATASET; PolyBench kernels run in double, PolyBench's default type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

CONTRACTION = "contraction"
CONVOLUTION = "convolution"
NORMALIZATION = "normalization"
LAYOUT = "layout"
POLYBENCH = "polybench"
#: Groups in table order; the summary gives a geometric mean of the ratios for each.
GROUPS = (CONTRACTION, CONVOLUTION, NORMALIZATION, LAYOUT, POLYBENCH)

POLYBENCH_SCALARS = {"alpha": 1.5, "beta": 1.2}  # PolyBench's init_array values


@dataclass(frozen=True)
class Case:
    """One benchmark: a kernel at one size, with its reference formulations."""

    name: str
    group: str
    sizes: Mapping[str, int]
    source: str  # TC text; the def named ``entry`` is benchmarked
    entry: str
    numpy: Callable
    einsum: Callable | None
    naive_c: str  # file under benchmarks/naive/
    flops: float  # 2 per multiply-add, 1 per other arithmetic operation
    reduction: int  # longest chain of accumulated terms, for the check tolerance
    scalars: Mapping[str, float] = field(default_factory=dict)
    note: str = ""

    @property
    def size_label(self) -> str:
        return "x".join(str(v) for v in self.sizes.values())

    @property
    def title(self) -> str:
        return f"{self.name} {self.size_label}"


# ---- contractions --------------------------------------------------------------------------


def sgemm(n: int) -> Case:
    return Case(
        "sgemm",
        CONTRACTION,
        dict(M=n, K=n, N=n),
        """
def sgemm(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}""",
        "sgemm",
        numpy=lambda A, B: A @ B,
        einsum=lambda A, B: np.einsum("mk,kn->mn", A, B, optimize=True),
        naive_c="sgemm.c",
        flops=2.0 * n**3,
        reduction=n,
    )


def tmm(m: int, n: int, k: int) -> Case:
    return Case(
        "tmm",
        CONTRACTION,
        dict(M=m, N=n, K=k),
        """
def tmm(float(M, K) A, float(N, K) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(n, r_k)
}""",
        "tmm",
        numpy=lambda A, B: A @ B.T,
        einsum=lambda A, B: np.einsum("mk,nk->mn", A, B, optimize=True),
        naive_c="tmm.c",
        flops=2.0 * m * n * k,
        reduction=k,
    )


def batch_matmul(b: int, n: int, m: int, k: int) -> Case:
    return Case(
        "batch_matmul",
        CONTRACTION,
        dict(B=b, N=n, M=m, K=k),
        """
def batch_matmul(float(B, N, M) X, float(B, M, K) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, r_m) * Y(b, r_m, k)
}""",
        "batch_matmul",
        numpy=lambda X, Y: X @ Y,
        einsum=lambda X, Y: np.einsum("bnm,bmk->bnk", X, Y, optimize=True),
        naive_c="batch_matmul.c",
        flops=2.0 * b * n * m * k,
        reduction=m,
    )


def kronecker3_1(m: int, d2: int, n0: int, n1: int, n2: int) -> Case:
    def numpy_step(W2, X):
        return (X.reshape(-1, X.shape[-1]) @ W2.T).reshape(*X.shape[:-1], W2.shape[0])

    return Case(
        "kronecker3_1",
        CONTRACTION,
        dict(M=m, N0=n0, N1=n1, N2=n2, D2=d2),
        """
def Kronecker3_1(float(D2, N2) W2, float(M, N0, N1, N2) X) -> (XW2) {
    XW2(m, n0, n1, d2) +=! X(m, n0, n1, r_n2) * W2(d2, r_n2)
}""",
        "Kronecker3_1",
        numpy=numpy_step,
        einsum=lambda W2, X: np.einsum("abcr,dr->abcd", X, W2, optimize=True),
        naive_c="kronecker3_1.c",
        flops=2.0 * m * n0 * n1 * d2 * n2,
        reduction=n2,
    )


def kronecker3_2(m: int, d1: int, d2: int, n0: int, n1: int) -> Case:
    return Case(
        "kronecker3_2",
        CONTRACTION,
        dict(M=m, N0=n0, N1=n1, D2=d2, D1=d1),
        """
def Kronecker3_2(float(D1, N1) W1, float(M, N0, N1, D2) XW2) -> (XW2W1) {
    XW2W1(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1)
}""",
        "Kronecker3_2",
        numpy=lambda W1, XW2: np.matmul(W1, XW2),  # W1 broadcast over (m, n0)
        einsum=lambda W1, XW2: np.einsum("abrd,cr->abcd", XW2, W1, optimize=True),
        naive_c="kronecker3_2.c",
        flops=2.0 * m * n0 * d1 * d2 * n1,
        reduction=n1,
    )


def kronecker3_3(m: int, d0: int, d1: int, d2: int, n0: int) -> Case:
    def numpy_step(W0, XW2W1):
        m_, n0_, d1_, d2_ = XW2W1.shape
        return np.matmul(W0, XW2W1.reshape(m_, n0_, d1_ * d2_)).reshape(m_, W0.shape[0], d1_, d2_)

    return Case(
        "kronecker3_3",
        CONTRACTION,
        dict(M=m, N0=n0, D1=d1, D2=d2, D0=d0),
        """
def Kronecker3_3(float(D0, N0) W0, float(M, N0, D1, D2) XW2W1) -> (Y) {
    Y(m, d0, d1, d2) +=! XW2W1(m, r_n0, d1, d2) * W0(d0, r_n0)
}""",
        "Kronecker3_3",
        numpy=numpy_step,
        einsum=lambda W0, XW2W1: np.einsum("mrcd,ar->macd", XW2W1, W0, optimize=True),
        naive_c="kronecker3_3.c",
        flops=2.0 * m * d0 * d1 * d2 * n0,
        reduction=n0,
    )


def mlp(b: int, m: int, n: int) -> Case:
    return Case(
        "mlp",
        CONTRACTION,
        dict(B=b, M=m, N=n),
        """
def mlp1(float(B, M) I, float(M, N) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, r_m) * W1(r_m, n)
    O1(b, n)  = O1(b, n) + B1(n)
    O1(b, n)  = fmax(O1(b, n), 0)
}""",
        "mlp1",
        numpy=lambda I, W1, B1: np.maximum(I @ W1 + B1, 0),
        einsum=lambda I, W1, B1: np.maximum(np.einsum("bm,mn->bn", I, W1, optimize=True) + B1, 0),
        naive_c="mlp.c",
        flops=2.0 * b * m * n + 2.0 * b * n,
        reduction=m + 1,
        note="TC's mlp1: fully connected layer with bias and ReLU",
    )


def tensordot(n: int, c1: int, c2: int, c3: int, h: int, w: int) -> Case:
    def numpy_tensordot(I0, I1):
        # C2 and C3 are tiny: broadcast multiply-adds over the small dimensions beat a batched
        # matmul over (n, h, w), which numpy runs on strided operands without BLAS
        out = np.empty((n, c1, c3, h, w), dtype=np.result_type(I0, I1))
        for k in range(c3):
            accumulator = I0[:, :, 0] * I1[:, None, 0, k]
            for j in range(1, c2):
                accumulator += I0[:, :, j] * I1[:, None, j, k]
            out[:, :, k] = accumulator
        return out

    return Case(
        "tensordot",
        CONTRACTION,
        dict(N=n, C1=c1, C2=c2, C3=c3, H=h, W=w),
        """
def tensordot(float(N, C1, C2, H, W) I0, float(N, C2, C3, H, W) I1) -> (O) {
    O(n, c1, c3, h, w) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, c3, h, w)
}""",
        "tensordot",
        numpy=numpy_tensordot,
        einsum=lambda I0, I1: np.einsum("nachw,ncbhw->nabhw", I0, I1, optimize=True),
        naive_c="tensordot.c",
        flops=2.0 * n * c1 * c2 * c3 * h * w,
        reduction=c2,
    )


# ---- convolutions --------------------------------------------------------------------------


def group_conv(n: int, g: int, c: int, f: int, h: int, w: int, k: int) -> Case:
    oh, ow = h - k + 1, w - k + 1

    def numpy_group_conv(I, W1, B):
        # im2col per group, then one batched matmul over the groups
        windows = sliding_window_view(I, (k, k), axis=(3, 4))  # n g c oh ow kh kw
        columns = windows.transpose(1, 0, 3, 4, 2, 5, 6).reshape(g, n * oh * ow, c * k * k)
        out = columns @ W1.reshape(g, f, c * k * k).transpose(0, 2, 1)  # g (n oh ow) f
        return out.reshape(g, n, oh, ow, f).transpose(1, 0, 4, 2, 3) + B[None, :, :, None, None]

    def einsum_group_conv(I, W1, B):
        windows = sliding_window_view(I, (k, k), axis=(3, 4))
        return np.einsum("ngchwxy,gfcxy->ngfhw", windows, W1, optimize=True) + B[None, :, :, None, None]

    return Case(
        "group_conv",
        CONVOLUTION,
        dict(N=n, G=g, C=c, F=f, H=h, W=w, KH=k, KW=k),
        """
def group_convolution(float(N, G, C, H, W) I, float(G, F, C, KH, KW) W1, float(G, F) B) -> (O) {
    O(n, g, f, h, w) +=! I(n, g, r_c, h + r_kh, w + r_kw) * W1(g, f, r_c, r_kh, r_kw)
    O(n, g, f, h, w)  = O(n, g, f, h, w) + B(g, f)
}""",
        "group_convolution",
        numpy=numpy_group_conv,
        einsum=einsum_group_conv,
        naive_c="group_conv.c",
        flops=2.0 * n * g * f * oh * ow * (c * k * k + 1),
        reduction=c * k * k + 1,
    )


def conv3x3(n: int, c: int, f: int, h: int, w: int) -> Case:
    k = 3
    oh, ow = h - k + 1, w - k + 1

    def numpy_conv(I, W1, B):
        windows = sliding_window_view(I, (k, k), axis=(2, 3))  # n c oh ow kh kw
        columns = windows.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k)
        out = (columns @ W1.reshape(f, c * k * k).T).reshape(n, oh, ow, f).transpose(0, 3, 1, 2)
        return np.maximum(out + B[None, :, None, None], 0)

    def einsum_conv(I, W1, B):
        windows = sliding_window_view(I, (k, k), axis=(2, 3))
        out = np.einsum("nchwxy,fcxy->nfhw", windows, W1, optimize=True)
        return np.maximum(out + B[None, :, None, None], 0)

    return Case(
        "conv3x3",
        CONVOLUTION,
        dict(N=n, C=c, F=f, H=h, W=w, KH=k, KW=k),
        """
def conv3x3(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
    O(n, f, h, w)  = fmax(O(n, f, h, w) + B(f), 0)
}""",
        "conv3x3",
        numpy=numpy_conv,
        einsum=einsum_conv,
        naive_c="conv3x3.c",
        flops=2.0 * n * f * oh * ow * (c * k * k + 1),
        reduction=c * k * k + 1,
        note="valid 3x3 convolution, stride 1, with bias and ReLU",
    )


def depthwise(n: int, h: int, w: int, c: int, k: int) -> Case:
    """A channels-last depthwise k x k convolution with zero padding k // 2 (the output as large
    as the image), a bias and ReLU: MobileNet's (3 x 3, 5 x 5) and ConvNeXt's (7 x 7) layers."""
    pad = k // 2

    def numpy_depthwise(I, W1, B):
        padded = np.pad(I, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        windows = sliding_window_view(padded, (k, k), axis=(1, 2))  # n h w c kh kw
        out = np.einsum("nhwcxy,xyc->nhwc", windows, W1, optimize=True)
        return np.maximum(out + B, 0)

    return Case(
        "depthwise",
        CONVOLUTION,
        dict(N=n, H=h, W=w, C=c, K=k),
        f"""
def depthwise(float(N, H, W, C) I, float(K, K, C) W1, float(C) B) -> (O) {{
    O(n, h, w, c) +=! (h + r_kh >= {pad} && h + r_kh < H + {pad} && w + r_kw >= {pad} && w + r_kw < W + {pad})
        ? I(n, h + r_kh - {pad}, w + r_kw - {pad}, c) * W1(r_kh, r_kw, c) : 0
        where h in 0:H, w in 0:W, r_kh in 0:K, r_kw in 0:K
    O(n, h, w, c) = fmax(O(n, h, w, c) + B(c), 0)
}}""",
        "depthwise",
        numpy=numpy_depthwise,
        einsum=None,
        naive_c="depthwise.c",
        flops=2.0 * n * h * w * c * (k * k + 1),
        reduction=k * k + 1,
        note=f"channels-last depthwise {k}x{k}, padding {pad}, bias and ReLU",
    )


# ---- softmax and normalisation -------------------------------------------------------------


def softmax(n: int, d: int) -> Case:
    def numpy_softmax(X):
        e = np.exp(X - X.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    return Case(
        "softmax",
        NORMALIZATION,
        dict(N=n, D=d),
        """
def softmax(float(N, D) X) -> (O) {
    M(n) max=! X(n, r_d)
    O(n, d) = exp(X(n, d) - M(n))
    S(n) +=! O(n, r_d)
    O(n, d) = O(n, d) / S(n)
}""",
        "softmax",
        numpy=numpy_softmax,
        einsum=None,
        naive_c="softmax.c",
        flops=5.0 * n * d,
        reduction=d,
    )


def layernorm(n: int, d: int) -> Case:
    def numpy_layernorm(X, gamma, beta):
        mean = X.mean(axis=1, keepdims=True)
        centred = X - mean
        var = (centred * centred).mean(axis=1, keepdims=True)
        return centred / np.sqrt(var + X.dtype.type(1e-5)) * gamma + beta

    return Case(
        "layernorm",
        NORMALIZATION,
        dict(N=n, D=d),
        """
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    s(n) +=! X(n, r_d)
    mu(n) = s(n) / D
    v(n) +=! (X(n, r_d) - mu(n)) * (X(n, r_d) - mu(n))
    rstd(n) = rsqrt(v(n) / D + 1e-5)
    Y(n, d) = (X(n, d) - mu(n)) * rstd(n) * gamma(d) + beta(d)
}""",
        "layernorm",
        numpy=numpy_layernorm,
        einsum=None,
        naive_c="layernorm.c",
        flops=8.0 * n * d,
        reduction=2 * d,
    )


# ---- layout changes: transpositions (the transpose kernel path) ------------------------------


def transpose(name: str, dims: str, order: str, shape: tuple[int, ...], note: str = "") -> Case:
    """``O`` = ``X`` with its dimensions (named by the letters of ``dims``, sizes ``shape``) in
    the order ``order``; flops 0 (the table's GB/s-free ratios compare times)."""
    sizes = dict(zip(dims.upper(), shape, strict=True))
    permutation = tuple(dims.index(letter) for letter in order)
    signature = ", ".join(dims.upper())
    return Case(
        name,
        LAYOUT,
        sizes,
        f"""
def {name}(float({signature}) X) -> (O) {{
    O({", ".join(order)}) = X({", ".join(dims)})
}}""",
        name,
        numpy=lambda X: np.ascontiguousarray(X.transpose(permutation)),
        einsum=lambda X: np.ascontiguousarray(np.einsum(f"{dims}->{order}", X)),
        naive_c=f"{name}.c",
        flops=0.0,
        reduction=1,
        note=note,
    )


def layout_cases() -> list[Case]:
    """The transpositions ONNX models make: a matrix, NCHW <-> NHWC, attention's heads."""
    return [
        transpose("transpose2d", "mn", "nm", (4096, 4096)),
        transpose("nchw_to_nhwc", "nchw", "nhwc", (8, 64, 56, 56)),
        transpose("nhwc_to_nchw", "nhwc", "nchw", (8, 56, 56, 64)),
        transpose("heads_keys", "bshd", "bhds", (8, 512, 8, 64), note="attention's K^T: (B, S, H, D) -> (B, H, D, S)"),
    ]


# ---- PolyBench/C 4.2 linear algebra (double precision) --------------------------------------


def pb_gemm(ni: int, nj: int, nk: int) -> Case:
    return Case(
        "gemm",
        POLYBENCH,
        dict(NI=ni, NJ=nj, NK=nk),
        """
def gemm(double alpha, double beta, double(NI, NJ) C, double(NI, NK) A, double(NK, NJ) B) -> (Cout) {
    Cout(i, j) = beta * C(i, j)
    Cout(i, j) += alpha * A(i, r_k) * B(r_k, j)
}""",
        "gemm",
        numpy=lambda alpha, beta, C, A, B: alpha * (A @ B) + beta * C,
        einsum=lambda alpha, beta, C, A, B: alpha * np.einsum("ik,kj->ij", A, B, optimize=True) + beta * C,
        naive_c="gemm.c",
        flops=2.0 * ni * nj * nk,
        reduction=nk + 1,
        scalars=POLYBENCH_SCALARS,
    )


def pb_2mm(ni: int, nj: int, nk: int, nl: int) -> Case:
    return Case(
        "2mm",
        POLYBENCH,
        dict(NI=ni, NJ=nj, NK=nk, NL=nl),
        """
def two_mm(double alpha, double beta, double(NI, NK) A, double(NK, NJ) B, double(NJ, NL) C,
           double(NI, NL) D) -> (Dout) {
    tmp(i, j) +=! alpha * A(i, r_k) * B(r_k, j)
    Dout(i, l) = beta * D(i, l)
    Dout(i, l) += tmp(i, r_j) * C(r_j, l)
}""",
        "two_mm",
        numpy=lambda alpha, beta, A, B, C, D: (alpha * (A @ B)) @ C + beta * D,
        einsum=lambda alpha, beta, A, B, C, D: alpha * np.einsum("ik,kj,jl->il", A, B, C, optimize=True) + beta * D,
        naive_c="2mm.c",
        flops=2.0 * ni * nj * nk + 2.0 * ni * nl * nj,
        reduction=nk + nj + 1,
        scalars=POLYBENCH_SCALARS,
    )


def pb_3mm(ni: int, nj: int, nk: int, nl: int, nm: int) -> Case:
    return Case(
        "3mm",
        POLYBENCH,
        dict(NI=ni, NJ=nj, NK=nk, NL=nl, NM=nm),
        """
def three_mm(double(NI, NK) A, double(NK, NJ) B, double(NJ, NM) C, double(NM, NL) D) -> (G) {
    E(i, j) +=! A(i, r_k) * B(r_k, j)
    F(j, l) +=! C(j, r_m) * D(r_m, l)
    G(i, l) +=! E(i, r_j) * F(r_j, l)
}""",
        "three_mm",
        numpy=lambda A, B, C, D: (A @ B) @ (C @ D),
        einsum=lambda A, B, C, D: np.einsum("ik,kj,jm,ml->il", A, B, C, D, optimize=True),
        naive_c="3mm.c",
        flops=2.0 * (ni * nj * nk + nj * nl * nm + ni * nl * nj),
        reduction=nk + nm + nj,
    )


def _lower(n: int) -> np.ndarray:
    return np.tri(n, dtype=bool)


def pb_syrk(n: int, m: int) -> Case:
    return Case(
        "syrk",
        POLYBENCH,
        dict(N=n, M=m),
        """
def syrk(double alpha, double beta, double(N, N) C, double(N, M) A) -> (Cout) {
    Cout(i, j) = j <= i ? beta * C(i, j) : C(i, j) where i in 0:N, j in 0:N
    Cout(i, j) += j <= i ? alpha * A(i, r_k) * A(j, r_k) : 0 where i in 0:N, j in 0:N, r_k in 0:M
}""",
        "syrk",
        numpy=lambda alpha, beta, C, A: np.where(_lower(len(C)), alpha * (A @ A.T) + beta * C, C),
        einsum=lambda alpha, beta, C, A: np.where(
            _lower(len(C)), alpha * np.einsum("ik,jk->ij", A, A, optimize=True) + beta * C, C
        ),
        naive_c="syrk.c",
        flops=2.0 * m * n * (n + 1) / 2,
        reduction=m + 1,
        scalars=POLYBENCH_SCALARS,
        note="triangular (j <= i) in PolyBench; TC has no triangular ranges, so a ternary guard "
        "on j <= i (polyc runs the full square, adding 0 above the diagonal)",
    )


def pb_syr2k(n: int, m: int) -> Case:
    return Case(
        "syr2k",
        POLYBENCH,
        dict(N=n, M=m),
        """
def syr2k(double alpha, double beta, double(N, N) C, double(N, M) A, double(N, M) B) -> (Cout) {
    Cout(i, j) = j <= i ? beta * C(i, j) : C(i, j) where i in 0:N, j in 0:N
    Cout(i, j) += j <= i ? A(j, r_k) * alpha * B(i, r_k) + B(j, r_k) * alpha * A(i, r_k) : 0
        where i in 0:N, j in 0:N, r_k in 0:M
}""",
        "syr2k",
        numpy=lambda alpha, beta, C, A, B: np.where(_lower(len(C)), alpha * (B @ A.T + A @ B.T) + beta * C, C),
        einsum=lambda alpha, beta, C, A, B: np.where(
            _lower(len(C)),
            alpha * (np.einsum("ik,jk->ij", B, A, optimize=True) + np.einsum("ik,jk->ij", A, B, optimize=True))
            + beta * C,
            C,
        ),
        naive_c="syr2k.c",
        flops=4.0 * m * n * (n + 1) / 2,
        reduction=2 * m + 1,
        scalars=POLYBENCH_SCALARS,
        note="triangular (j <= i) in PolyBench; ternary guard on j <= i as for syrk",
    )


def pb_atax(m: int, n: int) -> Case:
    return Case(
        "atax",
        POLYBENCH,
        dict(M=m, N=n),
        """
def atax(double(M, N) A, double(N) x) -> (y) {
    tmp(i) +=! A(i, r_j) * x(r_j)
    y(j) +=! A(r_i, j) * tmp(r_i)
}""",
        "atax",
        numpy=lambda A, x: A.T @ (A @ x),
        einsum=lambda A, x: np.einsum("ij,ik,k->j", A, A, x, optimize=True),
        naive_c="atax.c",
        flops=4.0 * m * n,
        reduction=m + n,
    )


def pb_bicg(m: int, n: int) -> Case:
    return Case(
        "bicg",
        POLYBENCH,
        dict(M=m, N=n),
        """
def bicg(double(N, M) A, double(M) p, double(N) r) -> (s, q) {
    s(j) +=! r(r_i) * A(r_i, j)
    q(i) +=! A(i, r_j) * p(r_j)
}""",
        "bicg",
        numpy=lambda A, p, r: (r @ A, A @ p),
        einsum=lambda A, p, r: (np.einsum("i,ij->j", r, A, optimize=True), np.einsum("ij,j->i", A, p, optimize=True)),
        naive_c="bicg.c",
        flops=4.0 * m * n,
        reduction=max(m, n),
    )


def pb_mvt(n: int) -> Case:
    return Case(
        "mvt",
        POLYBENCH,
        dict(N=n),
        """
def mvt(double(N) x1, double(N) x2, double(N) y_1, double(N) y_2, double(N, N) A) -> (x1_out, x2_out) {
    x1_out(i) = x1(i)
    x1_out(i) += A(i, r_j) * y_1(r_j)
    x2_out(i) = x2(i)
    x2_out(i) += A(r_j, i) * y_2(r_j)
}""",
        "mvt",
        numpy=lambda x1, x2, y_1, y_2, A: (x1 + A @ y_1, x2 + A.T @ y_2),
        einsum=lambda x1, x2, y_1, y_2, A: (
            x1 + np.einsum("ij,j->i", A, y_1, optimize=True),
            x2 + np.einsum("ji,j->i", A, y_2, optimize=True),
        ),
        naive_c="mvt.c",
        flops=4.0 * n * n,
        reduction=n + 1,
    )


def pb_gemver(n: int) -> Case:
    def numpy_gemver(alpha, beta, A, u1, v1, u2, v2, y, z):
        A2 = A + np.outer(u1, v1) + np.outer(u2, v2)
        x = beta * (A2.T @ y) + z
        return A2, x, alpha * (A2 @ x)

    return Case(
        "gemver",
        POLYBENCH,
        dict(N=n),
        """
def gemver(double alpha, double beta, double(N, N) A, double(N) u1, double(N) v1, double(N) u2,
           double(N) v2, double(N) y, double(N) z) -> (A2, x, w) {
    A2(i, j) = A(i, j) + u1(i) * v1(j) + u2(i) * v2(j)
    x(i) +=! beta * A2(r_j, i) * y(r_j)
    x(i) = x(i) + z(i)
    w(i) +=! alpha * A2(i, r_j) * x(r_j)
}""",
        "gemver",
        numpy=numpy_gemver,
        einsum=None,
        naive_c="gemver.c",
        flops=8.0 * n * n + n,
        reduction=2 * n + 4,
        scalars=POLYBENCH_SCALARS,
        note="x and w start at zero, as PolyBench's init_array sets them",
    )


def pb_gesummv(n: int) -> Case:
    return Case(
        "gesummv",
        POLYBENCH,
        dict(N=n),
        """
def gesummv(double alpha, double beta, double(N, N) A, double(N, N) B, double(N) x) -> (y) {
    tmp(i) +=! A(i, r_j) * x(r_j)
    y(i) +=! B(i, r_j) * x(r_j)
    y(i) = alpha * tmp(i) + beta * y(i)
}""",
        "gesummv",
        numpy=lambda alpha, beta, A, B, x: alpha * (A @ x) + beta * (B @ x),
        einsum=lambda alpha, beta, A, B, x: (
            alpha * np.einsum("ij,j->i", A, x, optimize=True) + beta * np.einsum("ij,j->i", B, x, optimize=True)
        ),
        naive_c="gesummv.c",
        flops=4.0 * n * n + 3.0 * n,
        reduction=n + 2,
        scalars=POLYBENCH_SCALARS,
    )


def pb_doitgen(nr: int, nq: int, np_: int) -> Case:
    return Case(
        "doitgen",
        POLYBENCH,
        dict(NR=nr, NQ=nq, NP=np_),
        """
def doitgen(double(NR, NQ, NP) A, double(NP, NP) C4) -> (Aout) {
    Aout(r, q, p) +=! A(r, q, r_s) * C4(r_s, p)
}""",
        "doitgen",
        numpy=lambda A, C4: (A.reshape(-1, A.shape[-1]) @ C4).reshape(A.shape),
        einsum=lambda A, C4: np.einsum("rqs,sp->rqp", A, C4, optimize=True),
        naive_c="doitgen.c",
        flops=2.0 * nr * nq * np_ * np_,
        reduction=np_,
    )


# ---- the suites ----------------------------------------------------------------------------


def full_suite() -> list[Case]:
    """Every case at its benchmark size (TC's sizes, PolyBench LARGE)."""
    return [
        *(sgemm(n) for n in (256, 512, 1024, 2048)),
        tmm(128, 1024, 1024),  # TC tmm.cc: M=128 N=1024 K=1024
        batch_matmul(500, 26, 72, 26),  # TC: B, N, M, K = 500, 26, 72, 26
        kronecker3_1(256, 16, 32, 32, 32),  # TC kronecker.cc: M=256, D*=16, N*=32
        kronecker3_2(256, 16, 16, 32, 32),
        kronecker3_3(256, 16, 16, 16, 32),
        mlp(128, 2000, 128),  # TC MLP_model.cc mlp1: B=128 M=2000 N=128
        tensordot(32, 512, 8, 2, 28, 28),  # TC README: N C1 C2 C3 H W = 32 512 8 2 28 28
        group_conv(32, 32, 16, 16, 14, 14, 3),  # TC group_convolution.cc, N=32 G=32 C=F=16 14x14
        conv3x3(8, 64, 64, 56, 56),  # a ResNet-style 3x3 layer, batch 8
        depthwise(1, 56, 56, 96, 7),  # ConvNeXt's first stage
        depthwise(1, 14, 14, 384, 7),  # ConvNeXt's third stage (most of its blocks)
        depthwise(1, 7, 7, 768, 7),  # ConvNeXt's last stage: every output near an edge
        depthwise(1, 56, 56, 144, 3),  # MobileNet v2
        depthwise(1, 7, 7, 960, 5),  # MobileNet v3's last 5x5 layers
        softmax(4096, 2048),
        layernorm(4096, 1024),
        *layout_cases(),
        pb_gemm(1000, 1100, 1200),  # PolyBench/C 4.2 LARGE_DATASET sizes
        pb_2mm(800, 900, 1100, 1200),
        pb_3mm(800, 900, 1000, 1100, 1200),
        pb_syrk(1200, 1000),
        pb_syr2k(1200, 1000),
        pb_atax(1900, 2100),
        pb_bicg(1900, 2100),
        pb_mvt(2000),
        pb_gemver(2000),
        pb_gesummv(1300),
        pb_doitgen(150, 140, 160),
    ]


def quick_suite() -> list[Case]:
    """A few cases at small sizes, for a smoke test that runs in well under a minute."""
    return [
        sgemm(128),
        mlp(32, 200, 32),
        conv3x3(1, 8, 8, 18, 18),
        softmax(256, 512),
        layernorm(256, 512),
        transpose("nchw_to_nhwc", "nchw", "nhwc", (1, 32, 20, 20)),
        pb_gemm(200, 220, 240),  # PolyBench MEDIUM_DATASET
        pb_syrk(240, 200),
        pb_atax(390, 410),
    ]
