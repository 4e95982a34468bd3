"""From syntax tree to checked definitions: name resolution, typing and range inference.

``check_source(text)`` parses and checks every def; ``check_def`` checks one.  The result, a
:class:`~polyc.lang.checked.CheckedDef`, is what every later stage takes.

Range inference follows TC: ``where`` ranges are fixed first; then, repeatedly, every access
subscript in which exactly one index is still unknown is required to stay inside its tensor for
all values of the known indices, which bounds that index; the bounds found in one round are
intersected and the indices become known.  Accesses in a branch of a ternary are *guarded*: they
need to be in bounds only where their branch is taken (the static bounds check proves that
later), so they bound an index only when the unguarded accesses cannot: a round uses guarded
accesses only if no unguarded one bounds any index still unknown.  TC's
``O(n, i, m) = i == 0 ? A(m, n) : B(m, n) where i in 0:2`` so gets m and n from A and B, while
padding written as ``(h >= 1) ? I(h - 1) : 0`` leaves h the range an unguarded access or the
``where`` clause gives it.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, replace

import islpy as isl
import numpy as np

from polyc.errors import PolycError, PolycWarning, RangeInferenceError, SourceLocation, TCSemanticError
from polyc.lang import ast
from polyc.lang import checked as ir
from polyc.lang.builtins import BUILTINS
from polyc.lang.parser import parse
from polyc.lang.printer import format_expr, format_statement
from polyc.lang.symbolic import Affine, affine_arithmetic
from polyc.types import BOOL, FLOAT32, INT32, INT64, TC_TYPES, is_float, is_integer, promote

#: Assignment operator as written -> update operator of a reduction.
_REDUCTION_OPS = {"+=": "+", "*=": "*", "min=": "min", "max=": "max"}


def check_source(text: str, filename: str = "<tc>") -> list[ir.CheckedDef]:
    """Parse ``text`` and check every def in it, in source order."""
    source = parse(text, filename)
    return [check_def(d, text, filename) for d in source.defs]


def check_def(definition: ast.Def, text: str = "", filename: str = "<tc>") -> ir.CheckedDef:
    """Check one parsed def (``text`` is the whole source, used in error messages)."""
    try:
        return _DefChecker(definition, text, filename).run()
    except RecursionError:
        raise TCSemanticError(f"def '{definition.name}' is nested too deeply to check", definition.loc, text) from None
    except _ConstantOutOfRange as problem:
        message = (
            f"the constant {problem.value} does not fit in {problem.dtype.name}, the type it takes "
            f"here; cast the other operand to a wider type"
        )
        raise TCSemanticError(message, problem.loc or definition.loc, text) from None


class _ConstantOutOfRange(Exception):
    """Raised by :func:`convert` for a literal that the integer type it must take cannot hold."""

    def __init__(self, value, dtype: np.dtype, loc: SourceLocation | None):
        super().__init__(value, dtype, loc)
        self.value, self.dtype, self.loc = value, dtype, loc


@dataclass
class _Typed:
    """A typed expression during checking; ``weak`` marks literal-only expressions, whose type
    yields to the other operand's (``2 * x`` has x's type), as in C++ templates and numpy."""

    expr: ir.TExpr
    weak: bool = False
    loc: SourceLocation | None = None  # of a literal, for "does not fit" errors


@dataclass
class _Constraint:
    """``0 <= subscript < extent`` from one access, for range inference; ``guarded`` when the
    access is in a branch of a ternary."""

    subscript: Affine
    extent: Affine
    guarded: bool = False
    access: str = ""  # the access as written, e.g. "A(i + 1)"


class _DefChecker:
    def __init__(self, definition: ast.Def, text: str, filename: str):
        self.definition = definition
        self.text = text
        self.filename = filename
        self.tensors: dict[str, ir.Tensor] = {}
        #: Tensors whose shape polyc inferred from the ranges that write them (no shape written):
        #: a later write with a ``where`` range beyond the shape extends them.
        self.inferred_shapes: set[str] = set()
        self.declared_outputs: dict[str, ast.Param] = {}
        self.sizes: list[str] = []
        self.bindings: list[ir.SizeBinding] = []
        self.statements: list[ir.CheckedStatement] = []

    # ------------------------------------------------------------------ helpers
    def error(self, message: str, loc: SourceLocation | None, cls=TCSemanticError) -> PolycError:
        return cls(message, loc if loc and loc.line else self.definition.loc, self.text)

    def _bind_size(self, name: str, tensor: str, dim: int | None) -> None:
        if name not in self.sizes:
            self.sizes.append(name)
            self.bindings.append(ir.SizeBinding(name, tensor, dim))

    def _is_scalar_int_input(self, name: str) -> bool:
        t = self.tensors.get(name)
        return t is not None and t.role is ir.Role.INPUT and t.rank == 0 and is_integer(t.dtype)

    # ------------------------------------------------------------------ signature
    def run(self) -> ir.CheckedDef:
        d = self.definition
        for param in d.inputs:
            self._add_input(param)
        for param in d.outputs:
            self._add_output(param)
        loops: dict[int, ir.SequentialLoop] = {}
        for position, statement in enumerate(d.statements):
            loop = None
            if statement.loop is not None:
                loop = loops.get(statement.loop.number)
                if loop is None:
                    loop = loops[statement.loop.number] = self._loop(statement.loop, position)
            self.statements.append(_StatementChecker(self, statement, position, loop).run())
        for loop, block in ir.loop_blocks(self.statements):
            if loop is not None:
                self._check_loop(loop, block)
        for name, param in self.declared_outputs.items():
            if name not in self.tensors:
                raise self.error(f"output '{name}' is never written", param.loc)
        outputs = tuple(p.name for p in d.outputs)
        order = (
            [n for n in self.tensors if self.tensors[n].role is ir.Role.INPUT]
            + list(outputs)
            + [n for n in self.tensors if self.tensors[n].role is ir.Role.TEMPORARY]
        )
        return ir.CheckedDef(
            name=d.name,
            tensors=tuple(self.tensors[n] for n in order),
            inputs=tuple(p.name for p in d.inputs),
            outputs=outputs,
            sizes=tuple(self.sizes),
            size_bindings=tuple(self.bindings),
            statements=tuple(self.statements),
            source=self.text,
            loc=d.loc,
        )

    def _loop(self, loop: ast.SequentialLoop, position: int) -> ir.SequentialLoop:
        if loop.index in self.sizes or loop.index in self.tensors or loop.index in self.declared_outputs:
            raise self.error(f"'{loop.index}' names a size or tensor and cannot be the index of 'for'", loop.loc)
        bounds = ir.IndexRange(self.size_expression(loop.lo), self.size_expression(loop.hi))
        return ir.SequentialLoop(loop.index, bounds, position)

    def _check_loop(self, loop: ir.SequentialLoop, block: list[ir.CheckedStatement]) -> None:
        """That every read, in ``loop``'s block, of a tensor the block writes sees a value the
        steps so far wrote: at an earlier step (``t - c``, c a positive constant), or at this
        step after the statement writing it.  (The bounds proof then checks every access.)"""
        t = loop.index
        written: dict[str, int] = {}  # tensor -> the dimension the block writes it at t along
        for statement in block:
            dim = statement.indices.index(t)
            if written.setdefault(statement.target, dim) != dim:
                message = (
                    f"'{statement.target}' is written at '{t}' along two different dimensions in one 'for {t}' block"
                )
                raise self.error(message, statement.loc)
        for statement in block:
            for read, guarded in _reads_with_guard_flags(statement.rhs):
                if read.tensor not in written:
                    continue
                where = f"'{read.tensor}' is written by the 'for {t}' block"
                if not read.is_affine:
                    raise self.error(f"{where}, so it is read there only at affine subscripts", read.loc)
                offset = read.subscripts[written[read.tensor]] - Affine.var(t)
                if not offset.is_constant:
                    raise self.error(
                        f"{where}, so it is read there at '{t} - c' along dimension {written[read.tensor]}, c a "
                        f"constant, not at '{read.subscripts[written[read.tensor]]}'",
                        read.loc,
                    )
                steps_back = -offset.constant
                if steps_back < 0:
                    raise self.error(
                        f"{where} in increasing '{t}': reading it at '{t} + {-steps_back}' would see a later step, "
                        "not yet written",
                        read.loc,
                    )
                if steps_back == 0:
                    later = [w for w in block if w.target == read.tensor and w.position > statement.position]
                    if later:
                        raise self.error(
                            f"{where}: statement {later[0].name} writes it at step '{t}' after this statement reads "
                            f"it there; read it at an earlier step ('{t} - 1') or write it first",
                            read.loc,
                        )
                    continue
                first_read = loop.range.lo - steps_back
                if not guarded and first_read.is_constant and first_read.constant < 0:
                    raise self.error(
                        f"'{read.tensor}' is read at '{t} - {steps_back}', which at the first step ('{t}' = "
                        f"{loop.range.lo}) is {first_read.constant}, before the tensor's start; start the loop at "
                        f"{steps_back} or guard the read (as in '{t} >= {steps_back} ? ... : initial value')",
                        read.loc,
                    )

    def _check_new_name(self, name: str, loc: SourceLocation, what: str) -> None:
        if name in self.tensors or name in self.declared_outputs:
            raise self.error(f"{what} '{name}' is declared twice", loc)
        if name in self.sizes:
            raise self.error(f"{what} '{name}' has the name of a size", loc)
        if name in BUILTINS or name in TC_TYPES:
            raise self.error(f"{what} '{name}' has the name of a builtin", loc)

    def _add_input(self, param: ast.Param) -> None:
        self._check_new_name(param.name, param.loc, "input")
        if param.dtype is None:
            raise self.error(f"input '{param.name}' needs a type", param.loc)
        shape: list[Affine] = []
        for dim, size in enumerate(param.sizes or ()):
            if isinstance(size, ast.Number):
                if size.is_float or size.value < 0:
                    raise self.error(
                        f"size {size.value} of input '{param.name}' is not a non-negative integer", size.loc
                    )
                shape.append(Affine.const(int(size.value)))
            else:
                if size.name in self.tensors or size.name == param.name:
                    raise self.error(f"size '{size.name}' has the name of a tensor", size.loc)
                self._bind_size(size.name, param.name, dim)
                shape.append(Affine.var(size.name))
        self.tensors[param.name] = ir.Tensor(param.name, TC_TYPES[param.dtype], tuple(shape), ir.Role.INPUT, param.loc)

    def _add_output(self, param: ast.Param) -> None:
        self._check_new_name(param.name, param.loc, "output")
        self.declared_outputs[param.name] = param
        if param.sizes is None:
            return
        for size in param.sizes:
            if isinstance(size, ast.Name) and size.name not in self.sizes and not self._is_scalar_int_input(size.name):
                raise self.error(f"size '{size.name}' of output '{param.name}' is not a size of any input", size.loc)

    def declared_shape(self, name: str) -> tuple[Affine, ...] | None:
        """The shape written in the signature for output ``name``, if any."""
        param = self.declared_outputs[name]
        if param.sizes is None:
            return None
        return tuple(self.size_expression(s) for s in param.sizes)

    # ------------------------------------------------------------------ size expressions
    def size_expression(self, expr: ast.Expr) -> Affine:
        """An expression in sizes only (``where`` bounds, output shapes), as an Affine."""
        if isinstance(expr, ast.Number):
            if expr.is_float:
                raise self.error(f"'{expr.value}' is not an integer", expr.loc)
            return Affine.const(int(expr.value))
        if isinstance(expr, ast.Name):
            if expr.name in self.sizes:
                return Affine.var(expr.name)
            if self._is_scalar_int_input(expr.name):
                self._bind_size(expr.name, expr.name, None)
                return Affine.var(expr.name)
            raise self.error(
                f"'{expr.name}' is not a size (bounds must be written in the sizes of the inputs)", expr.loc
            )
        if isinstance(expr, ast.Extent):
            return self.extent(expr)
        if isinstance(expr, ast.Unary) and expr.op == "-":
            return -self.size_expression(expr.operand)
        if isinstance(expr, ast.Unary) and expr.op == "+":
            return self.size_expression(expr.operand)
        if isinstance(expr, ast.Binary) and expr.op in "+-":
            lhs, rhs = self.size_expression(expr.lhs), self.size_expression(expr.rhs)
            return lhs + rhs if expr.op == "+" else lhs - rhs
        if isinstance(expr, ast.Binary) and expr.op == "*":
            lhs, rhs = self.size_expression(expr.lhs), self.size_expression(expr.rhs)
            if lhs.is_constant:
                return rhs * lhs.constant
            if rhs.is_constant:
                return lhs * rhs.constant
            raise self.error("a product of two sizes is not affine", expr.loc)
        if isinstance(expr, ast.Binary) and expr.op == "/":
            lhs, rhs = self.size_expression(expr.lhs), self.size_expression(expr.rhs)
            if rhs.is_constant and rhs.constant > 0:
                return lhs.floordiv(rhs.constant)
            raise self.error("sizes can only be divided by a positive integer constant", expr.loc)
        raise self.error("this bound must be an affine expression in the sizes", getattr(expr, "loc", None))

    def extent(self, expr: ast.Extent) -> Affine:
        tensor = self.tensors.get(expr.tensor)
        if tensor is None:
            raise self.error(f"unknown tensor '{expr.tensor}' in '{expr.tensor}.{expr.dim}'", expr.loc)
        if not 0 <= expr.dim < tensor.rank:
            raise self.error(
                f"'{expr.tensor}' has {tensor.rank} dimension(s); '{expr.tensor}.{expr.dim}' does not exist", expr.loc
            )
        return tensor.shape[expr.dim]


class _StatementChecker:
    """Checks one statement in the context of the def's tensors so far."""

    def __init__(
        self, owner: _DefChecker, statement: ast.Statement, position: int, loop: ir.SequentialLoop | None = None
    ):
        self.owner = owner
        self.statement = statement
        self.position = position
        self.loop = loop
        self.indices: list[str] = list(statement.indices)
        self.constraints: list[_Constraint] = []
        self.lets: dict[str, ast.Expr] = {}

    def error(self, message: str, loc: SourceLocation | None, cls=TCSemanticError) -> PolycError:
        return self.owner.error(message, loc or self.statement.loc, cls)

    # ------------------------------------------------------------------ driver
    def run(self) -> ir.CheckedStatement:
        s, owner = self.statement, self.owner
        target = owner.tensors.get(s.target)
        self._check_target(target)
        where_ranges = self._collect_where()
        if self.loop is not None:
            self._enter_loop(where_ranges)
        rhs = self.type_expr(self.inline_lets(s.rhs), guarded=False)
        for clause in s.where:
            if isinstance(clause, ast.ExistsClause):
                self.type_expr(self.inline_lets(clause.access), guarded=False)
        target_shape = (
            target.shape
            if target is not None
            else owner.declared_shape(s.target)
            if s.target in owner.declared_outputs
            else None
        )
        if target_shape is not None:
            if len(target_shape) != len(s.indices):
                raise self.error(
                    f"'{s.target}' has {len(target_shape)} dimension(s) but is written with {len(s.indices)} index(es)",
                    s.loc,
                )
            extendable = s.target in owner.inferred_shapes
            for index, extent in zip(s.indices, target_shape):
                if extendable and index in where_ranges:
                    continue  # the where range wins, and the tensor grows to hold it (below)
                self.constraints.append(_Constraint(Affine.var(index), extent, access=f"the shape of '{s.target}'"))
        for index in where_ranges:
            if index not in self.indices:
                clause = next(c for c in s.where if isinstance(c, ast.RangeClause) and c.index == index)
                raise self.error(
                    f"where clause gives a range to '{index}', which the statement does not use", clause.loc
                )
        ranges = self.infer_ranges(where_ranges)
        reduction_indices = tuple(i for i in self.indices if i not in s.indices)
        op, init = self._normalise_op(reduction_indices)
        loop = self._check_self_reads(rhs.expr, reduction_indices, ranges)

        if target is None:
            self._warn_reduction_from_zero()
            declared = owner.declared_outputs.get(s.target)
            dtype = TC_TYPES[declared.dtype] if declared is not None and declared.dtype else self._result_dtype(rhs)
            shape = target_shape if target_shape is not None else tuple(ranges[i].hi for i in s.indices)
            role = ir.Role.OUTPUT if s.target in owner.declared_outputs else ir.Role.TEMPORARY
            loc = owner.declared_outputs[s.target].loc if role is ir.Role.OUTPUT else s.loc
            target = ir.Tensor(s.target, dtype, shape, role, loc)
            owner.tensors[s.target] = target
            if target_shape is None:
                owner.inferred_shapes.add(s.target)
        elif s.target in owner.inferred_shapes:
            # A tensor's extent is the largest upper bound of the ranges that write it.
            shape = tuple(_larger(extent, ranges[i].hi) for extent, i in zip(target.shape, s.indices))
            if shape != target.shape:
                target = replace(target, shape=shape)
                owner.tensors[s.target] = target
        return ir.CheckedStatement(
            position=self.position,
            target=s.target,
            indices=s.indices,
            reduction_indices=reduction_indices,
            ranges=tuple((i, ranges[i]) for i in self.indices),
            op=op,
            init=init,
            rhs=convert(rhs, target.dtype),
            loop=loop,
            text=_statement_text(owner.text, s),
            loc=s.loc,
        )

    def _warn_reduction_from_zero(self) -> None:
        """TC's warning: '*=', 'min=' or 'max=' without '!' as the first write of a tensor reduces
        into its starting value, zero (unless the caller passes it in outputs=): a product of
        zero, a min capped at 0."""
        s = self.statement
        if s.init or s.op not in ("*=", "min=", "max="):
            return
        message = (
            f"column {s.loc.col}: '{s.target}' is first written by '{_statement_text(self.owner.text, s)}', "
            f"whose '{s.op}' without '!' starts from {s.target}'s value before the statement: zero, unless "
            f"passed in outputs=; write '{s.op}!' to start from the identity of {s.op[:-1]}"
        )
        # Shown at the TC source's line, not at a line of polyc.
        warnings.warn_explicit(message, PolycWarning, s.loc.filename, s.loc.line)

    def _check_target(self, target: ir.Tensor | None) -> None:
        s, owner = self.statement, self.owner
        if target is not None and target.role is ir.Role.INPUT:
            raise self.error(f"'{s.target}' is an input; inputs are read-only", s.loc)
        if s.target in owner.sizes:
            raise self.error(f"'{s.target}' is a size and cannot be written", s.loc)
        if s.target in BUILTINS or s.target in TC_TYPES:
            raise self.error(f"'{s.target}' is a builtin and cannot be written", s.loc)
        seen: set[str] = set()
        for index, loc in zip(s.indices, s.index_locs or [s.loc] * len(s.indices)):
            if index in seen:
                raise self.error(f"index '{index}' appears twice on the left-hand side", loc)
            seen.add(index)
            if index in owner.sizes or index in owner.tensors or index in owner.declared_outputs:
                raise self.error(f"'{index}' names a size or tensor and cannot be an index", loc)

    def _collect_where(self) -> dict[str, ir.IndexRange]:
        ranges: dict[str, ir.IndexRange] = {}
        for clause in self.statement.where:
            if isinstance(clause, ast.RangeClause):
                if clause.index in ranges:
                    raise self.error(f"index '{clause.index}' is given two ranges", clause.loc)
                if clause.index in self.owner.sizes or clause.index in self.owner.tensors:
                    raise self.error(f"'{clause.index}' names a size or tensor, not an index", clause.loc)
                ranges[clause.index] = ir.IndexRange(
                    self.owner.size_expression(clause.lo), self.owner.size_expression(clause.hi)
                )
            elif isinstance(clause, ast.LetClause):
                if (
                    clause.name in self.lets
                    or clause.name in self.owner.tensors
                    or clause.name in self.owner.sizes
                    or clause.name in self.statement.indices
                ):
                    raise self.error(f"let name '{clause.name}' is already in use", clause.loc)
                self.lets[clause.name] = clause.value
        return ranges

    def _normalise_op(self, reduction_indices: tuple[str, ...]) -> tuple[str, bool]:
        s = self.statement
        if s.op == "=":
            if reduction_indices:
                names = ", ".join(f"'{i}'" for i in reduction_indices)
                raise self.error(
                    f"'=' cannot reduce over {names} (not on the left-hand side); "
                    f"use '+=!' (or another reduction) or add the index to the left",
                    self._first_use(reduction_indices[0]),
                )
            return "=", False
        if not reduction_indices and s.init:
            return "=", False
        return _REDUCTION_OPS[s.op], s.init

    def _enter_loop(self, where_ranges: dict[str, ir.IndexRange]) -> None:
        """The loop's index is a left-hand index, and the loop gives it its range."""
        s, loop = self.statement, self.loop
        assert loop is not None
        if loop.index not in s.indices:
            raise self.error(
                f"a statement in 'for {loop.index}' writes its target at '{loop.index}' (every step writes "
                f"its own elements); add '{loop.index}' to the left-hand side of '{s.target}'",
                s.loc,
            )
        if loop.index in where_ranges:
            clause = next(c for c in s.where if isinstance(c, ast.RangeClause) and c.index == loop.index)
            raise self.error(f"'for {loop.index}' gives '{loop.index}' its range; remove this where range", clause.loc)
        where_ranges[loop.index] = loop.range

    def _check_self_reads(
        self, rhs: ir.TExpr, reduction_indices: tuple[str, ...], ranges: dict[str, ir.IndexRange]
    ) -> ir.SequentialLoop | None:
        """Reads of the statement's own target: at its own element (not in a reduction), or at an
        earlier step of a recurrence.  Returns the statement's sequential loop: its ``for``
        block's, or a loop of its own over the one index along which it reads an earlier step."""
        s = self.statement
        own = tuple(Affine.var(i) for i in s.indices)
        time: int | None = s.indices.index(self.loop.index) if self.loop is not None else None
        for read in ir.reads(rhs):
            if read.tensor != s.target:
                continue
            if read.subscripts == own:
                if reduction_indices:
                    raise self.error(
                        f"a reduction cannot read its own target '{s.target}' at the element it reduces into; "
                        "reduce into a temporary first",
                        read.loc,
                    )
                continue
            hint = (
                "; a statement reads its own target at its own element, or at an earlier step along one index "
                f"(as in '{s.target}(t - 1, ...)' with 't' on the left), else write the result to a temporary"
            )
            if not read.is_affine:
                raise self.error(f"'{s.target}' is read at a data-dependent element{hint}", read.loc)
            subscripts = [sub for sub in read.subscripts if isinstance(sub, Affine)]
            stepped = [d for d, (sub, mine) in enumerate(zip(subscripts, own)) if sub != mine]
            if time is None:
                along = [d for d in stepped if (subscripts[d] - own[d]).is_constant]
                if len(along) > 1:
                    names = " and ".join(f"'{s.indices[d]}'" for d in along)
                    raise self.error(
                        f"'{s.target}' is read at other steps along {names}; a recurrence steps along one index",
                        read.loc,
                    )
                if not along and len(stepped) != 1:
                    raise self.error(f"'{s.target}' is read at other indices than it is written{hint}", read.loc)
                time = along[0] if along else stepped[0]
            offset = subscripts[time] - own[time]
            index = s.indices[time]
            if not offset.is_constant:
                raise self.error(
                    f"'{s.target}' is read at '{read.subscripts[time]}' along '{index}': a recurrence reads an "
                    f"earlier step at a constant offset ('{index} - 1', '{index} - 2', ...)",
                    read.loc,
                )
            if offset.constant > 0:
                raise self.error(
                    f"'{s.target}' is read at '{index} + {offset.constant}', a later step along '{index}', which "
                    f"runs in increasing '{index}': that element is not yet written",
                    read.loc,
                )
            if offset.constant == 0:
                raise self.error(
                    f"'{s.target}' is read at this step of '{index}' at other indices than it is written{hint}",
                    read.loc,
                )
        if self.loop is not None or time is None:
            return self.loop
        return ir.SequentialLoop(s.indices[time], ranges[s.indices[time]], self.position)

    @staticmethod
    def _result_dtype(rhs: _Typed) -> np.dtype:
        if rhs.weak:  # literals only: float32, int32, or int64 for a constant int32 cannot hold
            return FLOAT32 if is_float(rhs.expr.dtype) else INT64 if rhs.expr.dtype == INT64 else INT32
        return rhs.expr.dtype

    # ------------------------------------------------------------------ lets
    def inline_lets(self, expr: ast.Expr, active: tuple[str, ...] = ()) -> ast.Expr:
        """Replace let names by their (inlined) definitions."""
        if not self.lets:
            return expr
        if isinstance(expr, ast.Name) and expr.name in self.lets:
            if expr.name in active:
                raise self.error(f"let '{expr.name}' is defined in terms of itself", expr.loc)
            return self.inline_lets(self.lets[expr.name], active + (expr.name,))
        if isinstance(expr, ast.Access):
            return ast.Access(expr.tensor, tuple(self.inline_lets(a, active) for a in expr.args), expr.loc)
        if isinstance(expr, ast.Call):
            return ast.Call(expr.func, tuple(self.inline_lets(a, active) for a in expr.args), expr.loc)
        if isinstance(expr, ast.Unary):
            return ast.Unary(expr.op, self.inline_lets(expr.operand, active), expr.loc)
        if isinstance(expr, ast.Binary):
            return ast.Binary(expr.op, self.inline_lets(expr.lhs, active), self.inline_lets(expr.rhs, active), expr.loc)
        if isinstance(expr, ast.Ternary):
            return ast.Ternary(
                self.inline_lets(expr.cond, active),
                self.inline_lets(expr.then, active),
                self.inline_lets(expr.otherwise, active),
                expr.loc,
            )
        return expr

    # ------------------------------------------------------------------ names
    def _classify(self, name: str) -> str:
        owner = self.owner
        if name in owner.tensors:
            return "tensor"
        if name in owner.declared_outputs:
            return "unwritten"
        if name in owner.sizes:
            return "size"
        return "index"

    def _use_index(self, name: str) -> None:
        if name not in self.indices:
            self.indices.append(name)

    # ------------------------------------------------------------------ subscripts
    def affine_subscript(self, expr: ast.Expr) -> Affine | None:
        """``expr`` as an Affine in indices and sizes, or None when it is not affine."""
        if isinstance(expr, ast.Number):
            return Affine.const(int(expr.value)) if not expr.is_float else None
        if isinstance(expr, ast.Name):
            kind = self._classify(expr.name)
            if kind == "size":
                return Affine.var(expr.name)
            if kind == "index":
                self._use_index(expr.name)
                return Affine.var(expr.name)
            return None
        if isinstance(expr, ast.Extent):
            return self.owner.extent(expr)
        if isinstance(expr, ast.Unary) and expr.op in "+-":
            inner = self.affine_subscript(expr.operand)
            return None if inner is None else (inner if expr.op == "+" else -inner)
        if isinstance(expr, ast.Binary) and expr.op in ("+", "-", "*"):
            return affine_arithmetic(expr.op, self.affine_subscript(expr.lhs), self.affine_subscript(expr.rhs))
        return None

    # ------------------------------------------------------------------ typing
    def type_expr(self, expr: ast.Expr, guarded: bool) -> _Typed:
        if isinstance(expr, ast.Number):
            if expr.is_float:
                return _Typed(ir.Const(FLOAT32, float(expr.value)), weak=True, loc=expr.loc)
            dtype = INT32 if -(2**31) <= expr.value < 2**31 else INT64
            if expr.value >= 2**63:
                raise self.error(f"the integer constant {expr.value} does not fit in int64", expr.loc)
            return _Typed(ir.Const(dtype, int(expr.value)), weak=True, loc=expr.loc)
        if isinstance(expr, ast.Name):
            return self._type_name(expr)
        if isinstance(expr, ast.Extent):
            return _Typed(ir.SizeValue(INT64, self.owner.extent(expr)))
        if isinstance(expr, ast.Access):
            return self._type_access(expr, guarded)
        if isinstance(expr, ast.Call):
            return self._type_call(expr, guarded)
        if isinstance(expr, ast.Unary):
            return self._type_unary(expr, guarded)
        if isinstance(expr, ast.Binary):
            return self._type_binary(expr, guarded)
        if isinstance(expr, ast.Ternary):
            cond = self.type_expr(expr.cond, guarded)
            then = self.type_expr(expr.then, True)
            otherwise = self.type_expr(expr.otherwise, True)
            dtype, weak = unify(then, otherwise)
            return _Typed(ir.Select(dtype, convert(cond, BOOL), convert(then, dtype), convert(otherwise, dtype)), weak)
        raise self.error(f"unexpected expression {type(expr).__name__}", getattr(expr, "loc", None))

    def _type_name(self, expr: ast.Name) -> _Typed:
        kind = self._classify(expr.name)
        if kind == "tensor":
            tensor = self.owner.tensors[expr.name]
            if tensor.rank != 0:
                raise self.error(f"tensor '{expr.name}' has {tensor.rank} dimension(s) and needs subscripts", expr.loc)
            return _Typed(ir.Read(tensor.dtype, expr.name, (), expr.loc))
        if kind == "unwritten":
            raise self.error(f"'{expr.name}' is read before any statement writes it", expr.loc)
        if kind == "size":
            return _Typed(ir.SizeValue(INT64, Affine.var(expr.name)))
        self._use_index(expr.name)
        return _Typed(ir.IndexValue(INT64, expr.name))

    def _type_access(self, expr: ast.Access, guarded: bool) -> _Typed:
        kind = self._classify(expr.tensor)
        declared = self.owner.declared_outputs.get(expr.tensor)
        if (
            kind == "unwritten"
            and (self.loop is not None or expr.tensor == self.statement.target)
            and declared is not None
            and declared.dtype is not None
            and declared.sizes is not None
        ):
            # A recurrence reads its state before the statement that writes it: an output
            # declared with its type and sizes can be read then (sema's loop check proves that
            # the read is of an earlier step).
            tensor = ir.Tensor(
                expr.tensor,
                TC_TYPES[declared.dtype],
                self.owner.declared_shape(expr.tensor) or (),
                ir.Role.OUTPUT,
                declared.loc,
            )
            return self._typed_read(expr, tensor, guarded)
        if kind == "unwritten" and (self.loop is not None or expr.tensor == self.statement.target):
            raise self.error(
                f"'{expr.tensor}' is read before any statement writes it; a recurrence may read its state "
                f"first only when it is an output declared with its type and sizes (as in 'float(T, N) "
                f"{expr.tensor}'), or written before",
                expr.loc,
            )
        if kind == "unwritten" or (
            kind == "index" and any(later.target == expr.tensor for later in self.owner.definition.statements)
        ):
            raise self.error(f"'{expr.tensor}' is read before any statement writes it", expr.loc)
        if kind != "tensor":
            what = "a size" if kind == "size" else "not a tensor, builtin or type"
            known = [*self.owner.tensors, *BUILTINS, *TC_TYPES]
            close = difflib.get_close_matches(expr.tensor, known, n=1) if kind != "size" else []
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise self.error(f"unknown tensor '{expr.tensor}' ({what}){hint}", expr.loc)
        return self._typed_read(expr, self.owner.tensors[expr.tensor], guarded)

    def _typed_read(self, expr: ast.Access, tensor: ir.Tensor, guarded: bool) -> _Typed:
        if len(expr.args) != tensor.rank:
            raise self.error(
                f"'{expr.tensor}' has {tensor.rank} dimension(s) but is accessed with {len(expr.args)} subscript(s)",
                expr.loc,
            )
        subscripts: list[ir.Subscript] = []
        for arg, extent in zip(expr.args, tensor.shape):
            affine = self.affine_subscript(arg)
            if affine is not None:
                subscripts.append(affine)
                self.constraints.append(_Constraint(affine, extent, guarded, format_expr(expr)))
                continue
            value = self.type_expr(arg, guarded)
            if not (is_integer(value.expr.dtype) or value.expr.dtype == BOOL):
                raise self.error(
                    f"subscript of '{expr.tensor}' has type {value.expr.dtype.name}; subscripts must be integers",
                    getattr(arg, "loc", expr.loc),
                )
            subscripts.append(convert(value, INT64))
        return _Typed(ir.Read(tensor.dtype, expr.tensor, tuple(subscripts), expr.loc))

    def _type_call(self, expr: ast.Call, guarded: bool) -> _Typed:
        args = [self.type_expr(a, guarded) for a in expr.args]
        if expr.func in TC_TYPES:
            if len(args) != 1:
                raise self.error(f"cast to {expr.func} takes 1 argument, not {len(args)}", expr.loc)
            return _Typed(convert(args[0], TC_TYPES[expr.func]))
        builtin = BUILTINS[expr.func]
        if len(args) != builtin.arity:
            raise self.error(f"{expr.func} takes {builtin.arity} argument(s), not {len(args)}", expr.loc)
        dtype, weak = unify(*args)
        if builtin.integer_only and is_float(dtype):
            raise self.error(f"{expr.func} takes integers, not {dtype}", expr.loc)
        if builtin.float_only and not is_float(dtype):
            dtype = FLOAT32
        elif dtype == BOOL:
            dtype = INT32
        return _Typed(ir.Call(dtype, expr.func, tuple(convert(a, dtype) for a in args)), weak)

    def _type_unary(self, expr: ast.Unary, guarded: bool) -> _Typed:
        operand = self.type_expr(expr.operand, guarded)
        if expr.op == "!":
            return _Typed(ir.Unary(BOOL, "not", convert(operand, BOOL)), operand.weak)
        if expr.op == "+":
            return operand
        dtype = INT32 if operand.expr.dtype == BOOL else operand.expr.dtype
        if isinstance(operand.expr, ir.Const):
            return _Typed(ir.Const(dtype, -operand.expr.value), operand.weak, loc=expr.loc)
        return _Typed(ir.Unary(dtype, "neg", convert(operand, dtype)), operand.weak)

    def _type_binary(self, expr: ast.Binary, guarded: bool) -> _Typed:
        # Only ternary branches are exempt from range inference (TC's rule); the short-circuit
        # guard of && and || is taken into account by the bounds check and the evaluators.
        lhs, rhs = self.type_expr(expr.lhs, guarded), self.type_expr(expr.rhs, guarded)
        if expr.op in ("&&", "||"):
            return _Typed(ir.Binary(BOOL, expr.op, convert(lhs, BOOL), convert(rhs, BOOL)), lhs.weak and rhs.weak)
        dtype, weak = unify(lhs, rhs)
        if expr.op in ("<", "<=", ">", ">=", "==", "!="):
            return _Typed(ir.Binary(BOOL, expr.op, convert(lhs, dtype), convert(rhs, dtype)), weak)
        if dtype == BOOL:
            dtype = INT32
        return _Typed(ir.Binary(dtype, expr.op, convert(lhs, dtype), convert(rhs, dtype)), weak)

    # ------------------------------------------------------------------ range inference
    def infer_ranges(self, fixed: dict[str, ir.IndexRange]) -> dict[str, ir.IndexRange]:
        known = dict(fixed)
        unknown = [i for i in self.indices if i not in known]
        unguarded = [c for c in self.constraints if not c.guarded]
        guarded = [c for c in self.constraints if c.guarded]
        while unknown:
            bounds = self._bounds_from(unguarded, known, unknown) or self._bounds_from(guarded, known, unknown)
            if not bounds:
                break
            for index, (lows, highs, accesses) in bounds.items():
                lo, hi = lows[0], highs[0]
                for other in lows[1:]:
                    lo = lo.maximum(other)
                for other in highs[1:]:
                    hi = hi.minimum(other)
                known[index] = ir.IndexRange(lo, hi, tuple(dict.fromkeys(accesses)))
                unknown.remove(index)
        if unknown:
            index = unknown[0]
            raise self.error(
                f"cannot infer the range of index '{index}': no access bounds it on its own; "
                f"add 'where {index} in LO:HI' (or, if '{index}' is not meant to be an index, it is an "
                f"unknown name)",
                self._first_use(index),
                RangeInferenceError,
            )
        return known

    @staticmethod
    def _bounds_from(
        constraints: list[_Constraint], known: dict[str, ir.IndexRange], unknown: list[str]
    ) -> dict[str, tuple[list[Affine], list[Affine], list[str]]]:
        """One round of inference: index -> (lower bounds, upper bounds, the accesses giving them)
        from every constraint in which exactly one index is still unknown, for all values of the
        known ones."""
        bounds: dict[str, tuple[list[Affine], list[Affine], list[str]]] = {}
        inclusive = {i: (r.lo, r.hi - 1) for i, r in known.items()}
        for constraint in constraints:
            free = [n for n in constraint.subscript.names() if n in unknown]
            if len(free) != 1:
                continue
            index = free[0]
            coefficient = constraint.subscript.coefficient(index)
            if coefficient == 0:
                continue  # the index only occurs inside floor/min/max: not a usable bound
            rest = constraint.subscript - Affine.var(index) * coefficient
            rest_min, rest_max = rest.bounds(inclusive)
            if coefficient > 0:
                lo = (-rest_min).ceildiv(coefficient)
                hi = (constraint.extent - 1 - rest_max).floordiv(coefficient) + 1
            else:
                lo = (rest_max - constraint.extent + 1).ceildiv(-coefficient)
                hi = rest_min.floordiv(-coefficient) + 1
            lows, highs, accesses = bounds.setdefault(index, ([], [], []))
            lows.append(lo)
            highs.append(hi)
            accesses.append(constraint.access)
        return bounds

    def _first_use(self, index: str) -> SourceLocation:
        s = self.statement
        for name, loc in zip(s.indices, s.index_locs):
            if name == index:
                return loc
        for node in _walk_ast(s.rhs):
            if isinstance(node, ast.Name) and node.name == index:
                return node.loc
        return s.loc


