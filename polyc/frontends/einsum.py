"""``polyc.einsum``: a drop-in for :func:`numpy.einsum` that lowers to a TC def.

    >>> import numpy as np, polyc
    >>> A = np.ones((2, 3), np.float32); B = np.ones((3, 4), np.float32)
    >>> polyc.einsum("ij,jk->ik", A, B, backend="interpreter")[0, 0]
    np.float32(3.0)

The pipeline has three steps, each a plain function:

1. :func:`parse_subscripts` reads numpy's subscript grammar (explicit ``ij,jk->ik`` or implicit
   ``ij,jk``, repeated labels, ``...``, spaces) into a :class:`Subscripts` record.
2. :func:`plan_contraction` binds it to the operands' shapes: it expands ``...`` into labels of
   its own, checks label sizes, and resolves numpy's broadcasting.  A dimension of size 1
   broadcast against a label of another size is dropped from its operand (a reshape, never a
   copy), because the operand does not vary along it.  The result is a :class:`Contraction`
   whose labels are renumbered in order of first appearance, so ``ij,jk->ik`` and
   ``ab,bc->ac`` are the same problem.
3. :func:`lower_to_tc` writes the contraction as TC source, e.g. ::

       def einsum(float32(S0, S1) I0, float32(S1, S2) I1) -> (Out) {
           Out(a, c) +=! I0(a, r_b) * I1(r_b, c)
       }

   Labels in the output are indices of the left-hand side; the others are reduction indices
   (``r_`` prefix).  A label repeated within an operand is the same index twice (a diagonal).
   bool operands reduce with logical or over logical and (``max=!`` over ``&&``), as numpy does.

The kernel of each contraction is defined once per (contraction, dtype, options) and kept in a
bounded cache; the compiler itself caches compiled code per shapes.

As numpy does, a single operand whose subscripts only permute axes or take diagonals (no sum)
gives a strided view of it, without a kernel; float16 is computed in float32 and rounded once.

Differences from numpy: ``optimize`` is accepted and not followed (the contraction is one TC
statement, or a pairwise chain of them, and polyc schedules it itself), though an explicit
path is checked as numpy checks it; complex, long double and object computations raise
:class:`~polyc.errors.UnsupportedError` (declined by design: the C back end has no such types).
Errors are numpy's builtin classes too: :class:`EinsumError` is a ValueError,
:class:`EinsumTypeError` a TypeError, :class:`EinsumPathError` a RuntimeError.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from polyc.errors import PolycError, UnsupportedError
from polyc.options import Options
from polyc.types import TC_TYPES

#: Marks where ``...`` stands in a parsed term.
ELLIPSIS = "..."
#: A label before numbering: a letter of the subscripts, or ``(ELLIPSIS, k)`` for the k-th
#: broadcast dimension.
_Label = str | tuple[str, int]

#: How many lowered kernels are kept (least recently used are dropped first).
KERNEL_CACHE_SIZE = 256

#: Problems of at most this many loop iterations run on a kernel compiled for all shapes
#: (``specialize=False``) unless the call sets ``specialize``: one build serves every small shape.
SMALL_PROBLEM = 1 << 12

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # numpy's sublist label order
_Order = Literal["K", "A", "C", "F"]
_Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]
_ORDERS: tuple[_Order, ...] = ("K", "A", "C", "F")
_CASTINGS: tuple[_Casting, ...] = ("no", "equiv", "safe", "same_kind", "unsafe")
_DEFAULT_OPTIONS = Options()  # a call without polyc options: checked once, not per call


class EinsumError(PolycError, ValueError):
    """An einsum call that numpy would reject too: bad subscripts, operands that do not fit them,
    or a forbidden cast.  Also a ValueError, so code written for numpy.einsum keeps working."""


class EinsumTypeError(PolycError, TypeError):
    """An einsum argument of the wrong kind: subscripts that are neither a string nor a sublist,
    an ``out`` that is not an array, an unknown dtype or keyword.  Also a TypeError, as in numpy."""


class EinsumPathError(PolycError, RuntimeError):
    """An explicit ``optimize=['einsum_path', ...]`` that does not contract every operand into one.
    Also a RuntimeError, as numpy raises for it."""


# ----------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Subscripts:
    """A parsed subscripts string.  Each term is a tuple of labels (letters) in which
    :data:`ELLIPSIS` may stand once; ``output`` is None in implicit mode (no ``->``)."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...] | None


