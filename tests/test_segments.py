"""Defs compiled in segments: contraction kernels with scale factors and guards, generic code
between them, linked into one kernel (polyc/schedule/segments.py, polyc/codegen/link.py).

Every compiled result is checked against numpy, written here by hand (never through polyc: the
interpreter shares polyc's front end and range inference with the compiled path), with TC's
tolerance ``ops * eps * max|input|``.  ``ops`` is the reduction length of the statement an
output comes from, plus those of the temporaries it reads (TC's rule per statement, a
temporary's error carried into the next), plus a few for scale factors, an accumulated
starting value and an epilogue: never the sum of all sizes, which for most kernels is many
times looser."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from builds import builds

import polyc
from polyc.lang.sema import check_source
from polyc.schedule.segments import plan_segments, split_sums
from tests.kernels import assert_close

POLYBENCH = {
    "gemm": """def gemm(double alpha, double beta, double(NI, NJ) C, double(NI, NK) A, double(NK, NJ) B) -> (Cout) {
        Cout(i, j) = beta * C(i, j)
        Cout(i, j) += alpha * A(i, r_k) * B(r_k, j)
    }""",
    "2mm": """def two_mm(double alpha, double beta, double(NI, NK) A, double(NK, NJ) B, double(NJ, NL) C,
                       double(NI, NL) D) -> (Dout) {
        tmp(i, j) +=! alpha * A(i, r_k) * B(r_k, j)
        Dout(i, l) = beta * D(i, l)
        Dout(i, l) += tmp(i, r_j) * C(r_j, l)
    }""",
    "3mm": """def three_mm(double(NI, NK) A, double(NK, NJ) B, double(NJ, NM) C, double(NM, NL) D) -> (G) {
        E(i, j) +=! A(i, r_k) * B(r_k, j)
        F(j, l) +=! C(j, r_m) * D(r_m, l)
        G(i, l) +=! E(i, r_j) * F(r_j, l)
    }""",
    "syrk": """def syrk(double alpha, double beta, double(N, N) C, double(N, M) A) -> (Cout) {
        Cout(i, j) = j <= i ? beta * C(i, j) : C(i, j) where i in 0:N, j in 0:N
        Cout(i, j) += j <= i ? alpha * A(i, r_k) * A(j, r_k) : 0 where i in 0:N, j in 0:N, r_k in 0:M
    }""",
    "syr2k": """def syr2k(double alpha, double beta, double(N, N) C, double(N, M) A, double(N, M) B) -> (Cout) {
        Cout(i, j) = j <= i ? beta * C(i, j) : C(i, j) where i in 0:N, j in 0:N
        Cout(i, j) += j <= i ? A(j, r_k) * alpha * B(i, r_k) + B(j, r_k) * alpha * A(i, r_k) : 0
            where i in 0:N, j in 0:N, r_k in 0:M
    }""",
}


def lower_triangle(C, updated):
    """PolyBench's syrk/syr2k: ``updated`` where j <= i, C elsewhere."""
    return np.where(np.tri(len(C), dtype=bool), updated, C)


#: name -> (numpy on float64 inputs, ops(sizes)).
POLYBENCH_NUMPY = {
    "gemm": (lambda alpha, beta, C, A, B: beta * C + alpha * (A @ B), lambda s: s["NK"] + 2),
    "2mm": (lambda alpha, beta, A, B, C, D: beta * D + (alpha * (A @ B)) @ C, lambda s: s["NK"] + s["NJ"] + 3),
    "3mm": (lambda A, B, C, D: (A @ B) @ (C @ D), lambda s: max(s["NK"], s["NM"]) + s["NJ"]),
    "syrk": (lambda alpha, beta, C, A: lower_triangle(C, beta * C + alpha * (A @ A.T)), lambda s: s["M"] + 2),
    "syr2k": (
        lambda alpha, beta, C, A, B: lower_triangle(C, beta * C + alpha * (A @ B.T + B @ A.T)),
        lambda s: 2 * s["M"] + 3,
    ),
}

