"""Exported C (``polyc.codegen.targets``) built into stand-alone programs and run against numpy.

For each case the test exports the kernel (``NAME.c`` and ``NAME.h``), writes a small C
``main()`` that reads the inputs from binary files, calls the kernel and writes the outputs,
builds it with the target's compiler and flags, runs it, and compares the outputs with the
corpus's numpy reference (``kernels.assert_close``):

- ``neon``: cross-compiled with ``aarch64-linux-gnu-gcc -O3 -march=armv8-a+simd -fopenmp -static``
  (static, so no aarch64 sysroot is needed at run time) and run under ``qemu-aarch64`` with two
  OpenMP threads; skipped where the cross compiler or qemu is absent.
- ``avx2``, ``generic``, ``host``: built by the host compiler and run natively.

The NEON claim itself is checked on the assembly: the vector loops of matmul become
``fmla v.4s`` multiply-adds on quad-word loads.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kernels
import polyc
from polyc.codegen.c_expr import c_type
from polyc.codegen.targets import TARGETS, export_c
from polyc.lang.checked import Role

AARCH64_CC = shutil.which(TARGETS["neon"].cc)
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
needs_aarch64_cc = pytest.mark.skipif(
    AARCH64_CC is None, reason="aarch64 cross compiler aarch64-linux-gnu-gcc absent (Debian: gcc-aarch64-linux-gnu)")
needs_qemu = pytest.mark.skipif(
    AARCH64_CC is None or QEMU is None,
    reason="aarch64 cross compiler or qemu-aarch64 absent (Debian: gcc-aarch64-linux-gnu, qemu-user)")


def _cpu_has(flag: str) -> bool:
    try:
        return flag in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


# (corpus case, sizes): matmul, a strided convolution, softmax, layernorm, two gathers, integer
# kernels, 0-d reductions, float16 and double, accumulation into given outputs, a 0-d input
# that is a size.  The larger sizes leave remainders after every vector loop.
CASES = [
    ("matmul", dict(M=33, K=40, N=37)),
    ("matmul", dict(M=5, K=7, N=3)),
    ("conv2d_stride2", dict(N=2, C=3, H=11, W=13, F=4, KH=3, KW=3)),
    ("softmax", dict(N=5, D=19)),
    ("layernorm", dict(N=3, D=21)),
    ("embedding_bag", dict(E=10, D=9, B=3, L=5)),
    ("take_along_axis", dict(N=4, M=6, K=3)),
    ("int_rowsum", dict(M=4, N=19)),
    ("int_divmod", dict(N=20)),
    ("sum_all", dict(M=5, N=7)),
    ("dot", dict(N=37)),
    ("half_axpby", dict(N=16)),
    ("double_norm", dict(M=5, N=7)),
    ("matmul_acc", dict(M=4, K=5, N=3)),
    ("resize", dict(N=7, K=4)),
]
CASE_IDS = [f"{name}-" + "-".join(f"{k}{v}" for k, v in sizes.items()) for name, sizes in CASES]
#: Parametric exports (sizes passed at run time), one specialised copy of each case above.
PARAMETRIC_CASES = [CASES[0], CASES[2], CASES[5], CASES[14]]


# ----------------------------------------------------------------------------- the harness
def harness_source(stages, header_name: str, files: set[str], size_values: dict[str, int]) -> str:
    """A C ``main(argc, argv)``: read ``argv[1]/<tensor>.bin`` for each tensor in ``files`` (the
    others start as zeros), call the kernel, write every output to ``argv[1]/<tensor>.out`` and
    print the kernel's return value."""
    definition, kernel = stages.program.definition, stages.kernel
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <stdint.h>", f'#include "{header_name}"', "",
             "static void *load(const char *directory, const char *name, size_t bytes, int from_file)",
             "{",
             "    char path[4096];",
             "    void *data = calloc(bytes ? bytes : 1, 1);",
             "    if (!data) { perror(\"calloc\"); exit(3); }",
             "    if (!from_file) return data;",
             "    snprintf(path, sizeof path, \"%s/%s.bin\", directory, name);",
             "    FILE *file = fopen(path, \"rb\");",
             "    if (!file || fread(data, 1, bytes, file) != bytes) { perror(path); exit(3); }",
             "    fclose(file);",
             "    return data;",
             "}",
             "",
             "static void store(const char *directory, const char *name, const void *data, size_t bytes)",
             "{",
             "    char path[4096];",
             "    snprintf(path, sizeof path, \"%s/%s.out\", directory, name);",
             "    FILE *file = fopen(path, \"wb\");",
             "    if (!file || fwrite(data, 1, bytes, file) != bytes) { perror(path); exit(3); }",
             "    fclose(file);",
             "}",
             "",
             "int main(int argc, char **argv)",
             "{",
             "    if (argc != 2) { fprintf(stderr, \"usage: %s DIRECTORY\\n\", argv[0]); return 2; }"]
    arguments = []
    for position, name in enumerate(kernel.tensor_arguments):
        tensor = definition.tensor(name)
        nbytes = int(np.prod(tensor.concrete_shape(size_values), dtype=np.int64)) * tensor.dtype.itemsize
        variable = f"arg{position}"
        lines.append(f"    {c_type(tensor.dtype)} *{variable} = load(argv[1], \"{name}\", {nbytes}u, "
                     f"{int(name in files)});")
        arguments.append(variable)
    arguments += [f"INT64_C({size_values[size]})" for size in kernel.size_arguments]
    lines.append(f"    int status = {kernel.function_name}({', '.join(arguments)});")
    for position, name in enumerate(kernel.tensor_arguments):
        tensor = definition.tensor(name)
        if tensor.role is Role.OUTPUT:
            nbytes = int(np.prod(tensor.concrete_shape(size_values), dtype=np.int64)) * tensor.dtype.itemsize
            lines.append(f"    store(argv[1], \"{name}\", arg{position}, {nbytes}u);")
    lines += ["    printf(\"%d\\n\", status);", "    return 0;", "}", ""]
    return "\n".join(lines)


