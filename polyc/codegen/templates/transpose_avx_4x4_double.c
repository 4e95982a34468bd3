#include <immintrin.h>
#define POLYC_TR_BLOCK 4
typedef double polyc_tr_lane_t;
static inline void polyc_tr_block(const double *s, double *d, int64_t sp, int64_t dp)
{
    const __m256d r0 = _mm256_loadu_pd(s), r1 = _mm256_loadu_pd(s + sp), r2 = _mm256_loadu_pd(s + 2 * sp),
                  r3 = _mm256_loadu_pd(s + 3 * sp);
    const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1),
                  t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
    _mm256_storeu_pd(d + dp, _mm256_permute2f128_pd(t1, t3, 0x20));
    _mm256_storeu_pd(d + 2 * dp, _mm256_permute2f128_pd(t0, t2, 0x31));
    _mm256_storeu_pd(d + 3 * dp, _mm256_permute2f128_pd(t1, t3, 0x31));
}
