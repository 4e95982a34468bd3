"""The C expression printer, checked against the reference interpreter.

Differential tests build random typed expressions (hypothesis), evaluate each one over a 1-D
index range with the interpreter and with a small generated C function per expression (one
compile per batch), and require identical results: bit for bit for integers, bools and for
every float operation that is correctly rounded in both (``+ - * /``, sqrt, fmod, conversions,
...).  Transcendental builtins, where numpy and glibc may differ in the last bits, are checked
to a few ulp in a separate test.  All C is compiled with ``-ffp-contract=off`` (and without
``-ffast-math``) so that gcc does not fuse ``a * b + c`` into one rounding.

Run ``POLYC_CFLAGS="-O2" pytest tests/codegen`` to test code built without ``-march=native``
(float16 then goes through software conversions instead of AVX512-FP16).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyc.codegen.c_expr import PRELUDE, CExpressionPrinter, c_constant, c_type
from polyc.errors import PolycError
from polyc.interpreter import interpret
from polyc.lang import checked as ir
from polyc.lang.checked import Binary, Call, Cast, Const, IndexValue, Read, Select, SizeValue, Unary
from polyc.lang.sema import check_source
from polyc.lang.symbolic import Affine
from polyc.runtime import CompilerOptions, get_function, get_or_build, load_library
from polyc.runtime.arguments import bind_arguments

BOOL, INT8, INT16, INT32, INT64 = (np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64))
UINT8, UINT16, UINT32, UINT64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
FLOAT16, FLOAT32, FLOAT64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
INTEGER_TYPES = [INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64]
FLOAT_TYPES = [FLOAT16, FLOAT32, FLOAT64]
ALL_TYPES = [BOOL, *INTEGER_TYPES, *FLOAT_TYPES]

#: Points of the 1-D index range; odd and above every vector width, so numpy's vector loops run.
N = 37
#: Expressions compiled together in one C file.
BATCH = 40

#: -frounding-math only to dodge a gcc 12 wrong-code bug: it folds ``0.0 - y`` and ``0.0 + (-y)`` to
#: ``-y`` whenever y cannot be -0.0 (``fabs(x)``, ``(double)int``), even at -O0, so 0.0 - fabs(0.0)
#: gives -0.0 instead of +0.0.  Under the default rounding mode the flag changes no result.
OPTIONS = CompilerOptions(extra_flags=("-ffp-contract=off", "-fno-fast-math", "-frounding-math"), openmp=False)

I = Affine.var("i")
SIZE = Affine.var("N")

INTERESTING_VALUES = {
    BOOL: [False, True],
    INT8: [0, 1, -1, 2, 3, -7, 100, 127, -128],
    INT32: [0, 1, -1, 2, 3, -7, 1000, 65536, 2**31 - 1, -(2**31)],
    INT64: [0, 1, -1, 3, -7, 2**31, 2**40 + 1, 2**63 - 1, -(2**63)],
    UINT8: [0, 1, 2, 3, 7, 128, 255],
    INT16: [0, 1, -1, 3, -7, 255, 32767, -32768],
    UINT16: [0, 1, 3, 255, 32768, 65535],  # 65535 * 65535 overflows int, to which C promotes uint16
    UINT32: [0, 1, 3, 2**31, 2**32 - 1],
    UINT64: [0, 1, 3, 2**63, 2**64 - 1],
}
FLOAT_VALUES = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    -0.5,
    1.5,
    -2.5,
    3.0,
    0.1,
    -7.75,
    127.5,
    -128.75,
    255.9,
    256.0,
    300.0,
    65504.0,
    2.0**31,
    -(2.0**31),
    2.0**31 - 128,
    2.0**32,
    2.0**63,
    -(2.0**63),
    2.0**64,
    1e30,
    -1e30,
    1e-40,
    1e-310,
    np.inf,
    -np.inf,
    np.nan,
]
for _dtype in FLOAT_TYPES:
    with np.errstate(over="ignore"):
        INTERESTING_VALUES[_dtype] = sorted({_dtype.type(v).item() for v in FLOAT_VALUES if not np.isnan(v)}) + [np.nan]


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache for this module, so the tests never touch the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
        yield


# ----------------------------------------------------------------------------- harness
def _access(read: Read, subscripts: list[str]) -> str:
    return f"{read.tensor}[{subscripts[0] if subscripts else 0}]"


PRINTER = CExpressionPrinter(access=_access)


def c_source(definition: ir.CheckedDef) -> str:
    """One C function ``statement_<k>(sizes, tensors)`` per statement of a def of 0-d and 1-d
    tensors whose statements are all plain assignments over at most one index."""
    names = [t.name for t in definition.tensors]
    lines = [PRELUDE]
    for statement in definition.statements:
        assert statement.op == "=" and len(statement.indices) <= 1 and not statement.reduction_indices
        lines.append(f"void statement_{statement.position}(const int64_t *sizes, void *const *tensors)\n{{")
        lines += [f"    const int64_t {size} = sizes[{k}];" for k, size in enumerate(definition.sizes)]
        for k, name in enumerate(names):
            tensor = definition.tensor(name)
            const = "const " if tensor.role is ir.Role.INPUT else ""
            lines.append(f"    {const}{c_type(tensor.dtype)} *restrict {name} = tensors[{k}];")
        value = PRINTER.to_c(statement.rhs)
        if statement.indices:
            ((index, bounds),) = statement.ranges
            lines.append(f"    for (int64_t {index} = {bounds.lo.to_c()}; {index} < {bounds.hi.to_c()}; ++{index})")
            lines.append(f"        {statement.target}[{index}] = {value};")
        else:
            lines.append(f"    {statement.target}[0] = {value};")
        lines.append("}\n")
    return "\n".join(lines)


def run_compiled(definition: ir.CheckedDef, args) -> tuple[np.ndarray, ...]:
    """Run ``definition`` through the generated C, returning its outputs like ``interpret``."""
    call = bind_arguments(definition, args)
    arrays = dict(call.arrays)
    arrays.update(
        {
            t.name: np.zeros(t.concrete_shape(call.sizes), t.dtype)
            for t in definition.tensors
            if t.role is ir.Role.TEMPORARY
        }
    )
    library = load_library(get_or_build(c_source(definition), OPTIONS))
    sizes = (ctypes.c_int64 * max(1, len(definition.sizes)))(*[call.sizes[s] for s in definition.sizes])
    tensors = (ctypes.c_void_p * len(definition.tensors))(*[arrays[t.name].ctypes.data for t in definition.tensors])
    for statement in definition.statements:
        function = get_function(library, f"statement_{statement.position}", [ctypes.c_void_p, ctypes.c_void_p])
        function(ctypes.cast(sizes, ctypes.c_void_p), ctypes.cast(tensors, ctypes.c_void_p))
    return tuple(arrays[name] for name in definition.outputs)


def expressions_def(expressions: list[ir.TExpr], inputs: dict[str, np.ndarray]) -> ir.CheckedDef:
    """A def computing ``O<k>(i) = expressions[k]`` for i in 0:N, reading the 1-d ``inputs``."""
    tensors = [ir.Tensor(name, array.dtype, (SIZE,), ir.Role.INPUT) for name, array in inputs.items()]
    statements = []
    for k, expr in enumerate(expressions):
        tensors.append(ir.Tensor(f"O{k}", expr.dtype, (SIZE,), ir.Role.OUTPUT))
        statements.append(
            ir.CheckedStatement(
                k,
                f"O{k}",
                ("i",),
                (),
                (("i", ir.IndexRange(Affine.const(0), SIZE)),),
                "=",
                False,
                expr,
                text=f"O{k}(i) = ...",
            )
        )
    return ir.CheckedDef(
        "expressions",
        tuple(tensors),
        tuple(inputs),
        tuple(f"O{k}" for k in range(len(expressions))),
        ("N",),
        (ir.SizeBinding("N", next(iter(inputs)), 0),),
        tuple(statements),
    )


def mismatches(expected: np.ndarray, actual: np.ndarray, ulps: int = 0) -> np.ndarray:
    """Positions where ``actual`` differs from ``expected``: exactly (any NaN equals any NaN; the
    sign of zero counts), or for floats with ``ulps`` > 0 by more than ``ulps`` units in the last
    place of the expected value (or that many machine epsilons absolutely, for results near 0)."""
    assert expected.dtype == actual.dtype and expected.shape == actual.shape
    if expected.dtype.kind != "f":
        return np.flatnonzero(expected != actual)
    both_nan = np.isnan(expected) & np.isnan(actual)
    bits = np.dtype(f"u{expected.dtype.itemsize}")
    same = both_nan | (expected.view(bits) == actual.view(bits))
    if ulps:
        with np.errstate(all="ignore"):
            scale = np.maximum(np.spacing(np.abs(expected)), np.finfo(expected.dtype).eps)
            same |= np.abs(expected.astype(np.float64) - actual.astype(np.float64)) <= ulps * scale.astype(np.float64)
    return np.flatnonzero(~same)


def check_against_interpreter(definition: ir.CheckedDef, args, ulps: int = 0) -> None:
    expected = interpret(definition, args)
    actual = run_compiled(definition, args)
    failures = []
    for statement, want, got in zip(definition.statements, expected, actual, strict=True):
        bad = mismatches(want, got, ulps)
        if bad.size:
            at = int(bad[0])
            inputs = {
                name: arg[at] if getattr(arg, "ndim", 0) == 1 else arg for name, arg in zip(definition.inputs, args)
            }
            failures.append(
                f"{statement.target}: {bad.size} mismatch(es); at i={at} interpreter {want[at]!r}, "
                f"C {got[at]!r}\n  C: {PRINTER.to_c(statement.rhs)}\n  expr: {statement.rhs}\n"
                f"  inputs at i: {inputs}"
            )
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- random expressions
def _tensor_name(prefix: str, dtype: np.dtype) -> str:
    return f"{prefix}_{dtype.name}"


def exact_inputs(seed: int) -> dict[str, np.ndarray]:
    """Two arrays X_<type>, Y_<type> per type, half interesting values and half random ones, and
    an int32 gather index G with values in [0, N)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for dtype in ALL_TYPES:
        for prefix in "XY":
            pool = np.array(INTERESTING_VALUES[dtype], dtype=dtype)
            if dtype.kind == "f":
                with np.errstate(over="ignore"):
                    random = (rng.standard_normal(N) * 10.0 ** rng.integers(-3, 6, N)).astype(dtype)
            elif dtype == BOOL:
                random = rng.integers(0, 2, N).astype(dtype)
            else:
                info = np.iinfo(dtype)
                random = rng.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
            inputs[_tensor_name(prefix, dtype)] = np.where(rng.random(N) < 0.5, rng.choice(pool, N), random)
    inputs["G"] = rng.integers(0, N, N).astype(np.int32)
    return inputs


