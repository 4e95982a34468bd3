
/* RF channels x up to NR points in portable C (the compiler vectorises the inner loops); the
   same contract as the vector kernels. */
static inline void polyc_conv_block(int64_t nred, const T *restrict wp, int64_t w_step, int64_t w_row,
    const T *restrict bp, const int64_t *restrict roff, int64_t n, T *restrict out, const int64_t *restrict row_off, int64_t rows,
    int beta, int mode, const uint32_t *restrict vmask, T *restrict block)
{
    (void)vmask;
    T acc[POLYC_RF * POLYC_NR] __attribute__((aligned(64)));
    for (int64_t x = 0; x < POLYC_RF * POLYC_NR; x++) acc[x] = 0;
    for (int64_t r = 0; r < nred; r++) {
        const T *restrict row = bp + roff[r];
        for (int64_t i = 0; i < POLYC_RF; i++) {
            const T ai = wp[(i < rows ? i * w_row : 0) + r * w_step];
            T *restrict c = acc + i * POLYC_NR;
            #pragma omp simd
            for (int64_t j = 0; j < n; j++)
                c[j] += ai * row[j];
        }
    }
    if (mode == 1) {
        for (int64_t i = 0; i < rows; i++) {
            T *restrict o = out + row_off[i];
            const T *restrict c = acc + i * POLYC_NR;
            if (beta)
                for (int64_t j = 0; j < n; j++) o[j] += c[j];
            else
                for (int64_t j = 0; j < n; j++) o[j] = c[j];
        }
    } else {
        for (int64_t x = 0; x < POLYC_RF * POLYC_NR; x++) block[x] = acc[x];
    }
}
