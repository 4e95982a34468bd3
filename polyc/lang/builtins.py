"""The builtin functions of TC expressions: arity, result type rule, numpy meaning, C spelling.

One table serves the parser (which names are calls), the checker (arity and types), the
reference interpreter (numpy) and code generation (C), so a builtin is added in one place.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special

from polyc.types import TC_TYPES


def _rsqrt(x):
    return np.reciprocal(np.sqrt(x))


def _round_half_away(x):
    """C's round(): halves away from zero.  ``x - trunc(x)`` is exact, so no rounding creeps in."""
    whole = np.trunc(x)
    return np.where(np.abs(x - whole) >= 0.5, whole + np.sign(x), whole)


def _fma(a, b, c):
    """a * b + c rounded once, as C's fma: exact in float64 for float32/float16 operands (the
    product of two 24-bit significands fits in 53 bits); float64 goes through long double, whose
    64-bit significand makes it nearly, not always, exact."""
    dtype = np.result_type(a, b, c)
    wide = np.float64 if dtype.itemsize <= 4 else np.longdouble
    return (np.asarray(a, wide) * np.asarray(b, wide) + np.asarray(c, wide)).astype(dtype)


def _fdim(a, b):
    """C's fdim: a - b where a > b, else +0; NaN when either is NaN (fdim(inf, inf) is 0)."""
    a, b = np.asarray(a), np.asarray(b)
    with np.errstate(invalid="ignore", over="ignore"):
        difference = np.where(a > b, a - b, np.zeros((), np.result_type(a, b)))
    return np.where(np.isnan(a) | np.isnan(b), np.nan, difference).astype(np.result_type(a, b))


def _remainder_scalar(a: float, b: float) -> float:
    try:
        return math.remainder(a, b)
    except ValueError:  # remainder(inf, y) and remainder(x, 0): NaN in C
        return math.nan


_remainder_elementwise = np.frompyfunc(_remainder_scalar, 2, 1)


def _remainder(a, b):
    """C's remainder (IEEE 754: the quotient rounded to nearest, ties to even), which numpy
    lacks (``numpy.remainder`` is Python's modulo).  Exact in float64 for every float type."""
    dtype = np.result_type(a, b)
    return np.asarray(_remainder_elementwise(np.asarray(a, np.float64), np.asarray(b, np.float64)), np.float64).astype(
        dtype
    )


def _logb(x):
    """C's logb: the exponent of |x| as a float (subnormals included); -inf at 0, inf at inf."""
    x = np.asarray(x)
    exponent = (np.frexp(x)[1] - 1).astype(x.dtype)
    with np.errstate(divide="ignore"):
        special = np.where(x == 0, -np.inf, np.abs(x))  # inf -> inf, NaN -> NaN
    return np.where((x == 0) | ~np.isfinite(x), special, exponent).astype(x.dtype)


def _exp10(x):
    """10^x, in float64 for narrower types (one rounding, as glibc's exp10f)."""
    x = np.asarray(x)
    wide = np.float64 if x.dtype.itemsize <= 4 else np.longdouble
    with np.errstate(over="ignore"):
        return np.power(wide(10), x.astype(wide)).astype(x.dtype)


def _shift_counts(a, n):
    """``a`` and ``n`` as arrays, and where ``n`` is a shift count within ``a``'s width."""
    a, n = np.asarray(a), np.asarray(n)
    return a, n, (n >= 0) & (n < 8 * a.dtype.itemsize)


def _shift_left(a, n):
    """``a << n`` wrapping in ``a``'s type; 0 for counts outside 0 .. width - 1 (undefined in C)."""
    a, n, inside = _shift_counts(a, n)
    wide = np.left_shift(a.astype(np.uint64), np.where(inside, n, 0).astype(np.uint64))
    return np.where(inside, wide.astype(a.dtype), np.zeros((), a.dtype))


def _shift_right(a, n):
    """``a >> n`` (arithmetic for signed types); beyond the width, what every bit shifted out
    leaves: 0, or -1 for a negative ``a``."""
    a, n, inside = _shift_counts(a, n)
    shifted = np.right_shift(a, np.where(inside, n, 0).astype(a.dtype))
    beyond = np.where(a < 0, a.dtype.type(-1) if a.dtype.kind == "i" else 0, 0).astype(a.dtype)
    return np.where(inside, shifted, beyond)


