"""The thread policy of the contraction, matrix-vector and convolution kernels
(:data:`polyc.codegen.pattern_kernel.THREAD_POLICY_C`): fewer threads while the machine is busier
than its cores, all of them again once it is not.

The C is compiled into a small test program: its decisions are checked call by call, and its
detection on a real crowded processor (two OpenMP threads pinned to one CPU, so each is kept
waiting half the time) and on an uncrowded one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import pytest

from polyc.codegen.pattern_kernel import THREAD_POLICY_C

#: The policy's readings of the machine's load, each through a file a test can name instead
#: ($POLYC_TEST_PROC_STAT, $POLYC_TEST_PROC_LOADAVG): a load injected, so that what the policy
#: decides on an uncrowded machine is checked on a busy one too (a test run's other workers).
#: Its clock too, read through polyc_test_clock_gettime: the times a test sets, while it sets them.
PROC_READS = {
    'fopen("/proc/stat", "r")': 'fopen(polyc_test_proc("/proc/stat", "POLYC_TEST_PROC_STAT"), "r")',
    'fopen("/proc/loadavg", "r")': 'fopen(polyc_test_proc("/proc/loadavg", "POLYC_TEST_PROC_LOADAVG"), "r")',
    "clock_gettime(which, &t);": "polyc_test_clock_gettime(which, &t);",
}


def _with_injected_load(policy: str) -> str:
    for read, injected in PROC_READS.items():
        assert policy.count(read) == 1, read
        policy = policy.replace(read, injected)
    return policy


PROGRAM = (
    r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <omp.h>

static const char *polyc_test_proc(const char *path, const char *variable)
{
    const char *injected = getenv(variable);
    return injected != NULL ? injected : path;
}

static int polyc_test_clock_set;
static double polyc_test_wall, polyc_test_cpu;

static void polyc_test_clock_gettime(clockid_t which, struct timespec *t)
{
    if (!polyc_test_clock_set) {
        clock_gettime(which, t);
        return;
    }
    const double seconds = which == CLOCK_MONOTONIC ? polyc_test_wall : polyc_test_cpu;
    t->tv_sec = (time_t)seconds;
    t->tv_nsec = (long)(1e9 * (seconds - (double)t->tv_sec));
}
"""
    + _with_injected_load(THREAD_POLICY_C)
    + r"""
/* Each thread of a team of `nthr` spins for `seconds` of CPU time; returns the slow count. */
static int region(int nthr, double seconds)
{
    int slow = 0;
    const double call_start = polyc_call_start();
    #pragma omp parallel num_threads(nthr)
    {
        polyc_thread_clock_t clock;
        polyc_thread_start(&clock, call_start);
        const double start = polyc_clock(CLOCK_THREAD_CPUTIME_ID);
        volatile double x = 0;
        while (polyc_clock(CLOCK_THREAD_CPUTIME_ID) - start < seconds) x += 1;
        polyc_thread_stop(&clock, &slow);
    }
    return slow;
}

int main(int argc, char **argv)
{
    if (strcmp(argv[1], "decisions") == 0) {
        /* One slow call, then a fine one: all 4 threads still.  Two calls in a row that found
           one of 4 threads slow: 3 threads for the next 16 calls, then 4 to try again; still
           slow: 32 calls; then fine: all of them, and the wait starts at 16 again. */
        printf("%d", polyc_threads(4));
        polyc_threads_note(4, 4, 1);
        printf(" %d", polyc_threads(4));
        polyc_threads_note(4, 4, 0);
        printf(" %d", polyc_threads(4));
        polyc_threads_note(4, 4, 1);
        printf(" %d", polyc_threads(4));
        polyc_threads_note(4, 4, 1);
        printf(" /");
        for (int i = 0; i < 17; i++) printf(" %d", polyc_threads(4));
        polyc_threads_note(4, 4, 3);
        printf(" |");
        for (int i = 0; i < 33; i++) printf(" %d", polyc_threads(4));
        polyc_threads_note(4, 4, 0);
        printf(" | %d %d\n", polyc_threads(4), polyc_threads_record()->backoff);
        return 0;
    }
    if (strcmp(argv[1], "crowded") == 0) {
        /* Whether the machine is crowded for a team of argv[2] threads (default: all of this
           process's), asked while all of this process's threads spin: the others until the
           master has its answer. */
        int answer = 0, answered = 0;
        #pragma omp parallel
        {
            const double start = polyc_clock(CLOCK_MONOTONIC);
            volatile double x = 0;
            while (polyc_clock(CLOCK_MONOTONIC) - start < 0.05) x += 1;
            if (omp_get_thread_num() == 0) {
                answer = polyc_machine_crowded(argc > 2 ? atoi(argv[2]) : omp_get_num_threads());
                __atomic_store_n(&answered, 1, __ATOMIC_RELEASE);
            } else {
                while (!__atomic_load_n(&answered, __ATOMIC_ACQUIRE)) x += 1;
            }
        }
        printf("%d\n", answer);
        return 0;
    }
    if (strcmp(argv[1], "stop") == 0) {
        /* Whether a thread that ran argv[3] ms of the argv[2] ms since the call started counts
           as slow: polyc_thread_stop on clocks that read those times (started at 100 s). */
        polyc_thread_clock_t clock = {100.0, 100.0};
        polyc_test_wall = 100.0 + atof(argv[2]) * 1e-3, polyc_test_cpu = 100.0 + atof(argv[3]) * 1e-3;
        polyc_test_clock_set = 1;
        int slow = 0;
        polyc_thread_stop(&clock, &slow);
        printf("%d\n", slow);
        return 0;
    }
    if (strcmp(argv[1], "lately") == 0) {
        /* Whether the machine counts as crowded lately for a one-thread team, before and after
           a call in which argv[2] threads were slow. */
        printf("%d ", polyc_machine_crowded_lately(1));
        polyc_threads_after(1, 1, atoi(argv[2]));
        printf("%d\n", polyc_machine_crowded_lately(1));
        return 0;
    }
    /* measure: the slow threads of five regions in a row of two threads, each spinning 3 ms
       of CPU time: short enough that a region stays under the policy's 20 ms even when other
       processes take most of the CPU's time (a test run's other worker, the compilers it starts) */
    for (int i = 0; i < 5; i++) printf("%d ", region(2, 0.003));
    printf("\n");
    return 0;
}
"""
)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    compiler = shutil.which(os.environ.get("POLYC_CC") or os.environ.get("CC") or "gcc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    directory = tmp_path_factory.mktemp("thread-policy")
    (directory / "policy.c").write_text(PROGRAM)
    subprocess.run(
        [compiler, "-O1", "-fopenmp", "-o", str(directory / "policy"), str(directory / "policy.c")],
        check=True,
        capture_output=True,
    )
    return directory / "policy"


def test_decisions_call_by_call(program):
    output = subprocess.run([str(program), "decisions"], capture_output=True, text=True, check=True).stdout.split("|")
    suspected, first = (part.split() for part in output[0].split("/"))
    assert suspected == ["4", "4", "4", "4"]  # a slow call, a fine one, two slow in a row
    assert first == ["3"] * 16 + ["4"]
    second = output[1].split()
    assert second == ["1"] * 32 + ["4"]  # 3 of 4 slow: one thread, twice as long
    last = output[2].split()
    assert last == ["4", "16"]


def _run(program, cpus: str, threads: int = 2, what: str = "measure", *arguments: str, **environment) -> list[int]:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset (util-linux) is not installed")
    run = subprocess.run(
        [taskset, "-c", cpus, str(program), what, *arguments],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "passive", **environment},
    )
    return [int(word) for word in run.stdout.split()]