def _constants(dtype: np.dtype):
    return st.sampled_from(INTERESTING_VALUES[dtype]).map(lambda v: Const(dtype, dtype.type(v).item()))


def leaves(dtype: np.dtype):
    """Reads (at i, at N - 1 - i, gathered through G or through a modulo), constants, and for
    int64 the index and the size."""
    x, y = _tensor_name("X", dtype), _tensor_name("Y", dtype)
    gather = Cast(INT64, Read(INT32, "G", (I,)))
    modulo = Binary(INT64, "%", Cast(INT64, Read(UINT8, "X_uint8", (I,))), SizeValue(INT64, SIZE))
    options = [
        st.sampled_from(
            [
                Read(dtype, x, (I,)),
                Read(dtype, y, (I,)),
                Read(dtype, x, (SIZE - I - 1,)),
                Read(dtype, y, (gather,)),
                Read(dtype, x, (modulo,)),
            ]
        ),
        _constants(dtype),
    ]
    if dtype == INT64:
        options.append(st.sampled_from([IndexValue(INT64, "i"), SizeValue(INT64, SIZE - 1)]))
    return st.one_of(options)


def _signed_zero_free(expr: ir.TExpr) -> ir.TExpr:
    """``expr + 0.0``, which turns -0.0 into +0.0 and changes nothing else.

    Whether float min/max of -0.0 and +0.0 give -0.0 or +0.0 is unspecified in C (fmax) and even
    in numpy, whose scalar and vector loops choose differently; later operations such as ``1 / x``
    would expose the choice, so the random tests normalise it away."""
    return Binary(expr.dtype, "+", expr, Const(expr.dtype, 0.0))


