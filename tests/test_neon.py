"""Exported C (``polyc.runtime.targets``) built into stand-alone programs and run against numpy.

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

Contractions (the gemm back end, whose register blocks are arm_neon.h intrinsics on aarch64)
are checked at many sizes per build: one parametric export, one program running every call in
one qemu process (``check_gemm_under_qemu``), also built with AddressSanitizer and UBSan where
the cross compiler has them; the assembly must multiply-add by lane (``fmla v.4s, v.4s,
v.s[i]``), and the header must compile as C++.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import kernels
import numpy as np
import pytest

import polyc
from polyc.codegen.c_expr import c_type
from polyc.codegen.gemm import micro_kernel_shapes
from polyc.lang.checked import Role
from polyc.runtime.arguments import bind_arguments
from polyc.runtime.targets import export_c
from polyc.target import TARGETS

AARCH64_CC = shutil.which(TARGETS["neon"].cc)
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
needs_aarch64_cc = pytest.mark.skipif(
    AARCH64_CC is None, reason="aarch64 cross compiler aarch64-linux-gnu-gcc absent (Debian: gcc-aarch64-linux-gnu)"
)
needs_qemu = pytest.mark.skipif(
    AARCH64_CC is None or QEMU is None,
    reason="aarch64 cross compiler or qemu-aarch64 absent (Debian: gcc-aarch64-linux-gnu, qemu-user)",
)


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
    ("matvec", dict(M=9, N=531)),
]
CASE_IDS = [f"{name}-" + "-".join(f"{k}{v}" for k, v in sizes.items()) for name, sizes in CASES]
#: Parametric exports (sizes passed at run time), one specialised copy of each case above.
PARAMETRIC_CASES = [CASES[0], CASES[2], CASES[5], CASES[14]]


# ----------------------------------------------------------------------------- the harness
def _harness_io(header_name: str) -> list[str]:
    """The includes of a harness, and its ``load`` (a zeroed buffer, filled from
    ``DIRECTORY/NAME.bin`` when asked) and ``store`` (into ``DIRECTORY/NAME.out``)."""
    return [
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <stdint.h>",
        f'#include "{header_name}"',
        "",
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
    ]


def harness_source(stages, header_name: str, files: set[str], size_values: dict[str, int]) -> str:
    """A C ``main(argc, argv)``: read ``argv[1]/<tensor>.bin`` for each tensor in ``files`` (the
    others start as zeros), call the kernel, write every output to ``argv[1]/<tensor>.out`` and
    print the kernel's return value."""
    definition, kernel = stages.program.definition, stages.kernel
    lines = [
        *_harness_io(header_name),
        "int main(int argc, char **argv)",
        "{",
        "    if (argc != 2) { fprintf(stderr, \"usage: %s DIRECTORY\\n\", argv[0]); return 2; }",
    ]
    arguments = []
    for position, name in enumerate(kernel.tensor_arguments):
        tensor = definition.tensor(name)
        nbytes = int(np.prod(tensor.concrete_shape(size_values), dtype=np.int64)) * tensor.dtype.itemsize
        variable = f"arg{position}"
        lines.append(
            f"    {c_type(tensor.dtype)} *{variable} = load(argv[1], \"{name}\", {nbytes}u, {int(name in files)});"
        )
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


