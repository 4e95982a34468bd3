"""The registry of kernel paths (polyc/paths): every registered path is reached by a def of its
form, computes what the interpreter computes, and is left by a def (or an option) just outside
it; the driver, the tuner and the explanations name the same path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import polyc
from polyc.options import Options
from polyc.paths import KERNEL_PATHS, choose_path, kernel_path
from polyc.paths.base import PathRequest
from polyc.tuning.space import space_for

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
MATVEC = "def mv(float(M, K) A, float(K) x) -> (y) { y(m) +=! A(m, r_k) * x(r_k) }"
NCHW_CONV = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw) }"""
WINOGRAD = """def conv(float(1, 16, 16, 16) I, float(3, 3, 16, 32) W1) -> (O) {
    O(n, h, w, f) +=! (h + r_kh >= 1 && h + r_kh < 17 && w + r_kw >= 1 && w + r_kw < 17)
        ? I(n, h + r_kh - 1, w + r_kw - 1, r_c) * W1(r_kh, r_kw, r_c, f) : 0
        where h in 0:16, w in 0:16, r_kh in 0:3, r_kw in 0:3 }"""
DEPTHWISE = """def conv(float(N, H, W, C) I, float(KH, KW, C) W1) -> (O) {
    O(n, h, w, c) +=! (h + r_kh >= 1 && h + r_kh < H + 1 && w + r_kw >= 1 && w + r_kw <= W)
        ? I(n, h + r_kh - 1, w + r_kw - 1, c) * W1(r_kh, r_kw, c) : 0
        where h in 0:H + 3 - KH, w in 0:W + 3 - KW, r_kh in 0:KH, r_kw in 0:KW }"""
POINTWISE_DEPTHWISE = """def blk(float(N, H, W, C) X, float(1, 1, C, E) W1, float(3, 3, E) W2) -> (O) {
    T(n, h, w, f) +=! X(n, h + r_k0, w + r_k1, r_c) * W1(r_k0, r_k1, r_c, f) where h in 0:H, w in 0:W, r_k0 in 0:1, r_k1 in 0:1
    O(n, h, w, c) +=! (h + r_kh >= 1 && w + r_kw >= 1 && h + r_kh <= H && w + r_kw <= W)
        ? T(n, h + r_kh - 1, w + r_kw - 1, c) * W2(r_kh, r_kw, c) : 0.0 where h in 0:H, w in 0:W, r_kh in 0:3, r_kw in 0:3
}"""
SEGMENTS = """def gemm(float a, float(M, N) C, float(M, K) A, float(K, N) B) -> (D) {
    D(i, j) = 2 * C(i, j)
    D(i, j) += a * A(i, r_k) * B(r_k, j) }"""
TRANSPOSE = "def nhwc(float(N, C, H, W) X) -> (O) { O(n, h, w, c) = X(n, c, h, w) }"
ROWSUM = "def rowsum(float(M, N) A) -> (B) { B(m) +=! A(m, r_n) }"
INTEGER_GEMM = """def qmm(uint8(M, K) A, int8(K, N) B, uint8 ZA, int8(N) ZB) -> (Y) {
    Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * (int32(B(r_k, n)) - int32(ZB(n))) }"""
INTEGER_DEPTHWISE = """def qdw(uint8(N, C, H, W) X, int16(C, KH, KW) F, int32(C) B, float(C) S) -> (Y) {
    P(n, c, h, w) +=! (int32(X(n, c, h + r_kh, w + r_kw)) - 7) * int32(F(c, r_kh, r_kw))
    Y(n, c, h, w) = uint8(fmin(fmax(rint(float(P(n, c, h, w) + B(c)) * S(c)) + float(3), float(0)), float(255))) }"""

