"""Model files are read bounded and only when regular: a path to /dev/zero (through a link), a
FIFO, a directory or a file over protobuf's 2 GiB limit is a PolycError at once.

Each case runs in a child interpreter with a timeout and a memory limit, so that a read that
never ends (a FIFO without a writer, /dev/zero) fails the test rather than blocks it or fills
the machine's memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs and /dev/zero as on Linux")

OPEN = """
import sys
import polyc.onnx
from polyc.errors import PolycError
try:
    polyc.onnx.InferenceSession(sys.argv[1])
except PolycError as error:
    print(error)
"""

#: A child reads at most this much memory (address space): /dev/zero read whole would pass it.
CHILD_MEMORY = 6 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def opened(path) -> str:
    """What opening a session on ``path`` says, in a child interpreter."""
    result = subprocess.run(
        [sys.executable, "-c", OPEN, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_link_to_dev_zero(tmp_path):
    link = tmp_path / "model.onnx"
    link.symlink_to("/dev/zero")
    assert "not a regular file but a character device" in opened(link)


def test_a_fifo(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    assert "not a regular file but a FIFO" in opened(fifo)


def test_a_directory(tmp_path):
    assert "not a regular file but a directory" in opened(tmp_path)


def test_a_file_over_protobufs_limit(tmp_path):
    large = tmp_path / "model.onnx"
    with open(large, "wb") as file:
        file.truncate(2**31)  # sparse: nothing written
    assert "more than protobuf's limit" in opened(large)


def test_a_model_with_external_data_still_loads(tmp_path):
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "model.onnx"
    onnx.save(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0
    )
    assert (tmp_path / "w.bin").is_file()
    import polyc.onnx

    (y,) = polyc.onnx.InferenceSession(path).run(None, {"x": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(y, weights + 1)
