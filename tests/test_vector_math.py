"""polyc's vectorisable elementary functions (polyc/codegen/vector_math.py) and the kernels that
use them: accuracy against a more precise reference, numpy's special values, vectorisation by
gcc without -ffast-math, and the fused, vectorised row-wise loop nests of softmax-like kernels.

The accuracy tests sample a few million inputs per function (random bit patterns, ranges where
the function is interesting, and every special value).  The exhaustive float32 measurement
behind the bounds in vector_math.py is ``python -m tests.test_vector_math`` (minutes).
"""

from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess
import sys

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc.codegen.c_expr import PRELUDE
from polyc.codegen.vector_math import ULP_BOUNDS, VECTOR_MATH_FUNCTIONS
from polyc.runtime import CompilerOptions, get_function, get_or_build, load_library

FLOAT32, FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)

#: The functions with their own float32/float64 implementations, as (builtin, dtype) pairs.
FUNCTIONS = [
    (name, dtype)
    for name, names in VECTOR_MATH_FUNCTIONS.items()
    if name not in ("min", "max")
    for dtype, c_name in zip((FLOAT32, FLOAT64), names)
    if c_name is not None
]
TRANSCENDENTAL = [(name, dtype) for name, dtype in FUNCTIONS if name not in ("fmin", "fmax")]

#: Compiled as the tests of c_expr.py compile: no FMA contraction, no fast math.
OPTIONS = CompilerOptions(extra_flags=("-ffp-contract=off", "-fno-fast-math"), openmp=False)

LONG_DOUBLE_IS_WIDER = np.finfo(np.longdouble).nmant >= 63

SPECIAL_VALUES = [
    0.0,
    -0.0,
    np.inf,
    -np.inf,
    np.nan,
    -np.nan,
    1.0,
    -1.0,
    2.0,
    0.5,
    1e-45,
    -1e-45,
    1e-310,
    -1e-310,
    1.1754944e-38,
    2.2250738585072014e-308,
    3.4028235e38,
    -3.4028235e38,
    1.7976931348623157e308,
    88.72283,
    88.72284,
    89.0,
    -87.33655,
    -103.97208,
    -103.98,
    -104.0,
    709.782712893384,
    709.79,
    -708.39641,
    -745.1332191019411,
    -745.2,
    -746.0,
    0.34657359,
    -0.34657359,
    0.7,
    -0.7,
    20.0,
    -20.0,
    22.0,
    9.01,
    -9.01,
    1e-8,
    -1e-8,
    1e-20,
    -0.9999999,
    -1.0000001,
    1e30,
    -1e30,
]


#: Inputs where a function once erred most (kept so that the error cannot come back unseen):
#: log1p before its correction was added inside log's sum, 1.61 ulp (200-bit reference).
KNOWN_WORST = {
    ("log1p", "float64"): [-0.30029474603159906, -0.33483426326755955],
    # erf's worst with FMA contraction (degree-14 branch) and without (x + x p(x^2))
    ("erf", "float32"): [1.03402209, 0.998232007],
    # tanh's worst, with and without FMA contraction: 1 - 2 / (exp(2|x|) + 1) near 0.75
    ("tanh", "float32"): [0.873041391, 0.867773533],
}


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache for this module, so the tests never touch the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
        yield


def _c_name(name: str, dtype: np.dtype) -> str:
    return VECTOR_MATH_FUNCTIONS[name][0 if dtype == FLOAT32 else 1]


