"""The integer gemm path (:mod:`polyc.paths.integer_gemm`): 8-bit matrix products summed in
int32, exact against numpy's int64 products of the shifted operands, in every instruction set's
branch of the kernel (AVX-512 VNNI here natively, AVX-VNNI, AVX2 and portable C by flags, NEON
with and without the dot product under qemu), and the recogniser's limits."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from builds import builds
from sanitizers import TESTS_DIR, assert_clean, run_sanitized

import polyc
from polyc.lang.sema import check_source
from polyc.paths import PathRequest, choose_path
from polyc.paths.explaining import built_for
from polyc.runtime.arguments import bind_arguments
from polyc.schedule.integer_contraction import recognise_integer_gemm_def
from polyc.target import INTEGER_DOT_PRODUCT_SETS, host

TYPES = {"u8": ("uint8", np.uint8), "s8": ("int8", np.int8)}
PAIRS = ["u8s8", "s8s8", "u8u8", "s8u8"]


def random_operand(rng, shape, name: str) -> np.ndarray:
    dtype = TYPES[name][1]
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape, dtype=dtype)


def expected(a, b, za=0, zb=0) -> np.ndarray:
    """The product of the shifted operands in int64, as int32 (it fits for these sizes)."""
    product = (a.astype(np.int64) - np.asarray(za, np.int64)) @ (b.astype(np.int64) - np.asarray(zb, np.int64))
    assert np.abs(product).max(initial=0) < 2**31
    return product.astype(np.int32)


def source(pair: str) -> str:
    """Defs of one operand pair: no zero points; A's one value and B's per column; A's per row
    and B's one value (of shape (1), as ONNX gives it); a literal zero point; B stored
    transposed; a batch of A times one B; accumulation into a given output."""
    ta, tb = TYPES[pair[:2]][0], TYPES[pair[2:]][0]
    return f"""
def plain({ta}(M, K) A, {tb}(K, N) B) -> (Y) {{
    Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))
}}
def zeros({ta}(M, K) A, {tb}(K, N) B, {ta} ZA, {tb}(N) ZB) -> (Y) {{
    Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * (int32(B(r_k, n)) - int32(ZB(n)))
}}
def rows({ta}(M, K) A, {tb}(K, N) B, {ta}(M) ZA, {tb}(1) ZB) -> (Y) {{
    Y(m, n) +=! (int32(B(r_k, n)) - int32(ZB(0))) * (int32(A(m, r_k)) - int32(ZA(m)))
}}
def literal({ta}(M, K) A, {tb}(K, N) B) -> (Y) {{
    Y(m, n) +=! (int32(A(m, r_k)) - 100) * int32(B(r_k, n))
}}
def transposed({ta}(M, K) A, {tb}(N, K) B) -> (Y) {{
    Y(m, n) +=! int32(A(m, r_k)) * int32(B(n, r_k))
}}
def batched({ta}(P, M, K) A, {tb}(K, N) B, {tb}(N) ZB) -> (Y) {{
    Y(p, m, n) +=! int32(A(p, m, r_k)) * (int32(B(r_k, n)) - int32(ZB(n)))
}}
def accumulate({ta}(M, K) A, {tb}(K, N) B, {ta} ZA) -> (Y) {{
    Y(m, n) += (int32(A(m, r_k)) - int32(ZA)) * int32(B(r_k, n))
}}
"""


#: (M, K, N): 1 in each place, sizes that are multiples of no register block or K group, several
#: KC blocks (the AVX-512 VNNI block's KC is 384 with a 48 KiB L1) and MC blocks.
SIZES = [(1, 1, 1), (1, 9, 70), (7, 1, 5), (5, 3, 1), (13, 21, 17), (6, 64, 64), (37, 403, 129), (130, 900, 67)]


def check_pair(module, pair: str, rng, sizes=SIZES) -> None:
    ta, tb = pair[:2], pair[2:]
    for m, k, n in sizes:
        a, b = random_operand(rng, (m, k), ta), random_operand(rng, (k, n), tb)
        za, zb_columns = random_operand(rng, (), ta), random_operand(rng, (n,), tb)
        za_rows, zb = random_operand(rng, (m,), ta), random_operand(rng, (1,), tb)
        np.testing.assert_array_equal(module.plain(a, b), expected(a, b), err_msg=f"plain {m}x{k}x{n}")
        np.testing.assert_array_equal(module.zeros(a, b, za, zb_columns), expected(a, b, za, zb_columns))
        np.testing.assert_array_equal(module.rows(a, b, za_rows, zb), expected(a, b, za_rows[:, None], zb))
        np.testing.assert_array_equal(module.literal(a, b), expected(a, b, 100))
        np.testing.assert_array_equal(module.transposed(a, np.ascontiguousarray(b.T)), expected(a, b))
        batch = random_operand(rng, (3, m, k), ta)
        np.testing.assert_array_equal(
            module.batched(batch, b, zb_columns), np.stack([expected(x, b, 0, zb_columns) for x in batch])
        )
        start = rng.integers(-1000, 1000, (m, n)).astype(np.int32)
        out = start.copy()
        module.accumulate(a, b, za, outputs=(out,))
        np.testing.assert_array_equal(out, start + expected(a, b, za))


def every_def_on_the_integer_path(module, sizes=None) -> None:
    for name in module.names:
        kernel = module[name]
        own = None if sizes is None else {s: sizes[s] for s in kernel.definition.sizes}
        assert kernel.stages(own).path == "integer_gemm", name


@builds("native", "avx2", "portable")
@pytest.mark.parametrize("pair", PAIRS)
def test_exact_in_every_branch(cflags, pair):
    """Parametric kernels (one build for every size) in the host's branch, AVX2's and portable C's."""
    module = polyc.define(source(pair), specialize=False, cflags=cflags)
    every_def_on_the_integer_path(module)
    check_pair(module, pair, np.random.default_rng(1))


