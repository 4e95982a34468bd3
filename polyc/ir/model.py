"""The polyhedral model of a checked definition, in isl.

Every statement becomes a named integer set over its indices with the sizes as parameters; its
reads and writes become maps from that set to tensor elements.  A reduction with ``!`` becomes
two statements: ``S<n>_init`` sets the target to the operator's identity over the left-hand
indices, ``S<n>`` combines every right-hand value into it.  The source order of statements (and,
within one, the order of its indices) is the initial schedule.

    >>> program = build_program(check_source('''def mm(float(M,K) A, float(K,N) B) -> (C) {
    ...     C(m, n) +=! A(m, r_k) * B(r_k, n) }''')[0])
    >>> print(program.statement("S0").domain)
    [M, K, N] -> { S0[m, n, r_k] : 0 <= m < M and 0 <= n < N and 0 <= r_k < K }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import islpy as isl

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine, affine_arithmetic

#: Words isl's parser reserves; a TC name equal to one is renamed in isl text.
_ISL_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "not",
        "exists",
        "implies",
        "mod",
        "floor",
        "ceil",
        "min",
        "max",
        "infty",
        "NaN",
        "true",
        "false",
        "rat",
        "int",
        "domain",
        "range",
        "params",
    }
)


def isl_name(name: str) -> str:
    """``name`` as used in isl text (TC names that isl reserves get a trailing underscore)."""
    return name + "_" if name in _ISL_KEYWORDS else name


def isl_affine(value: Affine) -> str:
    return value.substitute({n: Affine.var(isl_name(n)) for n in value.names() if n in _ISL_KEYWORDS}).to_isl()


@dataclass(frozen=True)
class Access:
    """One access of a statement.  ``relation`` maps statement instances to tensor elements;
    ``exact`` is False when a data-dependent subscript made it a may-access over a whole
    dimension.  ``guard`` is the set of instances where the access is actually performed
    (its enclosing ternaries' affine conditions); ``read`` is the typed node, None for the
    implicit read of a reduction's accumulator."""

    tensor: str
    relation: isl.Map
    exact: bool
    guard: isl.Set
    read: ir.Read | None = None


@dataclass(frozen=True)
class PolyStatement:
    """A statement of the polyhedral program.

    ``kind`` is ``init`` (target = identity), ``update`` (target = target op value, once per
    reduction point) or ``assign`` (target = value).
    """

    name: str
    kind: str
    source: ir.CheckedStatement
    indices: tuple[str, ...]
    domain: isl.Set
    write: isl.Map
    reads: tuple[Access, ...]

    @property
    def loop(self) -> ir.SequentialLoop | None:
        """The sequential loop of its source statement, if any."""
        return self.source.loop


@dataclass(frozen=True)
class PolyProgram:
    """All statements of a def with their domains, accesses and source-order schedule.

    ``context`` constrains the sizes: non-negative, every tensor extent non-negative, and fixed
    to concrete values when the program is specialised.
    """

    definition: ir.CheckedDef
    ctx: isl.Context = field(repr=False)
    params: tuple[str, ...]
    context: isl.Set
    statements: tuple[PolyStatement, ...]
    size_values: Mapping[str, int] | None = None

    def statement(self, name: str) -> PolyStatement:
        """The statement called ``name``."""
        return self._statements_by_name[name]

    @cached_property
    def _statements_by_name(self) -> dict[str, PolyStatement]:
        return {s.name: s for s in reversed(self.statements)}

    @property
    def domain(self) -> isl.UnionSet:
        result = isl.UnionSet.empty(self.context.get_space())
        for s in self.statements:
            result = result.union(isl.UnionSet.from_set(s.domain))
        return result

    @property
    def writes(self) -> isl.UnionMap:
        return _union_maps(self, (s.write for s in self.statements))

    @property
    def reads(self) -> isl.UnionMap:
        return _union_maps(self, (a.relation for s in self.statements for a in s.reads))

    @property
    def exact_reads(self) -> isl.UnionMap:
        return _union_maps(self, (a.relation for s in self.statements for a in s.reads if a.exact))

    def initial_schedule(self) -> isl.Schedule:
        """The order TC's semantics runs instances in, which dependences are computed against.

        Statements in source order; within a statement its indices in order, outermost first.
        The statements of a sequential loop share it as their outermost loop: ``[block, t,
        position in the block, the other indices...]``, so step t runs each of them before step
        t + 1 starts.
        """
        blocks = ir.loop_blocks(self.statements)
        depth = max((len(s.indices) + (s.source.loop is not None) for s in self.statements), default=0)
        pieces = []
        for ordinal, (loop, block) in enumerate(blocks):
            for position, s in enumerate(block):
                if loop is None:
                    dims = [str(ordinal), *_isl_dims(s.indices)]
                else:
                    others = [i for i in s.indices if i != loop.index]
                    dims = [str(ordinal), isl_name(loop.index), str(position), *_isl_dims(others)]
                dims += ["0"] * (depth + 1 - len(dims))
                pieces.append(f"{s.name}[{', '.join(_isl_dims(s.indices))}] -> [{', '.join(dims)}]")
        text = f"{self._params_text()} -> {{ {'; '.join(pieces)} }}"
        schedule_map = isl.UnionMap.read_from_str(self.ctx, text)
        return isl.Schedule.from_domain(self.domain).insert_partial_schedule(
            isl.MultiUnionPwAff.from_union_map(schedule_map)
        )

    def _params_text(self) -> str:
        return "[" + ", ".join(isl_name(p) for p in self.params) + "]"

    def to_isl_text(self) -> str:
        """Every statement's domain, write and reads as isl strings: the model as a reader sees it."""
        lines = [f"context: {self.context}"]
        for s in self.statements:
            lines.append(f"{s.name} ({s.kind}): {s.source.text}")
            lines.append(f"  domain: {s.domain.gist_params(self.context)}")
            lines.append(f"  write:  {s.write.gist_domain(s.domain)}")
            for access in s.reads:
                tags = [] if access.exact else ["may"]
                if not access.guard.plain_is_universe():
                    tags.append(f"guard {access.guard.gist(s.domain)}")
                relation = access.relation.gist_domain(s.domain)
                lines.append(f"  read:   {relation}" + (f"  ({'; '.join(tags)})" if tags else ""))
        return "\n".join(lines)


def _isl_dims(indices) -> tuple[str, ...]:
    return tuple(isl_name(i) for i in indices)


def _union_maps(program: PolyProgram, maps) -> isl.UnionMap:
    result = isl.UnionMap.empty(program.context.get_space())
    for m in maps:
        result = result.union(isl.UnionMap.from_map(m))
    return result


def build_program(
    definition: ir.CheckedDef, size_values: Mapping[str, int] | None = None, ctx: isl.Context | None = None
) -> PolyProgram:
    """The polyhedral program of ``definition``; with ``size_values`` it is specialised to them."""
    return _ProgramBuilder(definition, size_values, ctx or isl.Context()).build()


class _ProgramBuilder:
    def __init__(self, definition: ir.CheckedDef, size_values, ctx: isl.Context):
        self.definition = definition
        self.size_values = dict(size_values) if size_values is not None else None
        self.ctx = ctx
        self.params = definition.sizes
        self.params_text = "[" + ", ".join(isl_name(p) for p in self.params) + "]"

    def build(self) -> PolyProgram:
        self.context = self._context()  # parsed once: every statement's domain is intersected with it
        statements: list[PolyStatement] = []
        for s in self.definition.statements:
            if s.has_init_statement:
                statements.append(self._statement(s, f"{s.name}_init", "init", s.indices))
            statements.append(self._statement(s, s.name, "assign" if s.op == "=" else "update", s.all_indices))
        return PolyProgram(self.definition, self.ctx, self.params, self.context, tuple(statements), self.size_values)

    def _context(self) -> isl.Set:
        constraints = [f"{isl_name(p)} >= 0" for p in self.params]
        for tensor in self.definition.tensors:
            constraints += [f"{isl_affine(extent)} >= 0" for extent in tensor.shape if not extent.is_constant]
        if self.size_values is not None:
            constraints += [f"{isl_name(p)} = {self.size_values[p]}" for p in self.params]
        text = f"{self.params_text} -> {{ : {' and '.join(constraints) or 'true'} }}"
        return isl.Set.read_from_str(self.ctx, text)

    def _set(self, name: str, indices, constraints) -> isl.Set:
        body = " and ".join(constraints) or "true"
        return isl.Set.read_from_str(
            self.ctx, f"{self.params_text} -> {{ {name}[{', '.join(_isl_dims(indices))}] : {body} }}"
        )

    def _statement(self, source: ir.CheckedStatement, name: str, kind: str, indices) -> PolyStatement:
        bounds = []
        for index in indices:
            r = source.range_of(index)
            bounds.append(f"{isl_affine(r.lo)} <= {isl_name(index)} < {isl_affine(r.hi)}")
        domain = self._set(name, indices, bounds).intersect_params(self.context)
        dims = ", ".join(_isl_dims(indices))
        lhs = ", ".join(_isl_dims(source.indices))
        write = isl.Map.read_from_str(self.ctx, f"{self.params_text} -> {{ {name}[{dims}] -> {source.target}[{lhs}] }}")
        write = write.intersect_domain(domain)
        universe = isl.Set.universe(domain.get_space())
        reads: list[Access] = []
        if kind == "update":  # the accumulator is read as well as written
            reads.append(Access(source.target, write, True, universe))
        if kind != "init":
            for read, guard_text in _reads_with_guards(source.rhs):
                relation, exact = self._access_relation(name, indices, read)
                guard = self._set(name, indices, [guard_text]) if guard_text else universe
                reads.append(Access(read.tensor, relation.intersect_domain(domain), exact, guard, read))
        return PolyStatement(name, kind, source, tuple(indices), domain, write, tuple(reads))

    def _access_relation(self, name: str, indices, read: ir.Read) -> tuple[isl.Map, bool]:
        tensor = self.definition.tensor(read.tensor)
        outputs, constraints, exact = [], [], True
        for dim, (subscript, extent) in enumerate(zip(read.subscripts, tensor.shape)):
            if isinstance(subscript, Affine):
                outputs.append(isl_affine(subscript))
            else:  # data-dependent: may touch any element along this dimension
                exact = False
                outputs.append(f"polyc_any{dim}")
                constraints.append(f"0 <= polyc_any{dim} < {isl_affine(extent)}")
        where = f" : {' and '.join(constraints)}" if constraints else ""
        # Data-dependent dimensions are range variables constrained only by the extent.
        text = (
            f"{self.params_text} -> {{ {name}[{', '.join(_isl_dims(indices))}] -> "
            f"{read.tensor}[{', '.join(outputs)}]{where} }}"
        )
        return isl.Map.read_from_str(self.ctx, text), exact


# ----------------------------------------------------------------------------- guards
def affine_value(expr: ir.TExpr) -> Affine | None:
    """``expr`` as an Affine in indices and sizes when it is one (integer index arithmetic)."""
    if isinstance(expr, ir.Const) and isinstance(expr.value, (int, bool)) and expr.dtype.kind in "iub":
        return Affine.const(int(expr.value))
    if isinstance(expr, ir.IndexValue):
        return Affine.var(expr.name)
    if isinstance(expr, ir.SizeValue):
        return expr.value
    if isinstance(expr, ir.Cast) and expr.dtype.kind in "i" and expr.operand.dtype.kind in "iu":
        return affine_value(expr.operand)
    if isinstance(expr, ir.Unary) and expr.op == "neg":
        inner = affine_value(expr.operand)
        return None if inner is None else -inner
    if isinstance(expr, ir.Binary) and expr.op in ("+", "-", "*") and expr.dtype.kind in "iu":
        return affine_arithmetic(expr.op, affine_value(expr.lhs), affine_value(expr.rhs))
    return None


def affine_condition(expr: ir.TExpr) -> str | None:
    """isl text of a condition made of affine comparisons joined by && || !, else None."""
    if isinstance(expr, ir.Binary) and expr.op in ("<", "<=", ">", ">=", "==", "!="):
        lhs, rhs = affine_value(expr.lhs), affine_value(expr.rhs)
        if lhs is None or rhs is None:
            return None
        op = {"==": "=", "!=": "!="}.get(expr.op, expr.op)
        if op == "!=":
            return f"({isl_affine(lhs)} < {isl_affine(rhs)} or {isl_affine(lhs)} > {isl_affine(rhs)})"
        return f"({isl_affine(lhs)} {op} {isl_affine(rhs)})"
    if isinstance(expr, ir.Binary) and expr.op in ("&&", "||"):
        left, right = affine_condition(expr.lhs), affine_condition(expr.rhs)
        if left is None or right is None:
            return None
        return f"({left} {'and' if expr.op == '&&' else 'or'} {right})"
    if isinstance(expr, ir.Unary) and expr.op == "not":
        inner = affine_condition(expr.operand)
        return None if inner is None else f"(not {inner})"
    if isinstance(expr, ir.Const) and expr.dtype.kind == "b":
        return "true" if expr.value else "false"
    return None


def _reads_with_guards(expr: ir.TExpr, guard: str | None = None):
    """Every Read in ``expr`` with the isl text of the condition under which it is evaluated.

    A non-affine ternary condition leaves the guard as it was (an over-approximation: the read
    is treated as possibly performed on both branches).
    """
    if isinstance(expr, ir.Select):
        yield from _reads_with_guards(expr.cond, guard)
        condition = affine_condition(expr.cond)
        then_guard = _conjoin(guard, condition)
        else_guard = _conjoin(guard, None if condition is None else f"(not {condition})")
        yield from _reads_with_guards(expr.then, then_guard)
        yield from _reads_with_guards(expr.otherwise, else_guard)
        return
    if isinstance(expr, ir.Binary) and expr.op in ("&&", "||"):
        # C evaluates the right operand only when the left one has not decided the result.
        yield from _reads_with_guards(expr.lhs, guard)
        condition = affine_condition(expr.lhs)
        if condition is not None and expr.op == "||":
            condition = f"(not {condition})"
        yield from _reads_with_guards(expr.rhs, _conjoin(guard, condition))
        return
    if isinstance(expr, ir.Read):
        yield expr, guard
        for s in expr.subscripts:
            if isinstance(s, ir.TExpr):
                yield from _reads_with_guards(s, guard)
        return
    for child in _children(expr):
        yield from _reads_with_guards(child, guard)


def _conjoin(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return f"({a} and {b})"


def _children(expr: ir.TExpr):
    if isinstance(expr, ir.Unary):
        return (expr.operand,)
    if isinstance(expr, ir.Binary):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, ir.Call):
        return expr.args
    if isinstance(expr, ir.Cast):
        return (expr.operand,)
    return ()