def _harness(functions) -> str:
    """C with one ``apply_<builtin>_<type>(x, y, n)`` per function: y[i] = f(x[i]) under omp simd."""
    lines = [PRELUDE]
    for name, dtype in functions:
        ctype = "float" if dtype == FLOAT32 else "double"
        arguments = "x[i], y[i]" if name in ("fmin", "fmax") else "x[i]"  # (x, x) would fold to a copy
        lines.append(
            f"void apply_{name}_{dtype.name}(const {ctype} *restrict x, {ctype} *restrict y, int64_t n)\n"
            f"{{\n    #pragma omp simd\n    for (int64_t i = 0; i < n; i++) y[i] = {_c_name(name, dtype)}"
            f"({arguments});\n}}\n"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def library():
    return load_library(get_or_build(_harness(FUNCTIONS), OPTIONS))


def apply(library, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    y = np.empty_like(x)
    function = get_function(library, f"apply_{name}_{x.dtype.name}", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64])
    function(x.ctypes.data, y.ctypes.data, x.size)
    return y


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    """``name`` of x, far more accurate than x's type: float64 for float32, long double for float64."""
    wide = np.float64 if x.dtype == FLOAT32 else np.longdouble
    with np.errstate(all="ignore"):
        if name == "erf":  # numpy has none; polyc's is float32 only, so double suffices
            from scipy.special import erf

            return erf(x.astype(np.float64))
        return getattr(np, name)(x.astype(wide))


def ulp_errors(result: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|result - exact| in units in the last place of ``exact`` rounded to result's type
    (subnormals count in the smallest subnormal), element by element.

    Where ``result`` or ``exact`` is NaN or infinite, the error is 0 if ``result`` is what
    ``exact`` rounds to (NaN for NaN, the same infinity, also on overflow) and infinite
    otherwise: a NaN or inf for an input whose result is finite is an error, not a skipped
    element.
    """
    dtype = result.dtype
    errors = np.full(result.shape, np.inf)
    with np.errstate(all="ignore"):
        rounded = exact.astype(dtype)
        finite = np.isfinite(result) & np.isfinite(exact)
        same_special = ~finite & ((np.isnan(result) & np.isnan(rounded)) | (result == rounded))
        errors[same_special] = 0.0
        info = np.finfo(dtype)
        exponent = np.floor(np.log2(np.maximum(np.abs(exact[finite]), info.tiny)))
        ulp = np.exp2(exponent - info.nmant).astype(exact.dtype)
        errors[finite] = np.abs(result[finite].astype(exact.dtype) - exact[finite]) / ulp
    return errors


def test_ulp_errors_counts_nan_and_inf_results_as_errors():
    # Negative control: a NaN or inf where the exact value is finite must not be skipped.
    errors = ulp_errors(
        np.array([1.0, np.nan, np.inf, -np.inf, np.nan, np.inf]),
        np.array([1.0, 2.0, 3.0, -np.inf, np.nan, 1e309], dtype=np.longdouble),
    )
    assert errors.tolist() == [0.0, np.inf, np.inf, 0.0, 0.0, 0.0]


def test_a_vector_exp_returning_nan_for_one_input_is_reported(library):
    x = sample_inputs("exp", FLOAT32, 10_000)
    result = apply(library, "exp", x)
    finite = np.flatnonzero(np.isfinite(result))
    result[finite[len(finite) // 2]] = np.nan
    assert ulp_errors(result, _reference("exp", x)).max() == np.inf


def sample_inputs(name: str, dtype: np.dtype, count: int, seed: int = 0) -> np.ndarray:
    """Random bit patterns (all magnitudes), values spread over the interesting range, and the
    special values."""
    rng = np.random.default_rng(seed)
    bits = np.dtype(f"u{dtype.itemsize}")
    patterns = rng.integers(0, np.iinfo(bits).max, count // 2, dtype=bits, endpoint=True).view(dtype)
    span = {"log": 5.0, "log1p": 5.0, "log2": 5.0, "log10": 5.0}.get(name, 50.0 if dtype == FLOAT32 else 400.0)
    spread = rng.standard_normal(count // 2) * span * 10.0 ** rng.integers(-6, 1, count // 2)
    if name.startswith("log"):
        spread = np.abs(spread) - (1.0 if name == "log1p" else 0.0) + rng.random(count // 2) * 1e-3
    with np.errstate(over="ignore"):
        special = np.array(SPECIAL_VALUES).astype(dtype)
    known = np.array(KNOWN_WORST.get((name, dtype.name), []), dtype=dtype)
    return np.concatenate([patterns, spread.astype(dtype), special, -special, known])


@pytest.mark.parametrize("name, dtype", TRANSCENDENTAL, ids=lambda v: getattr(v, "name", v))
def test_accuracy_within_documented_bound(library, name, dtype):
    if dtype == FLOAT64 and not LONG_DOUBLE_IS_WIDER:
        pytest.skip("long double is no wider than double here: no reference for float64")
    x = sample_inputs(name, dtype, 4_000_000 if dtype == FLOAT32 else 1_000_000)
    errors = ulp_errors(apply(library, name, x), _reference(name, x))
    worst = float(errors.max())
    assert worst <= ULP_BOUNDS[name, dtype.name], f"{name} {dtype}: {worst:.3f} ulp"


@pytest.mark.parametrize("name, dtype", TRANSCENDENTAL, ids=lambda v: getattr(v, "name", v))
def test_special_values_are_numpys(library, name, dtype):
    with np.errstate(over="ignore"):
        x = np.array(SPECIAL_VALUES + [-v for v in SPECIAL_VALUES]).astype(dtype)
    result = apply(library, name, x)
    with np.errstate(all="ignore"):
        expected = _reference(name, x).astype(dtype)
    same_class = (np.isnan(result) == np.isnan(expected)) & (np.isinf(result) == np.isinf(expected))
    assert same_class.all(), f"{x[~same_class]} -> {result[~same_class]}, numpy {expected[~same_class]}"
    exact = np.isinf(expected) | (expected == 0)  # infinite and zero results, with their sign
    np.testing.assert_array_equal(np.signbit(result[exact]), np.signbit(expected[exact]), err_msg=f"{x[exact]}")
    np.testing.assert_array_equal(result[exact], expected[exact])


def test_fmax_and_fmin_ignore_nan():
    """NaN in either argument gives the other (the sign of a zero from zeros of both signs is
    unspecified, as in C, and numpy's differs between scalars and arrays); in scalar code and
    in vector loops with their scalar tails, with a variable second argument and a constant
    one (a clip, folded differently by gcc)."""
    source = (
        PRELUDE
        + """
void pairs(const double *a, const double *b, double *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        out[2 * i] = polyc_fmax(a[i], b[i]);
        out[2 * i + 1] = polyc_fminf((float)a[i], (float)b[i]);
    }
}
void vectors(const float *a, const float *b, float *out, int64_t n) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = polyc_fmaxf(a[i], b[i]);
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) out[n + i] = polyc_fminf(a[i], b[i]);
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) out[2 * n + i] = polyc_fminf(polyc_fmaxf(a[i], 0.0f), 6.0f);
}"""
    )
    library = load_library(get_or_build(source, OPTIONS))
    pairs = get_function(library, "pairs", [ctypes.c_void_p] * 3 + [ctypes.c_int64])
    a = np.array([1.0, np.nan, 2.0, np.nan, -np.inf, 3.0, -0.0, 0.0, -0.0, 4.0])
    b = np.array([np.nan, 1.0, 5.0, np.nan, 2.0, -1.0, 0.0, -0.0, -0.0, 4.0])
    out = np.empty(2 * a.size)
    pairs(a.ctypes.data, b.ctypes.data, out.ctypes.data, a.size)
    np.testing.assert_array_equal(out[0::2], np.fmax(a, b))
    np.testing.assert_array_equal(out[1::2], np.fmin(a, b))
    vectors = get_function(library, "vectors", [ctypes.c_void_p] * 3 + [ctypes.c_int64])
    a32, b32 = np.tile(a, 4).astype(np.float32)[:37], np.tile(b[::-1], 4).astype(np.float32)[:37]  # 37: tails
    a32[::3] = np.linspace(-3, 9, a32[::3].size)
    out32 = np.empty(3 * a32.size, np.float32)
    vectors(a32.ctypes.data, b32.ctypes.data, out32.ctypes.data, a32.size)
    clip = np.fmin(np.fmax(a32, np.float32(0)), np.float32(6))
    for got, expected in zip(np.split(out32, 3), (np.fmax(a32, b32), np.fmin(a32, b32), clip)):
        np.testing.assert_array_equal(got, expected)


#: Instruction sets the functions must vectorise for, whatever the host: (compiler, flags).  The
#: AVX2 machines lack AVX-512DQ's int64 <-> double conversions, which once left float64 log scalar.
VECTOR_ISAS = {
    "native": ("gcc", ("-march=native",)),
    "avx2": ("gcc", ("-mavx2", "-mfma")),
    "avx512": ("gcc", ("-march=skylake-avx512",)),
    "neon": ("aarch64-linux-gnu-gcc", ("-march=armv8-a+simd",)),
}


@pytest.mark.parametrize("isa", VECTOR_ISAS)
def test_gcc_vectorises_every_function_without_fast_math(tmp_path, isa):
    compiler, flags = VECTOR_ISAS[isa]
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed (Debian gcc-aarch64-linux-gnu for neon)")
    source = tmp_path / "loops.c"
    source.write_text(_harness(FUNCTIONS))
    report = subprocess.run(
        [
            compiler,
            "-O3",
            *flags,
            "-std=gnu11",
            "-fopenmp",
            "-fopt-info-vec-optimized",
            "-c",
            str(source),
            "-o",
            str(tmp_path / "loops.o"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    vectorised = {int(line) for line in re.findall(r"loops\.c:(\d+):\d+: optimized: loop vectorized", report)}
    lines = source.read_text().splitlines()
    for name, dtype in FUNCTIONS:
        header = next(k for k, line in enumerate(lines, 1) if f"apply_{name}_{dtype.name}(" in line)
        assert header + 3 in vectorised, f"{_c_name(name, dtype)} did not vectorise for {isa}"


# ----------------------------------------------------------------------------- kernels
ROW_WISE = """
def softmax(float(N, D) X) -> (O) {
    M(n) max=! X(n, r_d)
    O(n, d) = exp(X(n, d) - M(n))
    S(n) +=! O(n, r_d)
    O(n, d) = O(n, d) / S(n)
}
def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    s(n) +=! X(n, r_d)
    mu(n) = s(n) / D
    v(n) +=! (X(n, r_d) - mu(n)) * (X(n, r_d) - mu(n))
    rstd(n) = rsqrt(v(n) / D + 1e-5)
    Y(n, d) = (X(n, d) - mu(n)) * rstd(n) * gamma(d) + beta(d)
}
def row_max(double(N, D) X) -> (M) { M(n) max=! X(n, r_d) }
def log_sum_exp(double(N, D) X) -> (L) {
    S(n) +=! exp(X(n, r_d))
    L(n) = log(S(n))
}
"""


@pytest.fixture(scope="module")
def kernels():
    return polyc.define(ROW_WISE)


def test_softmax_is_one_parallel_loop_of_vectorised_row_loops(kernels):
    source = kernels.softmax.c_source({"N": 64, "D": 256})
    assert source.count("#pragma omp parallel for") == 1
    assert "#pragma omp simd reduction(max:polyc_acc_M)" in source  # lanes from -inf: see c._reduces_in_lanes
    assert "#pragma omp simd reduction(polyc_sum_float32:polyc_acc_S)" in source
    assert source.count("#pragma omp simd\n") == 2
    assert "polyc_expf(" in source and "expf(" not in source.replace("polyc_expf(", "")


@pytest.mark.parametrize("sizes", [(64, 256), (5, 37), (3, 0), (0, 4)])
def test_softmax_and_layernorm_match_numpy(kernels, sizes):
    n, d = sizes
    rng = np.random.default_rng(n * 1000 + d)
    x = (rng.standard_normal((n, d)) * 4).astype(np.float32)
    gamma, beta = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True, initial=-np.inf))
        expected = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(kernels.softmax(x), expected, rtol=2e-5, atol=1e-7)
    mean = x.mean(axis=1, keepdims=True) if d else np.zeros((n, 1), np.float32)
    with np.errstate(all="ignore"):
        var = ((x - mean) ** 2).sum(axis=1, keepdims=True) / d
        normalised = (x - mean) / np.sqrt(var + np.float32(1e-5)) * gamma + beta
    np.testing.assert_allclose(kernels.layernorm(x, gamma, beta), normalised, rtol=1e-4, atol=1e-4)


def test_vectorised_max_reduction_ignores_nan_like_the_interpreter(kernels):
    x = np.array([[1.0, np.nan, 3.0, -2.0] * 5, [np.nan] * 20, [-np.inf] * 19 + [np.nan]])
    expected = polyc.define(ROW_WISE, backend="interpreter").row_max(x)
    np.testing.assert_array_equal(kernels.row_max(x), expected)
    np.testing.assert_array_equal(expected, [3.0, -np.inf, -np.inf])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_and_min_reductions_ignore_nan_in_every_vector_lane(dtype):
    # Rows a few vectors long with NaNs, infinities and zeros of both signs in every lane
    # position: each lane of the simd loop ignores NaNs, and the lanes' results are combined
    # at its end by polyc's own reduction (max into min there fails this test).
    source = """def extremes(float(N, D) X) -> (M, L) {
        M(n) max=! X(n, r_d)
        L(n) min=! X(n, r_d)
    }""".replace("float", "double" if dtype == np.float64 else "float")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 16 * 8 + 5)).astype(dtype)
    for row in range(64):
        x[row, rng.integers(0, x.shape[1], row % 9)] = np.nan
    x[3, :] = np.nan
    x[5, :] = rng.choice(np.array([0.0, -0.0, np.nan], dtype), x.shape[1])
    x[7, 40] = np.inf
    x[8, 77] = -np.inf
    compiled = polyc.define(source).extremes(x)
    expected = polyc.define(source, backend="interpreter").extremes(x)
    for got, want in zip(compiled, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.isneginf(compiled[0][3]) and compiled[0][5] == 0 and np.isposinf(compiled[0][7])


def test_log_sum_exp_in_double(kernels):
    x = np.random.default_rng(5).standard_normal((33, 129)) * 10
    np.testing.assert_allclose(kernels.log_sum_exp(x), np.log(np.exp(x).sum(axis=1)), rtol=1e-13)


def test_fusion_min_keeps_the_loop_nests_apart():
    # What holds on any machine: the schedule is a sequence of one loop nest per statement,
    # initialisations too (how each nest is tiled and which loop is parallel follow the caches).
    schedule = polyc.define(ROW_WISE, fusion="min").softmax.stages({"N": 64, "D": 256}).optimized_schedule
    sequence = schedule.get_root().child(0)
    assert sequence.get_type() == isl.schedule_node_type.sequence
    nests = [sequence.child(k).filter_get_filter().get_set_list() for k in range(sequence.n_children())]
    assert [nest.n_set() for nest in nests] == [1] * 6
    assert {nest.get_at(0).get_tuple_name() for nest in nests} == {"S0_init", "S0", "S1", "S2_init", "S2", "S3"}


def test_no_fusion_where_the_outer_loop_should_be_tiled():
    # B is read whole for every row i of C: fused into the loop over the rows of A that S
    # needs, the product would give up the reuse of B a tile of i gives.
    source = """
