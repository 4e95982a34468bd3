
PACK_SLIVERS
/* A[ic:ic+mc, pc:pc+kc] into MR-tall slivers: element (i, k) of sliver s at
   [s*MR*kc + k*MR + i], times the contraction's scale; rows past the end are zero.  An A whose
   rows run along K (evenly spaced, K contiguous) is packed without the offset tables (by
   register transposes on x86). */
static void polyc_pack_a_SHAPE(const polyc_gemm_t *restrict g, const T *restrict a, int64_t ic, int64_t mc,
                               int64_t pc, int64_t kc, T *restrict dst)
{
    for (int64_t s = 0; s * MR < mc; s++, dst += MR * kc) {
        if (mc - s * MR >= MR && polyc_contiguous(g->a_m + ic + s * MR, MR))
            polyc_pack_a_contiguous_SHAPE(g, a, ic, mc, pc, kc, s, dst);
ROWS_ALONG_K_A        else
            polyc_pack_a_sliver_SHAPE(g, a, ic, mc, pc, kc, s, dst);
    }
}

/* Sliver s of B[pc:pc+kc, jc:jc+nc] (NR columns) into dst: element (k, j) at [k*NR + j];
   columns past the end are zero.  On AVX-512 a float B stored transposed is packed by
   register transposes. */
static void polyc_pack_b_SHAPE(const polyc_gemm_t *restrict g, const T *restrict b, int64_t jc, int64_t nc,
                               int64_t s, int64_t pc, int64_t kc, T *restrict dst)
{
    const int64_t cols = polyc_min(NR, nc - s * NR);
    const int64_t *restrict b_n = g->b_n + jc + s * NR;
    if (cols == NR && polyc_contiguous(b_n, NR)) {
        polyc_pack_b_contiguous_SHAPE(g, b, jc, nc, pc, kc, s, dst);
        return;
    }
TRANSPOSED_B
    polyc_pack_b_sliver_SHAPE(g, b, jc, nc, pc, kc, s, dst);
}

/* The longest KC block.  KC keeps an A sliver in L1 and an A panel in L2 for the products
   BLIS is made for; a product whose target is small (an eighth of L2) is dominated instead by
   what each KC block costs again (passes over C, packing B, a barrier per panel), so its KC
   block grows up to 4 KC while the A panel stays within three quarters of L2 (the 128 x 2000
   x 128 MLP layer: one block instead of four; the mlp case of python -m benchmarks).  Not
   when KC was given. */
static int64_t polyc_kc_most_SHAPE(const polyc_gemm_t *g)
{
    if (KC_FIXED || g->m * g->n * (int64_t)sizeof(T) > L2_BYTES / 8)
        return KC;
    const int64_t rows = polyc_round_up(polyc_min(MC, g->m), MR);
    return polyc_max(KC, polyc_min(4 * KC, (3 * (int64_t)L2_BYTES / 4) / ((int64_t)sizeof(T) * rows)));
}

/* How one product is shared among nthr threads: by blocks of rows (0), or (1) by the column
   slivers of each NC block, whichever balances better (the longest share, in blocks).  On a
   tie, the threads share the longer dimension: sharing rows, every thread streams all of B
   (and A is packed once); sharing columns, every thread streams all of A.  So a product of
   few rows and many columns (Kronecker steps: 16 rows, 100 000 columns) must not share rows.
   Rows are shared in blocks taken as threads come free, which absorbs a thread held up by the
   machine; with fewer than two blocks per thread (see polyc_product) that is lost, and sharing
   columns, which needs no barrier per panel, is better (the 128 x 128 MLP layer). */
