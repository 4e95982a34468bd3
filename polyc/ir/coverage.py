"""Which outputs and temporaries a def defines completely before reading them: those need no
zeroing.

The runtime allocates outputs and temporaries for a call.  TC's semantics start them at zero,
and a tensor that a statement only partly writes (``where`` ranges narrower than the tensor) or
accumulates into without ``!`` shows those zeros.  But most defs overwrite every element before
any read: then zeroing is wasted work, and for memory-bound kernels it is not small (a memset
of a 16 MB output is a large share of a Kronecker step: the ``kronecker3_*`` cases of
``python -m benchmarks``).  isl decides it for all
sizes at once.
"""

from __future__ import annotations

import islpy as isl

from polyc.ir.bounds import tensor_box
from polyc.ir.model import PolyProgram


def written_before_read(program: PolyProgram, names) -> frozenset[str]:
    """Those of the tensors ``names`` whose every element, for every choice of sizes, is
    written by a statement that does not read it before any statement reads it.

    Statements run in source order (the schedule respects every dependence, so no instance
    reads earlier than it would in that order).  Walking them in that order, an output is
    *defined* once the union of the writes so far covers its box; until then any statement that
    reads it, at an element the earlier statements have not written, may see the initial value.
    A statement's own writes count only after its reads: ``T(i) = T(i) + 1`` reads the old
    value.  The accumulator of a ``+=!`` reduction is read only by the update statement, after
    its init statement wrote it.
    """
    defined = []
    for name in names:
        box = tensor_box(program, name)
        written = isl.Set.empty(box.get_space())
        for statement in program.statements:
            read = isl.Set.empty(box.get_space())
            for access in statement.reads:
                if access.tensor == name:
                    read = read.union(access.relation.intersect_domain(statement.domain).range())
            if not read.is_subset(written):
                break
            if statement.source.target == name:
                written = written.union(statement.write.range())
                if box.is_subset(written):
                    defined.append(name)
                    break
    return frozenset(defined)