@st.composite
def exact_expressions(draw, dtype: np.dtype, depth: int = 4):
    """A random expression of type ``dtype`` made of operations that are exact in numpy and C."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(leaves(dtype))

    def sub(of_type=dtype):
        return draw(exact_expressions(of_type, depth - 1))

    kinds = ["select", "cast"]
    if dtype == BOOL:
        kinds += ["compare", "logic", "not"]
    else:
        kinds += ["arithmetic", "arithmetic", "negate", "min_max", "abs"]
        if dtype.kind == "f":
            kinds += ["unary_math", "binary_math"]
    kind = draw(st.sampled_from(kinds))
    if kind == "select":
        return Select(dtype, sub(BOOL), sub(), sub())
    if kind == "cast":
        return Cast(dtype, sub(draw(st.sampled_from([t for t in ALL_TYPES if t != dtype]))))
    if kind == "compare":
        operand_type = draw(st.sampled_from(ALL_TYPES))
        return Binary(
            BOOL, draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="])), sub(operand_type), sub(operand_type)
        )
    if kind == "logic":
        return Binary(BOOL, draw(st.sampled_from(["&&", "||"])), sub(), sub())
    if kind == "not":
        return Unary(BOOL, "not", sub())
    if kind == "arithmetic":
        return Binary(dtype, draw(st.sampled_from(["+", "-", "*", "/", "%"])), sub(), sub())
    if kind == "negate":
        return Unary(dtype, "neg", sub())
    if kind == "abs":
        return Call(dtype, "abs", (sub(),))
    if kind == "min_max":
        func = draw(st.sampled_from(["min", "max", "fmin", "fmax"] if dtype.kind == "f" else ["min", "max"]))
        call = Call(dtype, func, (sub(), sub()))
        return _signed_zero_free(call) if dtype.kind == "f" else call
    if kind == "unary_math":
        return Call(dtype, draw(st.sampled_from(["sqrt", "rsqrt", "floor", "ceil", "trunc", "fabs"])), (sub(),))
    return Call(dtype, "fmod", (sub(), sub()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    expressions=st.lists(st.sampled_from(ALL_TYPES).flatmap(exact_expressions), min_size=BATCH, max_size=BATCH),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_expressions_match_interpreter_exactly(expressions, seed):
    inputs = exact_inputs(seed)
    check_against_interpreter(expressions_def(expressions, inputs), list(inputs.values()))


# ----------------------------------------------------------------------------- math builtins
#: Inexact builtins -> the input arrays (domains) of their arguments.
MATH_DOMAINS = {
    "exp": "R",
    "exp2": "R",
    "expm1": "R",
    "log": "P",
    "log2": "P",
    "log10": "P",
    "log1p": "P",
    "cbrt": "R",
    "sin": "R",
    "cos": "R",
    "tan": "R",
    "asin": "U",
    "acos": "U",
    "atan": "R",
    "sinh": "R",
    "cosh": "R",
    "tanh": "R",
    "asinh": "R",
    "acosh": "Q",
    "atanh": "U",
    "erf": "R",
    "erfc": "R",
    "tgamma": "P",
    "lgamma": "P",
    "pow": "PR",
    "atan2": "RR",
    "hypot": "RR",
    "copysign": "RR",
    "fma": "PPP",
    "round": "H",
    "rint": "H",
    "exp10": "R",
    "logb": "R",
    "remainder": "RR",
    "fdim": "RR",
    "nextafter": "RR",
}


def math_inputs(dtype: np.dtype, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    domains = {
        "R": rng.uniform(-10, 10, N),
        "P": rng.uniform(0.1, 10, N),
        "U": rng.uniform(-0.99, 0.99, N),
        "Q": rng.uniform(1, 10, N),
        # Halves and quarters (ties included) well inside the range where round() is exact.
        "H": rng.integers(-400, 400, N) / 4,
    }
    inputs = {}
    for name, values in domains.items():
        inputs[f"{name}_{dtype.name}"] = values.astype(dtype)
        inputs[f"{name}2_{dtype.name}"] = rng.permutation(values).astype(dtype)
    return inputs


def math_expressions(dtype: np.dtype) -> list[ir.TExpr]:
    expressions = []
    for func, domains in MATH_DOMAINS.items():
        args = tuple(Read(dtype, f"{domain}{'2' if k else ''}_{dtype.name}", (I,)) for k, domain in enumerate(domains))
        expressions.append(Call(dtype, func, args))
    return expressions


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda d: d.name)
def test_math_builtins_agree_within_a_few_ulps(dtype):
    inputs = math_inputs(dtype)
    check_against_interpreter(expressions_def(math_expressions(dtype), inputs), list(inputs.values()), ulps=4)


def test_round_edge_cases():
    values = np.array([0.49999997, 8388609.0, -8388609.0, 0.5, 2.5], dtype=np.float32)
    inputs = {"X": values}
    expressions = [Call(FLOAT32, "round", (Read(FLOAT32, "X", (I,)),))]
    expected = np.array([0.0, 8388609.0, -8388609.0, 1.0, 3.0], dtype=np.float32)
    definition = expressions_def(expressions, inputs)
    np.testing.assert_array_equal(run_compiled(definition, [values])[0], expected)
    np.testing.assert_array_equal(interpret(definition, [values])[0], expected)


def test_rint_rounds_halves_to_even():
    values = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, 8388609.0, -0.25, np.inf, -np.inf], dtype=np.float32)
    expressions = [Call(FLOAT32, "rint", (Read(FLOAT32, "X", (I,)),))]
    expected = np.array([0.0, 2.0, 2.0, -0.0, -2.0, 0.0, 8388609.0, -0.0, np.inf, -np.inf], dtype=np.float32)
    definition = expressions_def(expressions, {"X": values})
    for result in (run_compiled(definition, [values])[0], interpret(definition, [values])[0]):
        np.testing.assert_array_equal(result, expected)
        np.testing.assert_array_equal(np.signbit(result), np.signbit(expected))


@pytest.mark.parametrize("dtype", INTEGER_TYPES, ids=lambda d: d.name)
def test_bit_operations_in_every_integer_type(dtype):
    # Interesting values against every shift count from -2 to the width + 2: C leaves counts
    # outside 0 .. width - 1 undefined, and polyc gives 0 (or -1, shifting a negative right).
    bits = 8 * dtype.itemsize
    values = np.array(INTERESTING_VALUES[dtype], dtype)
    counts = np.array([c for c in range(-2, bits + 3) if dtype.kind == "i" or c >= 0], dtype)
    a, n = (np.repeat(values, len(counts)), np.tile(counts, len(values)))
    inputs = {"A": a, "B": np.roll(a, 1), "S": n}

    def read(name):
        return Read(dtype, name, (I,))

    expressions = [
        Call(dtype, "bitand", (read("A"), read("B"))),
        Call(dtype, "bitor", (read("A"), read("B"))),
        Call(dtype, "bitxor", (read("A"), read("B"))),
        Call(dtype, "bitnot", (read("A"),)),
        Call(dtype, "shl", (read("A"), read("S"))),
        Call(dtype, "shr", (read("A"), read("S"))),
    ]
    definition = expressions_def(expressions, inputs)
    check_against_interpreter(definition, list(inputs.values()))
    got = interpret(definition, list(inputs.values()))
    inside = (n >= 0) & (n < bits)
    wide = a.astype(object)  # Python integers: the exact shifts, then wrapped into dtype
    left = [(int(x) << int(c)) % (1 << bits) if ok else 0 for x, c, ok in zip(wide, n, inside)]
    right = [int(x) >> int(c) if ok else (-1 if x < 0 else 0) for x, c, ok in zip(wide, n, inside)]
    np.testing.assert_array_equal(got[:4], [a & inputs["B"], a | inputs["B"], a ^ inputs["B"], ~a])
    np.testing.assert_array_equal(got[4], np.array(left, np.uint64).astype(dtype))
    np.testing.assert_array_equal(got[5], np.array(right, object).astype(dtype))


def test_bit_operations_take_integers_only():
    with pytest.raises(PolycError, match="bitand takes integers, not float32"):
        check_source("def f(float(N) A) -> (O) { O(i) = bitand(A(i), 1) }")


@pytest.mark.parametrize("dtype", [FLOAT32, FLOAT64], ids=lambda d: d.name)
def test_exact_builtins_at_special_values(dtype):
    # C's remainder rounds the quotient to even (numpy.remainder is Python's modulo); fdim is
    # +0 unless a > b; logb is the exponent, -inf at 0; nextafter steps one ulp towards b
    tiny = np.finfo(dtype).smallest_subnormal
    a = np.array([5, 7, -5, 1, np.inf, 3, 0, -0.0, np.nan, 1, tiny, 1e-30, np.inf, -2], dtype)
    b = np.array([2, 2, 2, 0, 2, np.inf, 1, 1, 1, np.nan, -1, 3, np.inf, -np.inf], dtype)
    inputs = {"A": a, "B": b}
    x, y = Read(dtype, "A", (I,)), Read(dtype, "B", (I,))
    expressions = [Call(dtype, name, (x, y)) for name in ("remainder", "fdim", "nextafter")]
    expressions.append(Call(dtype, "logb", (x,)))
    definition = expressions_def(expressions, inputs)
    check_against_interpreter(definition, [a, b])
    remainder, fdim, nextafter, logb = interpret(definition, [a, b])
    np.testing.assert_array_equal(remainder[:4], [1, -1, -1, np.nan])
    np.testing.assert_array_equal(fdim[[0, 5, 12, 13]], [3, 0, 0, np.inf])
    np.testing.assert_array_equal(nextafter[[3, 10]], [np.nextafter(dtype.type(1), dtype.type(0)), 0])
    np.testing.assert_array_equal(logb[[0, 4, 6, 10]], [2, np.inf, -np.inf, np.log2(tiny)])


def test_fma_rounds_once():
    a = np.array([1.0 + 2.0**-12], dtype=np.float32)
    c = np.array([-(1.0 + 2.0**-11)], dtype=np.float32)
    x = Read(FLOAT32, "A", (I,))
    definition = expressions_def([Call(FLOAT32, "fma", (x, x, Read(FLOAT32, "C", (I,))))], {"A": a, "C": c})
    compiled = run_compiled(definition, [a, c])[0]
    assert compiled[0] == np.float32(2.0**-24)  # the exact a * a + c
    np.testing.assert_array_equal(interpret(definition, [a, c])[0], compiled)


# ----------------------------------------------------------------------------- through the front end
FRONT_END_SOURCE = """
def mixed(int8(N) A, int8(N) B, uint8(N) U, int32(N) I, int64(N) L, float(N) X, double(N) D,
          float16(N) H, bool(N) M, int32(N) G) -> (O1, O2, O3, O4, O5, O6, O7, O8, O9, O10, O11, O12, O13, O14, O15) {
    O1(i) = A(i) + B(i)
    O2(i) = A(i) * B(i) - A(i) / B(i) + A(i) % B(i)
    O3(i) = int32(X(i)) + int32(D(i)) + I(i) / 0
    O4(i) = X(i) > 0 ? sqrt(X(i)) : -X(i)
    O5(i) = max(A(i), B(i)) * 2 + min(U(i), 3)
    O6(i) = X(G(i)) + D(N - 1 - i) + i + N
    O7(i) = M(i) && !(L(i) < I(i)) || X(i) != X(i)
    O8(i) = H(i) * H(i) + 1.5
    O9(i) = exp(X(i) / 100) + rsqrt(fabs(X(i)) + 1)
    O10(i) = uint8(-X(i)) + U(i) * U(i)
    O11(i) = L(i) * L(i) + L(i) % 7 - abs(L(i))
    O12(i) = int8(H(i)) + int64(X(i))
    O13(i) = x * x + 1e-5 where x = fmax(X(i), 0)
    O14(i) = float16(D(i)) / H(i)
    O15(i) = I(i) - 2147483647 - 1 + U(i) - 3.5
}
"""


def test_checked_def_from_tc_source_matches_interpreter():
    (definition,) = check_source(FRONT_END_SOURCE)
    rng = np.random.default_rng(7)
    args = []
    for name in definition.inputs:
        dtype = definition.tensor(name).dtype
        if name == "G":
            args.append(rng.integers(0, N, N).astype(dtype))
        else:
            pool = np.array(INTERESTING_VALUES.get(dtype, [0, 1, 2, 200, 255, 70000]), dtype=dtype)
            args.append(rng.choice(pool, N))
    # exp and rsqrt are not correctly rounded in every libm.
    check_against_interpreter(definition, args, ulps=4)


# ----------------------------------------------------------------------------- printed text
X8, Y8 = Read(INT8, "X", (I,)), Read(INT8, "Y", (I,))
XF = Read(FLOAT32, "F", (I,))
XH = Read(FLOAT16, "H", (I,))


@pytest.mark.parametrize(
    "expr, text",
    [
        (Binary(INT8, "+", X8, Y8), "((int8_t)((uint32_t)(X[i]) + (uint32_t)(Y[i])))"),
        (Binary(INT8, "/", X8, Y8), "polyc_div_int8((X[i]), (Y[i]))"),
        (Binary(BOOL, "<", X8, Const(INT8, -3)), "((X[i]) < (-3))"),
        (Unary(INT64, "neg", IndexValue(INT64, "i")), "((int64_t)-(uint64_t)i)"),
        (Binary(UINT64, "*", Read(UINT64, "U", (I,)), Const(UINT64, 3)), "((U[i]) * UINT64_C(3))"),
        (Call(FLOAT32, "exp", (XF,)), "polyc_expf((F[i]))"),
        (Call(FLOAT32, "sin", (XF,)), "sinf((F[i]))"),
        (
            Call(FLOAT64, "max", (Read(FLOAT64, "D", (I,)), Const(FLOAT64, -np.inf))),
            "polyc_fmax((D[i]), ((double)-INFINITY))",
        ),
        (Call(FLOAT32, "rsqrt", (XF,)), "polyc_rsqrtf((F[i]))"),
        (Call(INT32, "max", (Cast(INT32, X8), Const(INT32, 0))), "polyc_max_int32(((int32_t)(X[i])), 0)"),
        (Binary(FLOAT16, "*", XH, XH), "POLYC_F16((float)(H[i]) * (float)(H[i]))"),
        (Call(FLOAT16, "sin", (XH,)), "POLYC_F16(sinf((float)(H[i])))"),
        (Cast(INT32, XF), "polyc_floatf_to_int32((F[i]))"),
        (Cast(BOOL, XF), "((F[i]) != 0)"),
        (
            Select(FLOAT32, Unary(BOOL, "not", Read(BOOL, "M", (I,))), XF, Const(FLOAT32, 0.1)),
            "((!(M[i])) ? (F[i]) : 0.1f)",
        ),
        (Binary(BOOL, "&&", Const(BOOL, True), Read(BOOL, "M", (I,))), "(1 && (M[i]))"),
        (SizeValue(INT64, SIZE - 1), "(N - 1)"),
        (Read(FLOAT32, "F", (2 * I + SIZE.floordiv(2),)), "(F[(2 * i + polyc_floord(N, 2))])"),
        (Read(FLOAT32, "F", (Cast(INT64, Read(INT32, "G", (I + 1,))),)), "(F[((int64_t)(G[(i + 1)]))])"),
    ],
)
def test_printed_text(expr, text):
    assert PRINTER.to_c(expr) == text


POSITIVE = Binary(BOOL, ">", XF, Const(FLOAT32, 0.0))
GATHERED = Read(BOOL, "M", (Cast(INT64, Read(INT32, "G", (I,))),))


@pytest.mark.parametrize(
    "expr, text",
    [
        # Both operands are safe to evaluate: branch-free, so that gcc vectorizes the loop.
        (Binary(BOOL, "&&", POSITIVE, Read(BOOL, "M", (I,))), "(((F[i]) > 0.0f) & (M[i]))"),
        (Binary(BOOL, "||", POSITIVE, Binary(BOOL, "<", X8, Y8)), "(((F[i]) > 0.0f) | ((X[i]) < (Y[i])))"),
        # An affine left operand may be the guard that proved the right one's reads in bounds.
        (
            Binary(
                BOOL,
                "&&",
                Binary(BOOL, ">=", IndexValue(INT64, "i"), Const(INT64, 1)),
                Binary(BOOL, ">", Read(FLOAT32, "F", (I - 1,)), Const(FLOAT32, 0.0)),
            ),
            "((i >= INT64_C(1)) && ((F[(i - 1)]) > 0.0f))",
        ),
        # A data-dependent subscript is checked at run time: not for elements the left excluded.
        (Binary(BOOL, "&&", POSITIVE, GATHERED), "(((F[i]) > 0.0f) && (M[((int64_t)(G[i]))]))"),
    ],
)
def test_logical_operators_short_circuit_only_where_it_matters(expr, text):
    assert PRINTER.to_c(expr) == text


def test_callbacks_spell_indices_sizes_and_accesses():
    printer = CExpressionPrinter(
        access=lambda read, subscripts: f"{read.tensor}[{' * 8 + '.join(subscripts)}]",
        index=lambda name: {"i": "c0", "j": "c1"}.get(name, f"sizes->{name}"),
        size=lambda affine: f"polyc_size({affine.to_c()})",
    )
    j = Affine.var("j")
    expr = Binary(
        INT64, "+", Read(INT64, "T", (I + SIZE, j)), Binary(INT64, "*", IndexValue(INT64, "j"), SizeValue(INT64, SIZE))
    )
    assert printer.to_c(expr) == (
        "((int64_t)((uint64_t)(T[((sizes->N) + c0) * 8 + c1]) + "
        "(uint64_t)((int64_t)((uint64_t)c1 * (uint64_t)(polyc_size(N))))))"
    )


@pytest.mark.parametrize("dtype", [FLOAT16, FLOAT32, FLOAT64], ids=lambda d: d.name)
@pytest.mark.parametrize("value", [0.1, 1 / 3, -2.5e-8, 1e30, 3.4028235e38, 1e-45, 6e-8, 65504.0, -0.0])
def test_float_constants_read_back_exactly(dtype, value):
    text = c_constant(value, dtype)
    with np.errstate(over="ignore"):
        expected = dtype.type(value)
    literal = text.removeprefix(f"(({c_type(dtype)})").strip("()").removesuffix("f").replace("INFINITY", "inf")
    assert np.array_equal(dtype.type(float(literal)), expected, equal_nan=True), text


def test_special_constants():
    assert c_constant(np.nan, FLOAT32) == "NAN"
    assert c_constant(-np.inf, FLOAT32) == "(-INFINITY)"
    assert c_constant(np.inf, FLOAT16) == "((_Float16)INFINITY)"
    assert c_constant(1e40, FLOAT32) == "INFINITY"
    assert c_constant(-(2**31), INT32) == "INT32_MIN"
    assert c_constant(-5, INT64) == "(-INT64_C(5))"
    assert c_constant(4000000000, UINT32) == "4000000000u"
    assert c_constant(True, BOOL) == "1"
    with pytest.raises(ValueError):
        c_constant(300, INT8)


def test_prelude_compiles_warning_free_as_c99_and_gnu11(tmp_path):
    source = PRELUDE + "int polyc_prelude_probe(void) { return (int)polyc_floord(-7, 2); }\n"
    for standard in ("-std=c99", "-std=gnu11"):
        options = CompilerOptions(flags=("-O2", standard, "-Wall", "-Wextra", "-Werror"), openmp=False)
        probe = get_function(load_library(get_or_build(source, options)), "polyc_prelude_probe", [], ctypes.c_int)
        assert probe() == -4


def test_bool_elements_are_read_as_bytes_and_compute_as_numpy():
    """Bool arrays are read through ``polyc_bool_at`` (as the byte each element is), which gcc
    vectorizes where it leaves a loop that loads ``_Bool`` scalar or branchy."""
    import polyc

    kernels = polyc.define(
        """def masked(bool(N) C, float(N) A, float(N) B) -> (O, P, Q) {
        O(i) = C(i) ? A(i) : B(i)
        P(i) = C(i) && A(i) > B(i)
        Q(k) +=! (C(r_i) && A(r_i) > B(r_i)) ? int32(1) : int32(0) where k in 0:1
    }""",
        tuning=False,
    )
    rng = np.random.default_rng(3)
    c, a, b = rng.random(1000) > 0.5, rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    o, p, q = kernels.masked(c, a, b)
    np.testing.assert_array_equal(o, np.where(c, a, b))
    np.testing.assert_array_equal(p, c & (a > b))
    assert q[0] == np.count_nonzero(c & (a > b))
    assert "polyc_bool_at(&C[" in kernels.masked.c_source({"N": 1000})
