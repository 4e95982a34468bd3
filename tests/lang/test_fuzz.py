"""Fuzzing the front end: mutated TC sources must parse or fail with a PolycError, nothing else.

Each example takes one of the valid kernels below and applies a few random edits, at the level
of characters (delete, insert, replace, duplicate, truncate) or of tokens (delete, duplicate,
swap, replace with another TC token).  A crash of any other kind (IndexError, RecursionError,
AttributeError, ...) is a bug in the front end.
"""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyc.errors import PolycError
from polyc.lang import ast
from polyc.lang.parser import parse
from polyc.lang.sema import check_source

VALID_SOURCES = [
    # matmul
    """def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}""",
    # fully connected layer with bias and relu, several statements
    """def fc_relu(float(B, M) I, float(N, M) W1, float(N) B1) -> (O1) {
    O1(b, n) +=! I(b, r_m) * W1(n, r_m)
    O1(b, n) = O1(b, n) + B1(n)
    O1(b, n) = fmax(O1(b, n), 0)
}""",
    # convolution
    """def conv2d(float(N, C, H, W) I, float(M, C, KH, KW) W1) -> (O) {
    O(n, m, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(m, r_c, r_kh, r_kw)
}""",
    # strided max pooling with where ranges
    """def maxpool(float(B, C, H, W) I) -> (O) {
    O(b, c, h, w) max=! I(b, c, 2 * h + r_kh, 2 * w + r_kw)
        where r_kh in 0:3, r_kw in 0:3
}""",
    # average pooling
    """def avgpool(float(B, C, H, W) I) -> (O) {
    O(b, c, h, w) +=! I(b, c, h * 2 + r_kh, w * 2 + r_kw) / 4.0 where r_kh in 0:2, r_kw in 0:2
}""",
    # softmax, several statements and reductions
    """def softmax(float(N, D) I) -> (O, expsum, maxVal) {
    maxVal(n) max=! I(n, d)
    expsum(n) +=! exp(I(n, d) - maxVal(n))
    O(n, d) = exp(I(n, d) - maxVal(n)) / expsum(n)
}""",
    # layer norm with a let clause and a cast
    """def layernorm(float(T, B, C) I) -> (O, mean, centered, var) {
    mean(t, b) +=! I(t, b, r_c) / C
    centered(t, b, c) = I(t, b, c) - mean(t, b)
    var(t, b) +=! centered(t, b, r_c) * centered(t, b, r_c) / float(C)
    O(t, b, c) = centered(t, b, c) * s where s = rsqrt(var(t, b) + 1e-5)
}""",
    # gather (embedding lookup)
    """def embedding(float(E, D) LUT, int32(B, L) I) -> (O) {
    O(b, d) +=! LUT(I(b, r_l), d)
}""",
    # zero padding with a ternary guard and exists
    """def pad(float(N, M) A) -> (O) {
    O(i, j) = (i >= 1 && i < N + 1 && j >= 1 && j < M + 1) ? A(i - 1, j - 1) : 0.0
        where i in 0:N + 2, j in 0:M + 2, exists A(i - 1, j - 1)
}""",
    # 0-d outputs, both spellings, and a scalar input
    """def sums(float(N) A, float scale) -> (total, float() sq) {
    total() +=! A(r_i) * scale
    sq +=! A(r_i) * A(r_i);
}""",
    # min/max reductions, typed outputs, comparisons
    """def range_of(float(N, M) A) -> (float(N) lo, float(N) hi, int32(N) count) {
    lo(n) min=! A(n, r_m)
    hi(n) max=! A(n, r_m)
    count(n) +=! A(n, r_m) > 0.5 ? 1 : 0
}""",
    # extents and flips
    """def flip(float(N, M) A) -> (O) {
    O(i, j) = A(A.0 - 1 - i, A.1 - 1 - j)
}""",
    # comments everywhere, several defs
    """# two kernels in one file
def add(float(N) A, float(N) B) -> (C) { # element-wise
    C(i) = A(i) + B(i) # sum
}
# and a scale
def scale(float(N) A, double s) -> (C) { C(i) = s * A(i); }""",
    # logic, unary operators, integer arithmetic
    """def logic(int32(N) A, bool(N) M) -> (O) {
    O(i) = !M(i) || (A(i) % 2 == 0 && -A(i) <= 3) ? int32(abs(A(i))) / 2 : -1
}""",
    # batch matmul with constant sizes and a product reduction
    """def batch(float(4, M, K) A, float(4, K, N) B) -> (C, P) {
    C(b, m, n) +=! A(b, m, r_k) * B(b, r_k, n)
    P(b) *=! C(b, r_m, r_n) where r_m in 0:M, r_n in 0:N
}""",
]

