"""The dedicated kernel paths explain themselves with the choices their code generator made
(issue 84): every number an explanation names is the one the generator recorded
(:attr:`polyc.codegen.pattern_kernel.DedicatedKernel.decisions`), nothing is read from the C
text, and ``plot_domain`` on such a path draws no loops that never run (on the gemm path, the
kernel's own cache blocks)."""

from __future__ import annotations

import dataclasses

import pytest

import polyc
from polyc.driver import compile_stages
from polyc.paths import gemm as gemm_path
from polyc.paths.explaining import built_for
from polyc.target import INSTRUCTION_SETS
from polyc.viz.explain import _explain_stages
from tests.viz.sources import MATMUL

NHWC = """def conv(float(N, H, W, C) I, float(KH, KW, C, F) W1) -> (O) {
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
}"""
DEPTHWISE = """def conv(float(N, H, W, C) I, float(KH, KW, C) W1) -> (O) {
    O(n, h, w, c) +=! I(n, h + r_kh, w + r_kw, c) * W1(r_kh, r_kw, c)
}"""
MATVEC = "def mv(float(M, K) A, float(K) x) -> (y) { y(m) +=! A(m, r_k) * x(r_k) }"
CONV_SIZES = {"N": 1, "H": 18, "W": 18, "C": 32, "F": 32, "KH": 3, "KW": 3}


def explained(kernel, sizes):
    """The explanation's text, the stages, and the recorded decisions."""
    stages = kernel.stages(sizes)
    return str(kernel.explain(sizes)), stages, stages.kernel.decisions


def test_gemm_names_its_register_block_cache_blocks_and_where_they_came_from():
    kernel = polyc.define(MATMUL).mm
    sizes = {"M": 256, "K": 256, "N": 256}
    text, stages, decisions = explained(kernel, sizes)
    assert stages.path == "gemm" and decisions["kernel"] == "gemm"
    blocks = gemm_path.cache_blocks(stages)
    assert blocks["isa"] == built_for(stages) and f"built for {blocks['isa']}" in text
    assert (
        f"register block (micro-kernel, MR x NR accumulators in vector registers): {blocks['mr']} x {blocks['nr']}"
        in text
    )
    assert f"MC={blocks['mc']} rows, NC={blocks['nc']} columns, KC={blocks['kc']} steps" in text
    assert "from polyc's cache model" in text and "packing, in every call" in text
    assert f"{256**3} multiply-adds, at least {decisions['parallel_threshold']}" in text

    given = polyc.define(MATMUL, gemm_blocks=(48, 128, 64)).mm
    text, stages, _ = explained(given, sizes)
    blocks = gemm_path.cache_blocks(stages)
    assert (blocks["mc"], blocks["nc"], blocks["kc"]) == (48, 128, 64)
    assert "MC=48 rows, NC=128 columns, KC=64 steps" in text and "from the option gemm_blocks=[48, 128, 64]" in text


def test_gemm_blocks_from_a_tuning_record_are_named_so():
    """Blocks in the compiled options that the user did not give came from a tuning record."""
    kernel = polyc.define(MATMUL).mm
    sizes = {"M": 64, "K": 64, "N": 64}
    tuned = kernel.options.replace(gemm_blocks=(24, 128, 32))
    stages = compile_stages(kernel.definition, tuned, sizes, None, kernel.options)
    text = str(_explain_stages("mm", stages, sizes))
    assert "from a tuning record (gemm_blocks=[24, 128, 32]" in text
    blocks = gemm_path.cache_blocks(stages)
    assert f"MC={blocks['mc']} rows, NC={blocks['nc']} columns, KC={blocks['kc']} steps" in text


def test_portable_build_is_explained_with_the_portable_block():
    kernel = polyc.define(MATMUL, vectorize=False).mm
    text, stages, decisions = explained(kernel, {"M": 64, "K": 64, "N": 64})
    portable = next(b for b in decisions["register_blocks"] if b["isa"] == "portable")
    assert "built for portable (vectorize=False selects the portable code)" in text
    assert f"{portable['mr']} x {portable['nr']}" in text and f"MC={portable['mc']} rows" in text


