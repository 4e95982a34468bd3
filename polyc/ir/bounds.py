"""Static bounds checking: prove with isl that every affine access stays inside its tensor.

For every size the signature admits (the program's context) and every statement instance where
the access is performed (its domain, narrowed by the affine conditions of enclosing ternaries),
the accessed element must lie in the tensor's box.  An access that can fall outside is a
:class:`~polyc.errors.BoundsError` naming the statement, the access and an example.  Accesses
with data-dependent subscripts are checked at run time by the generated code instead; so are
affine subscripts of accesses guarded by conditions isl cannot express.
"""
from __future__ import annotations

import islpy as isl

from polyc.errors import BoundsError
from polyc.ir.model import PolyProgram, isl_affine, isl_name


def tensor_box(program: PolyProgram, tensor_name: str) -> isl.Set:
    """``{ T[a, b, ...] : 0 <= a < E0 and ... }`` in the program's parameters."""
    tensor = program.definition.tensor(tensor_name)
    dims = [f"a{d}" for d in range(tensor.rank)]
    constraints = [f"0 <= {d} < {isl_affine(e)}" for d, e in zip(dims, tensor.shape)]
    params = "[" + ", ".join(isl_name(p) for p in program.params) + "]"
    text = f"{params} -> {{ {tensor_name}[{', '.join(dims)}] : {' and '.join(constraints) or 'true'} }}"
    return isl.Set.read_from_str(program.ctx, text).intersect_params(program.context)


def check_bounds(program: PolyProgram) -> None:
    """Raise BoundsError for the first write or exact read that may leave its tensor."""
    for s in program.statements:
        accesses = [("writes", s.source.target, s.write, s.domain, None)]
        accesses += [("reads", a.tensor, a.relation, s.domain.intersect(a.guard), a.read)
                     for a in s.reads if a.exact]
        for verb, tensor, relation, where, read in accesses:
            touched = relation.intersect_domain(where)
            outside = touched.subtract_range(tensor_box(program, tensor))
            if outside.is_empty():
                continue
            example = outside.sample().wrap().sample_point()
            loc = read.loc if read is not None and read.loc.line else s.source.loc
            source = program.definition.source or None
            raise BoundsError(
                f"statement {s.source.name} ({s.source.text}) {verb} {tensor} outside its bounds "
                f"{_shape_text(program, tensor)}, e.g. at {_point_text(example)}; restrict the index "
                f"ranges with 'where' or guard the access with a condition", loc, source)


def _shape_text(program: PolyProgram, tensor: str) -> str:
    return "(" + ", ".join(str(e) for e in program.definition.tensor(tensor).shape) + ")"


def _point_text(point: isl.Point) -> str:
    """A sample instance -> element pair, with the sizes it needs, as isl prints it."""
    return str(point).replace("{ ", "").replace(" }", "")