EXPECTED_KINDS = {
    "gemm": ["generic", "gemm"],
    "2mm": ["gemm", "generic", "gemm"],
    "3mm": ["gemm", "gemm", "gemm"],
    "syrk": ["generic", "gemm"],
    "syr2k": ["generic", "gemm", "gemm"],
}


def definition_of(source: str):
    return check_source(source)[0]


@pytest.mark.parametrize("name", sorted(POLYBENCH))
def test_polybench_linear_algebra_is_cut_into_contraction_kernels(name):
    segments = plan_segments(definition_of(POLYBENCH[name]))
    assert [s.kind for s in segments] == EXPECTED_KINDS[name]
    for segment in segments:
        assert (segment.contraction is not None) == (segment.kind == "gemm")


def test_scale_and_guard_are_recognised():
    segments = plan_segments(definition_of(POLYBENCH["syrk"]))
    contraction = segments[1].contraction
    assert len(contraction.scale) == 1 and not contraction.init
    assert [str(g) for g in contraction.guard] == ["i - j"]


def test_a_sum_of_contractions_is_split_keeping_every_reduction_index():
    definition = definition_of(POLYBENCH["syr2k"])
    parts = split_sums(definition)
    assert len(parts) == 3
    assert parts[1].reduction_indices == parts[2].reduction_indices == ("r_k",)
    assert parts[1].init is False and parts[2].init is False


def test_a_sum_that_is_not_all_contractions_is_left_whole():
    definition = definition_of("""def f(float(M, K) A, float(K, N) B, float(M) b) -> (C) {
        C(m, n) +=! A(m, r_k) * B(r_k, n) + b(m)
    }""")
    assert len(split_sums(definition)) == 1
    assert plan_segments(definition) is None


def test_nothing_to_cut():
    assert plan_segments(definition_of("def f(float(N) x) -> (y) { y(i) = x(i) * 2 }")) is None
    single = "def f(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
    assert plan_segments(definition_of(single)) is None  # one gemm kernel, no segments needed


SIZES = {
    "gemm": [dict(NI=1, NJ=1, NK=1), dict(NI=37, NJ=45, NK=29), dict(NI=130, NJ=70, NK=260)],
    "2mm": [dict(NI=3, NJ=2, NK=5, NL=7), dict(NI=41, NJ=67, NK=33, NL=50)],
    "3mm": [dict(NI=9, NJ=8, NK=7, NL=6, NM=5), dict(NI=70, NJ=31, NK=45, NL=66, NM=20)],
    "syrk": [dict(N=1, M=1), dict(N=50, M=13), dict(N=203, M=77)],
    "syr2k": [dict(N=2, M=3), dict(N=97, M=40)],
}


def _inputs(definition, sizes, dtype, rng):
    arrays = []
    for name in definition.inputs:
        shape = definition.tensor(name).concrete_shape(sizes)
        arrays.append(np.asarray(rng.uniform(-1, 1, size=shape), dtype=dtype))
    return arrays


def _check(source: str, sizes, reference, ops, dtype=np.float64, outputs=None, **options):
    """Compile ``source``, run it on random inputs in [-1, 1) (and ``outputs`` to accumulate
    into) and compare with ``reference`` (numpy on float64 copies of the inputs, then of the
    outputs) within ``ops(sizes)`` operations of TC's tolerance.  Returns the kernel."""
    rng = np.random.default_rng(0)
    name = definition_of(source).name
    kernel = polyc.define(source, **options)[name]
    inputs = _inputs(kernel.definition, sizes, dtype, rng)
    if outputs is None:
        got = kernel(*inputs)
        want = reference(*(np.asarray(x, dtype=np.float64) for x in inputs))
    else:
        got = kernel(*inputs, outputs=[o.copy() for o in outputs])
        want = reference(*(np.asarray(x, dtype=np.float64) for x in (*inputs, *outputs)))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, ops(sizes), dtype, (*inputs, *(outputs or ())))
    return kernel


