"""The syntax tree back to TC text: ``format_def(parse(text).defs[0])`` is TC source again.

The output is canonical rather than a copy of what was written: one statement per line, one
space around binary operators, parentheses only where precedence needs them (and around
ternaries nested in a condition, a range bound or a then-branch, for the reader's sake).
Comments are not part of the tree and so are not printed.

Printing round-trips for every tree the parser builds: ``parse(format_source(tree)) == tree``
(node equality ignores source locations).  Trees built by hand print too, but some have no TC
spelling and come back different: a negative Number prints as ``-1`` and parses back as a
Unary minus, and infinities and NaN have no literal at all.

    >>> from polyc.lang.parser import parse
    >>> tree = parse("def f(float(N) X)->(Y){Y(i)=X(i)*(2+X(i))}")
    >>> print(format_source(tree))
    def f(float(N) X) -> (Y) {
        Y(i) = X(i) * (2 + X(i))
    }
"""

from __future__ import annotations

import math

from polyc.lang import ast

_BINARY_PRECEDENCE = ast.BINARY_PRECEDENCE
_UNARY_PRECEDENCE = 7  # tighter than every binary operator
_TERNARY_PRECEDENCE = 0  # looser than every binary operator
_ATOM_PRECEDENCE = 8  # names, numbers, accesses, calls, extents, parenthesised expressions

INDENT = "    "


def format_source(source: ast.SourceFile) -> str:
    """Every def of ``source`` as TC text, separated by blank lines."""
    return "\n\n".join(format_def(d) for d in source.defs)


def format_def(definition: ast.Def) -> str:
    """One def as TC text: the signature on one line, then one statement per line."""
    inputs = ", ".join(format_param(p) for p in definition.inputs)
    outputs = ", ".join(format_param(p) for p in definition.outputs)
    lines = [f"def {definition.name}({inputs}) -> ({outputs}) {{"]
    loop = None
    for statement in definition.statements:
        if statement.loop != loop and loop is not None:
            lines.append(INDENT + "}")
        if statement.loop != loop and statement.loop is not None:
            header = statement.loop
            lines.append(f"{INDENT}for {header.index} in {_format_bound(header.lo)}:{_format_bound(header.hi)} {{")
        loop = statement.loop
        lines.append(INDENT * (2 if loop is not None else 1) + format_statement(statement))
    if loop is not None:
        lines.append(INDENT + "}")
    lines.append("}")
    return "\n".join(lines)


def format_param(param: ast.Param) -> str:
    """``float(M, 3) A``, ``int32 n`` (0-d), or a bare output name."""
    if param.dtype is None:
        return param.name
    if param.sizes is None:
        return f"{param.dtype} {param.name}"
    sizes = ", ".join(format_expr(size) for size in param.sizes)
    return f"{param.dtype}({sizes}) {param.name}"


def format_statement(statement: ast.Statement) -> str:
    """``T(i, j) +=! rhs where ...``; a 0-d target is written ``T()``."""
    # A space always follows the operator, so that '= !x' (a negation) never reads as '=!'.
    op = statement.op + ("!" if statement.init else "")
    text = f"{statement.target}({', '.join(statement.indices)}) {op} {format_expr(statement.rhs)}"
    if statement.equivalent is not None:
        text += f" <=> {format_expr(statement.equivalent)}"
    if statement.where:
        text += " where " + ", ".join(format_where_clause(c) for c in statement.where)
    return text


def format_where_clause(clause: ast.WhereClause) -> str:
    """``i in lo:hi``, ``exists T(i)`` or ``x = e``."""
    if isinstance(clause, ast.RangeClause):
        return f"{clause.index} in {_format_bound(clause.lo)}:{_format_bound(clause.hi)}"
    if isinstance(clause, ast.ExistsClause):
        return f"exists {format_expr(clause.access)}"
    if isinstance(clause, ast.LetClause):
        return f"{clause.name} = {format_expr(clause.value)}"
    raise TypeError(f"not a where clause: {clause!r}")


def format_expr(expr: ast.Expr) -> str:
    """An expression with the fewest parentheses that keep its tree."""
    if isinstance(expr, ast.Number):
        return _format_number(expr)
    if isinstance(expr, ast.Name):
        return expr.name
    if isinstance(expr, ast.Access):
        return f"{expr.tensor}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, ast.Call):
        return f"{expr.func}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, ast.Extent):
        return f"{expr.tensor}.{expr.dim}"
    if isinstance(expr, ast.Unary):
        return expr.op + _wrap(expr.operand, _UNARY_PRECEDENCE)
    if isinstance(expr, ast.Binary):
        precedence = _BINARY_PRECEDENCE[expr.op]
        # Left-associative: an equally strong operator needs parentheses only on the right.
        lhs = _wrap(expr.lhs, precedence)
        rhs = _wrap(expr.rhs, precedence + 1)
        return f"{lhs} {expr.op} {rhs}"
    if isinstance(expr, ast.Ternary):
        cond = _wrap(expr.cond, _TERNARY_PRECEDENCE + 1)
        then = _wrap(expr.then, _TERNARY_PRECEDENCE + 1)
        return f"{cond} ? {then} : {format_expr(expr.otherwise)}"
    raise TypeError(f"not an expression: {expr!r}")


def _precedence(expr: ast.Expr) -> int:
    if isinstance(expr, ast.Binary):
        return _BINARY_PRECEDENCE[expr.op]
    if isinstance(expr, ast.Ternary):
        return _TERNARY_PRECEDENCE
    if isinstance(expr, ast.Unary) or (isinstance(expr, ast.Number) and _is_negative(expr)):
        return _UNARY_PRECEDENCE
    return _ATOM_PRECEDENCE


def _wrap(expr: ast.Expr, at_least: int) -> str:
    """``expr``'s text, parenthesised unless it binds at least as tightly as ``at_least``."""
    text = format_expr(expr)
    return text if _precedence(expr) >= at_least else f"({text})"


def _format_bound(expr: ast.Expr) -> str:
    # 'i in c ? a : b : hi' parses, but nobody should have to read it.
    return _wrap(expr, _TERNARY_PRECEDENCE + 1)


def _is_negative(number: ast.Number) -> bool:
    return number.value < 0 or (isinstance(number.value, float) and math.copysign(1.0, number.value) < 0)


def _format_number(number: ast.Number) -> str:
    if not number.is_float:
        return str(int(number.value))
    # repr() is the shortest text that reads back as the same double, and always has a '.' or
    # an exponent ('2.0', '1e-05'), so it lexes as a float literal again.
    return repr(float(number.value))
