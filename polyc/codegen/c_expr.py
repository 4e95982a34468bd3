"""C text for typed expressions, and the prelude every generated translation unit starts with.

The reference interpreter (:mod:`polyc.interpreter`) defines what an expression means; the C
printed here computes exactly that, bit for bit, whatever the C compiler's usual arithmetic
conversions would do on their own:

* Integer ``+ - *`` and negation wrap around in the node's type.  They are computed in the
  unsigned type of the same width (or ``uint32_t`` for narrower types) and converted back, so
  signed overflow is never undefined and ``int8 + int8`` does not silently become ``int``.
* Integer ``/`` and ``%`` truncate toward zero; ``x / 0`` and ``x % 0`` give 0 and
  ``INT_MIN / -1`` wraps (helpers ``polyc_div_<type>``, ``polyc_mod_<type>``).
* float32 uses the ``f`` variants of <math.h>, float64 the plain ones, except for exp, log,
  tanh and a few more, which are polyc's own vectorisable versions (:mod:`polyc.codegen.vector_math`,
  within a few ulp like libm's, with the same special values); float16 values are
  ``_Float16`` but every operation is done in ``float`` and rounded back to ``_Float16``, which
  is what numpy does and is exact for ``+ - * /``, sqrt and the rounding functions.
* float to integer conversion truncates; NaN, infinities and values whose truncation is out of
  the target's range give 0 (helpers ``polyc_float_to_<type>``, ``polyc_floatf_to_<type>``).
* ``min``/``max`` on floats ignore NaN (like ``fminf``/``fmaxf``), comparisons give ``_Bool`` values.

Every printed expression is a primary expression (a name, literal, call or subscript) or is
fully parenthesised, so it can be pasted anywhere without precedence surprises.  Values of
``bool`` and of integer types narrower than ``int`` may have C type ``int`` (always holding an
in-range value): C promotes them to ``int`` in every operation anyway.

    >>> from polyc.lang.checked import Binary, Read
    >>> from polyc.types import INT32
    >>> x = Read(INT32, "X", (Affine.var("i"),))
    >>> printer = CExpressionPrinter(access=lambda read, subscripts: f"{read.tensor}[{subscripts[0]}]")
    >>> printer.to_c(Binary(INT32, "/", x, x))
    'polyc_div_int32((X[i]), (X[i]))'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from polyc.codegen.vector_math import VECTOR_MATH_C, VECTOR_MATH_FUNCTIONS
from polyc.lang.builtins import BUILTINS
from polyc.lang.checked import Binary, Call, Cast, Const, IndexValue, Read, Select, SizeValue, TExpr, Unary
from polyc.lang.symbolic import Affine
from polyc.types import C_TYPES

FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
FLOAT64 = np.dtype(np.float64)

# ----------------------------------------------------------------------------- the prelude
PRELUDE = (
    r"""/* ---- polyc prelude: helpers of generated code (polyc/codegen/c_expr.py) ---- */
#include <stdint.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <stdlib.h>

/* Affine index arithmetic (symbolic.Affine.to_c): floor division by b > 0, min and max. */
static inline int64_t polyc_floord(int64_t a, int64_t b) { return a / b - (a % b < 0); }
static inline int64_t polyc_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t polyc_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Bit operations: & | ^ ~, and << wrapping in T (through uint64_t, so no signed overflow),
   0 for shift counts outside 0 .. width - 1, which C leaves undefined. */
#define POLYC_BIT_HELPERS(T, NAME)                                                               \
    static inline T polyc_bitand_##NAME(T a, T b) { return (T)(a & b); }                       \
    static inline T polyc_bitor_##NAME(T a, T b) { return (T)(a | b); }                        \
    static inline T polyc_bitxor_##NAME(T a, T b) { return (T)(a ^ b); }                       \
    static inline T polyc_bitnot_##NAME(T a) { return (T)~a; }                                 \
    static inline T polyc_shl_##NAME(T a, T n)                                                 \
    { return (uint64_t)n < 8 * sizeof(T) ? (T)((uint64_t)a << n) : (T)0; }

/* Per integer type: / and % truncating toward zero with x / 0 == x % 0 == 0 and INT_MIN / -1
   wrapping; min, max; abs wrapping at INT_MIN; >> (arithmetic for signed types; beyond the
   width, what shifting every bit out leaves); the bit operations. */
