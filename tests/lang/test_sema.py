"""The checker on valid defs: inferred ranges and shapes, element types, roles and the other
facts of a CheckedDef that every later stage reads."""

from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc.lang import checked as ir
from polyc.lang.checked import Role
from polyc.lang.sema import check_source
from polyc.lang.symbolic import Affine


def check(source: str) -> ir.CheckedDef:
    """The checked form of the only def in ``source``."""
    (definition,) = check_source(source)
    return definition


def ranges(definition: ir.CheckedDef, statement: int = 0) -> dict[str, str]:
    return {index: str(r) for index, r in definition.statements[statement].ranges}


def shape(definition: ir.CheckedDef, tensor: str) -> tuple[str, ...]:
    return tuple(str(extent) for extent in definition.tensor(tensor).shape)


def dtype(source: str, tensor: str = "B") -> np.dtype:
    return check(source).tensor(tensor).dtype


# ----------------------------------------------------------------------------- range inference
MATMUL = """
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}"""


def test_matmul_ranges_and_shape():
    matmul = check(MATMUL)
    assert ranges(matmul) == {"m": "0:M", "n": "0:N", "r_k": "0:K"}
    assert shape(matmul, "C") == ("M", "N")
    statement = matmul.statements[0]
    assert statement.indices == ("m", "n") and statement.reduction_indices == ("r_k",)
    assert (statement.op, statement.init) == ("+", True)


def test_matmul_describe():
    assert check(MATMUL).describe() == (
        "def matmul(float32(M, K) A, float32(K, N) B) -> (float32(M, N) C)\n"
        "  S0: C(m, n) +=! A(m, r_k) * B(r_k, n)\n"
        "      where m in 0:M, n in 0:N, r_k in 0:K reduce + over r_k"
    )


def test_valid_convolution_shape():
    conv = check("""
        def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
            O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
        }""")
    assert shape(conv, "O") == ("N", "F", "H - KH + 1", "W - KW + 1")
    assert ranges(conv)["r_kh"] == "0:KH"
    assert conv.tensor("O").concrete_shape(dict(N=2, C=3, H=7, W=5, F=4, KH=3, KW=2)) == (2, 4, 5, 4)


def test_strided_convolution_shape():
    conv = check("""
        def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
            O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 2 * w + r_kw) * W1(f, r_c, r_kh, r_kw)
        }""")
    assert shape(conv, "O")[2:] == ("floor((H - KH) / 2) + 1", "floor((W - KW) / 2) + 1")
    for H, KH in [(7, 3), (8, 3), (3, 3), (4, 1)]:
        extent = conv.tensor("O").shape[2].evaluate(dict(H=H, KH=KH))
        assert extent == len(range(0, H - KH + 1, 2))


def test_pooling_window_from_where():
    pool = check("""
        def pool(float(N, C, H, W) I) -> (O) {
            O(n, c, h, w) max=! I(n, c, 2 * h + r_kh, 2 * w + r_kw) where r_kh in 0:2, r_kw in 0:2
        }""")
    assert ranges(pool)["h"] == "0:floor((H - 2) / 2) + 1"
    assert pool.statements[0].op == "max"


def test_where_overrides_inference():
    half = check("def f(float(M, K) A) -> (O) { O(i) +=! A(i, r_j) where r_j in 0:K/2 }")
    assert half.statements[0].range_of("r_j").hi.evaluate({"K": 7}) == 3
    assert ranges(half)["i"] == "0:M"


def test_where_range_fixes_the_output_extent():
    stencil = check("def f(float(N) A) -> (B) { B(i) = A(i - 1) + A(i + 1) where i in 1:N-1 }")
    assert ranges(stencil) == {"i": "1:N - 1"}
    assert shape(stencil, "B") == ("N - 1",)


EXTENDED = """def ext(float(N) X) -> (A, B) {
    A(i) = X(0) where i in 0:1
    B(i) = A(i) + 1
    A(i) = X(i) * 2 where i in 1:N
}"""


