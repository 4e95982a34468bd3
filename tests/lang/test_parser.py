"""The TC parser on valid input: every construct, checked against the syntax tree it builds.

Syntax tree nodes compare without their locations, so expected trees are written with the
short constructors below; locations are checked separately where they matter.
"""

import pytest

from polyc.errors import SourceLocation, TCSyntaxError
from polyc.lang import ast
from polyc.lang.lexer import EOF, FLOAT, INT, NAME, tokenize
from polyc.lang.parser import MAX_NESTING, parse


# ----------------------------------------------------------------------------- helpers
def parse_def(text: str) -> ast.Def:
    """Parse a source holding exactly one def and return it."""
    source = parse(text)
    assert len(source.defs) == 1
    return source.defs[0]


def parse_statements(body: str) -> tuple[ast.Statement, ...]:
    """Parse statements inside a def whose signature does not matter to the parser."""
    return parse_def(f"def f(float(N) A, float(N) B) -> (C, D) {{\n{body}\n}}").statements


def parse_rhs(expr: str) -> ast.Expr:
    """Parse ``expr`` as the right-hand side of a statement."""
    (statement,) = parse_statements(f"C(i) = {expr}")
    return statement.rhs


def N(name: str) -> ast.Name:
    return ast.Name(name)


def num(value: int | float) -> ast.Number:
    return ast.Number(value, isinstance(value, float))


def bin_(op: str, lhs: ast.Expr, rhs: ast.Expr) -> ast.Binary:
    return ast.Binary(op, lhs, rhs)


def acc(tensor: str, *args: ast.Expr) -> ast.Access:
    return ast.Access(tensor, tuple(args))


def call(func: str, *args: ast.Expr) -> ast.Call:
    return ast.Call(func, tuple(args))


def neg(operand: ast.Expr) -> ast.Unary:
    return ast.Unary("-", operand)


def stmt(target, indices, op, init, rhs, where=()) -> ast.Statement:
    return ast.Statement(target, tuple(indices), op, init, rhs, tuple(where))


a, b, c, d, e = N("a"), N("b"), N("c"), N("d"), N("e")


# ----------------------------------------------------------------------------- lexer
def test_tokens_carry_kinds_and_positions():
    tokens = tokenize("def f(float(N) A)\n  -> (B) { B(i) +=! A(i) }")
    assert [t.kind for t in tokens[:6]] == ["def", NAME, "(", NAME, "(", NAME]
    arrow = tokens[9]
    assert (arrow.kind, arrow.line, arrow.col) == ("->", 2, 3)
    assert tokens[-1].kind == EOF


def test_extent_dot_is_not_a_float():
    kinds = [t.kind for t in tokenize("T.0 + .5 + T . 12")]
    assert kinds == [NAME, ".", INT, "+", FLOAT, "+", NAME, ".", INT, EOF]


@pytest.mark.parametrize("text", ["2", "0", "007", "123456789012345678901234567890"])
def test_integer_literals(text):
    (token, _) = tokenize(text)
    assert (token.kind, token.text) == (INT, text)


@pytest.mark.parametrize("text", ["0.5", "1.", ".5", "1e-5", "3e4", "1.e5", "2E+3", "1.5e-10"])
def test_float_literals(text):
    (token, _) = tokenize(text)
    assert (token.kind, token.text) == (FLOAT, text)


def test_longest_operator_wins():
    kinds = [t.kind for t in tokenize("a<=b>=c==d!=e&&f||g->h+=i*=j")][:-1]
    assert kinds[1::2] == ["<=", ">=", "==", "!=", "&&", "||", "->", "+=", "*="]


def test_comments_and_whitespace_are_dropped():
    tokens = tokenize("# a comment\n\ta # another\r\n  b#c\n")
    assert [(t.text, t.line, t.col) for t in tokens[:-1]] == [("a", 2, 2), ("b", 3, 3)]


def test_eof_sits_just_after_the_last_token():
    eof = tokenize("def f(\n  A\n\n# trailing comment\n")[-1]
    assert (eof.kind, eof.line, eof.col) == (EOF, 2, 4)
    assert tokenize("")[-1].loc == SourceLocation(1, 1)


