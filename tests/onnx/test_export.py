"""``InferenceSession.export``: models as C projects, built with make and run without Python.

Each model is exported, built by ``make`` with a ``PATH`` that holds only the C tool chain (no
Python), run on ``.npy`` inputs by the demo, and its ``.npy`` outputs compared with
onnxruntime's at the backend tests' tolerance.  One model is exported for ``neon``, built with
``aarch64-linux-gnu-gcc -static`` and run under ``qemu-aarch64`` (skipped where they are
absent).  A C program runs two instances of one model, in turn and in two threads at once.
Damaged, truncated and foreign weight files, wrong inputs, data-dependent models and bad
arguments give clear errors.  The builds use -O2 to stay fast.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyc  # noqa: E402
import polyc.onnx as ponnx  # noqa: E402
from polyc.target import TARGETS  # noqa: E402

GCC = shutil.which("gcc")
MAKE = shutil.which("make")
AARCH64_CC = shutil.which(TARGETS["neon"].cc)
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
needs_gcc = pytest.mark.skipif(GCC is None or MAKE is None, reason="gcc or make absent")
needs_qemu = pytest.mark.skipif(
    AARCH64_CC is None or QEMU is None or MAKE is None,
    reason="aarch64 cross compiler or qemu-aarch64 absent (Debian: gcc-aarch64-linux-gnu, qemu-user)",
)
RTOL, ATOL = 1e-3, 1e-5


# ----------------------------------------------------------------------------- models
def _model(nodes, inputs, outputs, weights, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "exported", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in weights.items()]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def cnn() -> onnx.ModelProto:
    """Conv + Relu, MaxPool, a second Conv, a Concat of the two branches, Flatten, Gemm, Softmax."""
    rng = np.random.default_rng(1)
    weights = {
        "W1": (rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32),
        "B1": rng.standard_normal(6).astype(np.float32),
        "W2": (rng.standard_normal((4, 6, 1, 1)) * 0.3).astype(np.float32),
        "Wf": (rng.standard_normal((7, 10 * 4 * 4)) * 0.1).astype(np.float32),
        "Bf": rng.standard_normal(7).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["p1", "W2"], ["c2"], name="conv2"),
        helper.make_node("Concat", ["p1", "c2"], ["cat"], axis=1, name="concat"),
        helper.make_node("Flatten", ["cat"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "Wf", "Bf"], ["g"], transB=1, name="fc"),
        helper.make_node("Softmax", ["g"], ["Y"], axis=-1, name="softmax"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 7])],
        weights,
    )


def transformer(tokens: int = 6, hidden: int = 16) -> onnx.ModelProto:
    """One attention head and a feed-forward layer: MatMul, Softmax, LayerNormalization, residuals."""
    rng = np.random.default_rng(2)
    weights = {
        name: (rng.standard_normal(shape) * 0.3).astype(np.float32)
        for name, shape in {
            "Wq": (hidden, hidden),
            "Wk": (hidden, hidden),
            "Wv": (hidden, hidden),
            "W1": (hidden, 2 * hidden),
            "W2": (2 * hidden, hidden),
            "gamma": (hidden,),
            "beta": (hidden,),
        }.items()
    }
    weights["scale"] = np.array(hidden**-0.5, np.float32)
    nodes = [
        helper.make_node("MatMul", ["X", "Wq"], ["q"], name="q"),
        helper.make_node("MatMul", ["X", "Wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["X", "Wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scaled"),
        helper.make_node("Softmax", ["ss"], ["a"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["a", "v"], ["o"], name="attend"),
        helper.make_node("Add", ["X", "o"], ["h"], name="residual1"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1, name="norm"),
        helper.make_node("MatMul", ["n", "W1"], ["u"], name="up"),
        helper.make_node("Relu", ["u"], ["ur"], name="relu"),
        helper.make_node("MatMul", ["ur", "W2"], ["d"], name="down"),
        helper.make_node("Add", ["n", "d"], ["Y"], name="residual2"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", tokens, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", tokens, hidden])],
        weights,
    )


def several_outputs() -> onnx.ModelProto:
    """Two inputs; outputs that are a kernel's, a reshape of one, an input passed through, a
    constant and one value twice (copies at the end of the run)."""
    rng = np.random.default_rng(3)
    weights = {"C": rng.standard_normal((2, 3)).astype(np.float32)}
    nodes = [
        helper.make_node("Add", ["A", "B"], ["s"], name="add"),
        helper.make_node("Tanh", ["s"], ["t"], name="tanh"),
        helper.make_node("Reshape", ["t", "shape"], ["flat"], name="reshape"),
        helper.make_node("Identity", ["A"], ["same"], name="identity"),
        helper.make_node("Identity", ["C"], ["constant"], name="constant"),
        helper.make_node("Identity", ["t"], ["again"], name="again"),
    ]
    weights["shape"] = np.array([-1], np.int64)
    return _model(
        nodes,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("A", "B")],
        [
            helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("flat", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("same", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("constant", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("again", TensorProto.FLOAT, [2, 3]),
        ],
        weights,
    )


def half_and_int8() -> onnx.ModelProto:
    """A float16 product with bias and Relu, and an int8 input cast and scaled (two element types)."""
    rng = np.random.default_rng(4)
    weights = {
        "W": (rng.standard_normal((8, 5)) * 0.3).astype(np.float16),
        "b": rng.standard_normal(5).astype(np.float16),
        "q_scale": np.array(0.05, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["H", "W"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b"], ["mb"], name="bias"),
        helper.make_node("Relu", ["mb"], ["Y"], name="relu"),
        helper.make_node("Cast", ["Q"], ["qf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["qf", "q_scale"], ["Z"], name="dequantize"),
    ]
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("H", TensorProto.FLOAT16, [3, 8]),
            helper.make_tensor_value_info("Q", TensorProto.INT8, [4, 5]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [3, 5]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [4, 5]),
        ],
        weights,
    )


def feeds_for(model: onnx.ModelProto, shapes: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        shape = shapes[value.name]
        if dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[value.name] = rng.integers(-100, 100, shape).astype(dtype)
    return feeds


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


# ----------------------------------------------------------------------------- building
def tool_chain_path(tmp_path: Path, *programs: str) -> str:
    """A PATH of one directory holding links to ``programs`` (and the assembler and linker):
    a C tool chain and make, no Python."""
    directory = tmp_path / "toolchain"
    directory.mkdir(exist_ok=True)
    for program in ("make", "as", "ld", *programs):
        found = shutil.which(program)
        if found is not None and not (directory / program).exists():
            (directory / program).symlink_to(found)
    path = str(directory)
    assert shutil.which("python", path=path) is None and shutil.which("python3", path=path) is None
    return path


def build(directory: Path, path: str, *make_arguments: str) -> None:
    environment = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "LC_ALL": "C"}
    result = subprocess.run(
        ["make", "-j2", *make_arguments], cwd=directory, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def fast_flags(target: str) -> str:
    """The target's flags with -O2 instead of -O3 (faster builds), as CFLAGS for make."""
    from polyc.target import LANGUAGE_FLAGS, get_target

    flags = ["-O2" if f == "-O3" else f for f in get_target(target).flags]
    return "CFLAGS=" + " ".join([*flags, *LANGUAGE_FLAGS])


