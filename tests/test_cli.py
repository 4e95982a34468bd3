"""The ``polyc`` command line: ``main([...])`` in-process, plus real ``python -m polyc`` runs.

``polyc run --check`` compares the kernel with the reference interpreter, so a check is only a
check when the kernel is compiled: runs use the default (compiled) back end, as the README's
commands do, at small sizes (each distinct def and size set costs a C compilation).  Only
``test_run_on_the_interpreter_backend`` passes ``--backend interpreter``.  ``--emit
isl/schedule/c`` print the real stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polyc
from polyc import cli
from polyc.cli import main
from polyc.lang.parser import parse

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
MATMUL = str(EXAMPLES / "matmul.tc")
CONV = str(EXAMPLES / "conv.tc")
INTERPRETER = ["--backend", "interpreter"]
MATMUL_SHAPES = ["--shape", "M=16", "--shape", "K=24", "--shape", "N=8"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` -> (exit status, stdout, stderr)."""
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path_factory, monkeypatch):
    """One kernel cache for this module's runs (each kernel built once), never the user's."""
    path = tmp_path_factory.getbasetemp() / "cli-kernel-cache"
    monkeypatch.setenv("POLYC_CACHE_DIR", str(path))
    return path


@pytest.fixture
def tc_file(tmp_path):
    """Write TC text to a file in a fresh directory and return its path."""

    def write(text: str, name: str = "kernel.tc") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


# ----------------------------------------------------------------------------- version, help
def test_version(capsys):
    status, out, _ = run_cli(capsys, "--version")
    assert status == 0
    assert out.strip() == f"polyc {polyc.__version__}" == "polyc 0.1.0"


@pytest.mark.parametrize("argv", [["--help"], ["compile", "--help"], ["run", "--help"]])
def test_help_has_usage_and_examples(capsys, argv):
    status, out, _ = run_cli(capsys, *argv)
    assert status == 0
    assert "usage: polyc" in out
    if argv != ["--help"]:
        assert "examples:" in out and "--shape" in out and "--backend" in out


def test_no_command_is_a_usage_error(capsys):
    status, _, err = run_cli(capsys)
    assert status == 2
    assert "usage:" in err


def test_bad_option_value_is_a_usage_error(capsys):
    status, _, err = run_cli(capsys, "compile", MATMUL, "--fusion", "sometimes")
    assert status == 2
    assert "--fusion" in err and "Traceback" not in err


@pytest.mark.parametrize("shape", ["M", "M=x", "M=-1", "=3"])
def test_bad_shape_syntax_is_a_usage_error(capsys, shape):
    status, _, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", "--shape", shape)
    assert status == 2
    assert "--shape" in err


# ----------------------------------------------------------------------------- compile
def test_compile_defaults_to_ranges_of_every_def(capsys):
    status, out, err = run_cli(capsys, "compile", MATMUL)
    assert status == 0, err
    module = polyc.define(Path(MATMUL).read_text(), backend="interpreter")
    assert out == module.matmul.describe() + "\n\n" + module.matmul_bias_relu.describe() + "\n"


def test_compile_emit_ranges_of_one_entry(capsys):
    status, out, _ = run_cli(capsys, "compile", CONV, "--entry", "conv2d", "--emit", "ranges")
    assert status == 0
    assert out.startswith("def conv2d(")
    assert "maxpool2x2" not in out
    assert "h in 0:H - KH + 1" in out


def test_compile_emit_ast_prints_tc_that_parses_to_the_same_tree(capsys):
    status, out, _ = run_cli(capsys, "compile", CONV, "--emit", "ast")
    assert status == 0
    assert parse(out) == parse(Path(CONV).read_text())
    assert "def conv2d(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B) -> (O) {" in out
    assert "#" not in out  # comments are not part of the tree


