
/* Threads share the work without barriers or waits: a thread held up by a busy machine delays
   only the work item it holds.  Work items are blocks of rows of one product, taken from a ticket
   counter as threads come free; a thread keeps its block through every K block (so the block's
   K blocks add up in order) and packs the block's rows of A itself.  The slivers of B (one per K
   block and NR columns) are packed once per product, into a buffer that holds all of them, by
   the first thread that needs each one; a thread that finds a sliver being packed by another
   packs it again for itself rather than wait.  With at least two products per thread, whole
   products are the work items, each thread packing its own B.  On a machine crowded by other
   processes, the work items run on polyc's thread pool (polyc/runtime/pool.py), whose calls never
   wait for a helper that has not started; elsewhere on OpenMP's threads. */

#ifndef POLYC_POOL_LOADED
#if defined(_OPENMP) && defined(__linux__)
typedef void (*polyc_pool_task_t)(void *context, int64_t ticket, int worker);
extern void polyc_pool_run_v1(polyc_pool_task_t task, void *context, int64_t tickets, int workers) __attribute__((weak));
#define POLYC_POOL_LOADED (polyc_pool_run_v1 != NULL)
#else
#define POLYC_POOL_LOADED 0
#endif
#endif

/* The state of each packed sliver of B: not packed, being packed, packed. */
enum { POLYC_B_EMPTY = 0, POLYC_B_PACKING = 1, POLYC_B_READY = 2 };

/* Sliver s of K block q (K from pc, kc long) of B: packed into `slot` first if no thread has;
   while another thread is packing it, packed again into `own` (this thread's), not waited for. */
static const unsigned char *polyc_b_sliver(const polyc_igemm_t *restrict g, const polyc_tb *restrict b,
                                           unsigned char *slot, int *state, unsigned char *own, int64_t s,
                                           int64_t pc, int64_t kc)
{
    const int now = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (now == POLYC_B_READY)
        return slot;
    int expected = POLYC_B_EMPTY;
    unsigned char *dst = own;
    if (now == POLYC_B_EMPTY
        && __atomic_compare_exchange_n(state, &expected, POLYC_B_PACKING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        dst = slot;
    else if (expected == POLYC_B_READY)
        return slot;
    polyc_pack_b(g, b, s * NR, polyc_min(NR, g->n - s * NR), pc, kc, dst);
    if (dst == slot)
        __atomic_store_n(state, POLYC_B_READY, __ATOMIC_RELEASE);
    return dst;
}

/* The sizes of one call's blocks and buffers. */
typedef struct {
    int64_t kc_step, k_blocks, slivers, mc_step, row_blocks, a_sliver, b_sliver, b_set;
} polyc_iplan_t;

/* Rows ic .. ic+mc-1 of product bt, over every K block; B's slivers from `bpack` and `states`
   (this product's set) or `own`, A's rows packed into `apack`.  The slivers are taken from
   `first` on, round: threads that start together start at different slivers, so each packs its
   own part of B instead of all of them meeting at the same sliver (and packing it twice). */
static void polyc_row_block(const polyc_igemm_t *restrict g, const polyc_iplan_t *plan, int64_t bt, int64_t ic,
                            int64_t mc, int init, unsigned char *bpack, int *states, unsigned char *apack,
                            unsigned char *own, int64_t first)
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
        for (int64_t step = 0; step < plan->slivers; step++) {
            const int64_t s = (first + step) % plan->slivers, item = q * plan->slivers + s;
            const unsigned char *bp = polyc_b_sliver(g, b, bpack + item * plan->b_sliver, states + item, own, s, pc, kc);
            const int64_t jr = s * NR, nr = polyc_min(NR, g->n - jr);
            for (int64_t ir = 0; ir < mc; ir += MR)
                polyc_ikernel(kg, apack + (ir / MR) * plan->a_sliver, bp, c, g->c_m + ic + ir, g->c_n + jr,
                              polyc_min(MR, mc - ir), nr, beta, unit, g->corrected);
        }
    }
#if defined(POLYC_EPILOGUE)
    /* The block's sums are final: its epilogue while they are in cache (L2: one block of rows),
       along whole rows, whose long runs the epilogue's vector loop takes with little overhead. */
    polyc_epilogue(g, bt, ic, mc, 0, g->n);
#endif
}

/* One call's work: items are whole products (by_product) or blocks of rows of a product. */
typedef struct {
    const polyc_igemm_t *g;
    const polyc_iplan_t *plan;
    int init, by_product, workers;
    unsigned char *bpacks, *apacks;
    int *states;
    int64_t a_block;  /* bytes per worker: its A block, then its own B sliver */
} polyc_iwork_t;

