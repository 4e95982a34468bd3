"""What the writers of hand-structured kernels share: the contraction (:mod:`polyc.codegen.gemm`),
matrix-vector (:mod:`polyc.codegen.gemv`) and convolution (:mod:`polyc.codegen.conv`) kernels.

They print C for one recognised statement plus the elementwise *epilogue* statements after it,
with the generic back end's conventions (:mod:`polyc.codegen.c`): row-major tensors whose
extents are ``const int64_t`` locals named like the generic back end's, sizes as constants when
specialised or as arguments, and epilogue statements printed through the same expression
printer, so that they compute exactly what the interpreter does.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from polyc.codegen.c import _C_KEYWORDS, _combine, _extent_name
from polyc.codegen.c_expr import CExpressionPrinter, c_type
from polyc.ir.model import PolyProgram
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.options import Options

#: How many threads a parallel call uses: all of them unless the machine is busier than its cores.
#: Each kernel library keeps its own record; a kernel calls polyc_threads() for its thread count,
#: each thread of the region wraps its work in polyc_thread_start/_stop, and the calling thread
#: then passes the count of slow threads to polyc_threads_after().
THREAD_POLICY_C = r"""#if defined(_OPENMP)
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
"""


#: Scratch memory a kernel keeps from one call to the next (the contraction kernel's packing
#: buffers).  Allocated and freed in every call, blocks of megabytes let the C library give the
#: memory back to the system and fault it in again in the next call, or not, by the allocator's
#: state, so sgemm 2048's time varied from process to process (``python -m benchmarks
#: --filter sgemm``; with glibc's allocation thresholds fixed, it did not).  A call takes the
#: kept block, or allocates its own when another call holds it or it is too small; the block
#: given back first is kept and the
#: others freed, so a kernel holds at most one block, of the size one of its calls needed
#: (untouched pages of it cost no memory), for as long as its library is loaded.
KEPT_WORKSPACE_C = r"""#include <stdlib.h>
#define POLYC_WORKSPACE_UNUSED __attribute__((unused))  /* a kernel without packing calls none */
typedef struct { void *memory; size_t bytes; } polyc_workspace_t;
typedef struct { polyc_workspace_t *block; } polyc_kept_workspace_t;

/* The kept block (a function's static: linked segments each keep their own). */
static POLYC_WORKSPACE_UNUSED polyc_kept_workspace_t *polyc_kept_workspace(void)
{
    static polyc_kept_workspace_t kept;
    return &kept;
}

/* 64-byte aligned scratch memory of at least `bytes` bytes, or NULL when there is none. */
static POLYC_WORKSPACE_UNUSED polyc_workspace_t *polyc_workspace_take(size_t bytes)
{
    polyc_workspace_t *w = __atomic_exchange_n(&polyc_kept_workspace()->block, NULL, __ATOMIC_ACQUIRE);
    if (w != NULL && w->bytes >= bytes)
        return w;
    if (w != NULL) {
        free(w->memory);
        free(w);
    }
    w = (polyc_workspace_t *)malloc(sizeof *w);
    if (w == NULL)
        return NULL;
    w->bytes = bytes > 0 ? (bytes + 63) / 64 * 64 : 64;
    w->memory = aligned_alloc(64, w->bytes);
    if (w->memory == NULL) {
        free(w);
        return NULL;
    }
    return w;
}

