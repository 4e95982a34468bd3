"""Structural edits of the syntax tree: find the tensors a statement reads, rename tensors and
indices, substitute expressions, each a free function from a tree to a new tree.

A pass that edits TC written by a program (the ONNX front end's fusion rules) edits these trees
rather than the text, so that a tensor named ``v1`` is never confused with ``v12``, a name in a
``where`` clause is renamed or left alone as its role says, and a subscript holding
parentheses is an expression like any other.  Nodes are immutable: every function returns a
new tree and shares the subtrees it leaves unchanged.

    >>> from polyc.lang.parser import parse_statements
    >>> from polyc.lang.printer import format_statement
    >>> (s,) = parse_statements("v1(i) = v12(i) + v1x(i) where i in 0:4")
    >>> print(format_statement(rename_tensors(s, {"v1": "w", "v12": "x"})))
    w(i) = x(i) + v1x(i) where i in 0:4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

from polyc.lang import ast

#: Returns the replacement of a node, or None to keep the node and edit inside it.
Replacement = Callable[[ast.Expr], "ast.Expr | None"]


def replace_expr(expr: ast.Expr, replace: Replacement) -> ast.Expr:
    """``expr`` with each outermost node for which ``replace`` gives an expression replaced by
    it (whose inside is not visited again); the nodes ``replace`` keeps (None) are rebuilt
    from their edited children, or returned as they are when nothing in them changed."""
    replaced = replace(expr)
    if replaced is not None:
        return replaced
    if isinstance(expr, _LEAVES):
        return expr
    if isinstance(expr, _WITH_ARGUMENTS):
        args = tuple(replace_expr(a, replace) for a in expr.args)
        return expr if _same(args, expr.args) else dataclasses.replace(expr, args=args)
    if isinstance(expr, ast.Binary):
        lhs, rhs = replace_expr(expr.lhs, replace), replace_expr(expr.rhs, replace)
        return expr if lhs is expr.lhs and rhs is expr.rhs else dataclasses.replace(expr, lhs=lhs, rhs=rhs)
    if isinstance(expr, ast.Unary):
        operand = replace_expr(expr.operand, replace)
        return expr if operand is expr.operand else dataclasses.replace(expr, operand=operand)
    if isinstance(expr, ast.Ternary):
        cond, then = replace_expr(expr.cond, replace), replace_expr(expr.then, replace)
        otherwise = replace_expr(expr.otherwise, replace)
        if cond is expr.cond and then is expr.then and otherwise is expr.otherwise:
            return expr
        return dataclasses.replace(expr, cond=cond, then=then, otherwise=otherwise)
    raise TypeError(f"not an expression: {expr!r}")


_LEAVES = (ast.Name, ast.Number, ast.Extent)
_WITH_ARGUMENTS = (ast.Access, ast.Call)
_NAMING_TENSORS = (ast.Access, ast.Extent)


def replace_in_statement(statement: ast.Statement, replace: Replacement) -> ast.Statement:
    """:func:`replace_expr` over every expression of ``statement``: its right-hand side, the
    arguments of its ``<=>`` note, and its ``where`` clauses (range bounds, ``exists``
    accesses, ``let`` values).  The target and the left-hand indices are left as they are."""
    rhs = replace_expr(statement.rhs, replace)
    equivalent = statement.equivalent
    if equivalent is not None:  # (its name is an operation, not a tensor: only its arguments)
        args = tuple(replace_expr(a, replace) for a in equivalent.args)
        equivalent = equivalent if _same(args, equivalent.args) else dataclasses.replace(equivalent, args=args)
    where = tuple(_replace_in_clause(c, replace) for c in statement.where)
    if rhs is statement.rhs and equivalent is statement.equivalent and _same(where, statement.where):
        return statement
    return dataclasses.replace(statement, rhs=rhs, equivalent=equivalent, where=where)


def _replace_in_clause(clause: ast.WhereClause, replace: Replacement) -> ast.WhereClause:
    if isinstance(clause, ast.RangeClause):
        lo, hi = replace_expr(clause.lo, replace), replace_expr(clause.hi, replace)
        return clause if lo is clause.lo and hi is clause.hi else dataclasses.replace(clause, lo=lo, hi=hi)
    if isinstance(clause, ast.ExistsClause):
        access = replace_expr(clause.access, replace)
        if access is clause.access:
            return clause
        if not isinstance(access, ast.Access):
            raise TypeError(f"an 'exists' clause needs an access, not {access!r}")
        return dataclasses.replace(clause, access=access)
    value = replace_expr(clause.value, replace)
    return clause if value is clause.value else dataclasses.replace(clause, value=value)


def walk(expr: ast.Expr) -> list[ast.Expr]:
    """``expr`` and every node inside it, in the order they are written (pre-order)."""
    nodes: list[ast.Expr] = []
    _collect(expr, nodes)
    return nodes


def _collect(expr: ast.Expr, nodes: list[ast.Expr]) -> None:
    nodes.append(expr)
    if isinstance(expr, _LEAVES):
        return
    if isinstance(expr, _WITH_ARGUMENTS):
        for argument in expr.args:
            _collect(argument, nodes)
    elif isinstance(expr, ast.Binary):
        _collect(expr.lhs, nodes)
        _collect(expr.rhs, nodes)
    elif isinstance(expr, ast.Unary):
        _collect(expr.operand, nodes)
    elif isinstance(expr, ast.Ternary):
        _collect(expr.cond, nodes)
        _collect(expr.then, nodes)
        _collect(expr.otherwise, nodes)


def statement_expressions(statement: ast.Statement) -> Iterator[ast.Expr]:
    """The expressions of ``statement`` in the order they are written: the right-hand side, the
    ``<=>`` note's arguments, then the ``where`` clauses' (not the bounds of its ``for`` block,
    which belong to the block)."""
    yield statement.rhs
    if statement.equivalent is not None:
        yield from statement.equivalent.args
    for clause in statement.where:
        if isinstance(clause, ast.RangeClause):
            yield from (clause.lo, clause.hi)
        elif isinstance(clause, ast.ExistsClause):
            yield clause.access
        else:
            yield clause.value


def reads_of(tensor: str, expr: ast.Expr) -> list[tuple[ast.Expr, ...]]:
    """The subscripts of every access of ``tensor`` in ``expr``, in the order written."""
    return [node.args for node in walk(expr) if isinstance(node, ast.Access) and node.tensor == tensor]


def tensors_written_and_read(statement: ast.Statement) -> Iterator[str]:
    """The tensors ``statement`` names, in the order they are written, with repeats: those of
    its ``for`` block's bounds, its target, then those of its accesses and extents (``T.0``).  (A 0-d tensor read by its bare name is
    a :class:`~polyc.lang.ast.Name` that only the def's declarations tell from an index.)"""
    if statement.loop is not None:
        yield from _tensors_in(statement.loop.lo)
        yield from _tensors_in(statement.loop.hi)
    yield statement.target
    for expr in statement_expressions(statement):
        yield from _tensors_in(expr)