#: path -> (source, sizes, options, the path an option (or a def) just outside the form takes, those options)
CASES = {
    "gemm": (MATMUL, {"M": 64, "K": 64, "N": 64}, {}, "generic", {"blas_contractions": False}),
    "gemv": (MATVEC, {"M": 64, "K": 64}, {}, "generic", {"blas_contractions": False}),
    "integer_gemm": (INTEGER_GEMM, {"M": 13, "K": 70, "N": 33}, {}, "generic", {"blas_contractions": False}),
    "integer_depthwise": (
        INTEGER_DEPTHWISE,
        {"N": 1, "C": 4, "H": 8, "W": 9, "KH": 3, "KW": 3},
        {},
        "generic",
        {"direct_convolutions": False},
    ),
    "winograd": (WINOGRAD, {}, {"winograd": True}, "direct_convolution", {"winograd": False}),
    "depthwise": (
        DEPTHWISE,
        {"N": 1, "H": 9, "W": 11, "C": 20, "KH": 3, "KW": 3},
        {},
        "generic",
        {"direct_convolutions": False},
    ),
    "direct_convolution": (
        NCHW_CONV,
        {"N": 1, "C": 3, "H": 9, "W": 8, "F": 5, "KH": 3, "KW": 3},
        {},
        "generic",
        {"direct_convolutions": False},
    ),
    "pointwise_depthwise": (
        POINTWISE_DEPTHWISE,
        {"N": 1, "H": 6, "W": 7, "C": 8, "E": 24},
        {},
        "generic",
        {"direct_convolutions": False},
    ),
    "segments": (SEGMENTS, {"M": 20, "N": 24, "K": 16}, {}, "generic", {"blas_contractions": False}),
    "transpose": (TRANSPOSE, {"N": 2, "C": 19, "H": 5, "W": 7}, {}, "generic", {"transpose_kernels": False}),
    "user_schedule": (
        MATMUL,
        {"M": 64, "K": 64, "N": 64},
        {"schedule": "[M, N, K] -> { S0_init[m, n] -> [m, n, 0]; S0[m, n, r_k] -> [m, n, K - r_k] }"},
        "gemm",
        {"schedule": None},
    ),
    "generic": (ROWSUM, {"M": 16, "N": 8}, {}, None, {}),
}


def define(source: str, **options):
    module = polyc.define(source, **options)
    return getattr(module, module.names[0])


def test_every_cpu_path_has_a_case_and_names_are_unique():
    names = [path.name for path in KERNEL_PATHS]
    assert len(names) == len(set(names))
    assert {name for name in names if "c" in kernel_path(name).backends} == set(CASES)
    assert names[-1] == "generic", "the path every def matches comes last"


def test_the_options_a_path_reads_are_options():
    fields = {f.name for f in dataclasses.fields(Options)}
    for path in KERNEL_PATHS:
        assert set(path.options) <= fields, path.name


@pytest.mark.parametrize("name", list(CASES))
def test_a_def_of_the_form_takes_the_path_and_computes_what_the_interpreter_does(name):
    source, sizes, options, _, _ = CASES[name]
    kernel = define(source, **options)
    stages = kernel.stages(sizes)
    assert stages.path == name
    assert kernel.explain(sizes).path == name
    assert space_for(kernel.definition, sizes, kernel.options).path == name
    arguments = kernel_arguments(kernel, sizes)
    expected = define(source, backend="interpreter")(*arguments)
    got = kernel(*arguments)
    expected, got = (r if isinstance(r, tuple) else (r,) for r in (expected, got))
    assert len(got) == len(expected)
    for ours, theirs in zip(got, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] is not None])
def test_outside_the_form_another_path_takes_the_def(name):
    source, sizes, options, other, other_options = CASES[name]
    kernel = define(source, **{**options, **other_options})
    assert kernel.stages(sizes).path == other


def test_a_segmented_def_records_each_segments_path():
    source, sizes, _, _, _ = CASES["segments"]
    stages = define(source).stages(sizes)
    assert [part.path for part in stages.segments] == ["generic", "gemm"]


def test_the_gpu_path_is_the_only_one_for_the_gpu_back_ends():
    kernel = define(ROWSUM, backend="opencl")
    path, match = choose_path(PathRequest(kernel.definition, kernel.options, {"M": 4, "N": 4}))
    assert path.name == "gpu_mapping" and match == "opencl"
    assert kernel.gpu_stages({"M": 4, "N": 4}).path == "gpu_mapping"


def test_an_unknown_path_name_is_a_clear_error():
    with pytest.raises(
        polyc.PolycError, match="no kernel path is called 'gem'; the paths are: gpu_mapping, user_schedule, gemv"
    ):
        kernel_path("gem")


def kernel_arguments(kernel, sizes):
    """Random inputs of the shapes ``sizes`` give (the def's fixed extents where it has them)."""
    rng = np.random.default_rng(0)
    arguments = []
    for name in kernel.definition.inputs:
        tensor = kernel.definition.tensor(name)
        shape = tuple(d.evaluate(sizes) for d in tensor.shape)
        if tensor.dtype.kind in "iu":  # integers over their whole range (8-bit operands, zero points)
            info = np.iinfo(tensor.dtype)
            arguments.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(tensor.dtype))
            continue
        arguments.append(rng.standard_normal(shape).astype(tensor.dtype) if shape else np.array(1.5, tensor.dtype))
    return arguments
