"""The GPU mapping stage: which loops go to blocks and threads, and the proofs every launch
must pass (with negative controls: launches built wrong on purpose fail them)."""

from __future__ import annotations

import dataclasses

import islpy as isl
import numpy as np
import pytest
from kernels import CASES, DIVERGENT_BARRIERS_DEF

import polyc
from polyc.errors import PolycError
from polyc.schedule.gpu_mapping import MappingOptions, _launch, _mapped_loops, prove_launch


def stages(case_name: str, sizes=None, **options):
    case = CASES[case_name]
    kernel = polyc.define(case.source, **options)[case.entry]
    return kernel.gpu_stages(dict(sizes or case.size_sets[0]))


def test_matmul_maps_n_to_x_and_m_to_y_with_the_reduction_inside_each_thread():
    (launch,) = stages("matmul", dict(M=37, K=20, N=45)).gpu.launches
    x, y = launch.loops
    assert set(x.indices.values()) == {"n"} and set(y.indices.values()) == {"m"}
    # register tiles: 45 = 32 + 13 values along x are 2 per thread, 37 = 4 * 8 + 5 along y 4 per thread
    assert (x.block, y.block) == (32, 8) and (x.registers, y.registers) == (2, 4)
    assert launch.grid == (1, 2) and launch.block == (32, 8)


def test_without_register_tiles_each_thread_runs_one_element():
    (launch,) = stages("matmul", dict(M=37, K=20, N=45), gpu_tiles=(8, 32, 32)).gpu.launches
    x, y = launch.loops
    assert (x.registers, y.registers) == (1, 1) and launch.grid == (2, 5)  # 45 = 32 + 13, 37 = 4 * 8 + 5


def test_blocks_are_tightened_to_small_domains():
    (launch,) = stages("matmul", dict(M=3, K=4, N=5)).gpu.launches
    assert launch.block == (5, 3) and launch.grid == (1, 1)


def test_a_sequence_of_statements_with_a_global_dependence_becomes_a_sequence_of_launches():
    plan = stages("atax").gpu
    assert len(plan.launches) == 2


def test_row_wise_softmax_is_one_launch_with_one_thread_per_row():
    case_sizes = dict(CASES["softmax"].size_sets[0])
    (launch,) = stages("softmax", case_sizes).gpu.launches
    assert len(launch.loops) == 1 and launch.loops[0].extent == list(case_sizes.values())[0]


def test_few_long_rows_get_a_block_each_where_the_device_needs_the_threads():
    (launch,) = stages("softmax", dict(N=7, D=300), device="sm_80").gpu.launches
    reduction = launch.reduction
    assert launch.grid == (7,) and launch.block == (256,) and not launch.loops
    assert [(t.statement, t.tensor, t.op) for t in reduction.trees] == [("S0", "maxVal", "max"), ("S2", "expSum", "+")]
    # enough rows fill the device one thread each (pocl's model: two cores of 8 lanes)
    assert stages("softmax", dict(N=40, D=300), device="pocl").gpu.launches[0].reduction is None


def test_negative_control_a_statement_moved_before_what_it_reads_fails_the_proof():
    from polyc.schedule.gpu_reduction import prove_block_reduction

    st = stages("softmax", dict(N=7, D=300), device="sm_80")
    (launch,) = st.gpu.launches
    reduction = launch.reduction
    assert prove_block_reduction(reduction, st.program, launch.domain, st.dependences) is None
    pieces = []
    reduction.schedule.foreach_map(pieces.append)
    moved = isl.UnionMap.empty(reduction.schedule.get_space())
    for piece in pieces:  # O(n, d) = expDistance(n, d) / expSum(n) first: before expSum is summed
        if piece.get_tuple_name(isl.dim_type.in_) == "S3":
            piece = piece.set_tuple_name(isl.dim_type.in_, "S3")
            rank = piece.dim(isl.dim_type.out)
            first = isl.Map.read_from_str(
                st.program.ctx,
                "{{ [{}] -> [-1, {}] }}".format(
                    ", ".join(f"t{i}" for i in range(rank)), ", ".join(f"t{i}" for i in range(1, rank))
                ),
            )
            piece = piece.apply_range(first)
        moved = moved.union(isl.UnionMap.from_map(piece))
    broken = dataclasses.replace(reduction, schedule=moved)
    assert "goes backwards" in prove_block_reduction(broken, st.program, launch.domain, st.dependences)