@pytest.mark.skipif("avx_vnni" not in host().flags, reason="this processor has no AVX-VNNI (the avx_vnni flag)")
@pytest.mark.parametrize("pair", ["u8s8", "s8u8"])
def test_exact_with_avx_vnni(pair):
    """The 256-bit VEX dot product, which machines with AVX-VNNI but no AVX-512 take."""
    module = polyc.define(source(pair), specialize=False, cflags="-O2 -mavx2 -mfma -mavxvnni")
    assert '"avxvnni"' in module.plain.c_source(None)
    check_pair(module, pair, np.random.default_rng(2))


@pytest.mark.parametrize("pair", ["u8s8", "s8s8"])
def test_specialised_sizes(pair):
    """Sizes known when the C is written, one kernel per size (the sizes that end on partial
    blocks and groups)."""
    module = polyc.define(source(pair))
    rng = np.random.default_rng(3)
    check_pair(module, pair, rng, sizes=[(1, 1, 1), (37, 403, 129)])
    every_def_on_the_integer_path(module, {"M": 37, "K": 403, "N": 129, "P": 3})


@builds("native", "avx2", "portable")
def test_saturation_edges(cflags):
    """Operands at the ends of their ranges: every pair of terms 255 x -128 (which 16-bit pair
    sums, as vpmaddubsw's, saturate), -128 x -128, and zero points as far from the values as
    they go; K long enough that the sums need most of int32."""
    source_text = """
def us(uint8(M, K) A, int8(K, N) B, uint8 ZA, int8 ZB) -> (Y) {
    Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * (int32(B(r_k, n)) - int32(ZB))
}
def ss(int8(M, K) A, int8(K, N) B, int8 ZA, int8 ZB) -> (Y) {
    Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA)) * (int32(B(r_k, n)) - int32(ZB))
}
"""
    module = polyc.define(source_text, specialize=False, cflags=cflags)
    m, k, n = 9, 4100, 70  # sums of up to 4100 * 255 * 255: a quarter of int32's range
    for a_value, b_value, za, zb in [(255, -128, 0, 0), (0, 127, 255, -128), (255, 127, 0, -128), (255, -128, 0, 127)]:
        a = np.full((m, k), a_value, np.uint8)
        b = np.full((k, n), b_value, np.int8)
        np.testing.assert_array_equal(module.us(a, b, np.uint8(za), np.int8(zb)), expected(a, b, za, zb))
    for a_value, b_value, za, zb in [(-128, -128, 0, 0), (127, -128, 0, 0), (-128, 127, 127, 0), (127, 127, -128, 0)]:
        a = np.full((m, k), a_value, np.int8)
        b = np.full((k, n), b_value, np.int8)
        np.testing.assert_array_equal(module.ss(a, b, np.int8(za), np.int8(zb)), expected(a, b, za, zb))