def test_a_later_write_over_another_range_extends_the_tensor():
    # A tensor's extent is the largest upper bound of the ranges that write it (issue 84):
    # A's second write, over 1:N, makes A hold N elements; B, read from A when it held one, keeps 1.
    extended = check(EXTENDED)
    assert ranges(extended, 2) == {"i": "1:N"}
    assert shape(extended, "A") == ("max(1, N)",) and shape(extended, "B") == ("1",)
    # A constant difference needs no max; a smaller range leaves the shape alone.
    grown = check("def f(float(N) X) -> (A) { A(i) = X(i) where i in 0:N\n A(i) = 0 where i in N:N+2 }")
    assert shape(grown, "A") == ("N + 2",)
    kept = check("def f(float(N) X) -> (A) { A(i) = X(i)\n A(i) = A(i) * 2 where i in 1:N-1 }")
    assert shape(kept, "A") == ("N",)


def test_a_declared_shape_is_not_extended():
    with pytest.raises(polyc.BoundsError, match="outside its bounds"):
        polyc.define("def f(float(N) X) -> (float(1) A) { A(i) = X(0) where i in 0:1\n A(i) = X(i) where i in 1:N }").f(
            np.ones(4, np.float32)
        )


def test_min_of_two_extents():
    add = check("def f(float(N) A, float(M) B) -> (O) { O(i) = A(i) + B(i) }")
    assert ranges(add) == {"i": "0:min(M, N)"}
    assert add.tensor("O").concrete_shape({"N": 5, "M": 3}) == (3,)


def test_same_size_twice_gives_one_bound():
    check_twice = check("def f(float(N) A, float(N) B) -> (O) { O(i) = A(i) + B(i) }")
    assert ranges(check_twice) == {"i": "0:N"}


def test_declared_output_shape_bounds_the_range():
    declared = check("def f(float(N) A) -> (float(3) B) { B(i) = A(i) }")
    assert shape(declared, "B") == ("3",)
    assert ranges(declared) == {"i": "0:min(3, N)"}


def test_declared_output_shape_gives_an_index_its_range():
    declared = check("def f(float(N) A) -> (float(N, N) B) { B(i, j) = A(i) }")
    assert ranges(declared) == {"i": "0:N", "j": "0:N"}


@pytest.mark.parametrize(
    "subscript, expected",
    [
        ("i - 2", "2:N + 2"),
        ("N - 1 - i", "0:N"),
        ("2 * i + 1", "0:floor((N - 2) / 2) + 1"),
        ("-i", "-N + 1:1"),  # inferred as TC does; the define-time bounds check rejects the write
    ],
)
def test_one_subscript_bounds(subscript, expected):
    definition = check(f"def f(float(N) A) -> (B) {{ B(i) = A({subscript}) }}")
    (value,) = ranges(definition).values()
    assert value == expected


def test_inference_proceeds_one_unknown_at_a_time():
    # r_k is bounded by W alone; then i by A(i + r_k) with r_k known
    window = check("def f(float(N) A, float(K) W) -> (O) { O(i) +=! A(i + r_k) * W(r_k) }")
    assert ranges(window) == {"i": "0:N - K + 1", "r_k": "0:K"}


def test_exists_bounds_an_index():
    window = check("def f(float(N) A, float(K) W) -> (O) { O(i) +=! A(i + r_k) where exists W(r_k) }")
    assert ranges(window) == {"i": "0:N - K + 1", "r_k": "0:K"}


def test_where_wins_over_guarded_accesses():
    shift = check("def f(float(N) A) -> (O) { O(i) = i > 0 ? A(i - 1) : 0 where i in 0:N }")
    assert ranges(shift) == {"i": "0:N"}
    assert shape(shift, "O") == ("N",)


def test_unguarded_accesses_win_over_guarded_ones():
    # A(i - 1) alone would give 1:N + 1; the unguarded A(i) decides
    shift = check("def f(float(N) A) -> (O) { O(i) = A(i) + (i > 0 ? A(i - 1) : 0) }")
    assert ranges(shift) == {"i": "0:N"}
    assert shift.statements[0].ranges[0][1].inferred_from == ("A(i)",)


def test_guarded_accesses_bound_what_nothing_else_bounds():
    # TC's concat: m and n appear only in the branches
    concat = check(
        "def concat(float(M, N) A, float(M, N) B) -> (O1) {\n"
        "    O1(n, i, m) = i == 0 ? A(m, n) : B(m, n) where i in 0:2\n}"
    )
    assert ranges(concat) == {"n": "0:N", "i": "0:2", "m": "0:M"}
    assert shape(concat, "O1") == ("N", "2", "M")
    assert dict(concat.statements[0].ranges)["m"].inferred_from == ("A(m, n)", "B(m, n)")
    # alone, the guarded access bounds its index as any access would (TC's rule)
    shift = check("def f(float(N) A) -> (O) { O(i) = i > 0 ? A(i - 1) : 0 }")
    assert ranges(shift) == {"i": "1:N + 1"}


