"""Malformed TC sources: each must fail with the right error class at the right line and column.

MALFORMED_CASES are syntax errors found by the parser (and its lexer).  Sources that parse but
mean nothing are in test_semantic_errors.py.
"""

import pytest

from polyc.errors import PolycError, TCSyntaxError
from polyc.lang.parser import parse


def case(case_id: str, source: str, line: int, col: int, error=TCSyntaxError):
    """One row of a table: the source, the error class, and the 1-based line and column."""
    return pytest.param(source, error, line, col, id=case_id)


def in_body(*lines: str) -> str:
    """A one-input def whose body is ``lines``: the first of them is line 2 of the source."""
    return "def f(float(N) A) -> (B) {\n" + "\n".join(lines) + "\n}"


# The body of a one-line def starts at column 28, its right-hand side (after 'B(i) = ') at 35.
ONE_LINE = "def f(float(N) A) -> (B) { "
DEEP = 10_000

# ----------------------------------------------------------------------------- syntax errors
MALFORMED_CASES = [
    # --- characters and numbers the lexer rejects
    case("stray-at", ONE_LINE + "B(i) = A(i) @ 2 }", 1, 40),
    case("dollar-in-name", "def f(float(N) $A) -> (B) { B(i) = 1 }", 1, 16),
    case("backtick", in_body("  B(i) = `A(i)`"), 2, 10),
    case("single-ampersand", in_body("  B(i) = A(i) > 0 & A(i) < 1"), 2, 19),
    case("single-pipe", in_body("  B(i) = A(i) > 0 | A(i) < 1"), 2, 19),
    case("square-brackets", in_body("  B[i] = A[i]"), 2, 4),
    case("exponent-without-digits", in_body("  B(i) = A(i) * 1e"), 2, 17),
    case("exponent-sign-only", in_body("  B(i) = A(i) * 1e+ 2"), 2, 17),
    case("float-suffix", in_body("  B(i) = A(i) * 2.5f"), 2, 17),
    case("number-glued-to-name", in_body("  B(i) = 2i * A(i)"), 2, 10),
    case("hex-literal", in_body("  B(i) = A(i) * 0x10"), 2, 17),
    case("huge-integer", in_body("  B(i) = A(i) * " + "9" * 5000), 2, 17),
    case("integer-beyond-uint64", in_body("  B(i) = A(i) * 18446744073709551616"), 2, 17),
    case("huge-size", "def f(float(" + "1" * 30 + ") A) -> (B) { B(i) = A(i) }", 1, 13),
    case("huge-extent-dimension", in_body("  B(i) = A." + "7" * 25), 2, 12),
    case("float-overflow", in_body("  B(i) = A(i) * 1e999"), 2, 17),
    case("def-name-is-number", "def 3f(float(N) A) -> (B) { B(i) = A(i) }", 1, 5),
    case("unicode-times", in_body("  B(i) = A(i) × 2"), 2, 15),
    case("unicode-minus", in_body("  B(i) = A(i) − 1"), 2, 15),
    case("string-literal", ONE_LINE + 'B(i) = "A" }', 1, 35),
    case("line-continuation", in_body("  B(i) = A(i) \\", "      + 1"), 2, 15),
    case("tab-indented-stray", "def f(float(N) A) -> (B) {\n\tB(i) = A(i) @\n}", 2, 14),
    case("crlf-stray", "def f(float(N) A) -> (B) {\r\n  B(i) = A(i) $\r\n}\r\n", 2, 15),
    case("nul-byte", in_body("  B(i) = A(i)\0"), 2, 14),
    # --- comments from other languages
    case("cpp-comment", in_body("  B(i) = A(i) // copy"), 2, 16),
    case("c-block-comment", "/* copy */\ndef f(float(N) A) -> (B) { B(i) = A(i) }", 1, 1),
    # --- empty sources and text outside defs
    case("empty-source", "", 1, 1),
    case("only-comments", "# nothing here\n# at all\n", 1, 1),
    case("only-whitespace", "   \n\n  \t", 1, 1),
    case("statement-outside-def", "B(i) = A(i)", 1, 1),
    case("statement-after-def", "def f(float(N) A) -> (B) { B(i) = A(i) }\nB(i) = 1", 2, 1),
    case("extra-closing-brace", in_body("  B(i) = A(i)") + "\n}", 4, 1),
    case("python-def-colon", "def f(float(N) A) -> (B):\n  B(i) = A(i)", 1, 25),
    case(
        "duplicate-def", "def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float(N) A) -> (B) { B(i) = 2 * A(i) }", 2, 5
    ),
    case("def-inside-def", in_body("  B(i) = A(i)", "def g(float(N) A) -> (B) { B(i) = A(i) }")[:-2], 3, 1),
    # --- def header
    case("missing-def-name", "def (float(N) A) -> (B) { B(i) = A(i) }", 1, 5),
    case("keyword-def-name", "def where(float(N) A) -> (B) { B(i) = A(i) }", 1, 5),
    case("missing-input-parens", "def f float(N) A) -> (B) { B(i) = A(i) }", 1, 7),
    case("untyped-input", "def f(A, B) -> (C) { C(i) = A(i) + B(i) }", 1, 7),
    case("python-annotation", "def f(A: float) -> (B) { B(i) = A }", 1, 7),
    case("unknown-type", "def f(foo(N) A) -> (B) { B(i) = A(i) }", 1, 7),
    case("type-int", "def f(int(N) A) -> (B) { B(i) = A(i) }", 1, 7),
    case("type-capitalised", "def f(Float(N) A) -> (B) { B(i) = A(i) }", 1, 7),
    case("type-misspelt-second", "def f(float(N) A, flaot(N) B) -> (C) { C(i) = A(i) }", 1, 19),
    case("type-no-sizes-unknown", "def f(real x) -> (B) { B = x }", 1, 7),
    case("size-expression", "def f(float(N+1) A) -> (B) { B(i) = A(i) }", 1, 14),
    case("size-float", "def f(float(2.5) A) -> (B) { B(i) = A(i) }", 1, 13),
    case("size-negative", "def f(float(-1) A) -> (B) { B(i) = A(i) }", 1, 13),
    case("size-keyword", "def f(float(where) A) -> (B) { B(i) = A(i) }", 1, 13),
    case("size-empty-slot", "def f(float(N,,M) A) -> (B) { B(i) = A(i, 0) }", 1, 15),
    case("sizes-unclosed", "def f(float(N A) -> (B) { B(i) = A(i) }", 1, 15),
    case("sizes-trailing-comma", "def f(float(N,) A) -> (B) { B(i) = A(i) }", 1, 15),
    case("sizes-in-brackets", "def f(float[N] A) -> (B) { B(i) = A(i) }", 1, 12),
    case("input-missing-name", "def f(float(N)) -> (B) { B(i) = 1 }", 1, 15),
    case("input-named-like-builtin", "def f(float(N) exp) -> (B) { B(i) = exp(i) }", 1, 16),
    case("input-named-like-type", "def f(float(N) int32) -> (B) { B(i) = 1 }", 1, 16),
    case("input-named-like-keyword", "def f(float(N) in) -> (B) { B(i) = 1 }", 1, 16),
    case("inputs-without-comma", "def f(float(N) A float(N) B) -> (C) { C(i) = A(i) }", 1, 18),
    case("inputs-trailing-comma", "def f(float(N) A,) -> (B) { B(i) = A(i) }", 1, 18),
    case("inputs-leading-comma", "def f(, float(N) A) -> (B) { B(i) = A(i) }", 1, 7),
    case("missing-arrow", "def f(float(N) A) (B) { B(i) = A(i) }", 1, 19),
    case("fat-arrow", "def f(float(N) A) => (B) { B(i) = A(i) }", 1, 19),
    case("spaced-arrow", "def f(float(N) A) - > (B) { B(i) = A(i) }", 1, 19),
    case("outputs-without-parens", "def f(float(N) A) -> B { B(i) = A(i) }", 1, 22),
    case("outputs-unclosed", "def f(float(N) A) -> (B { B(i) = A(i) }", 1, 25),
    case("outputs-without-comma", "def f(float(N) A) -> (B C) { B(i) = A(i) C(i) = A(i) }", 1, 23),
    case("outputs-trailing-comma", "def f(float(N) A) -> (B,) { B(i) = A(i) }", 1, 25),
    case("output-unknown-type", "def f(float(N) A) -> (flaot(N) B) { B(i) = A(i) }", 1, 23),
    case("output-type-without-name", "def f(float(N) A) -> (float(N)) { B(i) = A(i) }", 1, 31),
    case("output-named-like-type", "def f(float(N) A) -> (float) { B(i) = A(i) }", 1, 23),
    case("output-named-like-builtin", "def f(float(N) A) -> (B, exp) { B(i) = A(i) }", 1, 26),
    case("output-typed-missing-name", "def f(float(N) A) -> (float { B(i) = A(i) }", 1, 29),
    case("missing-body-brace", "def f(float(N) A) -> (B) B(i) = A(i) }", 1, 26),
    case("body-in-parens", "def f(float(N) A) -> (B) ( B(i) = A(i) )", 1, 26),
    # --- end of input too early (reported just after the last token)
    case("eof-after-def", "def", 1, 4),
    case("eof-in-inputs", "def f(float(N) A", 1, 17),
    case("eof-after-arrow", "def f(float(N) A) ->", 1, 21),
    case("eof-in-outputs", "def f(float(N) A) -> (B", 1, 24),
    case("eof-after-open-brace", "def f(float(N) A) -> (B) { # body follows\n\n", 1, 27),
    case("eof-in-body", in_body("  B(i) = A(i)")[:-2], 2, 14),
    case("eof-after-lhs", ONE_LINE + "B(i)", 1, 32),
    case("eof-after-init-marker", ONE_LINE + "B(i) +=!", 1, 36),
    case("eof-after-operator", ONE_LINE + "B(i) = A(i) *", 1, 41),
    case("eof-in-ternary", ONE_LINE + "B(i) = A(i) ?", 1, 41),
    case("eof-in-where", ONE_LINE + "B(i) = A(i) where i in", 1, 50),
    # --- left-hand side
    case("lhs-shifted-index", in_body("    B(i+1) = A(i)"), 2, 7),
    case("lhs-constant-index", in_body("    B(0) = A(0)"), 2, 7),
    case("lhs-strided-second-index", "def f(float(N, M) A) -> (B) {\n    B(i, 2*j) = A(i, j)\n}", 2, 10),
    case("lhs-access-index", in_body("    B(A(i)) = 1"), 2, 7),
    case("lhs-negated-index", in_body("    B(-i) = A(i)"), 2, 7),
    case("lhs-ternary-index", in_body("    B(i > 0 ? i : 0) = A(i)"), 2, 7),
    case("lhs-empty-slot", in_body("    B(i,) = A(i)"), 2, 9),
    case("lhs-leading-comma", in_body("    B(, i) = A(i)"), 2, 7),
    case("lhs-missing-comma", in_body("    B(i j) = A(i)"), 2, 9),
    case("lhs-unclosed", in_body("    B(i = A(i)"), 2, 9),
    case("lhs-in-brackets", in_body("    B[i] = A(i)"), 2, 6),
    case("target-is-keyword", in_body("    where(i) = A(i)"), 2, 5),
    case("target-is-builtin", in_body("    exp(i) = A(i)"), 2, 5),
    case("target-is-type", in_body("    float(i) = A(i)"), 2, 5),
    case("target-is-number", in_body("    2 = A(0)"), 2, 5),
    case("target-is-parenthesised", in_body("    (B)(i) = A(i)"), 2, 5),
    # --- assignment operator
    case("missing-assignment", in_body("    B(i) A(i)"), 2, 10),
    case("minus-equals", in_body("    B(i) -= A(i)"), 2, 10),
    case("divide-equals", in_body("    B(i) /= A(i)"), 2, 10),
    case("modulo-equals", in_body("    B(i) %= A(i)"), 2, 10),
    case("double-equals", in_body("    B(i) == A(i)"), 2, 10),
    case("colon-equals", in_body("    B(i) := A(i)"), 2, 10),
    case("plus-plus-equals", in_body("    B(i) ++= A(i)"), 2, 10),
    case("bang-alone", in_body("    B(i) ! A(i)"), 2, 10),
    case("bang-before-operator", in_body("    B(i) !+= A(i)"), 2, 10),
    case("min-then-space-equals", in_body("    B(i) min = A(i)"), 2, 14),
    case("min-without-equals", in_body("    B(i) min A(i)"), 2, 10),
    case("min-double-equals", in_body("    B(i) min== A(i)"), 2, 10),
    case("sum-equals", in_body("    B(i) sum= A(i, j)"), 2, 10),
    # --- right-hand side
    case("missing-rhs", in_body("    B(i) = "), 3, 1),
    case("missing-rhs-before-where", in_body("    B(i) +=! where i in 0:N"), 2, 14),
    case("dangling-plus", in_body("    B(i) = A(i) +"), 3, 1),
    case("double-operator", in_body("    B(i) = A(i) * * 2"), 2, 19),
    case("plus-times", in_body("    B(i) = A(i) +* 2"), 2, 18),
    case("unclosed-parenthesis", in_body("    B(i) = (A(i) + 1"), 3, 1),
    case("unclosed-access", in_body("    B(i) = A(i"), 3, 1),
    case("extra-closing-paren", in_body("    B(i) = A(i))"), 2, 16),
    case("empty-parentheses", in_body("    B(i) = ()"), 2, 13),
    case("missing-argument", in_body("    B(i) = fmax(A(i), )"), 2, 23),
    case("leading-comma-argument", in_body("    B(i) = A(, i)"), 2, 14),
    case("arguments-without-comma", in_body("    B(i) = fmax(A(i) 0)"), 2, 22),
    case("closer-as-rhs", in_body("    B(i) = ) A(i)"), 2, 12),
    case("keyword-as-argument", in_body("    B(i) = A(in)"), 2, 14),
    case("keyword-as-operand", in_body("    B(i) = A(i) + exists"), 2, 19),
    case("comma-after-rhs", in_body("    B(i) = A(i), B(i) = 1"), 2, 16),
    case("double-semicolon", in_body("    B(i) = A(i);;"), 2, 17),
    case("semicolon-before-where", in_body("    B(i) = A(i); where i in 0:N"), 2, 18),
    case("method-call", in_body("    B(i) = A(i).sum()"), 2, 16),
    case("python-conditional", in_body("    B(i) = A(i) if A(i) > 0 else 0"), 2, 17),
    case("ternary-missing-colon", in_body("    B(i) = A(i) > 0 ? A(i)"), 3, 1),
    case("ternary-missing-else", in_body("    B(i) = A(i) > 0 ? A(i) :"), 3, 1),
    case("ternary-missing-then", in_body("    B(i) = A(i) > 0 ? : 0"), 2, 23),
    case("extent-name-dimension", in_body("    B(i) = A.x"), 2, 14),
    case("extent-float-dimension", in_body("    B(i) = A.0.5"), 2, 14),
    case("extent-negative-dimension", in_body("    B(i) = A.-1"), 2, 14),
    case("extent-missing-dimension", in_body("    B(i) = A. + 1"), 2, 15),
    case("extent-of-access", in_body("    B(i) = A(i).0"), 2, 16),
    # --- where clauses
    case("where-nothing", in_body("    B(i) = A(i) where"), 3, 1),
    case("where-range-missing-hi", in_body("    B(i) = A(i) where i in 0:"), 3, 1),
    case("where-range-missing-lo", in_body("    B(i) = A(i) where i in :N"), 2, 28),
    case("where-range-missing-colon", in_body("    B(i) = A(i) where i in 0 N"), 2, 30),
    case("where-range-dot-dot", in_body("    B(i) = A(i) where i in 0..N"), 2, 30),
    case("where-range-python", in_body("    B(i) = A(i) where i in range(N)"), 3, 1),
    case("where-range-brackets", in_body("    B(i) = A(i) where i in [0, N)"), 2, 28),
    case("where-missing-in", in_body("    B(i) = A(i) where i 0:N"), 2, 25),
    case("where-equals-range", in_body("    B(i) = A(i) where i = 0:N"), 2, 28),
    case("where-keyword-index", in_body("    B(i) = A(i) where in in 0:N"), 2, 23),
    case("where-number-index", in_body("    B(i) = A(i) where 0 in 0:N"), 2, 23),
    case("where-trailing-comma", in_body("    B(i) = A(i) where i in 0:N,"), 3, 1),
    case("where-and-instead-of-comma", in_body("    B(i) = A(i) where i in 0:N and j in 0:N"), 2, 32),
    case("exists-builtin", in_body("    B(i) = A(i) where exists exp(i)"), 2, 30),
    case("exists-without-parens", in_body("    B(i) = A(i) where exists A"), 3, 1),
    case("exists-unclosed", in_body("    B(i) = A(i) where exists A(i"), 3, 1),
    case("exists-nothing", in_body("    B(i) = A(i) where exists"), 3, 1),
    # --- errors further down a realistic file
    case(
        "late-line-unclosed-call",
        "# matmul with bias\n"
        "def mm(float(M, K) A, float(K, N) B, float(N) bias) -> (C) {\n"
        "    C(m, n) +=! A(m, r_k) * B(r_k, n)\n"
        "    C(m, n) = C(m, n) + bias(n\n"
        "}\n",
        5,
        1,
    ),
    case(
        "second-def-error",
        "def f(float(N) A) -> (B) { B(i) = A(i) }\n\ndef g(float(N) A) -> (B) {\n    B(i) = A(i) +* 2\n}",
        4,
        18,
    ),
    case(
        "conv-missing-comma",
        "def conv(float(N, C, H, W) I, float(M, C, KH, KW) W1) -> (O) {\n"
        "    O(n, m, h, w) +=! I(n, r_c, h + r_kh w + r_kw) * W1(m, r_c, r_kh, r_kw)\n"
        "}",
        2,
        42,
    ),
    case(
        "softmax-unclosed-exp",
        "def softmax(float(N, D) I) -> (O, expsum, maxVal) {\n"
        "    maxVal(n) max=! I(n, d)\n"
        "    expsum(n) +=! exp(I(n, d) - maxVal(n)\n"
        "    O(n, d) = exp(I(n, d) - maxVal(n)) / expsum(n)\n"
        "}",
        4,
        5,
    ),
    # --- nesting too deep for the parser (the limit is hit mid-way through the input)
    case("deep-parentheses", ONE_LINE + "B(i) = " + "(" * DEEP + "1" + ")" * DEEP + " }", 1, 35 + 100),
    case("deep-unary-minus", ONE_LINE + "B(i) = " + "-" * DEEP + "1 }", 1, 35 + 199),
    case("deep-sum", ONE_LINE + "B(i) = " + "1+" * DEEP + "1 }", 1, 35 + 2 * 198),
]


