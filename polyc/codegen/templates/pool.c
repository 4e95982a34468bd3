/* polyc's thread pool (see polyc/runtime/pool.py). */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>

typedef void (*polyc_pool_task_t)(void *context, int64_t ticket, int worker);

#define POLYC_POOL_MOST 1024            /* helpers at most */
#define POLYC_POOL_SPIN 3e-3            /* seconds a helper spins after a job */
#define POLYC_POOL_KEPT_OFF 0.5e-3      /* a gap this long in the spinning: another task ran */
#define POLYC_POOL_CROWDED 0.1          /* seconds a helper sleeps at once after such a gap, */
#define POLYC_POOL_CROWDED_MOST 1.6     /* doubled up to this while each try of spinning meets one */
#define POLYC_POOL_UNDISTURBED 0.02     /* seconds of spinning with no gap that end such periods */
#define POLYC_POOL_SLICE_NS 100000      /* the scheduler slice helpers ask for */

typedef struct { polyc_pool_task_t task; void *context; int64_t tickets; int workers; } polyc_pool_job_t;

static struct {
    uint64_t next;              /* job generation << 32 | its next ticket */
    int published;              /* the generation of the last job (the helpers' futex word) */
    int sleepers;               /* helpers asleep on `published` */
    int64_t done;               /* tickets of the current job done */
    polyc_pool_job_t jobs[2];   /* generation g in jobs[g & 1] */
    int avoided_cpu;            /* the processor kept out of the helpers' masks (-1: none) */
    cpu_set_t allowed;          /* the processors helpers may use (their creator's) */
    pid_t tids[POLYC_POOL_MOST + 1];  /* per helper: its thread id, once it runs */
    int helpers;                /* started */
    int held;                   /* tests: helpers take no tickets */
    int seen_at_start[POLYC_POOL_MOST + 1];  /* per helper: the last job before it was made (the
                                                job that made it is its first) */
    int64_t jobs_run, helper_tickets;
    pthread_mutex_t calling;    /* one job at a time; another caller runs its job alone */
    pthread_mutex_t starting;
} polyc_pool = {.avoided_cpu = -1, .calling = PTHREAD_MUTEX_INITIALIZER, .starting = PTHREAD_MUTEX_INITIALIZER};

