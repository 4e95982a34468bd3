"""A sample of polyc's OpenCL kernels under oclgrind's simulator with its data-race,
bounds and API checks: clean.  Negative controls (a kernel with its reduction loop
across threads, one reading past its buffer) show that the harness catches what it should."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
OCLGRIND = shutil.which("oclgrind")
pytestmark = pytest.mark.skipif(OCLGRIND is None, reason="oclgrind is not installed (Debian: apt-get install oclgrind)")

RUNNER = Path(__file__).with_name("oclgrind_runner.py")

#: oclgrind's words for the errors it finds.
ERRORS = (
    "data race",
    "Invalid read",
    "Invalid write",
    "Uninitialized",
    "divergence",
    "out-of-bounds",
    "Oclgrind - OpenCL runtime error",
)

#: API "errors" that are pyopencl probing for device properties oclgrind's simulator lacks.
PROBES = ("Function: clGetDeviceInfo", "Function: clGetPlatformInfo")


def errors_in(report: str) -> list[str]:
    """oclgrind's error reports in ``report`` (its stderr), without pyopencl's probes."""
    blocks = [block for block in report.split("\n\n") if not any(probe in block for probe in PROBES)]
    return [block.strip() for block in blocks if any(error in block for error in ERRORS)]


#: Kernels of every shape: a contraction, row-wise reductions fused into one launch, two
#: launches, a convolution, a gather, bool outputs, float64, a strided pooling.
SAMPLE = (
    "matmul",
    "softmax",
    "atax",
    "conv2d",
    "embedding_bag",
    "compare",
    "double_norm",
    "maxpool2x2",
    "batchnorm_train",
)


def run_under_oclgrind(tmp_path, *arguments) -> subprocess.CompletedProcess:
    environment = dict(os.environ, POLYC_CACHE_DIR=str(tmp_path / "cache"))
    # (not --uninitialized: its plugin aborts on the LLVM 'freeze' instruction clang emits)
    return subprocess.run(
        [OCLGRIND, "--data-races", "--check-api", sys.executable, str(RUNNER), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )


@pytest.mark.parametrize("name", SAMPLE)
def test_kernel_is_clean_under_oclgrind(tmp_path, name):
    done = run_under_oclgrind(tmp_path, "case", name)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
    found = errors_in(done.stderr)
    assert not found, "\n\n".join(found)[:3000]


@pytest.mark.parametrize("name", ["softmax", "sum_all"])
def test_block_reductions_are_clean_under_oclgrind(tmp_path, name):
    done = run_under_oclgrind(tmp_path, "block-rows", name)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
    found = errors_in(done.stderr)
    assert not found, "\n\n".join(found)[:3000]


def test_negative_controls_start_from_a_clean_baseline(tmp_path):
    """The controls below perturb this run: matmul as generated, inputs of the shapes it was built
    for, results checked against numpy; oclgrind reports nothing."""
    done = run_under_oclgrind(tmp_path, "unmodified")
    assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
    found = errors_in(done.stderr)
    assert not found, "\n\n".join(found)[:3000]


def test_negative_control_a_race_is_reported(tmp_path):
    done = run_under_oclgrind(tmp_path, "racy")
    assert any("data race" in error for error in errors_in(done.stderr))


def test_negative_control_an_out_of_bounds_read_is_reported(tmp_path):
    done = run_under_oclgrind(tmp_path, "out-of-bounds")
    assert any("Invalid read" in error for error in errors_in(done.stderr))


def test_negative_control_a_missing_barrier_is_reported(tmp_path):
    done = run_under_oclgrind(tmp_path, "no-barrier")
    assert any("data race" in error for error in errors_in(done.stderr))
