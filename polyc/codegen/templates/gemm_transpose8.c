
/* dst[t*ldd + j] = src[j*ld + t] for j, t < 8: an 8 x 8 float block transposed in AVX registers. */
static inline void polyc_transpose8(const float *restrict src, int64_t ld, float *restrict dst, int64_t ldd)
{
    __m256 r[8], column[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + i * ld);
    polyc_transpose8_registers(r, column);
    for (int i = 0; i < 8; i++)
        _mm256_storeu_ps(dst + i * ldd, column[i]);
}
