/* Elementary functions that vectorise (polyc/codegen/vector_math.py). */
/* Bit casts: OpenCL C and CUDA have no memcpy in device code, but their own reinterpreting casts. */
#if defined(__OPENCL_C_VERSION__)
static inline uint32_t polyc_bits_f32(float x) { return as_uint(x); }
static inline float polyc_f32_from_bits(uint32_t u) { return as_float(u); }
static inline uint64_t polyc_bits_f64(double x) { return as_ulong(x); }
static inline double polyc_f64_from_bits(uint64_t u) { return as_double(u); }
#elif defined(__CUDACC__)
static inline uint32_t polyc_bits_f32(float x) { return __float_as_uint(x); }
static inline float polyc_f32_from_bits(uint32_t u) { return __uint_as_float(u); }
static inline uint64_t polyc_bits_f64(double x) { return (uint64_t)__double_as_longlong(x); }
static inline double polyc_f64_from_bits(uint64_t u) { return __longlong_as_double((long long)u); }
#else
static inline uint32_t polyc_bits_f32(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static inline float polyc_f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
static inline uint64_t polyc_bits_f64(double x) { uint64_t u; memcpy(&u, &x, sizeof u); return u; }
static inline double polyc_f64_from_bits(uint64_t u) { double x; memcpy(&x, &u, sizeof x); return x; }
#endif
/* condition ? a : b by bit masks: both sides are computed, so gcc needs no branch (with
   -ftrapping-math it would not compute a floating-point operation only one side needs). */
static inline float polyc_select_f32(int condition, float a, float b)
{
    uint32_t mask = 0u - (uint32_t)(condition != 0);
    return polyc_f32_from_bits((polyc_bits_f32(a) & mask) | (polyc_bits_f32(b) & ~mask));
}
static inline double polyc_select_f64(int condition, double a, double b)
{
    uint64_t mask = 0u - (uint64_t)(condition != 0);
    return polyc_f64_from_bits((polyc_bits_f64(a) & mask) | (polyc_bits_f64(b) & ~mask));
}
/* fmax and fmin ignoring NaN as C's do (of equal arguments the first, as numpy's), but by
   selects, which vectorise: gcc has no vector fmax/fmin for x86.  The comparison picks
   between the arguments (a NaN a compares false: b), and a NaN b, known not to be one when it
   is a constant (a ReLU's 0), gives a.  Written as (a < b) | (a != a), the selects ran many
   times slower on short rows with AVX-512 (mobilenet_v2's Clip of 192 x 28 x 28: python -m
   benchmarks.onnx_segments mobilenet_v2). */
static inline float polyc_fmaxf(float a, float b) { return polyc_select_f32(b != b, a, a >= b ? a : b); }
static inline float polyc_fminf(float a, float b) { return polyc_select_f32(b != b, a, a <= b ? a : b); }
static inline double polyc_fmax(double a, double b) { return polyc_select_f64(b != b, a, a >= b ? a : b); }
static inline double polyc_fmin(double a, double b) { return polyc_select_f64(b != b, a, a <= b ? a : b); }
/* |magnitude| with the sign bit of sign_of (magnitude must be non-negative). */
static inline double polyc_with_sign_f64(double magnitude, double sign_of)
{
    return polyc_f64_from_bits(polyc_bits_f64(magnitude) | (polyc_bits_f64(sign_of) & 0x8000000000000000u));
}

/* exp(x) = 2^k exp(r), x = k ln2 + r, |r| <= ln2/2: k by rounding with a shifter constant, ln2 in
   two parts (k * high part exact), exp(r) by its Taylor polynomial, and 2^k applied as two
   factors so that a subnormal result is rounded once.  Out-of-range x is clamped to where the
   result already overflows to inf or rounds to 0.  polyc_expf_reduced: exp(r) for xc = k ln2 + r,
   k in *ki. */
static inline float polyc_expf_reduced(float xc, int32_t *ki)
{
    const float shifter = 0x1.8p23f;
    float t = xc * 0x1.715476p+0f + shifter;
    float k = t - shifter;
    *ki = (int32_t)(polyc_bits_f32(t) - polyc_bits_f32(shifter));
    float r = (xc - k * 0x1.62e4p-1f) - k * 0x1.7f7d1cp-20f;
    float q = 1.0f / 5040;
    q = q * r + 1.0f / 720;
    q = q * r + 1.0f / 120;
    q = q * r + 1.0f / 24;
    q = q * r + 1.0f / 6;
    q = q * r + 0.5f;
    return (q * r * r + r) + 1.0f;
}
/* p 2^k by adding k to p's exponent field: for a normal p whose product is normal (the
   callers' p is exp's reduced result, in [0.70, 1.42]). */
static inline float polyc_scaled_by_power_of_two(float p, int32_t k)
{
    return polyc_f32_from_bits(polyc_bits_f32(p) + ((uint32_t)k << 23));
}
static inline float polyc_expf(float x)
{
    float xc = polyc_select_f32(x == x, x, 0.0f);
    xc = polyc_select_f32(xc > 89.0f, 89.0f, xc);
    xc = polyc_select_f32(xc < -104.0f, -104.0f, xc);
    int32_t ki;
    float p = polyc_expf_reduced(xc, &ki);
    int32_t k1 = ki >> 1, k2 = ki - k1;
    float s1 = polyc_f32_from_bits((uint32_t)(k1 + 127) << 23);
    float s2 = polyc_f32_from_bits((uint32_t)(k2 + 127) << 23);
    return polyc_select_f32(x == x, (p * s1) * s2, x);
}

/* The logistic function 1 / (1 + exp(-x)), as the interpreter computes it from exp: in float,
   with exp's reduction and polynomial (see polyc_expf) but 2^k as one exponent times 2, for -x
   clamped to [-86, 89]: below, 1 + exp(-x) rounds to 1; above, exp(-x) overflows to inf and
   the quotient is 0, as the interpreter's (exp(-x) for 88.7 < -x < 89 overflows alike).  Less
   work than the quotient of polyc_expf's result: a SiLU (x * sigmoid(x)) ran faster so, with
   AVX-512 and AVX2 alike (efficientnet_b0's: python -m benchmarks.onnx_bench --models
   efficientnet_b0). */
static inline float polyc_sigmoidf(float x)
{
    float z = -x;
    z = polyc_select_f32(z > 89.0f, 89.0f, z);
    z = polyc_select_f32(z < -86.0f, -86.0f, z);
    int32_t ki;
    float p = polyc_expf_reduced(z, &ki);
    /* p 2^(k-1), a normal float for k in [-124, 128], then doubled */
    float e = polyc_scaled_by_power_of_two(p, ki - 1) * 2.0f;
    return polyc_select_f32(x == x, 1.0f / (1.0f + e), x);
}

static inline double polyc_exp(double x)
{
    double xc = polyc_select_f64(x == x, x, 0.0);
    xc = polyc_select_f64(xc > 710.0, 710.0, xc);
    xc = polyc_select_f64(xc < -746.0, -746.0, xc);
    const double shifter = 0x1.8p52;
    double t = xc * 0x1.71547652b82fep+0 + shifter;
    double k = t - shifter;
    int64_t ki = (int64_t)(polyc_bits_f64(t) - polyc_bits_f64(shifter));
    double r = (xc - k * 0x1.62e42fefa38p-1) - k * 0x1.ef35793c7673p-45;
    double q = 1.0 / 6227020800.0;  /* 1/13! */
    q = q * r + 1.0 / 479001600.0;
    q = q * r + 1.0 / 39916800.0;
    q = q * r + 1.0 / 3628800.0;
    q = q * r + 1.0 / 362880.0;
    q = q * r + 1.0 / 40320.0;
    q = q * r + 1.0 / 5040.0;
    q = q * r + 1.0 / 720.0;
    q = q * r + 1.0 / 120.0;
    q = q * r + 1.0 / 24.0;
    q = q * r + 1.0 / 6.0;
    q = q * r + 0.5;
    double p = (q * r * r + r) + 1.0;
    int64_t k1 = ki >> 1, k2 = ki - k1;
    double s1 = polyc_f64_from_bits((uint64_t)(k1 + 1023) << 52);
    double s2 = polyc_f64_from_bits((uint64_t)(k2 + 1023) << 52);
    return polyc_select_f64(x == x, (p * s1) * s2, x);
}

/* log(x) = e ln2 + log(1 + f) with x = 2^e (1 + f), 1 + f in [sqrt(1/2), sqrt(2)) (subnormals
   scaled by 2^23 first) and f exact; with s = f / (2 + f), log(1 + f) = 2 atanh(s)
   = f - s (f - R), R = 2s^2/3 + 2s^4/5 + ...  Predicates are taken on the bits. */
static inline float polyc_logf(float x)
{
    uint32_t bits = polyc_bits_f32(x);
    uint32_t subnormal = 0u - (uint32_t)(bits < 0x00800000u);
    uint32_t u = (polyc_bits_f32(x * 0x1p23f) & subnormal) | (bits & ~subnormal);
    int32_t e = (int32_t)((u >> 23) & 0xffu) - 127 - (int32_t)(subnormal & 23u);
    uint32_t mantissa = u & 0x007fffffu;
    uint32_t above_sqrt2 = mantissa > 0x003504f3u;
    float m = polyc_f32_from_bits(mantissa | (0x3f800000u - (above_sqrt2 << 23)));
    e += (int32_t)above_sqrt2;
    float f = m - 1.0f;
    float s = f / (2.0f + f);
    float z = s * s;
    float R = 2.0f / 11;
    R = R * z + 2.0f / 9;
    R = R * z + 2.0f / 7;
    R = R * z + 2.0f / 5;
    R = R * z + 2.0f / 3;
    R = R * z;
    float ef = (float)e;
    float result = ef * 0x1.62e4p-1f + ((f - s * (f - R)) + ef * 0x1.7f7d1cp-20f);
    int is_regular = bits - 1u < 0x7f7fffffu;  /* positive, nonzero and finite */
    float special = polyc_select_f32((bits << 1) == 0u, -INFINITY, polyc_select_f32(bits >> 31, NAN, x));
    return polyc_select_f32(is_regular, result, special);
}

/* log(x) + c for a correction |c| below an ulp of log(x), added before the last rounding
   (log1p's correction of 1 + x); polyc_log is c = 0. */
static inline double polyc_log_corrected(double x, double c)
{
    uint64_t bits = polyc_bits_f64(x);
    uint64_t subnormal = 0u - (uint64_t)(bits < 0x0010000000000000u);
    uint64_t u = (polyc_bits_f64(x * 0x1p52) & subnormal) | (bits & ~subnormal);
    int64_t e = (int64_t)((u >> 52) & 0x7ffu) - 1023 - (int64_t)(subnormal & 52u);
    uint64_t mantissa = u & 0x000fffffffffffffu;
    uint64_t above_sqrt2 = mantissa > 0x0006a09e667f3bccu;
    double m = polyc_f64_from_bits(mantissa | (0x3ff0000000000000u - (above_sqrt2 << 52)));
    e += (int64_t)above_sqrt2;
    double f = m - 1.0;
    double s = f / (2.0 + f);
    double z = s * s;
    double R = 2.0 / 21;
    R = R * z + 2.0 / 19;
    R = R * z + 2.0 / 17;
    R = R * z + 2.0 / 15;
    R = R * z + 2.0 / 13;
    R = R * z + 2.0 / 11;
    R = R * z + 2.0 / 9;
    R = R * z + 2.0 / 7;
    R = R * z + 2.0 / 5;
    R = R * z + 2.0 / 3;
    R = R * z;
    /* (double)e by the bits of 1.5 * 2^52 + e: AVX2 has no int64 -> double conversion (gcc then
       leaves the whole loop scalar), but an integer add and a subtraction vectorise everywhere. */
    double ed = polyc_f64_from_bits(0x4338000000000000u + (uint64_t)e) - 0x1.8p52;
    double result = ed * 0x1.62e42fefa38p-1 + ((f - s * (f - R)) + (ed * 0x1.ef35793c7673p-45 + c));
    int is_regular = bits - 1u < 0x7fefffffffffffffu;
    double special = polyc_select_f64((bits << 1) == 0u, -INFINITY, polyc_select_f64(bits >> 63, NAN, x));
    return polyc_select_f64(is_regular, result, special);
}
static inline double polyc_log(double x) { return polyc_log_corrected(x, 0.0); }

/* expm1: for |x| < 0.7 its Taylor polynomial; beyond, 2^k expm1(r) + (2^k - 1), whose terms
   have the same sign there, so nothing cancels (for k > 56 the - 1 is below half an ulp). */
static inline double polyc_expm1(double x)
{
    double xc = polyc_select_f64(x == x, x, 0.0);
    xc = polyc_select_f64(xc > 709.8, 709.8, xc);
    xc = polyc_select_f64(xc < -40.0, -40.0, xc);
    const double shifter = 0x1.8p52;
    double t = xc * 0x1.71547652b82fep+0 + shifter;
    double k = t - shifter;
    int64_t ki = (int64_t)(polyc_bits_f64(t) - polyc_bits_f64(shifter));
    double r = (xc - k * 0x1.62e42fefa38p-1) - k * 0x1.ef35793c7673p-45;
    int is_small = (xc < 0.7) & (xc > -0.7);
    double a = polyc_select_f64(is_small, xc, r);
    double q = 1.0 / 355687428096000.0;  /* 1/16! */
    q = q * a + 1.0 / 20922789888000.0;
    q = q * a + 1.0 / 1307674368000.0;
    q = q * a + 1.0 / 87178291200.0;
    q = q * a + 1.0 / 6227020800.0;
    q = q * a + 1.0 / 479001600.0;
    q = q * a + 1.0 / 39916800.0;
    q = q * a + 1.0 / 3628800.0;
    q = q * a + 1.0 / 362880.0;
    q = q * a + 1.0 / 40320.0;
    q = q * a + 1.0 / 5040.0;
    q = q * a + 1.0 / 720.0;
    q = q * a + 1.0 / 120.0;
    q = q * a + 1.0 / 24.0;
    q = q * a + 1.0 / 6.0;
    q = q * a + 0.5;
    double p = q * a * a + a;
    double s = polyc_f64_from_bits((uint64_t)(ki + 1023) << 52);
    double s_half = polyc_f64_from_bits((uint64_t)(ki + 1022) << 52);
    double moderate = s * p + (s - 1.0);
    double large = ((p + 1.0) * s_half) * 2.0;
    double result = polyc_select_f64(is_small, p, polyc_select_f64(ki > 56, large, moderate));
    return polyc_select_f64((x == x) & (x != 0.0), result, x);  /* NaN, and the sign of 0 */
}

/* tanh|x| = u / (u + 2) with u = expm1(2|x|); beyond |x| = 22 it rounds to 1. */
static inline double polyc_tanh(double x)
{
    double a = fabs(x);
    a = polyc_select_f64(a > 22.0, 22.0, a);
    double u = polyc_expm1(2.0 * a);
    return polyc_select_f64(x == x, polyc_with_sign_f64(u / (u + 2.0), x), x);
}

/* log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x: the quotient corrects u's rounding;
   added inside log's sum, below e ln2's high part, it costs no rounding of its own. */
static inline double polyc_log1p(double x)
{
    double u = 1.0 + x;
    double result = polyc_log_corrected(u, (x - (u - 1.0)) / u);
    int is_regular = (x > -1.0) & (x < INFINITY) & (x != 0.0);
    double special = polyc_select_f64(x == -1.0, -INFINITY, polyc_select_f64(x < -1.0, NAN, x));
    return polyc_select_f64(is_regular, result, special);
}

/* tanh(x) for float x, in float (polyc_tanh in double has half the lanes a vector and was
   slower; GELU's tanh form and Mish use it).  |x| < 0.75:
   |x| + |x| s p(s), s = x^2, p the near-minimax fit (Lawson's iteration) of (tanh(a) - a) / a^3,
   weighted by the error relative to tanh; the term added to |x| is at most a fifth of it.
   |x| >= 0.75: 1 - 2 / (exp(2|x|) + 1) with exp's reduction and polynomial (polyc_expf_reduced):
   tanh is at least 0.63 there and the subtracted quotient at most 0.37, so exp's error reaches
   the result damped.  From 9.5 (clamped: exp stays finite, 2^k normal) it rounds to 1, also
   for inf.  The sign is x's (tanh(-0) = -0); NaN is returned as it came. */
static inline float polyc_tanhf(float x)
{
    float a = polyc_f32_from_bits(polyc_bits_f32(x) & 0x7fffffffu);
    const float p_coefficients[7] = {-0x1.587652p-11f, 0x1.8bb924p-9f, -0x1.1b00c0p-7f, 0x1.6581aap-6f,
                                     -0x1.ba1080p-5f, 0x1.1110f4p-3f, -0x1.555556p-2f};
    float s = a * a, p = p_coefficients[0];
    for (int64_t i = 1; i < 7; i++)
        p = p * s + p_coefficients[i];
    float small = a + (a * s) * p;
    float clamped = polyc_select_f32(a > 9.5f, 9.5f, a);
    int32_t ki;
    float e = polyc_expf_reduced(clamped + clamped, &ki);  /* exp(2 clamped) = e 2^ki, ki <= 28 */
    e = polyc_scaled_by_power_of_two(e, ki);
    float r = polyc_select_f32(a < 0.75f, small, 1.0f - 2.0f / (e + 1.0f));
    return polyc_select_f32(x == x, polyc_f32_from_bits(polyc_bits_f32(r) | (polyc_bits_f32(x) & 0x80000000u)), x);
}

/* float32 functions computed in double: one rounding of a far more accurate value. */
static inline float polyc_expm1f(float x) { return (float)polyc_expm1((double)x); }
static inline float polyc_log1pf(float x) { return (float)polyc_log1p((double)x); }
static inline float polyc_exp2f(float x) { return (float)polyc_exp((double)x * 0x1.62e42fefa39efp-1); }
static inline float polyc_log2f(float x) { return (float)(polyc_log((double)x) * 0x1.71547652b82fep+0); }
static inline float polyc_log10f(float x) { return (float)(polyc_log((double)x) * 0x1.bcb7b1526e50ep-2); }
static inline float polyc_sinhf(float x)
{
    double a = fabs((double)x);
    a = polyc_select_f64(a > 200.0, 200.0, a);  /* sinh overflows float far earlier */
    double u = polyc_expm1(a);
    return (float)polyc_with_sign_f64(0.5 * (u + u / (u + 1.0)), (double)x);
}
static inline float polyc_coshf(float x)
{
    double a = fabs((double)x);
    a = polyc_select_f64(a > 200.0, 200.0, a);
    double e = polyc_exp(a);
    return (float)(0.5 * (e + 1.0 / e));
}

/* One lane of a vectorised min/max reduction (polyc/codegen/c.py, _reduces_in_lanes): the lane
   starts from +-inf and is never NaN, so a NaN x leaves it, as fmax/fmin would; gcc makes this
   compare one vector max/min. */
static inline float polyc_lane_maxf(float lane, float x) { return x > lane ? x : lane; }
static inline float polyc_lane_minf(float lane, float x) { return x < lane ? x : lane; }
static inline double polyc_lane_max(double lane, double x) { return x > lane ? x : lane; }
static inline double polyc_lane_min(double lane, double x) { return x < lane ? x : lane; }

/* erf(x) for float x, in float (twice the lanes of double), from two polynomials and no exp:
   GELU's erf was most of its time, and the exp of 1 - exp(..) cost as much as the rest.
   |x| < 1: x + x p(x^2), p the weighted least-squares fit (6000 Chebyshev nodes) of
   erf(x)/x - 1 with its constant 2/sqrt(pi) - 1 exact to float; no cancellation with x.
   1 <= |x| < 3.919206: q(t) of degree 14 in t = (|x| - 2.46) / 1.46 on [-1, 1], the near-minimax
   fit (Lawson's iteration) of erf itself, error 7e-9; erf lies in [0.84, 1) there, so the last
   steps of Horner's rule, adding terms far smaller than the first, round about once.
   From 3.919206 (the first float whose erf rounds to 1) the result is +-1, also for +-inf;
   NaN goes through both polynomials and stays NaN (no select of the a < 1 or a >= 3.919206
   kind is true for it). */
static inline float polyc_erff(float x)
{
    float a = polyc_f32_from_bits(polyc_bits_f32(x) & 0x7fffffffu);
    const float p_coefficients[7] = {0x1.63786cp-14f, -0x1.ad29aep-11f, 0x1.5538b4p-8f, -0x1.b81d2ap-6f,
                                     0x1.ce2ed4p-4f, -0x1.812746p-2f, 0x1.06eba8p-3f};
    const float q_coefficients[15] = {0x1.c886b8p-13f, 0x1.d26edcp-17f, -0x1.a88e6ap-10f, 0x1.9ec426p-10f,
                                      0x1.b367fep-9f, -0x1.2745bap-7f, 0x1.e1fc34p-8f, 0x1.a78a7ep-8f,
                                      -0x1.d18820p-6f, 0x1.71677cp-5f, -0x1.7120bep-5f, 0x1.f5bdaap-6f,
                                      -0x1.c8feb8p-7f, 0x1.fd2acep-9f, 0x1.ffbde2p-1f};
    float s = a * a, p = p_coefficients[0];
    for (int64_t i = 1; i < 7; i++)
        p = p * s + p_coefficients[i];
    float small = a + a * p;
    float t = (a - 0x1.3ad444p+1f) * 0x1.5ec7c4p-1f, q = q_coefficients[0];
    for (int64_t i = 1; i < 15; i++)
        q = q * t + q_coefficients[i];
    float r = polyc_select_f32(a < 1.0f, small, polyc_select_f32(a >= 0x1.f5a88ap+1f, 1.0f, q));
    return polyc_f32_from_bits(polyc_bits_f32(r) | (polyc_bits_f32(x) & 0x80000000u));
}
