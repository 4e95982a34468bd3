"""CompilerOptions defaults and command lines, and compile_shared_library's results and errors."""

from __future__ import annotations

import platform
import shutil

import pytest

from polyc.errors import CompilationError
from polyc.runtime import CompilerOptions, compile_shared_library


def test_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("POLYC_CC", "my-cc")
    monkeypatch.setenv("CC", "other-cc")
    monkeypatch.setenv("POLYC_CFLAGS", "-O1 -g")
    options = CompilerOptions()
    assert options.cc == "my-cc"
    assert options.flags == ("-O1", "-g", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math")

    monkeypatch.delenv("POLYC_CC")
    monkeypatch.delenv("POLYC_CFLAGS")
    options = CompilerOptions(cc=None, flags=None)  # None asks for the defaults too
    assert options.cc == "other-cc"
    assert options.flags == ("-O3", "-march=native", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math")
    assert CompilerOptions(cc="gcc", flags=["-O1"]).flags == ("-O1",)


def test_default_command_line(monkeypatch):
    monkeypatch.delenv("POLYC_CFLAGS", raising=False)  # the defaults, whatever the caller's environment
    options = CompilerOptions(cc="gcc", extra_flags=("-fsanitize=address,undefined",))
    assert options.command("kernel.c", "kernel.so") == [
        "gcc",
        "-fPIC",
        "-shared",
        "-O3",
        "-march=native",
        "-std=gnu11",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-fopenmp",
        "-fsanitize=address,undefined",
        "-o",
        "kernel.so",
        "kernel.c",
        "-lm",
    ]
    assert "-fopenmp" not in CompilerOptions(cc="gcc", openmp=False).command("k.c", "k.so")


def test_compiler_may_carry_a_launcher():
    options = CompilerOptions(cc="ccache gcc", flags=("-O2",), openmp=False)
    assert options.command("k.c", "k.so")[:3] == ["ccache", "gcc", "-fPIC"]


def test_fingerprint_is_stable_and_sees_flags():
    options = CompilerOptions(cc="gcc", flags=("-O2",))
    assert options.fingerprint() == CompilerOptions(cc="gcc", flags=("-O2",)).fingerprint()
    assert options.fingerprint() != CompilerOptions(cc="gcc", flags=("-O3",)).fingerprint()
    assert options.fingerprint() != CompilerOptions(cc="gcc", flags=("-O2",), openmp=False).fingerprint()
    assert "gcc" in options.fingerprint().splitlines()[1].lower()  # the --version line


def test_builds_a_callable_library(tmp_path, axpy_source, check_axpy):
    library = tmp_path / "out" / "axpy.so"
    compile_shared_library(axpy_source, library, CompilerOptions())
    assert library.is_file()
    assert (tmp_path / "out" / "axpy.c").read_text() == axpy_source
    check_axpy(library)


def test_compile_error_quotes_the_compiler(tmp_path):
    source = "void broken(float *y) { y[0] = undeclared_variable; }\n"
    with pytest.raises(CompilationError) as caught:
        compile_shared_library(source, tmp_path / "broken.so", CompilerOptions())
    message = str(caught.value)
    assert "undeclared_variable" in message  # the compiler's own diagnostic
    assert "-o broken.so broken.c" in message  # the command that failed
    assert not (tmp_path / "broken.so").exists()


def test_long_diagnostics_are_truncated(tmp_path):
    source = "".join(f"void f{i}(void) {{ missing_{i}; }}\n" for i in range(300))
    with pytest.raises(CompilationError) as caught:
        compile_shared_library(source, tmp_path / "many.so", CompilerOptions())
    message = str(caught.value)
    assert "missing_0" in message and "missing_299" not in message
    assert "more lines)" in message
    assert len(message) < 12_000


def test_missing_compiler(tmp_path, axpy_source):
    with pytest.raises(CompilationError, match="/nonexistent/cc.*not found"):
        compile_shared_library(axpy_source, tmp_path / "axpy.so", CompilerOptions(cc="/nonexistent/cc"))


def test_no_compiler_at_all(tmp_path, axpy_source, monkeypatch):
    monkeypatch.delenv("POLYC_CC", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    options = CompilerOptions()
    assert options.cc is None
    with pytest.raises(CompilationError, match="no C compiler found"):
        compile_shared_library(axpy_source, tmp_path / "axpy.so", options)


def test_timeout(tmp_path, axpy_source):
    with pytest.raises(CompilationError, match="longer than"):
        compile_shared_library(axpy_source, tmp_path / "axpy.so", CompilerOptions(), timeout=1e-4)


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("gcc") is None,
    reason="x86-64 instruction-set flags, asked of gcc",
)
def test_vector_bits_follow_the_build_flags_not_the_processor(monkeypatch):
    # What the preprocessor defines decides which micro-kernels a build holds, so layouts made
    # for them follow the flags: AVX2 code on an AVX-512 machine computes in 256-bit vectors.
    from polyc.runtime.compiler import vector_bits
    from polyc.target import host

    monkeypatch.delenv("POLYC_CFLAGS", raising=False)
    assert vector_bits(CompilerOptions(cc="gcc", flags=("-O2", "-mavx2", "-mfma"))) == 256
    assert vector_bits(CompilerOptions(cc="gcc", flags=("-O2", "-mavx512f", "-mfma"))) == 512
    assert vector_bits(CompilerOptions(cc="gcc", flags=("-O2", "-mavx2"))) == 0  # the AVX2 kernels need FMA too
    assert vector_bits(CompilerOptions(cc="gcc", flags=("-O2",))) == 0
    assert vector_bits(CompilerOptions(cc="gcc", flags=("-O3", "-march=native"))) == host().vector_bits
    monkeypatch.setenv("POLYC_CFLAGS", "-O3 -mavx2 -mfma")
    assert vector_bits() == 256
    # A compiler that cannot be asked: this machine's own width, not an error while planning.
    assert vector_bits(CompilerOptions(cc="no-such-compiler-polyc", flags=("-O2",))) == host().vector_bits
