
/* Every product; 0, or an error status from the loops. */
static int polyc_gemm_run(const polyc_gemm_t *restrict g, int init)
{
    if (g->k == 0) {  /* no products to add: zero the target for `+=!`, then the epilogue */
        for (int64_t bt = 0; bt < g->nbatch; bt++) {
            if (init)
                for (int64_t m = 0; m < g->m; m++)
                    for (int64_t n = 0; n < g->n; n++)
                        g->c[g->c_batch[bt] + g->c_m[m] + g->c_n[n]] = 0;
            if (POLYC_HAS_EPILOGUE)
                polyc_epilogue(g, bt, 0, g->m, 0, g->n);
        }
        return 0;
    }
    return polyc_gemm_run_best(g, init);
}
