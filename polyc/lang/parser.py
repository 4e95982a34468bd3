"""A recursive-descent parser from TC source text to the syntax tree of :mod:`polyc.lang.ast`.

The grammar (``[x]`` optional, ``{x}`` repeated)::

    source     := def {def}
    def        := 'def' NAME '(' [input {',' input}] ')' '->' '(' [output {',' output}] ')'
                  '{' {statement | loop} '}'
    loop       := 'for' NAME 'in' expr ':' expr '{' {statement} '}'
    input      := TYPE ['(' [size {',' size}] ')'] NAME
    output     := NAME | TYPE ['(' [size {',' size}] ')'] NAME
    size       := NAME | INTEGER
    statement  := NAME ['(' [NAME {',' NAME}] ')'] ASSIGN ['!'] expr
                  ['<=>' NAME '(' [args] ')'] ['where' clause {',' clause}] [';']
    ASSIGN     := '=' | '+=' | '*=' | 'min=' | 'max='
    clause     := NAME 'in' expr ':' expr | 'exists' NAME '(' [args] ')' | NAME '=' expr
    expr       := or ['?' expr ':' expr]
    or .. mul  := binary operators, loosest first: || && (== !=) (< <= > >=) (+ -) (* / %)
    unary      := ('-' | '!' | '+') unary | primary
    primary    := NUMBER | NAME | NAME '(' [args] ')' | NAME '.' INTEGER | '(' expr ')'

Statements are simply juxtaposed: one ends where the next token cannot continue it.  The
``!`` init marker and the ``=`` of ``min=``/``max=`` must touch the token before them, so
``C(i) = !x`` is a negation while ``C(i) =!x`` initialises.

Every error is a :class:`TCSyntaxError` at the offending token.  Expression nesting is
bounded by :data:`MAX_NESTING`, which keeps both this parser and the later passes that
walk the tree well inside Python's recursion limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NoReturn, TypeVar

from polyc.errors import SourceLocation, TCSyntaxError
from polyc.lang import ast
from polyc.lang.builtins import BUILTINS, is_callable_name
from polyc.lang.lexer import EOF, FLOAT, INT, KEYWORDS, NAME, Token, tokenize
from polyc.types import TC_TYPES

#: The deepest expression the parser accepts, counting parentheses, call arguments, unary and
#: ternary operators and every operator of a binary chain (``a + b + c`` nests two deep).
MAX_NESTING = 200

_BINARY_PRECEDENCE = ast.BINARY_PRECEDENCE
_LOOSEST = 1
_UNARY_OPS = ("-", "!", "+")
_EXPRESSION_STARTS = frozenset({NAME, INT, FLOAT, "(", *_UNARY_OPS})
_PLAIN_ASSIGN_OPS = ("=", "+=", "*=")
_NAMED_ASSIGN_OPS = ("min", "max")
_C_ONLY_COMPOUND = ("-", "/", "%")  # '-=' and friends from C, read as two tokens
_ASSIGN_OPS_TEXT = "'=', '+=', '*=', 'min=' or 'max='"

_Item = TypeVar("_Item")


def parse(text: str, filename: str = "<tc>") -> ast.SourceFile:
    """Parse TC source holding one or more defs into a :class:`~polyc.lang.ast.SourceFile`.

    Names are not resolved here; the tree records what was written.  Raises
    :class:`TCSyntaxError`, located at the offending token, for text that is not TC, for a
    source without defs, and for two defs with the same name.
    """
    return _Parser(text, filename).parse_source()


def parse_statements(text: str, filename: str = "<tc>") -> tuple[ast.Statement, ...]:
    """Parse the statements and ``for`` blocks of a def's body, written without the def around
    them, in order; the statements of a block each point at it, the blocks numbered from 0.

        >>> [s.target for s in parse_statements("A(i) = B(i) where i in 0:4  C(i) = A(i)")]
        ['A', 'C']

    Raises :class:`TCSyntaxError` as :func:`parse` does.
    """
    return _Parser(text, filename).parse_body()


class _Parser:
    """The state of one parse: the token list, a cursor into it, and the current def."""

    def __init__(self, text: str, filename: str):
        self._text = text
        self._filename = filename
        self._tokens = tokenize(text, filename)
        self._pos = 0
        self._depth = 0  # current expression nesting, bounded by MAX_NESTING
        self._def_name: str | None = None  # for "unexpected end of input in def 'f'"
        self._def_locs: dict[str, SourceLocation] = {}

    # ------------------------------------------------------------------------- token cursor
    @property
    def _tok(self) -> Token:
        return self._tokens[self._pos]

    def _peek(self) -> Token:
        """The token after the current one (``eof`` at the end)."""
        return self._tokens[min(self._pos + 1, len(self._tokens) - 1)]

    def _advance(self) -> Token:
        token = self._tokens[self._pos]
        if token.kind != EOF:
            self._pos += 1
        return token

    def _accept(self, kind: str) -> Token | None:
        """Consume and return the current token if it has ``kind``."""
        return self._advance() if self._tok.kind == kind else None

    def _expect(self, kind: str, context: str) -> Token:
        """Consume a token of ``kind`` or fail with "expected 'kind' <context>, found ..."."""
        if self._tok.kind != kind:
            self._fail_expected(f"'{kind}' {context}")
        return self._advance()

    def _expect_name(self, what: str) -> Token:
        """Consume a name (not a keyword) or fail with "expected <what>, found ..."."""
        if self._tok.kind != NAME:
            self._fail_expected(what)
        return self._advance()

    def _expect_tensor_name(self, what: str) -> Token:
        """Consume a name that can name a tensor: builtin and type names would parse as calls."""
        token = self._expect_name(what)
        if is_callable_name(token.text):
            kind = "builtin function" if token.text in BUILTINS else "type"
            message = f"'{token.text}' is a {kind} name and cannot name a tensor"
            raise self._error(message, token.loc)
        return token

    # ------------------------------------------------------------------------- errors
    def _error(self, message: str, loc: SourceLocation) -> TCSyntaxError:
        return TCSyntaxError(message, loc, source=self._text)

    def _fail_expected(self, what: str) -> NoReturn:
        """Fail at the current token, which is not ``what`` the grammar needs here."""
        token = self._tok
        if token.kind == EOF:
            where = f" in def '{self._def_name}'" if self._def_name else ""
            raise self._error(f"unexpected end of input{where}: expected {what}", token.loc)
        raise self._error(f"expected {what}, found {_describe(token)}", token.loc)

    def _descend(self) -> None:
        """Enter one more level of expression nesting (the caller leaves it again)."""
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise self._error(
                f"expression nested too deeply (more than {MAX_NESTING} levels of operators "
                "and parentheses); split it into several statements",
                self._tok.loc,
            )

    # ------------------------------------------------------------------------- defs
    def parse_source(self) -> ast.SourceFile:
        defs = []
        while self._tok.kind != EOF:
            if self._tok.kind != "def":
                self._fail_expected("'def' at top level")
            defs.append(self._parse_def())
        if not defs:
            raise self._error("no def in source", SourceLocation(1, 1, self._filename))
        return ast.SourceFile(tuple(defs), text=self._text, filename=self._filename)

    def _parse_def(self) -> ast.Def:
        def_token = self._advance()  # the caller saw 'def'
        name_token = self._expect_name("a def name after 'def'")
        name = name_token.text
        if name in self._def_locs:
            first_line = self._def_locs[name].line
            message = f"duplicate def '{name}' (first defined at line {first_line})"
            raise self._error(message, name_token.loc)
        self._def_locs[name] = name_token.loc
        self._def_name = name

        self._expect("(", f"after def name '{name}'")
        inputs = self._parse_parenthesized(self._parse_input, lambda p: f"input '{p.name}'")
        self._expect("->", f"after the inputs of def '{name}'")
        self._expect("(", "to open the list of outputs after '->'")
        outputs = self._parse_parenthesized(self._parse_output, lambda p: f"output '{p.name}'")
        self._expect("{", f"to open the body of def '{name}'")
        statements = self._parse_statements(until="}")
        self._def_name = None
        return ast.Def(name, inputs, outputs, statements, loc=def_token.loc)

    def parse_body(self) -> tuple[ast.Statement, ...]:
        """The statements and loops of the whole text, a def's body without the def."""
        return self._parse_statements(until=EOF)

    def _parse_statements(self, until: str) -> tuple[ast.Statement, ...]:
        """``{statement | loop}`` up to and including the token ``until``."""
        statements: list[ast.Statement] = []
        loops = 0
        while not self._accept(until):
            if self._tok.kind == "for":
                statements += self._parse_loop(loops)
                loops += 1
            else:
                statements.append(self._parse_statement())
        return tuple(statements)

    def _parse_parenthesized(
        self, parse_item: Callable[[], _Item], describe: Callable[[_Item], str]
    ) -> tuple[_Item, ...]:
        """Parse ``[item {',' item}] ')'``, the opening ``(`` being already consumed."""
        items: list[_Item] = []
        if self._accept(")"):
            return ()
        while True:
            items.append(parse_item())
            if self._accept(")"):
                return tuple(items)
            if not self._accept(","):
                self._fail_expected(f"',' or ')' after {describe(items[-1])}")

    def _parse_input(self) -> ast.Param:
        token = self._tok
        if token.kind == NAME and token.text not in TC_TYPES and not self._type_follows():
            raise self._error(f"input '{token.text}' needs a type, as in 'float(N) {token.text}'", token.loc)
        return self._parse_typed_param("input")

    def _parse_output(self) -> ast.Param:
        token = self._tok
        bare = token.kind == NAME and (
            self._peek().kind in (",", ")") or (token.text not in TC_TYPES and not self._type_follows())
        )
        if not bare:
            return self._parse_typed_param("output")
        self._expect_tensor_name("an output name")
        return ast.Param(token.text, None, None, loc=token.loc)

    def _type_follows(self) -> bool:
        """Whether the name at the cursor is used as a type ('flaot(N) A', 'foo A'), so that
        a name that is not a type is reported as an unknown type rather than as a stray name."""
        return self._peek().kind in ("(", NAME)

    def _parse_typed_param(self, role: str) -> ast.Param:
        """``TYPE ['(' sizes ')'] NAME``; ``role`` is "input" or "output" for messages."""
        type_token = self._expect_name(f"an {role} type such as 'float(N)'")
        if type_token.text not in TC_TYPES:
            hint = ""
            if role == "output" and self._tok.kind == NAME:
                hint = " (or is a ',' missing between two outputs?)"
            raise self._error(f"unknown type '{type_token.text}'{hint}", type_token.loc)
        sizes = None
        if self._accept("("):
            sizes = self._parse_parenthesized(self._parse_size, lambda size: f"size {_show(size)}")
        name_token = self._expect_tensor_name(f"an {role} name after its type")
        return ast.Param(name_token.text, type_token.text, sizes, loc=type_token.loc)

    def _parse_size(self) -> ast.Name | ast.Number:
        token = self._tok
        if token.kind == NAME:
            self._advance()
            return ast.Name(token.text, loc=token.loc)
        if token.kind == INT:
            return ast.Number(self._int_value(self._advance()), False, loc=token.loc)
        self._fail_expected("a size (a size name or an integer)")

    # ------------------------------------------------------------------------- statements
    def _parse_loop(self, number: int) -> list[ast.Statement]:
        """``for t in lo:hi { statements }``: the statements, each pointing at the loop."""
        for_token = self._advance()  # the caller saw 'for'
        index = self._expect_name("an index name after 'for'")
        self._expect("in", f"after 'for {index.text}'")
        lo = self._parse_expression()
        self._expect(":", f"between the bounds of the range of '{index.text}'")
        hi = self._parse_expression()
        self._expect("{", f"to open the body of 'for {index.text}'")
        loop = ast.SequentialLoop(index.text, lo, hi, number, loc=for_token.loc)
        statements = []
        while not self._accept("}"):
            if self._tok.kind == "for":
                raise self._error("'for' blocks cannot be nested; write one 'for' block per recurrence", self._tok.loc)
            statements.append(dataclasses.replace(self._parse_statement(), loop=loop))
        if not statements:
            raise self._error(f"'for {index.text}' has no statements", for_token.loc)
        return statements

    def _parse_statement(self) -> ast.Statement:
        previous = self._tokens[self._pos - 1]
        # Juxtaposed statements on one line are legal but rare; more often a missing operator
        # has made a stray name look like the start of a new statement.
        follows_expression = previous.line == self._tok.line and previous.kind not in ("{", ";")
        target = self._expect_tensor_name("a statement or '}'")
        lhs_indices: tuple[ast.Name, ...] = ()
        if self._accept("("):
            lhs_indices = self._parse_parenthesized(self._parse_lhs_index, lambda index: f"index '{index.name}'")
        op, init = self._parse_assign_op(target, follows_expression)
        rhs = self._parse_expression()
        equivalent = None
        if self._accept("<=>"):  # TC's note of an equivalent library call: kept, not used
            name = self._expect_name("the name of an equivalent operation after '<=>'")
            self._expect("(", f"after '{name.text}' in '<=>'")
            equivalent = ast.Access(name.text, self._parse_arguments(name.text), loc=name.loc)

        clauses = []
        if self._accept("where"):
            clauses.append(self._parse_where_clause())
            while self._accept(","):
                clauses.append(self._parse_where_clause())
        self._accept(";")
        return ast.Statement(
            target.text,
            tuple(index.name for index in lhs_indices),
            op,
            init,
            rhs,
            tuple(clauses),
            equivalent,
            loc=target.loc,
            index_locs=tuple(index.loc for index in lhs_indices),
        )

    def _parse_lhs_index(self) -> ast.Name:
        """A left-hand index: a plain name.  Anything else is parsed whole to point at it."""
        if self._tok.kind not in _EXPRESSION_STARTS:
            self._fail_expected("an index name")
        index = self._parse_expression()
        if not isinstance(index, ast.Name):
            raise self._error(
                "left-hand side indices must be plain index names; "
                "compute shifted or strided positions on the right-hand side",
                index.loc,
            )
        return index

    def _parse_assign_op(self, target: Token, follows_expression: bool) -> tuple[str, bool]:
        """Read ``=``, ``+=``, ``*=``, ``min=`` or ``max=`` and the ``!`` that may touch it."""
        token, following = self._tok, self._peek()
        if token.kind in _PLAIN_ASSIGN_OPS:
            self._advance()
            op, end = token.kind, token.end
        elif token.kind == NAME and token.text in _NAMED_ASSIGN_OPS and following.kind == "=":
            if not _touching(token, following):
                raise self._error(f"write '{token.text}=' without a space", following.loc)
            self._advance()
            self._advance()
            op, end = token.text + "=", following.end
        elif token.kind in _C_ONLY_COMPOUND and following.kind == "=" and _touching(token, following):
            raise self._error(
                f"'{token.text}=' is not a TC assignment operator; use {_ASSIGN_OPS_TEXT}",
                token.loc,
            )
        elif follows_expression:
            raise self._error(
                f"'{target.text}' does not start a statement (no assignment follows it); "
                "is an operator missing before it?",
                target.loc,
            )
        else:
            self._fail_expected(f"an assignment operator ({_ASSIGN_OPS_TEXT}) after '{target.text}'")

        init = self._tok.kind == "!" and self._tok.offset == end
        if init:
            self._advance()
        return op, init

    def _parse_where_clause(self) -> ast.WhereClause:
        start = self._tok
        if self._accept("exists"):
            name_token = self._expect_tensor_name("a tensor access after 'exists'")
            self._expect("(", f"after '{name_token.text}' in an exists clause")
            args = self._parse_arguments(name_token.text)
            access = ast.Access(name_token.text, args, loc=name_token.loc)
            return ast.ExistsClause(access, loc=start.loc)

        name_token = self._expect_name("a where clause ('i in lo:hi', 'exists T(...)' or 'x = e')")
        name = name_token.text
        if self._accept("in"):
            lo = self._parse_expression()
            self._expect(":", f"between the bounds of the range of '{name}'")
            hi = self._parse_expression()
            return ast.RangeClause(name, lo, hi, loc=start.loc)
        if self._accept("="):
            return ast.LetClause(name, self._parse_expression(), loc=start.loc)
        self._fail_expected(f"'in' or '=' after '{name}' in a where clause")

    # ------------------------------------------------------------------------- expressions
    def _parse_expression(self) -> ast.Expr:
        """A full expression: a binary expression, possibly the condition of ``? :``."""
        self._descend()
        cond = self._parse_binary(_LOOSEST)
        if self._accept("?"):
            then = self._parse_expression()
            self._expect(":", "between the branches of '? :'")
            otherwise = self._parse_expression()
            cond = ast.Ternary(cond, then, otherwise, loc=cond.loc)
        self._depth -= 1
        return cond

    def _parse_binary(self, min_precedence: int) -> ast.Expr:
        """Precedence climbing over the operators that bind at least ``min_precedence``."""
        self._descend()
        chain_length = 0
        lhs = self._parse_unary()
        while _BINARY_PRECEDENCE.get(self._tok.kind, 0) >= min_precedence:
            op = self._advance().kind
            # A left-associative chain grows the tree one level per operator.
            self._descend()
            chain_length += 1
            rhs = self._parse_binary(_BINARY_PRECEDENCE[op] + 1)
            lhs = ast.Binary(op, lhs, rhs, loc=lhs.loc)
        self._depth -= 1 + chain_length
        return lhs

    def _parse_unary(self) -> ast.Expr:
        token = self._tok
        if token.kind not in _UNARY_OPS:
            return self._parse_primary()
        self._advance()
        self._descend()
        operand = self._parse_unary()
        self._depth -= 1
        # Unary plus changes nothing, so it leaves no node behind.
        return operand if token.kind == "+" else ast.Unary(token.kind, operand, loc=token.loc)

    def _parse_primary(self) -> ast.Expr:
        token = self._tok
        if token.kind == INT:
            return ast.Number(self._int_value(self._advance()), False, loc=token.loc)
        if token.kind == FLOAT:
            return ast.Number(self._float_value(self._advance()), True, loc=token.loc)
        if token.kind == "(":
            self._advance()
            inner = self._parse_expression()
            self._expect(")", "to close '('")
            return inner
        if token.kind != NAME:
            self._fail_expected("an expression")

        self._advance()
        name = token.text
        if self._accept("("):
            # Argument lists cost extra stack frames, so they count as a level of their own.
            self._descend()
            args = self._parse_arguments(name)
            self._depth -= 1
            if is_callable_name(name):
                return ast.Call(name, args, loc=token.loc)
            return ast.Access(name, args, loc=token.loc)
        if self._accept("."):
            if self._tok.kind != INT:
                self._fail_expected(f"a dimension number after '{name}.'")
            dim = self._int_value(self._advance())
            return ast.Extent(name, dim, loc=token.loc)
        return ast.Name(name, loc=token.loc)

    def _int_value(self, token: Token) -> int:
        """The value of an integer literal; no TC type holds one of 2**64 or more."""
        # Checking the length first also keeps int() clear of Python's limit on digit strings.
        if len(token.text.lstrip("0")) > 20 or int(token.text) >= 2**64:
            raise self._error(f"integer literal '{token.text}' is too large", token.loc)
        return int(token.text)

    def _float_value(self, token: Token) -> float:
        value = float(token.text)
        if value == float("inf"):
            raise self._error(f"floating-point literal '{token.text}' is too large", token.loc)
        return value

    def _parse_arguments(self, callee: str) -> tuple[ast.Expr, ...]:
        """``[expr {',' expr}] ')'`` after ``callee(``."""
        return self._parse_parenthesized(self._parse_expression, lambda _: f"an argument of '{callee}'")


def _describe(token: Token) -> str:
    """How a token is named in an error message."""
    if token.kind == EOF:
        return "end of input"
    if token.kind in KEYWORDS:
        return f"keyword '{token.text}'"
    return f"'{token.text}'"


def _touching(first: Token, second: Token) -> bool:
    """Whether ``second`` starts right where ``first`` ends, with no space between them."""
    return second.offset == first.end


def _show(size: ast.Name | ast.Number) -> str:
    return f"'{size.name}'" if isinstance(size, ast.Name) else f"'{size.value}'"
