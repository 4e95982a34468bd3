"""Schedules of the user's own: check_schedule lets a reduction's updates run in any order
(``strict=True`` keeps theirs), and ``polyc.define(..., schedule=...)`` compiles a legal schedule
on the user_schedule path and refuses an illegal one with the violated pair (issue 84 item 4)."""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc.options import Options

MATMUL = "def mm(float(M, K) A, float(K, N) B) -> (C) { C(m, n) +=! A(m, r_k) * B(r_k, n) }"
# The updates of C(m, n) in reverse (r_k from K - 1 down to 0), after its initialisation.
REVERSED = "[M, N, K] -> { S0_init[m, n] -> [m, n, 0]; S0[m, n, r_k] -> [m, n, K - r_k] }"
MATMUL_SIZES = {"M": 9, "K": 13, "N": 7}

HEAT = """def heat(float(N) U0, float(T) R) -> (U) {
    U(t, i) = U0(i) where t in 0:1, i in 0:N
    U(t, i) = i >= 1 && i < N - 1 ? U(t - 1, i) + R(t) * (U(t - 1, i - 1) - 2 * U(t - 1, i) + U(t - 1, i + 1)) : U(t - 1, i) where t in 1:T, i in 0:N
}"""
# A wavefront: the points with equal 2t + i run together, independent of each other.
WAVEFRONT = "[N, T] -> { S0[t, i] -> [2t + i, t]; S1[t, i] -> [2t + i, t] }"
# Space outside time: U(t, i) would run before U(t - 1, i + 1) that it reads.
INTERCHANGED = "[N, T] -> { S0[t, i] -> [i, t]; S1[t, i] -> [i, t] }"


def heat_reference(u0, r):
    u = np.empty((len(r), len(u0)), u0.dtype)
    u[0] = u0
    for t in range(1, len(r)):
        u[t] = u[t - 1]
        u[t, 1:-1] = u[t - 1, 1:-1] + r[t] * (u[t - 1, :-2] - 2 * u[t - 1, 1:-1] + u[t - 1, 2:])
    return u


def test_a_reduction_may_run_its_updates_in_any_order_unless_strict():
    kernel = polyc.define(MATMUL).mm
    assert kernel.check_schedule(REVERSED).valid
    assert kernel.check_schedule(REVERSED, MATMUL_SIZES).valid
    strict = kernel.check_schedule(REVERSED, MATMUL_SIZES, strict=True)
    assert not strict.valid
    (witness,) = strict.violations
    assert witness.kind == "reduction" and witness.source == witness.sink == "S0"
    assert witness.source_instance["r_k"] < witness.sink_instance["r_k"]
    assert witness.element == f"C({witness.source_instance['m']}, {witness.source_instance['n']})"


def test_the_initialisation_still_comes_first():
    kernel = polyc.define(MATMUL).mm
    late_init = "[M, N, K] -> { S0_init[m, n] -> [m, n, K + 1]; S0[m, n, r_k] -> [m, n, r_k] }"
    check = kernel.check_schedule(late_init, MATMUL_SIZES)
    assert not check.valid
    kinds = {w.kind: w for w in check.violations}
    assert {"flow", "output"} <= set(kinds)
    assert kinds["output"].source == "S0_init" and kinds["output"].sink == "S0"


def test_a_reader_of_a_reordered_reduction_waits_for_every_update():
    kernel = polyc.define(
        """def rowsum(float(M, K) A) -> (C, D) {
        C(m) +=! A(m, r_k)
        D(m) = C(m) * 2
    }"""
    ).rowsum
    # D(m) after the last update in source order (r_k = K - 1) but before the others.
    early = "[M, K] -> { S0_init[m] -> [m, 0]; S0[m, r_k] -> [m, K - r_k + 1]; S1[m] -> [m, 2] }"
    check = kernel.check_schedule(early, {"M": 3, "K": 4})
    assert not check.valid
    (witness,) = check.violations
    assert (witness.kind, witness.source, witness.sink) == ("flow", "S0", "S1")
    assert witness.source_instance["r_k"] < 3
    assert kernel.check_schedule(
        "[M, K] -> { S0_init[m] -> [m, 0]; S0[m, r_k] -> [m, K - r_k]; S1[m] -> [m, K + 1] }", {"M": 3, "K": 4}
    ).valid


