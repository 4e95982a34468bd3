
/* dst[t*ldd + j] = src[j*ld + t] for j, t < 16: a 16 x 16 float block transposed in registers. */
#define POLYC_LO64(a, b) _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
#define POLYC_HI64(a, b) _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
static inline void polyc_transpose16(const float *restrict src, int64_t ld, float *restrict dst, int64_t ldd)
{
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_loadu_ps(src + i * ld);
    for (int i = 0; i < 16; i += 2) {  /* interleave pairs of rows, 32 bits at a time */
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  /* then pairs of pairs, 64 bits at a time */
        r[i] = POLYC_LO64(t[i], t[i + 2]);
        r[i + 1] = POLYC_HI64(t[i], t[i + 2]);
        r[i + 2] = POLYC_LO64(t[i + 1], t[i + 3]);
        r[i + 3] = POLYC_HI64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; i++) {  /* then 128-bit lanes of groups of four rows */
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; i++)
        _mm512_storeu_ps(dst + i * ldd, r[i]);
}