@pytest.mark.parametrize("name,sizes", [(n, s) for n in sorted(SIZES) for s in SIZES[n]])
def test_segmented_polybench_against_numpy(name, sizes):
    kernel = _check(POLYBENCH[name], sizes, *POLYBENCH_NUMPY[name])
    assert len(kernel.stages(sizes).segments) == len(EXPECTED_KINDS[name])


@pytest.mark.parametrize(
    "options", [dict(specialize=False), dict(parallel=False), dict(vectorize=False), dict(tile_sizes=(8, 16, 5))]
)
@pytest.mark.parametrize("name", ["2mm", "syr2k"])
def test_segments_under_options(name, options):
    _check(POLYBENCH[name], SIZES[name][-1], *POLYBENCH_NUMPY[name], **options)


GUARDS = ["j <= i", "j < i", "i <= j", "j < i + 3 && i < j + 40", "i == j", "i + j < N", "j >= 5"]


def guard_mask(guard: str, n: int) -> np.ndarray:
    """Where the TC condition ``guard`` on (i, j) holds over an n x n target."""
    i, j = np.indices((n, n))
    return eval("(" + guard.replace("&&", ") & (") + ")", {"i": i, "j": j, "N": n})


@pytest.mark.parametrize("init", ["+=!", "+="])
@pytest.mark.parametrize("guard", GUARDS)
def test_guarded_contractions(guard, init):
    source = f"""def f(float(N, K) A, float(K, N) B) -> (C) {{
        C(i, j) {init} {guard} ? A(i, r_k) * B(r_k, j) : 0 where i in 0:N, j in 0:N, r_k in 0:K
    }}"""
    for sizes in (dict(N=1, K=1), dict(N=23, K=5), dict(N=150, K=70)):
        n = sizes["N"]
        if init == "+=":  # accumulates into C: give it a starting value
            C0 = np.random.default_rng(1).uniform(-1, 1, (n, n)).astype(np.float32)
            kernel = _check(
                source,
                sizes,
                lambda A, B, C: C + np.where(guard_mask(guard, n), A @ B, 0),
                lambda s: s["K"] + 1,
                np.float32,
                outputs=(C0,),
            )
        else:
            kernel = _check(
                source, sizes, lambda A, B: np.where(guard_mask(guard, n), A @ B, 0), lambda s: s["K"], np.float32
            )
        assert kernel.stages(sizes).contraction is not None


def test_scaled_contraction_with_epilogue():
    source = """def f(float a, float(M, K) A, float(K, N) B, float(N) bias) -> (C) {
        C(m, n) +=! 0.5 * A(m, r_k) * a * B(r_k, n)
        C(m, n) = fmax(C(m, n) + bias(n), 0)
    }"""
    for sizes in (dict(M=1, K=1, N=1), dict(M=65, K=33, N=100)):
        kernel = _check(
            source,
            sizes,
            lambda a, A, B, bias: np.maximum(0.5 * a * (A @ B) + bias, 0),
            lambda s: s["K"] + 3,
            np.float32,
        )
        assert kernel.stages(sizes).contraction.scale


def test_linked_source_has_one_prelude_and_separate_helpers():
    kernel = polyc.define(POLYBENCH["3mm"]).three_mm
    source = kernel.c_source(SIZES["3mm"][-1])
    assert source.count("---- polyc prelude") == 1
    for k in range(3):
        assert f"static int polyc_p{k}_three_mm_part{k}(" in source
        assert f"polyc_p{k}_gemm_t" in source
    assert "int polyc_three_mm(" in source