def test_block_reductions_keep_only_the_barriers_a_dependence_between_threads_needs():
    from polyc.schedule.gpu_reduction import _without_barrier, prove_block_reduction

    st = stages("softmax", dict(N=7, D=300), device="sm_80")
    (launch,) = st.gpu.launches
    reduction = launch.reduction
    last = len(launch.statements) - 1  # a group per statement, in the block's order
    assert f"polyc_barrier_g{last}_1" not in reduction.barriers  # nothing follows the last statement
    closing = [name for name in reduction.barriers if name.endswith("_1")]
    assert closing and len(closing) < last
    for name in closing:  # each closing barrier kept is needed: without it, the proof fails
        failure = prove_block_reduction(_without_barrier(reduction, name), st.program, launch.domain, st.dependences)
        assert failure is not None and "no barrier between" in failure, name


def test_a_full_reduction_runs_as_a_tree_on_one_block():
    (launch,) = stages("sum_all", dict(M=300, N=7)).gpu.launches
    assert launch.reduction is not None and launch.block == (256,) and launch.reduction.steps == 8
    assert "a block reduces it" in launch.reason


def test_the_reduction_tree_is_proved_race_free_and_needs_every_barrier():
    from polyc.schedule.gpu_reduction import prove_tree

    (launch,) = stages("sum_all", dict(M=40, N=7)).gpu.launches
    reduction = launch.reduction
    assert reduction.threads == 64 and prove_tree(reduction, launch_program("sum_all", dict(M=40, N=7))) is None
    for barrier in ("polyc_barrier_g1_3", "polyc_barrier_g1_7"):  # before the tree, between two steps
        kept = isl.UnionSet.empty(reduction.block_domain.get_space())
        for piece in _sets(reduction.block_domain):
            if piece.get_tuple_name() != barrier:
                kept = kept.union(isl.UnionSet.from_set(piece))
        broken = dataclasses.replace(reduction, block_domain=kept)
        assert "race without a barrier" in prove_tree(broken, launch_program("sum_all", dict(M=40, N=7)))


def launch_program(case_name, sizes):
    case = CASES[case_name]
    return polyc.define(case.source)[case.entry].gpu_stages(sizes).program


def _sets(union):
    found = []
    union.foreach_set(found.append)
    return found


def test_stages_show_the_mapped_schedule_tree():
    case = CASES["atax"]
    kernel = polyc.define(case.source, backend="opencl")[case.entry]
    tree = str(kernel.stages(dict(case.size_sets[0])).mapped_schedule.get_root())
    assert tree.count('mark: "kernel polyc_atax_k') == 2 and "sequence" in tree
    assert tree.count('mark: "threads x: block') == 2 and tree.count('mark: "per thread"') == 2
    assert "block reduction" in str(stages("sum_all", dict(M=40, N=7)).mapped_schedule.get_root())


def test_a_reduction_over_one_value_runs_on_one_thread_and_says_why():
    (launch,) = stages("sum_all", dict(M=1, N=1)).gpu.launches
    assert launch.reduction is None and "one thread" in launch.reason


def test_the_block_option_shapes_the_blocks():
    (launch,) = stages("matmul", dict(M=37, K=20, N=45), block=(16, 4), gpu_tiles=(4, 16, 32)).gpu.launches
    assert launch.block == (16, 4) and launch.grid == (3, 10)
    (launch,) = stages("matmul", dict(M=37, K=20, N=45), block=(16, 4)).gpu.launches  # 3 x 4 register tiles
    assert [loop.registers for loop in launch.loops] == [3, 4] and launch.grid == (1, 3)


def test_the_grid_option_bounds_the_blocks_and_threads_run_rounds():
    (launch,) = stages("matmul", dict(M=37, K=20, N=45), grid=(1, 2), **ONE_VALUE_PER_THREAD).gpu.launches
    assert launch.grid == (1, 2) and [loop.rounds for loop in launch.loops] == [2, 3]


def test_unroll_unrolls_the_reduction_around_the_register_tile():
    plain = stages("matmul", dict(M=37, K=8, N=45)).gpu_source.source
    unrolled = stages("matmul", dict(M=37, K=8, N=45), unroll=64).gpu_source.source
    assert "c5 += " in plain or "c5++" in plain or "for (int64_t c5" in plain
    assert unrolled.count("C_private") > plain.count("C_private")