# ----------------------------------------------------------------------------- expressions
@pytest.mark.parametrize(
    "text, tree",
    [
        ("a + b * c", bin_("+", a, bin_("*", b, c))),
        ("a * b + c", bin_("+", bin_("*", a, b), c)),
        ("a - b - c", bin_("-", bin_("-", a, b), c)),
        ("a / b / c", bin_("/", bin_("/", a, b), c)),
        ("a % b * c", bin_("*", bin_("%", a, b), c)),
        ("a - b + c", bin_("+", bin_("-", a, b), c)),
        ("(a + b) * c", bin_("*", bin_("+", a, b), c)),
        ("a * (b - c)", bin_("*", a, bin_("-", b, c))),
        ("a < b + c", bin_("<", a, bin_("+", b, c))),
        ("a + b <= c", bin_("<=", bin_("+", a, b), c)),
        ("a < b == c > d", bin_("==", bin_("<", a, b), bin_(">", c, d))),
        ("a == b != c", bin_("!=", bin_("==", a, b), c)),
        ("a >= b >= c", bin_(">=", bin_(">=", a, b), c)),
        ("a && b || c && d", bin_("||", bin_("&&", a, b), bin_("&&", c, d))),
        ("a || b && c", bin_("||", a, bin_("&&", b, c))),
        ("a == b && c != d", bin_("&&", bin_("==", a, b), bin_("!=", c, d))),
        ("-a * b", bin_("*", neg(a), b)),
        ("a * -b", bin_("*", a, neg(b))),
        ("- -a", neg(neg(a))),
        ("--a", neg(neg(a))),
        ("a - -b", bin_("-", a, neg(b))),
        ("!a && b", bin_("&&", ast.Unary("!", a), b)),
        ("!(a && b)", ast.Unary("!", bin_("&&", a, b))),
        ("+a", a),
        ("+a * +b", bin_("*", a, b)),
        ("-(a + b)", neg(bin_("+", a, b))),
        ("((a))", a),
    ],
)
def test_precedence_and_associativity(text, tree):
    assert parse_rhs(text) == tree


@pytest.mark.parametrize(
    "text, tree",
    [
        ("a ? b : c", ast.Ternary(a, b, c)),
        ("a ? b : c ? d : e", ast.Ternary(a, b, ast.Ternary(c, d, e))),
        ("a ? b ? c : d : e", ast.Ternary(a, ast.Ternary(b, c, d), e)),
        ("a || b ? c : d", ast.Ternary(bin_("||", a, b), c, d)),
        ("a < b ? a + 1 : b * 2", ast.Ternary(bin_("<", a, b), bin_("+", a, num(1)), bin_("*", b, num(2)))),
        ("(a ? b : c) + d", bin_("+", ast.Ternary(a, b, c), d)),
        ("a ? b : c + d", ast.Ternary(a, b, bin_("+", c, d))),
    ],
)
def test_ternary_is_loosest_and_right_associative(text, tree):
    assert parse_rhs(text) == tree


@pytest.mark.parametrize(
    "text, value, is_float",
    [
        ("2", 2, False),
        ("0", 0, False),
        ("007", 7, False),
        ("0.5", 0.5, True),
        ("1.", 1.0, True),
        (".5", 0.5, True),
        ("1e-5", 1e-5, True),
        ("3e4", 3e4, True),
        ("1.e5", 1e5, True),
        ("2E+3", 2e3, True),
        ("2.0", 2.0, True),
    ],
)
def test_number_literals(text, value, is_float):
    number = parse_rhs(text)
    assert number == ast.Number(value, is_float)
    assert type(number.value) is (float if is_float else int)


def test_largest_literals():
    assert parse_rhs("18446744073709551615") == num(2**64 - 1)
    assert parse_rhs("000000000000000000000000001") == num(1)
    assert parse_rhs("1.7e308") == num(1.7e308)


def test_negative_number_is_a_unary_minus():
    assert parse_rhs("-1") == neg(num(1))


@pytest.mark.parametrize(
    "text, tree",
    [
        ("T.0", ast.Extent("T", 0)),
        ("T.12", ast.Extent("T", 12)),
        ("T . 1", ast.Extent("T", 1)),
        ("A.0 - 1", bin_("-", ast.Extent("A", 0), num(1))),
        ("A(i) * B.1", bin_("*", acc("A", N("i")), ast.Extent("B", 1))),
        ("A(A.0 - 1 - i)", acc("A", bin_("-", bin_("-", ast.Extent("A", 0), num(1)), N("i")))),
        ("x.0+.5", bin_("+", ast.Extent("x", 0), num(0.5))),
    ],
)
def test_extent(text, tree):
    assert parse_rhs(text) == tree


