#if defined(_OPENMP)
#include <dirent.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define POLYC_UNUSED __attribute__((unused))  /* a serial kernel calls none of these */
/* Threads the machine runs now.  On a machine busier than its cores, a short parallel call
   waits for its slowest thread, and a thread that is woken while another process has its core,
   or loses the core during its share, waits a scheduler time slice (milliseconds, many times
   a short call: the tail of python -m benchmarks.tail_latency).  So each thread
   measures how long it was kept from running between the call's start and the end of its
   share (wall time minus its CPU time); when some threads lost over 2 ms and over a quarter of
   a call shorter than 20 ms in two calls in a row (one such call on a machine that was not
   busy is a suspicion only: single late wakes on an idle machine otherwise dropped sgemm 1024
   to one thread for its next 16 calls), later calls use that many fewer threads, until a call
   with every thread is tried again after a number of calls that doubles each time the machine
   is still busy (16 up to 4096) and starts at 16 again once it is not.  Longer calls keep every
   thread: the threads share their work as they go, and a fair share of a busy machine's cores
   still computes more than one core.  An idle machine never loses a thread (waking one takes
   tens of microseconds), and the cost is a clock read per thread and call (a system call), a
   second one only after 2 ms.  Why 2 ms: a
   lost scheduler slice is several milliseconds, while waking a thread on a virtual processor
   that the host has put to sleep (after an idle pause, or after numpy's calls) can take about
   one; a lower threshold took such wakes for a busy machine and put a 512^3 sgemm on one
   thread, for no gain in the busy-machine percentiles.
   Slow threads count only while other processes crowd the machine: their runnable threads and
   the call's team are more than its processors (/proc/stat's procs_running less this process's
   running threads, read only after a slow call).  A thread woken late on
   an idle machine (a virtual processor the host let sleep after a pause: every first call) is
   no reason to drop threads: without this check a 512^3 sgemm called after pauses ran on one
   thread most of the time.
   POLYC_THREADS=all in the environment turns the policy off.  A kernel that can run on polyc's
   thread pool (see polyc/runtime/pool.py) does so instead of dropping threads.  Measured:
   python -m benchmarks.tail_latency (benchmarks/results/zen5_tail_latency.json,
   xeon_tail_latency.json) and python -m benchmarks --filter sgemm. */
/* crowded: looks in a row (up to 3) that found the machine crowded, at crowd_checked (ns). */
typedef struct { int64_t calls, retry_at, crowd_checked; int limit, backoff, setting, suspect, crowded; } polyc_threads_t;
typedef struct { double wall, cpu; } polyc_thread_clock_t;

/* The library's record (a function's static: linked segments each keep their own). */
static POLYC_UNUSED polyc_threads_t *polyc_threads_record(void)
{
    static polyc_threads_t record = {0, 0, INT64_MIN / 2, 0, 16, -1, 0, 0};
    return &record;
}