def test_guarded_accesses_bound_one_unknown_at_a_time():
    # TC's masked_convolve: f and r_c from the unguarded Mask, then b, r_k1, r_k2 from the
    # branch, then h and w once r_k1 and r_k2 are known
    masked = check("""
def masked_convolve(float(B, C, H, W) Input, float(F, C, K, K) Weights, uint8(F, C) Mask) -> (Output) {
    Output(b, f, h, w) +=! (Mask(f, r_c) == 1) ?
        fmax(0.0, Input(b, r_c, h + r_k1, w + r_k2)) * Weights(f, r_c, r_k1, r_k2) : 0.0
}""")
    assert ranges(masked) == {
        "b": "0:B",
        "f": "0:F",
        "h": "0:H - K + 1",
        "w": "0:W - K + 1",
        "r_c": "0:C",
        "r_k1": "0:K",
        "r_k2": "0:K",
    }
    assert dict(masked.statements[0].ranges)["f"].inferred_from == ("Mask(f, r_c)",)


def test_gather_subscript_is_not_affine():
    bag = check("def f(float(E, D) LUT, int32(B, L) I) -> (O) { O(b, d) +=! LUT(I(b, r_l), d) }")
    assert ranges(bag) == {"b": "0:B", "d": "0:D", "r_l": "0:L"}
    (lut_read,) = [r for r in ir.reads(bag.statements[0].rhs) if r.tensor == "LUT"]
    assert not lut_read.is_affine
    assert lut_read.subscripts[1] == Affine.var("d")


def test_extent_in_where_and_in_values():
    definition = check("def f(float(N) A) -> (B) { B(i) = A(i) / A.0 where i in 0:A.0 - 1 }")
    assert ranges(definition) == {"i": "0:N - 1"}
    sizes = [e for e in ir.walk(definition.statements[0].rhs) if isinstance(e, ir.SizeValue)]
    assert [s.value for s in sizes] == [Affine.var("N")]
    assert definition.tensor("B").dtype == np.float32


def test_scalar_integer_input_is_a_size():
    definition = check("def f(float(N) A, int32 K) -> (O) { O(i) = i < N ? A(i) : 0 where i in 0:K }")
    assert shape(definition, "O") == ("K",)
    assert ir.SizeBinding("K", "K", None) in definition.size_bindings


def test_size_bindings_come_from_the_first_input_dimension_naming_them():
    matmul = check(MATMUL)
    assert matmul.sizes == ("M", "K", "N")
    assert matmul.size_bindings == (
        ir.SizeBinding("M", "A", 0),
        ir.SizeBinding("K", "A", 1),
        ir.SizeBinding("N", "B", 1),
    )


def test_constant_sizes():
    blur = check("def f(float(H, W) I, float(3, 3) K) -> (O) { O(h, w) +=! I(h + r_i, w + r_j) * K(r_i, r_j) }")
    assert shape(blur, "K") == ("3", "3")
    assert shape(blur, "O") == ("H - 2", "W - 2")


# ----------------------------------------------------------------------------- 0-d tensors
@pytest.mark.parametrize("lhs", ["C", "C()"])
def test_zero_dimensional_output(lhs):
    dot = check(f"def dot(float(N) A, float(N) B) -> (C) {{ {lhs} +=! A(r_i) * B(r_i) }}")
    assert dot.tensor("C").shape == ()
    assert dot.statements[0].indices == ()
    assert dot.statements[0].reduction_indices == ("r_i",)
    assert ranges(dot) == {"r_i": "0:N"}


def test_zero_dimensional_input():
    axpy = check("def axpy(float alpha, float(N) X) -> (Y) { Y(i) = alpha * X(i) }")
    assert axpy.tensor("alpha").shape == ()
    assert axpy.tensor("Y").dtype == np.float32
    assert axpy.sizes == ("N",)