@functools.lru_cache(maxsize=KERNEL_CACHE_SIZE)
def parse_subscripts(text: str) -> Subscripts:
    """Parse numpy's einsum subscripts: ``"ij,jk->ik"``, ``"ii"``, ``"...ij,...jk"``.

    Checks what the string alone settles: characters, ``...`` placement, repeated or unknown
    output labels.  Operand counts and ranks are checked against the operands later.
    """
    if not isinstance(text, str):
        raise EinsumError(f"einsum subscripts must be a string, not {type(text).__name__}")
    text = "".join(text.split())
    if text.count("->") > 1:
        raise EinsumError("einstein sum subscripts string contains more than one '->'")
    inputs_text, arrow, output_text = text.partition("->")
    inputs = tuple(_parse_term(term, f"operand {n}") for n, term in enumerate(inputs_text.split(",")))
    if not arrow:
        return Subscripts(inputs, None)
    if "," in output_text:
        raise EinsumError("einstein sum subscripts string has a ',' in the output (after '->')")
    output = _parse_term(output_text, "the output")
    seen: set[str] = set()
    used = {label for term in inputs for label in term}
    for label in output:
        if label in seen:
            raise EinsumError(f"einstein sum subscripts string includes output subscript '{label}' multiple times")
        seen.add(label)
        if label != ELLIPSIS and label not in used:
            raise EinsumError(
                f"einstein sum subscripts string included output subscript '{label}' which never appeared in an input"
            )
    return Subscripts(inputs, output)


def _parse_term(term: str, where: str) -> tuple[str, ...]:
    labels: list[str] = []
    position = 0
    while position < len(term):
        char = term[position]
        if term.startswith(ELLIPSIS, position):
            if ELLIPSIS in labels:
                raise EinsumError(f"einstein sum subscripts string contains more than one '...' in {where}")
            labels.append(ELLIPSIS)
            position += len(ELLIPSIS)
            continue
        if char == ".":
            raise EinsumError(
                f"einstein sum subscripts string contains a '.' that is not part of an ellipsis ('...') in {where}"
            )
        if not (char.isascii() and char.isalpha()):
            raise EinsumError(
                f"invalid subscript {char!r} in einstein sum subscripts string, subscripts must be letters"
            )
        labels.append(char)
        position += 1
    return tuple(labels)


def subscripts_from_sublists(args) -> tuple[str, tuple]:
    """numpy's other calling form, ``einsum(op0, sublist0, op1, sublist1, ..., [sublist_out])``,
    as a subscripts string and the operands.  A sublist is any sequence (list, tuple, range,
    1-d integer array) of integers 0..51, which stand for ``A..Z, a..z``, and ``Ellipsis``,
    which stands for ``...``."""
    if len(args) < 2:
        raise EinsumError("must specify the einstein sum subscripts string and at least one operand")
    operands = args[0::2][: len(args) // 2]
    sublists = args[1::2]
    terms = [_sublist_text(s) for s in sublists]
    output = _sublist_text(args[-1]) if len(args) % 2 else None
    text = ",".join(terms) + ("" if output is None else "->" + output)
    return text, tuple(operands)


def _sublist_text(sublist) -> str:
    if isinstance(sublist, np.ndarray) and sublist.ndim == 1 and sublist.dtype.kind in "iu":
        sublist = sublist.tolist()
    if isinstance(sublist, (str, bytes)) or not isinstance(sublist, collections.abc.Sequence):
        raise EinsumTypeError(
            f"einsum sublists must be sequences of integers (lists, tuples, ranges or "
            f"1-d integer arrays), not {type(sublist).__name__}"
        )
    text = []
    for item in sublist:
        if item is Ellipsis:
            text.append(ELLIPSIS)
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool) and 0 <= item < len(_LETTERS):
            text.append(_LETTERS[int(item)])
        else:
            raise EinsumError(f"subscript {item!r} is not within the valid range [0, {len(_LETTERS)}) (nor Ellipsis)")
    return "".join(text)