/* Ends a call's use of `w` (NULL: nothing): kept for the next call, or freed. */
static POLYC_WORKSPACE_UNUSED void polyc_workspace_give_back(polyc_workspace_t *w)
{
    polyc_workspace_t *none = NULL;
    polyc_kept_workspace_t *kept = polyc_kept_workspace();
    if (w != NULL && !__atomic_compare_exchange_n(&kept->block, &none, w, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        free(w->memory);
        free(w);
    }
}
"""


def typed(template: str, ctype: str) -> str:
    """``template`` with the element type for every word ``T``."""
    return re.sub(r"\bT\b", ctype, template)


class PatternKernelWriter:
    """Sizes, extents, element addresses and epilogue statements in C, for a kernel of
    ``program`` (specialised to its sizes, or parametric)."""

    def __init__(self, program: PolyProgram, options: Options):
        self.program = program
        self.definition = program.definition
        self.options = options
        self.specialised = program.size_values is not None
        tensor_names = {t.name for t in self.definition.tensors}
        self.size_c = {p: (f"{p}_size" if p in tensor_names or p in _C_KEYWORDS else p) for p in program.params}

    def known_extent(self, extent: Affine) -> int | None:
        """An extent's value when the C is written: a literal, or the sizes' when specialised;
        None when it is only known at run time."""
        if extent.is_constant:
            return extent.constant
        return extent.evaluate(self.program.size_values) if self.specialised else None

    def sizes_comment(self) -> str:
        """The sizes for the generated source's header: ``N=1, H=56`` or "parametric"."""
        if not self.specialised:
            return "parametric"
        return ", ".join(f"{k}={v}" for k, v in self.program.size_values.items())

    def preamble(self, portable_macro: str, includes: list[str]) -> str:
        """``includes``, <omp.h> when parallel, and ``#define portable_macro 1`` when not
        vectorising (the kernel's preprocessor then picks its portable C)."""
        lines = list(includes)
        if self.options.parallel:
            lines += ["#ifdef _OPENMP", "#include <omp.h>", "#endif"]
        if self.options.threads is not None:
            lines.append(f"#define POLYC_MAX_THREADS {self.options.threads}")
        lines += [THREAD_POLICY_C, KEPT_WORKSPACE_C]
        if not self.options.vectorize:
            lines.append(f"#define {portable_macro} 1")
        return "\n".join(lines)

    def size_expr(self, value: Affine) -> str:
        return value.to_c(lambda name: self.size_c[name])

    def key_length(self) -> int:
        """Entries of the key that tells the sizes a kernel's tables were built for (see
        :meth:`kept_tables`): one per size, or a single 0 when the sizes are literal."""
        return 1 if self.specialised else max(1, len(self.definition.sizes))

    def kept_tables(self, record: str, build: list[str]) -> list[str]:
        """C lines that give ``polyc_g`` (of struct type ``record``, with a ``key`` field) the
        tables of this call's sizes: ``build`` (lines that fill ``polyc_g`` and may set
        ``polyc_tables`` to the memory they allocate, freed by the caller at the end of the call)
        runs on a kernel's first call, whose record is then kept for every later call with the
        same sizes.  Built on every call, the point tables of a 1 x 1 convolution at 112 x 112
        took as long as the convolution (mobilenet_v2), and freeing them
        made the kernel interrupt its other threads' processors.  Calls with other sizes build
        their own; the kept record lives as long as the library."""
        sizes = [self.size_c[s] for s in self.definition.sizes] if not self.specialised else []
        key = ", ".join(sizes) if sizes else "0"
        return [
            f"const int64_t polyc_key[{self.key_length()}] = {{{key}}};",
            f"static {record} *polyc_kept;",
            f"{record} polyc_g;",
            "int64_t *polyc_tables = NULL;",
            f"{record} *const polyc_found = __atomic_load_n(&polyc_kept, __ATOMIC_ACQUIRE);",
            "if (polyc_found != NULL && memcmp(polyc_found->key, polyc_key, sizeof polyc_key) == 0) {",
            "    polyc_g = *polyc_found;",
            "} else {",
            "    memset(&polyc_g, 0, sizeof polyc_g);",
            *("    " + line for line in build),
            "    memcpy(polyc_g.key, polyc_key, sizeof polyc_key);",
            f"    {record} *polyc_keep = polyc_found == NULL ? ({record} *)malloc(sizeof *polyc_keep) : NULL;",
            f"    {record} *polyc_none = NULL;",
            "    if (polyc_keep != NULL) {",
            "        *polyc_keep = polyc_g;",
            "        if (__atomic_compare_exchange_n(&polyc_kept, &polyc_none, polyc_keep, 0, __ATOMIC_RELEASE,",
            "                                        __ATOMIC_RELAXED))",
            "            polyc_tables = NULL;  /* the kept record owns them now */",
            "        else",
            "            free(polyc_keep);",
            "    }",
            "}",
        ]

    def size_declarations(self, parametric_value: Callable[[str], str | None]) -> list[str]:
        """``const int64_t`` declarations of the sizes (``parametric_value(size)`` when not
        specialised; None: it is a function argument) and of every tensor extent."""
        lines = []
        for s in self.definition.sizes:
            value = self.program.size_values[s] if self.specialised else parametric_value(s)
            if value is not None:
                lines.append(f"const int64_t {self.size_c[s]} = {value};")
        for t in self.definition.tensors:
            for dim, extent in enumerate(t.shape):
                lines.append(f"const int64_t {_extent_name(t.name, dim)} = {self.size_expr(extent)};")
        lines += [f"(void){_extent_name(t.name, dim)};" for t in self.definition.tensors for dim in range(t.rank)]
        return lines

    def element(self, tensor_name: str, subscripts: list[str]) -> str:
        """C lvalue of an element (row-major, like :mod:`polyc.codegen.c`)."""
        tensor = self.definition.tensor(tensor_name)
        if tensor.rank == 0:
            return f"{tensor_name}[0]"
        offset = ""
        for dim, subscript in enumerate(subscripts):
            offset = f"({subscript})" if dim == 0 else f"({offset} * {_extent_name(tensor_name, dim)} + ({subscript}))"
        return f"{tensor_name}[{offset}]"

    def pointer_arguments(self, sizes: tuple[str, ...]) -> list[str]:
        """The kernel function's parameters: every tensor's pointer (const for the inputs), in
        signature order, then the ``sizes`` (a parametric kernel's)."""
        arguments = []
        for tensor in self.definition.tensors:
            qualified = f"const {c_type(tensor.dtype)}" if tensor.role is ir.Role.INPUT else c_type(tensor.dtype)
            arguments.append(f"{qualified} *__restrict__ {tensor.name}")
        return arguments + [f"int64_t {self.size_c[s]}" for s in sizes]

    @staticmethod
    def parallel_region(
        work: str, threshold: float, region: list[str], serial: list[str], prologue: tuple[str, ...] = ()
    ) -> list[str]:
        """C lines that run ``region`` in an OpenMP parallel region under the thread policy
        (:data:`THREAD_POLICY_C`: ``polyc_nthr`` threads, one when ``work`` is below
        ``threshold``), ``prologue`` first once ``polyc_nthr`` is known; ``serial`` where
        OpenMP is off."""
        return [
            "#if defined(_OPENMP)",
            "int polyc_nthr = 1, polyc_most = 1, polyc_slow = 0;",
            f"if ({work} >= {float(threshold)!r}) {{",
            "    polyc_most = polyc_most_threads();",
            "    polyc_nthr = polyc_threads(polyc_most);",
            "}",
            *prologue,
            "const double polyc_started = polyc_call_start();",
            "#pragma omp parallel num_threads(polyc_nthr) if(polyc_nthr > 1)",
            "{",
            "    polyc_thread_clock_t polyc_clock;",
            "    if (polyc_nthr > 1) polyc_thread_start(&polyc_clock, polyc_started);",
            *("    " + line for line in region),
            "    if (polyc_nthr > 1) polyc_thread_stop(&polyc_clock, &polyc_slow);",
            "}",
            "polyc_threads_after(polyc_nthr, polyc_most, polyc_slow);",
            "#else",
            *serial,
            "#endif",
        ]

    def workspace_region(
        self, work: str, threshold: float, allocate: list[str], region: list[str], serial: list[str]
    ) -> list[str]:
        """C lines that run ``region`` under :meth:`parallel_region` (``serial`` without OpenMP
        or without the ``parallel`` option) with the kept workspace ``polyc_work`` that
        ``allocate`` takes once ``polyc_nthr`` is known, and give it back."""
        alone = ["const int polyc_nthr = 1;", *allocate, "{", *("    " + line for line in serial), "}"]
        lines = (
            self.parallel_region(work, threshold, region, alone, prologue=tuple(allocate))
            if self.options.parallel
            else alone
        )
        return lines + ["polyc_workspace_give_back(polyc_work);"]

    def batch_indices(self, conv, image: str) -> list[str]:
        """C declarations of ``polyc_ix_<index>`` for a convolution's batch indices, from the
        flat number ``image`` (C) of the image they make together (row-major)."""
        lines = [f"int64_t polyc_rest = {image};"]
        for index in reversed(conv.batch):
            extent = self.size_expr(conv.extent(index))
            lines.append(f"const int64_t polyc_ix_{index} = polyc_rest % ({extent}); polyc_rest /= ({extent});")
        return lines + ["(void)polyc_rest;"]

    def image_box_fields(self, conv) -> list[str]:
        """C assignments to the record ``g`` of a 2-D convolution (:class:`~polyc.schedule.convolution.
        Convolution`) of the image's rows and columns (``ih, iw``) and of the positions
        ``lo <= p < hi`` whose products count (``lo_h, hi_h, lo_w, hi_w``: the padding box
        within the image)."""
        box = {b.dim: b for b in conv.box}

        def bound(dim: int, side: str, default: str) -> str:
            value = getattr(box[dim], side) if dim in box else None
            if value is None:
                return default
            value = f"({self.size_expr(value)})"
            return f"polyc_max({value}, 0)" if side == "lo" else f"polyc_min({value}, {default})"

        (wh, ww) = conv.windows
        image_h, image_w = (self.size_expr(self.definition.tensor(conv.image).shape[w.dim]) for w in conv.windows)
        return [
            f"g.ih = {image_h}; g.iw = {image_w};",
            f"g.lo_h = {bound(wh.dim, 'lo', '0')}; g.hi_h = {bound(wh.dim, 'hi', 'g.ih')};",
            f"g.lo_w = {bound(ww.dim, 'lo', '0')}; g.hi_w = {bound(ww.dim, 'hi', 'g.iw')};",
        ]

    def tensors_of_epilogues(self, target: str, epilogues: tuple[ir.CheckedStatement, ...]) -> list[str]:
        """The tensors epilogue statements on ``target`` read or write, in signature order."""
        used = {target} if epilogues else set()
        for statement in epilogues:
            used |= {read.tensor for read in ir.reads(statement.rhs)}
        return [t.name for t in self.definition.tensors if t.name in used]

    def stride(self, tensor_name: str, dim: int) -> str:
        """C of the distance between neighbours along dimension ``dim`` of a tensor."""
        tensor = self.definition.tensor(tensor_name)
        factors = [_extent_name(tensor_name, d) for d in range(dim + 1, tensor.rank)]
        return "(" + " * ".join(factors) + ")" if factors else "1"

    def epilogue_assignment(
        self, statement: ir.CheckedStatement, kernel_indices: tuple[str, ...], lhs: str | None = None
    ) -> str:
        """C of one epilogue statement at one point of the target.  The statement's indices
        are the kernel statement's ``kernel_indices`` by position, whose values are in
        ``polyc_ix_<index>``; ``lhs`` is the target element's lvalue (default: its address
        from those values), also used for reads of the target (always at the same point)."""
        index_c = {mine: f"polyc_ix_{theirs}" for mine, theirs in zip(statement.indices, kernel_indices)}
        target = self.definition.tensor(statement.target)
        lhs = lhs or self.element(statement.target, [index_c[i] for i in statement.indices])

        own_point = tuple(Affine.var(i) for i in statement.indices)

        def access(read: ir.Read, subscripts: list[str]) -> str:
            if read.tensor == statement.target:
                return lhs
            # A tensor of the target's shape read at the target's own point is at the target's
            # offset: one stream like the target's, where an address from the per-point index
            # tables was gathered element by element (a residual added in a convolution's
            # epilogue: it slowed resnet18's layer-1 blocks at batch 8).
            if (
                read.subscripts == own_point
                and lhs.startswith(f"{statement.target}[")
                and self.definition.tensor(read.tensor).shape == target.shape
            ):
                return read.tensor + lhs[len(statement.target) :]
            return self.element(read.tensor, subscripts)

        printer = CExpressionPrinter(
            access=access,
            index=lambda n: index_c[n] if n in index_c else self.size_c[n],
            size=lambda value: value.to_c(lambda n: self.size_c[n]),
        )
        value = printer.to_c(statement.rhs)
        if statement.op == "=":
            return f"{lhs} = {value}"
        return f"{lhs} = {_combine(statement.op, target.dtype, lhs, value, c_type(target.dtype))}"