def test_zero_dimensional_self_update():
    norm = check("def f(float(N) A) -> (S) {\n S +=! A(r) * A(r)\n S = sqrt(S)\n}")
    assert [s.op for s in norm.statements] == ["+", "="]


# ----------------------------------------------------------------------------- roles and order
def test_temporaries_and_output_order():
    definition = check("""
        def f(float(N) A) -> (Y, X) {
            T(i) = A(i) * 2
            X(i) = T(i) + 1
            U(i) = X(i) * T(i)
            Y(i) = U(i)
        }""")
    assert definition.outputs == ("Y", "X")
    assert definition.temporaries == ("T", "U")
    assert [t.name for t in definition.tensors] == ["A", "Y", "X", "T", "U"]
    assert [definition.tensor(n).role for n in ("A", "Y", "T")] == [Role.INPUT, Role.OUTPUT, Role.TEMPORARY]
    assert "temporary float32(N) T" in definition.describe()


def test_statements_are_numbered_in_order():
    definition = check("def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(i) = B(i) + 1\n B(i) = fmax(B(i), 0)\n}")
    assert [s.name for s in definition.statements] == ["S0", "S1", "S2"]
    assert all(s.target == "B" for s in definition.statements)


# ----------------------------------------------------------------------------- operators
@pytest.mark.parametrize(
    "op, expected",
    [
        ("+=!", ("+", True)),
        ("+=", ("+", False)),
        ("*=!", ("*", True)),
        ("*=", ("*", False)),
        ("min=!", ("min", True)),
        ("max=", ("max", False)),
        ("=", ("=", False)),
    ],
)
def test_reduction_operators(op, expected):
    definition = check(
        f"def f(float(N, M) A) -> (B) {{ B(i) {op} A(i, {'0' if op == '=' else 'r_j'}) "
        f"{'where exists A(i, 0)' if op == '=' else ''} }}"
    )
    statement = definition.statements[0]
    assert (statement.op, statement.init) == expected


def test_init_without_reduction_index_is_assignment():
    statement = check("def f(float(N) A) -> (B) { B(i) +=! A(i) }").statements[0]
    assert (statement.op, statement.init, statement.reduction_indices) == ("=", False, ())


def test_accumulation_without_reduction_index_keeps_its_operator():
    statement = check("def f(float(N) A) -> (B) { B(i) += A(i) }").statements[0]
    assert (statement.op, statement.init) == ("+", False)


def test_reduction_indices_in_order_of_appearance():
    statement = check("""
        def f(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
            O(n, f, h, w) +=! W1(f, r_c, r_kh, r_kw) * I(n, r_c, h + r_kh, w + r_kw)
        }""").statements[0]
    assert statement.reduction_indices == ("r_c", "r_kh", "r_kw")
    assert [i for i, _ in statement.ranges] == ["n", "f", "h", "w", "r_c", "r_kh", "r_kw"]