@pytest.mark.parametrize("block", [(0,), (1, 2, 3, 4), (2048,), (64, 32), "x"])
def test_bad_block_options_are_refused(block):
    with pytest.raises(PolycError, match="block"):
        polyc.define(CASES["matmul"].source, backend="opencl", block=block)


#: Options for a matmul without register tiles (TC's tile sizes: the block's 8 x 32 threads, slices of 32).
ONE_VALUE_PER_THREAD = dict(gpu_tiles=(8, 32, 32))


def _with_loop(launch, program, **changes):
    """``launch`` with its x loop changed, its thread domain rebuilt to match."""
    loops = (dataclasses.replace(launch.loops[0], **changes),) + launch.loops[1:]
    return _launch(launch.name, program, launch.schedule, launch.domain, loops, "negative control")


def test_negative_control_a_grid_too_small_leaves_instances_unrun():
    st = stages("matmul", dict(M=37, K=20, N=45), **ONE_VALUE_PER_THREAD)
    (launch,) = st.gpu.launches
    bad = _with_loop(launch, st.program, grid=1)  # 32 of 45 columns
    assert "no thread of the grid runs" in prove_launch(bad, st.program, st.dependences)


def test_negative_control_threads_along_a_reduction_race():
    st = stages("matmul", dict(M=6, K=20, N=5))
    (launch,) = st.gpu.launches
    band = st.optimized_schedule.get_root().child(0)
    assert not band.band_member_get_coincident(2)  # r_k: carries the reduction's dependence
    loops = _mapped_loops(st.program, band, launch.domain, [2], MappingOptions(block=(8,)))
    bad = _launch(launch.name, st.program, launch.schedule, launch.domain, loops, "negative control")
    failure = prove_launch(bad, st.program, st.dependences)
    assert failure is not None and "a dependence joins two threads" in failure
    assert prove_launch(launch, st.program, st.dependences) is None


# ----------------------------------------------------------------------------- shared memory
def test_matmul_tiles_go_to_shared_memory_in_slices_of_the_reduction():
    st = stages("matmul", dict(M=37, K=70, N=45), **ONE_VALUE_PER_THREAD)
    promotion = st.gpu.launches[0].promotion
    assert promotion is not None and promotion.member == 2 and promotion.slice_size == 32
    shapes = {array.tensor: array.sizes for array in promotion.arrays}
    assert shapes == {"A": (8, 32), "B": (32, 32)}  # rows of the block x a slice; a slice x columns
    source = st.gpu_source.source
    assert "__local float A_shared[528]" in source  # two buffers of 8 rows of 32 + 1 (padding)


def test_double_buffering_copies_the_next_slice_while_computing_this_one():
    single = stages("matmul", dict(M=37, K=70, N=45), double_buffer=False, **ONE_VALUE_PER_THREAD)
    double = stages("matmul", dict(M=37, K=70, N=45), **ONE_VALUE_PER_THREAD)
    assert not single.gpu.launches[0].promotion.double_buffered and double.gpu.launches[0].promotion.double_buffered
    assert "__local float A_shared[264]" in single.gpu_source.source
    assert "double-buffered" in double.gpu.describe()
    # two barriers per slice with one buffer; one per slice and one before the first with two
    for st, barriers in ((single, {"polyc_barrier1", "polyc_barrier3"}), (double, {"polyc_barrier3"})):
        names = {s.get_tuple_name() for s in _sets(st.gpu.launches[0].promotion.block_domain)}
        assert {n for n in names if n.startswith("polyc_barrier")} == barriers
    # a slice's buffer is s mod 2: with one buffer named for both, the copy of the next slice
    # overwrites what the block still reads, and the race proof says so
    from polyc.schedule.gpu_promotion import prove_promotion

    launch = double.gpu.launches[0]
    assert prove_promotion(launch.promotion, double.program, launch) is None
    one_buffer = dataclasses.replace(
        launch.promotion, arrays=tuple(dataclasses.replace(a, buffers=1) for a in launch.promotion.arrays)
    )
    failure = prove_promotion(one_buffer, double.program, launch)
    assert failure is not None and "race" in failure


def test_shared_memory_can_be_turned_off_or_limited():
    assert stages("matmul", dict(M=37, K=70, N=45), use_shared_memory=False).gpu.launches[0].promotion is None
    small = (
        stages("matmul", dict(M=37, K=70, N=45), max_shared_memory=1100, **ONE_VALUE_PER_THREAD)
        .gpu.launches[0]
        .promotion
    )
    assert [a.tensor for a in small.arrays] == ["A"]  # A: 8 x 33 floats fit, B: 32 x 33 do not


