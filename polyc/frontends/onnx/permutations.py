"""Transposes folded into the contractions beside them, before fusion.

A Transpose copies a tensor with its dimensions permuted: a pass over memory and a kernel of its
own.  Next to a contraction it is only a different indexing, and polyc's product kernels take
any evenly spaced rows and columns (an operand stored transposed is packed as cheaply, a target
is written through its offset tables), so the copy can go, as onnxruntime fuses Transpose into
MatMul:

- a Transpose whose every reader is a contraction is read through: ``T(a, b) = S(b, a)`` and
  ``C(i, j) +=! A(i, r) * T(r, j)`` make ``C(i, j) +=! A(i, r) * S(j, r)`` (attention's
  ``Q K^T``, exported as Transpose then MatMul);
- a Transpose that alone reads the result of a contraction is written through:
  ``P(i, j) +=! ...`` and ``T(j, i) = P(i, j)`` make the contraction assign ``T(j, i)``
  (attention's heads put back side by side after ``softmax(..) V``).

Transposes of transposes fold one after the other.  The rewrite edits the steps' statements,
syntax trees (:mod:`polyc.frontends.onnx.lowering`), as the other graph rewrites of
:mod:`.plan` do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from polyc.frontends.onnx.lowering import KernelStep, values_read
from polyc.lang import ast
from polyc.lang.rewrite import replace_expr, replace_in_statement, whole_ranges

#: Subscripts permuted, or None where they cannot be (another rank).
Remap = Callable[[tuple[ast.Expr, ...]], "tuple[ast.Expr, ...] | None"]


def fold_transposes(steps: list, outputs: list) -> list:
    """``steps`` with the Transposes beside contractions folded into them (module docstring)."""
    kept = {id(v) for v in outputs}
    changed = True
    while changed:  # each fold may make another possible (a transpose of a transpose)
        changed = False
        # One pass folds all it can, last step first.  (Starting again from the end after each
        # fold cost a detector's stages, of thousands of steps and a hundred transposes, a large
        # share of a new image's planning.)
        uses = _Uses(steps)
        for step in reversed(list(steps)):
            permutation = _permutation(step)
            if permutation is None:
                continue
            if _read_through(step, permutation, uses, kept) or _write_through(step, permutation, uses, kept):
                steps = [s for s in steps if s is not step]
                uses = _Uses(steps)
                changed = True
    return steps


class _Uses:
    """The steps that read and that write each value (by id), in the steps' order: made again
    after each fold, which changes them (a detector's stage has thousands of steps and a hundred
    transposes, each of which scanned them all: a large share of a new image's planning)."""

    def __init__(self, steps: list):
        self.readers: dict[int, list] = {}
        self.writers: dict[int, list] = {}
        for step in steps:
            for value in {id(v): v for v in values_read(step)}.values():
                self.readers.setdefault(id(value), []).append(step)
            if isinstance(step, KernelStep):
                for value in {id(v): v for v in step.writes}.values():
                    self.writers.setdefault(id(value), []).append(step)


def _permutation(step) -> list[int] | None:
    """For a step copying one tensor of its own type with the dimensions permuted over the whole
    of its output, ``p`` with ``T(i_0, .., i_n) = S(i_p[0], .., i_p[n])``; else None."""
    if (
        not isinstance(step, KernelStep)
        or len(step.statements) != 1
        or len(step.writes) != 1
        or len(step.reads) != 1
        or step.reads[0].dtype != step.writes[0].dtype
    ):
        return None
    statement = step.statements[0]
    target, source = step.writes[0], step.reads[0]
    copied = statement.rhs
    if (
        statement.op != "="
        or statement.init
        or statement.equivalent is not None
        or statement.loop is not None
        or statement.target != target.ident
        or not isinstance(copied, ast.Access)
        or copied.tensor != source.ident
        or not all(isinstance(a, ast.Name) for a in copied.args)
    ):
        return None
    names = list(statement.indices)
    subscripts = [a.name for a in copied.args if isinstance(a, ast.Name)]
    if (
        sorted(names) != sorted(subscripts)
        or len(set(names)) != len(names)
        or not statement.where
        or statement.where != whole_ranges(names, target.tc_shape)
        or len(source.tc_shape) != len(names)
    ):
        return None
    permutation = [names.index(s) for s in subscripts]
    if any(source.tc_shape[d] != target.tc_shape[p] for d, p in enumerate(permutation)):
        return None  # (a broadcast, not a permutation)
    return permutation


def _read_through(transpose: KernelStep, permutation: list[int], uses: _Uses, kept: set) -> bool:
    """Makes every reader of the transpose's result, all contractions, read its source instead.
    (Not through views: the qkv split of an attention layer, Transpose then Split, would leave
    constant subscripts in the products' operands, which the gemm kernel does not take.)"""
    result, source = transpose.writes[0], transpose.reads[0]
    readers = [s for s in uses.readers.get(id(result), []) if s is not transpose]
    if (
        id(result) in kept
        or not readers
        or any(not isinstance(s, KernelStep) or s.kind != "contraction" for s in readers)
    ):
        return False
    remap: Remap = lambda subs: _permuted(subs, permutation) if len(subs) == len(permutation) else None  # noqa: E731
    rewritten = [
        [_rename_reads(statement, result.ident, source.ident, remap) for statement in reader.statements]
        for reader in readers
    ]
    if any(statement is None for statements in rewritten for statement in statements):
        return False
    for reader, statements in zip(readers, rewritten):
        reader.statements = statements
        reader.reads = [source if r is result else r for r in reader.reads]
        reader.reads = [r for n, r in enumerate(reader.reads) if all(r is not q for q in reader.reads[:n])]
    return True


def _permuted(subscripts: tuple, permutation: list[int]) -> tuple:
    return tuple(subscripts[p] for p in permutation)


def _write_through(transpose: KernelStep, permutation: list[int], uses: _Uses, kept: set) -> bool:
    """Makes the contraction computing the transpose's source, which nothing else reads, assign
    the transpose's result instead."""
    result, source = transpose.writes[0], transpose.reads[0]
    writers = uses.writers.get(id(source), [])
    readers = uses.readers.get(id(source), [])
    if (
        id(source) in kept
        or len(writers) != 1
        or readers != [transpose]
        or writers[0].kind != "contraction"
        or len(writers[0].writes) != 1
    ):
        return False
    writer = writers[0]
    inverse = [permutation.index(d) for d in range(len(permutation))]
    statements = []
    for statement in writer.statements:
        if statement.target != source.ident:
            return False
        renamed = _rename_reads(
            statement,
            source.ident,
            result.ident,
            lambda subs: _permuted(subs, inverse) if len(subs) == len(inverse) else None,
        )
        if renamed is None:
            return False
        statements.append(renamed)
    writer.statements = statements
    writer.writes = [result]
    return True


def _rename_reads(statement: ast.Statement, old: str, new: str, remap: Remap) -> ast.Statement | None:
    """``statement`` with every access ``old(e..)`` made ``new(remap(e..))``, and its target
    too when it is ``old`` (its indices remapped); None when ``remap`` refuses one (None)."""
    refused = False

    def renamed(expr: ast.Expr) -> ast.Expr | None:
        nonlocal refused
        if not isinstance(expr, ast.Access) or expr.tensor != old:
            return None
        subscripts = remap(tuple(replace_expr(a, renamed) for a in expr.args))
        if subscripts is None:
            refused = True
            return expr
        return dataclasses.replace(expr, tensor=new, args=subscripts)

    edited = replace_in_statement(statement, renamed)
    if edited.target == old:
        indices = remap(tuple(ast.Name(i) for i in edited.indices))
        if indices is None:
            return None
        edited = dataclasses.replace(
            edited, target=new, indices=tuple(i.name for i in indices if isinstance(i, ast.Name)), index_locs=()
        )
    return None if refused else edited