def run_demo(directory: Path, feeds: dict, *prefix: str, environment=None) -> subprocess.CompletedProcess:
    paths = []
    for name, array in feeds.items():
        np.save(directory / f"in_{name}.npy", array)
        paths.append(f"in_{name}.npy")
    out = directory / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(
        [*prefix, "./model_demo", "-o", "out", *paths],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", **(environment or {})},
    )


def assert_outputs_match(directory: Path, expected: dict[str, np.ndarray]) -> None:
    for name, want in expected.items():
        got = np.load(directory / "out" / f"{name}.npy")
        assert got.dtype == want.dtype and got.shape == want.shape, name
        rtol, atol = (1e-2, 1e-3) if want.dtype == np.float16 else (RTOL, ATOL)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=name)


MODELS = {
    "cnn": (cnn, {"X": (2, 3, 8, 8)}),
    "transformer": (transformer, {"X": (2, 6, 16)}),
    "several_outputs": (several_outputs, {"A": (2, 3), "B": (2, 3)}),
    "half_and_int8": (half_and_int8, {"H": (3, 8), "Q": (4, 5)}),
}


# ----------------------------------------------------------------------------- host
@needs_gcc
@pytest.mark.parametrize("name", list(MODELS))
def test_an_exported_model_built_by_make_without_python_matches_onnxruntime(name, tmp_path):
    make_model, shapes = MODELS[name]
    model = make_model()
    exported = ponnx.InferenceSession(model).export(tmp_path, shapes=shapes)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.c", "model.h", "model.bin", "main.c", "Makefile", "CMakeLists.txt", "polyc_pool.c"} <= files
    assert {f"model_k{n}.c" for n in range(len(exported.kernels))} <= files
    build(tmp_path, tool_chain_path(tmp_path, "gcc"), fast_flags("host"))
    feeds = feeds_for(model, shapes)
    result = run_demo(tmp_path, feeds)
    assert result.returncode == 0, result.stderr
    assert_outputs_match(tmp_path, onnxruntime_outputs(model, feeds))