@pytest.mark.parametrize("source, error_class, line, col", MALFORMED_CASES)
def test_malformed_source(source, error_class, line, col):
    with pytest.raises(error_class) as info:
        parse(source, filename="bad.tc")
    location = info.value.location
    assert (location.line, location.col) == (line, col), str(info.value)
    assert location.filename == "bad.tc"


def test_there_are_many_malformed_cases():
    assert len(MALFORMED_CASES) >= 110


# ----------------------------------------------------------------------------- messages
@pytest.mark.parametrize(
    "source, fragment",
    [
        ("", "no def in source"),
        (ONE_LINE + "B(i) = fmax(A(i) {", "expected ',' or ')' after an argument of 'fmax', found '{'"),
        (ONE_LINE + "B(i) = A(i)", "unexpected end of input in def 'f': expected a statement or '}'"),
        ("def f(foo(N) A) -> (B) {}", "unknown type 'foo'"),
        (in_body("B(i+1) = A(i)"), "left-hand side indices must be plain index names"),
        ("def f() -> (B) {}\ndef f() -> (B) {}", "duplicate def 'f' (first defined at line 1)"),
        (ONE_LINE + "B(i) = " + "(" * DEEP, "expression nested too deeply"),
        (in_body("B(i) = 1e"), "malformed number '1e': the exponent has no digits"),
        (in_body("B(i) = A(i) @"), "unexpected character '@'"),
        (in_body("B(i) = A(i) & 1"), "did you mean '&&'?"),
        (in_body("B(i) -= A(i)"), "'-=' is not a TC assignment operator"),
        (in_body("B(i) max = A(i)"), "write 'max=' without a space"),
        ("def f(A) -> (B) {}", "input 'A' needs a type, as in 'float(N) A'"),
        ("def f(float(N) A) -> (B, exp) {}", "'exp' is a builtin function name and cannot name a tensor"),
        ("def f(float(N) A) -> (float) {}", "'float' is a type name and cannot name a tensor"),
        (in_body("B(i) = A.x"), "expected a dimension number after 'A.', found 'x'"),
        (in_body("B(i) = A(i) where i 0:N"), "expected 'in' or '=' after 'i' in a where clause"),
        (in_body("B(i) = A(i) where in"), "found keyword 'in'"),
        ("def f(float(N) A) (B) {}", "expected '->' after the inputs of def 'f', found '('"),
        (in_body("B(i) == A(i)"), "expected an assignment operator ('=', '+=', '*=', 'min=' or 'max=')"),
        (in_body("B(i) = A(i) if A(i) > 0 else 0"), "'if' does not start a statement"),
    ],
)
def test_error_message(source, fragment):
    with pytest.raises(TCSyntaxError) as info:
        parse(source)
    assert fragment in info.value.message


def test_error_text_has_location_and_caret():
    with pytest.raises(TCSyntaxError) as info:
        parse(in_body("  B(i) = A(i) @ 2"), filename="kernel.tc")
    assert str(info.value).splitlines() == [
        "kernel.tc:2:15: unexpected character '@'",
        "      B(i) = A(i) @ 2",
        "                  ^",
    ]


def test_syntax_errors_are_polyc_errors():
    assert issubclass(TCSyntaxError, PolycError)


# Sources that parse but mean nothing are in test_semantic_errors.py.