#define POLYC_SIGNED_HELPERS(T, NAME)                                                            \
    static inline T polyc_div_##NAME(T a, T b)                                                 \
    { return b == 0 ? (T)0 : b == -1 ? (T)(0 - (uint64_t)a) : (T)(a / b); }                    \
    static inline T polyc_mod_##NAME(T a, T b) { return (b == 0 || b == -1) ? (T)0 : (T)(a % b); } \
    static inline T polyc_min_##NAME(T a, T b) { return a < b ? a : b; }                       \
    static inline T polyc_max_##NAME(T a, T b) { return a > b ? a : b; }                       \
    static inline T polyc_abs_##NAME(T a) { return a < 0 ? (T)(0 - (uint64_t)a) : a; }         \
    static inline T polyc_shr_##NAME(T a, T n)                                                 \
    { return (uint64_t)n < 8 * sizeof(T) ? (T)(a >> n) : (T)(a < 0 ? -1 : 0); }                \
    POLYC_BIT_HELPERS(T, NAME)
#define POLYC_UNSIGNED_HELPERS(T, NAME)                                                          \
    static inline T polyc_div_##NAME(T a, T b) { return b == 0 ? (T)0 : (T)(a / b); }          \
    static inline T polyc_mod_##NAME(T a, T b) { return b == 0 ? (T)0 : (T)(a % b); }          \
    static inline T polyc_min_##NAME(T a, T b) { return a < b ? a : b; }                       \
    static inline T polyc_max_##NAME(T a, T b) { return a > b ? a : b; }                       \
    static inline T polyc_shr_##NAME(T a, T n) { return (uint64_t)n < 8 * sizeof(T) ? (T)(a >> n) : (T)0; } \
    POLYC_BIT_HELPERS(T, NAME)
POLYC_SIGNED_HELPERS(int8_t, int8)
POLYC_SIGNED_HELPERS(int16_t, int16)
POLYC_SIGNED_HELPERS(int32_t, int32)
POLYC_SIGNED_HELPERS(int64_t, int64)
POLYC_UNSIGNED_HELPERS(uint8_t, uint8)
POLYC_UNSIGNED_HELPERS(uint16_t, uint16)
POLYC_UNSIGNED_HELPERS(uint32_t, uint32)
POLYC_UNSIGNED_HELPERS(uint64_t, uint64)
#undef POLYC_SIGNED_HELPERS
#undef POLYC_UNSIGNED_HELPERS
#undef POLYC_BIT_HELPERS

/* rsqrt(x) = 1 / sqrt(x), each step rounded, as the interpreter computes it (not an estimate). */
static inline float polyc_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double polyc_rsqrt(double x) { return 1.0 / sqrt(x); }

"""
    + VECTOR_MATH_C
    + r"""
/* float -> integer conversion: truncates; NaN, infinities and values whose truncation is out
   of T's range (LOWER <= trunc(x) < UPPER is in range) give 0.  No branch, so that gcc
   vectorises a conversion whose result has two uses (a requantized tensor stored and read
   back; tests/test_vector_math.py): the range test picks by a bit mask, and float32 values
   of types within int32's range are converted in float lanes to int32 first (AVX2 has no
   float -> int64 conversion), then tested as integers. */
#define POLYC_FLOAT_TO_HELPERS(T, NAME, LOWER, UPPER)                                            \
    static inline T polyc_float_to_##NAME(double x)                                            \
    { double t = trunc(x); return (T)polyc_select_f64((t >= (LOWER)) & (t < (UPPER)), t, 0.0); }
static inline int32_t polyc_floatf_to_int32(float x)
{
    float t = truncf(x);
    return (int32_t)polyc_select_f32((t >= -0x1p31f) & (t < 0x1p31f), t, 0.0f);
}
#define POLYC_FLOATF_TO_NARROW_HELPER(T, NAME, LOWER, UPPER)                                     \
    static inline T polyc_floatf_to_##NAME(float x)                                            \
    { int32_t w = polyc_floatf_to_int32(x); return (T)((w >= (LOWER)) & (w < (UPPER)) ? w : 0); }
#define POLYC_FLOATF_TO_WIDE_HELPER(T, NAME)                                                     \
    static inline T polyc_floatf_to_##NAME(float x) { return polyc_float_to_##NAME(x); }