static int polyc_split_n_SHAPE(const polyc_gemm_t *g, int nthr)
{
    if (nthr <= 1) return 0;
    const int64_t m_slivers = (g->m + MR - 1) / MR;
    const int64_t n_slivers = (polyc_min(g->n, NC) + NR - 1) / NR;
    const int64_t m_rounds = (m_slivers + nthr - 1) / nthr, n_rounds = (n_slivers + nthr - 1) / nthr;
    const int64_t longest_rows = m_rounds * n_slivers, longest_columns = n_rounds * m_slivers;
    if (longest_rows != longest_columns)
        return longest_columns < longest_rows;
    return g->m < g->n || g->m < 2 * POLYC_SHARED_ROWS * nthr;
}

/* Whether the loops read B's sliver at column jr itself rather than packing it: when it is
   laid out like a packed sliver (columns contiguous, rows NR apart), or when few rows of A use
   it and its rows are not far apart.  The same for every thread: it decides who packs what. */
static int polyc_direct_b_SHAPE(const polyc_gemm_t *restrict g, int64_t jr, int64_t nr)
{
    const int64_t stride = g->b_k_stride;
    if (stride < 0 || (!MASKED_B && nr < NR) || !polyc_contiguous(g->b_n + jr, nr))
        return 0;
    return stride == NR || (g->m <= 4 * MR && stride * (int64_t)sizeof(T) <= 4096);
}

/* Slivers s .. s + count - 1 of B[pc:pc+kc, jc:jc+nc] that are not read in place into dst
   (sliver q at q * stride), as polyc_pack_b packs them one by one.  When they are whole, none
   is read in place and their columns are contiguous, they are copied a row of B at a time: the
   same elements as polyc_pack_b_contiguous reads (the offset of column jc + s*NR + j is then
   b_n[jc + s*NR] + j), as one run of count * NR values per row instead of count runs of NR
   values kc rows apart. */
static void polyc_pack_b_run_SHAPE(const polyc_gemm_t *restrict g, const T *restrict b, int64_t jc, int64_t nc,
                                   int64_t s, int64_t count, int64_t pc, int64_t kc, T *restrict dst,
                                   int64_t stride)
{
    const int64_t *restrict b_n = g->b_n + jc + s * NR;
    int64_t direct = 0;
    for (int64_t q = 0; q < count; q++)
        direct += polyc_direct_b_SHAPE(g, jc + (s + q) * NR, polyc_min(NR, nc - (s + q) * NR));
    if (count == 1 || direct > 0 || (s + count) * NR > nc || !polyc_contiguous(b_n, count * NR)) {
        for (int64_t q = 0; q < count; q++)
            if (!polyc_direct_b_SHAPE(g, jc + (s + q) * NR, polyc_min(NR, nc - (s + q) * NR)))
                polyc_pack_b_SHAPE(g, b, jc, nc, s + q, pc, kc, dst + q * stride);
        return;
    }
    for (int64_t k = 0; k < kc; k++) {
        const T *restrict row = b + g->b_k[pc + k] + b_n[0];
        for (int64_t q = 0; q < count; q++)
            for (int64_t j = 0; j < NR; j++)
                dst[q * stride + k * NR + j] = row[q * NR + j];
    }
}

/* One product (batch point bt) computed by thread tid of the team (NULL: alone); with a team,
   every thread of it must call it, for the same products in the same order.
   Rows shared: the threads pack each B panel together into one of the two halves of bpacks,
   then take blocks of rows one at a time (a thread held up by the operating system delays the
   others only by the block it is in).  The halves alternate, so one barrier per panel suffices:
   a thread packs panel t + 2 only after every thread passed the barrier of panel t + 1, that
   is after finishing its blocks of panel t.
   Column slivers shared (short products): each thread packs its own slivers into its own
   bpack, no barrier.
   An A block with evenly spaced rows is read in place when at most two B slivers use it, or
   when its rows run along K, the register block is at least two vectors wide and an A sliver
   (MR x KC) is within a quarter of L1, as a packed one would be: packing then costs more than
   it saves (sharing columns, each thread would pack all of A).  Not on AVX2, whose 6 x 16
   block has half the multiply-adds per load of A: the six row streams cost more there than
   packing.  Not with one vector per row, whose loop is mostly A's broadcasts: their MR row
   pointers take the registers; nor with the long KC blocks of small targets (the MLP layer's
   2000).  Measured on the sgemm, tmm, kronecker and mlp cases of python -m benchmarks
   (benchmarks/results/zen4_contraction_polybench.json, zen3_contraction_polybench.json). */