@pytest.mark.parametrize(
    "text, tree",
    [
        ("exp(a)", call("exp", a)),
        ("fmax(A(i), 0)", call("fmax", acc("A", N("i")), num(0))),
        ("min(a, b)", call("min", a, b)),
        ("max(a, b)", call("max", a, b)),
        ("fma(a, b, c)", call("fma", a, b, c)),
        ("int32(a)", call("int32", a)),
        ("float(A(i)) / 2", bin_("/", call("float", acc("A", N("i"))), num(2))),
        ("A(i)", acc("A", N("i"))),
        ("A(i, j + 1)", acc("A", N("i"), bin_("+", N("j"), num(1)))),
        ("A()", acc("A")),
        ("my_tensor(i)", acc("my_tensor", N("i"))),
        ("LUT(I(b, r_l), d)", acc("LUT", acc("I", N("b"), N("r_l")), d)),
        ("A(2 * h + kh, w)", acc("A", bin_("+", bin_("*", num(2), N("h")), N("kh")), N("w"))),
        ("exp(A(i) - M(i))", call("exp", bin_("-", acc("A", N("i")), acc("M", N("i"))))),
        ("A (i)", acc("A", N("i"))),
    ],
)
def test_calls_and_accesses(text, tree):
    assert parse_rhs(text) == tree


@pytest.mark.parametrize("name", ["i", "r_kh", "_x", "N", "x1", "exp", "float", "defs", "inside"])
def test_names(name):
    """Builtin, type and keyword-like names are plain names when nothing follows them."""
    assert parse_rhs(name) == N(name)


# ----------------------------------------------------------------------------- statements
@pytest.mark.parametrize(
    "text, op, init",
    [
        ("C(i) = A(i)", "=", False),
        ("C(i) =! A(i)", "=", True),
        ("C(i) += A(i)", "+=", False),
        ("C(i) +=! A(i)", "+=", True),
        ("C(i) +=!A(i)", "+=", True),
        ("C(i)+=!A(i)", "+=", True),
        ("C(i) *= A(i)", "*=", False),
        ("C(i) *=! A(i)", "*=", True),
        ("C(i) min= A(i)", "min=", False),
        ("C(i) min=! A(i)", "min=", True),
        ("C(i) max= A(i)", "max=", False),
        ("C(i) max=! A(i)", "max=", True),
        ("C(i)max=!A(i)", "max=", True),
    ],
)
def test_assignment_operators(text, op, init):
    assert parse_statements(text) == (stmt("C", ["i"], op, init, acc("A", N("i"))),)


def test_detached_bang_is_logical_not():
    (statement,) = parse_statements("C(i) += !A(i)")
    assert (statement.op, statement.init) == ("+=", False)
    assert statement.rhs == ast.Unary("!", acc("A", N("i")))


def test_init_marker_then_not():
    (statement,) = parse_statements("C(i) =!!A(i)")
    assert statement.init and statement.rhs == ast.Unary("!", acc("A", N("i")))


@pytest.mark.parametrize("text", ["C() +=! A(r)", "C +=! A(r)", "C()+=!A(r)", "C+=!A(r)"])
def test_zero_dimensional_target(text):
    assert parse_statements(text) == (stmt("C", [], "+=", True, acc("A", N("r"))),)


def test_lhs_indices_and_their_locations():
    (statement,) = parse_statements("  C(b, m,  n) = A(b)")
    assert statement.indices == ("b", "m", "n")
    assert statement.loc == SourceLocation(2, 3)
    assert statement.index_locs == (SourceLocation(2, 5), SourceLocation(2, 8), SourceLocation(2, 12))


def test_parenthesised_lhs_index_is_still_a_name():
    (statement,) = parse_statements("C((i)) = A(i)")
    assert statement.indices == ("i",)


@pytest.mark.parametrize(
    "body",
    [
        "C(i) = A(i)\nD(i) = B(i)",
        "C(i) = A(i); D(i) = B(i);",
        "C(i) = A(i) D(i) = B(i)",
        "C(i) = A(i)\n\n\n   D(i) = B(i)\n",
        "C(i) = A(i) # first\n# between\nD(i) = B(i) # second",
    ],
)
def test_statements_are_juxtaposed(body):
    assert parse_statements(body) == (
        stmt("C", ["i"], "=", False, acc("A", N("i"))),
        stmt("D", ["i"], "=", False, acc("B", N("i"))),
    )


def test_statement_ends_where_expression_cannot_continue():
    """A 0-d target after a name: the name ends the expression, not a juxtaposition."""
    statements = parse_statements("C = a\nD = b - c\nC(i) = -d")
    assert statements == (
        stmt("C", [], "=", False, a),
        stmt("D", [], "=", False, bin_("-", b, c)),
        stmt("C", ["i"], "=", False, neg(d)),
    )