# ----------------------------------------------------------------------------- typing helpers
def unify(*operands: _Typed) -> tuple[np.dtype, bool]:
    """The common type of operands and whether the result is still weak (literal-only)."""
    strong = [o.expr.dtype for o in operands if not o.weak]
    weak = [o.expr.dtype for o in operands if o.weak]
    any_weak_float = any(is_float(d) for d in weak)
    if not strong:
        return (FLOAT32 if any_weak_float else INT32 if all(d == INT32 for d in weak) else INT64), True
    dtype = strong[0]
    for other in strong[1:]:
        dtype = promote(dtype, other)
    if any_weak_float and not is_float(dtype):
        dtype = FLOAT32
    elif weak and dtype == BOOL:
        dtype = INT32
    return dtype, False


def convert(value: _Typed | ir.TExpr, dtype: np.dtype) -> ir.TExpr:
    """``value`` converted to ``dtype`` (literals are folded; other values get a Cast)."""
    expr = value.expr if isinstance(value, _Typed) else value
    if expr.dtype == dtype:
        return expr
    if isinstance(expr, ir.Const):
        if is_integer(dtype) and not _fits(expr.value, dtype):
            raise _ConstantOutOfRange(expr.value, dtype, value.loc if isinstance(value, _Typed) else None)
        return ir.Const(dtype, dtype.type(expr.value).item())
    return ir.Cast(dtype, expr)