def build_and_run(
    case_name: str, sizes: dict[str, int], target: str, directory: Path, inputs, initial=None, parametric: bool = False
) -> tuple[int, tuple[np.ndarray, ...]]:
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
    command = exported.target.compile_command(
        ["main.c", f"{exported.name}.c"], str(program), *(["-static"] if emulated else [])
    )
    built = subprocess.run(command, cwd=directory, capture_output=True, text=True)
    assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stderr}"
    run = [QEMU, str(program), str(directory)] if emulated else [str(program), str(directory)]
    ran = subprocess.run(run, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert ran.returncode == 0, f"{' '.join(run)} exited with {ran.returncode}:\n{ran.stderr}"
    outputs = tuple(
        np.fromfile(directory / f"{name}.out", dtype=definition.tensor(name).dtype).reshape(
            definition.tensor(name).concrete_shape(sizes)
        )
        for name in definition.outputs
    )
    return int(ran.stdout.strip()), outputs


def check_against_reference(
    case_name: str, sizes: dict[str, int], target: str, directory: Path, parametric: bool = False
) -> None:
    """``kernels.check_kernel`` on the exported program, called like a polyc kernel."""

    def exported_kernel(*inputs, outputs=None):
        status, results = build_and_run(case_name, sizes, target, directory, inputs, outputs, parametric)
        assert status == 0, f"{case_name}: the exported kernel returned {status}"
        if outputs is not None:  # updated in place, as a polyc kernel does
            for given, result in zip(outputs, results, strict=True):
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
@pytest.mark.parametrize("case_name, sizes", PARAMETRIC_CASES, ids=[CASE_IDS[CASES.index(c)] for c in PARAMETRIC_CASES])
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


# ----------------------------------------------------------------------------- gemm micro-kernels under qemu
# Contractions take the BLIS-style back end (polyc/codegen/gemm.py), whose register blocks are
# NEON intrinsics on aarch64.  Each test exports parametric kernels, builds each once (the
# kernel's own file with -Wall -Werror) and runs all its calls in one qemu process.


@dataclass
class GemmCall:
    """One call of a contraction kernel: its inputs (and outputs to update, or None), the results
    numpy computes in float64, and how many products each element sums (for TC's tolerance)."""

    inputs: tuple
    expected: tuple
    ops: int
    initial: tuple | None = None


def multi_call_harness(stages, header_name: str) -> str:
    """A C ``main(argc, argv)`` running the parametric kernel once per call, for ``argv[2]``
    calls: call c reads ``argv[1]/c.meta.bin`` (int64: the sizes in argument order, then each
    tensor's element count) and ``argv[1]/c.<tensor>.bin``, writes ``argv[1]/c.<output>.out``
    and prints the kernel's return value."""
    definition, kernel = stages.program.definition, stages.kernel
    n_sizes, n_tensors = len(kernel.size_arguments), len(kernel.tensor_arguments)
    lines = [
        *_harness_io(header_name),
        "int main(int argc, char **argv)",
        "{",
        "    if (argc != 3) { fprintf(stderr, \"usage: %s DIRECTORY CALLS\\n\", argv[0]); return 2; }",
        "    char name[256];",
        "    for (int call = 0; call < atoi(argv[2]); call++) {",
        "        snprintf(name, sizeof name, \"%d.meta\", call);",
        f"        int64_t *meta = load(argv[1], name, {n_sizes + n_tensors} * sizeof(int64_t), 1);",
    ]
    arguments = []
    for position, tensor_name in enumerate(kernel.tensor_arguments):
        ctype = c_type(definition.tensor(tensor_name).dtype)
        lines += [
            f"        snprintf(name, sizeof name, \"%d.{tensor_name}\", call);",
            f"        {ctype} *arg{position} = load(argv[1], name, "
            f"(size_t)meta[{n_sizes + position}] * sizeof({ctype}), 1);",
        ]
        arguments.append(f"arg{position}")
    arguments += [f"meta[{position}]" for position in range(n_sizes)]
    lines.append(f"        const int status = {kernel.function_name}({', '.join(arguments)});")
    for position, tensor_name in enumerate(kernel.tensor_arguments):
        if definition.tensor(tensor_name).role is Role.OUTPUT:
            ctype = c_type(definition.tensor(tensor_name).dtype)
            lines += [
                f"        snprintf(name, sizeof name, \"%d.{tensor_name}\", call);",
                f"        store(argv[1], name, arg{position}, (size_t)meta[{n_sizes + position}] * sizeof({ctype}));",
            ]
    lines += [f"        free(arg{position});" for position in range(n_tensors)]
    lines += ["        free(meta);", "        printf(\"%d\\n\", status);", "    }", "    return 0;", "}", ""]
    return "\n".join(lines)


def _aarch64_sanitizer_root() -> str | None:
    """The aarch64 system root qemu loads a dynamically linked program from, when the cross
    compiler has AddressSanitizer's runtime (a sanitized program cannot be linked statically)."""
    if AARCH64_CC is None:
        return None

    def find(name: str) -> Path:
        found = subprocess.run([AARCH64_CC, f"-print-file-name={name}"], capture_output=True, text=True).stdout
        return Path(found.strip()).resolve()

    loader = find("ld-linux-aarch64.so.1")
    if not find("libasan.so").is_file() or not loader.is_file():
        return None
    return str(loader.parent.parent)


AARCH64_SANITIZER_ROOT = _aarch64_sanitizer_root()


def check_gemm_under_qemu(
    directory: Path, source: str, calls: list[GemmCall], sanitize: bool = False, **options
) -> None:
    """Export the contraction def ``source`` for neon with sizes as arguments (``options`` as
    for polyc.define), run every call under qemu with two threads, compare with numpy.
    ``sanitize``: built with AddressSanitizer and UBSan, so any read or write outside the
    tensors (which the harness allocates at their exact sizes) fails the test."""
    module = polyc.define(source, specialize=False, **options)
    kernel = module[module.names[0]]
    definition = kernel.definition
    stages = kernel.stages(None)
    assert stages.contraction is not None, "not compiled by the gemm back end"
    exported = export_c(stages, "neon")
    exported.write(directory)
    for position, call in enumerate(calls):
        bound = bind_arguments(definition, call.inputs, call.initial)
        arrays = {
            t.name: bound.arrays.get(t.name, np.zeros(t.concrete_shape(bound.sizes), t.dtype))
            for t in definition.tensors
        }
        meta = [bound.sizes[s] for s in stages.kernel.size_arguments]
        meta += [arrays[name].size for name in stages.kernel.tensor_arguments]
        (directory / f"{position}.meta.bin").write_bytes(np.asarray(meta, np.int64).tobytes())
        for name, array in arrays.items():
            (directory / f"{position}.{name}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
    (directory / "main.c").write_text(multi_call_harness(stages, f"{exported.name}.h"))

    neon = TARGETS["neon"]
    # -O1: sanitized -O3 builds of the gemm file take ten times as long
    checks = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"] if sanitize else []
    commands = [
        [neon.cc, *neon.build_flags(), *checks, "-Wall", "-Werror", "-c", f"{exported.name}.c", "-o", "kernel.o"],
        neon.compile_command(["main.c", "kernel.o"], "main", *(checks or ["-static"])),
    ]
    for command in commands:
        built = subprocess.run(command, cwd=directory, capture_output=True, text=True)
        assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stderr}"
    run = [
        QEMU,
        *(["-L", AARCH64_SANITIZER_ROOT] if sanitize else []),
        str(directory / "main"),
        str(directory),
        str(len(calls)),
    ]
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": "2",
        "ASAN_OPTIONS": "detect_leaks=0",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }
    ran = subprocess.run(run, capture_output=True, text=True, timeout=600, env=environment)
    assert ran.returncode == 0 and "runtime error" not in ran.stderr, (
        f"{' '.join(run)} exited with {ran.returncode}:\n{ran.stderr[-6000:]}"
    )
    assert ran.stdout.split() == ["0"] * len(calls), ran.stdout

    for position, call in enumerate(calls):
        sizes = bind_arguments(definition, call.inputs, call.initial).sizes
        for name, expected in zip(definition.outputs, call.expected, strict=True):
            tensor = definition.tensor(name)
            got = np.fromfile(directory / f"{position}.{name}.out", dtype=tensor.dtype)
            got = got.reshape(tensor.concrete_shape(sizes))
            try:
                kernels.assert_close(got, expected.astype(tensor.dtype), max(call.ops, 4), tensor.dtype, call.inputs)
            except AssertionError as error:
                raise AssertionError(f"call {position}, sizes {sizes}: {error}") from None