def test_define_compiles_a_reordered_reduction_on_the_user_schedule_path():
    kernel = polyc.define(MATMUL, schedule=REVERSED).mm
    rng = np.random.default_rng(0)
    a = rng.standard_normal((9, 13)).astype(np.float32)
    b = rng.standard_normal((13, 7)).astype(np.float32)
    # float32 sums of 13 products in another order: a few ulps of the sum of magnitudes.
    bound = 13 * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(kernel(a, b) - a.astype(np.float64) @ b) <= bound)
    stages = kernel.stages(MATMUL_SIZES)
    assert stages.path == "user_schedule" and stages.contraction is None
    # m and n carry no dependence, r_k carries the reduction's.
    assert [d.coincident for d in stages.decisions] == [(True,), (True,), (False,)]
    # (at sizes with work enough for threads)
    source = kernel.c_source({"M": 64, "K": 13, "N": 64})
    assert "#pragma omp parallel for" in source and "(-c2) + INT64_C(13)" in source
    text = str(kernel.explain(MATMUL_SIZES))
    assert "user_schedule path" in text and "the schedule is the user's" in text
    assert "not tiled: the schedule is the user's" in text
    # The schedule may also come as an option change of one compile.
    assert polyc.define(MATMUL).mm.stages(MATMUL_SIZES, schedule=REVERSED).path == "user_schedule"


def test_define_compiles_a_wavefront_and_finds_its_parallel_loop():
    rng = np.random.default_rng(1)
    u0 = rng.random(40).astype(np.float32)
    r = np.full(17, 0.25, np.float32)
    for specialize in (True, False):
        kernel = polyc.define(HEAT, schedule=WAVEFRONT, specialize=specialize).heat
        # The same operations in the same order per element: equal.
        np.testing.assert_array_equal(kernel(u0, r), heat_reference(u0, r))
    stages = kernel.stages({"N": 40, "T": 17})
    assert [d.coincident for d in stages.decisions] == [(False,), (True,)]
    # A schedule that gives a whole wavefront one time (isl orders each wavefront's points).
    flat = polyc.define(HEAT, schedule="[N, T] -> { S0[t, i] -> [2t + i]; S1[t, i] -> [2t + i] }").heat
    np.testing.assert_array_equal(flat(u0, r), heat_reference(u0, r))
    # A schedule given as an isl object (a union map, a schedule tree) compiles alike.
    tree = isl.Schedule.from_domain(kernel.stages({"N": 40, "T": 17}).program.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(isl.UnionMap(WAVEFRONT))
    )
    for given in (isl.UnionMap(WAVEFRONT), tree):
        same = polyc.define(HEAT, schedule=given).heat
        np.testing.assert_array_equal(same(u0, r), heat_reference(u0, r))


def test_threads_share_only_the_loops_the_schedule_carries_nothing_at():
    kernel = polyc.define(HEAT, schedule="[N, T] -> { S0[t, i] -> [t, i]; S1[t, i] -> [t, i] }").heat
    sizes = {"N": 70000, "T": 3}  # rows of work enough for a team of threads at every step
    source = kernel.c_source(sizes)
    # The step loop c0 carries the stencil's dependences: sequential, each row shared out.
    lines = source.splitlines()
    steps = next(n for n, line in enumerate(lines) if "for (int64_t c0" in line)
    assert "omp parallel for" not in lines[steps - 1] and "#pragma omp for simd" in lines[steps + 1]
    u0 = np.random.default_rng(2).random(sizes["N"]).astype(np.float32)
    r = np.full(sizes["T"], 0.25, np.float32)
    np.testing.assert_array_equal(kernel(u0, r), heat_reference(u0, r))


def test_define_refuses_an_illegal_schedule_with_the_violated_pair():
    kernel = polyc.define(HEAT, schedule=INTERCHANGED).heat
    u0, r = np.ones(8, np.float32), np.ones(5, np.float32)
    with pytest.raises(polyc.IllegalScheduleError, match=r"violates a flow dependence: .* through U\(") as caught:
        kernel(u0, r)
    witness = caught.value.violations[0]
    assert witness.kind == "flow" and witness.sink_instance["t"] == witness.source_instance["t"] + 1
    assert witness.sink_instance["i"] < witness.source_instance["i"]
    with pytest.raises(polyc.IllegalScheduleError):
        polyc.define(MATMUL, schedule="{ S0_init[m, n] -> [1, m, n]; S0[m, n, r_k] -> [0, m, n] }").mm(
            np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
        )


def test_the_schedule_is_part_of_the_compile_request():
    plain = polyc.define(HEAT).heat
    wave = polyc.define(HEAT, schedule=WAVEFRONT).heat
    sizes = {"N": 12, "T": 4}
    assert plain.c_source(sizes) != wave.c_source(sizes)
    assert "schedule=" in repr(wave.options) and WAVEFRONT in repr(wave.options)


def test_schedule_option_is_checked():
    with pytest.raises(polyc.PolycError, match="schedule"):
        Options.from_kwargs(schedule=3)
    with pytest.raises(polyc.PolycError, match="blocks and threads"):
        Options.from_kwargs(schedule=WAVEFRONT, backend="cuda")
    assert Options.from_kwargs(schedule=isl.UnionMap(WAVEFRONT)).schedule == str(isl.UnionMap(WAVEFRONT))
    kernel = polyc.define(HEAT, schedule="{ S9[t, i] -> [t, i] }").heat
    with pytest.raises(polyc.PolycError, match="no statement of heat"):
        kernel.c_source({"N": 4, "T": 3})
