"""polyc's own elementary functions, in C that gcc vectorises without -ffast-math.

gcc vectorises calls to ``expf``, ``log``... only through glibc's libmvec, which it uses only
under -ffast-math, and polyc cannot use -ffast-math (it must keep the interpreter's NaN, inf and
signed-zero semantics).  So the prelude of generated code defines these functions itself as
straight-line C: range reduction, a polynomial, exponent arithmetic on the bits, and special
cases chosen by bit-mask selects (``polyc_select_f32``), which need no branch, so a loop
calling them under ``#pragma omp simd`` becomes vector code.  fmin/fmax (and min/max of floats)
are selects too: gcc has no vector form of C's fminf/fmaxf on x86.

Every function returns what numpy does for special inputs: NaN for NaN, exp(+inf) = inf,
exp(-inf) = 0, inf on overflow, subnormals (rounded once) and 0 on underflow, log(+-0) = -inf,
log(x < 0) = NaN, log1p(-1) = -inf, tanh(+-inf) = +-1, and the sign of zero (tanh(-0) = -0,
expm1(-0) = -0, log1p(-0) = -0).

Largest error found, in ulp of the exact result (float32: exhaustively over all 2^32 inputs;
float64: 8 million samples, half of them random bit patterns, against long double libm; log1p
also 16 million around x = -0.3 and 10^-18..10^-8, its worst cases rechecked against a 200-bit
reference (mpmath); each compiled with and without FMA contraction, the larger shown).  The tests
(tests/test_vector_math.py) sample them again and hold them to :data:`ULP_BOUNDS`:

=========  ==================  =========
function   float32             float64
=========  ==================  =========
exp        1.07 (in float)     0.99
log        0.95 (in float)     1.18
expm1      0.50 (in double)    1.31
log1p      0.50 (in double)    1.44
tanh       1.07 (in float)     2.36
exp2       0.50 (in double)    libm
log2       0.50 (in double)    libm
log10      0.50 (in double)    libm
sinh       0.50 (in double)    libm
cosh       0.50 (in double)    libm
erf        1.47 (in float)     libm
=========  ==================  =========

float32 exp, log, tanh and erf work in float, for twice the lanes of double; the other float32 functions
evaluate the float64 ones (or exp/log) in double and round once, which is nearly always
correctly rounded.  The float64 exp2, log2, log10, sinh and cosh, and every other builtin,
still call libm: doing them as well here (exact powers of two for exp2/log2, overflow just
below inf for sinh/cosh) needs more code than their use in tensor kernels pays for.  float16
goes through float, as everywhere in generated code.
"""

from __future__ import annotations

import string

from polyc.codegen.templates import c_template

#: Builtins computed by the functions below -> (float32 name, float64 name); None: libm's.
VECTOR_MATH_FUNCTIONS: dict[str, tuple[str, str | None]] = {
    "fmax": ("polyc_fmaxf", "polyc_fmax"),
    "fmin": ("polyc_fminf", "polyc_fmin"),
    "max": ("polyc_fmaxf", "polyc_fmax"),
    "min": ("polyc_fminf", "polyc_fmin"),
    "exp": ("polyc_expf", "polyc_exp"),
    "log": ("polyc_logf", "polyc_log"),
    "expm1": ("polyc_expm1f", "polyc_expm1"),
    "log1p": ("polyc_log1pf", "polyc_log1p"),
    "tanh": ("polyc_tanhf", "polyc_tanh"),
    "exp2": ("polyc_exp2f", None),
    "log2": ("polyc_log2f", None),
    "log10": ("polyc_log10f", None),
    "sinh": ("polyc_sinhf", None),
    "cosh": ("polyc_coshf", None),
    "erf": ("polyc_erff", None),
}

#: (builtin, dtype name) -> the largest error, in ulp, the tests accept: the measured one above
#: rounded up.  The README states these same figures (tests/test_readme.py compares them).
ULP_BOUNDS: dict[tuple[str, str], float] = {
    ("exp", "float32"): 1.1,
    ("log", "float32"): 1.1,
    ("tanh", "float32"): 1.1,
    ("erf", "float32"): 1.5,
    **{(name, "float32"): 0.51 for name in ("expm1", "log1p", "exp2", "log2", "log10", "sinh", "cosh")},
    ("exp", "float64"): 1.2,
    ("log", "float64"): 1.2,
    ("expm1", "float64"): 1.5,
    ("log1p", "float64"): 1.5,
    ("tanh", "float64"): 2.4,
}