def test_batched_operands_and_permuted_target():
    """Batch indices in both operands, a target whose M and N groups are each two indices and
    whose dimensions are permuted, read through the offset tables."""
    text = """
def f(uint8(P, K, M) A, int8(P, Q, K, N) B, uint8(M) ZA) -> (Y) {
    Y(p, n, m, q) +=! (int32(A(p, r_k, m)) - int32(ZA(m))) * int32(B(p, q, r_k, n))
}"""
    module = polyc.define(text, specialize=False)
    assert module.f.stages(None).path == "integer_gemm"
    rng = np.random.default_rng(4)
    a = random_operand(rng, (2, 45, 11), "u8")
    b = random_operand(rng, (2, 3, 45, 20), "s8")
    za = random_operand(rng, (11,), "u8")
    shifted = a.astype(np.int64) - za
    want = np.einsum("pkm,pqkn->pnmq", shifted, b.astype(np.int64))
    np.testing.assert_array_equal(module.f(a, b, za), want.astype(np.int32))


def test_parallel_and_serial_agree_with_threads():
    text = source("u8s8")
    rng = np.random.default_rng(5)
    a, b = random_operand(rng, (300, 520), "u8"), random_operand(rng, (520, 200), "s8")
    for options in (dict(parallel=False), dict(threads=2), dict(threads=3)):
        module = polyc.define(text, specialize=False, **options)
        np.testing.assert_array_equal(module.plain(a, b), expected(a, b), err_msg=str(options))


@pytest.mark.parametrize("products", [2, 9], ids=["rows-shared", "whole-products"])
def test_threads_share_products_or_their_rows(products):
    """Few products: the threads share each one's blocks of rows and B's slivers; at least two
    per thread: whole products."""
    module = polyc.define(source("s8s8"), specialize=False, threads=2)
    rng = np.random.default_rng(10)
    a, b = random_operand(rng, (products, 61, 150), "s8"), random_operand(rng, (150, 90), "s8")
    zb = random_operand(rng, (90,), "s8")
    want = np.stack([expected(x, b, 0, zb) for x in a])
    for _ in range(3):  # the kept workspace, reused
        np.testing.assert_array_equal(module.batched(a, b, zb), want)


_POOL_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import polyc
from test_integer_gemm import check_pair, source
module = polyc.define(source("s8u8"), specialize=False)
for _ in range(3):
    check_pair(module, "s8u8", np.random.default_rng(12), sizes=[(37, 403, 129), (130, 900, 67)])
