#include <immintrin.h>
#define POLYC_TR_BLOCK 8
typedef float polyc_tr_lane_t;
static inline void polyc_tr_block(const float *s, float *d, int64_t sp, int64_t dp)
{
    const __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + sp), r2 = _mm256_loadu_ps(s + 2 * sp),
                 r3 = _mm256_loadu_ps(s + 3 * sp), r4 = _mm256_loadu_ps(s + 4 * sp), r5 = _mm256_loadu_ps(s + 5 * sp),
                 r6 = _mm256_loadu_ps(s + 6 * sp), r7 = _mm256_loadu_ps(s + 7 * sp);
    /* pairs of rows interleaved, then pairs of pairs, then the 128-bit halves exchanged */
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                 t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(d + dp, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(d + 2 * dp, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(d + 3 * dp, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(d + 4 * dp, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(d + 5 * dp, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(d + 6 * dp, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(d + 7 * dp, _mm256_permute2f128_ps(u3, u7, 0x31));
}