def test_compile_output_file(capsys, tmp_path):
    target = tmp_path / "matmul.txt"
    status, out, _ = run_cli(capsys, "compile", MATMUL, "--entry", "matmul", "--emit", "ast", "-o", str(target))
    assert status == 0
    assert out == ""
    assert (
        target.read_text() == "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n"
        "    C(m, n) +=! A(m, r_k) * B(r_k, n)\n}\n"
    )


def test_compile_unwritable_output(capsys, tmp_path):
    status, _, err = run_cli(capsys, "compile", MATMUL, "-o", str(tmp_path / "no" / "such" / "dir.txt"))
    assert status == 1
    assert err.startswith("polyc: error: ") and "cannot write" in err


def test_compile_shape_only_with_compiled_stages(capsys):
    status, _, err = run_cli(capsys, "compile", MATMUL, "--shape", "M=4")
    assert status == 2
    assert "--shape is not used with --emit ranges" in err


def test_compile_shape_must_name_a_size(capsys):
    status, _, err = run_cli(capsys, "compile", MATMUL, "--entry", "matmul", "--emit", "c", "--shape", "Z=4")
    assert status == 2
    assert "--shape names Z, not a size of matmul (sizes: K, M, N)" in err


#: What each later stage of matmul at M=16, K=24, N=8 must show: the sizes fixed, the
#: statement's domain and accesses, its schedule, the C of the gemm kernel.
STAGE_TEXT = {
    "isl": [
        "M = 16 and K = 24 and N = 8",
        "S0[m, n, r_k] : 0 <= m <= 15 and 0 <= n <= 7 and 0 <= r_k <= 23",
        "S0[m, n, r_k] -> A[m, r_k]",
    ],
    "schedule": ["domain:", "S0[m, n, r_k]"],
    "c": ["polyc gemm kernel for def 'matmul'", "sizes: M=16, K=24, N=8", "int polyc_matmul("],
}


@pytest.mark.parametrize("emit", sorted(STAGE_TEXT))
def test_compile_later_stages_print_the_kernels_stage(capsys, emit):
    status, out, err = run_cli(
        capsys, "compile", MATMUL, "--entry", "matmul", "--emit", emit, "--shape", "M=16,K=24,N=8"
    )
    assert status == 0, err
    kernel = polyc.define(Path(MATMUL).read_text()).matmul
    expected = getattr(kernel, cli.EMIT_METHODS[emit])({"M": 16, "K": 24, "N": 8})
    assert out == expected.rstrip("\n") + "\n"
    for fragment in STAGE_TEXT[emit]:
        assert fragment in out


@pytest.mark.parametrize("emit, method", [("isl", "isl_model_text"), ("schedule", "schedule_text"), ("c", "c_source")])
def test_compile_later_stages_pass_each_def_its_sizes(capsys, monkeypatch, emit, method):
    calls = []

    def stage(self, *args):
        calls.append((self.name, args))
        return f"<{emit} of {self.name}>"

    monkeypatch.setattr(polyc.Kernel, method, stage, raising=False)
    status, out, err = run_cli(capsys, "compile", MATMUL, "--emit", emit, "--shape", "M=64,K=32")
    assert status == 0, err
    assert out == f"<{emit} of matmul>\n\n<{emit} of matmul_bias_relu>\n"
    # Each def gets its own sizes; without any, it is compiled for all sizes.
    assert calls == [("matmul", ({"M": 64, "K": 32},)), ("matmul_bias_relu", ({"M": 64, "K": 32},))]
    run_cli(capsys, "compile", MATMUL, "--entry", "matmul", "--emit", emit)
    assert calls[-1] == ("matmul", (None,))


def test_compile_stage_not_available(capsys, monkeypatch):
    monkeypatch.delattr(polyc.Kernel, "isl_model_text", raising=False)
    status, _, err = run_cli(capsys, "compile", MATMUL, "--emit", "isl")
    assert status == 2
    assert err == "polyc: error: --emit isl is not available yet\n"