POLYC_FLOAT_TO_HELPERS(int8_t, int8, -0x1p7, 0x1p7)
POLYC_FLOAT_TO_HELPERS(int16_t, int16, -0x1p15, 0x1p15)
POLYC_FLOAT_TO_HELPERS(int32_t, int32, -0x1p31, 0x1p31)
POLYC_FLOAT_TO_HELPERS(int64_t, int64, -0x1p63, 0x1p63)
POLYC_FLOAT_TO_HELPERS(uint8_t, uint8, 0.0, 0x1p8)
POLYC_FLOAT_TO_HELPERS(uint16_t, uint16, 0.0, 0x1p16)
POLYC_FLOAT_TO_HELPERS(uint32_t, uint32, 0.0, 0x1p32)
POLYC_FLOAT_TO_HELPERS(uint64_t, uint64, 0.0, 0x1p64)
POLYC_FLOATF_TO_NARROW_HELPER(int8_t, int8, -128, 128)
POLYC_FLOATF_TO_NARROW_HELPER(int16_t, int16, -32768, 32768)
POLYC_FLOATF_TO_NARROW_HELPER(uint8_t, uint8, 0, 256)
POLYC_FLOATF_TO_NARROW_HELPER(uint16_t, uint16, 0, 65536)
POLYC_FLOATF_TO_WIDE_HELPER(int64_t, int64)
POLYC_FLOATF_TO_WIDE_HELPER(uint32_t, uint32)
POLYC_FLOATF_TO_WIDE_HELPER(uint64_t, uint64)
#undef POLYC_FLOAT_TO_HELPERS
#undef POLYC_FLOATF_TO_NARROW_HELPER
#undef POLYC_FLOATF_TO_WIDE_HELPER
/* round() is C's: half away from zero.  bool is _Bool.  float16 is _Float16 (gcc >= 12 on
   x86-64, or AArch64); generated code computes float16 operations in float and rounds back with
   POLYC_F16 (from float) or POLYC_F16_DOUBLE (from double), which the GPU dialects define in
   their own ways, as polyc_round_float16. */
#ifndef POLYC_F16
#define POLYC_F16(x) ((_Float16)(x))
#define POLYC_F16_DOUBLE(x) ((_Float16)(x))
/* (float)(_Float16)x for a float x, in float arithmetic that gcc vectorises (a conversion to
   _Float16 is a call per element where F16C is off): c has the exponent of |x| (at least
   float16's smallest normal one, 2^-14) plus 13, so float16's spacing at |x| is c's ulp and
   (|x| + c) - c rounds |x| to it, ties to even; from 65520 on (where float16 rounds to
   infinity) the result is infinity, decided from x beside the addition so that the chain of
   dependent steps stays short; NaN stays NaN; x's sign is put back, a zero's too.  Checked on
   every float, in AVX-512, AVX2 and portable builds. */
static inline float polyc_round_float16(float x)
{
    uint32_t bits, sign, scale, overflow;
    float magnitude, c, y;
    memcpy(&bits, &x, sizeof bits);
    sign = bits & 0x80000000u;
    scale = bits & 0x7f800000u;
    scale = (scale < 0x38800000u ? 0x38800000u : scale) + (13u << 23);
    bits ^= sign;
    memcpy(&magnitude, &bits, sizeof bits);
    overflow = 0u - (uint32_t)(magnitude >= 65520.0f);
    memcpy(&c, &scale, sizeof c);
    y = (magnitude + c) - c;
    memcpy(&bits, &y, sizeof bits);
    bits = (bits & ~overflow) | (0x7f800000u & overflow) | sign;
    memcpy(&y, &bits, sizeof y);
    return y;
}
#endif
/* Float sums start from -0, the identity of IEEE addition (x + -0 is x for every x, +0 too):
   OpenMP's + reduction starts each thread's and each vector lane's partial sum from +0, which
   turns a sum of -0 terms into +0.  Generated code names these (c.py's reduction_identifier);
   without OpenMP its pragmas are ignored, these too. */