def test_tensor_updated_by_several_statements():
    statements = parse_statements("C(i) = A(i)\nC(i) = C(i) + B(i)\nC(i) = fmax(C(i), 0)")
    assert [s.target for s in statements] == ["C", "C", "C"]
    assert statements[2].rhs == call("fmax", acc("C", N("i")), num(0))


# ----------------------------------------------------------------------------- where clauses
def test_range_clause():
    (statement,) = parse_statements("C(i) = A(i) where i in 0:N")
    assert statement.where == (ast.RangeClause("i", num(0), N("N")),)


def test_range_clause_with_affine_bounds():
    (statement,) = parse_statements("C(i) = A(i + k) where k in 0:K, i in 1:N - K + 1")
    assert statement.where == (
        ast.RangeClause("k", num(0), N("K")),
        ast.RangeClause("i", num(1), bin_("+", bin_("-", N("N"), N("K")), num(1))),
    )


def test_exists_clause():
    (statement,) = parse_statements("C(i) = A(i) where exists B(i, j + 1)")
    (clause,) = statement.where
    assert clause == ast.ExistsClause(acc("B", N("i"), bin_("+", N("j"), num(1))))
    assert isinstance(clause.access, ast.Access)


def test_let_clause():
    (statement,) = parse_statements("C(i) = x * x where x = A(i) + 1")
    assert statement.where == (ast.LetClause("x", bin_("+", acc("A", N("i")), num(1))),)


def test_mixed_clauses_then_next_statement():
    statements = parse_statements("C(i) = s where i in 0:N, exists A(i), s = A(i) * 2;\n D(j) = B(j) where j in 0:N")
    assert statements[0].where == (
        ast.RangeClause("i", num(0), N("N")),
        ast.ExistsClause(acc("A", N("i"))),
        ast.LetClause("s", bin_("*", acc("A", N("i")), num(2))),
    )
    assert statements[1] == stmt("D", ["j"], "=", False, acc("B", N("j")), [ast.RangeClause("j", num(0), N("N"))])


def test_where_clause_locations():
    (statement,) = parse_statements("C(i) = A(i) where i in 0:N, exists A(i)")
    assert [clause.loc for clause in statement.where] == [SourceLocation(2, 19), SourceLocation(2, 29)]
    assert statement.where[1].access.loc == SourceLocation(2, 36)


# ----------------------------------------------------------------------------- signatures
def test_matmul_whole_tree():
    definition = parse_def(
        "def matmul(float(M, K) A, float(K, N) B) -> (C) {\n    C(m, n) +=! A(m, r_k) * B(r_k, n)\n}"
    )
    assert definition == ast.Def(
        "matmul",
        (
            ast.Param("A", "float", (N("M"), N("K"))),
            ast.Param("B", "float", (N("K"), N("N"))),
        ),
        (ast.Param("C", None, None),),
        (stmt("C", ["m", "n"], "+=", True, bin_("*", acc("A", N("m"), N("r_k")), acc("B", N("r_k"), N("n")))),),
    )
    assert definition.loc == SourceLocation(1, 1)
    assert definition.inputs[1].loc == SourceLocation(1, 27)


def test_scalar_inputs():
    definition = parse_def("def f(float x, double() y, int32(3) z) -> (C) { C = x }")
    assert definition.inputs == (
        ast.Param("x", "float", None),
        ast.Param("y", "double", ()),
        ast.Param("z", "int32", (num(3),)),
    )


def test_constant_and_named_sizes():
    definition = parse_def("def f(float(2, N, 16, M) A) -> (C) { C(i) = A(0, i, 1, 2) }")
    assert definition.inputs[0].sizes == (num(2), N("N"), num(16), N("M"))


@pytest.mark.parametrize(
    "type_name",
    ["float", "float32", "float64", "double", "float16", "half", "int8", "int64", "uint8", "uint64", "bool"],
)
def test_every_type_name(type_name):
    definition = parse_def(f"def f({type_name}(N) A) -> ({type_name}(N) C) {{ C(i) = A(i) }}")
    assert definition.inputs[0].dtype == definition.outputs[0].dtype == type_name


def test_typed_and_bare_outputs():
    definition = parse_def("def f(float(M, N) A) -> (int32(M, N) out, S, float t, float() u, bool(4) v) { S = 1 }")
    assert definition.outputs == (
        ast.Param("out", "int32", (N("M"), N("N"))),
        ast.Param("S", None, None),
        ast.Param("t", "float", None),
        ast.Param("u", "float", ()),
        ast.Param("v", "bool", (num(4),)),
    )