def scaled_product(float(M, K) A, float(K, N) B) -> (C) {
    S(i) +=! A(i, r_k)
    C(i, j) +=! A(i, r_k) * B(r_k, j) / S(i)
}"""
    kernel = polyc.define(source, blas_contractions=False).scaled_product
    assert kernel.c_source({"M": 256, "K": 256, "N": 256}).count("#pragma omp parallel for") == 2
    small = kernel.c_source({"M": 256, "K": 8, "N": 8})  # B fits in the L1 cache: fused
    assert small.count("#pragma omp parallel for") == 1


def test_no_fusion_that_would_walk_a_matrix_across_its_rows():
    # Fused on i, x2's loop over r_j would be innermost and stride A by rows; apart, i stays
    # innermost (mvt from PolyBench).
    source = """
def mvt(double(N) y_1, double(N) y_2, double(N, N) A) -> (x1, x2) {
    x1(i) +=! A(i, r_j) * y_1(r_j)
    x2(i) +=! A(r_j, i) * y_2(r_j)
}"""
    kernel = polyc.define(source, blas_contractions=False).mvt  # the generic path's fusion choice
    c_source = kernel.c_source({"N": 512})
    assert c_source.count("#pragma omp parallel for") == 2
    rng = np.random.default_rng(3)
    y_1, y_2, a = rng.random(512), rng.random(512), rng.random((512, 512))
    x1, x2 = kernel(y_1, y_2, a)
    np.testing.assert_allclose(x1, a @ y_1, rtol=1e-12)
    np.testing.assert_allclose(x2, a.T @ y_2, rtol=1e-12)


def test_reads_under_a_guard_of_the_loop_body_stay_in_the_loop():
    # isl fuses A1 into H1's loop over r_m as one more iteration (r_m = M), under a guard; I's
    # read there is out of bounds, so it must not be loaded before the loop (found by ASan).
    source = """