print("ok")
"""


def test_on_polycs_thread_pool():
    """POLYC_THREADS=pool: the work items run on polyc's thread pool (as on a crowded machine)."""
    from sanitizers import python_environment

    environment = python_environment(POLYC_THREADS="pool", OMP_NUM_THREADS="2")
    result = subprocess.run(
        [sys.executable, "-c", _POOL_SCRIPT, str(TESTS_DIR)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stdout + result.stderr[-3000:]


def test_empty_and_zero_length_reductions():
    module = polyc.define(source("u8s8"), specialize=False)
    a, b = np.zeros((4, 0), np.uint8), np.zeros((0, 3), np.int8)
    np.testing.assert_array_equal(module.plain(a, b), np.zeros((4, 3), np.int32))
    assert module.plain(np.zeros((0, 5), np.uint8), np.zeros((5, 3), np.int8)).shape == (0, 3)


# ----------------------------------------------------------------------------- the recogniser
def _path_of(text: str) -> str:
    definition = check_source(text)[0]
    path, _ = choose_path(PathRequest(definition, polyc.options.Options(), None))
    return path.name


@pytest.mark.parametrize(
    "text",
    [
        # float operands: the float gemm path's
        "def f(float(M, K) A, float(K, N) B) -> (Y) { Y(m, n) +=! A(m, r_k) * B(r_k, n) }",
        # 16-bit operands
        "def f(int16(M, K) A, int8(K, N) B) -> (Y) { Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n)) }",
        # an int64 target
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y) { Y(m, n) +=! int64(A(m, r_k)) * int64(B(r_k, n)) }",
        # a third factor
        "def f(uint8(M, K) A, int8(K, N) B, int8(N) S) -> (Y) "
        "{ Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n)) * int32(S(n)) }",
        # a zero point per K
        "def f(uint8(M, K) A, int8(K, N) B, uint8(K) Z) -> (Y) "
        "{ Y(m, n) +=! (int32(A(m, r_k)) - int32(Z(r_k))) * int32(B(r_k, n)) }",
        # A's zero point per column of B
        "def f(uint8(M, K) A, int8(K, N) B, uint8(N) Z) -> (Y) "
        "{ Y(m, n) +=! (int32(A(m, r_k)) - int32(Z(n))) * int32(B(r_k, n)) }",
        # an added shift
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y) { Y(m, n) +=! (int32(A(m, r_k)) + 3) * int32(B(r_k, n)) }",
        # a maximum, not a sum
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y) { Y(m, n) max=! int32(A(m, r_k)) * int32(B(r_k, n)) }",
        # a shifted subscript
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y) "
        "{ Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n + 1)) where n in 0:N-1 }",
        # an epilogue reading another point of the product
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y, Z) "
        "{ Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))\n Z(m, n) = Y(n, m) * 2 where m in 0:M, n in 0:N }",
        # an epilogue over part of the product
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y, Z) "
        "{ Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))\n Z(m) = Y(m, 0) }",
        # an epilogue that sums
        "def f(uint8(M, K) A, int8(K, N) B) -> (Y, Z) "
        "{ Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))\n Z(m) +=! Y(m, r_n) }",
        # no reduction
        "def f(uint8(M) A, int8(N) B) -> (Y) { Y(m, n) +=! int32(A(m)) * int32(B(n)) }",
        # the innermost target dimension a batch index
        "def f(uint8(M, K, P) A, int8(K, N, P) B) -> (Y) { Y(m, n, p) +=! int32(A(m, r_k, p)) * int32(B(r_k, n, p)) }",
    ],
)
def test_the_recogniser_declines_what_is_not_an_integer_product(text):
    definition = check_source(text)[0]
    assert recognise_integer_gemm_def(definition) is None
    assert _path_of(text) != "integer_gemm"


def test_a_declined_def_still_computes_exactly():
    text = """def f(uint8(M, K) A, int8(K, N) B, uint8(K) Z) -> (Y) {
        Y(m, n) +=! (int32(A(m, r_k)) - int32(Z(r_k))) * int32(B(r_k, n)) }"""
    rng = np.random.default_rng(6)
    a, b, z = random_operand(rng, (9, 13), "u8"), random_operand(rng, (13, 5), "s8"), random_operand(rng, (13,), "u8")
    np.testing.assert_array_equal(polyc.define(text).f(a, b, z), expected(a, b, z[None, :]))


def test_blas_contractions_off_compiles_a_loop_nest():
    module = polyc.define(source("u8s8"), specialize=False, blas_contractions=False)
    assert module.plain.stages(None).path != "integer_gemm"
    rng = np.random.default_rng(7)
    a, b = random_operand(rng, (5, 9), "u8"), random_operand(rng, (9, 4), "s8")
    np.testing.assert_array_equal(module.plain(a, b), expected(a, b))


def test_explanation_names_the_path_and_the_blocks():
    module = polyc.define(source("u8s8"), specialize=False)
    sizes = {"M": 8, "K": 8, "N": 8}
    text = str(module.zeros.explain(sizes))
    assert "integer_gemm path" in text and "integer matrix product" in text
    # The block of the instruction set the build runs, as the code generator printed it.
    stages = module.zeros.stages(sizes)
    isa = built_for(stages, INTEGER_DOT_PRODUCT_SETS)
    block = next(b for b in stages.kernel.decisions["register_blocks"] if b["isa"] == isa)
    assert f"built for {isa}" in text
    assert f"register block ({isa}): {block['mr']} x {block['nr']} int32 sums, K in groups of {block['group']}" in text
    assert f"MC={block['mc']}, KC={block['kc']}" in text


