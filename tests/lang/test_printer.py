"""The TC printer: printed text parses back to the same syntax tree, for written and random trees."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyc.lang import ast
from polyc.lang.builtins import BUILTINS
from polyc.lang.parser import parse
from polyc.lang.printer import format_def, format_expr, format_source
from polyc.types import TC_TYPES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def rhs_of(text: str) -> ast.Expr:
    return parse(f"def f() -> (C) {{ C(i) = {text} }}").defs[0].statements[0].rhs


# ----------------------------------------------------------------------------- written cases
@pytest.mark.parametrize(
    "text",
    [
        "a + b * c",
        "(a + b) * c",
        "a - (b - c)",
        "a - b - c",
        "a / (b * c)",
        "-(a + b)",
        "-a * b",
        "- -a",
        "!(a && b) || c",
        "a < b == (c < d)",
        "a ? b : c ? d : e",
        "(a ? b : c) ? d : e",
        "a ? (b ? c : d) : e",
        "(a ? b : c) + 1",
        "A(i + 1, 2 * j - k) * exp(-X(i))",
        "LUT(I(b, r_l), d)",
        "T.0 + T.12",
        "float(i) * 0.5 + 1e-05 + 2.0 + 1e+22",
        "fma(a, b, c)",
        "C()",
    ],
)
def test_expression_round_trip(text):
    tree = rhs_of(text)
    assert rhs_of(format_expr(tree)) == tree


def test_minimal_parentheses():
    assert format_expr(rhs_of("((a + b)) + (c * d)")) == "a + b + c * d"
    assert format_expr(rhs_of("a - (b + c)")) == "a - (b + c)"
    assert format_expr(rhs_of("(-a) * (b)")) == "-a * b"


def test_statement_forms():
    source = """
    def f(float(N, 3) A, int32 n, float x) -> (float(N) B, C, D) {
        B(i) min=! A(i, j) where j in 0:3
        C() +=! A(r_i, 0)
        D(i) = !(A(i, 0) > 0) ? x : -x where i in 0:n, exists A(i, 1), y = 2
        B(i) = !y where y = A(i, 2) > 0
        B(i) max= A(i, 1)
    }
    """
    tree = parse(source)
    text = format_source(tree)
    assert parse(text) == tree
    lines = text.splitlines()
    assert lines[0] == "def f(float(N, 3) A, int32 n, float x) -> (float(N) B, C, D) {"
    assert lines[1] == "    B(i) min=! A(i, j) where j in 0:3"
    assert lines[2] == "    C() +=! A(r_i, 0)"
    assert lines[4] == "    B(i) = !y where y = A(i, 2) > 0"  # '= !y' is a negation, not '=!'


@pytest.mark.parametrize("name", ["matmul.tc", "conv.tc"])
def test_examples_round_trip(name):
    tree = parse((EXAMPLES / name).read_text())
    assert parse(format_source(tree)) == tree


# ----------------------------------------------------------------------------- random trees
_NAMES = st.sampled_from(["i", "j", "r_k", "N", "M", "x1", "A", "B", "T", "_t"])
_TYPES = st.sampled_from(sorted(TC_TYPES))
_FUNCTIONS = st.sampled_from(sorted(BUILTINS) + ["float", "int32"])
_BINARY_OPS = st.sampled_from(["||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%"])

# Literals the parser accepts: integers below 2**64, finite floats.
_numbers = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda v: ast.Number(v, False)),
    st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(lambda v: ast.Number(abs(v), True)),
)
_leaves = st.one_of(
    _numbers,
    _NAMES.map(ast.Name),
    st.builds(ast.Extent, _NAMES, st.integers(0, 12)),
)


def _compound(children):
    args = st.lists(children, max_size=3).map(tuple)
    return st.one_of(
        st.builds(ast.Access, _NAMES, args),
        st.builds(ast.Call, _FUNCTIONS, args),
        st.builds(ast.Unary, st.sampled_from(["-", "!"]), children),
        st.builds(ast.Binary, _BINARY_OPS, children, children),
        st.builds(ast.Ternary, children, children, children),
    )


expressions = st.recursive(_leaves, _compound, max_leaves=25)
_accesses = st.builds(ast.Access, _NAMES, st.lists(expressions, max_size=3).map(tuple))
_where_clauses = st.one_of(
    st.builds(ast.RangeClause, _NAMES, expressions, expressions),
    st.builds(ast.ExistsClause, _accesses),
    st.builds(ast.LetClause, _NAMES, expressions),
)
statements = st.builds(
    ast.Statement,
    _NAMES,
    st.lists(_NAMES, max_size=3).map(tuple),
    st.sampled_from(ast.ASSIGN_OPS),
    st.booleans(),
    expressions,
    st.lists(_where_clauses, max_size=3).map(tuple),
)
_sizes = st.lists(
    st.one_of(_NAMES.map(ast.Name), st.integers(0, 64).map(lambda v: ast.Number(v, False))), max_size=3
).map(tuple)
_inputs = st.builds(ast.Param, _NAMES, _TYPES, st.one_of(st.none(), _sizes))
_outputs = st.one_of(st.builds(ast.Param, _NAMES, st.none(), st.none()), _inputs)
defs = st.builds(
    ast.Def,
    _NAMES,
    st.lists(_inputs, max_size=3).map(tuple),
    st.lists(_outputs, max_size=2).map(tuple),
    st.lists(statements, max_size=4).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_random_expression_round_trip(expr):
    assert rhs_of(format_expr(expr)) == expr


@settings(max_examples=200, deadline=None)
@given(defs)
def test_random_def_round_trip(definition):
    assert parse(format_def(definition)).defs == (definition,)