static void polyc_iwork_item(void *context, int64_t item, int worker)
{
    const polyc_iwork_t *w = (const polyc_iwork_t *)context;
    const polyc_iplan_t *plan = w->plan;
    const polyc_igemm_t *g = w->g;
    unsigned char *apack = w->apacks + (w->a_block + plan->b_sliver) * worker, *own = apack + w->a_block;
    if (w->by_product) {  /* product `item`, B packed into the worker's own set */
        unsigned char *bpack = w->bpacks + worker * plan->b_set * plan->b_sliver;
        int *states = w->states + worker * plan->b_set;
        memset(states, 0, (size_t)plan->b_set * sizeof(int));
        for (int64_t block = 0; block < plan->row_blocks; block++) {
            const int64_t ic = block * plan->mc_step;
            polyc_row_block(g, plan, item, ic, polyc_min(plan->mc_step, g->m - ic), w->init, bpack, states, apack, own,
                            0);
        }
    } else {
        const int64_t bt = item / plan->row_blocks, ic = (item % plan->row_blocks) * plan->mc_step;
        polyc_row_block(g, plan, bt, ic, polyc_min(plan->mc_step, g->m - ic), w->init,
                        w->bpacks + bt * plan->b_set * plan->b_sliver, w->states + bt * plan->b_set, apack, own,
                        plan->slivers * (worker % w->workers) / w->workers);
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
#if defined(POLYC_EPILOGUE)
        for (int64_t bt = 0; bt < g->nbatch; bt++)
            polyc_epilogue(g, bt, 0, g->m, 0, g->n);
#endif
        return 0;
    }
    int nthr = 1, most = 1, pooled = 0;
#if POLYC_IGEMM_PARALLEL
    if ((double)g->nbatch * (double)g->m * (double)g->n * (double)g->k >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
        /* As the float kernel decides (polyc/codegen/templates/gemm_blocked_loops.c): the pool on
           a machine crowded lately, OpenMP's threads on an idle one. */
        pooled = most > 1 && POLYC_POOL_LOADED
                 && (nthr < most || polyc_threads_setting() == POLYC_THREADS_POOL
                     || (polyc_threads_setting() == POLYC_THREADS_POLICY && polyc_machine_crowded_lately(most)));
        if (pooled)
            nthr = most;
    }
#endif
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
    const int by_product = nthr == 1 || g->nbatch >= 2 * nthr;
    const int64_t sets = by_product ? nthr : g->nbatch;  /* B buffers: per thread, or per product */
    const int64_t a_block = plan.a_sliver * ((plan.mc_step + MR - 1) / MR);
    const int64_t b_bytes = sets * plan.b_set * plan.b_sliver;
    const int64_t state_bytes = polyc_iround_up(sets * plan.b_set * (int64_t)sizeof(int), 64);
    polyc_workspace_t *workspace =
        polyc_workspace_take((size_t)(b_bytes + state_bytes + (a_block + plan.b_sliver) * nthr));
    if (workspace == NULL)
        return STATUS;
    polyc_iwork_t work;
    work.g = g;
    work.plan = &plan;
    work.init = init;
    work.by_product = by_product;
    work.workers = nthr;
    work.bpacks = (unsigned char *)workspace->memory;
    work.states = (int *)(work.bpacks + b_bytes);
    work.apacks = work.bpacks + b_bytes + state_bytes;
    work.a_block = a_block;
    memset(work.states, 0, (size_t)state_bytes);
    const int64_t items = by_product ? g->nbatch : g->nbatch * plan.row_blocks;
    if (nthr <= 1) {
        for (int64_t item = 0; item < items; item++)
            polyc_iwork_item(&work, item, 0);
    }
#if POLYC_IGEMM_PARALLEL && defined(__linux__)
    else if (pooled) {
        polyc_pool_run_v1(polyc_iwork_item, &work, items, nthr);
    }
#endif
#if POLYC_IGEMM_PARALLEL
    else {
        int64_t tickets = 0;
        int slow = 0;
        const double call_start = polyc_call_start();
        #pragma omp parallel num_threads(nthr)
        {
            polyc_thread_clock_t clock;
            polyc_thread_start(&clock, call_start);
            const int tid = omp_get_thread_num();
            for (;;) {
                const int64_t item = __atomic_fetch_add(&tickets, 1, __ATOMIC_RELAXED);
                if (item >= items) break;
                polyc_iwork_item(&work, item, tid);
            }
            polyc_thread_stop(&clock, &slow);
        }
        polyc_threads_after(nthr, most, slow);
    }
#endif
    (void)most;
    (void)pooled;
    polyc_workspace_give_back(workspace);
    return 0;
}