def _tensors_in(expr: ast.Expr) -> list[str]:
    return [node.tensor for node in walk(expr) if isinstance(node, _NAMING_TENSORS)]


def rename_tensors(statement: ast.Statement, renaming: Mapping[str, str]) -> ast.Statement:
    """``statement`` with the tensors of ``renaming`` renamed: its target, the tensors of its
    accesses, extents and ``exists`` clauses, and bare names of renamed tensors (a 0-d tensor's
    read; TC has no index of a tensor's name).  Indices, sizes, builtins and the operation a
    ``<=>`` note names keep their names, whatever they are called."""

    def renamed(expr: ast.Expr) -> ast.Expr | None:
        if isinstance(expr, ast.Access) and expr.tensor in renaming:
            args = tuple(replace_expr(a, renamed) for a in expr.args)
            return dataclasses.replace(expr, tensor=renaming[expr.tensor], args=args)
        if isinstance(expr, ast.Extent) and expr.tensor in renaming:
            return dataclasses.replace(expr, tensor=renaming[expr.tensor])
        if isinstance(expr, ast.Name) and expr.name in renaming:
            return dataclasses.replace(expr, name=renaming[expr.name])
        return None

    statement = replace_in_statement(statement, renamed)
    loop = statement.loop
    if loop is not None:
        lo, hi = replace_expr(loop.lo, renamed), replace_expr(loop.hi, renamed)
        if lo is not loop.lo or hi is not loop.hi:
            statement = dataclasses.replace(statement, loop=dataclasses.replace(loop, lo=lo, hi=hi))
    if statement.target in renaming:
        statement = dataclasses.replace(statement, target=renaming[statement.target])
    return statement


def rename_def_tensors(definition: ast.Def, renaming: Mapping[str, str]) -> ast.Def:
    """``definition`` with the tensors of ``renaming`` renamed in its signature and statements
    (:func:`rename_tensors`)."""

    def param(p: ast.Param) -> ast.Param:
        return dataclasses.replace(p, name=renaming[p.name]) if p.name in renaming else p

    return dataclasses.replace(
        definition,
        inputs=tuple(param(p) for p in definition.inputs),
        outputs=tuple(param(p) for p in definition.outputs),
        statements=tuple(rename_tensors(s, renaming) for s in definition.statements),
    )


def rename_indices(expr: ast.Expr, renaming: Mapping[str, str]) -> ast.Expr:
    """``expr`` with the bare names of ``renaming`` (indices) renamed; tensors, builtins and
    casts keep their names even where one is spelt as an index of ``renaming``."""
    return replace_expr(
        expr,
        lambda e: (
            dataclasses.replace(e, name=renaming[e.name]) if isinstance(e, ast.Name) and e.name in renaming else None
        ),
    )


def index_names(names: tuple[str, ...]) -> tuple[ast.Name, ...]:
    """The subscripts that read a tensor at the indices ``names`` themselves."""
    return tuple(ast.Name(n) for n in names)


def whole_ranges(indices: tuple[str, ...] | list[str], extents: tuple[int, ...]) -> tuple[ast.RangeClause, ...]:
    """``where i0 in 0:e0, i1 in 0:e1, ...``: each index over the whole of its extent."""
    return tuple(ast.RangeClause(i, ast.Number(0, False), ast.Number(int(e), False)) for i, e in zip(indices, extents))


def integer_literal(expr: ast.Expr) -> int | None:
    """The value of an integer literal, ``-`` before it allowed; None for any other expression."""
    if isinstance(expr, ast.Unary) and expr.op == "-" and isinstance(expr.operand, ast.Number):
        value = integer_literal(expr.operand)
        return None if value is None else -value
    if isinstance(expr, ast.Number) and not expr.is_float:
        return int(expr.value)
    return None


def _same(new: tuple, old: tuple) -> bool:
    return all(a is b for a, b in zip(new, old))