def test_slices_thin_until_every_reused_tile_fits_the_budget():
    launch = stages("matmul", dict(M=37, K=70, N=45), max_shared_memory=2000).gpu.launches[0]
    promotion = launch.promotion
    assert sorted(a.tensor for a in promotion.arrays) == ["A", "B"] and promotion.slice_size < 32
    assert promotion.shared_bytes <= 2000


def test_negative_control_the_race_proof_needs_the_barriers():
    from polyc.schedule.gpu_promotion import BARRIER, prove_promotion

    st = stages("matmul", dict(M=37, K=70, N=45))
    launch = st.gpu.launches[0]
    assert prove_promotion(launch.promotion, st.program, launch) is None
    sets = []
    launch.promotion.block_domain.foreach_set(sets.append)
    kept = [s for s in sets if not s.get_tuple_name().startswith(BARRIER)]
    without = isl.UnionSet.from_set(kept[0])
    for s in kept[1:]:
        without = without.union(isl.UnionSet.from_set(s))
    broken = dataclasses.replace(launch.promotion, block_domain=without)
    failure = prove_promotion(broken, st.program, launch)
    assert failure is not None and "race without a barrier" in failure


def test_accumulators_live_in_registers():
    matmul = stages("matmul", dict(M=37, K=70, N=45), **ONE_VALUE_PER_THREAD).gpu.launches[0].private
    assert [(a.tensor, a.sizes) for a in matmul.arrays] == [("C", (1, 1))]
    tiled = stages("matmul", dict(M=37, K=70, N=45)).gpu.launches[0].private  # a 4 x 2 register tile
    assert [(a.tensor, a.sizes, a.steps) for a in tiled.arrays] == [("C", (4, 2), (8, 32))]
    softmax = stages("softmax", dict(N=40, D=33), device="pocl").gpu.launches[0].private
    # the row's max and sum; not its D outputs
    assert sorted((a.tensor, a.sizes) for a in softmax.arrays) == [("expSum", (1,)), ("maxVal", (1,))]
    assert stages("matmul", dict(M=37, K=70, N=45), use_private_memory=False).gpu.launches[0].private is None


# ----------------------------------------------------------------------------- access proofs
def strides_of(launch) -> dict:
    return {(statement, tensor, kind): set(strides) for statement, tensor, kind, strides in launch.strides}


def test_global_accesses_are_proved_coalesced_or_not():
    plain = stages("matmul", dict(M=37, K=70, N=45), use_shared_memory=False, use_private_memory=False)
    found = strides_of(plain.gpu.launches[0])
    assert found[("S0", "B", "read")] == {1} and found[("S0", "C", "write")] == {1}  # along n
    assert found[("S0", "A", "read")] == {0}  # the same element for the whole warp: a broadcast
    transposed = polyc.define(
        "def tmm(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }", use_shared_memory=False
    ).tmm.gpu_stages(dict(M=37, K=70, N=45))
    assert strides_of(transposed.gpu.launches[0])[("S0", "B", "read")] == {70}  # a row apart: not coalesced
    assert "not coalesced" in transposed.gpu.describe()


def test_shared_rows_are_padded_so_column_reads_meet_every_bank():
    transposed = polyc.define(
        "def tmm(float(M, K) A, float(N, K) B) -> (C) { C(m, n) +=! A(m, r_k) * B(n, r_k) }"
    ).tmm.gpu_stages(dict(M=37, K=70, N=45))
    launch = transposed.gpu.launches[0]
    assert strides_of(launch)[("*", "B_shared", "shared read")] == {33}  # 32 + 1 of padding: odd
    assert "bank conflicts" not in launch.describe() and "no bank conflict" in launch.describe()


def test_vector_copies_need_rows_of_four_floats_proved_aligned():
    """Shared-memory copies move 4 floats with one aligned vector load only where isl proves every
    row of the box starts at a multiple of 4 in a tensor whose rows are multiples of 4."""
    source = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
    aligned = polyc.define(source, backend="opencl", device="sm_80").mm
    arrays = {a.tensor: a.vector for a in aligned.gpu_stages(dict(M=64, K=64, N=64)).gpu.launches[0].promotion.arrays}
    assert arrays == {"A": 4, "B": 4}
    assert "vload4(0, &A[" in aligned.gpu_source(dict(M=64, K=64, N=64), "opencl")
    assert "*(const float4 *)(&B[" in aligned.gpu_source(dict(M=64, K=64, N=64), "cuda")
    # rows of 66 floats: a row's groups of 4 do not start at multiples of 4 in memory
    arrays = {a.tensor: a.vector for a in aligned.gpu_stages(dict(M=64, K=66, N=64)).gpu.launches[0].promotion.arrays}
    assert arrays["A"] == 1