def mlp2(float(B, M) I, float(N, M) W1, float(N) B1) -> (A1) {
    H1(b, n) +=! I(b, r_m) * W1(n, r_m)
    A1(b, n)  =  fmax(H1(b, n) + B1(n), 0)
}"""
    kernel = polyc.define(source, specialize=False, blas_contractions=False).mlp2  # the generic path
    c_source = kernel.c_source()
    assert "if ((M >= " in c_source and "polyc_invariant" not in c_source
    rng = np.random.default_rng(7)
    i, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((3, 6), (5, 6), (5,)))
    np.testing.assert_allclose(kernel(i, w, b), np.maximum(i @ w.T + b, 0), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    # Exhaustive float32 measurement: every input, against float64 numpy, in chunks.
    harness = load_library(get_or_build(_harness(FUNCTIONS), OPTIONS))
    names = sys.argv[1:] or [name for name, dtype in TRANSCENDENTAL if dtype == FLOAT32]
    for name in names:
        worst, at = 0.0, 0.0
        for start in range(0, 1 << 32, 1 << 24):
            x = np.arange(start, start + (1 << 24), dtype=np.uint64).astype(np.uint32).view(np.float32)
            result, exact = apply(harness, name, x), _reference(name, x)
            errors = ulp_errors(result, exact)
            if errors.size and errors.max() > worst:
                worst, at = float(errors.max()), float(x[errors.argmax()])
        print(f"{name} float32: max {worst:.4f} ulp (at {at!r})")


def test_the_logistic_quotient_is_one_function_as_accurate_as_exp_and_the_quotient():
    """``1 / (1 + exp(-x))`` (ONNX's Sigmoid; SiLU's second factor), the sum in either order, is
    printed as ``polyc_sigmoidf(x)``: within SIGMOID_ULP_BOUND of the exact quotient where that
    is a normal float, and numpy's special values: NaN for NaN, 1 and 0 at the infinities, 0
    exactly where float32 exp(-x) overflows (x < -88.72), 1 where 1 + exp(-x) rounds to 1."""
    from polyc.codegen.vector_math import SIGMOID_ULP_BOUND

    kernels = polyc.define("""
        def logistic(float(N) X) -> (Y) { Y(i) = 1 / (1 + exp(-X(i))) }
        def silu(float(N) X) -> (Y) { Y(i) = X(i) * (1 / (exp(-X(i)) + 1)) }
        def other(float(N) X) -> (Y) { Y(i) = 1 / (2 + exp(-X(i))) }
    """)
    assert "polyc_sigmoidf((X" in kernels.logistic.c_source({"N": 8})
    assert "polyc_sigmoidf((X" in kernels.silu.c_source({"N": 8})
    assert "polyc_sigmoidf((X" not in kernels.other.c_source({"N": 8})
    x = sample_inputs("exp", FLOAT32, 2_000_000)
    with np.errstate(all="ignore"):
        exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
        numpys = 1.0 / (1.0 + np.exp(-x))
    result = kernels.logistic(x)
    normal = np.abs(exact) >= np.finfo(np.float32).tiny
    worst = float(ulp_errors(result[normal], exact[normal]).max())
    assert worst <= SIGMOID_ULP_BOUND, f"{worst:.3f} ulp"
    np.testing.assert_array_equal(np.isnan(result), np.isnan(x))
    settled = (numpys == 0) | (numpys == 1)  # overflowed, or 1 + exp(-x) rounded to 1
    np.testing.assert_array_equal(result[settled], numpys[settled])
    special = np.array([np.nan, np.inf, -np.inf, -88.72283, -88.72284, -100.0, 0.0, 20.0], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(kernels.silu(special), special * (1 / (np.exp(-special) + 1)), rtol=1e-6, atol=0)


#: Instruction set -> the flags that build its vector logistic function, and the host CPU flag
#: it needs to run.
_LOGISTIC_VECTOR_BUILDS = {"avx512": (("-O3", "-mavx512f"), "avx512f"), "avx2": (("-O3", "-mavx2", "-mfma"), "avx2")}


@pytest.mark.parametrize("isa", sorted(_LOGISTIC_VECTOR_BUILDS))
def test_the_vector_logistic_function_is_polyc_sigmoidf_bit_for_bit(isa):
    """The register epilogues' logistic function (``sigmoid_vector_c``) gives what gcc's
    vectorised loop of polyc_sigmoidf gives, on every lane, bit for bit: random bit patterns,
    the interesting range, every special value (the whole float32 range was checked so by hand,
    every seventh input)."""
    from polyc.codegen.vector_math import sigmoid_vector_c, sigmoid_vector_name
    from polyc.target import host

    flags, cpu_flag = _LOGISTIC_VECTOR_BUILDS[isa]
    if platform.machine() not in ("x86_64", "AMD64") or cpu_flag not in host().flags:
        pytest.skip(f"this CPU cannot run {isa} code")
    vector, lanes = ("__m512", 16) if isa == "avx512" else ("__m256", 8)
    prefix = vector.replace("__m", "_mm")
    source = f"""{PRELUDE}