#: The largest error of ``polyc_sigmoidf`` (the float32 quotient ``1 / (1 + exp(-x))``), in ulp,
#: over results that are normal floats: 2.46 measured over every fifth float32 input against long
#: double (the quotient of polyc_expf's result errs as much, at the same input).
SIGMOID_ULP_BOUND = 2.5

#: C text of the functions, part of the prelude (needs <stdint.h>, <string.h>, <math.h>).
VECTOR_MATH_C = c_template("vector_math.c")

# polyc_sigmoidf on one vector of floats, in intrinsics: a register epilogue
# (polyc/codegen/register_epilogue.py) applies it to a kernel's accumulators before their one
# store, where a loop over the stored output would load, change and store every element again
# (efficientnet_b0's SiLU after its convolutions).  The same operations in the same order as
# polyc_sigmoidf vectorised by gcc with the FMA contraction of -std=gnu11, so the same results.
# Filled in per instruction set by sigmoid_vector_c.
_SIGMOID_VECTOR_TEMPLATE = string.Template(r"""
#ifndef POLYC_SIGMOID_${ISA}_DEFINED
#define POLYC_SIGMOID_${ISA}_DEFINED
/* polyc_sigmoidf (the logistic function) on every lane of x. */
static inline $V ${name}($V x)
{
    const $V shifter = ${P}_set1_ps(0x1.8p23f), high = ${P}_set1_ps(89.0f), low = ${P}_set1_ps(-86.0f);
    /* -x, the sign bit flipped (a 512-bit xor_ps needs AVX-512DQ) */
    $V z = ${P}_cast${B}_ps(${P}_xor_$B(${P}_castps_$B(x), ${P}_set1_epi32((int)0x80000000u)));
    z = $above_high;
    z = $below_low;
    const $V t = ${P}_fmadd_ps(z, ${P}_set1_ps(0x1.715476p+0f), shifter);
    const $V k = ${P}_sub_ps(t, shifter);
    const $I ki = ${P}_sub_epi32(${P}_castps_$B(t), ${P}_castps_$B(shifter));
    $V r = ${P}_fnmadd_ps(k, ${P}_set1_ps(0x1.62e4p-1f), z);
    r = ${P}_fnmadd_ps(k, ${P}_set1_ps(0x1.7f7d1cp-20f), r);
    $V q = ${P}_fmadd_ps(${P}_set1_ps(1.0f / 5040), r, ${P}_set1_ps(1.0f / 720));
    q = ${P}_fmadd_ps(q, r, ${P}_set1_ps(1.0f / 120));
    q = ${P}_fmadd_ps(q, r, ${P}_set1_ps(1.0f / 24));
    q = ${P}_fmadd_ps(q, r, ${P}_set1_ps(1.0f / 6));
    q = ${P}_fmadd_ps(q, r, ${P}_set1_ps(0.5f));
    const $V p = ${P}_add_ps(${P}_fmadd_ps(${P}_mul_ps(q, r), r, r), ${P}_set1_ps(1.0f));
    /* p 2^(k-1), then doubled in the sum */
    const $I exponent_step = ${P}_slli_epi32(${P}_sub_epi32(ki, ${P}_set1_epi32(1)), 23);
    const $V e = ${P}_cast${B}_ps(${P}_add_epi32(${P}_castps_$B(p), exponent_step));
    const $V y = ${P}_div_ps(${P}_set1_ps(1.0f), ${P}_fmadd_ps(e, ${P}_set1_ps(2.0f), ${P}_set1_ps(1.0f)));
    return $nan_kept;
}
#endif
""")

#: Instruction set -> (vector type, intrinsics' prefix, integer vector type, bit cast suffix).
_SIGMOID_VECTOR_SPELLINGS = {
    "avx512": ("__m512", "_mm512", "__m512i", "si512"),
    "avx2": ("__m256", "_mm256", "__m256i", "si256"),
}


