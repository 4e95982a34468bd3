"""The contraction kernel's packing as polyhedral statements (polyc.schedule.packing): isl proves
the statements right for every register block, rejects wrong ones, and the C back end prints the
general packing path from isl's loops.  The numeric checks of the packed kernels are in
test_gemm.py (every layout, edge blocks, threads, sanitizers) and test_neon.py."""

from __future__ import annotations

import dataclasses

import islpy as isl
import numpy as np
import pytest
from kernels import assert_close

import polyc
from polyc.codegen.gemm import ISA_GUARDS, micro_kernel_shapes
from polyc.errors import PolycError
from polyc.schedule import packing

SHAPES = sorted(
    {(s.mr, s.nr) for isa in ISA_GUARDS for dtype in (np.float32, np.float64) for s in micro_kernel_shapes(isa, dtype)}
)


@pytest.mark.parametrize("mr, nr", SHAPES, ids=[f"{mr}x{nr}" for mr, nr in SHAPES])
def test_every_register_block_has_proved_packing(mr, nr):
    program = packing.packing_program(mr, nr)
    packing.check_packing(program)
    names = {s.name for s in program.statements}
    assert names == {"PackA", "PadA", "PackB", "PadB"}
    # The program reads as isl text, with the block's schedule tree.
    text = program.to_isl_text()
    assert "PackA[s, k, i] -> A[" in text and "schedule of a block:" in text


def _broken(program: packing.PackingProgram, name: str, **changes) -> packing.PackingProgram:
    """``program`` with one statement's domain, write or read replaced (given as isl text; a
    larger domain needs its write and read given too, as the stored ones are restricted to
    the old domain)."""
    statement = program.statement(name)
    params = f"[{', '.join(packing.BLOCK_PARAMETERS)}]"
    parsed = {}
    for field, text in changes.items():
        kind = isl.Set if field == "domain" else isl.Map
        parsed[field] = kind.read_from_str(program.context.get_ctx(), f"{params} -> {{ {text} }}")
    if "domain" in parsed:
        domain = parsed["domain"]
        parsed.setdefault("write", statement.write)
        parsed["write"] = parsed["write"].intersect_domain(domain)
        if statement.read is not None:
            parsed.setdefault("read", statement.read)
            parsed["read"] = parsed["read"].intersect_domain(domain)
    replaced = dataclasses.replace(statement, **parsed)
    return dataclasses.replace(program, statements=tuple(replaced if s.name == name else s for s in program.statements))


@pytest.mark.parametrize(
    "name, changes, complaint",
    [
        # The zero rows of the last sliver forgotten: the micro-kernel would read garbage.
        (
            "PadA",
            {"domain": "PadA[s, k, i] : 0 <= k < kc and 0 <= i < 6 and mc < 6 s + i and 6 s < mc"},
            "no statement wrote",
        ),
        # Rows copied one place off.
        ("PackA", {"read": "PackA[s, k, i] -> A[ic + 6 s + i + 1, pc + k]"}, "(do not hold|outside an operand)"),
        # B's columns copied transposed within a sliver.
        ("PackB", {"read": "PackB[s, k, j] -> B[pc + j, jc + 64 s + k]"}, "(do not hold|outside an operand)"),
        # Two instances writing one element.
        ("PackB", {"write": "PackB[s, k, j] -> Bpack[s, k, 0]"}, "same buffer element"),
        # The K range ignored: the copy reads past the block and past B.
        (
            "PackB",
            {
                "domain": "PackB[s, k, j] : 0 <= k <= kc and 0 <= j < 64 and 0 <= 64 s + j < nc",
                "write": "PackB[s, k, j] -> Bpack[s, k, j]",
                "read": "PackB[s, k, j] -> B[pc + k, jc + 64 s + j]",
            },
            "(outside an operand|outside its buffers)",
        ),
    ],
)
def test_wrong_packing_is_rejected(name, changes, complaint):
    program = _broken(packing.packing_program(6, 64), name, **changes)
    with pytest.raises(PolycError, match=complaint):
        packing.check_packing(program)


