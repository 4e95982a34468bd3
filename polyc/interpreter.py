"""The reference interpreter: TC semantics executed directly on numpy arrays.

It is the oracle for compiled code (tests, ``polyc run --check``) and so favours being obviously
right over being fast.  Each statement is evaluated over its whole iteration space at once: every
index becomes a broadcast ``arange``, the right-hand side is evaluated as an array over all
indices, reduced over the reduction axes and combined with the target.  Large spaces are cut
into chunks along the first index to bound memory.

Every access is checked at run time: an element read outside its tensor where its guard holds
raises :class:`~polyc.errors.BoundsError` instead of reading garbage.
"""

from __future__ import annotations

import numpy as np

from polyc.errors import BoundsError
from polyc.lang import checked as ir
from polyc.lang.builtins import BUILTINS
from polyc.lang.symbolic import Affine
from polyc.runtime.arguments import BoundCall, bind_arguments
from polyc.types import identity

#: Largest number of iteration points evaluated at once.
CHUNK_POINTS = 1 << 22


def interpret(definition: ir.CheckedDef, args, outputs=None) -> tuple[np.ndarray, ...]:
    """Run ``definition`` on ``args`` and return its outputs in declared order."""
    return run_bound(definition, bind_arguments(definition, args, outputs))


def run_bound(definition: ir.CheckedDef, call: BoundCall) -> tuple[np.ndarray, ...]:
    """Execute every statement on the bound arrays (allocating temporaries) in place; return
    the outputs in declared order."""
    tensors = dict(call.arrays)
    for name in definition.temporaries:
        tensors[name] = call.new_array(definition.tensor(name))
    for loop, block in ir.loop_blocks(definition.statements):
        if loop is None:
            _StatementRun(definition, block[0], tensors, call.sizes).execute()
            continue
        for step in range(loop.range.lo.evaluate(call.sizes), loop.range.hi.evaluate(call.sizes)):
            for statement in block:  # each step runs the block's statements in order
                _StatementRun(definition, statement, tensors, call.sizes, {loop.index: step}).execute()
    return tuple(call.arrays[name] for name in definition.outputs)