def _proc_stat(tmp_path, procs_running: int) -> dict:
    """The environment that shows the policy a /proc/stat with ``procs_running`` threads."""
    path = tmp_path / f"stat-{procs_running}"
    path.write_text(f"cpu  1 0 1 1 0 0 0 0 0 0\nctxt 1\nprocs_running {procs_running}\nprocs_blocked 0\n")
    return {"POLYC_TEST_PROC_STAT": str(path)}


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc (not Linux)")
def test_three_spinning_threads_crowd_one_cpu(program):
    # Three threads pinned to one CPU crowd it whatever the rest of the machine does.
    assert _run(program, str(sorted(os.sched_getaffinity(0))[0]), threads=3, what="crowded") == [1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc (not Linux)")
def test_a_team_of_two_on_two_cpus_is_crowded_by_other_processes_only(program, tmp_path):
    """/proc/stat injected: its 2 running threads are this team's own (both spin), so the two
    CPUs are not crowded; a third running thread is another process's, and they are."""
    cpus = ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))
    assert _run(program, cpus, 2, "crowded", **_proc_stat(tmp_path, 2)) == [0]
    assert _run(program, cpus, 2, "crowded", **_proc_stat(tmp_path, 3)) == [1]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc (not Linux)")
def test_this_processs_spinning_threads_do_not_crowd_a_one_thread_team(program, tmp_path):
    """Three spinning threads of this process (as OpenBLAS's idle threads spin after a numpy
    call) on one CPU, /proc/stat injected with those three running: a one-thread team there is
    not crowded; with a fourth, another process's, it is."""
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    assert _run(program, cpu, 3, "crowded", "1", **_proc_stat(tmp_path, 3)) == [0]
    assert _run(program, cpu, 3, "crowded", "1", **_proc_stat(tmp_path, 4)) == [1]