def test_sliver_loops_come_from_isl():
    program = packing.packing_program(6, 64)
    edge = packing.sliver_loops(program, "A").to_C_str()
    assert "PackA(" in edge and "PadA(" in edge and "mc" in edge
    # A sliver wholly inside the block: no zero fill, no edge test.
    whole = packing.sliver_loops(program, "B", full=True).to_C_str()
    assert "PackB(" in whole and "PadB(" not in whole and "nc" not in whole


def test_generated_kernel_packs_through_the_statements():
    kernel = polyc.define("""def mm(float(M, K) A, float(K, N) B) -> (C) {
        C(m, n) +=! A(m, r_k) * B(r_k, n) }""").mm
    source = kernel.c_source({"M": 50, "K": 70, "N": 90})
    for function in (
        "polyc_pack_a_sliver_",
        "polyc_pack_a_contiguous_",
        "polyc_pack_b_sliver_",
        "polyc_pack_b_contiguous_",
    ):
        assert function in source
    assert "the statements PackA and PadA of polyc.schedule.packing" in source


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 3, 65), (13, 300, 17), (97, 129, 130)])
def test_gathered_slivers_match_numpy(m, k, n):
    """Rows of A made of two indices (the second of extent 3) are not contiguous across the
    first, and C's columns likewise: every sliver takes the general, isl-generated path."""
    kernel = polyc.define("""def g(float(P, K, Q) A, float(R, K, S) B) -> (C) {
        C(p, q, r, s) +=! A(p, r_k, q) * B(r, r_k, s) }""").g
    rng = np.random.default_rng(m * 1000 + n)
    p, r = max(1, m // 3), max(1, n // 5)
    A = rng.uniform(-1, 1, (p, k, 3)).astype(np.float32)
    B = rng.uniform(-1, 1, (r, k, 5)).astype(np.float32)
    assert kernel.stages({"P": p, "K": k, "Q": 3, "R": r, "S": 5}).contraction is not None
    expected = np.einsum("pkq,rks->pqrs", A.astype(np.float64), B.astype(np.float64))
    assert_close(kernel(A, B), expected, 2 * k, np.float32, (A, B))


def test_padding_must_come_from_the_zero_fill():
    """Copying the rows past the block from A instead of zero-filling them leaves the padded
    lanes with whatever A holds there (and reads past A at its edge): rejected."""
    program = _broken(
        packing.packing_program(6, 64),
        "PackA",
        domain="PackA[s, k, i] : 0 <= k < kc and 0 <= i < 6 and 0 <= 6 s < mc",
        write="PackA[s, k, i] -> Apack[s, k, i]",
        read="PackA[s, k, i] -> A[ic + 6 s + i, pc + k]",
    )
    program = _broken(program, "PadA", domain="PadA[s, k, i] : 1 = 0")
    with pytest.raises(PolycError, match="padded micro-kernel lanes"):
        packing.check_packing(program)


def test_packing_must_come_before_the_micro_kernel():
    """The proof depends on the block's schedule: with the A block packed after the
    micro-kernel ran, the kernel reads buffer elements nothing wrote yet."""
    program = packing.packing_program(8, 32)
    params = f"[{', '.join(packing.BLOCK_PARAMETERS)}]"
    late = isl.UnionMap.read_from_str(
        program.context.get_ctx(),
        f"{params} -> {{ "
        "PackB[s, k, j] -> [0, s, k, j, 0, 0]; PadB[s, k, j] -> [0, s, k, j, 0, 0]; "
        "PackA[s, k, i] -> [3, s, k, i, 0, 0]; PadA[s, k, i] -> [3, s, k, i, 0, 0]; "
        "Kernel[sa, sb, k, i, j] -> [2, sb, sa, k, i, j] }",
    )
    with pytest.raises(PolycError, match="no statement wrote"):
        packing.check_packing(dataclasses.replace(program, order=late))
