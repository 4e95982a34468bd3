"""The tokenizer of TC source text.

:func:`tokenize` turns text into a list of :class:`Token`, each with its 1-based line and
column, ending with one ``eof`` token.  It knows nothing of the grammar beyond two local
decisions that the characters alone settle:

* ``T.0`` is a name, a ``.`` and an integer (an extent), not a name followed by the float
  ``.0``: a ``.`` right after a name is always the extent dot.
* Multi-character operators are read longest first (``<=`` before ``<``, ``->`` before ``-``).

Everything else that depends on context is left to the parser: ``min=`` is the name ``min``
followed by ``=``, and the init marker of ``+=!`` is a ``!`` token that touches the operator.
Tokens keep their character offset so that the parser can tell whether two tokens touch.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from polyc.errors import SourceLocation, TCSyntaxError

# Token kinds.  Keywords and punctuation use their own text as their kind.
NAME = "name"
INT = "int"
FLOAT = "float"
EOF = "eof"

KEYWORDS = frozenset({"def", "where", "in", "exists", "for"})

# Longest first, so that the first match is the maximal munch.
PUNCTUATION = (
    "<=>",
    "->",
    "+=",
    "*=",
    "&&",
    "||",
    "<=",
    ">=",
    "==",
    "!=",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    ";",
    "?",
    ".",
    "=",
    "!",
    "<",
    ">",
    "+",
    "-",
    "*",
    "/",
    "%",
)

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# C-like decimal literals: 2, 0.5, 1., .5, 1e-5, 1.e5.  The exponent digits are optional here
# so that '1e' is caught and reported as a malformed number rather than as '1' then 'e'.
_NUMBER_RE = re.compile(r"(?:\d+\.?\d*|\.\d+)(?P<exponent>[eE][+-]?(?P<exp_digits>\d*))?")
_IDENTIFIER_TAIL_RE = re.compile(r"[A-Za-z0-9_]*")
_WHITESPACE = " \t\r\f\v"
_WHITESPACE_RUN_RE = re.compile(r"[ \t\r\f\v]+")
# One alternation in PUNCTUATION's order: re tries alternatives left to right, so the first
# that matches is the longest (a scan of the tuple per token was most of a warm ONNX start's lexing).
_PUNCTUATION_RE = re.compile("|".join(map(re.escape, PUNCTUATION)))


def _match_at(pattern: re.Pattern[str], text: str, pos: int) -> re.Match[str]:
    """``pattern.match(text, pos)`` where a match always exists: the caller has checked that the
    character at ``pos`` starts one, or the pattern also matches the empty string."""
    match = pattern.match(text, pos)
    assert match is not None, f"lexer: {pattern.pattern!r} does not match at offset {pos}"
    return match


# Hints for characters that users of C-like languages reach for.
_CHARACTER_HINTS = {
    "&": "TC has no bitwise operators; did you mean '&&'?",
    "|": "TC has no bitwise operators; did you mean '||'?",
    "[": "tensors are indexed with parentheses, as in 'A(i, j)'",
    "]": "tensors are indexed with parentheses, as in 'A(i, j)'",
}


class Token(NamedTuple):
    """One token: its kind (``name``, ``int``, ``float``, ``eof``, or the keyword or
    punctuation text itself), its text, its character offset, and its 1-based line and column
    in ``filename``.  A tuple, and its location made only when asked for: a model's worth of
    TC is tens of thousands of tokens, most of which never appear in a message or a node."""

    kind: str
    text: str
    offset: int
    line: int
    col: int
    filename: str = "<tc>"

    @property
    def loc(self) -> SourceLocation:
        return SourceLocation(self.line, self.col, self.filename)

    @property
    def end(self) -> int:
        """The offset just past the token's last character."""
        return self.offset + len(self.text)


def tokenize(text: str, filename: str = "<tc>") -> list[Token]:
    """Split TC source into tokens, dropping whitespace and ``#`` comments.

    The list always ends with an ``eof`` token, placed just after the last real token so
    that "unexpected end of input" errors point at a line that is shown with a caret.
    Raises :class:`TCSyntaxError` at the first character that cannot start a token and at
    malformed numbers such as ``1e`` or ``2.5f``.
    """
    tokens: list[Token] = []
    line, line_start = 1, 0
    pos = 0

    def location(offset: int) -> SourceLocation:
        return SourceLocation(line, offset - line_start + 1, filename)

    def error(message: str, offset: int) -> TCSyntaxError:
        return TCSyntaxError(message, location(offset), source=text)

    while pos < len(text):
        char = text[pos]
        if char == "\n":
            line, line_start = line + 1, pos + 1
            pos += 1
        elif char in _WHITESPACE:
            pos = _match_at(_WHITESPACE_RUN_RE, text, pos).end()
        elif char == "#":
            newline = text.find("\n", pos)
            pos = len(text) if newline < 0 else newline
        elif char.isascii() and (char.isalpha() or char == "_"):
            word = _match_at(_NAME_RE, text, pos).group()
            kind = word if word in KEYWORDS else NAME
            tokens.append(Token(kind, word, pos, line, pos - line_start + 1, filename))
            pos += len(word)
        elif (char.isascii() and char.isdigit()) or (
            char == "." and text[pos + 1 : pos + 2].isdigit() and not _follows_name(tokens)
        ):
            token = _read_number(text, pos, line, pos - line_start + 1, filename)
            tokens.append(token)
            pos = token.end
        else:
            match = _PUNCTUATION_RE.match(text, pos)
            if match is None:
                hint = _CHARACTER_HINTS.get(char)
                raise error(f"unexpected character {char!r}" + (f" ({hint})" if hint else ""), pos)
            punct = match.group()
            tokens.append(Token(punct, punct, pos, line, pos - line_start + 1, filename))
            pos += len(punct)

    if tokens:
        last = tokens[-1]
        tokens.append(Token(EOF, "", last.end, last.line, last.col + len(last.text), filename))
    else:
        tokens.append(Token(EOF, "", 0, 1, 1, filename))
    return tokens


def _follows_name(tokens: list[Token]) -> bool:
    """True when the next ``.`` is the extent dot of ``T.0`` rather than the start of ``.5``."""
    return bool(tokens) and tokens[-1].kind == NAME


def _read_number(text: str, pos: int, line: int, col: int, filename: str) -> Token:
    """Read the numeric literal starting at ``pos`` (at ``line``, ``col``); letters glued to it
    make it malformed."""
    match = _match_at(_NUMBER_RE, text, pos)
    end = match.end()
    tail = _match_at(_IDENTIFIER_TAIL_RE, text, end).group()
    literal = text[pos : end + len(tail)]
    if tail:
        raise TCSyntaxError(f"malformed number '{literal}'", SourceLocation(line, col, filename), source=text)
    if match.group("exponent") is not None and not match.group("exp_digits"):
        message = f"malformed number '{literal}': the exponent has no digits"
        raise TCSyntaxError(message, SourceLocation(line, col, filename), source=text)
    is_float = any(c in literal for c in ".eE")
    return Token(FLOAT if is_float else INT, literal, pos, line, col, filename)