static double polyc_pool_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A few hundred cycles of waiting that leave the core to its other hardware thread. */
static void polyc_pool_pause(void)
{
    for (int i = 0; i < 32; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
}

/* The next ticket of job `generation` for `worker`, or -1 when it has none left or is over.
   The compare-exchange succeeds only while the job is still `generation`, so the job record
   read here is that job's: the next one reusing the slot is published after every ticket of
   this one is done. */
static int64_t polyc_pool_take(uint32_t generation, int worker, polyc_pool_job_t **job)
{
    uint64_t next = __atomic_load_n(&polyc_pool.next, __ATOMIC_ACQUIRE);
    for (;;) {
        if ((uint32_t)(next >> 32) != generation)
            return -1;
        polyc_pool_job_t *j = &polyc_pool.jobs[generation & 1];
        const int64_t ticket = (int64_t)(next & 0xffffffffu);
        /* Atomic reads: a helper that lags behind may read a slot being filled for a later job
           (its compare-exchange then fails). */
        if (ticket >= __atomic_load_n(&j->tickets, __ATOMIC_RELAXED) || worker >= __atomic_load_n(&j->workers, __ATOMIC_RELAXED))
            return -1;
        if (__atomic_compare_exchange_n(&polyc_pool.next, &next, next + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *job = j;
            return ticket;
        }
    }
}

static void polyc_pool_work(uint32_t generation, int worker)
{
    polyc_pool_job_t *job;
    for (int64_t ticket; (ticket = polyc_pool_take(generation, worker, &job)) >= 0;) {
        job->task(job->context, ticket, worker);
        if (worker > 0)
            __atomic_add_fetch(&polyc_pool.helper_tickets, 1, __ATOMIC_RELAXED);
        __atomic_add_fetch(&polyc_pool.done, 1, __ATOMIC_RELEASE);
    }
}

/* Asks for short scheduler slices (Linux's sched_attr, version 1 layout). */
static void polyc_pool_short_slices(void)
{
    struct { uint32_t size, policy; uint64_t flags; int32_t nice; uint32_t priority;
             uint64_t runtime, deadline, period; } attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.policy = SCHED_OTHER;
    attr.runtime = POLYC_POOL_SLICE_NS;
    syscall(SYS_sched_setattr, 0, &attr, 0);  /* an older kernel refuses or ignores it: no matter */
}

/* Keeps helper thread `tid` off processor `cpu` when the helpers' mask leaves it another one. */
static void polyc_pool_avoid(pid_t tid, int cpu)
{
    const cpu_set_t *allowed = &polyc_pool.allowed;
    if (tid == 0 || cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, allowed) || CPU_COUNT(allowed) < 2)
        return;
    cpu_set_t others = *allowed;
    CPU_CLR(cpu, &others);
    sched_setaffinity(tid, sizeof others, &others);  /* refused: the helper may meet the caller */
}

/* Before a job: the helpers' masks leave out the caller's processor.  Placed there, a woken
   helper waits beside the thread it should run with, and beside a busy process it almost never
   did a ticket (benchmarks/results/zen4_tail_latency_2026-12-05_keepoff_run*.json).  The
   caller moves between processors now and then (between a benchmark's blocks of calls): done
   when it has moved, a system call per helper. */
static void polyc_pool_keep_off(int cpu, int helpers)
{
    if (cpu == __atomic_load_n(&polyc_pool.avoided_cpu, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&polyc_pool.avoided_cpu, cpu, __ATOMIC_RELAXED);
    for (int worker = 1; worker <= helpers; worker++)
        polyc_pool_avoid(__atomic_load_n(&polyc_pool.tids[worker], __ATOMIC_ACQUIRE), cpu);
}

/* Whether a helper spins after its jobs.  Kept off its processor for a while as it spins,
   it sleeps after its jobs for `period` seconds (until `until`).  The period doubles each time
   the spinning after it meets such a gap again, up to POLYC_POOL_CROWDED_MOST, and is set back
   once the helper has spun POLYC_POOL_UNDISTURBED seconds undisturbed: beside a busy process,
   each try at spinning lost the processor for a slice, and the helper the calls of that slice
   (two or three in a row, every 0.1 s with a fixed period), but often only after spinning
   through a call or two. */
typedef struct { double until, period, undisturbed; } polyc_pool_spinning_t;

static void polyc_pool_kept_off(polyc_pool_spinning_t *spinning, double now)
{
    const double twice = 2 * spinning->period;
    spinning->period = spinning->undisturbed >= POLYC_POOL_UNDISTURBED ? POLYC_POOL_CROWDED
                       : twice < POLYC_POOL_CROWDED_MOST ? twice : POLYC_POOL_CROWDED_MOST;
    spinning->until = now + spinning->period;
    spinning->undisturbed = 0;
}

/* After a wait that spun from `since` to `now`, with no gap when `gap` is 0. */
static void polyc_pool_spun(polyc_pool_spinning_t *spinning, double since, double now, int gap)
{
    if (since >= 0 && !gap)
        spinning->undisturbed += now - since;
}

static void *polyc_pool_helper(void *argument)
{
    const int worker = (int)(intptr_t)argument;
    int seen = polyc_pool.seen_at_start[worker], now_published;
    const pid_t tid = (pid_t)syscall(SYS_gettid);
    pthread_setname_np(pthread_self(), "polyc-pool");  /* as top -H and /proc show it */
    __atomic_store_n(&polyc_pool.tids[worker], tid, __ATOMIC_RELEASE);
    polyc_pool_avoid(tid, __atomic_load_n(&polyc_pool.avoided_cpu, __ATOMIC_RELAXED));
    polyc_pool_short_slices();
    polyc_pool_spinning_t spinning = {-1, POLYC_POOL_CROWDED, POLYC_POOL_UNDISTURBED};
    for (;;) {
        const double idle_since = polyc_pool_now();
        double last = idle_since;
        double spun_since = -1;  /* the start of this wait's spinning, if it spun */
        int gap = 0;
        while ((now_published = __atomic_load_n(&polyc_pool.published, __ATOMIC_ACQUIRE)) == seen) {
            const double now = polyc_pool_now();
            if (now - last > POLYC_POOL_KEPT_OFF) {
                polyc_pool_kept_off(&spinning, now);
                gap = 1;
            }
            last = now;
            if (now - idle_since < POLYC_POOL_SPIN && now >= spinning.until) {
                if (spun_since < 0)
                    spun_since = now;
                polyc_pool_pause();
                continue;
            }
            polyc_pool_spun(&spinning, spun_since, now, gap);
            spun_since = -1;
            __atomic_add_fetch(&polyc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &polyc_pool.published, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            __atomic_sub_fetch(&polyc_pool.sleepers, 1, __ATOMIC_SEQ_CST);
            last = polyc_pool_now();  /* asleep is not kept off */
        }
        /* Kept off while spinning, it may find the job only when it runs again: that gap counts
           too (missed, it kept spinning and missed the next calls in a row). */
        const double now = polyc_pool_now();
        if (now - last > POLYC_POOL_KEPT_OFF) {
            polyc_pool_kept_off(&spinning, now);
            gap = 1;
        }
        polyc_pool_spun(&spinning, spun_since, now, gap);
        seen = now_published;
        while (__atomic_load_n(&polyc_pool.held, __ATOMIC_ACQUIRE))  /* tests: as if not yet started */
            usleep(200);
        polyc_pool_work((uint32_t)seen, worker);
    }
    return NULL;
}

/* A child of fork() has none of its parent's helpers: it starts its own. */
static void polyc_pool_after_fork(void)
{
    polyc_pool.helpers = 0;
    polyc_pool.sleepers = 0;
    polyc_pool.avoided_cpu = -1;
    memset(polyc_pool.tids, 0, sizeof polyc_pool.tids);
    pthread_mutex_init(&polyc_pool.calling, NULL);
    pthread_mutex_init(&polyc_pool.starting, NULL);
}

static void polyc_pool_start(int helpers)
{
    static int registered;
    pthread_mutex_lock(&polyc_pool.starting);
    if (!registered)
        registered = pthread_atfork(NULL, NULL, polyc_pool_after_fork) == 0;
    if (__atomic_load_n(&polyc_pool.helpers, __ATOMIC_RELAXED) == 0
        && pthread_getaffinity_np(pthread_self(), sizeof polyc_pool.allowed, &polyc_pool.allowed) != 0)
        CPU_ZERO(&polyc_pool.allowed);  /* unknown: helpers are left where the scheduler puts them */
    while (__atomic_load_n(&polyc_pool.helpers, __ATOMIC_RELAXED) < helpers) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        const int worker = __atomic_load_n(&polyc_pool.helpers, __ATOMIC_RELAXED) + 1;
        polyc_pool.seen_at_start[worker] = __atomic_load_n(&polyc_pool.published, __ATOMIC_ACQUIRE);
        const int failed = pthread_create(&thread, &attributes, polyc_pool_helper, (void *)(intptr_t)worker);
        pthread_attr_destroy(&attributes);
        if (failed)
            break;  /* fewer helpers: the caller takes their tickets */
        __atomic_store_n(&polyc_pool.helpers, worker, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&polyc_pool.starting);
}

/* Runs task(context, t, worker) for every ticket t in 0 .. tickets - 1, on this thread (worker
   0) and helpers 1 .. workers - 1 as they come; returns when all are done. */
void polyc_pool_run_v1(polyc_pool_task_t task, void *context, int64_t tickets, int workers)
{
    if (workers > POLYC_POOL_MOST + 1)
        workers = POLYC_POOL_MOST + 1;
    if (workers <= 1 || tickets <= 1 || tickets > UINT32_MAX || pthread_mutex_trylock(&polyc_pool.calling) != 0) {
        for (int64_t t = 0; t < tickets; t++)
            task(context, t, 0);
        return;
    }
    if (__atomic_load_n(&polyc_pool.helpers, __ATOMIC_ACQUIRE) < workers - 1)
        polyc_pool_start(workers - 1);
    polyc_pool_keep_off(sched_getcpu(), workers - 1);
    const uint32_t generation = (uint32_t)(__atomic_load_n(&polyc_pool.next, __ATOMIC_RELAXED) >> 32) + 1;
    polyc_pool_job_t *job = &polyc_pool.jobs[generation & 1];
    job->task = task;
    job->context = context;
    __atomic_store_n(&job->tickets, tickets, __ATOMIC_RELAXED);
    __atomic_store_n(&job->workers, workers, __ATOMIC_RELAXED);
    __atomic_store_n(&polyc_pool.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&polyc_pool.next, (uint64_t)generation << 32, __ATOMIC_RELEASE);
    __atomic_store_n(&polyc_pool.published, (int)generation, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&polyc_pool.sleepers, __ATOMIC_SEQ_CST) > 0)
        syscall(SYS_futex, &polyc_pool.published, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    polyc_pool_work(generation, 0);
    /* Only tickets a helper took can be left: wait for them.  Not by yielding at once: this
       processor's other task is then often another process, which keeps it a whole slice
       (most calls of sgemm 256 beside a busy process, python -m benchmarks.tail_latency); only
       after 1 ms, when the helper may be waiting for this very processor. */
    const double waiting_since = polyc_pool_now();
    while (__atomic_load_n(&polyc_pool.done, __ATOMIC_ACQUIRE) < tickets) {
        polyc_pool_pause();
        if (polyc_pool_now() - waiting_since > 1e-3)
            sched_yield();
    }
    __atomic_add_fetch(&polyc_pool.jobs_run, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&polyc_pool.calling);
}

/* For tests and diagnosis: jobs run by the pool, tickets done by helpers, helpers started. */
void polyc_pool_statistics_v1(int64_t *out)
{
    out[0] = __atomic_load_n(&polyc_pool.jobs_run, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&polyc_pool.helper_tickets, __ATOMIC_RELAXED);
    out[2] = __atomic_load_n(&polyc_pool.helpers, __ATOMIC_RELAXED);
}

/* For tests: while `held` is set, helpers that see a job do not start on it, like threads the
   scheduler keeps waiting. */
void polyc_pool_hold_v1(int held) { __atomic_store_n(&polyc_pool.held, held, __ATOMIC_RELAXED); }
#endif
