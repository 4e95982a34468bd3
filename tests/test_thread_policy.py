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

PROGRAM = (
    r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
"""
    + THREAD_POLICY_C
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


def _run(program, cpus: str, threads: int = 2, what: str = "measure", *arguments: str) -> list[int]:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset (util-linux) is not installed")
    run = subprocess.run(
        [taskset, "-c", cpus, str(program), what, *arguments],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "passive"},
    )
    return [int(word) for word in run.stdout.split()]


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="no /proc/stat (not Linux)")
def test_three_spinning_threads_crowd_two_cpus_and_two_do_not(program):
    cpus = sorted(os.sched_getaffinity(0))
    # Three threads pinned to one CPU crowd it whatever the rest of the machine does.
    assert _run(program, str(cpus[0]), threads=3, what="crowded") == [1]
    if len(cpus) >= 2 and os.getloadavg()[0] <= 0.5:
        # Two threads on two CPUs of an idle machine: a late thread there is a late wake-up.
        # Another process may run for a moment (a test worker beside this one), so of three
        # tries one must find the machine uncrowded.
        answers = [_run(program, f"{cpus[0]},{cpus[1]}", threads=2, what="crowded") for _ in range(3)]
        assert [0] in answers, answers


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
def test_other_processes_crowd_the_machine_and_this_ones_threads_do_not(program):
    cpu = str(sorted(os.sched_getaffinity(0))[0])
    # A busy process on the CPU: a one-thread team there is crowded.
    with _busy_process_on(cpu):
        assert _run(program, cpu, 1, "crowded", "1") == [1]
    if os.getloadavg()[0] > 0.5:
        pytest.skip(f"the machine is busy (load {os.getloadavg()[0]:.2f}): other processes may take the CPU")
    # Three spinning threads of this process (as OpenBLAS's idle threads spin after a numpy call)
    # do not crowd it for a one-thread team; of three tries one must find the CPU free of others.
    answers = [_run(program, cpu, 3, "crowded", "1") for _ in range(3)]
    assert [0] in answers, answers


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
    if os.getloadavg()[0] > 0.5:
        pytest.skip(f"the machine is busy (load {os.getloadavg()[0]:.2f}): other processes may take the CPUs")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    # A virtual machine's host may pause both processors for milliseconds now and then (seen
    # on an Intel VM: about one region in six), which the policy rightly counts; but on an idle
    # machine most regions find both threads running at once.
    slow_regions = sum(slow > 0 for slow in _run(program, f"{cpus[0]},{cpus[1]}"))
    assert slow_regions <= 2, f"{slow_regions} of 5 regions had a slow thread"