def test_negative_control_a_copy_past_the_tensor_fails_the_bounds_proof():
    """The out-of-bounds copy of tests/gpu/test_oclgrind.py, seen by isl: A's box one row
    further down, so the last block's copies read past A."""
    from polyc.schedule.gpu_promotion import prove_promotion

    st = stages("matmul", dict(M=37, K=70, N=45))
    launch = st.gpu.launches[0]
    assert prove_promotion(launch.promotion, st.program, launch) is None
    arrays = tuple(
        dataclasses.replace(
            a, offsets=(a.offsets[0].add_constant_val(isl.Val.int_from_si(a.offsets[0].get_ctx(), 1)), *a.offsets[1:])
        )
        if a.tensor == "A"
        else a
        for a in launch.promotion.arrays
    )
    failure = prove_promotion(dataclasses.replace(launch.promotion, arrays=arrays), st.program, launch)
    assert failure is not None and "copies read outside A" in failure


def test_private_tiles_load_only_what_is_read_before_it_is_written():
    """A matmul's accumulators are set by its init statement first: no load of C; an update
    without '!' reads C's old values first: loaded."""
    fresh = polyc.define(
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }", backend="opencl"
    ).mm
    source = fresh.gpu_source(dict(M=64, K=64, N=64), "opencl")
    assert "C_private" in source and "= C[" not in source
    accumulate = polyc.define(
        "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) += A(m, r_k) * B(r_k, n) }", backend="opencl"
    ).mm
    assert "= C[" in accumulate.gpu_source(dict(M=64, K=64, N=64), "opencl")
    a, b, c = (np.ones((64, 64), np.float32) for _ in range(3))
    np.testing.assert_allclose(accumulate(a, b, outputs=[c]), 65.0)
    np.testing.assert_allclose(fresh(a, b), 64.0)


def test_every_thread_meets_each_barrier_at_one_place_in_the_code():
    """isl may hoist guards on the thread ids above a shared-memory slice loop (here: those of
    a private tile's loads and stores at the edges) and print the loop, barriers and all, once
    per guard; such a launch goes without its private tile (tests/gpu/test_opencl.py runs it)."""
    from polyc.schedule.gpu_mapping import divergent_barriers
    from polyc.schedule.gpu_promotion import MAX_PRIVATE_ELEMENTS, promote_private

    kernel = polyc.define(DIVERGENT_BARRIERS_DEF, backend="opencl", fusion="min", block=(5, 3)).fuzz
    st = kernel.gpu_stages(dict(M=14, N=7))
    for launch in st.gpu.launches:
        assert divergent_barriers(launch.build_ast(), launch.thread_dims) == []
    launch = st.gpu.launches[-1]
    assert launch.promotion is not None and launch.private is None
    assert "no private copies: isl guarded its barriers by the thread ids" in st.gpu.describe()
    # negative control: the private tile put back, the check finds the barriers under guards
    schedule, domain = launch.body()
    private = promote_private(st.program, launch, schedule, domain, MAX_PRIVATE_ELEMENTS)
    assert private is not None
    with_private = dataclasses.replace(launch, private=private, ast=None)
    assert divergent_barriers(with_private.build_ast(), launch.thread_dims)


# ----------------------------------------------------------------------------- proofs' negative controls
def _union_of(pieces, like: isl.UnionSet) -> isl.UnionSet:
    """The union of the sets ``pieces``, in the space of ``like``."""
    union = isl.UnionSet.empty(like.get_space())
    for piece in pieces:
        union = union.union(isl.UnionSet.from_set(piece))
    return union