@pytest.mark.parametrize("sizes", [dict(NI=8, NJ=9, NK=10), None])
def test_segmented_kernel_exports_compile(tmp_path, sizes):
    kernel = polyc.define(POLYBENCH["2mm"]).two_mm
    c_path, h_path = kernel.export_c(tmp_path, sizes and dict(sizes, NL=11), target="host")
    assert "int polyc_two_mm(" in h_path.read_text()
    main = tmp_path / "use.c"
    main.write_text(f'#include "{h_path.name}"\nint main(void) {{ return 0; }}\n')
    result = subprocess.run(
        ["gcc", "-std=gnu11", "-fopenmp", "-O1", "-c", str(c_path), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    result = subprocess.run(
        ["gcc", "-std=gnu11", "-c", str(main), "-o", str(tmp_path / "use.o")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------- matrix-vector
MATVEC = {
    "rows": "def f(float(M, K) A, float(K) x) -> (y) { y(i) +=! A(i, r_k) * x(r_k) }",
    "columns": "def f(float(K, M) A, float(K) x) -> (y) { y(i) +=! x(r_k) * A(r_k, i) }",
    "accumulating": "def f(float(M, K) A, float(K) x) -> (y) { y(i) += A(i, r_k) * x(r_k) }",
    "scaled_with_epilogue": """def f(float a, float(K, M) A, float(K) x, float(M) z) -> (y) {
        y(i) +=! a * A(r_k, i) * 3 * x(r_k)
        y(i) = tanh(y(i) + z(i))
    }""",
    "multi_index": "def f(float(M, H, K, L) A, float(K, L) x) -> (y) { y(i, h) +=! A(i, h, r_k, r_l) * x(r_k, r_l) }",
    "multi_index_columns": "def f(float(K, M, H) A, float(K) x) -> (y) { y(i, h) +=! A(r_k, i, h) * x(r_k) }",
}
#: name -> (numpy on float64 inputs (then the starting y), ops(sizes)); tanh adds a few ulp.
MATVEC_NUMPY = {
    "rows": (lambda A, x: A @ x, lambda s: s["K"]),
    "columns": (lambda A, x: A.T @ x, lambda s: s["K"]),
    "accumulating": (lambda A, x, y: y + A @ x, lambda s: s["K"] + 1),
    "scaled_with_epilogue": (lambda a, A, x, z: np.tanh(a * 3 * (A.T @ x) + z), lambda s: s["K"] + 6),
    "multi_index": (lambda A, x: np.einsum("ihkl,kl->ih", A, x), lambda s: s["K"] * s["L"]),
    "multi_index_columns": (lambda A, x: np.einsum("kih,k->ih", A, x), lambda s: s["K"]),
}
MATVEC_SIZES = [
    dict(M=1, K=1, H=1, L=1),
    dict(M=7, K=3, H=2, L=5),
    dict(M=333, K=129, H=3, L=2),
    dict(M=1500, K=70, H=2, L=3),
]


def _matvec_sizes(name, sizes):
    used = definition_of(MATVEC[name]).sizes
    return {k: v for k, v in sizes.items() if k in used}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(MATVEC))
def test_matrix_vector_kernels(name, dtype):
    source = MATVEC[name].replace("float", "double") if dtype == np.float64 else MATVEC[name]
    source = source.replace("double a,", "double a,")
    for sizes in MATVEC_SIZES:
        sizes = _matvec_sizes(name, sizes)
        if name == "accumulating":
            y0 = np.random.default_rng(2).uniform(-1, 1, sizes["M"]).astype(dtype)
            kernel = _check(source, sizes, *MATVEC_NUMPY[name], dtype, outputs=(y0,))
        else:
            kernel = _check(source, sizes, *MATVEC_NUMPY[name], dtype)
        assert kernel.stages(sizes).contraction.is_matvec


@pytest.mark.parametrize("options", [dict(specialize=False), dict(parallel=False), dict(vectorize=False)])
@pytest.mark.parametrize("name", ["rows", "columns", "scaled_with_epilogue"])
def test_matrix_vector_kernels_under_options(name, options):
    _check(MATVEC[name], _matvec_sizes(name, MATVEC_SIZES[-1]), *MATVEC_NUMPY[name], np.float32, **options)


@builds("native", "avx2", "portable")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matrix_vector_rows_in_every_instruction_set(cflags, dtype):
    """The rows loop's vector partial sums: several blocks of SUM_BLOCK columns, a last block
    that ends inside a vector, rows past a multiple of four, accumulation into y."""
    for name in ("rows", "accumulating"):
        source = MATVEC[name].replace("float", "double") if dtype == np.float64 else MATVEC[name]
        for sizes in (dict(M=9, K=531), dict(M=6, K=1031), dict(M=3, K=13)):
            outputs = (
                (np.random.default_rng(2).uniform(-1, 1, sizes["M"]).astype(dtype),) if name == "accumulating" else None
            )
            kernel = _check(source, sizes, *MATVEC_NUMPY[name], dtype, outputs=outputs, cflags=cflags, specialize=False)
        assert kernel.stages(sizes).contraction.is_matvec


def test_matrix_vector_layouts_the_kernel_does_not_stream_stay_generic():
    source = "def f(float(M, K, L) A, float(L, K) x) -> (y) { y(i) +=! A(i, r_k, r_l) * x(r_l, r_k) }"
    sizes = dict(M=9, K=4, L=3)
    kernel = _check(source, sizes, lambda A, x: np.einsum("ikl,lk->i", A, x), lambda s: s["K"] * s["L"], np.float32)
    assert kernel.stages(sizes).contraction is None


def _gemver(alpha, beta, A, u1, v1, u2, v2, y, z):
    A2 = A + np.outer(u1, v1) + np.outer(u2, v2)
    x = beta * (A2.T @ y) + z
    return A2, x, alpha * (A2 @ x)


MATVEC_POLYBENCH = {
    "atax": (
        """def atax(double(M, N) A, double(N) x) -> (y) {
        tmp(i) +=! A(i, r_j) * x(r_j)
        y(j) +=! A(r_i, j) * tmp(r_i)
    }""",
        ["gemv", "gemv"],
        dict(M=190, N=210),
        lambda A, x: A.T @ (A @ x),
        lambda s: s["N"] + s["M"],
    ),
    "gemver": (
        """def gemver(double alpha, double beta, double(N, N) A, double(N) u1, double(N) v1, double(N) u2,
               double(N) v2, double(N) y, double(N) z) -> (A2, x, w) {
        A2(i, j) = A(i, j) + u1(i) * v1(j) + u2(i) * v2(j)
        x(i) +=! beta * A2(r_j, i) * y(r_j)
        x(i) = x(i) + z(i)
        w(i) +=! alpha * A2(i, r_j) * x(r_j)
    }""",
        ["generic", "gemv", "gemv"],
        dict(N=301),
        _gemver,
        lambda s: 2 * s["N"] + 6,
    ),
    "gesummv": (
        """def gesummv(double alpha, double beta, double(N, N) A, double(N, N) B, double(N) x) -> (y) {
        tmp(i) +=! A(i, r_j) * x(r_j)
        y(i) +=! B(i, r_j) * x(r_j)
        y(i) = alpha * tmp(i) + beta * y(i)
    }""",
        ["gemv", "gemv"],
        dict(N=130),
        lambda alpha, beta, A, B, x: alpha * (A @ x) + beta * (B @ x),
        lambda s: s["N"] + 2,
    ),
}


@pytest.mark.parametrize("name", sorted(MATVEC_POLYBENCH))
def test_polybench_matrix_vector_kernels(name):
    source, kinds, sizes, reference, ops = MATVEC_POLYBENCH[name]
    assert [s.kind for s in plan_segments(definition_of(source))] == kinds
    _check(source, sizes, reference, ops)