def test_empty_inputs_outputs_and_body():
    definition = parse_def("def nothing() -> () {}")
    assert (definition.inputs, definition.outputs, definition.statements) == ((), (), ())


# ----------------------------------------------------------------------------- whole sources
def test_several_defs_and_comments():
    source = parse(
        "# two kernels\n"
        "def add(float(N) A, float(N) B) -> (C) { # inline\n"
        "  C(i) = A(i) + B(i) # sum\n"
        "}\n"
        "# between\n"
        "def scale(float(N) A, float s) -> (C) { C(i) = s * A(i) }\n"
        "# trailing, no newline",
        filename="kernels.tc",
    )
    assert [definition.name for definition in source.defs] == ["add", "scale"]
    assert source.get("scale").inputs[1] == ast.Param("s", "float", None)
    assert source.get("missing") is None
    assert source.filename == "kernels.tc"
    assert source.defs[1].loc == SourceLocation(6, 1, "kernels.tc")
    assert source.text.startswith("# two kernels")


def test_locations_carry_filename_and_first_token():
    source = parse("def f(float(N) A) -> (C) {\n  C(i) = (A(i)) * 2 - b\n}", filename="x.tc")
    rhs = source.defs[0].statements[0].rhs
    assert rhs.loc == SourceLocation(2, 11, "x.tc")  # the Binary starts with A, inside the parens
    assert rhs.rhs.loc == SourceLocation(2, 23, "x.tc")


CLASSIC_SOURCES = {
    "conv2d": """
        def conv2d(float(N, C, H, W) I, float(M, C, KH, KW) W1, float(M) B) -> (O) {
            O(n, m, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(m, r_c, r_kh, r_kw)
            O(n, m, h, w) = O(n, m, h, w) + B(m)
            O(n, m, h, w) = fmax(O(n, m, h, w), 0)
        }""",
    "strided_maxpool": """
        def maxpool(float(B, C, H, W) I) -> (O) {
            O(b, c, h, w) max=! I(b, c, 2 * h + r_kh, 2 * w + r_kw)
                where r_kh in 0:3, r_kw in 0:3
        }""",
    "softmax": """
        def softmax(float(N, D) I) -> (O, expsum, maxVal) {
            maxVal(n) max=! I(n, d)
            expsum(n) +=! exp(I(n, d) - maxVal(n))
            O(n, d) = exp(I(n, d) - maxVal(n)) / expsum(n)
        }""",
    "embedding": """
        def embed(float(E, D) LUT, int32(B, L) I) -> (O) {
            O(b, d) +=! LUT(I(b, r_l), d)
        }""",
    "padded": """
        def pad(float(N) A) -> (O) {
            O(i) = (i >= 1 && i < N + 1) ? A(i - 1) : 0.0 where i in 0:N + 2, exists A(i - 1)
        }""",
    "flip": """
        def flip(float(N, M) A) -> (O) { O(i, j) = A(A.0 - 1 - i, j) }""",
    "argmax_value": """
        def amax(float(N) A) -> (float m, int32 k) {
            m max=! A(r); k = 0
        }""",
}


@pytest.mark.parametrize("name", sorted(CLASSIC_SOURCES))
def test_classic_kernels_parse(name):
    assert isinstance(parse(CLASSIC_SOURCES[name]), ast.SourceFile)


# ----------------------------------------------------------------------------- nesting limits
def test_reasonable_nesting_is_accepted():
    assert parse_rhs("(" * 90 + "a" + ")" * 90) == a
    assert parse_rhs("-" * 150 + "a") is not None
    sum_of_150 = parse_rhs(" + ".join(["a"] * 150))
    assert isinstance(sum_of_150, ast.Binary)
    assert parse_rhs("exp(" * 60 + "a" + ")" * 60) is not None


@pytest.mark.parametrize(
    "expr",
    [
        "(" * 10_000 + "a" + ")" * 10_000,
        "-" * 10_000 + "a",
        " + ".join(["a"] * 10_000),
        "a ? b : " * 10_000 + "c",
        "A(" * 10_000 + "i" + ")" * 10_000,
        "exp(" * 10_000 + "a" + ")" * 10_000,
    ],
    ids=["parens", "unary", "sum", "ternary", "accesses", "calls"],
)
def test_deep_nesting_is_a_syntax_error(expr):
    with pytest.raises(TCSyntaxError, match="nested too deeply"):
        parse_rhs(expr)


def test_nesting_limit_is_not_below_realistic_code():
    assert MAX_NESTING >= 100