# ----------------------------------------------------------------------------- planning
@dataclass(frozen=True)
class Contraction:
    """An einsum problem bound to ranks and a dtype, independent of the letters used.

    Labels are integers numbered in order of first appearance (inputs, left to right).
    ``inputs[n]`` labels the dimensions of operand n (a label may repeat: a diagonal);
    ``output`` labels the result's dimensions.  Labels not in ``output`` are summed over.
    """

    inputs: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    dtype: np.dtype

    @property
    def labels(self) -> tuple[int, ...]:
        return tuple(range(1 + max((l for term in self.inputs for l in term), default=-1)))

    @property
    def reduced(self) -> tuple[int, ...]:
        return tuple(l for l in self.labels if l not in self.output)

    def __str__(self) -> str:
        terms = [''.join(_label_name(l) for l in term) for term in self.inputs]
        return f"{','.join(terms)}->{''.join(_label_name(l) for l in self.output)} ({self.dtype.name})"


def plan_contraction(
    subscripts: Subscripts, arrays: list[np.ndarray], dtype: np.dtype
) -> tuple[Contraction, list[np.ndarray], tuple[int, ...]]:
    """Bind ``subscripts`` to the operands: check ranks and sizes, expand ``...``, resolve
    broadcasting of size-1 dimensions.  Returns the contraction, the operands as views that fit
    it (broadcast dimensions reshaped away), and the result's shape.
    """
    contraction, view_shapes, shape = _plan_for_shapes(subscripts, tuple(a.shape for a in arrays), dtype)
    return contraction, [a.reshape(s) for a, s in zip(arrays, view_shapes)], shape