class _StatementRun:
    def __init__(
        self,
        definition: ir.CheckedDef,
        statement: ir.CheckedStatement,
        tensors: dict[str, np.ndarray],
        sizes: dict[str, int],
        fixed: dict[str, int] | None = None,
    ):
        self.definition = definition
        self.statement = statement
        self.tensors = tensors
        self.sizes = sizes
        fixed = fixed or {}  # indices held at one value: a sequential loop's step
        self.bounds = [
            (name, fixed[name], fixed[name] + 1)
            if name in fixed
            else (name, r.lo.evaluate(sizes), r.hi.evaluate(sizes))
            for name, r in statement.ranges
        ]

    def execute(self) -> None:
        s = self.statement
        target = self.tensors[s.target]
        for axis, (name, lo, hi) in enumerate(self.bounds[: len(s.indices)]):
            if hi > lo and (lo < 0 or hi > target.shape[axis]):
                raise BoundsError(
                    f"{self.definition.name}: statement {s.name} ({s.text}) writes "
                    f"{s.target} at {name} in [{lo}, {hi}), outside its extent {target.shape[axis]}"
                )
        extents = [max(hi - lo, 0) for _, lo, hi in self.bounds]
        if any(e == 0 for e in extents[: len(s.indices)]):
            return
        if any(e == 0 for e in extents):  # an empty reduction leaves the identity, or the old value
            if s.init:
                target[self._lhs_slices()] = identity(s.op, target.dtype)
            return
        points = int(np.prod(extents, dtype=np.int64)) if extents else 1
        rows = extents[0] if extents else 1
        chunk = max(1, rows * CHUNK_POINTS // max(points, 1))
        first_is_lhs = bool(s.indices)
        partial = None
        for start in range(0, rows, chunk):
            values = self._evaluate_chunk(start, min(rows, start + chunk))
            if first_is_lhs or not extents:
                self._store(values, start)
            else:
                reduced = self._reduce(values)
                partial = reduced if partial is None else self._combine(partial, reduced)
        if partial is not None:
            self._store_reduced(partial)

    # ------------------------------------------------------------------ evaluation
    def _evaluate_chunk(self, start: int, stop: int) -> np.ndarray:
        rank = len(self.bounds)
        grids: dict[str, np.ndarray] = {}
        shape = []
        for axis, (name, lo, hi) in enumerate(self.bounds):
            if axis == 0:
                values = np.arange(lo + start, lo + stop, dtype=np.int64)
            else:
                values = np.arange(lo, hi, dtype=np.int64)
            grids[name] = values.reshape([-1 if a == axis else 1 for a in range(rank)])
            shape.append(values.size)
        with np.errstate(all="ignore"):
            result = _Evaluator(self, grids).eval(self.statement.rhs, None)
        return np.broadcast_to(result, shape)

    def _reduce(self, values: np.ndarray) -> np.ndarray:
        s = self.statement
        axes = tuple(range(len(s.indices), len(s.all_indices)))
        if not axes:
            return values
        with np.errstate(all="ignore"):
            if s.op == "+":
                return np.add.reduce(values, axis=axes, dtype=values.dtype)
            if s.op == "*":
                return np.multiply.reduce(values, axis=axes, dtype=values.dtype)
            ufunc = _min_max_ufunc(s.op, values.dtype)
            return ufunc.reduce(values, axis=axes)

    def _combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        op = self.statement.op
        with np.errstate(all="ignore"):
            if op == "+":
                return (a + b).astype(a.dtype)
            if op == "*":
                return (a * b).astype(a.dtype)
            return _min_max_ufunc(op, a.dtype)(a, b)

    def _lhs_slices(self, start: int = 0, stop: int | None = None) -> tuple:
        slices = []
        for axis, (_, lo, hi) in enumerate(self.bounds[: len(self.statement.indices)]):
            if axis == 0 and stop is not None:
                slices.append(slice(lo + start, lo + stop))
            else:
                slices.append(slice(lo, hi))
        return tuple(slices)

    def _store(self, values: np.ndarray, start: int) -> None:
        s = self.statement
        target = self.tensors[s.target]
        stop = start + (values.shape[0] if values.ndim else 1)
        region = self._lhs_slices(start, stop) if s.indices else ()
        if s.op == "=":
            target[region] = values
            return
        reduced = self._reduce(values)
        current = np.full(reduced.shape, identity(s.op, target.dtype), dtype=target.dtype) if s.init else target[region]
        target[region] = self._combine(current, reduced.astype(target.dtype))

    def _store_reduced(self, reduced: np.ndarray) -> None:
        """Store a reduction whose first axis was a reduction axis (chunks already combined)."""
        s = self.statement
        target = self.tensors[s.target]
        region = self._lhs_slices() if s.indices else ()
        current = np.full(reduced.shape, identity(s.op, target.dtype), dtype=target.dtype) if s.init else target[region]
        target[region] = self._combine(current, reduced.astype(target.dtype))


def _min_max_ufunc(op: str, dtype: np.dtype):
    if dtype.kind == "f":
        return np.fmin if op == "min" else np.fmax  # NaN-ignoring, like C's fmin/fmax
    return np.minimum if op == "min" else np.maximum


class _Evaluator:
    """Evaluates typed expressions over index grids.  ``mask`` is where the current value is
    actually used (the enclosing ternaries' guards); None means everywhere."""

    def __init__(self, run: _StatementRun, grids: dict[str, np.ndarray]):
        self.run = run
        self.grids = grids

    def affine(self, value: Affine) -> np.ndarray:
        env = dict(self.run.sizes)
        total: np.ndarray = np.asarray(value.constant, dtype=np.int64)
        for atom, coefficient in value.terms:
            if isinstance(atom, str) and atom in self.grids:
                total = total + coefficient * self.grids[atom]
            else:
                total = total + coefficient * Affine(((atom, 1),), 0).evaluate(env)
        return np.asarray(total, dtype=np.int64)

    def eval(self, expr: ir.TExpr, mask) -> np.ndarray:
        method = getattr(self, "eval_" + type(expr).__name__)
        return method(expr, mask)

    def eval_Const(self, expr: ir.Const, mask):
        return np.asarray(expr.value, dtype=expr.dtype)

    def eval_IndexValue(self, expr: ir.IndexValue, mask):
        return self.grids[expr.name]

    def eval_SizeValue(self, expr: ir.SizeValue, mask):
        return np.asarray(expr.value.evaluate(self.run.sizes), dtype=np.int64)

    def eval_Read(self, expr: ir.Read, mask):
        array = self.run.tensors[expr.tensor]
        if not expr.subscripts:
            return np.asarray(array[()], dtype=expr.dtype)
        subscripts = np.broadcast_arrays(
            *(self.affine(s) if isinstance(s, Affine) else self.eval(s, mask).astype(np.int64) for s in expr.subscripts)
        )
        clipped = []
        for dim, (subscript, extent) in enumerate(zip(subscripts, array.shape)):
            outside = (subscript < 0) | (subscript >= extent)
            if mask is not None:
                outside = outside & mask
            if np.any(outside):
                bad = int(subscript[np.broadcast_to(outside, subscript.shape)].flat[0])
                raise BoundsError(
                    f"{self.run.definition.name}: statement {self.run.statement.name} "
                    f"({self.run.statement.text}) reads {expr.tensor} at index {bad} along dimension {dim}, "
                    f"outside its extent {extent}",
                    expr.loc if expr.loc.line else None,
                    self.run.definition.source or None,
                )
            clipped.append(np.clip(subscript, 0, max(extent - 1, 0)))
        if any(extent == 0 for extent in array.shape):
            return np.zeros(clipped[0].shape, dtype=expr.dtype)  # nothing is read where the guard holds
        return array[tuple(clipped)]

    def eval_Unary(self, expr: ir.Unary, mask):
        value = self.eval(expr.operand, mask)
        if expr.op == "not":
            return np.logical_not(value)
        return np.negative(value).astype(expr.dtype)

    def eval_Binary(self, expr: ir.Binary, mask):
        op, dtype = expr.op, expr.dtype
        if op in ("&&", "||"):  # short-circuit: the right operand counts only where it is evaluated
            lhs = np.asarray(self.eval(expr.lhs, mask), dtype=bool)
            needed = lhs if op == "&&" else ~lhs
            rhs = self.eval(expr.rhs, needed if mask is None else (needed & mask))
            return np.logical_and(lhs, rhs) if op == "&&" else np.logical_or(lhs, rhs)
        lhs, rhs = self.eval(expr.lhs, mask), self.eval(expr.rhs, mask)
        comparisons = {
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
            "==": np.equal,
            "!=": np.not_equal,
        }
        if op in comparisons:
            return comparisons[op](lhs, rhs)
        if op == "+":
            return np.add(lhs, rhs, dtype=dtype)
        if op == "-":
            return np.subtract(lhs, rhs, dtype=dtype)
        if op == "*":
            return np.multiply(lhs, rhs, dtype=dtype)
        if dtype.kind == "f":
            return np.divide(lhs, rhs, dtype=dtype) if op == "/" else np.fmod(lhs, rhs, dtype=dtype)
        return _c_integer_division(lhs, rhs, dtype, op)

    def eval_Select(self, expr: ir.Select, mask):
        cond = np.asarray(self.eval(expr.cond, mask), dtype=bool)
        then_mask = cond if mask is None else (cond & mask)
        else_mask = ~cond if mask is None else (~cond & mask)
        then = self.eval(expr.then, then_mask)
        otherwise = self.eval(expr.otherwise, else_mask)
        return np.where(cond, then, otherwise).astype(expr.dtype)

    def eval_Call(self, expr: ir.Call, mask):
        args = [self.eval(a, mask) for a in expr.args]
        builtin = BUILTINS[expr.func]
        return np.asarray(builtin.numpy(*args)).astype(expr.dtype)

    def eval_Cast(self, expr: ir.Cast, mask):
        value = self.eval(expr.operand, mask)
        if expr.dtype.kind in "iu" and np.asarray(value).dtype.kind == "f":
            # In float64 every float16/32/64 value and both bounds are exact; in float32,
            # iinfo(int32).max would round up to 2**31 and let 2**31 through.
            value = np.trunc(np.nan_to_num(np.asarray(value, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0))
            info = np.iinfo(expr.dtype)
            upper = 2.0 ** (info.bits - 1 if expr.dtype.kind == "i" else info.bits)
            value = np.where((value < float(info.min)) | (value >= upper), 0, value)
        return np.asarray(value).astype(expr.dtype)


def _c_integer_division(lhs, rhs, dtype, op):
    """``/`` and ``%`` on integers as C defines them (truncation toward zero); x/0 and x%0 give 0."""
    lhs = np.asarray(lhs, dtype=dtype)
    rhs = np.asarray(rhs, dtype=dtype)
    zero = rhs == 0
    safe = np.where(zero, 1, rhs).astype(dtype)
    quotient = np.floor_divide(lhs, safe)
    remainder = lhs - quotient * safe
    if dtype.kind == "i":
        fix = (remainder != 0) & ((lhs < 0) != (safe < 0))
        quotient = np.where(fix, quotient + 1, quotient)
        remainder = lhs - quotient * safe
    result = quotient if op == "/" else remainder
    return np.where(zero, 0, result).astype(dtype)