def uniform(rng, shape, dtype) -> np.ndarray:
    return rng.uniform(-1, 1, size=shape).astype(dtype)


MATMUL = "def matmul(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"

#: (M, K, N): size 1 in each place, multiples and non-multiples of every register block (float
#: 8 x 12, 8 x 8, 8 x 4; double 6 x 8, 8 x 4, 8 x 2), N that picks each narrow block, K over
#: KC, M over MC, a product large enough to share among threads, and a short wide one (column
#: slivers shared).
GEMM_SIZES = [
    (1, 1, 1),
    (1, 17, 9),
    (9, 1, 13),
    (13, 9, 1),
    (7, 5, 3),
    (8, 16, 12),
    (24, 8, 24),
    (6, 7, 8),
    (16, 9, 2),
    (37, 11, 4),
    (50, 20, 8),
    (29, 13, 16),
    (33, 129, 257),
    (257, 33, 129),
    (61, 700, 67),
    (300, 200, 310),
    (5, 64, 3000),
]


def matmul_calls(dtype, sizes, seed: int) -> list[GemmCall]:
    rng = np.random.default_rng(seed)
    calls = []
    for m, k, n in sizes:
        a, b = uniform(rng, (m, k), dtype), uniform(rng, (k, n), dtype)
        calls.append(GemmCall((a, b), (a.astype(np.float64) @ b,), k))
    return calls