def test_winograd_names_its_tiles_channels_and_register_block():
    kernel = polyc.define(NHWC, winograd=True).conv
    text, stages, decisions = explained(kernel, CONV_SIZES)
    assert stages.path == "winograd" and decisions["transform"] == "F(2x2, 3x3)"
    assert decisions["tiles"] == 64  # 16 x 16 outputs in tiles of 2 x 2
    assert f"{decisions['tiles']} tiles of 2 x 2 outputs" in text and "why Winograd" in text
    isa = built_for(stages)
    block = decisions["register_blocks"][isa]
    assert f"register block ({isa}): {block['tiles']} tiles x {block['vectors']} vectors of {block['lanes']}" in text
    half, _ = decisions["tiles_per_chunk"]
    assert f"chunks of at most {half} tiles" in text


def test_direct_convolution_says_why_not_winograd_and_names_its_blocks():
    off = polyc.define(NHWC).conv
    text, stages, decisions = explained(off, CONV_SIZES)
    assert stages.path == "direct_convolution"
    assert (
        "why direct, not Winograd: the option winograd is off (with winograd=True the Winograd kernel would take it)"
        in text
    )
    assert "output channels innermost (channels-last, NHWC): vectorised along the output channels" in text
    isa = built_for(stages)
    block = decisions["register_blocks"][isa]
    assert f"register block ({isa}): {block['channels']} output channels x {block['points']} points" in text

    odd_channels = polyc.define(NHWC, winograd=True).conv
    text, stages, decisions = explained(odd_channels, dict(CONV_SIZES, C=24))
    assert stages.path == "direct_convolution"
    assert decisions["not_winograd"].startswith("its 24 input and 32 output channels are not both multiples of 16")
    assert "why direct, not Winograd: its 24 input and 32 output channels" in text

    nchw = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw) }"""
    text, stages, decisions = explained(polyc.define(nchw, conv_block=16).conv, CONV_SIZES)
    assert decisions["vectorised"] == "output points" and decisions["chunk_blocks"] == 16 // 4
    assert "vectorised along the output points, rows flattened" in text
    assert "4 register blocks of output channels per work item (conv_block=16)" in text
    assert "its layout is not channels-last" in text


def test_depthwise_names_its_lanes_and_blocks_of_outputs():
    kernel = polyc.define(DEPTHWISE).conv
    text, stages, decisions = explained(kernel, {"N": 1, "H": 10, "W": 10, "C": 32, "KH": 3, "KW": 3})
    assert stages.path == "depthwise" and decisions["taps"] == (3, 3)
    isa = built_for(stages)
    block = decisions["register_blocks"][isa]
    outputs = " then ".join(map(str, block["row_blocks"]))
    assert f"block of outputs ({isa}): vectors of {block['lanes']} channels" in text
    assert f"blocks of {outputs} along the row" in text and "3 x 3 taps" in text


def test_gemv_names_its_vectors_and_blocks():
    kernel = polyc.define(MATVEC).mv
    text, stages, decisions = explained(kernel, {"M": 64, "K": 64})
    assert stages.path == "gemv"
    lanes = decisions["row_lanes"][built_for(stages)]
    assert f"vectors of {lanes} elements" in text
    assert (
        f"blocks of {decisions['sum_block']} columns" in text
        and f"{decisions['column_block']} columns at a time" in text
    )
    assert "threads: one: 4096 multiply-adds are fewer than 65536" in text


TRANSPOSE = "def t(float(N, C, H, W) A) -> (O) { O(n, h, w, c) = A(n, c, h, w) }"
TRANSPOSE_SIZES = {"N": 2, "C": 100, "H": 20, "W": 20}
SEGMENTS = """def seg(double a, double(M, N) C, double(M, K) A, double(K, N) B) -> (D) {
    D(i, j) = 2 * C(i, j)
    D(i, j) += a * A(i, r_k) * B(r_k, j)
    D(i, j) = fmax(D(i, j), 0.0)
}"""
SEGMENTS_SIZES = {"M": 64, "N": 64, "K": 64}
SPLIT_SUM = """def syr(float(N, M) A, float(N, M) B) -> (O) {
    O(i, j) +=! (i >= j) ? A(r_k, i) * B(r_k, j) + B(r_k, i) * A(r_k, j) : 0
    O(i, j) = fmax(O(i, j), 0.0)
}"""
POINTWISE_DEPTHWISE = """def blk(float(1, 14, 14, 8) X, float(1, 1, 8, 48) W1, float(48) B1, float(3, 3, 48) W2) -> (O) {
    T(n, h, w, f) +=! X(n, h + r_k0, w + r_k1, r_c) * W1(r_k0, r_k1, r_c, f) where r_k0 in 0:1, r_k1 in 0:1
    T(n, h, w, f) = fmax(T(n, h, w, f) + B1(f), 0.0)
    O(n, h, w, c) +=! (h + r_kh - 1 >= 0 && w + r_kw - 1 >= 0 && h + r_kh - 1 < 14 && w + r_kw - 1 < 14) ? T(n, h + r_kh - 1, w + r_kw - 1, c) * W2(r_kh, r_kw, c) : 0.0
        where h in 0:14, w in 0:14, r_kh in 0:3, r_kw in 0:3
}"""


def test_transpose_names_its_planes_tiles_and_register_transpose():
    kernel = polyc.define(TRANSPOSE).t
    text, stages, decisions = explained(kernel, TRANSPOSE_SIZES)
    assert stages.path == "transpose" and decisions["kernel"] == "transpose"
    # NCHW -> NHWC: H and W move together; each plane is C rows x (H W) columns, one per image.
    assert decisions["groups"] == ((0,), (1,), (2, 3)) and decisions["order"] == (0, 2, 1)
    assert decisions["rows"] == (1,) and decisions["columns"] == (2, 3)
    assert decisions["extents"] == (2, 100, 400) and decisions["planes"] == 2
    assert decisions["tiles"] == 2 * 2 * 7  # ceil(100 / 64) x ceil(400 / 64) tiles a plane
    assert "each plane of 100 x 400: its rows are the input's dimension 1" in text
    assert "columns the input's dimensions 2, 3 merged" in text
    assert f"2 plane(s), one per value of the other dimensions; cut into tiles of {decisions['tile']} x" in text
    assert "28 tiles in all" in text
    isa = built_for(stages, {n: INSTRUCTION_SETS[n] for n in decisions["instruction_sets"]})
    block = decisions["register_blocks"][isa]
    if block is not None:
        assert f"inside a tile ({isa}): blocks of {block} x {block} elements of 4 bytes" in text
    else:
        assert f"inside a tile ({isa}): one element at a time" in text
    assert f"threads: 80000 elements moved, at least {decisions['parallel_threshold']}" in text

    small = polyc.define(TRANSPOSE, threads=1).t
    text, _, _ = explained(small, dict(TRANSPOSE_SIZES, N=1, C=8))
    assert "threads: one: 3200 elements moved are fewer than" in text


def test_segments_name_each_segment_its_path_and_why():
    kernel = polyc.define(SEGMENTS).seg
    text, stages, decisions = explained(kernel, SEGMENTS_SIZES)
    assert stages.path == "segments" and [s["kind"] for s in decisions["segments"]] == ["generic", "gemm"]
    assert [part.path for part in stages.segments] == ["generic", "gemm"]
    assert "it runs as 2 segments in order" in text
    assert (
        "segment 0 (generic path): `D(i, j) = 2 * C(i, j)`: no contraction worth a BLIS kernel (not a contraction)"
        in text
    )
    assert (
        "segment 1 (gemm path): `D(i, j) += a * A(i, r_k) * B(r_k, j)`; `D(i, j) = fmax(D(i, j), 0.0)`: a contraction"
        in text
    )
    assert decisions["segments"][1]["contraction"] in text and "one statement per product" not in text

    text, stages, decisions = explained(polyc.define(SPLIT_SUM).syr, {"N": 32, "M": 48})
    assert [part.path for part in stages.segments] == ["gemm", "gemm"] and decisions["split_statements"] == 1
    assert "(term 1 of 2)" in text and "(term 2 of 2)" in text
    assert "became one statement per product" in text


def test_pointwise_depthwise_names_its_ring_register_blocks_and_work_items():
    kernel = polyc.define(POINTWISE_DEPTHWISE).blk
    text, stages, decisions = explained(kernel, {})
    assert stages.path == "pointwise_depthwise" and decisions["kernel"] == "pointwise_depthwise"
    assert decisions["temporary"] == "T" and decisions["expanded_channels"] == 48 and decisions["ring_rows"] == 3
    assert "never stores T (48 channels)" in text and "into a ring buffer of 3 rows" in text
    isa = built_for(stages)
    pointwise = decisions["pointwise_blocks"][isa]
    if pointwise["lanes"] is not None:
        assert (
            f"1x1 rows ({isa}): register blocks of {pointwise['pixels']} pixels x {pointwise['vectors']} vectors of "
            f"{pointwise['lanes']} channels" in text
        )
    assert "its epilogues applied to the accumulators" in text  # bias + relu: in registers
    block = decisions["register_blocks"][isa]
    assert f"block of outputs ({isa}): vectors of {block['lanes']} channels" in text
    assert f"blocks of at least {decisions['block_channels']} channels" in text


@pytest.mark.parametrize(
    "source, sizes, options",
    [
        (TRANSPOSE, TRANSPOSE_SIZES, {}),
        (SEGMENTS, SEGMENTS_SIZES, {}),
        (POINTWISE_DEPTHWISE, {}, {}),
        (MATMUL, {"M": 64, "K": 64, "N": 64}, {}),
        (NHWC, CONV_SIZES, {"winograd": True}),
        (NHWC, CONV_SIZES, {}),
        (DEPTHWISE, {"N": 1, "H": 10, "W": 10, "C": 32, "KH": 3, "KW": 3}, {}),
        (MATVEC, {"M": 64, "K": 64}, {}),
    ],
)
def test_explanations_do_not_read_the_c_text(source, sizes, options):
    """The same explanation from stages whose kernel has no C text at all."""
    kernel = getattr(polyc.define(source, **options), source.split()[1].split("(")[0])
    stages = kernel.stages(sizes)
    blank = dataclasses.replace(stages, kernel=dataclasses.replace(stages.kernel, source=""))
    name = kernel.definition.name
    assert str(_explain_stages(name, blank, sizes)) == str(_explain_stages(name, stages, sizes))


def test_plot_domain_on_the_gemm_path_draws_its_cache_blocks_not_the_schedules_tiles():
    pytest.importorskip("matplotlib")
    from polyc.viz import plot_domain

    kernel = polyc.define(MATMUL, gemm_blocks=(12, 64, 2)).mm
    sizes = {"M": 24, "N": 128, "K": 4}
    stages = kernel.stages(sizes)
    assert stages.path == "gemm" and any(d.tile_sizes for d in stages.decisions)  # the unused loop nest is tiled
    blocks = gemm_path.cache_blocks(stages)
    plot = plot_domain(kernel, sizes, dims=("m", "n"), tiles=True, order=True, parallel=True)
    instances = plot.instances
    assert "runs on the gemm path" in plot.title and "tiles are the kernel's cache blocks" in plot.title
    assert instances.order == {} and instances.parallel == {}
    assert instances.tile_sizes == (blocks["mc"], blocks["nc"], blocks["kc"]) == (12, 64, 2)
    for (statement, point), tile in instances.tile.items():
        value = dict(zip(stages.program.statement(statement).indices, point))
        assert tile[:2] == (value["m"] // 12, value["n"] // 64)
    assert {tile[:2] for tile in instances.tile.values()} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert plot.figure is not None  # it draws


def test_plot_domain_on_another_dedicated_path_draws_no_tiles():
    pytest.importorskip("matplotlib")
    from polyc.viz import plot_domain

    kernel = polyc.define(DEPTHWISE).conv
    plot = plot_domain(kernel, {"N": 1, "H": 4, "W": 4, "C": 4, "KH": 3, "KW": 3}, tiles=True, order=True)
    assert "runs on the depthwise path" in plot.title and "nor tiles" in plot.title
    assert plot.instances.tile == {} and plot.instances.order == {}