# Tokens that mutations insert: every TC operator and keyword, some names and numbers, and a
# few characters TC does not know.
TC_TOKENS = [
    "def",
    "where",
    "in",
    "exists",
    "for",
    "->",
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
    "+=",
    "*=",
    "min=",
    "max=",
    "!",
    "+=!",
    "&&",
    "||",
    "<",
    "<=",
    ">",
    ">=",
    "==",
    "!=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "A",
    "i",
    "r_k",
    "N",
    "exp",
    "float",
    "int32",
    "min",
    "T.0",
    "0",
    "1",
    "2.5",
    "1e-5",
    ".5",
    "1e",
    "#",
    "\n",
    " ",
    "@",
    "[",
    "&",
    "\t",
    "\\",
]
CHARACTERS = st.sampled_from(list("()[]{},:;?.=!<>+-*/%#&|@$_ \n\taxN019e") + ["é", "\0", "\r"])

# A rough split into tokens and the text between them, independent of polyc's lexer.
_PIECE = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|->|[+*]=!?|\S")


@st.composite
def char_edit(draw, text: str) -> str:
    position = draw(st.integers(0, len(text)))
    kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate", "truncate"]))
    if kind == "truncate":
        return text[:position]
    if kind == "insert":
        return text[:position] + draw(CHARACTERS) + text[position:]
    length = draw(st.integers(1, 12))
    end = min(len(text), position + length)
    if kind == "delete":
        return text[:position] + text[end:]
    if kind == "replace":
        return text[:position] + draw(CHARACTERS) + text[position + 1 :]
    return text[:end] + text[position:end] + text[end:]  # duplicate


@st.composite
def token_edit(draw, text: str) -> str:
    pieces = _PIECE.findall(text)
    if not pieces:
        return draw(st.sampled_from(TC_TOKENS))
    index = draw(st.integers(0, len(pieces) - 1))
    kind = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "insert"]))
    if kind == "delete":
        del pieces[index]
    elif kind == "duplicate":
        pieces.insert(index, pieces[index])
    elif kind == "swap":
        other = draw(st.integers(0, len(pieces) - 1))
        pieces[index], pieces[other] = pieces[other], pieces[index]
    elif kind == "replace":
        pieces[index] = draw(st.sampled_from(TC_TOKENS))
    else:
        pieces.insert(index, " " + draw(st.sampled_from(TC_TOKENS)) + " ")
    return "".join(pieces)


@st.composite
def mutated_sources(draw) -> str:
    """A valid kernel with one to five random character or token edits."""
    text = draw(st.sampled_from(VALID_SOURCES))
    for _ in range(draw(st.integers(1, 5))):
        edit = draw(st.sampled_from([char_edit, token_edit]))
        text = draw(edit(text))
    return text


def assert_well_located(error: PolycError, text: str) -> None:
    """An error's location, if any, must point into (or just past) the source."""
    if error.location is None:
        return
    assert 1 <= error.location.line <= text.count("\n") + 1
    assert error.location.col >= 1
    str(error)  # formatting the caret line must not fail either


@pytest.mark.parametrize("text", VALID_SOURCES)
def test_seed_sources_are_valid(text):
    assert isinstance(parse(text), ast.SourceFile)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_parse_never_crashes(text):
    try:
        result = parse(text)
    except PolycError as error:
        assert_well_located(error, text)
    else:
        assert isinstance(result, ast.SourceFile) and result.defs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_sources())
def test_check_never_crashes(text):
    try:
        check_source(text)
    except PolycError as error:
        assert_well_located(error, text)