def build_and_run(case_name: str, sizes: dict[str, int], target: str, directory: Path, inputs,
                  initial=None, parametric: bool = False) -> tuple[int, tuple[np.ndarray, ...]]:
    """Export ``case_name`` for ``target``, build it with a harness and run it on ``inputs``
    (and ``initial`` outputs, when given); return the kernel's status and its outputs."""
    case = kernels.CASES[case_name]
    kernel = polyc.define(case.source)[case.entry]
    definition = kernel.definition
    stages = kernel.stages(None if parametric else sizes)
    exported = export_c(stages, target)
    exported.write(directory)
    files = {**dict(zip(definition.inputs, inputs)), **dict(zip(definition.outputs, initial or ()))}
    for name, value in files.items():
        array = np.ascontiguousarray(np.asarray(value, dtype=definition.tensor(name).dtype))
        (directory / f"{name}.bin").write_bytes(array.tobytes())
    (directory / "main.c").write_text(harness_source(stages, f"{exported.name}.h", set(files), sizes))

    program = directory / "main"
    emulated = exported.target.machine == "aarch64"  # static: qemu then needs no aarch64 sysroot
    command = exported.target.compile_command(["main.c", f"{exported.name}.c"], str(program),
                                              *(["-static"] if emulated else []))
    built = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stderr}"
    run = [QEMU, str(program), str(directory)] if emulated else [str(program), str(directory)]
    ran = subprocess.run(run, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert ran.returncode == 0, f"{' '.join(run)} exited with {ran.returncode}:\n{ran.stderr}"
    outputs = tuple(np.fromfile(directory / f"{name}.out", dtype=definition.tensor(name).dtype)
                    .reshape(definition.tensor(name).concrete_shape(sizes)) for name in definition.outputs)
    return int(ran.stdout.strip()), outputs


def check_against_reference(case_name: str, sizes: dict[str, int], target: str, directory: Path,
                            parametric: bool = False) -> None:
    """``kernels.check_kernel`` on the exported program, called like a polyc kernel."""
    def exported_kernel(*inputs, outputs=None):
        status, results = build_and_run(case_name, sizes, target, directory, inputs, outputs, parametric)
        assert status == 0, f"{case_name}: the exported kernel returned {status}"
        if outputs is not None:  # updated in place, as a polyc kernel does
            for given, result in zip(outputs, results):
                given[...] = result
            results = tuple(outputs)
        return results[0] if len(results) == 1 else results

    kernels.check_kernel(kernels.CASES[case_name], exported_kernel, sizes)


# ----------------------------------------------------------------------------- aarch64 NEON under qemu
@needs_qemu
@pytest.mark.parametrize("case_name, sizes", CASES, ids=CASE_IDS)
def test_neon_export_matches_numpy_under_qemu(tmp_path, case_name, sizes):
    check_against_reference(case_name, sizes, "neon", tmp_path)


@needs_qemu
@pytest.mark.parametrize("case_name, sizes", PARAMETRIC_CASES,
                         ids=[CASE_IDS[CASES.index(c)] for c in PARAMETRIC_CASES])
def test_neon_parametric_export_matches_numpy_under_qemu(tmp_path, case_name, sizes):
    check_against_reference(case_name, sizes, "neon", tmp_path, parametric=True)


@needs_qemu
def test_neon_gather_out_of_range_returns_1(tmp_path):
    case = kernels.CASES["embedding_bag"]
    sizes = dict(E=10, D=4, B=3, L=5)
    (lut, indices), _ = kernels.case_inputs(case, sizes)
    indices = indices.copy()
    indices[1, 2] = sizes["E"]  # one past the table
    status, _ = build_and_run("embedding_bag", sizes, "neon", tmp_path, (lut, indices))
    assert status == 1


@needs_aarch64_cc
def test_neon_assembly_uses_advanced_simd(tmp_path):
    """The vector loop of matmul becomes NEON: quad-word loads and 4-lane fused multiply-adds."""
    kernel = polyc.define(kernels.CASES["matmul"].source).matmul
    c_path, _ = kernel.export_c(tmp_path, dict(M=64, K=64, N=64), target="neon")
    neon = TARGETS["neon"]
    command = [neon.cc, *neon.build_flags(), "-S", "-o", "matmul.s", c_path.name]
    built = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assembly = (tmp_path / "matmul.s").read_text()
    assert re.search(r"\bfmla\s+v\d+\.4s, v\d+\.4s, v\d+\.(4s|s\[\d\])", assembly), "no 4-lane fmla"
    assert re.search(r"\b(ldr\s+q\d+|ld1r?\s+\{v\d+\.4s)", assembly), "no quad-word vector load"


# ----------------------------------------------------------------------------- x86, natively
X86_CASES = [CASES[i] for i in (0, 2, 3, 5, 7, 9, 11, 13)]


@pytest.mark.skipif(not _cpu_has("avx2"), reason="AVX2 absent from this CPU")
@pytest.mark.parametrize("case_name, sizes", X86_CASES, ids=[CASE_IDS[CASES.index(c)] for c in X86_CASES])
def test_avx2_export_matches_numpy(tmp_path, case_name, sizes):
    check_against_reference(case_name, sizes, "avx2", tmp_path)


@pytest.mark.parametrize("case_name, sizes", [CASES[0], CASES[4]], ids=[CASE_IDS[0], CASE_IDS[4]])
@pytest.mark.parametrize("parametric", [False, True], ids=["specialised", "parametric"])
def test_generic_export_matches_numpy(tmp_path, case_name, sizes, parametric):
    check_against_reference(case_name, sizes, "generic", tmp_path, parametric=parametric)


def test_host_export_gather_out_of_range_returns_1(tmp_path):
    case = kernels.CASES["take_along_axis"]
    sizes = dict(N=4, M=6, K=3)
    (values, indices), _ = kernels.case_inputs(case, sizes)
    indices = indices.copy()
    indices[2, 0] = -1
    status, _ = build_and_run("take_along_axis", sizes, "host", tmp_path, (values, indices))
    assert status == 1


@pytest.mark.parametrize("target, register", [("avx512", "zmm"), ("avx2", "ymm")])
def test_x86_targets_use_their_vector_registers(tmp_path, target, register):
    kernel = polyc.define(kernels.CASES["matmul"].source).matmul
    c_path, _ = kernel.export_c(tmp_path, dict(M=64, K=64, N=64), target=target)
    chosen = TARGETS[target]
    command = [*chosen.c_compiler().split(), *chosen.build_flags(), "-S", "-o", "matmul.s", c_path.name]
    built = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert re.search(rf"\bvfmadd\w*\s+.*%{register}", (tmp_path / "matmul.s").read_text())


# ----------------------------------------------------------------------------- the files themselves
def test_header_documents_arguments_shapes_and_return(tmp_path):
    kernel = polyc.define(kernels.CASES["conv2d_stride2"].source).conv2d_stride2
    sizes = dict(N=2, C=3, H=11, W=13, F=4, KH=3, KW=3)
    c_path, h_path = kernel.export_c(tmp_path, sizes)
    assert (c_path.name, h_path.name) == ("conv2d_stride2.c", "conv2d_stride2.h")
    header, source = h_path.read_text(), c_path.read_text()
    assert "int polyc_conv2d_stride2(const float *__restrict__ I, const float *__restrict__ W1, " \
           "float *__restrict__ O);" in header
    assert re.search(r"I\s+input\s+float32\[N\]\[C\]\[H\]\[W\] = \[2\]\[3\]\[11\]\[13\]", header)
    assert re.search(r"O\s+output\s+float32\[N\]\[F\]\[floor\(\(H - KH\) / 2\) \+ 1\]"
                     r"\[floor\(\(W - KW\) / 2\) \+ 1\] = \[2\]\[4\]\[5\]\[6\]", header)
    assert "Returns 0 on success; otherwise the outputs are not valid: 1 when a data-dependent subscript" in header
    assert "for target neon" in header and "aarch64-linux-gnu-gcc -O3 -march=armv8-a+simd" in source
    assert source.count('#include "conv2d_stride2.h"') == 1 and "polyc prelude" in source
    assert "Python" not in source  # nothing of the runtime is needed


def test_parametric_header_takes_sizes_and_states_the_precondition(tmp_path):
    kernel = polyc.define(kernels.CASES["resize"].source).resize
    _, h_path = kernel.export_c(tmp_path, target="generic")
    header = h_path.read_text()
    assert "int64_t N, int64_t K_size);" in header
    assert re.search(r"K_size\s+int64_t, the size K", header)
    assert "holds the value of the size K" in header
    assert "Every affine access is proved in bounds for all sizes" in header
    column = polyc.define("def column(float(M, K) A) -> (B) { B(i) = A(i, 0) }").column
    _, h_path = column.export_c(tmp_path, target="generic")
    assert "stay in bounds only for sizes satisfying: not [M, K] -> {  : K = 0 and M > 0 }" in h_path.read_text()


def test_export_errors_are_polyc_errors(tmp_path):
    module = polyc.define(kernels.CASES["matmul"].source + """
def column(float(M, K) A) -> (B) {
    B(i) = A(i, 0)
}""")
    with pytest.raises(polyc.PolycError, match="unknown target 'sse9'; the targets are: host, avx512"):
        module.matmul.export_c(tmp_path, target="sse9")
    with pytest.raises(polyc.PolycError, match="no value for K, N"):
        module.matmul.export_c(tmp_path, dict(M=4))
    with pytest.raises(polyc.PolycError, match="Q is not one of them"):
        module.matmul.export_c(tmp_path, dict(M=4, K=4, N=4, Q=1))
    with pytest.raises(polyc.BoundsError):
        module.column.export_c(tmp_path, dict(M=3, K=0))
    assert not any(tmp_path.iterdir())


def test_cli_writes_c_and_header(tmp_path, capsys):
    from polyc.cli import main
    source = tmp_path / "matmul.tc"
    source.write_text(kernels.CASES["matmul"].source)
    out = tmp_path / "out"
    assert main(["compile", str(source), "--entry", "matmul", "--target", "neon",
                 "--shape", "M=8,K=8,N=8", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["matmul.c", "matmul.h"]
    assert "const int64_t M = 8;" in (out / "matmul.c").read_text()
    capsys.readouterr()
    assert main(["compile", str(source), "--entry", "matmul", "--target", "avx2", "--emit", "c"]) == 0
    printed = capsys.readouterr().out
    assert "exported for target avx2" in printed and "-mavx2 -mfma" in printed
    assert main(["compile", str(source), "--target", "neon"]) == 2
    assert "-o OUTDIR" in capsys.readouterr().err
    assert main(["compile", str(source), "--target", "neon", "--emit", "isl"]) == 2
    assert "--target applies to C" in capsys.readouterr().err