static POLYC_UNUSED double polyc_clock(clockid_t which)
{
    struct timespec t;
    clock_gettime(which, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The threads a parallel call may use: OpenMP's, or fewer when the kernel was compiled so. */
static POLYC_UNUSED int polyc_most_threads(void)
{
    const int most = omp_get_max_threads();
#ifdef POLYC_MAX_THREADS
    return most < POLYC_MAX_THREADS ? most : POLYC_MAX_THREADS;
#else
    return most;
#endif
}

/* POLYC_THREADS: unset (the policy), "all" (every thread, always) or "pool" (the policy, and
   kernels that can run on polyc's thread pool do so on every call, not only on a crowded
   machine: see polyc/runtime/pool.py). */
#ifndef POLYC_THREADS_POOL  /* linked segments each bring this text */
#define POLYC_THREADS_POLICY 0
#define POLYC_THREADS_ALL 1
#define POLYC_THREADS_POOL 2
#endif

static POLYC_UNUSED int polyc_threads_setting(void)
{
    polyc_threads_t *s = polyc_threads_record();
    int setting = __atomic_load_n(&s->setting, __ATOMIC_RELAXED);
    if (setting < 0) {
        const char *text = getenv("POLYC_THREADS");
        setting = text == NULL ? POLYC_THREADS_POLICY : strcmp(text, "all") == 0 ? POLYC_THREADS_ALL
                  : strcmp(text, "pool") == 0 ? POLYC_THREADS_POOL : POLYC_THREADS_POLICY;
        __atomic_store_n(&s->setting, setting, __ATOMIC_RELAXED);
    }
    return setting;
}

/* The threads for a call that could use `most`. */
static POLYC_UNUSED int polyc_threads(int most)
{
    polyc_threads_t *s = polyc_threads_record();
    const int off = polyc_threads_setting() == POLYC_THREADS_ALL;
    const int64_t call = __atomic_fetch_add(&s->calls, 1, __ATOMIC_RELAXED);
    const int limit = __atomic_load_n(&s->limit, __ATOMIC_RELAXED);
    if (off || most <= 1 || limit <= 0 || limit >= most || call >= __atomic_load_n(&s->retry_at, __ATOMIC_RELAXED))
        return most;
    return limit;
}

/* The call's start, read by the calling thread before the parallel region. */
static POLYC_UNUSED double polyc_call_start(void) { return polyc_clock(CLOCK_MONOTONIC); }

/* In each thread, first thing in the region: the waiting since `call_start` counts as lost. */
static POLYC_UNUSED void polyc_thread_start(polyc_thread_clock_t *clock, double call_start)
{
    clock->wall = call_start;
    clock->cpu = polyc_clock(CLOCK_THREAD_CPUTIME_ID);
}

/* In each thread, at the end of its share: adds one to *slow when it was kept from running
   long enough to matter (see above). */
static POLYC_UNUSED void polyc_thread_stop(const polyc_thread_clock_t *clock, int *slow)
{
    const double wall = polyc_clock(CLOCK_MONOTONIC) - clock->wall;
    if (wall <= 2e-3 || wall >= 20e-3)
        return;  /* it cannot have lost 2 ms, or it keeps every thread: no second CPU clock read */
    const double lost = wall - (polyc_clock(CLOCK_THREAD_CPUTIME_ID) - clock->cpu);
    if (lost > 2e-3 && lost > 0.25 * wall)
        __atomic_add_fetch(slow, 1, __ATOMIC_RELAXED);
}

/* Threads of this process that are running or runnable now (state R in /proc/self/task/N/stat);
   -1 where that cannot be read. */
static POLYC_UNUSED int polyc_own_running(void)
{
    DIR *tasks = opendir("/proc/self/task");
    if (tasks == NULL)
        return -1;
    int running = 0;
    char path[96], stat[512];
    for (struct dirent *task; (task = readdir(tasks)) != NULL;) {
        if (task->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%.40s/stat", task->d_name);
        FILE *file = fopen(path, "r");
        if (file == NULL)
            continue;  /* the thread ended meanwhile */
        const size_t length = fread(stat, 1, sizeof stat - 1, file);
        fclose(file);
        stat[length] = '\0';
        const char *name_end = strrchr(stat, ')');  /* a thread's name may hold spaces and ')' */
        running += name_end != NULL && name_end[1] == ' ' && name_end[2] == 'R';
    }
    closedir(tasks);
    return running;
}

/* Whether other processes crowd the processors this process may use: their runnable threads
   (/proc/stat's procs_running less this process's own) and a team of `nthr` threads are more
   than the processors.  Threads of this process do not count: after a numpy call, OpenBLAS's
   idle threads spin for a while, and counting them dropped a Kronecker step called just after
   numpy calls to one thread for the next 16 to 4096 calls, long after the spinning stopped
   (the kronecker cases of python -m benchmarks).  -1 where /proc cannot be read. */
static POLYC_UNUSED int polyc_machine_load(int nthr)
{
    /* Counted before and after /proc/stat, the larger count: threads of this process that
       fall asleep or wake meanwhile (a team leaving its region) are not taken for others. */
    const int own_before = polyc_own_running();
    FILE *file = fopen("/proc/stat", "r");
    if (file == NULL)
        return -1;
    char line[256];
    long running = -1;
    while (fgets(line, sizeof line, file) != NULL)
        if (strncmp(line, "procs_running ", 14) == 0) {
            running = strtol(line + 14, NULL, 10);
            break;
        }
    fclose(file);
    const int own_after = polyc_own_running(), own = own_before > own_after ? own_before : own_after;
    if (running < 0 || own_before < 0 || own_after < 0)
        return -1;
    const long others = running > own ? running - own : 0;
    return others + nthr > omp_get_num_procs();
}

/* The same, unknown counting as crowded (the slow threads are then the only evidence). */
static POLYC_UNUSED int polyc_machine_crowded(int nthr)
{
    return polyc_machine_load(nthr) != 0;
}

/* Whether the machine's runnable threads (/proc/loadavg's, this thread among them) could
   crowd it: more than the processors less a team of `nthr` besides this thread.  A read of a
   few bytes, where polyc_machine_load reads a file per thread of the process. */
static POLYC_UNUSED int polyc_runnable_beyond(int nthr)
{
    FILE *file = fopen("/proc/loadavg", "r");
    if (file == NULL)
        return 1;
    long runnable = -1;
    const int read = fscanf(file, "%*s %*s %*s %ld/", &runnable);
    fclose(file);
    return read != 1 || runnable - 1 + nthr > omp_get_num_procs();
}

/* Whether other processes crowd the machine lately: the machine is looked at at most every
   50 ms, and counts as crowded once three looks in a row found it so, or once a call's thread
   was kept from running for milliseconds while it was so (polyc_threads_after).  A look reads
   /proc/loadavg (a few bytes), and /proc's thread states (a file per thread) only when the
   first allows crowding (on an idle machine numpy's spinning threads make it so); those reads
   take far longer beside a busy process, so a crowded machine is looked at every 0.5 s only,
   and looking more often than every 50 ms lengthened an idle machine's tail too.  One look is
   not enough: with few cores, any thread that is runnable for a moment (a kernel worker) makes
   the machine look crowded, and idle calls of sgemm 256 went to the pool in turn with OpenMP,
   whose threads met each other.  Unknown counts as not crowded.  Measured: python -m
   benchmarks.tail_latency (benchmarks/results/zen4_tail_latency.json, zen5_tail_latency.json). */
static POLYC_UNUSED int polyc_machine_crowded_lately(int nthr)
{
    polyc_threads_t *s = polyc_threads_record();
    const int64_t now = (int64_t)(1e9 * polyc_clock(CLOCK_MONOTONIC));
    const int crowded = __atomic_load_n(&s->crowded, __ATOMIC_RELAXED);
    if (now - __atomic_load_n(&s->crowd_checked, __ATOMIC_RELAXED) > (crowded >= 3 ? 500000000 : 50000000)) {
        __atomic_store_n(&s->crowd_checked, now, __ATOMIC_RELAXED);
        const int looks = polyc_runnable_beyond(nthr) && polyc_machine_load(nthr) > 0 ? crowded + 1 : 0;
        __atomic_store_n(&s->crowded, looks < 3 ? looks : 3, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&s->crowded, __ATOMIC_RELAXED) >= 3;
}

/* Records a region of `nthr` threads (out of `most`) of which `slow` were kept waiting. */
static POLYC_UNUSED void polyc_threads_note(int nthr, int most, int slow)
{
    polyc_threads_t *s = polyc_threads_record();
    if (nthr <= 1)
        return;
    const int64_t calls = __atomic_load_n(&s->calls, __ATOMIC_RELAXED);
    if (slow > 0) {
        /* With every thread and none held back before: the first slow call only raises the
           suspicion; a retry after backing off, or a second slow call in a row, confirms it. */
        if (nthr == most && __atomic_load_n(&s->limit, __ATOMIC_RELAXED) <= 0
            && !__atomic_exchange_n(&s->suspect, 1, __ATOMIC_RELAXED))
            return;
        __atomic_store_n(&s->suspect, 0, __ATOMIC_RELAXED);
        int backoff = __atomic_load_n(&s->backoff, __ATOMIC_RELAXED);
        __atomic_store_n(&s->limit, nthr - slow > 1 ? nthr - slow : 1, __ATOMIC_RELAXED);
        __atomic_store_n(&s->retry_at, calls + backoff, __ATOMIC_RELAXED);
        __atomic_store_n(&s->backoff, backoff < 4096 ? 2 * backoff : 4096, __ATOMIC_RELAXED);
    } else if (nthr == most) {
        __atomic_store_n(&s->limit, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->backoff, 16, __ATOMIC_RELAXED);
        __atomic_store_n(&s->suspect, 0, __ATOMIC_RELAXED);
    }
}

/* After a region of `nthr` threads (out of `most`) of which `slow` were kept waiting. */
static POLYC_UNUSED void polyc_threads_after(int nthr, int most, int slow)
{
    const int crowded = slow > 0 && polyc_machine_crowded(nthr);
    polyc_threads_note(nthr, most, crowded ? slow : 0);
    if (crowded) {  /* the evidence of three looks: kernels that can move to the pool do so now */
        polyc_threads_t *s = polyc_threads_record();
        __atomic_store_n(&s->crowd_checked, (int64_t)(1e9 * polyc_clock(CLOCK_MONOTONIC)), __ATOMIC_RELAXED);
        __atomic_store_n(&s->crowded, 3, __ATOMIC_RELAXED);
    }
}
#endif