#include <immintrin.h>
{sigmoid_vector_c(isa)}
void scalar(const float *restrict x, float *restrict y, int64_t n)
{{
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = polyc_sigmoidf(x[i]);
}}
void vector(const float *restrict x, float *restrict y, int64_t n)
{{
    for (int64_t i = 0; i < n; i += {lanes}) {prefix}_storeu_ps(y + i, {sigmoid_vector_name(isa)}({prefix}_loadu_ps(x + i)));
}}
"""
    library = load_library(get_or_build(source, CompilerOptions(flags=flags)))
    x = sample_inputs("exp", FLOAT32, 2_000_000)
    x = np.concatenate([x, np.zeros(-x.size % lanes, np.float32)])
    results = []
    for name in ("scalar", "vector"):
        y = np.empty_like(x)
        function = get_function(library, name, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64])
        function(x.ctypes.data, y.ctypes.data, x.size)
        results.append(y)
    np.testing.assert_array_equal(results[1].view(np.uint32), results[0].view(np.uint32))


# ----------------------------------------------------------------------------- conversions
REQUANTIZE_AND_READ_BACK = """
def requantize(int32(C, N) acc, float(C) scale, uint8(1) zero) -> (Q, D) {
    Q(c, n) = uint8(fmin(fmax(rint(float(acc(c, n)) * scale(c)) + float(zero(0)), 0.0), 255.0))
    D(c, n) = float(Q(c, n)) - float(zero(0))
}
"""


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_a_clamped_conversion_read_back_vectorises(tmp_path, isa):
    """A requantization (clamp, convert to uint8) whose result is stored and read back in the same
    loop: gcc turned the clamp's selects into branches and left the loop scalar, tens of times
    slower, until the language flags carried -fno-trapping-math and the conversion helpers
    picked by bit masks."""
    from polyc.target import LANGUAGE_FLAGS

    compiler, flags = VECTOR_ISAS[isa]
    kernel = polyc.define(REQUANTIZE_AND_READ_BACK).requantize
    source = tmp_path / "requantize.c"
    source.write_text(kernel.c_source())
    report = subprocess.run(
        [compiler, "-O3", *flags, *LANGUAGE_FLAGS, "-fopenmp", "-fopt-info-vec-optimized", "-c", str(source)]
        + ["-o", str(tmp_path / "requantize.o")],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    lines = source.read_text().splitlines()
    simd = [k for k, line in enumerate(lines, 1) if "#pragma omp simd" in line]
    assert simd, "the conversion loop is not marked as a vector loop"
    vectorised = {int(line) for line in re.findall(r"requantize\.c:(\d+):\d+: optimized: loop vectorized", report)}
    # gcc names the loop by its header or by the first statement of its body
    for k in simd:
        assert vectorised & set(range(k + 1, k + 5)), f"the loop after line {k} stayed scalar:\n{report[-2000:]}"

    rng = np.random.default_rng(3)
    acc = rng.integers(-40000, 40000, (5, 67)).astype(np.int32)
    acc[0, :4] = [np.iinfo(np.int32).min, np.iinfo(np.int32).max, 0, -1]
    scale = rng.uniform(0.001, 0.02, 5).astype(np.float32)
    zero = np.array([7], np.uint8)
    q, d = kernel(acc, scale, zero)
    expected = np.clip(np.rint(acc.astype(np.float32) * scale[:, None]) + np.float32(7), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(q, expected)
    np.testing.assert_array_equal(d, expected.astype(np.float32) - np.float32(7))
