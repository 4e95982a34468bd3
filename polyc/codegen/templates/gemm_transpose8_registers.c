
/* column[c] lane i = r[i] lane c for i, c < 8: eight float vectors transposed in AVX registers. */
static inline void polyc_transpose8_registers(__m256 r[8], __m256 column[8])
{
    __m256 t[8];
    for (int i = 0; i < 8; i += 2) {  /* interleave pairs of rows, within 128-bit lanes */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {  /* then pairs of pairs: columns c and c + 4 of four rows */
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {  /* then the 128-bit halves of rows 0-3 and 4-7 */
        column[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        column[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
}
