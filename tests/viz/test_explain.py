"""kernel.explain(sizes) and kernel.check_schedule(schedule): the right reason on each kernel,
checked against the decision polyc took (its recorded band decisions and the pragmas in the
generated C) and against the dependence relation (every witness is a pair in it)."""

from __future__ import annotations

import dataclasses

import islpy as isl
import pytest

import polyc
from polyc.viz.explain import Explanation
from tests.viz.sources import MATMUL, SHIFTED  # noqa: E402

ROWSUM = "def rowsum(float(M, N) A) -> (B) { B(m) +=! A(m, r_n) }"
SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
    M(n) max=! X(n, r_d)
    S(n) +=! exp(X(n, r_d) - M(n))
    Y(n, d) = exp(X(n, d) - M(n)) / S(n)
}"""


def explained(source: str, sizes: dict, **options) -> tuple[Explanation, object]:
    module = polyc.define(source, **options)
    kernel = module[module.names[0]]
    return kernel.explain(sizes), kernel.stages(sizes)


def assert_witness_is_a_dependence(explanation: Explanation, stages, sizes: dict) -> int:
    """Every witness is a pair of the dependence relation of its kind, at these sizes."""
    program = stages.program
    checked = 0
    for loop in explanation.loops:
        w = loop.witness
        if w is None:
            continue
        source = ", ".join(str(v) for v in w.source_instance.values())
        sink = ", ".join(str(v) for v in w.sink_instance.values())
        pair = isl.UnionMap.read_from_str(program.ctx, f"{{ {w.source}[{source}] -> {w.sink}[{sink}] }}")
        relation = getattr(stages.dependences, w.kind)
        params = ", ".join(program.params)
        fixed = " and ".join(f"{p} = {sizes[p]}" for p in program.params)
        pair = pair.align_params(relation.get_space())
        if params:
            fixed_sizes = isl.Set.read_from_str(program.ctx, f"[{params}] -> {{ : {fixed} }}")
            relation, pair = relation.intersect_params(fixed_sizes), pair.intersect_params(fixed_sizes)
        assert pair.is_subset(relation), f"{w.describe()} is not a {w.kind} dependence"
        checked += 1
    return checked


def pragmas(stages) -> str:
    return "\n".join(
        line.strip() for line in stages.kernel.source.splitlines() if line.strip().startswith("#pragma omp")
    )


def test_matmul_loop_nest_parallel_rows_reduction_inside():
    sizes = {"M": 16, "K": 8, "N": 12}
    e, stages = explained(MATMUL, sizes, blas_contractions=False, register_tiles=())
    assert e.path == "generic"
    m, n, r = e.loop("m"), e.loop("n"), e.loop("r_k")
    # 2 tiles of 8 rows: OpenMP shares out the tiles and their rows together (collapse(2)).
    assert m.parallel and m.parallel_how == "parallel for, collapse(2)" and not n.parallel and not r.parallel
    assert "omp parallel for collapse(2)" in pragmas(stages)
    assert r.witness is not None and r.witness.kind == "reduction" and r.witness.element.startswith("C(")
    assert r.witness.distance[-1] != 0 and r.witness.distance[:2] == (0, 0)
    assert "the loop over m around it is parallel" in " ".join(n.reasons)
    assert assert_witness_is_a_dependence(e, stages, sizes) >= 1


def test_negative_control_a_made_up_witness_is_not_a_dependence():
    """The check every witness test leans on rejects pairs that are not dependences: the real pair
    backwards, a pair of two different elements of C, and one past the reduction's end at K = 8."""
    sizes = {"M": 16, "K": 8, "N": 12}
    e, stages = explained(MATMUL, sizes, blas_contractions=False)
    real = e.loop("r_k").witness
    assert (real.source_instance, real.sink_instance) == ({"m": 0, "n": 0, "r_k": 0}, {"m": 0, "n": 0, "r_k": 1})
    made_up = [
        dataclasses.replace(real, source_instance=real.sink_instance, sink_instance=real.source_instance),
        dataclasses.replace(real, sink_instance={"m": 0, "n": 1, "r_k": 1}),
        dataclasses.replace(real, source_instance={"m": 0, "n": 0, "r_k": 7}, sink_instance={"m": 0, "n": 0, "r_k": 8}),
    ]
    for witness in made_up:
        loops = [dataclasses.replace(loop, witness=witness) if loop.witness is real else loop for loop in e.loops]
        with pytest.raises(AssertionError, match="is not a reduction dependence"):
            assert_witness_is_a_dependence(dataclasses.replace(e, loops=loops), stages, sizes)
    assert assert_witness_is_a_dependence(e, stages, sizes) == 1


