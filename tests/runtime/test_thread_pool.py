"""polyc's thread pool (polyc/runtime/pool.py): contractions shared without barriers run on it
(on a crowded machine, or always with ``POLYC_THREADS=pool``), a call never waits for a helper
that has not started, a forked child gets helpers of its own, and ``POLYC_POOL=off`` leaves
kernels on OpenMP alone."""

from __future__ import annotations

import ctypes
import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import polyc
from polyc.runtime.pool import hold_helpers, pool_statistics, thread_pool

SGEMM = "def sgemm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
BATCHED = "def bmm(float(B, M, K) X, float(B, K, N) Y) -> (Z) { Z(b, m, n) +=! X(b, m, r_k) * Y(b, r_k, n) }"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="the pool runs on Linux machines of two or more processors",
)


@pytest.fixture(scope="module")
def kernel_directory(tmp_path_factory):
    return tmp_path_factory.mktemp("pool-kernels")


@pytest.fixture(scope="module")
def products(kernel_directory):
    """sgemm 256 (a product shared by its columns) and 64 products of 32 x 32 x 32 (whole
    products per ticket), compiled once for the module and set to run on the pool in every
    call (``POLYC_THREADS=pool``, read by a kernel library at its first call), with operands
    and numpy's results."""
    rng = np.random.default_rng(0)
    A, B = rng.random((256, 256), dtype=np.float32), rng.random((256, 256), dtype=np.float32)
    X, Y = rng.random((64, 32, 32), dtype=np.float32), rng.random((64, 32, 32), dtype=np.float32)
    previous = {name: os.environ.get(name) for name in ("POLYC_CACHE_DIR", "POLYC_THREADS")}
    os.environ.update(POLYC_CACHE_DIR=str(kernel_directory), POLYC_THREADS="pool")
    try:
        sgemm = polyc.define(SGEMM, tuning=False).sgemm
        bmm = polyc.define(BATCHED, tuning=False).bmm
        calls = {"columns": (lambda: sgemm(A, B), A @ B), "batches": (lambda: bmm(X, Y), X @ Y)}
        for call, _ in calls.values():
            call()
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return calls


@pytest.mark.parametrize("share", ["columns", "batches"])
def test_products_shared_without_barriers_run_on_the_pool(products, share):
    call, expected = products[share]
    before = pool_statistics()
    for _ in range(20):
        np.testing.assert_allclose(call(), expected, rtol=1e-4)
    after = pool_statistics()
    assert after["jobs"] == before["jobs"] + 20
    assert after["helpers"] >= 1


def test_a_call_never_waits_for_helpers_that_do_not_start(products):
    """Helpers held as a busy machine's scheduler would hold them: every call still finishes,
    its tickets all done by the calling thread (an OpenMP-like join would wait for them)."""
    finished = []

    def calls():
        for share, (call, expected) in products.items():
            for _ in range(10):
                np.testing.assert_allclose(call(), expected, rtol=1e-4)
                finished.append(share)

    before = pool_statistics()
    hold_helpers(True)
    try:
        caller = threading.Thread(target=calls, daemon=True)
        caller.start()
        caller.join(timeout=60)
        finished_while_held, during = len(finished), pool_statistics()
    finally:
        hold_helpers(False)
    caller.join(timeout=60)
    assert finished_while_held == 20, "a call waited for a helper that had not started"
    assert during["jobs"] == before["jobs"] + 20
    assert during["helper_tickets"] == before["helper_tickets"]


def test_a_forked_child_computes_with_helpers_of_its_own(products):
    """The child's kernels run on one thread (OpenMP's team of the parent is gone: see
    polyc/runtime/after_fork.py); given threads again, these kernels, which run on the pool
    alone, get helpers of the child's own."""
    call, expected = products["columns"]
    call()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: 50 calls alone, 50 with two threads, and its statistics
        try:
            at_fork = pool_statistics()
            right = all(np.allclose(call(), expected, rtol=1e-4) for _ in range(50))
            alone = pool_statistics()
            ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD).omp_set_num_threads(2)
            right = right and all(np.allclose(call(), expected, rtol=1e-4) for _ in range(50))
            report = (right, at_fork, alone, pool_statistics())
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            report = (False, repr(error), None, None)
        with os.fdopen(write_end, "wb") as out:
            pickle.dump(report, out)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report_file:
        right, at_fork, alone, after = pickle.load(report_file)
    os.waitpid(child, 0)
    assert right, at_fork
    assert at_fork["helpers"] == 0, "the child believed its parent's helpers were its own"
    assert alone["helpers"] == 0 and alone["jobs"] == at_fork["jobs"], "the forked child ran on several threads"
    assert after["helpers"] >= 1 and after["helper_tickets"] > at_fork["helper_tickets"]


def test_kernels_use_openmp_alone_when_the_pool_is_off(kernel_directory):
    program = f"""
import numpy as np, polyc
from polyc.runtime.pool import pool_statistics
A = np.random.default_rng(1).random((256, 256), dtype=np.float32)
C = polyc.define({SGEMM!r}, tuning=False).sgemm(A, A)
assert np.allclose(C, A @ A, rtol=1e-4)
print(pool_statistics())
"""
    environment = {**os.environ, "POLYC_POOL": "off", "POLYC_THREADS": "pool", "POLYC_CACHE_DIR": str(kernel_directory)}
    result = subprocess.run(
        [sys.executable, "-c", program], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None"


def test_the_pool_is_loaded_before_kernels():
    assert thread_pool() is not None


def test_calls_move_to_the_pool_while_other_processes_crowd_the_machine(kernel_directory, monkeypatch):
    """With a spinning process per processor, a product shared by its columns runs on the pool
    within a second (the machine is looked at every 50 ms, crowded after three looks)."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(kernel_directory))
    monkeypatch.delenv("POLYC_THREADS", raising=False)
    rng = np.random.default_rng(2)
    I, W = rng.random((128, 1000), dtype=np.float32), rng.random((1000, 128), dtype=np.float32)
    product = polyc.define(SGEMM, tuning=False).sgemm
    expected = I @ W
    np.testing.assert_allclose(product(I, W), expected, rtol=1e-4)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count())]
    try:
        before = pool_statistics()["jobs"]
        for _ in range(400):
            np.testing.assert_allclose(product(I, W), expected, rtol=1e-4)
            if pool_statistics()["jobs"] > before:
                break
            threading.Event().wait(0.005)
        assert pool_statistics()["jobs"] > before, "calls on a crowded machine never used the pool"
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _helper_processors() -> list[set[int]]:
    """The processors each of this process's pool helpers may run on."""
    helpers = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().strip() != "polyc-pool":
                    continue
            helpers.append(os.sched_getaffinity(int(task)))
        except OSError:  # the thread ended meanwhile
            continue
    return helpers


def test_helpers_keep_off_the_callers_processor_wherever_it_moves(products):
    """A helper placed on the calling thread's processor waits beside the thread it should run
    with: before each job the helpers' masks leave that processor out, also after the caller
    has moved to another one."""
    call, expected = products["columns"]
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("this process may use one processor only")
    first, second = sorted(allowed)[:2]
    try:
        for cpu, other in ((first, second), (second, first)):
            os.sched_setaffinity(0, {cpu})  # this thread only
            np.testing.assert_allclose(call(), expected, rtol=1e-4)
            helpers = _helper_processors()
            assert helpers, "no helper threads named polyc-pool"
            for processors in helpers:
                assert cpu not in processors and other in processors, (cpu, processors)
    finally:
        os.sched_setaffinity(0, allowed)