# ----------------------------------------------------------------------------- types
@pytest.mark.parametrize(
    "signature, rhs, expected",
    [
        # weak literals take the other operand's type
        ("float16(N) A", "2 * A(i)", np.float16),
        ("float16(N) A", "A(i) * 0.5 + 1", np.float16),
        ("double(N) A", "A(i) * 0.1", np.float64),
        ("int8(N) A", "A(i) + 1", np.int8),
        ("uint8(N) A", "A(i) - 1", np.uint8),
        ("int64(N) A", "A(i) * 3", np.int64),
        # a float literal makes integer arithmetic float32
        ("int32(N) A", "A(i) * 0.5", np.float32),
        ("int64(N) A", "A(i) + 1.0", np.float32),
        # integers and floats: the float's type (C and TC), not numpy's float64
        ("int32(N) A, float(N) X", "A(i) * X(i)", np.float32),
        ("int64(N) A, float16(N) X", "A(i) + X(i)", np.float16),
        ("float(N) A", "A(i) / N", np.float32),
        ("float(N) A", "A(i) * i", np.float32),
        # floats with floats, integers with integers: the wider
        ("float16(N) A, float(N) X", "A(i) + X(i)", np.float32),
        ("float(N) A, double(N) X", "A(i) + X(i)", np.float64),
        ("int8(N) A, int32(N) X", "A(i) + X(i)", np.int32),
        ("int32(N) A, int64(N) X", "A(i) * X(i)", np.int64),
        ("int64(N) A, uint64(N) X", "A(i) + X(i)", np.int64),
        # literal-only expressions
        ("float(N) A", "2 where i in 0:N", np.int32),
        ("float(N) A", "2.5 where i in 0:N", np.float32),
        ("float(N) A", "3000000000 where i in 0:N", np.int64),
        # indices and sizes are int64 values
        ("float(N) A", "i + N where i in 0:N", np.int64),
        # comparisons and logic give bool; bool in arithmetic is int32
        ("float(N) A", "A(i) > 0", np.bool_),
        ("float(N) A", "A(i) > 0 && A(i) < 1", np.bool_),
        ("float(N) A", "!(A(i) > 0)", np.bool_),
        ("float(N) A", "(A(i) > 0) + (A(i) < 0)", np.int32),
        ("float(N) A", "(A(i) > 0) * A(i)", np.float32),
        # casts
        ("float(N) A", "int32(A(i))", np.int32),
        ("float(N) A", "float(i) where i in 0:N", np.float32),
        ("int32(N) A", "double(A(i)) / 3", np.float64),
        ("float(N) A", "float16(A(i)) * 2", np.float16),
        ("float(N) A", "bool(A(i))", np.bool_),
        # builtins: math functions compute in float (float32 for integers), min/max/abs keep the type
        ("int32(N) A", "exp(A(i))", np.float32),
        ("double(N) A", "sqrt(A(i))", np.float64),
        ("float16(N) A", "tanh(A(i))", np.float16),
        ("int32(N) A", "max(A(i), 0)", np.int32),
        ("int16(N) A", "abs(A(i))", np.int16),
        ("float(N) A", "fmax(A(i), 0)", np.float32),
        # a ternary unifies its branches
        ("float(N) A", "A(i) > 0 ? A(i) : 0", np.float32),
        ("int8(N) A", "A(i) > 0 ? A(i) : -1", np.int8),
    ],
)
def test_result_types(signature, rhs, expected):
    assert dtype(f"def f({signature}) -> (B) {{ B(i) = {rhs} }}") == np.dtype(expected)


def test_right_hand_side_is_converted_to_the_target_type():
    definition = check("def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(i) = B(i) > 0 }")
    second = definition.statements[1].rhs
    assert second.dtype == np.float32
    assert isinstance(second, ir.Cast) and second.operand.dtype == np.bool_


@pytest.mark.parametrize("declared, expected", [("int32", np.int32), ("double", np.float64), ("float16", np.float16)])
def test_annotated_output_keeps_its_type(declared, expected):
    definition = check(f"def f(float(N) A) -> ({declared}(N) B) {{ B(i) = A(i) * 2 }}")
    assert definition.tensor("B").dtype == np.dtype(expected)
    assert definition.statements[0].rhs.dtype == np.dtype(expected)


def test_literals_fold_into_the_operation_type():
    rhs = check("def f(float16(N) A) -> (B) { B(i) = A(i) * 0.5 }").statements[0].rhs
    assert isinstance(rhs, ir.Binary) and rhs.dtype == np.float16
    assert rhs.rhs == ir.Const(np.dtype(np.float16), 0.5)


# ----------------------------------------------------------------------------- let bindings
def test_let_bindings_are_inlined():
    with_let = check("def f(float(N) A, float(N) B) -> (O) { O(i) = t * t + u where t = A(i) - B(i), u = t * 2 }")
    written_out = check(
        "def f(float(N) A, float(N) B) -> (O) { O(i) = (A(i) - B(i)) * (A(i) - B(i)) + (A(i) - B(i)) * 2 }"
    )
    assert with_let.statements[0].rhs == written_out.statements[0].rhs
    assert ranges(with_let) == {"i": "0:N"}


def test_let_bound_accesses_bound_ranges():
    definition = check("def f(float(M, K) A) -> (O) { O(i) +=! x * x where x = A(i, r_k) }")
    assert ranges(definition) == {"i": "0:M", "r_k": "0:K"}


# ----------------------------------------------------------------------------- several defs
def test_every_def_of_a_source_is_checked_in_order():
    first, second = check_source(MATMUL + "\ndef twice(float(N) A) -> (B) { B(i) = 2 * A(i) }")
    assert (first.name, second.name) == ("matmul", "twice")
    assert second.sizes == ("N",)
