"""Kernels in a child of ``fork()`` after the parent ran parallel kernels
(:mod:`polyc.runtime.after_fork`).

Each case runs a script in a fresh interpreter: it runs parallel kernels (a matmul, an
elementwise sum, a loop nest with ``threads=2``, an ONNX session), then a ``multiprocessing``
child runs them again and checks them against numpy.  The kernels' module runs them at import,
and the ``forkserver`` server preloads it, so there the server has run them before it forks the
child.  A child that hangs (libgomp waits for its parent's team, which does not exist
in the child) is killed after a timeout and fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("onnx")

#: The kernels, run once on import.
KERNELS = r'''
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import polyc
import polyc.onnx

SOURCE = """
def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }
def add(float(N) X, float(N) Y) -> (Z) { Z(i) = X(i) + Y(i) }
def scale(float(M, N) X) -> (Y) { Y(m, n) = 2 * X(m, n) }
"""
module = polyc.define(SOURCE)
capped = polyc.define(SOURCE, threads=2)
weights = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
    "fork",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
    [numpy_helper.from_array(weights, "w")],
)
session = polyc.onnx.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def run_kernels(size):
    """Every kernel once on operands of `size`, checked against numpy."""
    rng = np.random.default_rng(size)
    a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
    x, y = (rng.standard_normal(size * 4096).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(module.matmul(a, b), a @ b, rtol=1e-4, atol=1e-4 * size)  # sums of `size` products
    np.testing.assert_array_equal(module.add(x, y), x + y)
    np.testing.assert_array_equal(capped.scale(a), 2 * a)
    (out,) = session.run(None, {"x": a[:, :64].copy()})
    np.testing.assert_allclose(out, np.maximum(a[:, :64] @ weights, 0), rtol=1e-4, atol=1e-3)


run_kernels(256)
'''

#: The parent: its child runs the kernels again.
SCRIPT = r'''
import multiprocessing
import sys

import fork_kernels


def child(queue):
    fork_kernels.run_kernels(100)
    queue.put("ok")


if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    if sys.argv[1] == "forkserver":
        context.set_forkserver_preload(["fork_kernels"])
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    process.join(float(sys.argv[2]))
    if process.is_alive():
        process.kill()
        sys.exit("the child hung")
    if process.exitcode != 0 or queue.get(timeout=5) != "ok":
        sys.exit(f"the child failed: exit code {process.exitcode}")
    fork_kernels.run_kernels(128)  # and the parent goes on as before
    print("ok")
'''

#: Seconds a child may take: its kernels compile for new sizes (a cold cache, two busy cores).
CHILD_SECONDS = 240


@pytest.mark.parametrize("threads", [None, "all", "pool"])
@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_kernels_run_in_a_forked_child(tmp_path, start_method, threads):
    script = tmp_path / "fork_child.py"
    script.write_text(SCRIPT)
    (tmp_path / "fork_kernels.py").write_text(KERNELS)
    environment = {key: value for key, value in os.environ.items() if key != "POLYC_THREADS"}
    environment["OMP_NUM_THREADS"] = "2"  # a team of threads even on one core
    # Python 3.11's forkserver ignores the parent's sys.path: it finds the kernels' module here.
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    if threads is not None:
        environment["POLYC_THREADS"] = threads
    result = subprocess.run(
        [sys.executable, str(script), start_method, str(CHILD_SECONDS)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=CHILD_SECONDS + 240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
