
/* The fewest rows in a block of rows threads share: each such block streams the whole B panel,
   so it must do enough work per byte of B (2 * 96 flops per element of B). */
#define POLYC_SHARED_ROWS 96

/* Whether offsets[i] == offsets[0] + i for every i < count. */
static inline int polyc_contiguous(const int64_t *restrict offsets, int64_t count)
{
    for (int64_t i = 1; i < count; i++)
        if (offsets[i] != offsets[0] + i) return 0;
    return 1;
}

/* How many offsets from the first on step by one. */
static int64_t polyc_run_length(const int64_t *offsets, int64_t count)
{
    int64_t run = 1;
    while (run < count && offsets[run] == offsets[0] + run) run++;
    return run;
}

/* s when the offsets of a group of `rank` indices (their extents and their strides in one
   tensor, outermost first) are f * s at every flat index f, else -1; 0 for at most one element.
   Indices of extent 1 do not count: they are always 0. */
static int64_t polyc_group_stride(int rank, const int64_t *extent, const int64_t *stride)
{
    int64_t count = 1;
    for (int d = 0; d < rank; d++) count *= extent[d];
    if (count <= 1) return 0;
    int64_t s = -1, inner = 1;  /* inner: the flat distance of a step of index d */
    for (int d = rank - 1; d >= 0; inner *= extent[d], d--) {
        if (extent[d] == 1) continue;
        if (s < 0) s = stride[d];  /* the innermost index that moves: inner == 1 here */
        else if (stride[d] != s * inner) return -1;
    }
    return s;
}

/* The lowest min(max(n, 0), lanes) bits set. */
static inline uint32_t polyc_lane_mask(int64_t n, int lanes)
{
    return n >= lanes ? (uint32_t)((1ull << lanes) - 1) : n <= 0 ? 0u : (uint32_t)((1u << n) - 1);
}

/* Writes an mr x nr block (row stride `stride` in `block`) to C at offsets c_m[i] + c_n[j]. */
static void polyc_scatter(const T *restrict block, int64_t stride, T *restrict c, const int64_t *restrict c_m,
                          const int64_t *restrict c_n, int64_t mr, int64_t nr, int beta)
{
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            T *restrict p = c + c_m[i] + c_n[j];
            *p = beta ? *p + block[i * stride + j] : block[i * stride + j];
        }
}

/* Asks for the cache lines of `rows` rows of `bytes` bytes each, `stride` elements apart. */
static void polyc_prefetch_rows(const T *p, int64_t rows, int64_t stride, int64_t bytes)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t offset = 0; offset < bytes; offset += 64)
            __builtin_prefetch((const char *)(p + i * stride) + offset, 0, 3);
}

static int64_t polyc_round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The step that cuts `total` into as few blocks of at most `most` as possible, of nearly equal
   sizes, multiples of `multiple` (`most` is one): 600 by at most 512 gives 300, not 512 + 88. */
static int64_t polyc_balanced_step(int64_t total, int64_t most, int64_t multiple)
{
    if (total <= 0) return most;
    const int64_t blocks = (total + most - 1) / most;
    return polyc_min(most, polyc_round_up((total + blocks - 1) / blocks, multiple));
}

/* The same for blocks that `nthr` threads take in turn: their count a multiple of nthr where
   the rounding to `multiple` allows, so no thread is left computing the last block alone (as
   a 512^3 sgemm cut into 5 row blocks of 126 rows for 2 threads was: python -m benchmarks
   --filter sgemm, benchmarks/results/zen5_contraction_polybench.json). */
static int64_t polyc_team_step(int64_t total, int64_t most, int64_t multiple, int nthr)
{
    if (total <= 0 || nthr <= 1) return polyc_balanced_step(total, most, multiple);
    const int64_t blocks = polyc_round_up((total + most - 1) / most, nthr);
    return polyc_max(multiple, polyc_round_up((total + blocks - 1) / blocks, multiple));
}

/* A barrier that spins briefly, then yields the processor while it waits: on a machine busier
   than its cores, a waiting thread must not keep the thread it waits for off the processor
   (OpenMP's default spinning can cost a scheduler time slice, milliseconds, per barrier).
   Sleeping on a futex instead of yielding made sgemm 2048 slower (waking a sleeper takes
   tens of microseconds), so the waiter yields (python -m benchmarks --filter sgemm). */
typedef struct { int count, generation; } polyc_barrier_t;

static void polyc_barrier_wait(polyc_barrier_t *barrier, int nthr)
{
    const int generation = __atomic_load_n(&barrier->generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&barrier->count, 1, __ATOMIC_ACQ_REL) == nthr) {
        __atomic_store_n(&barrier->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&barrier->generation, generation + 1, __ATOMIC_RELEASE);
        return;
    }
    for (int spins = 0; __atomic_load_n(&barrier->generation, __ATOMIC_ACQUIRE) == generation; spins++) {
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
}

/* polyc's thread pool (polyc/runtime/pool.py), when the process has loaded it: its tickets
   are taken by the calling thread and the pool's helpers as they come, and a helper that has
   not started is never waited for. */
#if defined(_OPENMP) && defined(__linux__)
typedef void (*polyc_pool_task_t)(void *context, int64_t ticket, int worker);
extern void polyc_pool_run_v1(polyc_pool_task_t task, void *context, int64_t tickets, int workers) __attribute__((weak));
#define POLYC_POOL_LOADED (polyc_pool_run_v1 != NULL)
#else
#define POLYC_POOL_LOADED 0
#endif

/* The threads computing products together: their barrier and ticket counters. */
typedef struct { int size; polyc_barrier_t barrier; int64_t pack_tickets, row_tickets, batch_tickets; } polyc_team_t;

/* One thread's count of B panels and of tickets used (the same in every thread of a team). */
typedef struct { int64_t panels, pack_base, row_base; } polyc_progress_t;

/* The next of `count` work items of a phase, or -1 when they are all taken.  Each thread takes
   until it fails once, so a phase uses count + nthr tickets and the next phase starts at the
   base after them (phases of one counter never overlap: barriers separate them). */
static int64_t polyc_take(int64_t *tickets, int64_t *base, int64_t count, int nthr)
{
    const int64_t item = __atomic_fetch_add(tickets, 1, __ATOMIC_RELAXED) - *base;
    if (item < count) return item;
    *base += count + nthr;
    return -1;
}
