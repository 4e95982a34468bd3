"""Watching a model's compile (issue 83): the log names every kernel built and, the next time,
says each comes from the cache; a progress bar over the kernels shows in a terminal and not in
a pipe (nor with ``POLYC_PROGRESS=0`` or ``progress=False``); and the cache's size limit holds
while a model runs, its results still right."""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import pty
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402
from polyc.driver import build_ahead  # noqa: E402
from polyc.runtime import cache_space  # noqa: E402
from polyc.runtime.cache import in_use_here  # noqa: E402
from polyc.runtime.environment import environment_problems  # noqa: E402

#: The progress bar is tqdm's, an optional dependency (the progress extra).
needs_tqdm = pytest.mark.skipif(importlib.util.find_spec("tqdm") is None, reason="tqdm is not installed")
REPOSITORY = Path(__file__).resolve().parents[2]
#: Shapes no other test uses, so that no kernel of this model is compiled in the process already.
CHANNELS, IMAGE, CLASSES = 5, 7, 6


def small_model(channels: int = CHANNELS) -> onnx.ModelProto:
    """Conv + Relu, Flatten, MatMul + Add, Softmax: four kernels."""
    rng = np.random.default_rng(83)
    weights = {
        "W": rng.standard_normal((channels, 3, 3, 3)).astype(np.float32) * 0.3,
        "Wf": rng.standard_normal((channels * IMAGE * IMAGE, CLASSES)).astype(np.float32) * 0.1,
        "Bf": rng.standard_normal(CLASSES).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "Wf"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "Bf"], ["a"], name="bias"),
        helper.make_node("Softmax", ["a"], ["Y"], axis=-1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "watched",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, IMAGE, IMAGE])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds() -> dict:
    return {"X": np.random.default_rng(1).standard_normal((2, 3, IMAGE, IMAGE)).astype(np.float32)}


def expected(model: onnx.ModelProto) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds())[0]


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "kernel-cache"
    monkeypatch.setenv("POLYC_CACHE_DIR", str(directory))
    return directory


# ----------------------------------------------------------------------------- the log
def test_the_log_names_every_kernel_built_then_each_from_the_cache(kernel_cache, caplog):
    model = small_model(channels=CHANNELS + 2)
    caplog.set_level(logging.DEBUG, logger="polyc")
    session = ponnx.InferenceSession(model, progress=False)
    (result,) = session.run(None, feeds())
    np.testing.assert_allclose(result, expected(model), rtol=1e-4, atol=1e-5)
    plan = session.plans()[-1]
    groups = [g for g in plan.groups]
    assert len(groups) >= 3
    built = [r.getMessage() for r in caplog.records if r.name == "polyc.runtime.cache" and r.levelno == logging.INFO]
    for group in groups:
        assert any(message.startswith(f"built {group.name} (") and " s (" in message for message in built), group.name
    infos = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "planning model watched for input shapes X=(2, 3, 7, 7)" in infos
    assert f"as {len(groups)} kernel(s)" in infos
    assert "first run (compiling what the cache lacks) in" in infos
    assert f"{len(groups)} kernel(s) in" in infos and f"{len(groups)} built" in infos

    caplog.clear()
    again = ponnx.InferenceSession(model, progress=False)
    np.testing.assert_array_equal(again.run(None, feeds())[0], result)
    messages = [r.getMessage() for r in caplog.records]
    assert not any(m.startswith("built group") for m in messages)
    for group in groups:
        assert any(m.startswith(f"{group.name} (") and "from cache" in m for m in messages), group.name


def test_a_new_process_takes_every_kernel_from_the_cache(kernel_cache):
    script = textwrap.dedent(
        f"""
        import logging, sys
        import numpy as np
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
        from test_watching_compile import feeds, small_model
        import polyc.onnx as ponnx
        ponnx.InferenceSession(small_model(channels=3)).run(None, feeds())
        """
    )
    outputs = [_run_python(script, pipe=True).stderr for _ in range(2)]
    assert "polyc.runtime.cache built group0 (conv, relu)" in outputs[0]
    assert "polyc.runtime.cache built group" not in outputs[1]
    assert "polyc.runtime.cache group0 (conv, relu): from cache" in outputs[1]


def test_polyc_prints_nothing_unless_logging_is_configured():
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("polyc").handlers)


# ----------------------------------------------------------------------------- the progress bar
BAR_SCRIPT = textwrap.dedent(
    f"""
    import sys
    sys.path.insert(0, {str(Path(__file__).parent)!r})
    from test_watching_compile import feeds, small_model
    import polyc.onnx as ponnx
    ponnx.InferenceSession(small_model(channels=4)).run(None, feeds())
    print("done", file=sys.stderr)
    """
)


