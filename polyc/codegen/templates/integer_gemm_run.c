
/* Threads share the work without barriers: a thread held up by a busy machine delays the others
   by at most the sliver it is packing.  Work items are blocks of rows of one product, taken from
   a ticket counter as threads come free; a thread keeps its block through every K block (so the
   block's K blocks add up in order) and packs the block's rows of A itself.  The slivers of B
   (one per K block and NR columns) are packed once per product, into a buffer that holds all of
   them, by the first thread that needs each one; a thread that finds a sliver being packed waits
   for it, yielding the processor.  With at least two products per thread, whole products are the
   work items, each thread packing its own B. */

/* The state of each packed sliver of B: not packed, being packed, packed. */
enum { POLYC_B_EMPTY = 0, POLYC_B_PACKING = 1, POLYC_B_READY = 2 };

/* Sliver s of K block q (K from pc, kc long) of B, packed into `slot` first if no thread has. */
static const unsigned char *polyc_b_sliver(const polyc_igemm_t *restrict g, const polyc_tb *restrict b,
                                           unsigned char *slot, int *state, int64_t s, int64_t pc, int64_t kc)
{
    int now = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (now == POLYC_B_READY)
        return slot;
    int expected = POLYC_B_EMPTY;
    if (now == POLYC_B_EMPTY
        && __atomic_compare_exchange_n(state, &expected, POLYC_B_PACKING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        polyc_pack_b(g, b, s * NR, polyc_min(NR, g->n - s * NR), pc, kc, slot);
        __atomic_store_n(state, POLYC_B_READY, __ATOMIC_RELEASE);
        return slot;
    }
    for (int spins = 0; __atomic_load_n(state, __ATOMIC_ACQUIRE) != POLYC_B_READY; spins++) {
        if (spins >= 200)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#elif defined(__aarch64__)
        else
            __asm__ __volatile__("yield");
#endif
    }
    return slot;
}

/* The sizes of one call's blocks and buffers. */
typedef struct {
    int64_t kc_step, k_blocks, slivers, mc_step, row_blocks, a_sliver, b_sliver, b_set;
} polyc_iplan_t;

/* Rows ic .. ic+mc-1 of product bt, over every K block; B's slivers from `bpack` and `states`
   (this product's set), A's rows packed into `apack`. */
static void polyc_row_block(const polyc_igemm_t *restrict g, const polyc_iplan_t *plan, int64_t bt, int64_t ic,
                            int64_t mc, int init, unsigned char *bpack, int *states, unsigned char *apack)
{
    const polyc_ta *restrict a = g->a + g->a_batch[bt];
    const polyc_tb *restrict b = g->b + g->b_batch[bt];
    int32_t *restrict c = g->c + g->c_batch[bt];
    const int unit = g->c_n_stride == 1;
    for (int64_t q = 0; q < plan->k_blocks; q++) {
        const int64_t pc = q * plan->kc_step, kc = polyc_min(plan->kc_step, g->k - pc);
        const int64_t kg = (kc + G - 1) / G;
        const int beta = q > 0 || !init;
        for (int64_t ir = 0; ir < mc; ir += MR)
            polyc_pack_a(g, a, ic + ir, polyc_min(MR, mc - ir), pc, kc, apack + (ir / MR) * plan->a_sliver);
        for (int64_t s = 0; s < plan->slivers; s++) {
            const int64_t item = q * plan->slivers + s;
            const unsigned char *bp = polyc_b_sliver(g, b, bpack + item * plan->b_sliver, states + item, s, pc, kc);
            const int64_t jr = s * NR, nr = polyc_min(NR, g->n - jr);
            for (int64_t ir = 0; ir < mc; ir += MR)
                polyc_ikernel(kg, apack + (ir / MR) * plan->a_sliver, bp, c, g->c_m + ic + ir, g->c_n + jr,
                              polyc_min(MR, mc - ir), nr, beta, unit, g->corrected);
        }
    }
}

/* Every product of the call; 0, or STATUS when the buffers cannot be allocated. */
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
    (void)most;
    polyc_iplan_t plan;
    plan.kc_step = polyc_istep(g->k, KC, G, 1);
    plan.k_blocks = (g->k + plan.kc_step - 1) / plan.kc_step;
    plan.slivers = (g->n + NR - 1) / NR;
    /* Blocks of at most MC rows, at least two per thread where there are rows enough, so that a
       thread held up by the machine leaves the others blocks to take. */
    const int64_t share = polyc_iround_up((g->m + 2 * nthr - 1) / (2 * nthr), MR);
    plan.mc_step = polyc_istep(g->m, polyc_max(MR, polyc_min(MC, share)), MR, nthr);
    plan.row_blocks = (g->m + plan.mc_step - 1) / plan.mc_step;
    const int64_t kg_most = (plan.kc_step + G - 1) / G;
    plan.a_sliver = POLYC_A_TAIL + polyc_iround_up(kg_most * MR * G * (int64_t)sizeof(polyc_pa), 64);
    plan.b_sliver = POLYC_B_TAIL + polyc_iround_up(kg_most * NR * G * (int64_t)sizeof(polyc_pb), 64);
    plan.b_set = plan.k_blocks * plan.slivers;  /* slivers of one product's B */
    const int by_product = nthr > 1 && g->nbatch >= 2 * nthr;
    const int64_t sets = nthr == 1 || by_product ? nthr : g->nbatch;  /* B buffers: per thread, or per product */
    const int64_t a_block = plan.a_sliver * ((plan.mc_step + MR - 1) / MR);
    const int64_t b_bytes = sets * plan.b_set * plan.b_sliver;
    const int64_t state_bytes = polyc_iround_up(sets * plan.b_set * (int64_t)sizeof(int), 64);
    polyc_workspace_t *workspace = polyc_workspace_take((size_t)(b_bytes + state_bytes + a_block * nthr));
    if (workspace == NULL)
        return STATUS;
    unsigned char *const bpacks = (unsigned char *)workspace->memory;
    int *const states = (int *)(bpacks + b_bytes);
    unsigned char *const apacks = bpacks + b_bytes + state_bytes;
    memset(states, 0, (size_t)state_bytes);
    int64_t tickets = 0;
#if POLYC_IGEMM_PARALLEL
    #pragma omp parallel num_threads(nthr) if (nthr > 1)
#endif
    {
#if POLYC_IGEMM_PARALLEL
        const int tid = omp_get_thread_num();
#else
        const int tid = 0;
#endif
        unsigned char *const apack = apacks + a_block * tid;
        if (by_product || nthr == 1) {
            unsigned char *const bpack = bpacks + tid * plan.b_set * plan.b_sliver;
            int *const state = states + tid * plan.b_set;
            for (;;) {
                const int64_t bt = __atomic_fetch_add(&tickets, 1, __ATOMIC_RELAXED);
                if (bt >= g->nbatch) break;
                memset(state, 0, (size_t)plan.b_set * sizeof(int));
                for (int64_t block = 0; block < plan.row_blocks; block++) {
                    const int64_t ic = block * plan.mc_step;
                    polyc_row_block(g, &plan, bt, ic, polyc_min(plan.mc_step, g->m - ic), init, bpack, state, apack);
                }
            }
        } else {
            for (;;) {
                const int64_t item = __atomic_fetch_add(&tickets, 1, __ATOMIC_RELAXED);
                if (item >= g->nbatch * plan.row_blocks) break;
                const int64_t bt = item / plan.row_blocks, ic = (item % plan.row_blocks) * plan.mc_step;
                polyc_row_block(g, &plan, bt, ic, polyc_min(plan.mc_step, g->m - ic), init,
                                bpacks + bt * plan.b_set * plan.b_sliver, states + bt * plan.b_set, apack);
            }
        }
    }
    polyc_workspace_give_back(workspace);
    return 0;
}
