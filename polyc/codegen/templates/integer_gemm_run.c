
/* Every product of the call: for each batch point, N in NC blocks, K in KC blocks, the threads
   pack the B panel together (slivers shared statically), then take blocks of MC rows as they
   come: each packs its rows of A and runs the micro-kernel over every B sliver.  The corrections
   of each K block are applied as its block is written, so C sums the K blocks exactly.
   Returns 0, or STATUS when the packing buffers cannot be allocated. */
static int polyc_igemm_run(const polyc_igemm_t *restrict g, int init)
{
    if (g->k == 0) {  /* no products to add: `+=!` sets the target to zero */
        if (init)
            for (int64_t bt = 0; bt < g->nbatch; bt++)
                for (int64_t m = 0; m < g->m; m++)
                    for (int64_t n = 0; n < g->n; n++)
                        g->c[g->c_batch[bt] + g->c_m[m] + g->c_n[n]] = 0;
        return 0;
    }
    int nthr = 1, most = 1;
#if POLYC_IGEMM_PARALLEL
    if ((double)g->nbatch * (double)g->m * (double)g->n * (double)g->k >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
    }
#endif
    const int64_t kc_step = polyc_istep(g->k, KC, G, 1);
    const int64_t nc_step = polyc_istep(g->n, NC, NR, 1);
    const int64_t mc_step = polyc_istep(g->m, MC, MR, nthr);
    const int64_t kg_most = (polyc_min(kc_step, g->k) + G - 1) / G;
    const int64_t a_sliver = POLYC_A_TAIL + polyc_iround_up(kg_most * MR * G * (int64_t)sizeof(polyc_pa), 64);
    const int64_t b_sliver = POLYC_B_TAIL + polyc_iround_up(kg_most * NR * G * (int64_t)sizeof(polyc_pb), 64);
    const int64_t a_block = a_sliver * ((polyc_min(mc_step, g->m) + MR - 1) / MR);
    const int64_t b_slivers = (polyc_min(nc_step, g->n) + NR - 1) / NR;
    polyc_workspace_t *workspace = polyc_workspace_take((size_t)(a_block * nthr + b_sliver * b_slivers));
    if (workspace == NULL)
        return STATUS;
    unsigned char *const bpack = (unsigned char *)workspace->memory;
    unsigned char *const apacks = bpack + b_sliver * b_slivers;
    const int64_t row_blocks = (g->m + mc_step - 1) / mc_step;
#if POLYC_IGEMM_PARALLEL
    #pragma omp parallel num_threads(nthr) if (nthr > 1)
#endif
    {
#if POLYC_IGEMM_PARALLEL
        unsigned char *const apack = apacks + a_block * omp_get_thread_num();
#else
        unsigned char *const apack = apacks;
#endif
        for (int64_t bt = 0; bt < g->nbatch; bt++) {
            const polyc_ta *restrict a = g->a + g->a_batch[bt];
            const polyc_tb *restrict b = g->b + g->b_batch[bt];
            int32_t *restrict c = g->c + g->c_batch[bt];
            for (int64_t jc = 0; jc < g->n; jc += nc_step) {
                const int64_t nc = polyc_min(nc_step, g->n - jc);
                const int64_t slivers = (nc + NR - 1) / NR;
                for (int64_t pc = 0; pc < g->k; pc += kc_step) {
                    const int64_t kc = polyc_min(kc_step, g->k - pc);
                    const int64_t kg = (kc + G - 1) / G;
                    const int beta = pc > 0 || !init;
#if POLYC_IGEMM_PARALLEL
                    #pragma omp for schedule(static)
#endif
                    for (int64_t s = 0; s < slivers; s++)
                        polyc_pack_b(g, b, jc + s * NR, polyc_min(NR, nc - s * NR), pc, kc, bpack + s * b_sliver);
#if POLYC_IGEMM_PARALLEL
                    #pragma omp for schedule(dynamic, 1)
#endif
                    for (int64_t block = 0; block < row_blocks; block++) {
                        const int64_t ic = block * mc_step, mc = polyc_min(mc_step, g->m - ic);
                        for (int64_t ir = 0; ir < mc; ir += MR)
                            polyc_pack_a(g, a, ic + ir, polyc_min(MR, mc - ir), pc, kc, apack + (ir / MR) * a_sliver);
                        for (int64_t s = 0; s < slivers; s++) {
                            const int64_t jr = jc + s * NR, nr = polyc_min(NR, nc - s * NR);
                            const int unit = g->c_n_stride == 1;
                            for (int64_t ir = 0; ir < mc; ir += MR)
                                polyc_ikernel(kg, apack + (ir / MR) * a_sliver, bpack + s * b_sliver, c,
                                              g->c_m + ic + ir, g->c_n + jr, polyc_min(MR, mc - ir), nr, beta, unit,
                                              g->corrected);
                        }
                    }
                }
            }
        }
    }
    (void)most;
    polyc_workspace_give_back(workspace);
    return 0;
}
