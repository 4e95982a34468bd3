"""Suite-wide pytest settings: the ``--update-goldens`` option, which golden tests read through
the ``update_goldens`` fixture (see tests/test_golden.py), a private tuning-records file, so
that records the user made with ``polyc.tune`` never change what the tests compile, and the
order in which pytest-xdist's workers take the test files (longest first, from
``tests/file_seconds.json``, which ``--record-file-seconds`` writes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ["POLYC_TUNING_FILE"] = os.path.join(tempfile.mkdtemp(prefix="polyc-test-tuning-"), "records.jsonl")

#: Seconds each test file took in a recorded run of the suite (``--record-file-seconds``).
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")

#: What a test of a file missing from FILE_SECONDS is taken to cost.
UNRECORDED_TEST_SECONDS = 0.5


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="rewrite the stored golden files under tests/golden/ with the current output "
        "instead of comparing against them (review the git diff afterwards)",
    )
    parser.addoption(
        "--record-file-seconds",
        metavar="PATH",
        type=Path,
        default=None,
        help="write each test file's seconds (its tests' setup, call and teardown) to PATH "
        f"as JSON ({FILE_SECONDS.name} holds a whole run's, which orders the files)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the files longest first, each file's tests in their own order.

    ``--dist loadfile`` hands whole files to the workers in collection order (setup.cfg's
    --no-loadscope-reorder; by default pytest-xdist would sort them by their number of tests,
    which starts the files of a few long tests, the real ONNX models and the fuzzers, last), so
    a long file started near the end keeps one worker busy while the other has nothing left:
    the order that shortens a run is the longest first.  Every worker collects, and sorts, alike.
    """
    if not hasattr(config, "workerinput"):
        return
    try:
        recorded = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        recorded = {}
    tests_per_file = Counter(_file_of(item.nodeid) for item in items)

    def file_seconds(item: pytest.Item) -> float:
        file = _file_of(item.nodeid)
        return recorded.get(file, tests_per_file[file] * UNRECORDED_TEST_SECONDS)

    items.sort(key=file_seconds, reverse=True)  # a stable sort keeps each file's order


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FileSecondsRecorder:
    """Adds up each test file's report durations (in the process that reports, the pytest-xdist
    controller under -n) and writes them as JSON when the session ends."""

    def __init__(self, path: Path):
        self.path, self.seconds = path, Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = {file: round(seconds, 1) for file, seconds in self.seconds.most_common()}
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-file-seconds")
    if path is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileSecondsRecorder(path), "polyc-file-seconds")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when pytest ran with ``--update-goldens``: golden tests then write, not compare."""
    return request.config.getoption("--update-goldens")


@pytest.fixture
def watched_builds(monkeypatch) -> SimpleNamespace:
    """The kernel cache's C compiles, each held back 0.3 s (long enough for the next kernel's C to
    be generated meanwhile, so that builds that may overlap do): ``running`` now, ``most`` at
    once, ``count`` so far."""
    from polyc.runtime import cache as cache_module

    real_compile, lock = cache_module.compile_shared_library, threading.Lock()
    builds = SimpleNamespace(running=0, most=0, count=0)

    def watched_compile(*args, **kwargs):
        with lock:
            builds.running += 1
            builds.count += 1
            builds.most = max(builds.most, builds.running)
        try:
            time.sleep(0.3)
            return real_compile(*args, **kwargs)
        finally:
            with lock:
                builds.running -= 1

    monkeypatch.setattr(cache_module, "compile_shared_library", watched_compile)
    return builds


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """When a pytest-xdist worker dies, say how: a segfault prints its own traceback, but a worker
    killed from outside (the kernel's out-of-memory killer sends SIGKILL) leaves only xdist's
    "node down: Not properly terminated".  setup.cfg's --max-worker-restart=0 then ends the run
    instead of letting xdist's loadfile scheduler wait for ever (pytest-xdist issue 1323)."""
    if error is None:
        return
    popen = getattr(getattr(node.gateway, "_io", None), "popen", None)
    try:
        status = popen.wait(timeout=10) if popen is not None else None
    except subprocess.TimeoutExpired:  # still running: nothing more to say
        status = None
    how = f"killed by {signal.Signals(-status).name}" if status is not None and status < 0 else f"exit status {status}"
    try:
        with open("/proc/meminfo") as meminfo:
            available = next(line.split()[1] for line in meminfo if line.startswith("MemAvailable"))
        memory = f"; {int(available) // 1024} MiB of memory available now"
    except (OSError, StopIteration):
        memory = ""
    sys.stderr.write(f"\n[{node.gateway.id}] worker {how}{memory}\n")