@needs_qemu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize(
    "options", [{}, dict(parallel=False, gemm_blocks=(16, 24, 8))], ids=["parallel", "serial-small-blocks"]
)
def test_neon_gemm_matmul_under_qemu(tmp_path, dtype, options):
    """Small cache blocks (MC, NC, KC rounded to MR and NR) put several of each block in every
    product, most of them partial."""
    source = MATMUL.replace("float", c_type(dtype))
    check_gemm_under_qemu(tmp_path, source, matmul_calls(dtype, GEMM_SIZES, seed=1), **options)


#: name: (source, shapes of the inputs for (m, k, n), numpy on float64 inputs, the tolerance's
#: operation count for K = k)
GEMM_LAYOUTS = {
    # B read with K contiguous: packed by gathering
    "a_bt": (
        "def f(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }",
        lambda m, k, n: [(m, k), (n, k)],
        lambda A, B: A @ B.T,
        lambda k: k,
    ),
    # A with M contiguous: read in place with the lane multiply-adds when few B slivers use it
    "at_bt": (
        "def f(float(K, M) A, float(N, K) B) -> (C) { C(m, n) +=! A(r_k, m) * B(n, r_k) }",
        lambda m, k, n: [(k, m), (n, k)],
        lambda A, B: A.T @ B.T,
        lambda k: k,
    ),
    # C's columns not contiguous: every block written back through the buffer
    "transposed_output": (
        "def f(float(M, K) A, float(K, N) B) -> (C) { C(n, m) +=! A(m, r_k) * B(r_k, n) }",
        lambda m, k, n: [(m, k), (k, n)],
        lambda A, B: (A @ B).T,
        lambda k: k,
    ),
    "multi_k": (
        "def f(float(M, K1, K2) A, float(K2, K1, N) B) -> (C) { C(m, n) +=! A(m, r_a, r_b) * B(r_b, r_a, n) }",
        lambda m, k, n: [(m, k, 3), (3, k, n)],
        lambda A, B: np.einsum("mab,ban->mn", A, B),
        lambda k: 3 * k,
    ),
    # the diagonal sums k squares, all positive: its rounding grows with the sum (about k / 3),
    # not with max|input|; 3 k as in tests/test_gemm.py
    "same_tensor_twice": (
        "def f(float(N, K) A) -> (C) { C(i, j) +=! A(i, r_k) * A(j, r_k) }",
        lambda m, k, n: [(m, k)],
        lambda A: A @ A.T,
        lambda k: 3 * k,
    ),
}


@needs_qemu
@pytest.mark.parametrize("name", sorted(GEMM_LAYOUTS))
def test_neon_gemm_layouts_under_qemu(tmp_path, name):
    source, shapes, reference, ops = GEMM_LAYOUTS[name]
    rng = np.random.default_rng(2)
    calls = []
    for m, k, n in [(1, 1, 1), (7, 3, 5), (8, 9, 12), (13, 7, 70), (70, 150, 13), (130, 90, 140)]:
        inputs = tuple(uniform(rng, shape, np.float32) for shape in shapes(m, k, n))
        calls.append(GemmCall(inputs, (reference(*(x.astype(np.float64) for x in inputs)),), ops(k)))
    check_gemm_under_qemu(tmp_path, source, calls)


@needs_qemu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_neon_gemm_batched_under_qemu(tmp_path, dtype):
    """One big product (rows shared among threads), three, eight (whole products per thread),
    many tiny ones (A read in place, element by element), one short and wide."""
    source = "def f(float(B, N, M) X, float(B, M, K) Y) -> (Z) { Z(b, n, k) +=! X(b, n, r_m) * Y(b, r_m, k) }"
    rng = np.random.default_rng(3)
    calls = []
    for b, n, m, k in [
        (1, 1, 1, 1),
        (2, 3, 5, 7),
        (1, 130, 97, 140),
        (3, 70, 100, 90),
        (8, 45, 50, 60),
        (50, 26, 72, 26),
        (1, 5, 64, 3000),
    ]:
        x, y = uniform(rng, (b, n, m), dtype), uniform(rng, (b, m, k), dtype)
        calls.append(GemmCall((x, y), (np.matmul(x.astype(np.float64), y),), m))
    check_gemm_under_qemu(tmp_path, source.replace("float", c_type(dtype)), calls)


