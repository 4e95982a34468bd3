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

Transposes of transposes fold one after the other.  The rewrite works on the steps' TC text
(:mod:`polyc.frontends.onnx.lowering`), as the other graph rewrites of :mod:`.plan` do.
"""

from __future__ import annotations

import re

from polyc.frontends.onnx.lowering import KernelStep, values_read

_COPY = re.compile(
    r"^(?P<target>v\d+)\((?P<indices>[^()]*)\) = (?P<source>v\d+)\((?P<subscripts>[^()]*)\)"
    r" where (?P<ranges>[^()]*)$"
)
_ASSIGNED = re.compile(r"^(?P<target>v\d+)\((?P<indices>[^()]*)\) (?P<op>\S+) ")


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
    parts = _COPY.match(step.statements[0])
    target, source = step.writes[0], step.reads[0]
    if parts is None or parts["target"] != target.ident or parts["source"] != source.ident:
        return None
    names = _split(parts["indices"])
    subscripts = _split(parts["subscripts"])
    whole = ", ".join(f"{n} in 0:{e}" for n, e in zip(names, target.tc_shape))
    if (
        sorted(names) != sorted(subscripts)
        or len(set(names)) != len(names)
        or parts["ranges"] != whole
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
    remap = lambda subs: _permuted(subs, permutation) if len(subs) == len(permutation) else None  # noqa: E731
    rewritten = [
        [_rename_reads(text, result.ident, source.ident, remap) for text in reader.statements] for reader in readers
    ]
    if any(text is None for statements in rewritten for text in statements):
        return False
    for reader, statements in zip(readers, rewritten):
        reader.statements = statements
        reader.reads = [source if r is result else r for r in reader.reads]
        reader.reads = [r for n, r in enumerate(reader.reads) if all(r is not q for q in reader.reads[:n])]
    return True


def _permuted(subscripts: list[str], permutation: list[int]) -> list[str]:
    return [subscripts[p] for p in permutation]


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
    for text in writer.statements:
        assigned = _ASSIGNED.match(text)
        if assigned is None or assigned["target"] != source.ident:
            return False
        renamed = _rename_reads(
            text,
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


def _rename_reads(text: str, old: str, new: str, remap) -> str | None:
    """``text`` with every ``old(e..)`` made ``new(remap(e..))``; None when one has a subscript
    with parentheses (which the pattern cannot take apart) or ``remap`` refuses it (None)."""
    if len(re.findall(rf"\b{old}\(", text)) != len(re.findall(rf"\b{old}\([^()]*\)", text)):
        return None
    failed = False

    def renamed(match: re.Match) -> str:
        nonlocal failed
        subscripts = remap(_split(match.group(1)))
        if subscripts is None:
            failed = True
            return match.group(0)
        return f"{new}({', '.join(subscripts)})"

    text = re.sub(rf"\b{old}\(([^()]*)\)", renamed, text)
    return None if failed else text


def _split(subscripts: str) -> list[str]:
    return [s.strip() for s in subscripts.split(",")] if subscripts.strip() else []