@functools.lru_cache(maxsize=KERNEL_CACHE_SIZE)
def _plan_for_shapes(
    subscripts: Subscripts, shapes: tuple[tuple[int, ...], ...], dtype: np.dtype
) -> tuple[Contraction, tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """:func:`plan_contraction` for operands of these shapes (the operands' views as shapes).
    Remembered: a call that repeats its shapes skips the planning (half of a small einsum's
    Python time)."""
    if len(shapes) != len(subscripts.inputs):
        more = "more" if len(shapes) > len(subscripts.inputs) else "fewer"
        raise EinsumError(
            f"{more} operands provided to einstein sum function than specified in the "
            f"subscripts string ({len(shapes)} operand(s), {len(subscripts.inputs)} term(s))"
        )
    terms, ellipsis_rank = _expand_ellipses(subscripts, shapes)
    output = _output_labels(subscripts, terms, ellipsis_rank)
    sizes = _label_sizes(terms, shapes)

    kept_terms, view_shapes = [], []
    for term, shape in zip(terms, shapes):
        # A dimension of size 1 against a label of another size is numpy's broadcasting: the
        # operand is constant along that label, so it is dropped rather than copied.
        keep = [dim for dim, label in enumerate(term) if shape[dim] == sizes[label]]
        kept_terms.append(tuple(term[dim] for dim in keep))
        view_shapes.append(tuple(shape[dim] for dim in keep))

    numbering: dict = {}
    for term in kept_terms:
        for label in term:
            numbering.setdefault(label, len(numbering))
    contraction = Contraction(
        tuple(tuple(numbering[l] for l in term) for term in kept_terms), tuple(numbering[l] for l in output), dtype
    )
    return contraction, tuple(view_shapes), tuple(sizes[l] for l in output)


def _expand_ellipses(subscripts: Subscripts, shapes: tuple[tuple[int, ...], ...]) -> tuple[list[tuple], int]:
    """Each operand's labels with ``...`` replaced by its broadcast dimensions, which get labels
    ``(ELLIPSIS, k)`` numbered from the left of the broadcast shape (right-aligned, as numpy)."""
    ranks = []
    for n, (term, shape) in enumerate(zip(subscripts.inputs, shapes)):
        named = len(term) - (ELLIPSIS in term)
        if ELLIPSIS not in term and len(shape) > named:
            raise EinsumError(
                f"operand {n} has more dimensions ({len(shape)}) than subscripts given in "
                f"einstein sum ('{''.join(term)}'), but no '...' ellipsis provided to "
                f"broadcast the extra dimensions."
            )
        if len(shape) < named:
            raise EinsumError(
                f"einstein sum subscripts string contains too many subscripts for operand {n} "
                f"('{''.join(term)}' for an operand with {len(shape)} dimension(s))"
            )
        ranks.append(len(shape) - named)
    ellipsis_rank = max(ranks, default=0)
    terms = []
    for term, rank in zip(subscripts.inputs, ranks):
        expanded: list[_Label] = []
        for label in term:
            if label == ELLIPSIS:
                expanded.extend((ELLIPSIS, k) for k in range(ellipsis_rank - rank, ellipsis_rank))
            else:
                expanded.append(label)
        terms.append(tuple(expanded))
    return terms, ellipsis_rank


def _output_labels(subscripts: Subscripts, terms: list[tuple], ellipsis_rank: int) -> tuple:
    broadcast = tuple((ELLIPSIS, k) for k in range(ellipsis_rank))
    if subscripts.output is None:
        # numpy's implicit mode: broadcast dimensions first, then labels used exactly once, sorted.
        counts: dict[str, int] = {}
        for term in subscripts.inputs:
            for label in term:
                counts[label] = counts.get(label, 0) + 1
        return broadcast + tuple(sorted(l for l, c in counts.items() if c == 1 and l != ELLIPSIS))
    if ELLIPSIS not in subscripts.output and ellipsis_rank > 0:
        raise EinsumError(
            "output has more dimensions than subscripts given in einstein sum, but no '...' "
            "ellipsis provided to broadcast the extra dimensions."
        )
    output: list[_Label] = []
    for label in subscripts.output:
        output.extend(broadcast if label == ELLIPSIS else (label,))
    return tuple(output)


def _label_sizes(terms: list[tuple], shapes: tuple[tuple[int, ...], ...]) -> dict:
    """The extent of every label: equal wherever it occurs, except that 1 broadcasts."""
    sizes: dict = {}
    where: dict = {}
    for n, (term, shape) in enumerate(zip(terms, shapes)):
        own: dict = {}
        for label, extent in zip(term, shape):
            if label in own and own[label] != extent:
                raise EinsumError(
                    f"dimensions in operand {n} for collapsing index {_describe(label)} "
                    f"don't match ({own[label]} != {extent})"
                )
            own[label] = extent
        for label, extent in own.items():
            if label not in sizes or sizes[label] == 1:
                sizes[label], where[label] = extent, n
            elif extent not in (1, sizes[label]):
                raise EinsumError(
                    f"operands could not be broadcast together: {_describe(label)} has size "
                    f"{sizes[label]} in operand {where[label]} but {extent} in operand {n} "
                    f"(shapes {', '.join(map(str, shapes))})"
                )
    return sizes


def _describe(label) -> str:
    return f"'{label}'" if isinstance(label, str) else f"dimension {label[1]} of '...'"


# ----------------------------------------------------------------------------- lowering
def _label_name(label: int) -> str:
    """A TC index name for a label: a..z, A..Z, then x52, x53, ... (never a size or tensor name)."""
    if label < 26:
        return chr(ord("a") + label)
    if label < 52:
        return chr(ord("A") + label - 26)
    return f"x{label}"


def contraction_order(inputs: tuple[tuple[int, ...], ...], output: tuple[int, ...]) -> list[tuple[int, int]]:
    """A pairwise order for contracting more than two operands, as positions in a shrinking list
    of terms (the result of each step is appended at the end).

    Without sizes (one kernel serves every shape) the choice is by labels: contract the pair
    whose result keeps the fewest labels, breaking ties by the most labels summed away.  This
    turns ``ij,jk,kl->il`` from one n^4 loop nest into two n^3 matrix products.
    """
    terms = [set(t) for t in inputs]
    steps = []
    while len(terms) > 2:
        best: tuple[int, int, int, int] | None = None
        for a in range(len(terms)):
            for b in range(a + 1, len(terms)):
                others = set(output).union(*(t for k, t in enumerate(terms) if k not in (a, b)))
                kept = (terms[a] | terms[b]) & others
                summed = (terms[a] | terms[b]) - others
                key = (len(kept), -len(summed), a, b)
                best = key if best is None or key < best else best
        assert best is not None, "more than two terms have a pair"
        _, _, a, b = best
        others = set(output).union(*(t for k, t in enumerate(terms) if k not in (a, b)))
        merged = (terms[a] | terms[b]) & others
        terms = [t for k, t in enumerate(terms) if k not in (a, b)] + [merged]
        steps.append((a, b))
    return steps


def lower_to_tc(contraction: Contraction, name: str = "einsum") -> str:
    """The TC def computing ``contraction``: inputs ``I0, I1, ...``, output ``Out``, size ``Sk``
    for label k.  Two operands or fewer: one statement, ``=`` when nothing is summed, else
    ``+=!`` (``max=!`` over ``&&`` for bool: numpy's logical or of logical ands).  More operands
    are contracted pairwise into temporaries ``T0, T1, ...`` (see :func:`contraction_order`)."""
    type_name = contraction.dtype.name
    is_bool = contraction.dtype == np.bool_

    def statement(target: str, target_labels: tuple[int, ...], operands: list[tuple[str, tuple[int, ...]]]) -> str:
        kept = set(target_labels)

        def index(label: int) -> str:
            return _label_name(label) if label in kept else "r_" + _label_name(label)

        def access(tensor: str, term: tuple[int, ...]) -> str:
            return f"{tensor}({', '.join(index(l) for l in term)})" if term else tensor

        reduced = {l for _, term in operands for l in term} - kept
        product = (" && " if is_bool else " * ").join(access(t, term) for t, term in operands)
        op = "=" if not reduced else "max=!" if is_bool else "+=!"
        return f"    {access(target, target_labels)} {op} {product}\n"

    params = []
    for n, term in enumerate(contraction.inputs):
        shape = f"({', '.join(f'S{l}' for l in term)})" if term else ""
        params.append(f"{type_name}{shape} I{n}")
    operands = [(f"I{n}", term) for n, term in enumerate(contraction.inputs)]
    body = []
    for step, (a, b) in enumerate(contraction_order(contraction.inputs, contraction.output)):
        others = set(contraction.output).union(*(set(t) for k, (_, t) in enumerate(operands) if k not in (a, b)))
        labels = tuple(l for l in dict.fromkeys(operands[a][1] + operands[b][1]) if l in others)
        body.append(statement(f"T{step}", labels, [operands[a], operands[b]]))
        operands = [o for k, o in enumerate(operands) if k not in (a, b)] + [(f"T{step}", labels)]
    body.append(statement("Out", contraction.output, operands))
    return f"def {name}({', '.join(params)}) -> (Out) {{\n{''.join(body)}}}\n"


@functools.lru_cache(maxsize=KERNEL_CACHE_SIZE)
def lowered_kernel(contraction: Contraction, options: Options):
    """The polyc kernel of ``contraction`` (defined once per contraction and options)."""
    from polyc.api import define  # polyc.api imports the whole front end; keep this module light

    return define(lower_to_tc(contraction), filename="<einsum>", **dataclasses.asdict(options)).einsum


# ----------------------------------------------------------------------------- entry point
def einsum(*operands, out=None, dtype=None, order="K", casting="safe", optimize=False, **options):
    """Evaluate the Einstein summation ``subscripts`` on ``operands``, like :func:`numpy.einsum`:
    ``einsum(subscripts, *operands, ...)``.

    Accepts numpy's grammar (``"ij,jk->ik"``, implicit output ``"ij,jk"``, repeated labels
    ``"ii->i"``, ``"..."`` broadcasting, any number of operands) and its sublist form
    ``einsum(a, [0, 1], b, [1, 2], [0, 2])`` (sublists may be any integer sequences).

    - ``dtype``: compute and return in this type (operands are cast with ``casting``, 'safe' by
      default); otherwise ``numpy.result_type`` of the operands.  bool, integer and float16/32/64
      types are supported; complex, long double and object raise
      :class:`~polyc.errors.UnsupportedError` (declined by design).
    - ``out``: an array of the result's shape to write into; it is returned.  The result is cast
      to its dtype under ``casting``, as numpy's einsum does; with ``optimize`` other than False
      it is assigned (any cast), as numpy's Python path for ``optimize`` does.
    - ``order``: memory layout of a new result, in any case: 'C', 'F', 'A' (F if every operand
      is Fortran-contiguous, else C) or 'K' (as close to the operands' layout as numpy's
      iterator makes it, the default).
    - ``optimize``: accepted for compatibility; polyc plans its loops itself.  An explicit
      ``['einsum_path', ...]`` is checked as numpy checks it.
    - ``**options``: passed to :func:`polyc.define` (``backend=``, ``loop_tiles=``, ...).  Unless
      ``specialize`` is given, problems of at most :data:`SMALL_PROBLEM` loop iterations use a
      kernel compiled once for all shapes, larger ones a kernel compiled for their shapes.

    A single operand whose subscripts only permute its axes or take diagonals, with no sum (``ji``,
    ``ii->i``, ``...ii->i...``), gives a strided view of the operand, as numpy does: no copy, no
    kernel, writeable when the operand is.  Otherwise a new array (a numpy scalar for a 0-d result,
    as numpy does), or ``out``.  Raises :class:`EinsumError` (a ValueError) and
    :class:`EinsumTypeError` (a TypeError) where numpy raises those.
    """
    if not operands:
        raise EinsumError("must specify the einstein sum subscripts string and at least one operand")
    subscripts, operands = operands[0], operands[1:]
    if not isinstance(subscripts, str):
        subscripts, operands = subscripts_from_sublists((subscripts,) + operands)
    if not operands:
        raise EinsumError("must specify the einstein sum subscripts string and at least one operand")
    order = _check_order(order)
    casting = _check_casting(casting)
    _check_explicit_path(optimize, len(operands))
    checked_options = _check_options(options)
    requested_dtype = _requested_dtype(dtype)
    if out is not None and not isinstance(out, np.ndarray):
        raise EinsumTypeError(f"out must be a numpy array, not {type(out).__name__}")
    arrays = [np.asarray(op) for op in operands]
    compute_dtype = _compute_dtype(arrays, requested_dtype, casting)
    parsed = parse_subscripts(subscripts)
    # float16 is computed in float32 and rounded once at the end, as numpy's einsum accumulates it.
    kernel_dtype = np.dtype(np.float32) if compute_dtype == np.float16 else compute_dtype
    contraction, views, shape = plan_contraction(parsed, arrays, kernel_dtype)
    if out is not None:
        _check_out(out, shape, compute_dtype, "unsafe" if optimize is not False else casting)
    elif (
        len(arrays) == 1 and arrays[0].dtype == compute_dtype and set(contraction.output) == set(contraction.inputs[0])
    ):
        view = _single_operand_view(arrays[0], contraction)
        if order in ("K", "A") or view.flags[f"{order}_CONTIGUOUS"]:
            return view[()] if view.ndim == 0 else view

    if "specialize" not in options and _iterations(contraction, views) <= SMALL_PROBLEM:
        # Specialising a tiny problem buys nothing but a build per shape: one serves them all.
        checked_options = checked_options.replace(specialize=False)
    kernel = lowered_kernel(contraction, checked_options)
    # astype copies only when the dtype changes; kernels never write their inputs either way.
    # Broadcast (stride-0) operands are copied here, whatever their size: numpy's einsum takes
    # them, and a kernel call would refuse a large one (polyc.BroadcastInputError).
    operands_for_kernel = [_contiguous_if_broadcast(view.astype(kernel_dtype, copy=False)) for view in views]
    result = kernel(*operands_for_kernel).astype(compute_dtype, copy=False)
    if contraction.reduced and result.dtype.kind in "fc":
        # polyc's sums start from -0.0, the identity of addition (an ONNX model's sum of -0
        # terms is -0, as onnxruntime's); numpy's start from +0.0, so an empty sum or one of
        # -0 terms is +0 in numpy.  Adding +0 changes exactly those zeros' signs.
        np.add(result, 0.0, out=result, casting="unsafe")
    if out is not None:
        np.copyto(out, result, casting="unsafe")  # the cast was checked against `casting` above
        return out
    if result.ndim == 0:
        return result[()]
    if order == "F":
        return np.asfortranarray(result)
    if order in ("K", "A") and result.ndim > 1:
        return _in_numpy_layout(result, views, contraction, order)
    return result


def _contiguous_if_broadcast(array: np.ndarray) -> np.ndarray:
    """``array``, or a C-contiguous copy of it when an axis longer than 1 has stride 0."""
    if any(stride == 0 and extent > 1 for extent, stride in zip(array.shape, array.strides)):
        return np.ascontiguousarray(array)
    return array


def _iterations(contraction: Contraction, views: list[np.ndarray]) -> int:
    """How many points the contraction's loops visit: the product of every label's extent."""
    extents = {
        label: extent for term, view in zip(contraction.inputs, views) for label, extent in zip(term, view.shape)
    }
    return math.prod(extents.values())


def _check_order(order) -> _Order:
    """``order`` in upper case, checked."""
    if isinstance(order, str):
        for known in _ORDERS:
            if order.upper() == known:
                return known
    raise EinsumError(f"order must be one of {', '.join(_ORDERS)} (in any case), not {order!r}")


def _check_casting(casting) -> _Casting:
    """``casting``, checked."""
    for known in _CASTINGS:
        if casting == known:
            return known
    raise EinsumError(f"casting must be one of {', '.join(map(repr, _CASTINGS))}, not {casting!r}")


def _check_explicit_path(optimize, n_operands: int) -> None:
    """An explicit contraction path (``['einsum_path', (0, 1), ...]``) must name existing operands
    and contract them all into one; polyc does not follow it otherwise."""
    if not (isinstance(optimize, (list, tuple)) and optimize and optimize[0] == "einsum_path"):
        return
    remaining = n_operands
    for step in optimize[1:]:
        positions = tuple(step)
        if len(set(positions)) != len(positions) or not all(
            isinstance(p, (int, np.integer)) and 0 <= p < remaining for p in positions
        ):
            raise EinsumPathError(
                f"Invalid einsum_path is specified: step {step!r} does not name distinct "
                f"operands among the {remaining} left"
            )
        remaining -= len(positions) - 1
    if remaining != 1:
        raise EinsumPathError(f"Invalid einsum_path is specified: {remaining - 1} more operands has to be contracted.")


def _check_options(options: dict) -> Options:
    if not options:
        return _DEFAULT_OPTIONS
    known = {f.name for f in dataclasses.fields(Options)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise EinsumTypeError(
            f"unknown option {', '.join(map(repr, unknown))}: neither an argument of "
            f"numpy.einsum nor a polyc option ({', '.join(sorted(known))})"
        )
    return Options.from_kwargs(**options)


def _requested_dtype(dtype) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except TypeError as error:
        raise EinsumTypeError(f"einsum dtype {dtype!r} is not a data type: {error}") from None


def _compute_dtype(arrays: list[np.ndarray], dtype: np.dtype | None, casting: _Casting) -> np.dtype:
    if dtype is None:
        result = np.result_type(*arrays)
    else:
        result = dtype
        for n, array in enumerate(arrays):
            if not np.can_cast(array.dtype, result, casting):
                raise EinsumError(
                    f"operand {n} dtype could not be cast from {array.dtype.name} to "
                    f"{result.name} according to the rule '{casting}'"
                )
    if result.kind == "c":
        raise UnsupportedError(
            f"einsum on complex numbers ({result.name}) is not supported; split them into real and imaginary parts"
        )
    if result.name not in TC_TYPES:
        raise UnsupportedError(
            f"einsum on {result.name} is not supported; polyc computes in bool, "
            f"integer and float16/float32/float64 types"
        )
    return result


def _check_out(out: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, casting: _Casting) -> None:
    if out.shape != shape:
        raise EinsumError(f"out has shape {out.shape} but the result has shape {shape}")
    if not np.can_cast(dtype, out.dtype, casting):
        raise EinsumError(
            f"the result ({dtype.name}) could not be cast to out's dtype {out.dtype.name} "
            f"according to the rule '{casting}'"
        )
    if not out.flags.writeable:
        raise EinsumError("out is read-only")


def _label_strides(array: np.ndarray, term: tuple[int, ...], labels: tuple[int, ...]) -> tuple[int, ...]:
    """The stride of each of ``labels`` through ``array`` labelled by ``term``: the sum of the
    strides of its dimensions (a diagonal when it repeats), 0 where it is absent."""
    stride_of: dict[int, int] = {}
    for stride, label in zip(array.strides, term):
        stride_of[label] = stride_of.get(label, 0) + stride
    return tuple(stride_of.get(label, 0) for label in labels)


def _single_operand_view(array: np.ndarray, contraction: Contraction) -> np.ndarray:
    """The result of a one-operand einsum without sums, as a strided view of ``array``."""
    term = contraction.inputs[0]
    shape = tuple(array.shape[term.index(label)] for label in contraction.output)
    strides = _label_strides(array, term, contraction.output)
    owner = array
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    try:
        # A view of the array owning the memory, so that its base is the operand's base, as
        # numpy's views are.
        offset = array.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
        view = np.ndarray(shape, array.dtype, buffer=owner, offset=offset, strides=strides)
    except (TypeError, ValueError, BufferError):  # memory numpy cannot offer as a buffer
        view = np.lib.stride_tricks.as_strided(array, shape, strides, writeable=array.flags.writeable)
    if not array.flags.writeable:
        view.flags.writeable = False
    return view


def _c_ordered(strides: tuple[int, ...]) -> bool:
    """Whether the non-zero strides, by magnitude, never grow from one axis to the next."""
    magnitudes = [abs(stride) for stride in strides if stride]
    return all(a >= b for a, b in zip(magnitudes, magnitudes[1:]))


def _in_numpy_layout(
    result: np.ndarray, views: list[np.ndarray], contraction: Contraction, order: _Order
) -> np.ndarray:
    """``result`` (C-contiguous) in the layout numpy's iterator gives a new output for ``order``
    'K' or 'A', given the operands: a copy when that layout is not C order."""
    if order == "A":  # Fortran order if every operand is Fortran-contiguous
        return np.asfortranarray(result) if all(view.flags.f_contiguous for view in views) else result
    output_strides = [_label_strides(view, term, contraction.output) for view, term in zip(views, contraction.inputs)]
    if all(_c_ordered(strides) for strides in output_strides):
        return result  # no operand asks the iterator to reorder the axes: C order (the usual case, and cheap)
    over_output = [
        np.lib.stride_tricks.as_strided(view, result.shape, strides) for view, strides in zip(views, output_strides)
    ]
    operands: list[np.ndarray | None] = [*over_output, None]  # None: the iterator allocates the output
    op_flags: list[list[Literal["readonly", "writeonly", "allocate"]]] = [["readonly"]] * len(over_output)
    op_flags.append(["writeonly", "allocate"])
    iterator = np.nditer(
        operands,
        flags=["zerosize_ok", "refs_ok"],
        op_flags=op_flags,
        op_dtypes=[None] * len(over_output) + [result.dtype],
        order=order,
    )
    laid_out = iterator.operands[-1]
    if laid_out.flags.c_contiguous:
        return result
    laid_out[...] = result
    return laid_out
