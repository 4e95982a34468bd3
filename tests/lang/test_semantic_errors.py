"""Sources that parse but mean nothing: each must fail in the checker with the right error class,
at the right line and column, with a message that names the problem."""

from __future__ import annotations

import pytest

from polyc.errors import PolycError, RangeInferenceError, TCSemanticError
from polyc.lang.sema import check_source


def case(case_id: str, source: str, line: int, col: int, fragment: str, error=TCSemanticError):
    """One row: the source, the error class, the 1-based line and column, and a piece of the message."""
    return pytest.param(source, error, line, col, fragment, id=case_id)


def in_body(*lines: str, signature: str = "float(N) A", outputs: str = "B") -> str:
    """A def whose body is ``lines``: the first of them is line 2 of the source."""
    return f"def f({signature}) -> ({outputs}) {{\n" + "\n".join(lines) + "\n}"


# In a body line "  B(i) = ...", the target is at column 3 and the right-hand side at column 10.
SEMANTIC_CASES = [
    # --- names
    case("unknown-tensor", in_body("  B(i) = C(i)"), 2, 10, "unknown tensor 'C'"),
    case("unknown-function", in_body("  B(i) = relu(A(i))"), 2, 10, "unknown tensor 'relu'"),
    case("size-read-as-tensor", in_body("  B(i) = N(i)"), 2, 10, "unknown tensor 'N' (a size)"),
    case("index-called-like-a-tensor", in_body("  B(i) = A(i) + i(0)"), 2, 17, "unknown tensor 'i'"),
    case("unknown-size-in-where", in_body("  B(i) = A(i) where i in 0:M"), 2, 28, "'M' is not a size"),
    case("index-in-where-bound", in_body("  B(i) = A(i + j) where i in 0:N - j"), 2, 36, "'j' is not a size"),
    case(
        "float-scalar-as-bound",
        in_body("  B(i) = A(i) where i in 0:K", signature="float(N) A, float K"),
        2,
        28,
        "'K' is not a size",
    ),
    case("unknown-tensor-in-exists", in_body("  B(i) = 1 where exists Q(i)"), 2, 25, "unknown tensor 'Q'"),
    case("unknown-tensor-in-extent", in_body("  B(i) = A(i) / C.0"), 2, 17, "unknown tensor 'C' in 'C.0'"),
    case("tensor-without-subscripts", in_body("  B(i) = A + 1"), 2, 10, "needs subscripts"),
    # --- signature
    case(
        "duplicate-input", "def f(float(N) A, float(N) A) -> (B) { B(i) = A(i) }", 1, 19, "input 'A' is declared twice"
    ),
    case("duplicate-output", "def f(float(N) A) -> (B, B) { B(i) = A(i) }", 1, 26, "output 'B' is declared twice"),
    case("output-named-like-input", "def f(float(N) A) -> (A) { A(i) = 1 }", 1, 23, "output 'A' is declared twice"),
    case(
        "output-named-like-size", "def f(float(N) A) -> (N) { N(i) = A(i) }", 1, 23, "output 'N' has the name of a size"
    ),
    case(
        "size-named-like-earlier-input",
        "def f(float(N) A, float(A) C) -> (B) { B(i) = A(i) }",
        1,
        25,
        "size 'A' has the name of a tensor",
    ),
    case(
        "size-named-like-its-input",
        "def f(float(N) N) -> (B) { B(i) = N(i) }",
        1,
        13,
        "size 'N' has the name of a tensor",
    ),
    case("output-never-written", in_body("  B(i) = A(i)", outputs="B, C"), 1, 26, "output 'C' is never written"),
    case(
        "output-size-unbound",
        "def f(float(N) A) -> (float(M) B) {\n  B(i) = A(i)\n}",
        1,
        29,
        "size 'M' of output 'B' is not a size of any input",
    ),
    case(
        "output-size-from-float-scalar",
        "def f(float(N) A, float K) -> (float(K) B) {\n  B(i) = A(i)\n}",
        1,
        38,
        "size 'K' of output 'B'",
    ),
    # --- ranks
    case(
        "rank-mismatch-on-read",
        in_body("  B(i) = A(i, 0)"),
        2,
        10,
        "'A' has 1 dimension(s) but is accessed with 2 subscript(s)",
    ),
    case(
        "rank-mismatch-on-scalar-read",
        in_body("  B(i) = A(i) * s(0)", signature="float(N) A, float s"),
        2,
        17,
        "'s' has 0 dimension(s)",
    ),
    case("rank-mismatch-in-exists", in_body("  B(i) = 1 where exists A(i, i)"), 2, 25, "accessed with 2"),
    case(
        "rank-mismatch-on-write",
        "def f(float(N) A) -> (float(N) B) {\n  B(i, j) = A(i)\n}",
        2,
        3,
        "'B' has 1 dimension(s) but is written with 2 index(es)",
    ),
    case(
        "rank-mismatch-on-second-write",
        in_body("  B(i) = A(i)", "  B(i, j) = A(i) + A(j)"),
        3,
        3,
        "written with 2 index(es)",
    ),
    case(
        "rank-mismatch-on-temporary-read", in_body("  T(i) = A(i)", "  B(i) = T(i, 0)"), 3, 10, "'T' has 1 dimension(s)"
    ),
    case("extent-out-of-range", in_body("  B(i) = A(i) / A.5"), 2, 17, "'A.5' does not exist"),
    # --- statements
    case(
        "assignment-with-reduction-index",
        in_body("  B(i) = A(i, r_j)", signature="float(N, M) A"),
        2,
        15,
        "'=' cannot reduce over 'r_j'",
    ),
    case("zero-d-assignment-with-reduction", in_body("  B = A(r_i)"), 2, 9, "'=' cannot reduce over 'r_i'"),
    case("write-input", in_body("  A(i) = 1 where i in 0:N", "  B(i) = A(i)"), 2, 3, "inputs are read-only"),
    case("write-size", in_body("  N(i) = A(i)"), 2, 3, "'N' is a size and cannot be written"),
    case(
        "index-twice-on-lhs", in_body("  B(i, i) = A(i, i)", signature="float(N, N) A"), 2, 8, "index 'i' appears twice"
    ),
    case("size-as-lhs-index", in_body("  B(N) = A(0)"), 2, 5, "'N' names a size or tensor"),
    case(
        "tensor-as-lhs-index",
        in_body("  B(C) = A(0)", signature="float(N) A, float(N) C"),
        2,
        5,
        "'C' names a size or tensor",
    ),
    case(
        "read-output-before-write",
        in_body("  C(i) = B(i) + A(i)", "  B(i) = A(i)", outputs="B, C"),
        2,
        10,
        "'B' is read before any statement writes it",
    ),
    case(
        "read-temporary-before-write",
        in_body("  B(i) = T(i)", "  T(i) = A(i)"),
        2,
        10,
        "'T' is read before any statement writes it",
    ),
    case(
        "self-read-at-a-later-step",
        in_body("  B(i) = A(i)", "  B(i) = B(i + 1) where i in 0:N-1"),
        3,
        10,
        "a later step along 'i'",
    ),
    case(
        "self-read-at-other-indices",
        in_body("  B(i, j) = A(i, j)", "  B(i, j) = B(j, i)", signature="float(N, N) A"),
        3,
        13,
        "read at other indices than it is written",
    ),
    case(
        "reduction-reads-its-target",
        in_body("  B(i) = A(i, 0)", "  B(i) +=! B(i) * A(i, r_j)", signature="float(N, M) A"),
        3,
        12,
        "a reduction cannot read its own target 'B'",
    ),
    # --- expressions
    case("cast-arity", in_body("  B(i) = float(A(i), 1)"), 2, 10, "cast to float takes 1 argument, not 2"),
    case("cast-without-argument", in_body("  B(i) = A(i) + int32()"), 2, 17, "takes 1 argument, not 0"),
    case("builtin-arity-too-many", in_body("  B(i) = exp(A(i), A(i))"), 2, 10, "exp takes 1 argument(s), not 2"),
    case("builtin-arity-too-few", in_body("  B(i) = fmax(A(i))"), 2, 10, "fmax takes 2 argument(s), not 1"),
    case(
        "float-subscript",
        in_body("  B(i) = A(X(i))", signature="float(N) A, float(N) X"),
        2,
        12,
        "subscripts must be integers",
    ),
    case(
        "float-scalar-subscript",
        in_body("  B(i) = A(s) where i in 0:N", signature="float(N) A, float s"),
        2,
        12,
        "subscripts must be integers",
    ),
    case(
        "literal-overflows-int8",
        in_body("  B(i) = A(i) + 1000", signature="int8(N) A"),
        2,
        17,
        "1000 does not fit in int8",
    ),
    case(
        "negative-literal-for-uint8",
        in_body("  B(i) = A(i) + -1", signature="uint8(N) A"),
        2,
        17,
        "-1 does not fit in uint8",
    ),
    case("cast-of-overflowing-literal", in_body("  B(i) = int8(300) + A(i)"), 2, 15, "300 does not fit in int8"),
    # --- range inference
    case("uninferable-index", in_body("  B(i, j) = A(i)"), 2, 8, "where j in", RangeInferenceError),
    case(
        "uninferable-reduction-index", in_body("  B(i) +=! A(i) * r"), 2, 19, "range of index 'r'", RangeInferenceError
    ),
    case(
        "uninferable-in-later-statement",
        in_body("  B(i) = A(i)", "  B(i) = B(i) * 2 + j"),
        3,
        21,
        "where j in",
        RangeInferenceError,
    ),
    case("non-affine-subscript", in_body("  B(i) = A(i * i)"), 2, 5, "range of index 'i'", RangeInferenceError),
    case(
        "index-only-in-a-condition",
        in_body("  B(i) = A(i) + (j > 0 ? 1 : 0)"),
        2,
        18,
        "where j in",
        RangeInferenceError,
    ),
    # --- where clauses
    case(
        "where-range-for-unused-index",
        in_body("  B(i) = A(i) where j in 0:N"),
        2,
        21,
        "gives a range to 'j', which the statement does not use",
    ),
    case(
        "duplicate-where-range",
        in_body("  B(i) = A(i) where i in 0:N, i in 0:N"),
        2,
        31,
        "index 'i' is given two ranges",
    ),
    case("where-range-for-size", in_body("  B(i) = A(i) where N in 0:3"), 2, 21, "'N' names a size or tensor"),
    case("where-range-for-tensor", in_body("  B(i) = A(i) where A in 0:N"), 2, 21, "'A' names a size or tensor"),
    case("float-bound", in_body("  B(i) = A(i) where i in 0:1.5"), 2, 28, "'1.5' is not an integer"),
    case(
        "product-of-sizes-bound",
        in_body("  B(i) = A(0, 0) where i in 0:N*M", signature="float(N, M) A"),
        2,
        31,
        "a product of two sizes is not affine",
    ),
    case(
        "division-by-size-bound",
        in_body("  B(i) = A(i, 0) where i in 0:N/M", signature="float(N, M) A"),
        2,
        31,
        "divided by a positive integer constant",
    ),
    # --- let bindings
    case("let-cycle", in_body("  B(i) = x where x = y + A(i), y = x"), 2, 36, "defined in terms of itself"),
    case("let-refers-to-itself", in_body("  B(i) = x where x = x + A(i)"), 2, 22, "defined in terms of itself"),
    case("let-defined-twice", in_body("  B(i) = A(i) + x where x = 1, x = 2"), 2, 32, "let name 'x' is already in use"),
    case("let-named-like-index", in_body("  B(i) = A(i) where i = 3"), 2, 21, "let name 'i' is already in use"),
    case("let-named-like-tensor", in_body("  B(i) = A(i) where A = 3"), 2, 21, "let name 'A' is already in use"),
    case("let-reads-unknown-tensor", in_body("  B(i) = x where x = Q(i)"), 2, 22, "unknown tensor 'Q'"),
]