static void polyc_product_SHAPE(const polyc_gemm_t *restrict g, int64_t bt, int init, T *restrict bpacks,
                                T *restrict apack, polyc_team_t *team, int tid, polyc_progress_t *progress)
{
    const int nthr = team ? team->size : 1;
    const T *restrict a = g->a + g->a_batch[bt];
    const T *restrict b = g->b + g->b_batch[bt];
    T *restrict c = g->c + g->c_batch[bt];
    const int split_n = polyc_split_n_SHAPE(g, nthr), shared_b = nthr > 1 && !split_n;
    const int64_t kc_step = polyc_balanced_step(g->k, polyc_kc_most_SHAPE(g), 1);
    const int64_t nc_step = polyc_balanced_step(g->n, NC, NR);
    const int a_in_place = g->a_m_stride >= 0 && g->a_k_stride >= 0 && !POLYC_HAS_SCALE;  /* packing scales */
    /* Shared rows: each block streams the whole B panel, so blocks of at least about
       POLYC_SHARED_ROWS rows, and up to 8 per thread so that a thread held up by the
       machine delays the others by a fraction of its share; a product of few rows is cut
       into one block per thread.  An A read in place (a product at most two B slivers wide,
       see direct_a) is not packed into an L2-sized panel, so its blocks need not fit one:
       longer blocks keep each thread's reads of A long runs.  With MC-row blocks the threads'
       reads interleaved every few ten kilobytes, and the 262144 x 16 x 32 Kronecker step
       (kronecker3_1 in python -m benchmarks) took markedly longer. */
    const int64_t mc_cap = a_in_place && g->n <= 2 * NR ? g->m : MC;
    const int64_t per_thread = polyc_max(1, polyc_min(8, g->m / (POLYC_SHARED_ROWS * nthr)));
    const int64_t mc_most = shared_b ? polyc_min(mc_cap, polyc_round_up((g->m + per_thread * nthr - 1)
                                                                         / (per_thread * nthr), MR)) : MC;
    const int64_t mc_step = shared_b ? polyc_team_step(g->m, mc_most, MR, nthr) : polyc_balanced_step(g->m, mc_most, MR);
    const int64_t row_blocks = (g->m + mc_step - 1) / mc_step;
    const int64_t stride = NR * kc_step;  /* between slivers in a bpack */
    const int64_t panel = polyc_round_up(polyc_min(NC, g->n), NR) * polyc_min(polyc_kc_most_SHAPE(g), g->k);
    /* A partly guarded block's destination: MR x NR values, row i at i * NR. */
    T guard_block[POLYC_HAS_GUARD ? MR * NR : 1] __attribute__((aligned(64)));
    int64_t block_m[MR], block_n[NR];
    for (int64_t i = 0; i < MR; i++) block_m[i] = i * NR;
    for (int64_t j = 0; j < NR; j++) block_n[j] = j;
    for (int64_t jc = 0; jc < g->n; jc += nc_step) {
        const int64_t nc = polyc_min(nc_step, g->n - jc);
        const int64_t slivers = (nc + NR - 1) / NR;
        int64_t s_lo = 0, s_hi = slivers;
        if (split_n) {
            const int64_t per = (slivers + nthr - 1) / nthr;
            s_lo = polyc_min(slivers, tid * per);
            s_hi = polyc_min(slivers, s_lo + per);
        }
        const int direct_a = a_in_place && (s_hi - s_lo <= 2 || (g->a_k_stride == 1 && WIDE_BLOCK
                                                                  && MR * kc_step * (int64_t)sizeof(T) <= L1_BYTES / 4));
        /* An A read in place whose rows are short (a K block of at most 256 bytes) streams from
           memory at a few multiply-adds per byte, and the hardware prefetcher does not keep up
           with a block's MR row streams: each block asks for the rows about 8 KiB ahead
           (the 262144 x 16 x 32 Kronecker step, kronecker3_1 in python -m benchmarks:
           benchmarks/results/zen5_contraction_polybench.json). */
        const int prefetch_a = direct_a && g->a_k_stride == 1 && g->a_m_stride > 0
                               && kc_step * (int64_t)sizeof(T) <= 256;
        const int64_t a_ahead = prefetch_a ? polyc_round_up(polyc_max(1, 8192 / (g->a_m_stride * (int64_t)sizeof(T))), MR) : 0;
        for (int64_t pc = 0; pc < g->k; pc += kc_step, progress->panels++) {
            const int64_t kc = polyc_min(kc_step, g->k - pc);
            const int beta = pc > 0 || !init;
            const int last = pc + kc >= g->k;
            T *restrict bpack = bpacks + (shared_b ? (progress->panels % 2) * panel : 0);
            if (shared_b) {
                for (;;) {
                    const int64_t s = polyc_take(&team->pack_tickets, &progress->pack_base, slivers, nthr);
                    if (s < 0) break;
                    if (!polyc_direct_b_SHAPE(g, jc + s * NR, polyc_min(NR, nc - s * NR)))
                        polyc_pack_b_SHAPE(g, b, jc, nc, s, pc, kc, bpack + s * stride);
                }
                polyc_barrier_wait(&team->barrier, nthr);
            }
            for (int64_t block = 0;; block++) {
                if (shared_b) {
                    block = polyc_take(&team->row_tickets, &progress->row_base, row_blocks, nthr);
                    if (block < 0) break;
                } else if (block >= row_blocks) {
                    break;
                }
                const int64_t ic = block * mc_step, mc = polyc_min(mc_step, g->m - ic);
                if (!direct_a)
                    polyc_pack_a_SHAPE(g, a, ic, mc, pc, kc, apack);
                for (int64_t s = s_lo; s < s_hi; s++) {
                    const int64_t jr = jc + s * NR, nr = polyc_min(NR, nc - s * NR);
                    const int unit = polyc_contiguous(g->c_n + jr, nr);
                    const int direct_b = polyc_direct_b_SHAPE(g, jr, nr);
                    /* A thread alone on its slivers packs them just before the first row block
                       uses them, PACK_RUN at a time (256 bytes of each row of B), while they are
                       in L1 or L2, as OpenBLAS does.  Packed all first, one sliver at a time, an
                       AVX2 float sliver is one cache line per row of B, and a panel wider than L2
                       goes out to L3 and comes back: packing took a large share of short
                       products such as BERT's 128 x 768 x 3072, which ran faster packed here in
                       runs (python -m benchmarks.onnx_bench --models encoder, and the tmm case
                       of python -m benchmarks, with AVX2 code).  Direct slivers are read in
                       place, never packed. */
                    if (!shared_b && block == 0 && (s - s_lo) % PACK_RUN == 0)
                        polyc_pack_b_run_SHAPE(g, b, jc, nc, s, polyc_min(PACK_RUN, s_hi - s), pc, kc,
                                               bpack + s * stride, stride);
                    const T *restrict bp = direct_b ? b + g->b_n[jr] + pc * g->b_k_stride : bpack + s * stride;
                    const int64_t b_rs = direct_b ? g->b_k_stride : NR;
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        const int64_t mr = polyc_min(MR, mc - ir);
                        /* Under a guard: a block where it holds nowhere adds nothing (zero for
                           `+=!`); one where it holds in part is computed into `block`, then
                           written where it holds. */
                        const int cover = POLYC_HAS_GUARD ? polyc_guard_cover(g, bt, ic + ir, mr, jr, nr) : 2;
                        T *restrict dst = cover == 2 ? c : guard_block;
                        const int64_t *dst_m = cover == 2 ? g->c_m + ic + ir : block_m;
                        const int64_t *dst_n = cover == 2 ? g->c_n + jr : block_n;
                        const int dst_beta = cover == 2 ? beta : 0, dst_unit = cover == 2 ? unit : 1;
                        /* Constant arguments let the compiler specialise the kernel for packed A and B. */
                        if (cover == 0)
                            polyc_guarded_write(g, bt, NULL, 0, c, ic + ir, mr, jr, nr, beta);
                        else if (direct_a) {
                            if (prefetch_a && s == s_lo && ic + ir + a_ahead + mr <= g->m)
                                polyc_prefetch_rows(a + (ic + ir + a_ahead) * g->a_m_stride + pc, mr,
                                                    g->a_m_stride, kc * (int64_t)sizeof(T));
                            polyc_kernel_SHAPE(kc, a + (ic + ir) * g->a_m_stride + pc * g->a_k_stride, mr,
                                               g->a_m_stride, g->a_k_stride, bp, b_rs, !direct_b || nr == NR, dst,
                                               dst_m, dst_n, mr, nr, dst_beta, dst_unit);
                        } else if (direct_b)
                            polyc_kernel_SHAPE(kc, apack + ir * kc, MR, 1, MR, bp, b_rs, nr == NR, dst,
                                               dst_m, dst_n, mr, nr, dst_beta, dst_unit);
                        else
                            polyc_kernel_SHAPE(kc, apack + ir * kc, MR, 1, MR, bp, NR, 1, dst, dst_m,
                                               dst_n, mr, nr, dst_beta, dst_unit);
                        if (cover == 1)
                            polyc_guarded_write(g, bt, guard_block, NR, c, ic + ir, mr, jr, nr, beta);
                        if (POLYC_HAS_EPILOGUE && last)
                            polyc_epilogue(g, bt, ic + ir, mr, jr, nr);
                    }
                }
            }
        }
    }
}