def _fits(value: int | float | bool, dtype: np.dtype) -> bool:
    """Whether ``value`` converts to the integer type ``dtype`` (truncating, as C does) without overflow."""
    if isinstance(value, float) and not np.isfinite(value):
        return False
    info = np.iinfo(dtype)
    return info.min <= int(value) <= info.max


def _reads_with_guard_flags(expr: ir.TExpr, guarded: bool = False):
    """Every Read in ``expr`` and whether it is guarded: in a branch of a ternary, or the right
    operand of ``&&``/``||`` (evaluated only when the left one has not decided)."""
    if isinstance(expr, ir.Read):
        yield expr, guarded
        children: tuple = tuple(s for s in expr.subscripts if isinstance(s, ir.TExpr))
        flags: tuple = (guarded,) * len(children)
    elif isinstance(expr, ir.Select):
        children, flags = (expr.cond, expr.then, expr.otherwise), (guarded, True, True)
    elif isinstance(expr, ir.Binary):
        children, flags = (expr.lhs, expr.rhs), (guarded, guarded or expr.op in ("&&", "||"))
    elif isinstance(expr, ir.Unary) or isinstance(expr, ir.Cast):
        children, flags = (expr.operand,), (guarded,)
    elif isinstance(expr, ir.Call):
        children, flags = expr.args, (guarded,) * len(expr.args)
    else:
        children, flags = (), ()
    for child, flag in zip(children, flags):
        yield from _reads_with_guard_flags(child, flag)