#if defined(_OPENMP)
#pragma omp declare reduction(polyc_sum_float32 : float : omp_out += omp_in) initializer(omp_priv = -0.0f)
#pragma omp declare reduction(polyc_sum_float64 : double : omp_out += omp_in) initializer(omp_priv = -0.0)
#pragma omp declare reduction(polyc_sum_float16 : _Float16 : omp_out = POLYC_F16((float)omp_out + (float)omp_in)) initializer(omp_priv = POLYC_F16(-0.0f))
#endif
/* ---- end of polyc prelude ---- */
"""
)


def c_type(dtype: np.dtype) -> str:
    """The C spelling of an element type: ``int8_t``, ``float``, ``_Bool``, ``_Float16``..."""
    return C_TYPES[np.dtype(dtype)]


# ----------------------------------------------------------------------------- the printer
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")

#: Builtins whose C spelling is not ``c_name`` (+ ``f`` for float32): float32 name, float64 name.
_FLOAT_SPELLINGS: dict[str, tuple[str, str]] = {
    "rsqrt": ("polyc_rsqrtf", "polyc_rsqrt"),
    "abs": ("fabsf", "fabs"),
    **{
        name: (float_name, double_name or BUILTINS[name].c_name)
        for name, (float_name, double_name) in VECTOR_MATH_FUNCTIONS.items()
    },
}


def _is_narrow(dtype: np.dtype) -> bool:
    """bool and integers narrower than ``int``, which C promotes to ``int`` in arithmetic."""
    return dtype.kind == "b" or (dtype.kind in "iu" and dtype.itemsize < 4)


def _unsigned_work_type(dtype: np.dtype) -> str:
    """The unsigned C type in which integer ``+ - *`` of ``dtype`` wrap without undefined behaviour."""
    return "uint64_t" if dtype.itemsize == 8 else "uint32_t"


def _float_repr(value: float) -> str:
    """Shortest decimal text of a finite double that reads back exactly, always with a '.' or 'e'."""
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def _paren_if_negative(text: str) -> str:
    return f"({text})" if text.startswith("-") else text


def _wrap(text: str) -> str:
    """``text`` as a primary expression: identifiers and plain numbers stay, the rest is parenthesised."""
    if _IDENTIFIER.fullmatch(text) or re.fullmatch(r"[0-9]+", text):
        return text
    return f"({text})"


def _affine_to_c(affine: Affine) -> str:
    return affine.to_c()


def _name_to_c(name: str) -> str:
    return name


@dataclass(frozen=True)
class CExpressionPrinter:
    """Prints typed expressions as C, asking the caller how to spell names and tensor elements.

    ``access(read, subscripts)``
        C lvalue text of the element ``read`` refers to; ``subscripts`` holds one C int64
        expression per dimension, each a primary expression (affine subscripts via
        ``Affine.to_c(index)``, data-dependent ones printed by this printer).  Linearising and
        bounds checks are the caller's.
    ``index(name)``
        C text (int64_t) of an iteration index's current value.  It is also the ``name_of`` of
        affine subscripts, so it receives size names there too: return those unchanged (or as
        the caller spells sizes).
    ``size(affine)``
        C text (int64_t) of a size expression (:class:`SizeValue`); default ``affine.to_c()``.
    ``known_condition(select)``
        The value of a select's condition where the caller knows it (a loop written in one
        version per value of a condition it leaves fixed), else None; then only the chosen
        branch is printed.
    """

    access: Callable[[Read, list[str]], str]
    index: Callable[[str], str] = _name_to_c
    size: Callable[[Affine], str] = _affine_to_c
    known_condition: Callable[[Select], bool | None] | None = None

    def to_c(self, expr: TExpr) -> str:
        """C text computing ``expr`` with exactly the interpreter's semantics in ``expr.dtype``."""
        method = getattr(self, "_print_" + type(expr).__name__)
        return method(expr)

    # ------------------------------------------------------------------ leaves
    def _print_Const(self, expr: Const) -> str:
        return c_constant(expr.value, expr.dtype)

    def _print_IndexValue(self, expr: IndexValue) -> str:
        return _wrap(self.index(expr.name))

    def _print_SizeValue(self, expr: SizeValue) -> str:
        return _wrap(self.size(expr.value))

    def _print_Read(self, expr: Read) -> str:
        subscripts = [
            _wrap(s.to_c(self._affine_name)) if isinstance(s, Affine) else self.to_c(s) for s in expr.subscripts
        ]
        return f"({self.access(expr, subscripts)})"

    def _affine_name(self, name: str) -> str:
        return _wrap(self.index(name))

    # ------------------------------------------------------------------ operators
    def _print_Unary(self, expr: Unary) -> str:
        operand = self.to_c(expr.operand)
        if expr.op == "not":
            return f"(!{operand})"
        dtype = expr.dtype
        if dtype.kind == "f":
            return f"(-{operand})"  # exact in every float type, _Float16 included
        if dtype.kind == "u" and not _is_narrow(dtype):
            return f"(-{operand})"  # unsigned int and wider wrap by themselves
        return f"(({c_type(dtype)})-({_unsigned_work_type(dtype)}){operand})"

    def _print_Binary(self, expr: Binary) -> str:
        op, dtype = expr.op, expr.dtype
        logistic = logistic_operand(expr) if dtype == FLOAT32 else None
        if logistic is not None:
            return f"polyc_sigmoidf({self.to_c(logistic)})"
        lhs, rhs = self.to_c(expr.lhs), self.to_c(expr.rhs)
        if op in ("&&", "||") and speculatable(expr):
            return f"({lhs} {'&' if op == '&&' else '|'} {rhs})"
        if op in ("&&", "||") or op in _COMPARISONS:
            return f"({lhs} {op} {rhs})"
        if dtype.kind == "f":
            return _float_arithmetic(op, dtype, lhs, rhs)
        if op in ("/", "%"):
            helper = "div" if op == "/" else "mod"
            return f"polyc_{helper}_{dtype.name}({lhs}, {rhs})"
        if dtype.kind == "u" and not _is_narrow(dtype):
            return f"({lhs} {op} {rhs})"
        work = _unsigned_work_type(dtype)
        return f"(({c_type(dtype)})(({work}){lhs} {op} ({work}){rhs}))"

    def _print_Select(self, expr: Select) -> str:
        known = self.known_condition(expr) if self.known_condition is not None else None
        if known is not None:
            return self.to_c(expr.then if known else expr.otherwise)
        # C evaluates only the chosen branch, so a guarded access is never made out of bounds.
        return f"({self.to_c(expr.cond)} ? {self.to_c(expr.then)} : {self.to_c(expr.otherwise)})"

    def _print_Cast(self, expr: Cast) -> str:
        operand = self.to_c(expr.operand)
        source, target = expr.operand.dtype, expr.dtype
        if source == target:
            return operand
        if target.kind == "b":
            return f"({operand} != 0)"  # NaN is true, as in numpy
        if target.kind in "iu" and source.kind == "f":
            helper = "float_to" if source == FLOAT64 else "floatf_to"
            return f"polyc_{helper}_{target.name}({operand})"
        if target == FLOAT16:
            return to_float16(operand, source)
        inner = expr.operand
        if target == FLOAT32 and source == FLOAT16 and isinstance(inner, Cast) and inner.operand.dtype == FLOAT32:
            return f"polyc_round_float16({self.to_c(inner.operand)})"  # a float16 store and load, in float
        return f"(({c_type(target)}){operand})"

    def _print_Call(self, expr: Call) -> str:
        dtype = expr.dtype
        args = [self.to_c(a) for a in expr.args]
        if dtype.kind == "f":
            return _float_call(expr.func, dtype, args)
        # Integer min, max, abs and the bit operations (the builtins that are not float_only).
        if expr.func == "abs" and dtype.kind == "u":
            return args[0]
        return f"polyc_{expr.func}_{dtype.name}({', '.join(args)})"