@needs_qemu
def test_neon_gemm_multi_index_groups_under_qemu(tmp_path):
    """Groups of several indices (batch (n, w, h)), and the two steps of a Kronecker product
    (M of three indices; N of three, whose B slivers are read in place)."""
    rng = np.random.default_rng(4)
    grouped = (
        "def f(float(N, C1, C2, H, W) I0, float(N, C2, W, H, C3) I1) -> (O) {"
        " O(n, c1, w, h, c3) +=! I0(n, c1, r_c2, h, w) * I1(n, r_c2, w, h, c3) }"
    )
    i0, i1 = uniform(rng, (2, 17, 33, 5, 3), np.float32), uniform(rng, (2, 33, 3, 5, 19), np.float32)
    expected = np.einsum("nabhw,nbwhc->nawhc", i0.astype(np.float64), i1)
    check_gemm_under_qemu(tmp_path / "grouped", grouped, [GemmCall((i0, i1), (expected,), 33)])

    step1 = (
        "def f(float(D2, N2) W2, float(M, N0, N1, N2) X) -> (XW2) {"
        " XW2(m, n0, n1, d2) +=! X(m, n0, n1, r_n2) * W2(d2, r_n2) }"
    )
    calls = []
    for d2, n2, m, n0, n1 in [(21, 19, 9, 5, 7), (12, 8, 1, 3, 2)]:
        w2, x = uniform(rng, (d2, n2), np.float32), uniform(rng, (m, n0, n1, n2), np.float32)
        calls.append(GemmCall((w2, x), (np.einsum("mabr,dr->mabd", x.astype(np.float64), w2),), n2))
    check_gemm_under_qemu(tmp_path / "step1", step1, calls)

    step2 = (
        "def f(float(D1, N1) W1, float(M, N0, N1, D2) XW2) -> (Y) {"
        " Y(m, n0, d1, d2) +=! XW2(m, n0, r_n1, d2) * W1(d1, r_n1) }"
    )
    calls = []
    for d1, n1, m, n0, d2 in [(20, 17, 6, 5, 21), (3, 40, 2, 3, 70), (12, 5, 2, 2, 12)]:
        w1, xw2 = uniform(rng, (d1, n1), np.float32), uniform(rng, (m, n0, n1, d2), np.float32)
        calls.append(GemmCall((w1, xw2), (np.einsum("mard,er->maed", xw2.astype(np.float64), w1),), n1))
    check_gemm_under_qemu(tmp_path / "step2", step2, calls)


MLP = """def mlp(float(M, K) I, float(K, N) W, float(N) bias) -> (O) {
    O(i, j) +=! I(i, r_k) * W(r_k, j)
    O(a, b) = fmax(O(a, b) + bias(b), 0)
}"""


@needs_qemu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "serial"])
def test_neon_gemm_bias_relu_epilogue_under_qemu(tmp_path, dtype, parallel):
    rng = np.random.default_rng(5)
    calls = []
    for m, k, n in [(1, 1, 1), (7, 5, 3), (67, 45, 130), (200, 300, 100)]:
        i, w, bias = uniform(rng, (m, k), dtype), uniform(rng, (k, n), dtype), uniform(rng, (n,), dtype)
        calls.append(GemmCall((i, w, bias), (np.maximum(i.astype(np.float64) @ w + bias, 0),), k))
    check_gemm_under_qemu(tmp_path, MLP.replace("float", c_type(dtype)), calls, parallel=parallel)