#if defined(_OPENMP) && defined(__linux__)
/* Products shared out as the pool's tickets: whole products (by_batch), or else each product's
   column blocks (`parts` per product); `worker` picks the packing buffers. */
typedef struct {
    const polyc_gemm_t *g;
    int init, by_batch, parts;
    T *bpacks, *apacks;
    int64_t a_elements, b_elements;
} polyc_pooled_SHAPE_t;

static void polyc_pooled_ticket_SHAPE(void *context, int64_t ticket, int worker)
{
    const polyc_pooled_SHAPE_t *job = (const polyc_pooled_SHAPE_t *)context;
    T *bpack = job->bpacks + 2 * job->b_elements * worker, *apack = job->apacks + job->a_elements * worker;
    polyc_progress_t progress = {0, 0, 0};
    if (job->by_batch) {
        polyc_product_SHAPE(job->g, ticket, job->init, bpack, apack, NULL, 0, &progress);
    } else {
        polyc_team_t team;  /* only its size is read when columns are shared */
        memset(&team, 0, sizeof team);
        team.size = job->parts;
        polyc_product_SHAPE(job->g, ticket / job->parts, job->init, bpack, apack, &team,
                            (int)(ticket % job->parts), &progress);
    }
}
#endif

/* Every product with this register block; 0, or STATUS when buffers cannot be allocated. */
static int polyc_gemm_run_SHAPE(const polyc_gemm_t *restrict g, int init)
{
    const int64_t kc_most = polyc_min(polyc_kc_most_SHAPE(g), g->k);
    const int64_t a_elements = polyc_round_up(polyc_min(MC, g->m), MR) * kc_most;
    const int64_t b_elements = polyc_round_up(polyc_min(NC, g->n), NR) * kc_most;
    int nthr = 1, most = 1, pooled = 0;
#if defined(_OPENMP)
    if ((double)g->nbatch * (double)g->m * (double)g->n * (double)g->k >= THRESHOLD) {
        most = polyc_most_threads();
        nthr = polyc_threads(most);
        /* On a machine crowded by other processes, shares that need no barrier (whole
           products, or a product's columns) run on polyc's thread pool with every thread: a
           helper kept from running then costs at most the one-thread time, never a scheduler
           slice.  Not on an idle machine: there OpenMP's threads, which a model's other kernels
           use and which spin after their regions, met the pool's helpers on the cores (a
           transformer encoder ran several times slower: python -m benchmarks.onnx_bench
           --models encoder). */
        pooled = most > 1 && POLYC_POOL_LOADED && (g->nbatch >= 2 * most || polyc_split_n_SHAPE(g, most))
                 && (nthr < most || polyc_threads_setting() == POLYC_THREADS_POOL
                     || (polyc_threads_setting() == POLYC_THREADS_POLICY && polyc_machine_crowded_lately(most)));
        if (pooled)
            nthr = most;
    }
#endif
    (void)most;
    (void)pooled;
    /* Per thread: an A panel, and two B panels (a shared pair when rows are shared), in the
       kernel's kept workspace. */
    const int64_t a_total = polyc_round_up(a_elements * nthr, 64 / (int64_t)sizeof(T));
    polyc_workspace_t *workspace = polyc_workspace_take((size_t)(a_total + 2 * b_elements * nthr) * sizeof(T));
    if (workspace == NULL)
        return STATUS;
    T *apacks = (T *)workspace->memory, *bpacks = apacks + a_total;
    if (nthr <= 1) {
        polyc_progress_t progress = {0, 0, 0};
        for (int64_t bt = 0; bt < g->nbatch; bt++)
            polyc_product_SHAPE(g, bt, init, bpacks, apacks, NULL, 0, &progress);
    }
#if defined(_OPENMP) && defined(__linux__)
    else if (pooled) {
        polyc_pooled_SHAPE_t job = {g, init, g->nbatch >= 2 * nthr, nthr, bpacks, apacks, a_elements, b_elements};
        polyc_pool_run_v1(polyc_pooled_ticket_SHAPE, &job, job.by_batch ? g->nbatch : g->nbatch * nthr, nthr);
    }
#endif
#if defined(_OPENMP)
    else {
        /* Whole products per thread when there are enough of them to balance; else share each
           one.  Either way the threads take work as they go.  No barrier of ours ends the
           region: OpenMP's own is enough, and a second one cost a scheduler slice whenever
           one of its waiters lost its core. */
        const int by_batch = g->nbatch >= 2 * nthr;
        polyc_team_t team;
        memset(&team, 0, sizeof team);
        int slow = 0;
        const double call_start = polyc_call_start();
        #pragma omp parallel num_threads(nthr)
        {
            polyc_thread_clock_t clock;
            polyc_thread_start(&clock, call_start);
            const int tid = omp_get_thread_num();
            __atomic_store_n(&team.size, omp_get_num_threads(), __ATOMIC_RELAXED);  /* the same in all */
            polyc_progress_t progress = {0, 0, 0};
            if (by_batch) {
                for (;;) {
                    const int64_t bt = __atomic_fetch_add(&team.batch_tickets, 1, __ATOMIC_RELAXED);
                    if (bt >= g->nbatch) break;
                    polyc_product_SHAPE(g, bt, init, bpacks + 2 * b_elements * tid, apacks + a_elements * tid,
                                        NULL, 0, &progress);
                }
            } else {
                const int split_n = polyc_split_n_SHAPE(g, team.size);
                for (int64_t bt = 0; bt < g->nbatch; bt++)
                    polyc_product_SHAPE(g, bt, init, bpacks + (split_n ? 2 * b_elements * tid : 0),
                                        apacks + a_elements * tid, &team, tid, &progress);
            }
            polyc_thread_stop(&clock, &slow);
        }
        polyc_threads_after(nthr, most, slow);
    }
#endif
    polyc_workspace_give_back(workspace);
    return 0;
}
