"""Suite-wide pytest settings: the ``--update-goldens`` option, which golden tests read through
the ``update_goldens`` fixture (see tests/test_golden.py), and a private tuning-records file, so
that records the user made with ``polyc.tune`` never change what the tests compile."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest

os.environ["POLYC_TUNING_FILE"] = os.path.join(tempfile.mkdtemp(prefix="polyc-test-tuning-"), "records.jsonl")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the stored golden files under tests/golden/ with the current output "
                          "instead of comparing against them (review the git diff afterwards)")


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