def test_compile_passes_options_to_define(capsys, monkeypatch):
    seen = {}
    real_define = polyc.define

    def spy(source, filename="<tc>", **options):
        seen.update(options)
        return real_define(source, filename, **options)

    monkeypatch.setattr(polyc, "define", spy)
    status, _, err = run_cli(
        capsys,
        "compile",
        MATMUL,
        "--fusion",
        "max",
        "--loop-tiles",
        "32,32,8",
        "--no-parallel",
        "--no-vectorize",
        "--unroll",
        "4",
        "--no-specialize",
        "--cc",
        "gcc",
        "--cflags",
        "-O2 -g",
        "--loop-order",
        "r_k, m",
    )
    assert status == 0, err
    assert seen == {
        "backend": "interpreter",
        "fusion": "max",
        "loop_tiles": (32, 32, 8),
        "parallel": False,
        "vectorize": False,
        "unroll": 4,
        "specialize": False,
        "cc": "gcc",
        "cflags": "-O2 -g",
        "loop_order": ("r_k", "m"),
    }


# ----------------------------------------------------------------------------- errors
def test_syntax_error_shows_location_and_caret(capsys, tc_file):
    path = tc_file("def f(float(N) X) -> (Y) {\n    Y(i) = X(i) +* 2\n}\n")
    status, out, err = run_cli(capsys, "compile", path)
    assert status == 1
    assert out == ""
    assert err.startswith(f"polyc: error: {path}:2:18: expected an expression")
    assert "Y(i) = X(i) +* 2" in err and "^" in err
    assert "Traceback" not in err


def test_semantic_error_exit_1(capsys, tc_file):
    path = tc_file("def f(float(N) X) -> (Y) {\n    Y(i) = Z(i)\n}\n")
    status, _, err = run_cli(capsys, "run", path, "--shape", "N=3")
    assert status == 1
    assert err.startswith(f"polyc: error: {path}:2:")


def test_missing_file(capsys, tmp_path):
    missing = str(tmp_path / "absent.tc")
    status, _, err = run_cli(capsys, "compile", missing)
    assert status == 1
    assert err == f"polyc: error: {missing}: no such file\n"


def test_unknown_entry(capsys):
    status, _, err = run_cli(capsys, "compile", MATMUL, "--entry", "conv")
    assert status == 2
    assert err == f"polyc: error: no def named 'conv' in {MATMUL} (defs: matmul, matmul_bias_relu)\n"


# ----------------------------------------------------------------------------- run
def built_kernels(cache: Path) -> list[str]:
    """The C sources the kernel cache holds: one per kernel polyc compiled."""
    return [path.read_text() for path in cache.rglob("kernel.c")]


def test_run_matmul_with_check(capsys, kernel_cache):
    status, out, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--check", "--repeat", "2")
    assert status == 0, err
    assert "output C: float32(16, 8)" in out
    assert "over 2 run(s)" in out
    assert "check: OK (max abs error" in out and "ops 24)" in out
    # The check compared compiled code (the default back end) with the interpreter.
    assert any("polyc gemm kernel for def 'matmul'" in c for c in built_kernels(kernel_cache))


def test_readme_conv_command_with_check(capsys, kernel_cache):
    shapes = [f"--shape={size}" for size in ("N=2", "C=8", "H=16", "W=16", "F=4", "KH=3", "KW=3")]
    status, out, err = run_cli(capsys, "run", CONV, "--entry", "conv2d", *shapes, "--check")
    assert status == 0, err
    assert "output O: float32(2, 4, 14, 14)" in out and "check: OK" in out and "ops 72)" in out
    assert any("def 'conv2d'" in c for c in built_kernels(kernel_cache))


def test_run_pooling_with_check(capsys):
    status, out, err = run_cli(capsys, "run", CONV, "--entry", "maxpool2x2", "--shape", "N=1,C=2,H=9,W=8", "--check")
    assert status == 0, err
    assert "output O: float32(1, 2, 4, 4)" in out and "check: OK" in out