@pytest.mark.parametrize("source, error_class, line, col, fragment", SEMANTIC_CASES)
def test_semantic_error(source, error_class, line, col, fragment):
    with pytest.raises(error_class) as info:
        check_source(source, filename="bad.tc")
    error = info.value
    assert type(error) is error_class, str(error)
    assert (error.location.line, error.location.col) == (line, col), str(error)
    assert error.location.filename == "bad.tc"
    assert fragment in error.message, str(error)


def test_there_are_many_cases():
    assert len(SEMANTIC_CASES) >= 40


def test_uninferable_index_message_suggests_where():
    with pytest.raises(RangeInferenceError) as info:
        check_source(in_body("  B(i, j) = A(i)"))
    message = info.value.message
    assert "'j'" in message and "where j in LO:HI" in message


def test_error_text_shows_the_line_and_a_caret():
    with pytest.raises(TCSemanticError) as info:
        check_source(in_body("  B(i) = C(i)"), filename="kernel.tc")
    assert str(info.value).splitlines() == [
        "kernel.tc:2:10: unknown tensor 'C' (not a tensor, builtin or type)",
        "      B(i) = C(i)",
        "             ^",
    ]


def test_semantic_errors_are_polyc_errors():
    assert issubclass(RangeInferenceError, TCSemanticError)
    assert issubclass(TCSemanticError, PolycError)


def test_the_first_bad_def_is_reported():
    good = "def g(float(N) A) -> (B) { B(i) = A(i) }\n"
    with pytest.raises(TCSemanticError) as info:
        check_source(good + "def f(float(N) A) -> (B) { B(i) = C(i) }")
    assert info.value.location.line == 2