def speculatable(expr: Binary) -> bool:
    """Whether ``a && b`` (or ``a || b``) may evaluate both operands, as the branch-free ``a & b``:
    C's short-circuit makes a branch per element, which gcc does not vectorize (a rank that
    counts ``(s_j > s_i || (s_j == s_i && j < i)) && keep_j`` over 16384 elements took an order
    of magnitude longer with ``&&`` than with ``&``).  Every operation polyc prints is total
    (integer division by zero gives 0, floats do not trap), so only reads can make eager
    evaluation unsafe:
    - a read whose bounds proof used the left operand as a guard: the proof
      (:func:`polyc.ir.model.affine_condition`) takes a guard only from an affine left operand,
      so ``&&`` stays when the left operand is affine;
    - a data-dependent subscript, checked at run time, which would report an error for an
      element the left operand excluded."""
    from polyc.ir.model import affine_condition

    return affine_condition(expr.lhs) is None and not _has_data_dependent_read(expr.rhs)


def _has_data_dependent_read(expr: TExpr) -> bool:
    if isinstance(expr, Read):
        return any(not isinstance(s, Affine) for s in expr.subscripts)
    if isinstance(expr, Unary) or isinstance(expr, Cast):
        return _has_data_dependent_read(expr.operand)
    if isinstance(expr, Binary):
        return _has_data_dependent_read(expr.lhs) or _has_data_dependent_read(expr.rhs)
    if isinstance(expr, Select):
        return any(_has_data_dependent_read(e) for e in (expr.cond, expr.then, expr.otherwise))
    if isinstance(expr, Call):
        return any(_has_data_dependent_read(a) for a in expr.args)
    return False


