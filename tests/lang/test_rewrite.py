"""Structural edits of the syntax tree (polyc.lang.rewrite): names are renamed by their role in
the tree, never by their spelling, so the cases a regex on the text gets wrong come out right."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyc.lang import ast
from polyc.lang.parser import parse, parse_statements
from polyc.lang.printer import format_def, format_statement
from polyc.lang.rewrite import (
    integer_literal,
    reads_of,
    rename_def_tensors,
    rename_indices,
    rename_tensors,
    replace_expr,
    tensors_written_and_read,
    walk,
    whole_ranges,
)
from polyc.lang.sema import check_source


def statement(text: str) -> ast.Statement:
    (parsed,) = parse_statements(text)
    return parsed


def test_parse_statements_reads_a_body_without_its_def():
    first, second, *looped = parse_statements(
        "A(i) = B(i) where i in 0:4\nC(i) = A(i) + 1\nfor t in 0:3 {\n  D(t, i) = C(i)\n  E(t, i) = D(t, i)\n}"
    )
    assert (first.target, second.target) == ("A", "C")
    assert [s.target for s in looped] == ["D", "E"]
    assert looped[0].loop is looped[1].loop and looped[0].loop.number == 0
    assert parse_statements("") == ()


def test_a_tensor_whose_name_is_a_prefix_of_another_is_renamed_alone():
    s = statement("v1(i) = v12(i) + v1(i) * v1x(v1(i)) where i in 0:v1.0")
    renamed = rename_tensors(s, {"v1": "w"})
    assert format_statement(renamed) == "w(i) = v12(i) + w(i) * v1x(w(i)) where i in 0:w.0"
    assert format_statement(rename_tensors(s, {"v12": "w"})) == "v1(i) = w(i) + v1(i) * v1x(v1(i)) where i in 0:v1.0"


def test_names_inside_where_clauses_are_renamed_by_their_role():
    s = statement("C(i) = A(i) + x where i in 0:A.0, exists B(i), x = B(i + 1)")
    renamed = rename_tensors(s, {"A": "P", "B": "Q"})
    assert format_statement(renamed) == "C(i) = P(i) + x where i in 0:P.0, exists Q(i), x = Q(i + 1)"
    # An index is renamed in the right-hand side and its subscripts, never as the range's own
    # name nor as a let name, which are the statement's declarations.
    assert format_expr_of(rename_indices(s.rhs, {"i": "j", "x": "y"})) == "A(j) + y"


def test_an_index_spelt_as_a_builtin_is_renamed_and_the_builtin_kept():
    s = statement("B(exp) = exp(A(exp)) + exp where exp in 0:4")
    renamed = rename_indices(s.rhs, {"exp": "k"})
    assert format_expr_of(renamed) == "exp(A(k)) + k"
    check_source(f"def f(float(4) A) -> (B) {{ {format_statement(s)} }}")  # (the TC is valid)


def test_the_operation_of_an_equivalent_note_is_not_a_tensor():
    s = statement("C(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j))")
    renamed = rename_tensors(s, {"A": "X", "matmul": "oops"})
    assert format_statement(renamed) == "C(i, j) +=! X(i, k) * B(k, j) <=> matmul(X(i, k), B(k, j))"


def test_a_def_is_renamed_in_its_signature_and_statements_and_prints_back():
    source = "def f(float(N) v1, float(N) v12) -> (v2) {\n    v2(i) = v1(i) * v12(i)\n}"
    definition = parse(source).defs[0]
    renamed = rename_def_tensors(definition, {"v1": "a", "v12": "b", "v2": "c"})
    assert format_def(renamed) == "def f(float(N) a, float(N) b) -> (c) {\n    c(i) = a(i) * b(i)\n}"
    assert parse(format_def(renamed)).defs[0] == renamed


def test_tensors_are_listed_in_the_order_they_are_written():
    s = statement("C(i) = A(B(i)) + D.0 where i in 0:E.0, exists F(i)")
    assert list(tensors_written_and_read(s)) == ["C", "A", "B", "D", "E", "F"]
    (looped,) = parse_statements("for t in 0:T.0 { S(t) = S(t - 1) }")
    assert list(tensors_written_and_read(looped)) == ["T", "S", "S"]


def test_reads_and_replacement_reach_nested_subscripts():
    s = statement("C(i) = A(B(i) + (1), (i)) + A(i, i)")
    assert [len(args) for args in reads_of("A", s.rhs)] == [2, 2]
    assert reads_of("B", s.rhs) == [(ast.Name("i"),)]
    replaced = replace_expr(s.rhs, lambda e: ast.Name("b") if isinstance(e, ast.Access) and e.tensor == "B" else None)
    assert format_expr_of(replaced) == "A(b + 1, i) + A(i, i)"
    untouched = replace_expr(s.rhs, lambda e: None)
    assert untouched is s.rhs  # nothing changed: the tree is shared, not copied


def test_ranges_and_literals():
    assert whole_ranges(["i", "j"], (2, 3)) == statement("A(i, j) = 0 where i in 0:2, j in 0:3").where
    assert [integer_literal(e) for e in (statement("A(i) = -3").rhs, statement("A(i) = 3.0").rhs)] == [-3, None]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(["v1", "v12", "v2", "v1x"]), min_size=1, max_size=4),
    st.sampled_from(["w", "v", "v123", "v1_", "A"]),
)
def test_renaming_a_tensor_and_back_is_the_identity(tensors, fresh):
    """Renaming tensor ``v1`` to a name the statement does not use, and back, gives the tree
    read, whatever the names around it spell."""
    rhs = " + ".join(f"{t}(i, {t}(i, j))" for t in tensors)
    s = statement(f"v2(i, j) = {rhs} where i in 0:4, j in 0:v1.1")
    there = rename_tensors(s, {"v1": fresh})
    assert statement(format_statement(there)) == there
    assert rename_tensors(there, {fresh: "v1"}) == s
    assert all(node.tensor != "v1" for node in walk(there.rhs) if isinstance(node, ast.Access))


def format_expr_of(expr: ast.Expr) -> str:
    from polyc.lang.printer import format_expr

    return format_expr(expr)


@pytest.mark.parametrize("text", ["A(i) = ", "for t in 0:3 { }"])
def test_parse_statements_refuses_what_is_not_tc(text):
    from polyc.errors import TCSyntaxError

    with pytest.raises(TCSyntaxError):
        parse_statements(text)