def _walk_ast(expr: ast.Expr):
    yield expr
    children: tuple = ()
    if isinstance(expr, (ast.Access, ast.Call)):
        children = expr.args
    elif isinstance(expr, ast.Unary):
        children = (expr.operand,)
    elif isinstance(expr, ast.Binary):
        children = (expr.lhs, expr.rhs)
    elif isinstance(expr, ast.Ternary):
        children = (expr.cond, expr.then, expr.otherwise)
    for child in children:
        yield from _walk_ast(child)


def _larger(extent: Affine, bound: Affine) -> Affine:
    """The larger of two extents: the one known to be larger when they differ by a constant, the
    extent when ``bound`` cannot exceed it wherever it holds an element (:func:`_within`), else
    their maximum."""
    difference = bound - extent
    if difference.is_constant:
        return bound if difference.constant > 0 else extent
    if _within(bound, extent):
        return extent
    return extent.maximum(bound)


def _within(bound: Affine, extent: Affine) -> bool:
    """Whether ``bound <= extent`` at every size (sizes are non-negative) where ``extent`` is at
    least 1: a later write of part of a tensor (``where h in 0:1``) does not grow it, and keeps
    its shape an affine expression that the kernel paths recognise; a write that can reach
    beyond it (``where i in 1:N`` after ``0:1``) does."""
    names = sorted(bound.names() | extent.names())
    conditions = [f"{name} >= 0" for name in names] + [f"{extent} >= 1", f"{bound} > {extent}"]
    try:
        beyond = isl.Set(f"[{', '.join(names)}] -> {{ : {' and '.join(conditions)} }}")
    except isl.Error:
        return False
    return beyond.is_empty()


def _statement_text(text: str, statement: ast.Statement) -> str:
    """The statement in canonical TC form, for comments and summaries."""
    return format_statement(statement)
