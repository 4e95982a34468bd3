
/* FBLOCK channels x RQ points in portable C (the compiler vectorises the channel loops); the
   contract of the vector kernels, nfv 1 and tail channels. */
static inline void polyc_convc_block(int64_t nfv, const int64_t *restrict pieces, int64_t npieces,
    const T *restrict wp, int64_t w_step,
    const T *const *restrict ip, const int64_t *restrict roff, T *restrict out, const int64_t *restrict oo, int beta,
    int64_t tail, const char *pf, int64_t pf_step, int64_t npf, const char *ipf, int64_t nipf,
    const polyc_conv_t *restrict g, int64_t f0, int last_chunk)
{
    (void)nfv; (void)g; (void)f0; (void)last_chunk;
    T acc[POLYC_NR][POLYC_FBLOCK] __attribute__((aligned(64)));
    for (int64_t j = 0; j < POLYC_NR; j++)
        for (int64_t i = 0; i < POLYC_FBLOCK; i++) acc[j][i] = 0;
    for (int64_t k = 0; k < npieces; k++) {
        const uint64_t mask = (uint64_t)pieces[3 * k + 2];
        const T *restrict wq = wp + pieces[3 * k] * w_step;
        for (int64_t r = pieces[3 * k]; r < pieces[3 * k + 1]; r++, wq += w_step) {
            const int64_t o = roff[r];
            if (r < npf) POLYC_PREFETCH_LINE(pf, pf_step, r);
            if (r < nipf) __builtin_prefetch(ipf + 64 * r, 0, 3);
            for (int64_t j = 0; j < POLYC_NR; j++) {
                if (!(mask >> j & 1)) continue;
                const T b = ip[j][o];
                #pragma omp simd
                for (int64_t i = 0; i < tail; i++) acc[j][i] += wq[i] * b;
            }
        }
    }
    for (int64_t j = 0; j < POLYC_NR; j++) {
        if (oo[j] < 0) continue;
        T *restrict q = out + oo[j];
        for (int64_t i = 0; i < tail; i++) q[i] = beta ? q[i] + acc[j][i] : acc[j][i];
    }
}
