
#define POLYC_GEMV_BLOCK GEMV_BLOCK  /* columns of y per block: 4 KiB of float, 8 KiB of double */
#define POLYC_SUM_BLOCK SUM_BLOCK  /* a row's dot product adds partial sums of this many terms */

/* Rows i0 .. i0+rows-1 of y from their sums: scaled, then written (init) or added; then the
   epilogue on them. */
static void polyc_gemv_finish(const polyc_gemm_t *restrict g, int64_t i0, int64_t rows, const T *restrict sums,
                              int init)
{
    for (int64_t i = 0; i < rows; i++) {
        T *restrict p = g->c + g->c_m[i0 + i];
        const T value = POLYC_SCALED(sums[i]);
        *p = init ? value : *p + value;
    }
    if (POLYC_HAS_EPILOGUE)
        polyc_epilogue(g, 0, i0, rows, 0, 1);
}

/* Rows lo .. hi-1 when K is contiguous in A and x (a_k, b_k step by one). */
static void polyc_gemv_rows(const polyc_gemm_t *restrict g, int init, int64_t lo, int64_t hi)
{
    const int64_t k = g->k, row_stride = g->a_m_stride;
    const T *restrict x = g->b;
    for (int64_t i0 = lo; i0 < hi; i0 += 4) {
        const int64_t rows = polyc_min(4, hi - i0);
        const T *restrict a0 = g->a + i0 * row_stride;  /* rows past the end repeat row i0 */
        const T *restrict a1 = rows > 1 ? a0 + row_stride : a0;
        const T *restrict a2 = rows > 2 ? a0 + 2 * row_stride : a0;
        const T *restrict a3 = rows > 3 ? a0 + 3 * row_stride : a0;
        T sums[4] = {0, 0, 0, 0};
#if POLYC_GV_LANES
        /* Blocks summed from zero in vector registers (accuracy), added up as vectors, one
           horizontal sum per row at the end: the omp simd loop below sums every block
           horizontally, which cost much of the speed from memory (a 1280 -> 1000 classifier:
           python -m benchmarks.onnx_bench --models mobilenet_v2). */
        polyc_gv_t t0 = polyc_gv_zero(), t1 = t0, t2 = t0, t3 = t0;
        int64_t j = 0;
        for (int64_t j0 = 0; j0 < k; j0 += POLYC_SUM_BLOCK) {
            const int64_t j1 = polyc_min(j0 + POLYC_SUM_BLOCK, k);
            polyc_gv_t p0 = polyc_gv_zero(), p1 = p0, p2 = p0, p3 = p0;
            for (; j + POLYC_GV_LANES <= j1; j += POLYC_GV_LANES) {
                const polyc_gv_t xj = polyc_gv_load(x + j);
                p0 = polyc_gv_fma(polyc_gv_load(a0 + j), xj, p0);
                p1 = polyc_gv_fma(polyc_gv_load(a1 + j), xj, p1);
                p2 = polyc_gv_fma(polyc_gv_load(a2 + j), xj, p2);
                p3 = polyc_gv_fma(polyc_gv_load(a3 + j), xj, p3);
            }
            t0 = polyc_gv_add(t0, p0);
            t1 = polyc_gv_add(t1, p1);
            t2 = polyc_gv_add(t2, p2);
            t3 = polyc_gv_add(t3, p3);
        }
        for (; j < k; j++) {  /* the last block's columns past its last whole vector */
            sums[0] += a0[j] * x[j];
            sums[1] += a1[j] * x[j];
            sums[2] += a2[j] * x[j];
            sums[3] += a3[j] * x[j];
        }
        sums[0] += polyc_gv_sum(t0);
        sums[1] += polyc_gv_sum(t1);
        sums[2] += polyc_gv_sum(t2);
        sums[3] += polyc_gv_sum(t3);
#else
        for (int64_t j0 = 0; j0 < k; j0 += POLYC_SUM_BLOCK) {  /* blocks summed from zero: accuracy */
            const int64_t j1 = polyc_min(j0 + POLYC_SUM_BLOCK, k);
            T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            #pragma omp simd reduction(+: s0, s1, s2, s3)
            for (int64_t j = j0; j < j1; j++) {
                const T xj = x[j];
                s0 += a0[j] * xj;
                s1 += a1[j] * xj;
                s2 += a2[j] * xj;
                s3 += a3[j] * xj;
            }
            sums[0] += s0;
            sums[1] += s1;
            sums[2] += s2;
            sums[3] += s3;
        }
#endif
        polyc_gemv_finish(g, i0, rows, sums, init);
    }
}