# ----------------------------------------------------------------------------- sanitizers
_SANITIZED_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import polyc
from test_integer_gemm import check_pair, source
for flags in sys.argv[2:]:
    for pair in ("u8s8", "s8u8"):
        module = polyc.define(source(pair), specialize=False, cflags=tuple(flags.split()))
        check_pair(module, pair, np.random.default_rng(8), sizes=[(1, 1, 1), (7, 9, 70), (37, 403, 129)])
    print("checked", flags.split()[-1], flush=True)
"""


def test_sanitized(tmp_path):
    """Every branch x86 builds (the host's, AVX2 and portable C), under AddressSanitizer and
    UBSan: no read or write outside the tensors, no signed overflow in the corrections."""
    flag_sets = [
        "-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -march=native",
        "-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -mavx2",
        "-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -O1",
    ]
    result = run_sanitized(_SANITIZED_SCRIPT, str(TESTS_DIR), *flag_sets, cache_dir=tmp_path, timeout=900)
    assert_clean(result)
    assert result.stdout.split() == [w for flags in flag_sets for w in ("checked", flags.split()[-1])], result.stdout


# ----------------------------------------------------------------------------- NEON under qemu
def _neon_run(tmp_path, text: str, calls, extra_flags: tuple[str, ...]) -> list[np.ndarray]:
    """Export the parametric def for neon (plus ``extra_flags``), run each call's inputs under
    qemu with two threads, and return each call's output."""
    from test_neon import QEMU, multi_call_harness

    from polyc.runtime.targets import export_c
    from polyc.target import TARGETS

    module = polyc.define(text, specialize=False)
    kernel = module[module.names[0]]
    stages = kernel.stages(None)
    assert stages.path == "integer_gemm"
    exported = export_c(stages, "neon")
    exported.write(tmp_path)
    definition = kernel.definition
    for position, inputs in enumerate(calls):
        bound = bind_arguments(definition, inputs, None)
        arrays = {
            t.name: bound.arrays.get(t.name, np.zeros(t.concrete_shape(bound.sizes), t.dtype))
            for t in definition.tensors
        }
        meta = [bound.sizes[s] for s in stages.kernel.size_arguments]
        meta += [arrays[name].size for name in stages.kernel.tensor_arguments]
        (tmp_path / f"{position}.meta.bin").write_bytes(np.asarray(meta, np.int64).tobytes())
        for name, array in arrays.items():
            (tmp_path / f"{position}.{name}.bin").write_bytes(np.ascontiguousarray(array).tobytes())
    (tmp_path / "main.c").write_text(multi_call_harness(stages, f"{exported.name}.h"))
    neon = TARGETS["neon"]
    commands = [
        [neon.cc, *neon.build_flags(), *extra_flags, "-Wall", "-Werror", "-c", f"{exported.name}.c", "-o", "kernel.o"],
        neon.compile_command(["main.c", "kernel.o"], "main", "-static", *extra_flags),
    ]
    for command in commands:
        built = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
        assert built.returncode == 0, f"{' '.join(command)} failed:\n{built.stderr}"
    run = [QEMU, "-cpu", "max", str(tmp_path / "main"), str(tmp_path), str(len(calls))]
    ran = subprocess.run(run, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert ran.returncode == 0 and ran.stdout.split() == ["0"] * len(calls), ran.stderr[-3000:]
    results = []
    for position, inputs in enumerate(calls):
        sizes = bind_arguments(definition, inputs, None).sizes
        tensor = definition.tensor(definition.outputs[0])
        got = np.fromfile(tmp_path / f"{position}.{tensor.name}.out", dtype=tensor.dtype)
        results.append(got.reshape(tensor.concrete_shape(sizes)))
    return results


def _needs_qemu():
    from test_neon import AARCH64_CC, QEMU

    if AARCH64_CC is None or QEMU is None:
        pytest.skip("aarch64 cross compiler or qemu-aarch64 absent (Debian: gcc-aarch64-linux-gnu, qemu-user)")


@pytest.mark.parametrize("extra_flags", [(), ("-march=armv8.2-a+dotprod",)], ids=["neon-int16", "neon-dotprod"])
@pytest.mark.parametrize("pair", ["u8s8", "s8u8"])
def test_neon_under_qemu(tmp_path, extra_flags, pair):
    """NEON without the dot product (smlal on int16) and with it (sdot, each unsigned operand
    sign-flipped and corrected), cross-compiled and run under qemu."""
    _needs_qemu()
    ta, tb = TYPES[pair[:2]][0], TYPES[pair[2:]][0]
    text = f"""def zeros({ta}(M, K) A, {tb}(K, N) B, {ta}(M) ZA, {tb}(N) ZB) -> (Y) {{
        Y(m, n) +=! (int32(A(m, r_k)) - int32(ZA(m))) * (int32(B(r_k, n)) - int32(ZB(n))) }}"""
    rng = np.random.default_rng(9)
    calls, wanted = [], []
    for m, k, n in [(1, 1, 1), (9, 7, 13), (8, 64, 12), (37, 403, 129), (17, 2100, 25)]:
        a, b = random_operand(rng, (m, k), pair[:2]), random_operand(rng, (k, n), pair[2:])
        za, zb = random_operand(rng, (m,), pair[:2]), random_operand(rng, (n,), pair[2:])
        calls.append((a, b, za, zb))
        wanted.append(expected(a, b, za[:, None], zb))
    for got, want in zip(_neon_run(tmp_path, text, calls, extra_flags), wanted, strict=True):
        np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- epilogues
#: A requantization of the product into uint8 (a per-row scale and int32 bias, a zero point,
#: halves rounded to even, saturated), as ONNX's QLinearConv computes it, the rows and columns
#: of the output swapped; then the uint8 value dequantized into float.
REQUANTIZED = """
def requantized(int8(F, K) W, uint8(K, B, P) X, int8(F) ZW, uint8(1) ZX, float(F) S, int32(F) BIAS, uint8(1) ZY)
        -> (Y, D) {
    T(f, b, p) +=! (int32(W(f, r_k)) - int32(ZW(f))) * (int32(X(r_k, b, p)) - int32(ZX(0)))
    Y(i0, i1, i2) = uint8(fmin(fmax(rint(float(T(i1, i0, i2) + BIAS(i1)) * S(i1)) + float(ZY(0)), 0.0), 255.0))
    D(i0, i1, i2) = (float(Y(i0, i1, i2)) - float(ZY(0))) * 0.5
}
def images(int8(F, K) W, uint8(K, B, H, V) X, float(F) S, uint8(B, F, H, V) R) -> (Y) {
    T(f, b, h, w) +=! int32(W(f, r_k)) * int32(X(r_k, b, h, w))
    Y(i0, i1, i2, i3) = uint8(fmin(fmax(rint(float(T(i1, i0, i2, i3)) * S(i1)), 0.0), 255.0))
    Y(i0, i1, i2, i3) = uint8(fmin(float(Y(i0, i1, i2, i3)) + float(R(i0, i1, i2, i3)), 255.0))
}
def biased(uint8(M, K) A, int8(K, N) B, int32(N) BIAS) -> (Y) {
    Y(m, n) +=! int32(A(m, r_k)) * int32(B(r_k, n))
    Y(m, n) = Y(m, n) + BIAS(n)
}
"""


def _requantized_expected(w, x, zw, zx, scale, bias, zy):
    sums = np.einsum("fk,kbp->fbp", w.astype(np.int64) - zw[:, None], x.astype(np.int64) - zx[0])
    scaled = (sums + bias[:, None, None]).astype(np.float32) * scale[:, None, None]
    y = np.clip(np.rint(scaled) + np.float32(zy[0]), 0, 255).astype(np.uint8).transpose(1, 0, 2)
    return y, (y.astype(np.float32) - np.float32(zy[0])) * np.float32(0.5)


@builds("native", "avx2", "portable")
@pytest.mark.parametrize("specialize", [False, True])
def test_epilogues_requantize_each_block(cflags, specialize):
    """Statements after the product that write other tensors of its points (a requantization
    with the output's axes swapped, a dequantization of that) are the integer kernel's
    epilogues: one kernel, exact, saturating at both ends, over sizes that end on partial
    blocks, several K blocks and several images."""
    module = polyc.define(REQUANTIZED, specialize=specialize, cflags=cflags)
    rng = np.random.default_rng(7)
    for f, k, b, p in [(1, 1, 1, 1), (13, 21, 1, 17), (70, 403, 3, 77), (6, 900, 2, 64)]:
        kernel = module.requantized
        assert kernel.stages({"F": f, "K": k, "B": b, "P": p}).path == "integer_gemm"
        w, x = random_operand(rng, (f, k), "s8"), random_operand(rng, (k, b, p), "u8")
        zw, zx = random_operand(rng, (f,), "s8"), np.array([rng.integers(0, 256)], np.uint8)
        # scales that put the sums across the whole uint8 range and beyond it at both ends
        # (a sum's standard deviation is about 74 * 74 * sqrt(k): scaled, about 270)
        scale = (rng.uniform(0.5, 2.0, f) / (20 * np.sqrt(k))).astype(np.float32)
        bias = rng.integers(-5000, 5000, f).astype(np.int32)
        zy = np.array([rng.integers(0, 256)], np.uint8)
        y, d = kernel(w, x, zw, zx, scale, bias, zy)
        want_y, want_d = _requantized_expected(w, x, zw, zx, scale, bias, zy)
        np.testing.assert_array_equal(y, want_y, err_msg=f"{f}x{k}x{b}x{p}")
        np.testing.assert_array_equal(d, want_d)
        if f * b * p > 100:
            assert {0, 255} <= set(np.unique(y)), "the test should saturate at both ends"


@pytest.mark.parametrize("specialize", [False, True])
def test_epilogues_over_images_of_rows_and_columns(specialize):
    """A convolution's product (filters x images x rows x columns) requantized into NCHW, then a
    residual added in place: the epilogue runs along each image's rows and columns as one run."""
    module = polyc.define(REQUANTIZED, specialize=specialize)
    rng = np.random.default_rng(9)
    for f, k, b, h, v in [(1, 1, 1, 1, 1), (13, 21, 2, 7, 7), (70, 403, 3, 5, 9)]:
        assert module.images.stages({"F": f, "K": k, "B": b, "H": h, "V": v}).path == "integer_gemm"
        w, x = random_operand(rng, (f, k), "s8"), random_operand(rng, (k, b, h, v), "u8")
        scale = (rng.uniform(0.5, 2.0, f) / (20 * np.sqrt(k))).astype(np.float32)
        residual = random_operand(rng, (b, f, h, v), "u8")
        sums = np.einsum("fk,kbhv->bfhv", w.astype(np.int64), x.astype(np.int64))
        y = np.clip(np.rint(sums.astype(np.float32) * scale[None, :, None, None]), 0, 255)
        want = np.minimum(y + residual, 255).astype(np.uint8)
        np.testing.assert_array_equal(module.images(w, x, scale, residual), want, err_msg=f"{f}x{k}x{b}x{h}x{v}")


def test_an_epilogue_updating_the_product_in_place():
    module = polyc.define(REQUANTIZED, specialize=False)
    rng = np.random.default_rng(8)
    a, b = random_operand(rng, (37, 403), "u8"), random_operand(rng, (403, 129), "s8")
    bias = rng.integers(-1000, 1000, 129).astype(np.int32)
    assert module.biased.stages({"M": 37, "K": 403, "N": 129}).path == "integer_gemm"
    np.testing.assert_array_equal(module.biased(a, b, bias), expected(a, b) + bias)


def test_epilogues_are_described_and_explained():
    definition = check_source(REQUANTIZED)[0]
    contraction = recognise_integer_gemm_def(definition)
    assert contraction is not None
    assert [e.statement.target for e in contraction.epilogues] == ["Y", "D"]
    assert dict(contraction.epilogues[0].points) == {"i0": "b", "i1": "f", "i2": "p"}
    assert contraction.describe() == "T = (W - ZW) * (X - ZX): int8 x uint8 -> int32, batch=() M=(f) N=(b, p) K=(r_k)"
    explanation = str(polyc.define(REQUANTIZED).requantized.explain({"F": 64, "K": 576, "B": 1, "P": 3136}))
    assert "on each block of rows of the int32 sums once final" in explanation
    assert "Y(i0, i1, i2) = uint8(" in explanation