@pytest.mark.parametrize(
    "wall_ms, ran_ms, slow",
    [(10, 10, 0), (10, 7, 1), (6, 4.1, 0), (6, 3.9, 1), (19, 15, 0), (19, 14, 1), (1.9, 0, 0), (25, 0, 0)],
)
def test_a_thread_is_slow_when_it_lost_over_2_ms_and_a_quarter_of_its_wall_time(program, wall_ms, ran_ms, slow):
    """polyc_thread_stop's arithmetic on clock readings set by the test (the real-clock tests
    below depend on what else runs): lost = wall - ran, slow when lost > 2 ms and > wall / 4,
    for calls of 2 to 20 ms."""
    run = subprocess.run([str(program), "stop", str(wall_ms), str(ran_ms)], capture_output=True, text=True, check=True)
    assert int(run.stdout) == slow


@contextlib.contextmanager
def _busy_process_on(cpu: str):
    """A process spinning on processor `cpu` for the duration of the block."""
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset (util-linux) is not installed")
    busy = subprocess.Popen([taskset, "-c", cpu, sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc (not Linux)")
def test_another_process_crowds_the_machine(program):
    # A busy process on the CPU (the real /proc/stat): a one-thread team there is crowded.
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    with _busy_process_on(cpu):
        assert _run(program, cpu, 1, "crowded", "1") == [1]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="no /proc (not Linux)")
def test_a_slow_call_on_a_crowded_machine_moves_calls_to_the_pool_at_once(program):
    """Three looks 50 ms apart make a machine crowded lately; a call whose thread was kept from
    running while other processes crowd the machine is evidence enough, and the next call goes
    to the pool (the 150 ms of OpenMP calls before cost sgemm 256 its busy p90).  A call with no
    slow thread changes nothing."""
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    with _busy_process_on(cpu):
        assert _run(program, cpu, 1, "lately", "1") == [0, 1]
        assert _run(program, cpu, 1, "lately", "0") == [0, 0]


def test_threads_sharing_one_cpu_are_found_slow(program):
    # Two threads on one CPU: one waits for the other most of its 3 ms, in every region. A CI
    # run's other worker on the same CPU once stretched a region of 5 ms shares past the 20 ms
    # the policy looks at; so 3 ms shares, and one region in five may still be stretched so.
    slow_threads = _run(program, "0")
    assert sum(slow >= 1 for slow in slow_threads) >= 4, slow_threads


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_threads_on_their_own_cpus_are_not_slow_when_the_machine_is_idle(program):
    # Real clocks, so only on an idle machine; the decision itself, on clocks the test sets, is
    # checked on any machine (test_a_thread_is_slow_when_it_lost_over_2_ms_...).
    if os.getloadavg()[0] > 0.5:
        pytest.skip(f"the machine is busy (load {os.getloadavg()[0]:.2f}): other processes may take the CPUs")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    # A virtual machine's host may pause both processors for milliseconds now and then (seen
    # on an Intel VM: about one region in six), which the policy rightly counts; but on an idle
    # machine most regions find both threads running at once.
    slow_regions = sum(slow > 0 for slow in _run(program, f"{cpus[0]},{cpus[1]}"))
    assert slow_regions <= 2, f"{slow_regions} of 5 regions had a slow thread"