@needs_qemu
def test_neon_gemm_accumulation_and_epilogues_under_qemu(tmp_path):
    """``+=`` into a given output (the first KC block adds to C too), then two epilogues; and a
    1x1 convolution (N of three indices) with bias and relu."""
    rng = np.random.default_rng(6)
    source = """def f(float(M, K) A, float(K, N) B, float(M, N) D, float alpha) -> (C) {
        C(m, n) += A(m, r_k) * B(r_k, n)
        C(m, n) += D(m, n)
        C(m, n) = alpha * C(m, n)
    }"""
    calls = []
    for m, k, n in [(1, 1, 1), (5, 9, 70), (150, 130, 170)]:
        a, b, d, c0 = (uniform(rng, shape, np.float32) for shape in [(m, k), (k, n), (m, n), (m, n)])
        expected = 1.5 * (c0.astype(np.float64) + a.astype(np.float64) @ b + d)
        calls.append(GemmCall((a, b, d, np.float32(1.5)), (expected,), k + 2, initial=(c0,)))
    check_gemm_under_qemu(tmp_path / "accumulate", source, calls)

    conv = """def conv(float(N, C, H, W) I, float(F, C) W1, float(F) bias) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h, w) * W1(f, r_c)
        O(n, f, h, w) = fmax(O(n, f, h, w) + bias(f), 0)
    }"""
    calls = []
    for n, c, h, w, f in [(1, 3, 2, 2, 1), (2, 70, 9, 11, 40), (3, 33, 16, 16, 20)]:
        i, w1, bias = (
            uniform(rng, (n, c, h, w), np.float32),
            uniform(rng, (f, c), np.float32),
            uniform(rng, (f,), np.float32),
        )
        reference = np.einsum("nchw,fc->nfhw", i.astype(np.float64), w1) + bias[None, :, None, None]
        calls.append(GemmCall((i, w1, bias), (np.maximum(reference, 0),), c))
    check_gemm_under_qemu(tmp_path / "conv1x1", conv, calls)


@needs_qemu
@pytest.mark.skipif(AARCH64_SANITIZER_ROOT is None, reason="no AddressSanitizer runtime for aarch64 (libasan)")
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_neon_gemm_sanitized_under_qemu(tmp_path, dtype):
    """Partial blocks at every edge read and write nothing outside the tensors: matmul in both
    thread modes, A and B transposed, C transposed, tiny batches (A read in place), bias+relu."""
    name = c_type(dtype)
    sizes = [(1, 1, 1), (7, 5, 3), (9, 1, 13), (37, 11, 4), (50, 20, 8), (29, 13, 16), (45, 37, 130), (130, 100, 97)]
    check_gemm_under_qemu(
        tmp_path / "parallel", MATMUL.replace("float", name), matmul_calls(dtype, sizes, 7), sanitize=True
    )
    check_gemm_under_qemu(
        tmp_path / "serial",
        MATMUL.replace("float", name),
        matmul_calls(dtype, sizes, 8),
        sanitize=True,
        parallel=False,
        gemm_blocks=(16, 24, 8),
    )
    rng = np.random.default_rng(9)
    for layout in ("a_bt", "at_bt", "transposed_output"):
        source, shapes, reference, ops = GEMM_LAYOUTS[layout]
        calls = []
        for m, k, n in [(1, 1, 1), (7, 3, 5), (13, 7, 70), (70, 40, 13)]:
            inputs = tuple(uniform(rng, shape, dtype) for shape in shapes(m, k, n))
            calls.append(GemmCall(inputs, (reference(*(x.astype(np.float64) for x in inputs)),), ops(k)))
        check_gemm_under_qemu(tmp_path / layout, source.replace("float", name), calls, sanitize=True)
    batched = "def f(float(B, N, M) X, float(B, M, K) Y) -> (Z) { Z(b, n, k) +=! X(b, n, r_m) * Y(b, r_m, k) }"
    calls = []
    for b, n, m, k in [(2, 3, 5, 7), (50, 7, 9, 5), (3, 26, 33, 10)]:
        x, y = uniform(rng, (b, n, m), dtype), uniform(rng, (b, m, k), dtype)
        calls.append(GemmCall((x, y), (np.matmul(x.astype(np.float64), y),), m))
    check_gemm_under_qemu(tmp_path / "batched", batched.replace("float", name), calls, sanitize=True)
    calls = []
    for m, k, n in [(1, 1, 1), (13, 200, 70)]:
        i, w, bias = uniform(rng, (m, k), dtype), uniform(rng, (k, n), dtype), uniform(rng, (n,), dtype)
        calls.append(GemmCall((i, w, bias), (np.maximum(i.astype(np.float64) @ w + bias, 0),), k))
    check_gemm_under_qemu(tmp_path / "mlp", MLP.replace("float", name), calls, sanitize=True)


