"""Differential fuzzing: random TC defs, compiled to C, against an independent numpy oracle.

Each hypothesis example is one random *problem* (a def described as plain data: inputs,
statements, expression trees) with random compilation options.  The def is printed as TC,
compiled with ``-O1``, mostly once and parametrically (``specialize=False``), and run at
``SIZE_SETS`` random size sets, each a *case*; a few defs are specialised and run at
``SPECIALIZED_SIZE_SETS``.  The oracle never looks at polyc: it evaluates the same problem with
numpy in float64 (int64 for integers), broadcasting every access over the statement's index
space, and carries beside each value a bound on how far correct compiled code may be from it:

- ``+ - *`` and ``/`` add one rounding, ``u * |value|`` (``u`` the unit roundoff of the element
  type), except where the exact result lies on a coarse binary grid that the type holds
  exactly (then no rounding happens in any order: inputs like k/4 make contractions exact);
- a sum over ``n`` terms adds ``n * eps * max(max|term|, max|sum|)``, TC's tolerance for a
  reduction in any order, unless exact as above; a product over ``n`` factors ``n * u * |value|``;
- ``exp`` and ``tanh`` add ``TRANSCENDENTAL_ULPS`` ulps for C's libm (and, for float64, the
  error of numpy's own);
- errors already present propagate to first order (``|a|e_b + |b|e_a`` for a product, ...);
  ``fmax``, ``fmin``, ``max=!``, ``min=!`` and selections are exact.
Integer problems are checked exactly.  Float64 problems double every rounding term, since the
float64 oracle itself rounds as often as the code under test.

Reproducing a failure: the message (and hypothesis' note) prints the TC source, options, sizes
and a ``check_case(...)`` line to paste into Python; ``POLYC_FUZZ_SEED=<seed>`` replays the run.
A bug found this way, once minimised, goes into ``REGRESSIONS`` at the end of the file.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, seed, settings
from hypothesis import strategies as st

import polyc
from polyc.runtime.gpu import opencl_missing

#: Hypothesis' seed for this run; printed with every failure, set it to replay a run.
FUZZ_SEED = int(os.environ.get("POLYC_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
#: Size sets each compiled def runs at; one case each.  Specialised kernels (compiled once per
#: size set, so slower to test) run at fewer.
SIZE_SETS = 10
SPECIALIZED_SIZE_SETS = 3
#: Largest size of a size name.
MAX_SIZE = 17
#: Most distinct indices in one statement (17 ** 5 points at most).
MAX_INDICES = 5
#: Defs per test; together with SIZE_SETS at least MIN_CASES cases.
EXAMPLES = {"contractions": 250, "reductions": 120, "elementwise": 200, "multi_statement": 450}
MIN_CASES = 2000
#: ulps by which C's libm may differ from the exact exp / tanh (glibc: 1 and 2).
TRANSCENDENTAL_ULPS = 2
#: ulps by which numpy's float64 exp / tanh may be off (its SIMD versions are not correctly
#: rounded); for float32 problems the float64 oracle's own error is negligible.
NUMPY_FLOAT64_ULPS = 4
#: Binary grid used to prove a result exact: multiples of 2 ** -GRID_BITS.
GRID_BITS = 8
#: First-order error propagation drops second-order terms; this covers them with room to spare.
SECOND_ORDER = 1.01

SIZE_NAMES = ("N", "M", "K", "L")
OUTPUT_INDICES = ("i", "j", "k", "l")
REDUCTION_INDICES = ("r_a", "r_b", "r_c")
INPUT_NAMES = ("A", "B", "C", "D", "E", "F", "G", "H")
TC_TYPE_NAMES = {"float32": "float", "float64": "double", "int32": "int32"}


# ----------------------------------------------------------------------------- problems as data
# Every record is a frozen dataclass of strings, numbers and tuples, so its repr is Python that
# rebuilds it (the reproduction line of a failure).


@dataclass(frozen=True)
class Access:
    """``tensor(indices...)``; a 0-d tensor is printed bare or with empty parentheses."""

    tensor: str
    indices: tuple[str, ...]
    parens: bool = True


@dataclass(frozen=True)
class IndexRef:
    """The value of an index (an int64 in TC, converted to the float type it meets)."""

    name: str


@dataclass(frozen=True)
class Const:
    value: int | float


@dataclass(frozen=True)
class Apply:
    """An operator or builtin: + - * / (binary), neg exp tanh (unary), fmax fmin max min."""

    op: str
    args: tuple


@dataclass(frozen=True)
class Select:
    """``(lhs CMP rhs) ? then : otherwise``; lhs and rhs are input accesses, index values or
    constants, so the comparison is exact in both the compiled code and the oracle."""

    comparison: str
    lhs: object
    rhs: object
    then: object
    otherwise: object


@dataclass(frozen=True)
class Statement:
    target: str
    indices: tuple[str, ...]
    op: str  # "=", "+=", "+=!", "*=!", "max=!", "min=!"
    rhs: object


@dataclass(frozen=True)
class Problem:
    """One def: inputs ``(name, dims)`` with dims size names or constants, statements in order,
    each index's size, and how input values are drawn (see ``VALUE_KINDS``)."""

    dtype: str
    inputs: tuple[tuple[str, tuple[str | int, ...]], ...]
    outputs: tuple[str, ...]
    statements: tuple[Statement, ...]
    index_sizes: tuple[tuple[str, str | int], ...]
    values: str
    name: str = "fuzz"

    def size_names(self) -> tuple[str, ...]:
        names = []
        for _, dims in self.inputs:
            names += [d for d in dims if isinstance(d, str) and d not in names]
        return tuple(names)

    def source(self) -> str:
        return tc_source(self)