/* Columns lo .. hi-1 when M is contiguous in A (a_m steps by one, rows of A a_k_stride apart). */
static void polyc_gemv_columns(const polyc_gemm_t *restrict g, int init, int64_t lo, int64_t hi)
{
    const int64_t k = g->k, row_stride = g->a_k_stride;
    const T *restrict x = g->b;
    T sums[POLYC_GEMV_BLOCK] __attribute__((aligned(64)));
    for (int64_t i0 = lo; i0 < hi; i0 += POLYC_GEMV_BLOCK) {
        const int64_t width = polyc_min(POLYC_GEMV_BLOCK, hi - i0);
        for (int64_t i = 0; i < width; i++)
            sums[i] = 0;
        int64_t j = 0;
        for (; j + 4 <= k; j += 4) {
            const T *restrict r0 = g->a + j * row_stride + i0, *restrict r1 = r0 + row_stride;
            const T *restrict r2 = r1 + row_stride, *restrict r3 = r2 + row_stride;
            const T x0 = x[j], x1 = x[j + 1], x2 = x[j + 2], x3 = x[j + 3];
            #pragma omp simd
            for (int64_t i = 0; i < width; i++)
                sums[i] += r0[i] * x0 + r1[i] * x1 + r2[i] * x2 + r3[i] * x3;
        }
        for (; j < k; j++) {
            const T *restrict r0 = g->a + j * row_stride + i0;
            const T x0 = x[j];
            #pragma omp simd
            for (int64_t i = 0; i < width; i++)
                sums[i] += r0[i] * x0;
        }
        polyc_gemv_finish(g, i0, width, sums, init);
    }
}

/* Rows lo .. hi-1 through the offset tables (any layout). */
static void polyc_gemv_tables(const polyc_gemm_t *restrict g, int init, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i++) {
        const T *restrict row = g->a + g->a_m[i];
        T sum = 0;
        for (int64_t j = 0; j < g->k; j++)
            sum += row[g->a_k[j]] * g->b[g->b_k[j]];
        polyc_gemv_finish(g, i, 1, &sum, init);
    }
}

/* Which loops suit the layout: 0 rows, 1 columns, 2 tables. */
static int polyc_gemv_order(const polyc_gemm_t *restrict g)
{
    if (g->b_k_stride == 1 || g->k <= 1) {
        if (g->a_k_stride == 1 && g->a_m_stride >= 0) return 0;
        if (g->a_m_stride == 1 && g->a_k_stride >= 0) return 1;
    }
    return 2;
}

/* The part of [0, m) thread t of nthr computes: contiguous, in multiples of `unit`. */
static void polyc_gemv_share(int64_t m, int64_t unit, int t, int nthr, int64_t *lo, int64_t *hi)
{
    const int64_t units = (m + unit - 1) / unit, per = (units + nthr - 1) / nthr;
    *lo = polyc_min(m, t * per * unit);
    *hi = polyc_min(m, (t + 1) * per * unit);
}

static int polyc_gemm_run(const polyc_gemm_t *restrict g, int init)
{
    const int order = polyc_gemv_order(g);
    const int64_t unit = order == 1 ? 16 : 4;
    int nthr = 1, most = 1, slow = 0;
#if defined(_OPENMP)
    if ((double)g->m * (double)g->k >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
    }
    const double call_start = polyc_call_start();
    #pragma omp parallel num_threads(nthr) if(nthr > 1)
#endif
    {
        int t = 0, team = 1;
#if defined(_OPENMP)
        polyc_thread_clock_t clock;
        if (nthr > 1) polyc_thread_start(&clock, call_start);
        t = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        int64_t lo, hi;
        polyc_gemv_share(g->m, unit, t, team, &lo, &hi);
        if (lo < hi) {
            if (order == 0) polyc_gemv_rows(g, init, lo, hi);
            else if (order == 1) polyc_gemv_columns(g, init, lo, hi);
            else polyc_gemv_tables(g, init, lo, hi);
        }
#if defined(_OPENMP)
        if (nthr > 1) polyc_thread_stop(&clock, &slow);
#endif
    }
#if defined(_OPENMP)
    polyc_threads_after(nthr, most, slow);
#endif
    (void)nthr; (void)most; (void)slow;
    return 0;
}