@dataclass(frozen=True)
class Builtin:
    """``float_only``: integer arguments are converted to float32 first (C's math.h functions);
    otherwise the builtin works in the promoted type of its arguments (min, max, abs).
    ``integer_only``: the arguments must be integers (bool counts as int32): the bit operations."""

    name: str
    arity: int
    numpy: Callable
    c_name: str
    float_only: bool = True
    integer_only: bool = False


def _table(*entries: Builtin) -> dict[str, Builtin]:
    return {b.name: b for b in entries}


BUILTINS: dict[str, Builtin] = _table(
    Builtin("exp", 1, np.exp, "exp"),
    Builtin("exp2", 1, np.exp2, "exp2"),
    Builtin("exp10", 1, _exp10, "exp10"),
    Builtin("expm1", 1, np.expm1, "expm1"),
    Builtin("log", 1, np.log, "log"),
    Builtin("log2", 1, np.log2, "log2"),
    Builtin("log10", 1, np.log10, "log10"),
    Builtin("log1p", 1, np.log1p, "log1p"),
    Builtin("logb", 1, _logb, "logb"),
    Builtin("sqrt", 1, np.sqrt, "sqrt"),
    Builtin("rsqrt", 1, _rsqrt, "rsqrt"),
    Builtin("cbrt", 1, np.cbrt, "cbrt"),
    Builtin("sin", 1, np.sin, "sin"),
    Builtin("cos", 1, np.cos, "cos"),
    Builtin("tan", 1, np.tan, "tan"),
    Builtin("asin", 1, np.arcsin, "asin"),
    Builtin("acos", 1, np.arccos, "acos"),
    Builtin("atan", 1, np.arctan, "atan"),
    Builtin("sinh", 1, np.sinh, "sinh"),
    Builtin("cosh", 1, np.cosh, "cosh"),
    Builtin("tanh", 1, np.tanh, "tanh"),
    Builtin("asinh", 1, np.arcsinh, "asinh"),
    Builtin("acosh", 1, np.arccosh, "acosh"),
    Builtin("atanh", 1, np.arctanh, "atanh"),
    Builtin("erf", 1, special.erf, "erf"),
    Builtin("erfc", 1, special.erfc, "erfc"),
    Builtin("tgamma", 1, special.gamma, "tgamma"),
    Builtin("lgamma", 1, special.gammaln, "lgamma"),
    Builtin("fabs", 1, np.fabs, "fabs"),
    Builtin("floor", 1, np.floor, "floor"),
    Builtin("ceil", 1, np.ceil, "ceil"),
    Builtin("round", 1, _round_half_away, "round"),
    Builtin("rint", 1, np.rint, "rint"),  # halves to even (C's default rounding mode)
    Builtin("trunc", 1, np.trunc, "trunc"),
    Builtin("pow", 2, np.power, "pow"),
    Builtin("atan2", 2, np.arctan2, "atan2"),
    Builtin("fmod", 2, np.fmod, "fmod"),
    Builtin("remainder", 2, _remainder, "remainder"),
    Builtin("fdim", 2, _fdim, "fdim"),
    Builtin("nextafter", 2, np.nextafter, "nextafter"),
    Builtin("hypot", 2, np.hypot, "hypot"),
    Builtin("copysign", 2, np.copysign, "copysign"),
    Builtin("fmax", 2, np.fmax, "fmax"),
    Builtin("fmin", 2, np.fmin, "fmin"),
    Builtin("fma", 3, _fma, "fma"),
    # Generic over all types; NaN-ignoring for floats like fmax/fmin.
    Builtin("min", 2, np.fmin, "min", float_only=False),
    Builtin("max", 2, np.fmax, "max", float_only=False),
    Builtin("abs", 1, np.abs, "abs", float_only=False),
    # Bit operations on integers (C's & | ^ ~ << >>, with shifts defined for every count).
    Builtin("bitand", 2, np.bitwise_and, "bitand", float_only=False, integer_only=True),
    Builtin("bitor", 2, np.bitwise_or, "bitor", float_only=False, integer_only=True),
    Builtin("bitxor", 2, np.bitwise_xor, "bitxor", float_only=False, integer_only=True),
    Builtin("bitnot", 1, np.invert, "bitnot", float_only=False, integer_only=True),
    Builtin("shl", 2, _shift_left, "shl", float_only=False, integer_only=True),
    Builtin("shr", 2, _shift_right, "shr", float_only=False, integer_only=True),
)


def is_callable_name(name: str) -> bool:
    """True for names that are calls rather than tensor accesses: builtins and type casts."""
    return name in BUILTINS or name in TC_TYPES