# ----------------------------------------------------------------------------- TC text
def tc_source(problem: Problem) -> str:
    type_name = TC_TYPE_NAMES[problem.dtype]
    params = []
    for name, dims in problem.inputs:
        shape = f"({', '.join(str(d) for d in dims)})" if dims else ""
        params.append(f"{type_name}{shape} {name}")
    lines = [f"def {problem.name}({', '.join(params)}) -> ({', '.join(problem.outputs)}) {{"]
    for s in problem.statements:
        lhs = f"{s.target}({', '.join(s.indices)})"
        lines.append(f"    {lhs} {s.op} {tc_expr(s.rhs)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def tc_expr(expr) -> str:
    if isinstance(expr, Access):
        if not expr.indices and not expr.parens:
            return expr.tensor
        return f"{expr.tensor}({', '.join(expr.indices)})"
    if isinstance(expr, IndexRef):
        return expr.name
    if isinstance(expr, Const):
        text = repr(expr.value)
        return f"({text})" if expr.value < 0 else text
    if isinstance(expr, Select):
        return (
            f"(({tc_expr(expr.lhs)} {expr.comparison} {tc_expr(expr.rhs)}) ? "
            f"{tc_expr(expr.then)} : {tc_expr(expr.otherwise)})"
        )
    args = [tc_expr(a) for a in expr.args]
    if expr.op in ("+", "-", "*", "/"):
        return f"({args[0]} {expr.op} {args[1]})"
    if expr.op == "neg":
        return f"(-{args[0]})"
    return f"{expr.op}({', '.join(args)})"


def expr_accesses(expr):
    """Every access in an expression tree, in source order."""
    if isinstance(expr, Access):
        yield expr
    elif isinstance(expr, Select):
        for child in (expr.lhs, expr.rhs, expr.then, expr.otherwise):
            yield from expr_accesses(child)
    elif isinstance(expr, Apply):
        for child in expr.args:
            yield from expr_accesses(child)


# ----------------------------------------------------------------------------- input values
def _signed(rng, low, high, shape):
    return rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


#: How input values are drawn: float kinds give float64 values exactly representable in float32.
VALUE_KINDS = {
    "uniform": lambda rng, shape: rng.uniform(-1.0, 1.0, shape),
    "quarters": lambda rng, shape: rng.integers(-4, 5, shape) / 4.0,  # k/4: sums stay exact
    "away_from_zero": lambda rng, shape: _signed(rng, 0.25, 1.5, shape),  # safe denominators
    "quarters_away_from_zero": lambda rng, shape: rng.integers(1, 7, shape) / 4.0 * rng.choice([-1, 1], shape),
    "near_one": lambda rng, shape: _signed(rng, 0.8, 1.25, shape),  # products neither overflow nor vanish
    "small_int": lambda rng, shape: rng.integers(-3, 4, shape),
    "sign": lambda rng, shape: rng.choice([-1, 1], shape),
}


def make_inputs(problem: Problem, sizes: dict[str, int], value_seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(value_seed)
    arrays = {}
    for name, dims in problem.inputs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
        values = VALUE_KINDS[problem.values](rng, shape)
        arrays[name] = np.asarray(values).astype(problem.dtype)
    return arrays


# ----------------------------------------------------------------------------- the numpy oracle
@dataclass
class Bounded:
    """A value of the oracle (float64 or int64, broadcast over a statement's index space) and a
    bound on how far the compiled code's value may be from it (0.0 where it must be exact)."""

    value: np.ndarray
    error: np.ndarray | float = 0.0


@dataclass
class _Arithmetic:
    """Rounding model of one element type."""

    dtype: np.dtype
    is_int: bool = field(init=False)
    unit_roundoff: float = field(init=False)
    eps: float = field(init=False)
    libm_error: float = field(init=False)
    tiny: float = field(init=False)
    exact_limit: float = field(init=False)

    def __post_init__(self):
        self.is_int = self.dtype.kind == "i"
        if self.is_int:
            self.unit_roundoff = self.eps = self.libm_error = self.tiny = 0.0
            return
        info = np.finfo(self.dtype)
        # The float64 oracle rounds too when the type under test is float64: count both sides.
        both_sides = 2.0 if self.dtype == np.float64 else 1.0
        self.eps = float(info.eps) * both_sides
        self.unit_roundoff = self.eps / 2
        oracle_ulps = NUMPY_FLOAT64_ULPS if self.dtype == np.float64 else 0
        self.libm_error = (TRANSCENDENTAL_ULPS + oracle_ulps) * float(info.eps)  # relative
        self.tiny = float(info.tiny) * both_sides  # covers results in the subnormal range
        self.exact_limit = 2.0 ** (info.nmant + 1 - GRID_BITS)

    def on_grid(self, value: np.ndarray) -> np.ndarray:
        """Where ``value`` is a multiple of 2**-GRID_BITS small enough that the type holds every
        such multiple up to it exactly (so no operation producing it rounds)."""
        scaled = value * 2.0**GRID_BITS
        return (scaled == np.round(scaled)) & (np.abs(value) < self.exact_limit)

    def rounding(self, value: np.ndarray, exact_inputs: bool) -> np.ndarray | float:
        """Error of one correctly rounded operation with result ``value``."""
        if self.is_int:
            return 0.0
        bound = self.unit_roundoff * np.abs(value) + self.tiny
        if not exact_inputs:
            return bound
        on_grid = self.on_grid(value)
        return 0.0 if np.all(on_grid) else np.where(on_grid, 0.0, bound)


def _align(array: np.ndarray, indices: tuple[str, ...], space: tuple[str, ...]) -> np.ndarray:
    """``array`` indexed by ``indices`` (repeats take the diagonal), as an array broadcastable
    over ``space``."""
    unique = tuple(dict.fromkeys(indices))
    if len(unique) != len(indices):
        letters = {name: chr(ord("a") + n) for n, name in enumerate(unique)}
        array = np.einsum(f"{''.join(letters[i] for i in indices)}->{''.join(letters[i] for i in unique)}", array)
    order = sorted(range(len(unique)), key=lambda n: space.index(unique[n]))
    array = np.transpose(array, order)
    present = [unique[n] for n in order]
    shape = [array.shape[present.index(name)] if name in present else 1 for name in space]
    return array.reshape(shape)


def _error_is_zero(error) -> bool:
    return not np.any(error)


def _evaluate_expr(expr, space, env, extents, arithmetic: _Arithmetic) -> Bounded:
    if isinstance(expr, IndexRef):
        extent = extents[expr.name]
        return Bounded(
            _align(np.arange(extent, dtype=np.int64 if arithmetic.is_int else np.float64), (expr.name,), space)
        )
    if isinstance(expr, Const):
        return Bounded(np.asarray(expr.value, dtype=np.int64 if arithmetic.is_int else np.float64))
    if isinstance(expr, Access):
        tensor = env[expr.tensor]
        value = _align(tensor.value, expr.indices, space)
        error = tensor.error if np.isscalar(tensor.error) else _align(tensor.error, expr.indices, space)
        return Bounded(value, error)
    if isinstance(expr, Select):
        lhs = _evaluate_expr(expr.lhs, space, env, extents, arithmetic)
        rhs = _evaluate_expr(expr.rhs, space, env, extents, arithmetic)
        assert _error_is_zero(lhs.error) and _error_is_zero(rhs.error), "conditions must be exact"
        condition = {
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
            "==": np.equal,
            "!=": np.not_equal,
        }[expr.comparison](lhs.value, rhs.value)
        then = _evaluate_expr(expr.then, space, env, extents, arithmetic)
        otherwise = _evaluate_expr(expr.otherwise, space, env, extents, arithmetic)
        error = (
            0.0
            if _error_is_zero(then.error) and _error_is_zero(otherwise.error)
            else np.where(condition, then.error, otherwise.error)
        )
        return Bounded(np.where(condition, then.value, otherwise.value), error)

    args = [_evaluate_expr(a, space, env, extents, arithmetic) for a in expr.args]
    exact = all(_error_is_zero(a.error) for a in args)
    if expr.op == "neg":
        return Bounded(-args[0].value, args[0].error)
    if expr.op in ("fmax", "max"):  # |max(a', b') - max(a, b)| <= max(|a' - a|, |b' - b|)
        return Bounded(np.maximum(args[0].value, args[1].value), np.maximum(args[0].error, args[1].error))
    if expr.op in ("fmin", "min"):
        return Bounded(np.minimum(args[0].value, args[1].value), np.maximum(args[0].error, args[1].error))
    if expr.op in ("exp", "tanh"):
        (a,) = args
        value = np.exp(a.value) if expr.op == "exp" else np.tanh(a.value)
        # exp amplifies an absolute input error into a relative one; tanh is 1-Lipschitz.
        propagated = np.abs(value) * np.expm1(a.error) if expr.op == "exp" else a.error
        libm = arithmetic.libm_error * np.abs(value) + arithmetic.tiny
        return Bounded(value, propagated + libm)
    a, b = args
    if expr.op == "+":
        value, propagated = a.value + b.value, a.error + b.error
    elif expr.op == "-":
        value, propagated = a.value - b.value, a.error + b.error
    elif expr.op == "*":
        value = a.value * b.value
        propagated = np.abs(a.value) * b.error + np.abs(b.value) * a.error + a.error * b.error
    elif expr.op == "/":
        value = a.value / b.value
        margin = np.abs(b.value) - b.error
        assert np.all(margin > 0), "the generator must keep denominators away from zero"
        propagated = (a.error + np.abs(value) * b.error) / margin
        return Bounded(value, propagated + arithmetic.unit_roundoff * np.abs(value) + arithmetic.tiny)
    else:
        raise AssertionError(f"unknown operator {expr.op}")
    return Bounded(value, propagated + arithmetic.rounding(value, exact))


def _statement_space(statement: Statement) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The statement's left-hand indices and its reduction indices (first use order)."""
    indices = [i for access in expr_accesses(statement.rhs) for i in access.indices]
    reduction = dict.fromkeys(i for i in indices if i not in statement.indices)
    return tuple(statement.indices), tuple(reduction)


def _sum(value, error, axes, count: int, arithmetic: _Arithmetic, previous: Bounded | None) -> Bounded:
    """The sum of ``value`` over ``axes`` (and ``previous``, which ``+=`` accumulates into), in
    any order: TC's tolerance ``count * eps * max(max|term|, max|sum|)``, or exact on the grid."""
    total = value.sum(axis=axes)
    total_error = error if np.isscalar(error) else error.sum(axis=axes)
    if arithmetic.is_int:
        return Bounded(total + (0 if previous is None else previous.value), 0.0)
    magnitude = np.abs(value).sum(axis=axes)
    exact = np.all(arithmetic.on_grid(value), axis=axes) & _error_is_zero(error)
    scale = max(np.max(np.abs(value), initial=0.0), np.max(np.abs(total), initial=0.0))
    if previous is not None:
        total = previous.value + total
        total_error = previous.error + total_error
        magnitude = magnitude + np.abs(previous.value)
        exact = exact & arithmetic.on_grid(previous.value) & _error_is_zero(previous.error)
        scale = max(scale, np.max(np.abs(previous.value), initial=0.0), np.max(np.abs(total), initial=0.0))
        count += 1
    rounding = np.where(
        exact & (magnitude < arithmetic.exact_limit), 0.0, count * arithmetic.eps * scale + arithmetic.tiny
    )
    return Bounded(total, total_error + rounding)


def sum_bound(terms: np.ndarray, dtype) -> Bounded:
    """The sum of every element of ``terms`` (in float64) and the error the oracle allows a sum
    of them in ``dtype`` in any order (see :func:`_sum`): 0 when every term and partial sum lies
    on the exact grid, else TC's ``count * eps * max(max|term|, |sum|)``.  For other tests that
    check a reduction by the fuzzer's rule instead of deriving a second one."""
    value = np.asarray(terms, dtype=np.float64).ravel()
    return _sum(value, 0.0, (0,), value.size, _Arithmetic(np.dtype(dtype)), None)


def _evaluate_statement(statement: Statement, env, extents, arithmetic: _Arithmetic) -> Bounded:
    lhs, reduction = _statement_space(statement)
    space = lhs + reduction
    term = _evaluate_expr(statement.rhs, space, env, extents, arithmetic)
    shape = tuple(extents[i] for i in space)
    value = np.broadcast_to(term.value, shape)
    error = term.error if np.isscalar(term.error) else np.broadcast_to(term.error, shape)
    axes = tuple(range(len(lhs), len(space)))
    count = int(np.prod([extents[i] for i in reduction], dtype=np.int64))
    kind = statement.op.rstrip("!")

    if kind == "=" or (kind == "+=" and not reduction and statement.op != "+="):
        result = Bounded(value.copy(), error)
    elif kind == "+=":
        previous = env[statement.target] if statement.op == "+=" else None
        result = _sum(value, error, axes, count, arithmetic, previous)
    elif kind == "*=":
        product = value.prod(axis=axes)
        if arithmetic.is_int:
            result = Bounded(product, 0.0)
        else:
            relative = 0.0 if np.isscalar(error) else (error / np.abs(value)).sum(axis=axes)
            rounding = count * arithmetic.unit_roundoff * np.abs(product) + arithmetic.tiny
            result = Bounded(product, np.abs(product) * relative + rounding)
    elif kind in ("max=", "min="):
        reduce = np.max if kind == "max=" else np.min
        result = Bounded(reduce(value, axis=axes), error if np.isscalar(error) else np.max(error, axis=axes))
    else:
        raise AssertionError(f"unknown statement operator {statement.op}")

    if not np.isscalar(result.error):
        result.error = np.broadcast_to(result.error, result.value.shape)
    return result


def evaluate(problem: Problem, arrays: dict[str, np.ndarray], sizes: dict[str, int]) -> dict[str, Bounded]:
    """The expected value and error bound of every tensor the problem writes."""
    arithmetic = _Arithmetic(np.dtype(problem.dtype))
    wide = np.int64 if arithmetic.is_int else np.float64
    env = {name: Bounded(array.astype(wide)) for name, array in arrays.items()}
    extents = {index: sizes[size] if isinstance(size, str) else size for index, size in problem.index_sizes}
    for statement in problem.statements:
        env[statement.target] = _evaluate_statement(statement, env, extents, arithmetic)
    return env


# ----------------------------------------------------------------------------- running one case
def compile_problem(problem: Problem, options: dict):
    """The kernel of ``problem``, compiled with ``-O1`` (quick to build) and, unless the options
    say otherwise, parametric: one binary then serves every size set."""
    module = polyc.define(problem.source(), cflags="-O1", **{"specialize": False, **options})
    return module[problem.name]


def describe_case(problem: Problem, options: dict, sizes: dict, value_seed: int) -> str:
    return (
        f"POLYC_FUZZ_SEED={FUZZ_SEED}\n{problem.source()}options: {options}\nsizes: {sizes}\n"
        f"value_seed: {value_seed}\nreproduce with:\n"
        f"    from tests.test_differential_fuzz import Access, Apply, Const, IndexRef, Problem, Select, \\\n"
        f"        Statement, check_case\n"
        f"    check_case({problem!r}, {options!r}, {sizes!r}, {value_seed!r})"
    )


def check_case(problem: Problem, options: dict, sizes: dict, value_seed: int, kernel=None) -> None:
    """Run one case and compare every output with the oracle; AssertionError on a mismatch."""
    kernel = kernel or compile_problem(problem, options)
    arrays = make_inputs(problem, sizes, value_seed)
    results = kernel(*[arrays[name] for name, _ in problem.inputs])
    results = results if isinstance(results, tuple) else (results,)
    expected = evaluate(problem, arrays, sizes)
    for name, result in zip(problem.outputs, results, strict=True):
        want = expected[name]
        result = np.asarray(result)
        context = f"output {name}\n{describe_case(problem, options, sizes, value_seed)}"
        assert result.dtype == np.dtype(problem.dtype), f"dtype {result.dtype}; {context}"
        assert result.shape == want.value.shape, f"shape {result.shape} != {want.value.shape}; {context}"
        if np.dtype(problem.dtype).kind == "i":
            assert np.all(np.abs(want.value) < 2**31), "the generator must keep integers in range"
            mismatched = result != want.value
            bound = np.zeros(result.shape)
        else:
            bound = SECOND_ORDER * np.broadcast_to(want.error, result.shape)
            mismatched = ~(np.abs(result.astype(np.float64) - want.value) <= bound)
        if np.any(mismatched):
            where = tuple(int(w[0]) for w in np.nonzero(mismatched)) if result.ndim else ()
            raise AssertionError(
                f"{int(np.count_nonzero(mismatched))} of {result.size} elements differ; first at {where}: "
                f"compiled {result[where]!r}, numpy {want.value[where]!r}, allowed error {bound[where]!r}\n"
                f"{context}"
            )


# ----------------------------------------------------------------------------- generators
def _weighted(draw, choices: dict):
    """One key of ``choices`` with probability proportional to its value; hypothesis shrinks
    towards the first key."""
    keys = list(choices)
    ticket = draw(st.integers(0, sum(choices.values()) - 1))
    for key in keys:
        ticket -= choices[key]
        if ticket < 0:
            return key
    raise AssertionError


def _draw_dtype(draw) -> str:
    return draw(st.sampled_from(["float32"] * 14 + ["float64"] * 3 + ["int32"] * 3))


def _draw_index_sizes(draw, indices) -> dict[str, str | int]:
    """A size for each index: a size name (several indices may share one) or, rarely, a constant."""
    names = SIZE_NAMES[: draw(st.integers(1, len(SIZE_NAMES)))]
    sizes = {}
    for index in indices:
        if draw(st.integers(0, 9)) == 0:
            sizes[index] = draw(st.integers(1, 4))
        else:
            sizes[index] = draw(st.sampled_from(names))
    return sizes


def _draw_access_indices(draw, pool, max_rank: int) -> tuple[str, ...]:
    """Up to max_rank indices of ``pool`` in random order, sometimes one repeated (a diagonal)."""
    order = draw(st.permutations(pool))
    rank = draw(st.integers(0, min(max_rank, len(pool))))
    indices = list(order[:rank])
    if rank >= 2 and draw(st.integers(0, 7)) == 0:
        indices[draw(st.integers(0, rank - 1))] = indices[draw(st.integers(0, rank - 1))]
    return tuple(indices)


def _inputs_for(accesses: list[tuple[str, tuple[str, ...]]], index_sizes) -> tuple:
    return tuple((name, tuple(index_sizes[i] for i in indices)) for name, indices in accesses)


def _scalar_access(draw, name, indices) -> Access:
    return Access(name, indices, parens=bool(indices) or draw(st.booleans()))


def _contraction_operands(draw, pool, count, max_rank=4):
    """``count`` operand index tuples of rank at most ``max_rank`` that together use every index
    of ``pool`` (at most ``count * max_rank`` of them), each in random order, sometimes with a
    repeated index (a diagonal)."""
    operands = [[] for _ in range(count)]
    for index in pool:  # every index somewhere
        room = [op for op in operands if len(op) < max_rank]
        room[draw(st.integers(0, len(room) - 1))].append(index)
    for op in operands:
        extra = [i for i in pool if i not in op]
        for index in draw(st.permutations(extra))[: draw(st.integers(0, max_rank - len(op)))]:
            op.append(index)
        if op and len(op) < max_rank and draw(st.integers(0, 7)) == 0:
            op.append(op[draw(st.integers(0, len(op) - 1))])
    return [tuple(draw(st.permutations(op))) for op in operands]


def _product(factors):
    expr = factors[0]
    for factor in factors[1:]:
        expr = Apply("*", (expr, factor))
    return expr


@st.composite
def contraction_problems(draw) -> Problem:
    """``O(out) +=! A(...) * B(...) * C(...)``: 1-3 operands of rank 0-4, reduction over the rest."""
    dtype = _draw_dtype(draw)
    count = draw(st.integers(1, 3))
    pool = list(OUTPUT_INDICES + REDUCTION_INDICES)[: draw(st.integers(0, min(MAX_INDICES, 4 * count)))]
    index_sizes = _draw_index_sizes(draw, pool)
    operands = _contraction_operands(draw, pool, count)
    names = INPUT_NAMES[: len(operands)]
    used = list(dict.fromkeys(i for op in operands for i in op))
    out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
    factors = [_scalar_access(draw, name, op) for name, op in zip(names, operands)]
    values = "small_int" if dtype == "int32" else _weighted(draw, {"quarters": 1, "uniform": 1})
    return Problem(
        dtype,
        _inputs_for(list(zip(names, operands)), index_sizes),
        ("O",),
        (Statement("O", tuple(out), "+=!", _product(factors)),),
        tuple((i, index_sizes[i]) for i in used),
        values,
    )


@st.composite
def reduction_problems(draw) -> Problem:
    """``O(out) max=! A(...)``, ``min=!`` of one operand, and ``*=!`` of the product of one or two
    operands of values near +-1 (at most two reduction indices, so products stay in range)."""
    dtype = _draw_dtype(draw)
    op = _weighted(draw, {"max=!": 2, "min=!": 2, "*=!": 3})
    count = draw(st.integers(1, 2)) if op == "*=!" else 1
    pool = list(OUTPUT_INDICES[:3] + REDUCTION_INDICES[:2])[: draw(st.integers(0, min(MAX_INDICES, 4 * count)))]
    index_sizes = _draw_index_sizes(draw, pool)
    operands = _contraction_operands(draw, pool, count)
    names = INPUT_NAMES[: len(operands)]
    used = list(dict.fromkeys(i for o in operands for i in o))
    order = draw(st.permutations(used))
    least_kept = max(0, len(used) - 2) if op == "*=!" else 0
    out = order[: draw(st.integers(least_kept, len(used)))]
    factors = [_scalar_access(draw, name, o) for name, o in zip(names, operands)]
    if op == "*=!":
        values = "sign" if dtype == "int32" else "near_one"
    else:
        values = "small_int" if dtype == "int32" else _weighted(draw, {"quarters": 1, "uniform": 1})
    return Problem(
        dtype,
        _inputs_for(list(zip(names, operands)), index_sizes),
        ("O",),
        (Statement("O", tuple(out), op, _product(factors)),),
        tuple((i, index_sizes[i]) for i in used),
        values,
    )


# Expression trees: each subtree carries a magnitude bound and a floor on its absolute value,
# so the generator only divides by values away from zero, only exponentiates moderate values
# and never overflows (integers stay far inside int32).
@dataclass(frozen=True)
class _Tree:
    expr: object
    magnitude: float
    floor: float = 0.0


FLOAT_LIMIT = 1e4
INT_LIMIT = 2**20
FLOAT_CONSTANTS = (0.0, 0.5, 1.0, 2.0, -1.0, 0.25, 1.5)
INT_CONSTANTS = (0, 1, 2, -1, 3)


def _reads_data(expr) -> bool:
    """Whether the value of ``expr`` depends on a tensor (conditions of selections aside)."""
    if isinstance(expr, Access):
        return True
    if isinstance(expr, Select):
        return _reads_data(expr.then) or _reads_data(expr.otherwise)
    if isinstance(expr, Apply):
        return any(_reads_data(a) for a in expr.args)
    return False


def _constant(*trees: _Tree) -> bool:
    """Whether the trees' values come from literals and index values only.  polyc types such a
    subexpression float32 even in a float64 def (TC's weak literals), so the generator keeps
    them exact in float32: no division, exp or tanh of them."""
    return not any(_reads_data(tree.expr) for tree in trees)


def _const_tree(value) -> _Tree:
    return _Tree(Const(value), abs(value), abs(value))


def _combine(draw, a: _Tree, b: _Tree, is_int: bool, conditions) -> _Tree:
    """A random valid binary combination of two subtrees (or a selection between them)."""
    limit = INT_LIMIT if is_int else FLOAT_LIMIT
    options = {"+": 3, "-": 3, "*": 3, "select": 2}
    options.update({"max": 1, "min": 1} if is_int else {"fmax": 1, "fmin": 1, "/": 2})
    for _ in range(8):
        op = _weighted(draw, options)
        if op in ("+", "-") and a.magnitude + b.magnitude <= limit:
            return _Tree(Apply(op, (a.expr, b.expr)), a.magnitude + b.magnitude)
        if op == "*" and a.magnitude * b.magnitude <= limit:
            return _Tree(Apply("*", (a.expr, b.expr)), a.magnitude * b.magnitude, a.floor * b.floor)
        if op == "/" and b.floor >= 0.25 and a.magnitude / b.floor <= limit and not _constant(a, b):
            return _Tree(Apply("/", (a.expr, b.expr)), a.magnitude / b.floor, a.floor / b.magnitude)
        if op in ("fmax", "fmin", "max", "min"):
            return _Tree(Apply(op, (a.expr, b.expr)), max(a.magnitude, b.magnitude))
        if op == "select":
            lhs, rhs = draw(conditions)
            comparisons = ["<", "<=", ">", ">="] + (["==", "!="] if is_int else [])
            return _Tree(
                Select(draw(st.sampled_from(comparisons)), lhs, rhs, a.expr, b.expr),
                max(a.magnitude, b.magnitude),
                min(a.floor, b.floor),
            )
    return _Tree(Apply("max" if is_int else "fmax", (a.expr, b.expr)), max(a.magnitude, b.magnitude))


def _maybe_unary(draw, tree: _Tree, is_int: bool) -> _Tree:
    choice = _weighted(draw, {"none": 6, "neg": 1} if is_int else {"none": 8, "neg": 1, "exp": 2, "tanh": 2})
    if choice == "neg":
        return _Tree(Apply("neg", (tree.expr,)), tree.magnitude, tree.floor)
    if choice in ("exp", "tanh") and _constant(tree):
        return tree
    if choice == "exp" and tree.magnitude <= 6:
        return _Tree(Apply("exp", (tree.expr,)), float(np.exp(tree.magnitude)), float(np.exp(-tree.magnitude)))
    if choice == "tanh":
        return _Tree(Apply("tanh", (tree.expr,)), 1.0, float(np.tanh(tree.floor)))
    return tree


def _unguarded_indices(expr) -> set[str]:
    """Indices of accesses outside ternary branches: the ones range inference looks at."""
    if isinstance(expr, Access):
        return set(expr.indices)
    if isinstance(expr, Select):
        return _unguarded_indices(expr.lhs) | _unguarded_indices(expr.rhs)
    if isinstance(expr, Apply):
        return set().union(*(_unguarded_indices(a) for a in expr.args))
    return set()


def _draw_tree(
    draw, required: list[_Tree], optional: list[_Tree], is_int: bool, conditions, indices: tuple[str, ...]
) -> _Tree:
    """A random expression over every ``required`` leaf and a few ``optional`` ones, in which
    every one of ``indices`` has an access outside ternary branches (polyc infers ranges from
    those only)."""
    leaves = list(required)
    if indices and not is_int:  # an index value now and then: i * A(i), i > j ? ...
        optional = optional + [_Tree(IndexRef(draw(st.sampled_from(indices))), MAX_SIZE - 1.0)]
    for _ in range(draw(st.integers(0, 3))):
        leaves.append(draw(st.sampled_from(optional)))
    constants = INT_CONSTANTS if is_int else FLOAT_CONSTANTS
    for _ in range(draw(st.integers(0, 2))):
        leaves.append(_const_tree(draw(st.sampled_from(constants))))
    leaves = [_maybe_unary(draw, leaf, is_int) for leaf in draw(st.permutations(leaves))]
    while len(leaves) > 1:
        a = leaves.pop(draw(st.integers(0, len(leaves) - 1)))
        b = leaves.pop(draw(st.integers(0, len(leaves) - 1)))
        leaves.append(_maybe_unary(draw, _combine(draw, a, b, is_int, conditions), is_int))
    tree = leaves[0]
    for index in indices:
        if index not in _unguarded_indices(tree.expr):
            leaf = next(leaf for leaf in required if index in _unguarded_indices(leaf.expr))
            tree = _Tree(Apply("+", (tree.expr, leaf.expr)), tree.magnitude + leaf.magnitude)
    return tree


def _input_magnitude(dtype: str) -> tuple[float, float]:
    """Magnitude bound and floor of elementwise input values (see VALUE_KINDS)."""
    return (3.0, 0.0) if dtype == "int32" else (1.5, 0.25)


def _conditions(inputs: list[tuple[str, tuple[str, ...]]], is_int: bool, indices: tuple[str, ...]):
    """Exact comparison operands: input accesses, index values and constants."""
    accesses = [Access(name, ix) for name, ix in inputs] + [IndexRef(i) for i in indices]
    constants = [Const(c) for c in (INT_CONSTANTS if is_int else (0.0, 0.5, -0.5))]
    return st.tuples(st.sampled_from(accesses or constants), st.sampled_from(accesses + constants))


def _draw_inputs(draw, indices, first_name: int, count: int, cover=()):
    """``count`` new inputs with index tuples drawn from ``indices``; together they use every
    index of ``cover``."""
    names = INPUT_NAMES[first_name : first_name + count]
    accesses = [list(_draw_access_indices(draw, indices, 4)) for _ in names]
    used = {i for a in accesses for i in a}
    for index in cover:
        if index not in used:
            shortest = min(accesses, key=len)
            shortest.insert(draw(st.integers(0, len(shortest))), index)
    return [(name, tuple(a)) for name, a in zip(names, accesses)]


def _elementwise_values(draw, dtype: str) -> str:
    if dtype == "int32":
        return "small_int"
    return _weighted(draw, {"away_from_zero": 2, "quarters_away_from_zero": 1})


@st.composite
def elementwise_problems(draw) -> Problem:
    """``O(out) = tree`` over 1-3 inputs broadcast by index."""
    dtype = _draw_dtype(draw)
    is_int = dtype == "int32"
    out = draw(st.permutations(OUTPUT_INDICES))[: draw(st.integers(0, 4))]
    index_sizes = _draw_index_sizes(draw, out)
    inputs = _draw_inputs(draw, out, 0, draw(st.integers(1, 3)), cover=out)
    magnitude, floor = _input_magnitude(dtype)
    leaves = [_Tree(_scalar_access(draw, name, ix), magnitude, floor) for name, ix in inputs]
    tree = _draw_tree(draw, leaves, leaves, is_int, _conditions(inputs, is_int, out), out)
    return Problem(
        dtype,
        _inputs_for(inputs, index_sizes),
        ("O",),
        (Statement("O", tuple(out), "=", tree.expr),),
        tuple((i, index_sizes[i]) for i in out),
        _elementwise_values(draw, dtype),
    )


def _contraction_statement(draw, dtype, target, lhs, inputs, first_name, index_sizes, reduction_names):
    """``target(lhs) +=! product`` of 1-2 new operands over ``lhs`` and up to two reduction indices."""
    reduction = list(reduction_names[: draw(st.integers(0, 2))])
    pool = list(lhs) + reduction
    operands = _contraction_operands(draw, pool, draw(st.integers(1 if len(pool) <= 4 else 2, 2)))
    names = INPUT_NAMES[first_name : first_name + len(operands)]
    inputs += list(zip(names, operands))
    factors = [Access(name, o) for name, o in zip(names, operands)]
    terms = int(np.prod([MAX_SIZE if isinstance(index_sizes[r], str) else index_sizes[r] for r in reduction]))
    magnitude = terms * _input_magnitude(dtype)[0] ** len(operands)
    return Statement(target, tuple(lhs), "+=!", _product(factors)), magnitude


def _tree_statement(draw, dtype, target, lhs, reduction, inputs, given: list[_Tree]):
    """``target(lhs) OP tree``: the tree reads the ``given`` leaves and 0-2 new inputs (appended
    to ``inputs``) indexed by ``lhs`` and ``reduction``; OP is ``=`` without reduction indices,
    else ``+=!``, ``max=!`` or ``min=!``.  Returns the statement and a bound on its values."""
    is_int = dtype == "int32"
    magnitude, floor = _input_magnitude(dtype)
    space = tuple(lhs) + tuple(reduction)
    covered = {i for leaf in given for a in expr_accesses(leaf.expr) for i in a.indices}
    missing = [i for i in space if i not in covered]
    new = _draw_inputs(draw, space, len(inputs), draw(st.integers(1 if missing else 0, 2)), cover=missing)
    inputs.extend(new)
    leaves = list(given) + [_Tree(_scalar_access(draw, n, ix), magnitude, floor) for n, ix in new]
    conditions = _conditions([(n, ix) for n, ix in inputs if set(ix) <= set(space)], is_int, space)
    tree = _draw_tree(draw, leaves, leaves, is_int, conditions, space)
    if not reduction:
        return Statement(target, tuple(lhs), "=", tree.expr), tree
    op = _weighted(draw, {"+=!": 2, "max=!": 1, "min=!": 1})
    terms = MAX_SIZE ** len(reduction) if op == "+=!" else 1
    return Statement(target, tuple(lhs), op, tree.expr), _Tree(None, tree.magnitude * terms)


@st.composite
def multi_statement_problems(draw) -> Problem:
    """Two or three statements: a temporary produced (elementwise, or reducing with +=!, max=!,
    min=!) then consumed (likewise, possibly reducing over the temporary's indices); an
    output rewritten (``O = O + B`` then ``O = fmax(O, 0)``, or ``O += ...``); or an output read
    elsewhere than where it is written, then overwritten (``T(i, j) = O(j, i)``, then ``O = T``:
    only anti dependences keep the overwrite after the read)."""
    dtype = _draw_dtype(draw)
    is_int = dtype == "int32"
    magnitude, floor = _input_magnitude(dtype)
    out = draw(st.permutations(OUTPUT_INDICES))[: draw(st.integers(1, 4))]
    reduction_names = REDUCTION_INDICES[: MAX_INDICES - len(out)]
    index_sizes = _draw_index_sizes(draw, list(out) + list(reduction_names))
    inputs: list[tuple[str, tuple[str, ...]]] = []
    statements = []
    outputs = ["O"]
    shape = _weighted(draw, {"temporary": 2, "rewrite": 2, "reread": 1})

    def first_statement(target, lhs, reduction_names):
        if reduction_names and draw(st.booleans()):  # a product of accesses: a matmul, maybe
            statement, bound = _contraction_statement(
                draw, dtype, target, lhs, inputs, len(inputs), index_sizes, reduction_names
            )
            return statement, _Tree(None, bound)
        reduction = reduction_names[: draw(st.integers(0, min(1, len(reduction_names))))]
        return _tree_statement(draw, dtype, target, lhs, reduction, inputs, [])

    if shape == "temporary":
        # O(out) = / reduces over consumed ... T(t) ... where T(t) = / reduces over produced.
        consumed = reduction_names[: draw(st.integers(0, min(1, len(reduction_names))))]
        space = list(out) + list(consumed)
        lhs = draw(st.permutations(space))[: draw(st.integers(1, len(space)))]
        statement, produced = first_statement("T", lhs, reduction_names[len(consumed) :])
        statements.append(statement)
        temporary = _Tree(Access("T", tuple(lhs)), produced.magnitude)
        statement, _ = _tree_statement(draw, dtype, "O", out, consumed, inputs, [temporary])
        statements.append(statement)
        if draw(st.integers(0, 2)) == 0:
            outputs.append("T")
    elif shape == "reread":
        statement, produced = first_statement("O", out, reduction_names)
        statements.append(statement)
        reduction = reduction_names[: draw(st.integers(0, min(1, len(reduction_names))))]
        space = list(out) + list(reduction)
        # Read O with any indices of the right sizes: O(j, i), O(i, i), O(r_a, j), ...
        reread = tuple(draw(st.sampled_from([i for i in space if index_sizes[i] == index_sizes[o]])) for o in out)
        lhs = draw(st.permutations(out))
        statement, bound = _tree_statement(
            draw, dtype, "T", lhs, reduction, inputs, [_Tree(Access("O", reread), produced.magnitude)]
        )
        statements.append(statement)
        statement, _ = _tree_statement(
            draw, dtype, "O", out, (), inputs, [_Tree(Access("T", tuple(lhs)), bound.magnitude)]
        )
        statements.append(statement)
    else:
        statement, produced = first_statement("O", out, reduction_names)
        statements.append(statement)
        current = _Tree(Access("O", tuple(out)), produced.magnitude)
        for _ in range(draw(st.integers(1, 2))):
            if draw(st.integers(0, 2)) == 0:  # accumulate without '!'
                statement, bound = _contraction_statement(
                    draw, dtype, "O", out, inputs, len(inputs), index_sizes, reduction_names
                )
                statements.append(Statement("O", statement.indices, "+=", statement.rhs))
                current = _Tree(current.expr, current.magnitude + bound)
                continue
            new = _draw_inputs(draw, out, len(inputs), draw(st.integers(0, 1)))
            inputs.extend(new)
            leaves = [_Tree(Access(n, ix), magnitude, floor) for n, ix in new]
            conditions = _conditions([(n, ix) for n, ix in inputs if set(ix) <= set(out)], is_int, out)
            tree = _draw_tree(draw, [current] + leaves, [current] + leaves, is_int, conditions, out)
            statements.append(Statement("O", tuple(out), "=", tree.expr))
            current = _Tree(current.expr, tree.magnitude)
    used = sorted({i for s in statements for a in expr_accesses(s.rhs) for i in a.indices} | set(out))
    return Problem(
        dtype,
        _inputs_for(inputs, index_sizes),
        tuple(draw(st.permutations(outputs))),
        tuple(statements),
        tuple((i, index_sizes[i]) for i in used),
        _elementwise_values(draw, dtype),
    )


# The drawn option sets give one set of sizes to defs of any kernel path: the deprecated
# tile_sizes is the option each path reads as its own (loop_tiles, gemm_blocks, conv_block).
pytestmark = pytest.mark.filterwarnings("ignore:tile_sizes is deprecated")


@st.composite
def option_sets(draw) -> dict:
    tiles = _weighted(draw, {"none": 2, "off": 1, "sizes": 3})
    tile_sizes = {"none": None, "off": ()}.get(tiles)
    if tiles == "sizes":
        tile_sizes = tuple(draw(st.lists(st.integers(1, 8), min_size=1, max_size=4)))
    return {
        "fusion": draw(st.sampled_from(["smart", "min", "max"])),
        "tile_sizes": tile_sizes,
        "parallel": draw(st.booleans()),
        "vectorize": draw(st.booleans()),
        "unroll": draw(st.sampled_from([1, 2, 4])),
        "blas_contractions": draw(st.booleans()),
        "specialize": _weighted(draw, {False: 5, True: 1}),
    }


def size_sets(problem: Problem):
    names = problem.size_names()
    one_set = st.fixed_dictionaries({name: st.integers(1, MAX_SIZE) for name in names})
    return st.lists(one_set, min_size=SIZE_SETS, max_size=SIZE_SETS)


# ----------------------------------------------------------------------------- the tests
@pytest.fixture(scope="module", autouse=True)
def private_kernel_cache(tmp_path_factory):
    """A kernel cache of this module's own, so the fuzzing never touches the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POLYC_CACHE_DIR", str(tmp_path_factory.mktemp("fuzz-kernel-cache")))
        yield


@pytest.fixture(scope="module")
def case_tally() -> dict[str, int]:
    """Cases checked so far in this module, per test."""
    return {}


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=False,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def run_problem(data, problem: Problem, tally: dict[str, int], test_name: str) -> None:
    options = data.draw(option_sets(), label="options")
    # Some of the def's indices, in a random order, as the loop_order option (none: the scheduler's).
    order = data.draw(st.permutations([name for name, _ in problem.index_sizes]), label="loop order")
    named = data.draw(st.integers(0, len(order)), label="loop order length")
    if named:
        options["loop_order"] = tuple(order[:named])
    sizes_list = data.draw(size_sets(problem), label="sizes")
    if options["specialize"]:  # a compilation per size set
        sizes_list = sizes_list[:SPECIALIZED_SIZE_SETS]
    value_seed = data.draw(st.integers(0, 2**32 - 1), label="value_seed")
    note(f"POLYC_FUZZ_SEED={FUZZ_SEED}\n{problem.source()}options: {options}")
    try:
        kernel = compile_problem(problem, options)
    except Exception as error:
        raise AssertionError(
            f"define failed: {error!r}\n{describe_case(problem, options, sizes_list[0], value_seed)}"
        ) from error
    for sizes in sizes_list:
        try:
            check_case(problem, options, sizes, value_seed, kernel)
        except AssertionError:
            raise
        except Exception as error:
            raise AssertionError(
                f"compiling or running failed: {error!r}\n{describe_case(problem, options, sizes, value_seed)}"
            ) from error
        tally[test_name] = tally.get(test_name, 0) + 1


@seed(FUZZ_SEED)
@fuzz_settings(EXAMPLES["contractions"])
@given(data=st.data())
def test_contractions(data, case_tally):
    run_problem(data, data.draw(contraction_problems(), label="problem"), case_tally, "contractions")


@seed(FUZZ_SEED)
@fuzz_settings(EXAMPLES["reductions"])
@given(data=st.data())
def test_max_min_product_reductions(data, case_tally):
    run_problem(data, data.draw(reduction_problems(), label="problem"), case_tally, "reductions")


@seed(FUZZ_SEED)
@fuzz_settings(EXAMPLES["elementwise"])
@given(data=st.data())
def test_elementwise(data, case_tally):
    run_problem(data, data.draw(elementwise_problems(), label="problem"), case_tally, "elementwise")


@seed(FUZZ_SEED)
@fuzz_settings(EXAMPLES["multi_statement"])
@given(data=st.data())
def test_multi_statement(data, case_tally):
    run_problem(data, data.draw(multi_statement_problems(), label="problem"), case_tally, "multi_statement")


#: Defs the OpenCL back end is fuzzed with (each compiled per size set, by PoCL: slower to build).
OPENCL_EXAMPLES = 120
OPENCL_SIZE_SETS = 2


@st.composite
def opencl_option_sets(draw) -> dict:
    block = draw(st.sampled_from([None, (1,), (5, 3), (32, 2, 2), (7, 1, 3)]))
    return {"backend": "opencl", "fusion": draw(st.sampled_from(["smart", "min", "max"])), "block": block}


@seed(FUZZ_SEED)
@fuzz_settings(OPENCL_EXAMPLES)
@given(data=st.data())
def opencl_fuzz(data):
    """Contractions and multi-statement defs through the GPU mapping and OpenCL, on PoCL (run by
    :func:`test_opencl_back_end` in a process of its own).  Each example is written to the file
    ``$POLYC_FUZZ_LAST`` names before it is compiled: if the driver takes the process down, that
    file says with what."""
    kind = data.draw(st.sampled_from(["contraction", "multi-statement"]), label="kind")
    problem = data.draw(
        contraction_problems() if kind == "contraction" else multi_statement_problems(), label="problem"
    )
    options = data.draw(opencl_option_sets(), label="options")
    sizes_list = data.draw(size_sets(problem), label="sizes")[:OPENCL_SIZE_SETS]
    value_seed = data.draw(st.integers(0, 2**32 - 1), label="value_seed")
    note(f"POLYC_FUZZ_SEED={FUZZ_SEED}\n{problem.source()}options: {options}")
    last = Path(os.environ["POLYC_FUZZ_LAST"])
    last.write_text(describe_case(problem, options, sizes_list[0], value_seed))
    kernel = compile_problem(problem, options)
    for sizes in sizes_list:  # each size set is built for, then run
        last.write_text(describe_case(problem, options, sizes, value_seed))
        check_case(problem, options, sizes, value_seed, kernel)


@pytest.mark.skipif(opencl_missing() is not None, reason=str(opencl_missing()))
def test_opencl_back_end(tmp_path):
    """The OpenCL fuzzing, in a child process.  In two CI runs the OpenCL driver (Debian's PoCL
    3.1, built with assertions) aborted the test worker itself, with no message (pytest had
    captured its stderr) and no test named; in 20 runs in fresh processes it never did.  In a
    child, an abort takes only the child down, and the failure names the signal, the seed, the
    example being compiled and what the driver printed.  A child killed by a signal is run
    again, the same seed in a fresh process, and the test fails either way: the report says
    whether the crash came back (an example) or not (the driver's state: report it to the
    driver's makers); a crash that passes on a rerun is still a crash."""
    first = _opencl_fuzz_child(tmp_path / "first")
    if first is None:
        return
    if first[0] < 0:
        again = _opencl_fuzz_child(tmp_path / "again")
        if again is None:
            pytest.fail(
                f"the OpenCL fuzzing process was {first[1]}, and its rerun in a fresh process passed "
                f"(the driver's state, not an example: report it to the driver's makers)\n{first[2]}",
                pytrace=False,
            )
        pytest.fail(f"{first[2]}\n\nand again in a fresh process:\n{again[2]}", pytrace=False)
    pytest.fail(first[2], pytrace=False)


def test_an_opencl_crash_that_passes_on_its_rerun_fails(tmp_path, monkeypatch):
    """Control of the rule above, without a driver: a child aborted once, then passing in a fresh
    process, fails the test (it used to pass it with a warning)."""
    runs = iter([(-6, "killed by SIGABRT", "the report"), None])
    monkeypatch.setattr(sys.modules[__name__], "_opencl_fuzz_child", lambda directory: next(runs))
    with pytest.raises(pytest.fail.Exception, match="its rerun in a fresh process passed"):
        test_opencl_back_end(tmp_path)


def _opencl_fuzz_child(directory: Path) -> tuple[int, str, str] | None:
    """Runs :func:`opencl_fuzz` in a child process: None when it passed, else its return code,
    how it ended and a report (the seed, its output, the example it was on)."""
    directory.mkdir()
    last = directory / "last-example.txt"
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "import test_differential_fuzz as fuzz; fuzz.opencl_fuzz()"
    )
    env = {**os.environ, "POLYC_FUZZ_SEED": str(FUZZ_SEED), "POLYC_FUZZ_LAST": str(last)}
    child = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1100)
    if child.returncode == 0:
        return None
    how = (
        f"killed by {signal.Signals(-child.returncode).name}"
        if child.returncode < 0
        else f"ended with exit status {child.returncode}"
    )
    example = last.read_text() if last.exists() else "(none started)"
    return (
        child.returncode,
        how,
        (
            f"the OpenCL fuzzing process {how}, POLYC_FUZZ_SEED={FUZZ_SEED}\n"
            f"its output:\n{(child.stdout + child.stderr)[-8000:]}\n"
            f"the example it was on:\n{example}"
        ),
    )


#: Cases that once failed, minimised: (what went wrong, problem, options, sizes, value seed).
REGRESSIONS = [
    (
        "a then-branch ending in an else-less if took the C else (codegen/c.py)",
        Problem(
            "float32",
            (("A", ("N",)), ("C", ("N", "N", "N", "N"))),
            ("O",),
            (
                Statement(
                    "O",
                    ("i", "j", "l", "k"),
                    "+=!",
                    Apply("*", (Access("A", ("r_a",)), Access("C", ("i", "j", "l", "k")))),
                ),
                Statement(
                    "T",
                    ("k", "i", "j", "l"),
                    "+=!",
                    Apply("*", (Access("O", ("k", "r_a", "j", "l")), Access("C", ("l", "r_a", "i", "k")))),
                ),
                Statement("O", ("i", "j", "l", "k"), "=", Access("T", ("k", "i", "j", "l"))),
            ),
            tuple((i, "N") for i in ("i", "j", "l", "k", "r_a")),
            "quarters",
        ),
        {"fusion": "max", "loop_tiles": (8,), "parallel": False, "vectorize": False, "blas_contractions": False},
        {"N": 10},
        0,
    ),
]


@pytest.mark.parametrize("what, problem, options, sizes, value_seed", REGRESSIONS, ids=[r[0] for r in REGRESSIONS])
def test_regressions(what, problem, options, sizes, value_seed):
    check_case(problem, options, sizes, value_seed)


def test_case_count(case_tally):
    """The fuzz tests above, run in this process, checked at least MIN_CASES cases together."""
    if set(case_tally) != set(EXAMPLES):
        pytest.skip(
            f"only {sorted(case_tally)} of the fuzz tests ran in this process; "
            f"the count is checked when the whole module runs"
        )
    total = sum(case_tally.values())
    print(f"differential fuzzing: {total} cases {case_tally} (POLYC_FUZZ_SEED={FUZZ_SEED})")
    assert total >= MIN_CASES, f"only {total} cases ran ({case_tally}); at least {MIN_CASES} are required"