@needs_gcc
def test_every_kernel_has_a_symbol_of_its_own_and_the_arena_is_one_block(tmp_path):
    model = transformer()
    exported = ponnx.InferenceSession(model).export(tmp_path, shapes={"X": (1, 6, 16)}, name="block")
    names = [k.function_name for k in exported.kernels]
    assert len(set(names)) == len(names) == len(exported.kernels) and all(n.startswith("polyc_block_k") for n in names)
    for number, kernel in enumerate(exported.kernels):
        obj = tmp_path / f"k{number}.o"
        subprocess.run(
            ["gcc", "-O1", "-std=gnu11", "-fopenmp", "-c", f"block_k{number}.c", "-o", obj], cwd=tmp_path, check=True
        )
        defined = subprocess.run(["nm", "-g", "--defined-only", obj], capture_output=True, text=True).stdout.split()
        assert [s for s in defined if not s.isalnum() or s.startswith("polyc")] == [kernel.function_name]
    source = (tmp_path / "block.c").read_text()
    assert "malloc" not in source.split("the call sequence")[1]  # a run allocates nothing
    assert f"#define BLOCK_ARENA_BYTES {exported.arena_bytes}" in (tmp_path / "block.h").read_text()


# ----------------------------------------------------------------------------- neon
@needs_qemu
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_a_model_exported_for_neon_runs_under_qemu_and_matches_onnxruntime(tmp_path, name):
    make_model, shapes = MODELS[name]
    model = make_model()
    exported = ponnx.InferenceSession(model).export(tmp_path, target="neon", shapes=shapes)
    assert exported.target.name == "neon" and "CC = aarch64-linux-gnu-gcc" in (tmp_path / "Makefile").read_text()
    build(tmp_path, tool_chain_path(tmp_path, TARGETS["neon"].cc), fast_flags("neon"), "LDFLAGS=-static")
    feeds = feeds_for(model, shapes)
    result = run_demo(tmp_path, feeds, QEMU, environment={"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr
    assert_outputs_match(tmp_path, onnxruntime_outputs(model, feeds))


# ----------------------------------------------------------------------------- two instances
TWO_INSTANCES = r"""
#include "model.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_IN 2 * 6 * 16
typedef struct { model_t *model; const float *x; float *y; int status; } job_t;

static void *work(void *argument)
{
    job_t *job = (job_t *)argument;
    for (int r = 0; r < 20 && job->status == 0; r++) {
        const void *inputs[1] = {job->x};
        void *outputs[1] = {job->y};
        job->status = model_run(job->model, inputs, outputs);
    }
    return NULL;
}

int main(void)
{
    static float x1[N_IN], x2[N_IN], y1[N_IN], y2[N_IN], z1[N_IN], z2[N_IN];
    for (int k = 0; k < N_IN; k++) {
        x1[k] = (float)((k * 37) % 101) / 50.0f - 1.0f;
        x2[k] = (float)((k * 53) % 97) / 40.0f - 1.2f;
    }
    model_t *a = model_create("model.bin"), *b = model_create("model.bin");
    if (model_error(a) || model_error(b)) {
        printf("create: %s %s\n", model_error_message(a), model_error_message(b));
        return 1;
    }
    /* each alone first, then in turn, then in two threads at once: the same results */
    const void *in1[1] = {x1}, *in2[1] = {x2};
    void *out1[1] = {y1}, *out2[1] = {y2};
    if (model_run(a, in1, out1) || model_run(b, in2, out2))
        return 2;
    job_t jobs[2] = {{a, x1, z1, 0}, {b, x2, z2, 0}};
    work(&jobs[0]);
    work(&jobs[1]);
    if (memcmp(y1, z1, sizeof y1) || memcmp(y2, z2, sizeof y2))
        return 3;
    memset(z1, 0, sizeof z1);
    memset(z2, 0, sizeof z2);
    pthread_t threads[2];
    model_set_threads(a, 1);
    model_set_threads(b, 2);
    for (int t = 0; t < 2; t++)
        pthread_create(&threads[t], NULL, work, &jobs[t]);
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL);
    if (jobs[0].status || jobs[1].status)
        return 4;
    if (memcmp(y1, z1, sizeof y1) || memcmp(y2, z2, sizeof y2))
        return 5;
    if (memcmp(y1, y2, sizeof y1) == 0)
        return 6;  /* different inputs, different outputs */
    model_destroy(a);
    model_destroy(b);
    FILE *file = fopen("y1.bin", "wb");
    fwrite(y1, sizeof y1, 1, file);
    fclose(file);
    puts("ok");
    return 0;
}
"""


@needs_gcc
def test_two_instances_in_one_process_give_the_same_results_in_turn_and_in_threads(tmp_path):
    model = transformer()
    ponnx.InferenceSession(model).export(tmp_path, shapes={"X": (2, 6, 16)})
    (tmp_path / "two.c").write_text(TWO_INSTANCES)
    kernels = sorted(str(p.name) for p in tmp_path.glob("model_k*.c"))
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-std=gnu11",
            "-fopenmp",
            "-march=native",
            "-o",
            "two",
            "two.c",
            "model.c",
            *kernels,
            "-lm",
            "-lpthread",
        ],
        cwd=tmp_path,
        check=True,
    )
    result = subprocess.run(["./two"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (result.returncode, result.stdout)
    x = np.array([((k * 37) % 101) / 50.0 - 1.0 for k in range(2 * 6 * 16)], np.float32).reshape(2, 6, 16)
    expected = onnxruntime_outputs(model, {"X": x})["Y"]
    got = np.fromfile(tmp_path / "y1.bin", np.float32).reshape(2, 6, 16)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------- errors
@pytest.fixture(scope="module")
def built_cnn(tmp_path_factory):
    """The cnn exported and built for the host, once for the error tests."""
    directory = tmp_path_factory.mktemp("built_cnn")
    ponnx.InferenceSession(cnn()).export(directory, shapes={"X": (1, 3, 8, 8)})
    build(directory, tool_chain_path(directory, "gcc"), fast_flags("host"))
    return directory


@needs_gcc
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:-5], "truncated"),
        (lambda data: data + b"\0", "bytes after its weights"),
        (lambda data: data[:100] + bytes([data[100] ^ 1]) + data[101:], "damaged"),
        (lambda data: b"GARBAGE!" + data[8:], "not a polyc weights file"),
        (lambda data: data[:32] + bytes(8) + data[40:], "another model"),
        (lambda data: b"", "not a polyc weights file"),
    ],
)
def test_damaged_truncated_and_foreign_weights_are_refused_with_a_message(built_cnn, damage, message):
    good = (built_cnn / "model.bin").read_bytes()
    bad = built_cnn / "bad.bin"
    bad.write_bytes(damage(good))
    np.save(built_cnn / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    result = subprocess.run(["./model_demo", "-w", "bad.bin", "x.npy"], cwd=built_cnn, capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr and "bad.bin" in result.stderr, result.stderr


@needs_gcc
def test_the_weights_of_another_export_are_refused(built_cnn, tmp_path):
    ponnx.InferenceSession(transformer()).export(tmp_path, shapes={"X": (1, 6, 16)})
    np.save(built_cnn / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    other = tmp_path / "model.bin"
    result = subprocess.run(["./model_demo", "-w", other, "x.npy"], cwd=built_cnn, capture_output=True, text=True)
    assert result.returncode == 1 and "another model" in result.stderr
    missing = subprocess.run(
        ["./model_demo", "-w", "nowhere.bin", "x.npy"], cwd=built_cnn, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "cannot open the weights file nowhere.bin" in missing.stderr


@needs_gcc
@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((1, 3, 8, 7), np.float32), "must have shape (1, 3, 8, 8)"),
        (np.zeros((1, 3, 8, 8), np.float64), "must have element type float32"),
        (np.asfortranarray(np.zeros((1, 3, 8, 8), np.float32)), "C order"),
    ],
)
def test_the_demo_refuses_inputs_of_another_shape_type_or_order(built_cnn, array, message):
    np.save(built_cnn / "wrong.npy", array)
    result = subprocess.run(["./model_demo", "wrong.npy"], cwd=built_cnn, capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr, result.stderr


@needs_gcc
def test_the_cmake_project_builds(tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake absent")
    model = several_outputs()
    shapes = {"A": (2, 3), "B": (2, 3)}
    ponnx.InferenceSession(model).export(tmp_path / "src", shapes=shapes)
    build_dir = tmp_path / "build"
    subprocess.run(
        ["cmake", "-S", tmp_path / "src", "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"],
        check=True,
        capture_output=True,
    )
    subprocess.run(["cmake", "--build", build_dir, "-j2"], check=True, capture_output=True)
    feeds = feeds_for(model, shapes)
    for name, array in feeds.items():
        np.save(tmp_path / f"{name}.npy", array)
    (tmp_path / "out").mkdir()
    result = subprocess.run(
        [
            build_dir / "model_demo",
            "-w",
            tmp_path / "src" / "model.bin",
            "-o",
            tmp_path / "out",
            tmp_path / "A.npy",
            tmp_path / "B.npy",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert_outputs_match(tmp_path, onnxruntime_outputs(model, feeds))


def test_data_dependent_models_are_refused_naming_the_operator(tmp_path):
    nodes = [
        helper.make_node("NonZero", ["X"], ["nz"], name="find"),
        helper.make_node("Transpose", ["nz"], ["Y"], name="t"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, None)],
        {},
    )
    with pytest.raises(polyc.UnsupportedError, match="planned in stages") as error:
        ponnx.InferenceSession(model).export(tmp_path)
    assert "NonZero" in str(error.value) or "find" in str(error.value)
    assert not (tmp_path / "model.c").exists()


def test_inputs_that_give_shapes_are_refused(tmp_path):
    nodes = [helper.make_node("Reshape", ["X", "S"], ["Y"], name="reshape")]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("S", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        {},
    )
    with pytest.raises(polyc.UnsupportedError, match="'S'|S give"):
        ponnx.InferenceSession(model).export(tmp_path)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(target="riscv"), polyc.PolycError, "unknown target 'riscv'"),
        (dict(name="my model"), polyc.PolycError, "C identifier"),
        (dict(shapes={"Z": (1, 3, 8, 8)}), polyc.SignatureError, "names no input"),
        (dict(shapes={"X": (1, 3, 8)}), polyc.SignatureError, "rank"),
        (dict(shapes={"X": (1, 4, 8, 8)}), polyc.SignatureError, "dimension 1 is 3"),
        (dict(shapes={"X": (1, 3, -8, 8)}), polyc.PolycError, "integers >= 0"),
        (dict(shapes=[1, 3, 8, 8]), polyc.PolycError, "dict"),
        (dict(), polyc.PolycError, "pass shapes="),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, arguments, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        ponnx.InferenceSession(cnn()).export(tmp_path, **arguments)


@needs_gcc
def test_the_command_line_exports_a_model(tmp_path):
    from polyc.cli import main

    path = tmp_path / "model.onnx"
    onnx.save(several_outputs(), path)
    assert main(["onnx", "export", str(path), "--target", "generic", "-o", str(tmp_path / "out"), "--name", "net"]) == 0
    assert {"net.c", "net.h", "net.bin", "Makefile"} <= {p.name for p in (tmp_path / "out").iterdir()}
    assert "CFLAGS = -O3 -std=gnu11" in (tmp_path / "out" / "Makefile").read_text()
    assert main(["onnx", "export", str(path), "--target", "sparc", "-o", str(tmp_path / "x")]) != 0


# ----------------------------------------------------------------------------- saved sessions
LOAD_IN_A_NEW_PROCESS = """
import sys, time
import numpy as np
import polyc.onnx
started = time.perf_counter()
session = polyc.onnx.InferenceSession(sys.argv[1])
loaded = time.perf_counter() - started
(y,) = session.run(None, {"X": np.load(sys.argv[2])})
np.save(sys.argv[3], y)
print(loaded)
"""


@pytest.fixture(scope="module")
def saved_cnn(tmp_path_factory):
    """The cnn saved for (2, 3, 8, 8), with an input and the session's output."""
    directory = tmp_path_factory.mktemp("saved_cnn")
    session = ponnx.InferenceSession(cnn())
    x = feeds_for(cnn(), {"X": (2, 3, 8, 8)})["X"]
    (y,) = session.run(None, {"X": x})
    session.save(directory / "cnn.polyc", shapes={"X": (2, 3, 8, 8)})
    np.save(directory / "x.npy", x)
    return directory, x, y


def _rewritten(data: bytes, change) -> bytes:
    """A saved session whose manifest ``change`` edits, its digest made again (a file that is
    whole, but made elsewhere)."""
    import hashlib
    import json

    length = int.from_bytes(data[16:24], "little")
    manifest = json.loads(data[56 : 56 + length])
    change(manifest)
    text = json.dumps(manifest).encode()
    body = text + data[56 + length :]
    return data[:16] + len(text).to_bytes(8, "little") + hashlib.sha256(body).digest() + body


@needs_gcc
def test_a_saved_session_loads_in_a_new_process_without_a_c_compiler(saved_cnn, tmp_path):
    import sys

    directory, x, y = saved_cnn
    (tmp_path / "load.py").write_text(LOAD_IN_A_NEW_PROCESS)
    environment = {k: v for k, v in os.environ.items() if k not in ("CC", "POLYC_CC")}
    environment.update(PATH=str(tmp_path / "empty"), PYTHONPATH=str(Path(polyc.__file__).parent.parent))
    result = subprocess.run(
        [sys.executable, tmp_path / "load.py", directory / "cnn.polyc", directory / "x.npy", tmp_path / "y.npy"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), y)
    assert float(result.stdout.split()[-1]) < 0.2  # seconds to load (numbers: the export guide)


@needs_gcc
def test_a_saved_session_checks_its_feeds(saved_cnn):
    directory, x, y = saved_cnn
    session = ponnx.InferenceSession(directory / "cnn.polyc")
    assert [(i.name, i.shape, i.type) for i in session.get_inputs()] == [("X", [2, 3, 8, 8], "tensor(float)")]
    np.testing.assert_array_equal(session.run(["Y"], {"X": x})[0], y)
    with pytest.raises(polyc.SignatureError, match="saved for"):
        session.run(None, {"X": x[:1]})
    with pytest.raises(polyc.SignatureError, match="data type"):
        session.run(None, {"X": x.astype(np.float64)})
    with pytest.raises(polyc.SignatureError, match="missing: 'X'"):
        session.run(None, {})
    with pytest.raises(polyc.SignatureError, match="Invalid output"):
        session.run(["Z"], {"X": x})
    with pytest.raises(polyc.PolycError, match="compiled already"):
        ponnx.InferenceSession(directory / "cnn.polyc", graph_fusion=False)


@needs_gcc
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[: len(data) // 2], "truncated"),
        (lambda data: data[:56] + data[56:], "fine"),
        (lambda data: data[:-10] + bytes([data[-10] ^ 0x10]) + data[-9:], "damaged"),
        (lambda data: data[:9] + b"\x07" + data[10:], "format"),
        (
            lambda data: _rewritten(data, lambda m: m.update(machine="x86_64 0000000000000000", processor="Other CPU")),
            "another machine",
        ),
        (lambda data: _rewritten(data, lambda m: m.update(polyc="0.0.1")), "saved by polyc 0.0.1"),
        (lambda data: _rewritten(data, lambda m: m.update(library_bytes=1)), "do not add up"),
    ],
)
def test_damaged_truncated_and_foreign_saved_sessions_are_refused(saved_cnn, tmp_path, damage, message):
    directory, x, y = saved_cnn
    path = tmp_path / "bad.polyc"
    path.write_bytes(damage((directory / "cnn.polyc").read_bytes()))
    if message == "fine":  # (the test's own check: an unchanged file loads)
        np.testing.assert_array_equal(ponnx.InferenceSession(path).run(None, {"X": x})[0], y)
        return
    with pytest.raises(polyc.PolycError, match=message) as error:
        ponnx.InferenceSession(path)
    assert "bad.polyc" in str(error.value)


@needs_qemu
def test_a_quantized_model_exported_for_neon_dotprod_uses_sdot_and_gives_onnxruntimes_bits(tmp_path):
    """A QDQ network quantized by onnxruntime (per-channel 7-bit weights: onnxruntime's sums are
    exact on every processor) exported for Armv8.2-A: the integer products run on ``sdot`` under
    qemu, and the outputs are onnxruntime's, bit for bit."""
    from tests.onnx.test_qdq import SHAPE, quantized

    model = quantized(tmp_path, per_channel=True, reduce_range=True)
    directory = tmp_path / "export"
    exported = ponnx.InferenceSession(model).export(directory, target="neon-dotprod", shapes={"x": SHAPE})
    assert exported.target.name == "neon-dotprod"
    build(directory, tool_chain_path(directory, TARGETS["neon-dotprod"].cc), "LDFLAGS=-static")
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is not None:
        disassembly = subprocess.run([objdump, "-d", directory / "model_demo"], capture_output=True, text=True).stdout
        assert re.search(r"\bsdot\b", disassembly), "no sdot in the integer products"
    feeds = feeds_for(model, {"x": SHAPE}, seed=5)
    result = run_demo(directory, feeds, QEMU, "-cpu", "max", environment={"OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, result.stderr
    (expected,) = onnxruntime_outputs(model, feeds).values()
    np.testing.assert_array_equal(np.load(directory / "out" / "y.npy"), expected)