def sigmoid_vector_name(isa: str) -> str:
    """The C name of :func:`sigmoid_vector_c`'s function for ``isa``."""
    return f"polyc_sigmoid_{isa}"


def sigmoid_vector_c(isa: str) -> str:
    """C defining ``polyc_sigmoid_<isa>(x)``: polyc_sigmoidf on every lane of a float vector of
    ``isa`` ("avx512": 16 lanes, "avx2": 8), once per translation unit however often it is
    included (a kernel with two register epilogues includes it twice)."""
    vector, prefix, integer, bits = _SIGMOID_VECTOR_SPELLINGS[isa]

    def select(a: str, b: str, predicate: str, then: str, otherwise: str) -> str:
        """``a predicate b ? then : otherwise``, lane by lane."""
        if isa == "avx512":
            return f"{prefix}_mask_blend_ps({prefix}_cmp_ps_mask({a}, {b}, {predicate}), {otherwise}, {then})"
        return f"{prefix}_blendv_ps({otherwise}, {then}, {prefix}_cmp_ps({a}, {b}, {predicate}))"

    return _SIGMOID_VECTOR_TEMPLATE.substitute(
        ISA=isa.upper(),
        name=sigmoid_vector_name(isa),
        V=vector,
        P=prefix,
        I=integer,
        B=bits,
        above_high=select("z", "high", "_CMP_GT_OQ", "high", "z"),
        below_low=select("z", "low", "_CMP_LT_OQ", "low", "z"),
        nan_kept=select("x", "x", "_CMP_ORD_Q", "y", "x"),
    )


_ROUND_FLOAT16_VECTOR_TEMPLATE = string.Template(r"""
#ifndef POLYC_ROUND_FLOAT16_${ISA}_DEFINED
#define POLYC_ROUND_FLOAT16_${ISA}_DEFINED
/* Every lane of x rounded to the nearest float16 value (ties to even), kept in float: the
   float16 store and load of a value, in registers. */
static inline $V ${name}($V x)
{
$body
}
#endif
""")

#: F16C's conversions (AVX-512F has the 512-bit ones); without F16C (code built for AVX2 alone)
#: the rounding of c_expr's scalar polyc_round_float16 on the lanes: c has x's sign and exponent
#: (clamped to 2^-14 .. 2^16) plus 13, so (x + c) - c rounds x to float16's spacing there, ties to
#: even; past 65504 is infinity; NaN stays NaN; a zero keeps x's sign.
_ROUND_FLOAT16_BODIES = {
    "avx512": "    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));",
    "avx2": """#if defined(__F16C__)
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
#else
    const __m256i sign = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32((int)0x80000000u));
    __m256i scale = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7f800000));
    scale = _mm256_min_epi32(_mm256_max_epi32(scale, _mm256_set1_epi32(0x38800000)), _mm256_set1_epi32(0x47800000));
    const __m256 c = _mm256_castsi256_ps(_mm256_or_si256(_mm256_add_epi32(scale, _mm256_set1_epi32(13 << 23)), sign));
    const __m256 magnitude = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_sub_ps(_mm256_add_ps(x, c), c));
    const __m256 overflow = _mm256_cmp_ps(magnitude, _mm256_set1_ps(65504.0f), _CMP_GT_OQ);
    const __m256 y = _mm256_blendv_ps(magnitude, _mm256_set1_ps(__builtin_inff()), overflow);
    return _mm256_or_ps(y, _mm256_castsi256_ps(sign));
#endif""",
}


def round_float16_vector_name(isa: str) -> str:
    """The C name of :func:`round_float16_vector_c`'s function for ``isa``."""
    return f"polyc_round_float16_{isa}"


def round_float16_vector_c(isa: str) -> str:
    """C defining ``polyc_round_float16_<isa>(x)``: every lane of a float vector of ``isa``
    rounded to float16 and widened back (``(float)(_Float16)x`` on each lane), once per
    translation unit however often it is included."""
    vector = _SIGMOID_VECTOR_SPELLINGS[isa][0]
    return _ROUND_FLOAT16_VECTOR_TEMPLATE.substitute(
        ISA=isa.upper(), name=round_float16_vector_name(isa), V=vector, body=_ROUND_FLOAT16_BODIES[isa]
    )