def test_a_contraction_goes_to_the_gemm_kernel():
    e, stages = explained(MATMUL, {"M": 64, "K": 64, "N": 64})
    assert e.path == stages.path == "gemm" and stages.contraction is not None
    assert "gemm" in " ".join(e.summary) and "blas_contractions=False" in " ".join(e.summary)


def test_matrix_vector_and_convolution_paths():
    e, stages = explained(
        "def mv(float(M, K) A, float(K) x) -> (y) { y(m) +=! A(m, r_k) * x(r_k) }", {"M": 64, "K": 64}
    )
    assert e.path == stages.path == "gemv" and stages.contraction.is_matvec
    conv = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw) }"""
    e, stages = explained(conv, {"N": 1, "C": 2, "H": 6, "W": 6, "F": 3, "KH": 3, "KW": 3})
    assert e.path == stages.path == "direct_convolution" and stages.convolution is not None


def test_row_sum_parallel_rows_simd_reduction():
    sizes = {"M": 16, "N": 8}
    e, stages = explained(ROWSUM, sizes)
    m, r = e.loop("m"), e.loop("r_n")
    assert m.parallel and r.vectorised and "simd reductions (+:B)" in " ".join(r.reasons)
    assert any("simd" in p for p in pragmas(stages).splitlines())
    assert r.witness.kind == "reduction" and assert_witness_is_a_dependence(e, stages, sizes) == 1


def test_a_total_is_a_parallel_reduction():
    e, stages = explained("def total(float(N) A) -> (B) { B(z) +=! A(r) where z in 0:1 }", {"N": 100})
    loop = e.loop("r")
    assert loop.parallel and loop.parallel_how == "parallel reduction (+:B)"
    assert "reduction(polyc_sum_float32:" in pragmas(stages)


def test_a_float_max_is_not_an_openmp_reduction_because_of_nan():
    sizes = {"N": 100}
    e, stages = explained("def top(float(N) A) -> (B) { B(z) max=! A(r) where z in 0:1 }", sizes)
    loop = e.loop("r")
    assert not loop.parallel and "NaN" in " ".join(loop.reasons)
    assert stages.decisions[0].parallel is None and "omp parallel" not in pragmas(stages)
    assert loop.witness.kind == "reduction" and assert_witness_is_a_dependence(e, stages, sizes) == 1


def test_an_integer_max_is_an_openmp_reduction():
    e, stages = explained("def top(int32(N) A) -> (B) { B(z) max=! A(r) where z in 0:1 }", {"N": 100})
    assert e.loop("r").parallel_how == "parallel reduction (max:B)"


def test_softmax_row_reductions():
    sizes = {"N": 64, "D": 96}
    e, stages = explained(SOFTMAX, sizes)
    assert e.path == "generic"
    rows = [loop for loop in e.loops if loop.index == "n"]
    assert rows and all(loop.parallel for loop in rows[:1])
    inner = [loop for loop in e.loops if loop.index == "r_d"]
    assert inner and any(loop.vectorised for loop in inner)
    assert any("max:M" in r for loop in inner for r in loop.reasons)
    assert_witness_is_a_dependence(e, stages, sizes)


def test_too_little_work_stays_on_the_calling_thread():
    # 8 rows of 16: fewer statement instances than starting threads is worth; the loop over
    # the rows keeps its place and says why it is not parallel.
    e, stages = explained(SOFTMAX, {"N": 8, "D": 16})
    rows = [loop for loop in e.loops if loop.index == "n"]
    assert rows and not rows[0].parallel
    assert any("too little work for threads: 400 statement instances" in r for r in rows[0].reasons)
    assert "omp parallel" not in stages.kernel.source


def test_fusion_min_keeps_statements_apart():
    e, stages = explained(SOFTMAX, {"N": 8, "D": 16}, fusion="min")
    nests = [d for d in stages.decisions if d.depth == 0]
    assert len(nests) >= 3
    assert "fusion='min' keeps every statement in a loop nest of its own" in " ".join(e.summary)


def test_fusion_with_a_shift():
    e, stages = explained(SHIFTED, {"N": 32}, fusion="max")
    fused = [d for d in stages.decisions if {"S0", "S1"} <= set(d.statements)]
    assert fused, "fusion='max' fuses the two statements"
    assert any("shift" in line for line in e.summary)
    assert any("fused: statements S0, S1" in r for loop in e.loops for r in loop.reasons)


def test_options_that_switch_things_off_are_named():
    sizes = {"M": 16, "N": 8}
    e, _ = explained(ROWSUM, sizes, parallel=False)
    assert "parallel=False" in " ".join(e.loop("m").reasons)
    e, _ = explained(ROWSUM, sizes, vectorize=False)
    # Without vectors the scheduler puts m innermost (stride-1 over B): that loop says why.
    assert e.loops[-1].index == "m" and "vectorize=False" in " ".join(e.loops[-1].reasons)
    e, _ = explained(ROWSUM, sizes, loop_tiles=())
    assert "loop_tiles=()" in " ".join(e.loop("m").reasons)


def test_segments_are_explained_part_by_part():
    source = """def mlp(float(B, K) I, float(K, N) W) -> (O) {
        T(b, n) +=! I(b, r_k) * W(r_k, n)
        O(b, n) = T(b, n) + T(b, n) * T(b, n) where b in 0:B, n in 0:N
        S(b) +=! O(b, r_n)
        O(b, n) = O(b, n) / S(b)
    }"""
    e, stages = explained(source, {"B": 32, "K": 32, "N": 32})
    assert stages.path == "segments" and len(stages.segments) >= 2
    assert e.path == "segments" and len(e.parts) == len(stages.segments)
    assert [part.path for part in e.parts] == [segment.path for segment in stages.segments]
    assert e.parts[0].path == "gemm"


def test_explanations_render_as_text_and_html():
    e, _ = explained(ROWSUM, {"M": 16, "N": 8})
    text, page = str(e), e._repr_html_()
    assert "loop over m" in text and "parallel" in text
    assert "<table>" in page and "r_n" in page


def test_check_schedule_accepts_and_refuses_with_witnesses():
    kernel = polyc.define(MATMUL, blas_contractions=False).mm
    good = kernel.check_schedule("{ S0[m, n, r_k] -> [1, r_k, m, n]; S0_init[m, n] -> [0, 0, m, n] }")
    assert good.valid
    bad = kernel.check_schedule(
        "{ S0[m, n, r_k] -> [0, m, n, r_k]; S0_init[m, n] -> [1, m, n, 0] }", {"M": 4, "K": 3, "N": 2}
    )
    assert not bad.valid and {w.kind for w in bad.violations} >= {"flow"}
    flow = next(w for w in bad.violations if w.kind == "flow")
    assert flow.source == "S0_init" and flow.sink == "S0" and flow.element.startswith("C(")
    with pytest.raises(polyc.PolycError, match="no time"):
        kernel.check_schedule("{ S0[m, n, r_k] -> [m, n, r_k] }")
    with pytest.raises(polyc.PolycError, match="not an isl union map"):
        kernel.check_schedule("{ this is not isl")


FIRST_SUM = """def firstsum(float(N) A) -> (B) {
    B(j) = A(j) where j in 0:N
    B(z) += A(r) where z in 0:1, r in 0:N
}"""


def test_a_reduction_target_too_large_to_privatise():
    # The sum into B(0) could run as an OpenMP reduction, but OpenMP would give every thread a
    # private copy of all of B: polyc declines above 4096 elements and says so.
    sizes = {"N": 10000}
    e, stages = explained(FIRST_SUM, sizes)
    loop = e.loop("r")
    band = next(d for d in stages.decisions if d.statements == ("S1",))
    assert not loop.parallel and band.parallel is None
    assert "B has 10000 elements, more than the 4096" in " ".join(loop.reasons)
    assert "parallel for reduction" not in pragmas(stages)
    assert "omp simd reduction(polyc_sum_float32:" in pragmas(stages)
    assert loop.witness.kind == "reduction" and assert_witness_is_a_dependence(e, stages, sizes) == 1
    e, stages = explained(FIRST_SUM, {"N": 100})
    assert e.loop("r").parallel_how == "parallel reduction (+:B)"
    assert next(d for d in stages.decisions if d.statements == ("S1",)).parallel == "reduce:+:B"


def test_a_fused_stencil_carries_dependences_on_both_loops():
    source = """def stencil(float(N, M) A) -> (C) {
        B(i, j) = A(i, j) * 2 where i in 0:N, j in 0:M
        C(i, j) = B(i + 1, j) + B(i, j + 1) + B(i, j) where i in 0:N-1, j in 0:M-1
    }"""
    sizes = {"N": 6, "M": 6}
    e, stages = explained(source, sizes, fusion="max")
    fused = next(d for d in stages.decisions if {"S0", "S1"} <= set(d.statements))
    assert fused.parallel is None and "omp parallel" not in pragmas(stages)
    assert [loop.parallel for loop in e.loops] == [False, False]
    assert all(loop.witness.kind == "flow" for loop in e.loops)
    assert assert_witness_is_a_dependence(e, stages, sizes) == 2
    # The distances: the outer loop carries B(i + 1, j) -> C(i, j), the inner B(i, j + 1).
    assert e.loops[0].witness.distance[0] > 0 and e.loops[1].witness.distance == (0, 1)
    # With the default fusion the two nests stay apart and both are parallel.
    e, _ = explained(source, sizes)
    assert all(loop.parallel for loop in e.loops if loop.depth == 0)


def test_elementwise_column_sum_and_layer_norm():
    # Elementwise: rows in parallel, columns vectorised; no dependence, so no witness.
    e, stages = explained(
        "def add(float(M, N) A, float(M, N) B) -> (C) { C(m, n) = A(m, n) + B(m, n) }", {"M": 64, "N": 64}
    )
    (band,) = stages.decisions
    assert (band.parallel, band.innermost) == ("parallel", "simd")
    assert e.loop("m").parallel and e.loop("n").vectorised and not e.loop("n").parallel
    assert all(loop.witness is None for loop in e.loops)
    assert "#pragma omp parallel for" in pragmas(stages) and "#pragma omp simd" in pragmas(stages)
    # A column sum: the output's index j is the parallel loop, the reduction runs inside it.
    sizes = {"N": 64, "M": 64}
    e, stages = explained("def colsum(float(N, M) A) -> (B) { B(j) +=! A(r_i, j) }", sizes)
    assert e.loop("j").parallel and not e.loop("r_i").parallel
    assert e.loop("r_i").witness.kind == "reduction" and e.loop("r_i").witness.element.startswith("B(")
    assert assert_witness_is_a_dependence(e, stages, sizes) == 1
    # Layer norm: two row reductions and the normalisation fused under one parallel row loop,
    # each inner loop vectorised (the reductions with simd reduction clauses).
    source = """def layernorm(float(N, D) X) -> (Y) {
        mean(n) +=! X(n, r_d) / D
        var(n) +=! (X(n, r_d) - mean(n)) * (X(n, r_d) - mean(n)) / D
        Y(n, d) = (X(n, d) - mean(n)) / sqrt(var(n) + 1e-5)
    }"""
    sizes = {"N": 64, "D": 64}
    e, stages = explained(source, sizes)
    outer = stages.decisions[0]
    assert outer.parallel == "parallel" and set(outer.statements) >= {"S0", "S1", "S2"}
    assert [d.innermost for d in stages.decisions[1:]] == ["simd:+:mean", "simd:+:var", "simd"]
    assert e.loop("n").parallel and "fused: statements S0, S0_init, S1, S1_init, S2" in " ".join(e.loop("n").reasons)
    inner = [loop for loop in e.loops if loop.depth == 1]
    assert all(loop.vectorised and not loop.parallel for loop in inner)
    assert all("the loop over n around it is parallel" in " ".join(loop.reasons) for loop in inner)
    assert assert_witness_is_a_dependence(e, stages, sizes) == 2


# ----------------------------------------------------------------------------- issue 84's defects
# Each test failed on the code before issue 84, whose explanations read the scheduler's band
# decisions before its later reorderings and without the C's collapse and elided loops.


def simd_iterators(stages) -> list[str]:
    """The iterators of the loops right under an ``omp simd`` pragma in the C."""
    lines = [line.strip() for line in stages.kernel.source.splitlines()]
    return [
        lines[at + 1].split()[2]
        for at, line in enumerate(lines)
        if line.startswith("#pragma omp") and "simd" in line and lines[at + 1].startswith("for (")
    ]


def test_the_vectorised_loop_is_the_one_under_the_simd_pragma():
    # The scheduler moves n innermost (stride 1 over B and C) after recording the band: the
    # C vectorises n, and explain said r_k.
    sizes = {"M": 16, "K": 8, "N": 12}
    e, stages = explained(MATMUL, sizes, blas_contractions=False, register_tiles=())
    assert e.loop("n").vectorised and not e.loop("r_k").vectorised
    (iterator,) = simd_iterators(stages)
    assert f"c{e.loop('n').depth}" == iterator
    assert "innermost, vectorised" in " ".join(e.loop("n").reasons)


HEADS_FIRST = """def heads_first(float(1, 128, 3, 12, 64) X) -> (Y) {
    Y(i0, i1, i2, i3, i4) = X(i1, i3, i0, i2, i4) where i0 in 0:3, i1 in 0:1, i2 in 0:12, i3 in 0:128, i4 in 0:64
}"""


def test_collapsed_loops_are_parallel():
    # 3 matrices in parallel: OpenMP's collapse(3) shares out the loops over the heads too.
    e, stages = explained(HEADS_FIRST, {}, transpose_kernels=False)
    assert "collapse(3)" in pragmas(stages)
    assert e.loop("i0").parallel and e.loop("i2").parallel
    assert e.loop("i2").parallel_how == "collapsed into the parallel loop over i0"
    assert not e.loop("i3").parallel and not e.loop("i4").parallel


def test_a_loop_of_one_iteration_is_not_claimed():
    # At N=1 isl prints no loop over n, so nothing is parallel; explain said "n: parallel".
    e, stages = explained("def rowmax(float(N, D) X) -> (M) { M(n) max=! X(n, r_d) }", {"N": 1, "D": 64})
    assert "omp parallel" not in stages.kernel.source
    assert not any(loop.parallel for loop in e.loops)
    assert "one iteration" in " ".join(e.loop("n").reasons)
    assert e.loop("r_d").vectorised and "one iteration" in " ".join(e.loop("r_d").reasons)


def test_sequential_nests_do_not_claim_a_parallel_enclosing_loop():
    # Softmax at 8 x 16 runs on the calling thread: its inner loops said "an enclosing loop is
    # already parallel".
    e, stages = explained(SOFTMAX, {"N": 8, "D": 16})
    assert "omp parallel" not in stages.kernel.source
    inner = [loop for loop in e.loops if loop.depth == 1]
    assert inner and not any("already parallel" in " ".join(loop.reasons) for loop in inner)
    assert all("too little work for threads" in " ".join(loop.reasons) for loop in inner)


def test_check_schedule_with_sizes_times_only_their_instances():
    # A schedule written for N = 6 (no size parameter): with the sizes it is checked there;
    # before issue 84 it was refused for not timing the instances of larger N.
    kernel = polyc.define(SHIFTED).shifted
    good = kernel.check_schedule("{ S0[i] -> [i, 0] : 0 <= i < 6; S1[i] -> [i + 1, 1] : 0 <= i < 5 }", {"N": 6})
    assert good.valid
    bad = kernel.check_schedule("{ S0[i] -> [i, 1] : 0 <= i < 6; S1[i] -> [i, 0] : 0 <= i < 5 }", {"N": 6})
    assert not bad.valid and {w.kind for w in bad.violations} == {"flow"}
    with pytest.raises(polyc.PolycError, match="no time to some statement instances at N=6"):
        kernel.check_schedule("{ S0[i] -> [i, 0] : 0 <= i < 5; S1[i] -> [i + 1, 1] : 0 <= i < 5 }", {"N": 6})
    with pytest.raises(polyc.PolycError, match="no time"):  # without sizes: every size
        kernel.check_schedule("{ S0[i] -> [i, 0] : 0 <= i < 6; S1[i] -> [i + 1, 1] : 0 <= i < 5 }")