def _run_python(script: str, pipe: bool, **environment) -> subprocess.CompletedProcess:
    """Run ``script`` with its standard error in a pipe, or in a terminal (a pty) when ``pipe``
    is False; the output is in ``.stderr`` either way."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), **environment}
    env.pop("POLYC_PROGRESS", None) if "POLYC_PROGRESS" not in environment else None
    command = [sys.executable, "-c", script]
    if pipe:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=True)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    output = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 300)
        if not ready:
            process.kill()
            break
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert process.wait(timeout=60) == 0, output.decode(errors="replace")
    return subprocess.CompletedProcess(command, 0, "", output.decode(errors="replace"))


@needs_tqdm
def test_the_progress_bar_shows_in_a_terminal(tmp_path):
    shown = _run_python(BAR_SCRIPT, pipe=False, POLYC_CACHE_DIR=str(tmp_path / "cache")).stderr
    assert "polyc: compiling the model" in shown and "4/4" in shown, shown
    assert "done" in shown


@needs_tqdm
def test_no_progress_bar_in_a_pipe(tmp_path):
    piped = _run_python(BAR_SCRIPT, pipe=True, POLYC_CACHE_DIR=str(tmp_path / "cache")).stderr
    assert "polyc: compiling" not in piped and piped.strip() == "done", piped


@needs_tqdm
def test_polyc_progress_0_turns_the_bar_off_in_a_terminal(tmp_path):
    quiet = _run_python(BAR_SCRIPT, pipe=False, POLYC_CACHE_DIR=str(tmp_path / "cache"), POLYC_PROGRESS="0").stderr
    assert "polyc: compiling" not in quiet and "done" in quiet, quiet


class _Terminal(io.StringIO):
    """Standard error as a terminal (what tqdm draws in)."""

    def isatty(self) -> bool:
        return True


def _kernels(tag: int) -> list:
    """Two kernels no other test compiles (the tag is in their text)."""
    module = polyc.define(
        f"""
        def scale{tag}(float(N) X) -> (Y) {{ Y(i) = X(i) * {tag}.5 }}
        def shift{tag}(float(N) X) -> (Y) {{ Y(i) = X(i) + {tag}.25 }}
        """
    )
    return [(module[name], {"N": 97}) for name in module.names]


@needs_tqdm
@pytest.mark.parametrize(
    ("setting", "progress", "stream", "shown"),
    [
        (None, None, _Terminal, True),
        ("0", None, _Terminal, False),
        ("off", None, _Terminal, False),
        (None, False, _Terminal, False),
        (None, None, io.StringIO, False),
        ("1", None, io.StringIO, True),
        ("auto", None, io.StringIO, False),
        ("0", True, io.StringIO, True),
    ],
)
def test_build_ahead_shows_a_bar_where_it_is_watched(kernel_cache, monkeypatch, setting, progress, stream, shown):
    if setting is None:
        monkeypatch.delenv("POLYC_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("POLYC_PROGRESS", setting)
    stderr = stream()
    monkeypatch.setattr(sys, "stderr", stderr)
    tag = abs(hash((setting, progress, stream.__name__))) % 10**6
    summary = build_ahead(_kernels(tag), progress=progress, description="polyc: building")
    assert summary.built == 2
    assert ("polyc: building" in stderr.getvalue()) is shown, stderr.getvalue()


def test_no_bar_when_everything_is_cached(kernel_cache, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    kernels = _kernels(7)
    build_ahead(kernels, progress=False)
    assert build_ahead(kernels).cached == 2
    assert sys.stderr.getvalue() == ""


def test_a_bad_polyc_progress_is_named():
    (problem,) = environment_problems({"POLYC_PROGRESS": "loud"})
    assert "POLYC_PROGRESS='loud' is neither off (0, off, no, false), on (1, on, yes, true) nor auto" in problem
    assert environment_problems({"POLYC_PROGRESS": "Auto"}) == []


def test_the_session_refuses_a_bad_progress_option():
    with pytest.raises(polyc.PolycError, match="progress must be True, False or None"):
        ponnx.InferenceSession(small_model(), progress="yes")


# ----------------------------------------------------------------------------- the limit, while a model runs
def test_the_limit_holds_while_a_model_runs(kernel_cache, monkeypatch):
    from polyc.runtime.cache import get_or_build
    from polyc.runtime.compiler import CompilerOptions

    quick = CompilerOptions(flags=("-O0",), openmp=False)
    old = {get_or_build(f"int polyc_old_{n}(void) {{ return {n}; }}\n", quick).parent for n in range(3)}
    limit = 4096
    monkeypatch.setenv("POLYC_CACHE_MAX_SIZE", str(limit))
    builds = []
    real_after_build = cache_space.after_build

    def counted(root, entry, size, in_use):
        builds.append(entry)
        return real_after_build(root, entry, size, in_use)

    monkeypatch.setattr(cache_space, "after_build", counted)
    model = small_model(channels=CHANNELS + 4)
    (result,) = ponnx.InferenceSession(model, progress=False).run(None, feeds())
    np.testing.assert_allclose(result, expected(model), rtol=1e-4, atol=1e-5)
    assert len(builds) >= 4  # every kernel of the model was built, the limit checked after each
    items = [i for i in cache_space.inventory(kernel_cache) if i.kind in cache_space.EVICTABLE]
    in_use = set(in_use_here())  # (loaded libraries, the header built with: never evicted by this process)
    assert sum(i.size for i in items if i.path not in in_use | {builds[-1]}) <= limit
    assert not {i.path for i in items} & old  # the entries used least recently went


def test_without_tqdm_there_is_no_bar(kernel_cache, monkeypatch):
    from polyc.runtime import progress

    monkeypatch.setattr(progress, "_tqdm", lambda: None)
    monkeypatch.setenv("POLYC_PROGRESS", "1")
    assert not progress.progress_wanted(None) and not progress.progress_wanted(True)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert build_ahead(_kernels(8)).built == 2
    assert sys.stderr.getvalue() == ""