def logistic_operand(expr: Binary) -> TExpr | None:
    """``x`` when ``expr`` is ``1 / (1 + exp(-x))`` (ONNX's Sigmoid, and SiLU's second factor),
    the sum in either order, else None: such a quotient is printed as ``polyc_sigmoidf(x)``
    (:mod:`polyc.codegen.vector_math`)."""

    def is_one(e: TExpr) -> bool:
        return isinstance(e, Const) and e.value == 1

    if expr.op != "/" or not is_one(expr.lhs) or not isinstance(expr.rhs, Binary) or expr.rhs.op != "+":
        return None
    terms = (expr.rhs.lhs, expr.rhs.rhs)
    for one, power in (terms, terms[::-1]):
        if (
            is_one(one)
            and isinstance(power, Call)
            and power.func == "exp"
            and isinstance(power.args[0], Unary)
            and power.args[0].op == "neg"
        ):
            return power.args[0].operand
    return None


def to_float16(text: str, source: np.dtype = FLOAT32) -> str:
    """C text of ``text`` (a float, or a ``source`` value) rounded to float16: one rounding, by
    the prelude's POLYC_F16 macros (a cast in C; the GPU dialects round their own way)."""
    if np.dtype(source) == FLOAT64:
        return f"POLYC_F16_DOUBLE({text})"
    return f"POLYC_F16({text})" if np.dtype(source) == FLOAT32 else f"POLYC_F16((float)({text}))"


def _float_arithmetic(op: str, dtype: np.dtype, lhs: str, rhs: str) -> str:
    if dtype == FLOAT16:
        if op == "%":
            return to_float16(f"fmodf((float){lhs}, (float){rhs})")
        return to_float16(f"(float){lhs} {op} (float){rhs}")
    if op == "%":
        return f"{'fmodf' if dtype == FLOAT32 else 'fmod'}({lhs}, {rhs})"
    return f"({lhs} {op} {rhs})"


def _float_call(func: str, dtype: np.dtype, args: list[str]) -> str:
    """A builtin on float arguments: the float32 or float64 function, float16 through float."""
    float_name, double_name = _FLOAT_SPELLINGS.get(func, (BUILTINS[func].c_name + "f", BUILTINS[func].c_name))
    if dtype == FLOAT64:
        return f"{double_name}({', '.join(args)})"
    if dtype == FLOAT32:
        return f"{float_name}({', '.join(args)})"
    widened = ", ".join(f"(float){a}" for a in args)
    if func == "rsqrt":  # the interpreter rounds the square root to float16 before the reciprocal
        return to_float16(f"1.0f / (float){to_float16(f'sqrtf({widened})')}")
    return to_float16(f"{float_name}({widened})")


def c_constant(value: int | float | bool, dtype: np.dtype) -> str:
    """A C literal equal to ``value`` converted to ``dtype`` as the interpreter converts it.

    Floats are rounded to ``dtype`` first and printed so that they read back exactly.

    >>> c_constant(0.1, np.dtype(np.float32)), c_constant(-2**63, np.dtype(np.int64))
    ('0.1f', 'INT64_MIN')
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return "1" if value else "0"
    if dtype.kind in "iu":
        return _integer_constant(int(value), dtype)
    with np.errstate(over="ignore"):
        rounded = dtype.type(value)
    if math.isnan(rounded):
        text = "NAN"  # a float expression, like INFINITY
    elif math.isinf(rounded):
        text = "INFINITY" if rounded > 0 else "-INFINITY"
    elif dtype == FLOAT32:
        text = str(rounded)  # numpy prints the shortest decimal that reads back as this float32
        text = (text if ("." in text or "e" in text) else text + ".0") + "f"
    else:
        text = _float_repr(float(rounded))  # exact: every float16 value is a double
    if dtype == FLOAT32 or (dtype == FLOAT64 and math.isfinite(rounded)):
        return _paren_if_negative(text)
    return f"(({c_type(dtype)}){text})"


def _integer_constant(value: int, dtype: np.dtype) -> str:
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"constant {value} is out of the range of {dtype.name}")
    if dtype.kind == "i" and dtype.itemsize >= 4 and value == info.min:
        return f"INT{info.bits}_MIN"  # the literal 2147483648 would not be an int
    if dtype.itemsize == 8:
        macro = "INT64_C" if dtype.kind == "i" else "UINT64_C"
        return f"(-{macro}({-value}))" if value < 0 else f"{macro}({value})"
    suffix = "u" if dtype.kind == "u" and dtype.itemsize == 4 else ""
    return _paren_if_negative(f"{value}{suffix}")