def test_run_on_the_interpreter_backend(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    status, out, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--check", *INTERPRETER)
    assert status == 0, err
    assert "check: OK (max abs error 0," in out  # the interpreter against itself
    assert built_kernels(tmp_path) == []


def test_run_check_catches_a_wrong_compiled_result(capsys, monkeypatch):
    # Negative control: a compiled kernel whose result is off in one element must fail the check.
    real_call = polyc.Kernel.__call__

    def one_element_off(self, *args, **kwargs):
        result = real_call(self, *args, **kwargs)
        result.flat[-1] += np.float32(0.01)
        return result

    monkeypatch.setattr(polyc.Kernel, "__call__", one_element_off)
    status, out, _ = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--check")
    assert status == 1
    assert "check: MISMATCH C: max abs error" in out


def test_run_missing_shape_names_every_missing_size(capsys):
    status, out, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", "--shape", "K=4")
    assert status == 2
    assert out == ""
    assert err.startswith("polyc: error: matmul needs a value for M, N ")
    assert len(err.strip().splitlines()) == 1


def test_run_unknown_shape_name(capsys):
    status, _, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--shape", "Q=2")
    assert status == 2
    assert "Q" in err and "M, K, N" in err


def test_run_conflicting_shapes(capsys):
    status, _, err = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--shape", "M=3")
    assert status == 2
    assert "M twice" in err


def test_run_needs_entry_when_several_defs(capsys):
    status, _, err = run_cli(capsys, "run", MATMUL, *MATMUL_SHAPES)
    assert status == 2
    assert "--entry" in err and "matmul, matmul_bias_relu" in err


def test_run_single_def_needs_no_entry(capsys, tc_file):
    path = tc_file("def scale(float(N) X, float a) -> (Y) {\n    Y(i) = a * X(i)\n}\n")
    status, out, err = run_cli(capsys, "run", path, "--shape", "N=5", "--check")
    assert status == 0, err
    assert "output Y: float32(5,)" in out and "check: OK" in out


def test_run_scalar_size_input_takes_its_value_from_shape(capsys, tc_file):
    path = tc_file("def repeat(float(N) X, int32 R) -> (Y) {\n    Y(r, i) = X(i) where r in 0:R\n}\n")
    status, out, err = run_cli(capsys, "run", path, "--shape", "N=8,R=3", "--check")
    assert status == 0, err
    assert "output Y: float32(3, 8)" in out
    status, out, err = run_cli(capsys, "run", path, "--shape", "N=8")
    assert status == 2 and "needs a value for R" in err


def test_run_gather_indices_stay_in_bounds(capsys, tc_file):
    path = tc_file("def embed(float(E, D) LUT, int32(B, L) I) -> (O) {\n    O(b, d) +=! LUT(I(b, r_l), d)\n}\n")
    status, out, err = run_cli(capsys, "run", path, "--shape", "E=3,D=4,B=50,L=7", "--check")
    assert status == 0, err
    assert "output O: float32(50, 4)" in out and "check: OK" in out


def test_run_integer_and_boolean_outputs_compare_exactly(capsys, tc_file):
    path = tc_file("def f(int32(N) X, float(N) Y) -> (S, P) {\n    S() +=! X(r_i)\n    P(i) = Y(i) > 0\n}\n")
    status, out, err = run_cli(capsys, "run", path, "--shape", "N=10", "--check")
    assert status == 0, err
    assert "output S: int32()" in out and "output P: bool(10,)" in out and "check: OK" in out


def test_run_check_mismatch_exits_1(capsys, monkeypatch):
    real_interpret = cli.interpret

    def off_by_a_bit(definition, args, outputs=None):
        return tuple(out + np.float32(0.01) for out in real_interpret(definition, args, outputs))

    monkeypatch.setattr(cli, "interpret", off_by_a_bit)
    status, out, _ = run_cli(capsys, "run", MATMUL, "--entry", "matmul", *MATMUL_SHAPES, "--check")
    assert status == 1
    assert "check: MISMATCH" in out and "C: max abs error" in out


def test_run_without_check_is_deterministic_in_seed(capsys):
    # Nothing is checked against anything here: the interpreter spares a compilation.
    argv = ["run", MATMUL, "--entry", "matmul_bias_relu", *MATMUL_SHAPES, "--seed", "7", *INTERPRETER]
    status, out, _ = run_cli(capsys, *argv)
    assert status == 0
    assert "check:" not in out and "output O: float32(16, 8)" in out
    definition = polyc.define(Path(MATMUL).read_text(), backend="interpreter").matmul_bias_relu.definition
    sizes = {"M": 16, "K": 24, "N": 8}
    first = cli.random_inputs(definition, sizes, np.random.default_rng(7))
    second = cli.random_inputs(definition, sizes, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert [a.shape for a in first] == [(16, 24), (24, 8), (8,)]


# ----------------------------------------------------------------------------- subprocess
def _python_m_polyc(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "polyc", *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )


def test_subprocess_version():
    result = _python_m_polyc("--version")
    assert result.returncode == 0
    assert result.stdout == "polyc 0.1.0\n"


def test_subprocess_run_with_check():
    # The README's command, compiled; the kernel is the one test_run_matmul_with_check built.
    result = _python_m_polyc("run", "examples/matmul.tc", "--entry", "matmul", *MATMUL_SHAPES, "--check")
    assert result.returncode == 0, result.stderr
    assert "output C: float32(16, 8)" in result.stdout
    assert "check: OK" in result.stdout


def test_subprocess_syntax_error_has_no_traceback(tc_file):
    path = tc_file("def f(float(N) X) -> (Y) {\n    Y(i) = X(i] \n}\n")
    result = _python_m_polyc("compile", path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"polyc: error: {path}:2:15:")
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- GPU exports
@pytest.mark.parametrize("dialect, suffix, qualifier", [("cuda", ".cu", "__global__"), ("opencl", ".cl", "__kernel")])
def test_compile_exports_gpu_code_with_its_launch_configuration(capsys, tmp_path, dialect, suffix, qualifier):
    status, _, err = run_cli(
        capsys, "compile", MATMUL, "--entry", "matmul", "--target", dialect, *MATMUL_SHAPES, "-o", str(tmp_path)
    )
    assert status == 0, err
    assert qualifier in (tmp_path / f"matmul{suffix}").read_text()
    launch = json.loads((tmp_path / "matmul.launch.json").read_text())
    assert launch["launches"] == [
        {"kernel": "polyc_matmul_k0", "grid": [1, 1], "block": [8, 8]}
    ]  # 4 x 1 register tiles
    assert launch["arguments"] == ["A", "B", "C", "polyc_status_out"]


def test_compile_gpu_target_takes_the_mapping_options(capsys, tmp_path):
    status, _, err = run_cli(
        capsys,
        "compile",
        MATMUL,
        "--entry",
        "matmul",
        "--target",
        "cuda",
        *MATMUL_SHAPES,
        "--block",
        "4,2",
        "--grid",
        "1,2",
        "--device",
        "sm_90",
        "--no-private-memory",
        "-o",
        str(tmp_path),
    )
    assert status == 0, err
    launch = json.loads((tmp_path / "matmul.launch.json").read_text())
    assert launch["launches"] == [{"kernel": "polyc_matmul_k0", "grid": [1, 2], "block": [4, 2]}]
    assert "device model sm_90" in (tmp_path / "matmul.cu").read_text()


def test_compile_gpu_target_needs_every_size(capsys, tmp_path):
    status, _, err = run_cli(
        capsys, "compile", MATMUL, "--entry", "matmul", "--target", "cuda", "--shape", "M=4", "-o", str(tmp_path)
    )
    assert status == 2 and "K, N" in err and "--shape" in err