def test_negative_control_a_promoted_read_whose_element_is_not_copied():
    from polyc.schedule.gpu_promotion import COPY, prove_promotion

    st = stages("matmul", dict(M=37, K=70, N=45))
    launch = st.gpu.launches[0]
    assert prove_promotion(launch.promotion, st.program, launch) is None
    pieces = []
    for piece in _sets(launch.promotion.block_domain):
        if piece.get_tuple_name() == COPY + "B":  # the last copy of B's tile left out
            piece = piece.subtract(piece.lexmax())
        pieces.append(piece)
    broken = dataclasses.replace(launch.promotion, block_domain=_union_of(pieces, launch.promotion.block_domain))
    failure = prove_promotion(broken, st.program, launch)
    assert failure is not None and "shared B_shared: a read finds its element not copied" in failure, failure


def test_negative_control_an_instance_run_by_two_threads():
    st = stages("matmul", dict(M=37, K=20, N=45), **ONE_VALUE_PER_THREAD)
    (launch,) = st.gpu.launches
    x = launch.loops[0]
    twice = x.schedule.union(x.schedule.apply_range(isl.UnionMap.read_from_str(st.program.ctx, "{ [v] -> [v + 1] }")))
    bad = _with_loop(launch, st.program, schedule=twice)  # each column also run by the next thread
    assert prove_launch(bad, st.program, st.dependences) == "an instance is run by two threads"


def test_negative_control_a_dependence_joining_two_rows():
    from polyc.schedule.gpu_reduction import prove_block_reduction

    st = stages("softmax", dict(N=7, D=300), device="sm_80")
    (launch,) = st.gpu.launches
    reduction = launch.reduction
    (row,) = reduction.rows
    assert prove_block_reduction(reduction, st.program, launch.domain, st.dependences) is None
    pieces = []
    row.schedule.foreach_map(pieces.append)
    by_last_index = isl.UnionMap.empty(row.schedule.get_space())
    for piece in pieces:  # a block per value of each statement's last index: D's reductions cross blocks
        name, rank = piece.get_tuple_name(isl.dim_type.in_), piece.dim(isl.dim_type.in_)
        names = ", ".join(f"i{d}" for d in range(rank))
        last = isl.Map.read_from_str(st.program.ctx, f"{{ {name}[{names}] -> [i{rank - 1}] }}")
        last = last.align_params(piece.get_space()).intersect_domain(piece.domain())
        by_last_index = by_last_index.union(isl.UnionMap.from_map(last))
    broken = dataclasses.replace(reduction, rows=(dataclasses.replace(row, schedule=by_last_index),))
    assert prove_block_reduction(broken, st.program, launch.domain, st.dependences) == "a dependence joins two rows"


def test_negative_control_a_tree_step_reading_what_no_thread_stored():
    from polyc.schedule.gpu_reduction import PARTIAL_STORE, prove_tree

    program = launch_program("sum_all", dict(M=40, N=7))
    reduction = stages("sum_all", dict(M=40, N=7)).gpu.launches[0].reduction
    assert prove_tree(reduction, program) is None
    kept = [p for p in _sets(reduction.block_domain) if not p.get_tuple_name().startswith(PARTIAL_STORE)]
    broken = dataclasses.replace(reduction, block_domain=_union_of(kept, reduction.block_domain))
    failure = prove_tree(broken, program)
    assert failure is not None and "a step reads an element no thread stored" in failure, failure


def test_a_failing_proof_makes_the_mapper_fall_back(monkeypatch):
    """Each proof, made to fail, takes away what it proves: the shared-memory tiles, the block
    reduction, then every thread mapping (one thread runs the kernel)."""
    from polyc.schedule import gpu_mapping, gpu_reduction

    assert stages("matmul", dict(M=37, K=70, N=45)).gpu.launches[0].promotion is not None
    monkeypatch.setattr(gpu_mapping, "prove_promotion", lambda *args: "made up")
    (launch,) = stages("matmul", dict(M=37, K=70, N=45)).gpu.launches
    assert launch.promotion is None and "no shared memory: made up" in launch.reason and launch.loops

    assert stages("softmax", dict(N=7, D=300), device="sm_80").gpu.launches[0].reduction is not None
    monkeypatch.setattr(gpu_reduction, "prove_block_reduction", lambda *args: "made up")
    assert stages("softmax", dict(N=7, D=300), device="sm_80").gpu.launches[0].reduction is None

    monkeypatch.setattr(gpu_mapping, "prove_launch", lambda *args: "made up")
    st = stages("matmul", dict(M=37, K=70, N=45))
    (launch,) = st.gpu.launches
    assert launch.loops == () and "no mapping passed the proofs: one thread runs it" in launch.reason
    assert "made up" in launch.reason
