"""Static bounds checking: prove with isl that every affine access stays inside its tensor.

For every statement instance where an access is performed (its domain, narrowed by the affine
conditions of enclosing ternaries and short-circuit operators), the accessed element must lie in
the tensor's box.  isl computes, per access, the exact set of sizes for which it can fall
outside:

- when that set holds every choice of sizes >= 1, the access is always wrong: a
  :class:`~polyc.errors.BoundsError` at define time naming the statement, the access and an
  example;
- otherwise it is a *precondition* on the sizes (``B(i) = A(i, 0)`` needs N >= 1; an index
  bounded by a scalar K needs K <= N), checked at every call before anything runs.

Accesses with data-dependent subscripts are checked at run time by the generated code instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyc.errors import BoundsError, SourceLocation
from polyc.ir.model import PolyProgram, isl_affine, isl_name
from polyc.lang.checked import Read


def tensor_box(program: PolyProgram, tensor_name: str) -> isl.Set:
    """``{ T[a, b, ...] : 0 <= a < E0 and ... }`` in the program's parameters."""
    tensor = program.definition.tensor(tensor_name)
    dims = [f"a{d}" for d in range(tensor.rank)]
    constraints = [f"0 <= {d} < {isl_affine(e)}" for d, e in zip(dims, tensor.shape)]
    params = "[" + ", ".join(isl_name(p) for p in program.params) + "]"
    text = f"{params} -> {{ {tensor_name}[{', '.join(dims)}] : {' and '.join(constraints) or 'true'} }}"
    return isl.Set.read_from_str(program.ctx, text).intersect_params(program.context)


@dataclass(frozen=True)
class Violation:
    """The sizes (an isl parameter set) for which one access leaves its tensor."""

    description: str
    sizes: isl.Set
    loc: SourceLocation | None


@dataclass(frozen=True)
class BoundsPrecondition:
    """What the sizes of a call must satisfy for every access to stay in bounds."""

    params: tuple[str, ...]
    violations: tuple[Violation, ...]

    def check(self, sizes: Mapping[str, int], source: str | None = None) -> None:
        """Raise BoundsError when ``sizes`` let an access fall outside its tensor."""
        if not self.violations:
            return
        for violation in self.violations:
            point = violation.sizes
            for position, name in enumerate(self.params):
                point = point.fix_val(isl.dim_type.param, position, isl.Val.int_from_si(point.get_ctx(), sizes[name]))
            if not point.is_empty():
                values = ", ".join(f"{name}={sizes[name]}" for name in self.params)
                raise BoundsError(f"for sizes {values}, {violation.description}", violation.loc, source)

    def to_json(self) -> dict:
        """The precondition as JSON-ready data (:meth:`from_json` reads it back)."""
        return {
            "params": list(self.params),
            "violations": [
                {
                    "description": v.description,
                    "sizes": str(v.sizes),
                    "loc": [v.loc.line, v.loc.col] if v.loc is not None else None,
                }
                for v in self.violations
            ],
        }

    @classmethod
    def from_json(cls, data: dict, filename: str) -> BoundsPrecondition:
        """The precondition :meth:`to_json` wrote, its locations in ``filename``.  Raises
        ValueError, KeyError or TypeError (or isl's error) on data it did not write."""
        ctx = isl.Context()
        violations = tuple(
            Violation(
                str(v["description"]),
                isl.Set.read_from_str(ctx, v["sizes"]),
                SourceLocation(int(v["loc"][0]), int(v["loc"][1]), filename) if v["loc"] else None,
            )
            for v in data["violations"]
        )
        return cls(tuple(str(p) for p in data["params"]), violations)

    def __str__(self) -> str:
        if not self.violations:
            return "none"
        return "; ".join(f"not {v.sizes}" for v in self.violations)


def check_bounds(program: PolyProgram) -> BoundsPrecondition:
    """Prove every write and exact read in bounds; see the module docstring for the outcome."""
    positive = program.context
    for position in range(len(program.params)):
        positive = positive.lower_bound_val(isl.dim_type.param, position, isl.Val.int_from_si(program.ctx, 1))
    violations: list[Violation] = []
    boxes: dict[str, isl.Set] = {}  # per tensor, made once (each one a parse of isl text)
    for s in program.statements:
        # (verb, tensor, access relation, where it is made, the read or None for the write)
        accesses: list[tuple[str, str, isl.Map, isl.Set, Read | None]] = [
            ("writes", s.source.target, s.write, s.domain, None)
        ]
        accesses += [("reads", a.tensor, a.relation, s.domain.intersect(a.guard), a.read) for a in s.reads if a.exact]
        for verb, tensor, relation, where, read in accesses:
            touched = relation.intersect_domain(where)
            if tensor not in boxes:
                boxes[tensor] = tensor_box(program, tensor)
            outside = touched.subtract_range(boxes[tensor])
            if outside.is_empty():
                continue
            loc = read.loc if read is not None and read.loc.line else s.source.loc
            description = (
                f"statement {s.source.name} ({s.source.text}) {verb} {tensor} outside its "
                f"bounds {_shape_text(program, tensor)}"
            )
            bad_sizes = outside.params()
            if positive.is_subset(bad_sizes):
                example = outside.intersect_params(positive).sample().wrap().sample_point()
                advice = (
                    _explain_write(program, s.source) if read is None else ""
                ) or "restrict the index ranges with 'where' or guard the access with a condition"
                raise BoundsError(
                    f"{description} for every choice of sizes, e.g. at {_point_text(example)}; {advice}",
                    loc,
                    program.definition.source or None,
                )
            violations.append(Violation(description, bad_sizes.coalesce(), loc))
    return BoundsPrecondition(program.params, tuple(violations))


def _explain_write(program: PolyProgram, statement) -> str:
    """Why a write leaves its tensor, in words: the ranges of the left-hand indices that exceed the
    target's extents, where each range came from, and the ``where`` clause that keeps the write
    inside ("" when no range is to blame)."""
    ranges = dict(statement.ranges)
    target = program.definition.tensor(statement.target)
    reasons, clauses, needs = [], [], []
    for index, extent in zip(statement.indices, target.shape):
        given = ranges[index]
        inside_lo, inside_hi = given.lo.maximum(0), given.hi.minimum(extent)
        if (inside_lo, inside_hi) == (given.lo, given.hi):
            continue
        origin = (
            f"range inference gave '{index}' the range {given.lo} <= {index} < {given.hi} because of "
            f"{' and '.join(given.inferred_from)}"
            if given.inferred_from
            else f"the where clause gives '{index}' the range {given.lo} <= {index} < {given.hi}"
        )
        reasons.append(origin)
        needs.append(f"0 <= {index} < {extent}")
        clauses.append(f"{index} in {inside_lo}:{inside_hi}")
    if not reasons:
        return ""
    return (
        f"{'; '.join(reasons)}, but the write to {statement.target} needs {' and '.join(needs)}: "
        f"add 'where {', '.join(clauses)}' (or guard the statement with a condition)"
    )


def _shape_text(program: PolyProgram, tensor: str) -> str:
    return "(" + ", ".join(str(e) for e in program.definition.tensor(tensor).shape) + ")"


def _point_text(point: isl.Point) -> str:
    """A sample instance -> element pair, with the sizes it needs, as isl prints it."""
    return str(point).replace("{ ", "").replace(" }", "")