@needs_aarch64_cc
@pytest.mark.parametrize(
    "dtype, lanes, element", [(np.float32, "4s", "s"), (np.float64, "2d", "d")], ids=["float32", "float64"]
)
def test_neon_gemm_kernel_is_neon(tmp_path, dtype, lanes, element):
    """The exported contraction selects the NEON register blocks (not the portable ones), and its
    multiply-adds take elements of A as lanes of a vector: ``fmla v.4s, v.4s, v.s[i]``.
    Parametric, so that every register block is in the file."""
    source = MATMUL.replace("float", c_type(dtype))
    kernel = polyc.define(source).matmul
    c_path, _ = kernel.export_c(tmp_path, None, target="neon")
    neon = TARGETS["neon"]
    preprocessed = subprocess.run(
        [neon.cc, *neon.build_flags(), "-E", c_path.name], cwd=tmp_path, capture_output=True, text=True
    )
    assert preprocessed.returncode == 0, preprocessed.stderr
    blocks = set(re.findall(r"\bpolyc_kernel_(\d+x\d+)\(", preprocessed.stdout))
    assert blocks == {shape.name for shape in micro_kernel_shapes("neon", np.dtype(dtype))}, blocks
    built = subprocess.run(
        [neon.cc, *neon.build_flags(), "-Wall", "-Werror", "-S", "-o", "matmul.s", c_path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    assembly = (tmp_path / "matmul.s").read_text()
    by_lane = re.findall(rf"\bfmla\s+v\d+\.{lanes}, v\d+\.{lanes}, v\d+\.{element}\[(\d)\]", assembly)
    assert set(by_lane) == {str(lane) for lane in range(16 // np.dtype(dtype).itemsize)}, "no multiply-adds by lane"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler (g++)")
@pytest.mark.parametrize("sizes", [dict(M=10, K=20, N=30), None], ids=["specialised", "parametric"])
def test_neon_gemm_header_is_usable_from_cplusplus(tmp_path, sizes):
    """The exported header declares the kernel with C linkage; C++ (host g++: the header is the
    same for every target) can include it and call it."""
    kernel = polyc.define(MLP).mlp
    _, h_path = kernel.export_c(tmp_path, sizes, target="neon")
    size_arguments = ", 10, 20, 30" if sizes is None else ""
    (tmp_path / "use.cpp").write_text(
        f'#include "{h_path.name}"\n'
        "#include <vector>\n"
        "int run() {\n"
        "    std::vector<float> i(200), w(600), bias(30), o(300);\n"
        f"    return polyc_mlp(i.data(), w.data(), bias.data(), o.data(){size_arguments});\n"
        "}\n"
    )
    command = ["g++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", "use.cpp", "-o", "use.o"]
    built = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    symbols = subprocess.run(["nm", "use.o"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert re.search(r"\bU polyc_mlp\b", symbols), symbols  # an unmangled, C-linkage reference


# ----------------------------------------------------------------------------- x86, natively
X86_CASES = [CASES[i] for i in (0, 2, 3, 5, 7, 9, 11, 13, 15)]


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
    assert (
        "int polyc_conv2d_stride2(const float *__restrict__ I, const float *__restrict__ W1, "
        "float *__restrict__ O);" in header
    )
    assert re.search(r"I\s+input\s+float32\[N\]\[C\]\[H\]\[W\] = \[2\]\[3\]\[11\]\[13\]", header)
    assert re.search(
        r"O\s+output\s+float32\[N\]\[F\]\[floor\(\(H - KH\) / 2\) \+ 1\]"
        r"\[floor\(\(W - KW\) / 2\) \+ 1\] = \[2\]\[4\]\[5\]\[6\]",
        header,
    )
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
    module = polyc.define(
        kernels.CASES["matmul"].source
        + """
def column(float(M, K) A) -> (B) {
    B(i) = A(i, 0)
}"""
    )
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
    assert (
        main(
            ["compile", str(source), "--entry", "matmul", "--target", "neon", "--shape", "M=8,K=8,N=8", "-o", str(out)]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["matmul.c", "matmul.h"]
    assert "const int64_t M = 8;" in (out / "matmul.c").read_text()
    assert "#include <arm_neon.h>" in (out / "matmul.c").read_text()  # the contraction's NEON blocks
    capsys.readouterr()
    assert main(["compile", str(source), "--entry", "matmul", "--target", "avx2", "--emit", "c"]) == 0
    printed = capsys.readouterr().out
    assert "exported for target avx2" in printed and "-mavx2 -mfma" in printed
    assert main(["compile", str(source), "--target", "neon"]) == 2
    assert "-o OUTDIR" in capsys.readouterr().err
    assert main(["compile", str(source), "--target", "neon", "--emit", "isl"]) == 2
    assert "--target applies to C" in capsys.readouterr().err
