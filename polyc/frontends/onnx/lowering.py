"""What ONNX operators lower to: TC statements over named values, views, and constants.

A session plans a model for one set of concrete input shapes (:mod:`polyc.frontends.onnx.plan`),
so every value has a concrete shape here.  A converter (:mod:`polyc.frontends.onnx.ops`) reads
its inputs as :class:`Value` s and, through a :class:`Builder`, either

- emits TC statements (:class:`KernelStep`) writing new values, each statement with explicit
  ``where`` ranges for all of its indices, so nothing depends on range inference;
- declares a view (:class:`ViewStep`): the same elements under another shape (Reshape,
  Flatten, Squeeze, Unsqueeze, Identity), which costs nothing at run time;
- or returns constants (Shape, Constant, a folded subgraph).

Rank-0 values are rank 1 of extent 1 in TC (``v(0)``) and get their empty shape back at the
session's edge.
"""

from __future__ import annotations

import functools
import math
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from polyc.errors import ModelError, PolycError, TCSyntaxError, UnsupportedError
from polyc.frontends.onnx.model import TC_TYPES
from polyc.lang import ast
from polyc.lang.parser import parse_statements
from polyc.lang.rewrite import walk


@dataclass(eq=False)
class Value:
    """A tensor of the planned graph.  ``ident`` names it in TC; ``const`` holds it when known
    at plan time (initializers, folded subgraphs)."""

    ident: str
    dtype: np.dtype
    shape: tuple[int, ...]
    const: np.ndarray | None = None
    onnx_name: str = ""

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def tc_shape(self) -> tuple[int, ...]:
        return self.shape if self.shape else (1,)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(eq=False)
class KernelStep:
    """TC statements of one node: read ``reads``, write ``writes``.  ``kind`` guides fusion:
    ``elementwise`` (each output element from the same-index elements of inputs, broadcast
    allowed), ``reduction``, ``contraction``, ``convolution``, ``recurrence`` (a ``for`` block:
    never fused), ``integer_convolution`` (an 8-bit convolution and its requantization for an integer
    convolution kernel: never fused), ``integer_product`` (an 8-bit matrix product for the integer kernel: it takes
    ``requantize`` steps and elementwise ones computing one element of its output each as its
    epilogues, and joins nothing), ``requantize`` (int32 sums scaled into an 8-bit type:
    otherwise as ``other``) or ``other``.  ``options``: polyc options the kernel these statements end up in
    should be compiled with (the session's own options win).  ``states``: values of ``writes``
    the statements read before writing them (a recurrence's state at the step before), which
    the def declares as outputs with their types and shapes.  The statements are syntax trees
    (:mod:`polyc.lang.ast`), parsed once from the converter's text and edited by the graph
    passes as trees (:mod:`polyc.lang.rewrite`); the statements of a ``for`` block each
    point at it."""

    node: str
    statements: list[ast.Statement]
    reads: list[Value]
    writes: list[Value]
    kind: str
    options: dict = field(default_factory=dict)
    states: list[Value] = field(default_factory=list)


@dataclass(eq=False)
class ViewStep:
    """``target`` is the elements of ``source`` from flat position ``offset`` on, under
    ``target``'s shape: a reshape, or a contiguous part (a Split along the outermost axis)."""

    node: str
    source: Value
    target: Value
    offset: int = 0

    def of(self, array: np.ndarray) -> np.ndarray:
        """The view of ``array`` (``source``'s elements, C-contiguous); its bits reinterpreted
        when ``target`` has another element type of the same width (BitCast)."""
        if array.dtype != self.target.dtype:
            array = array.view(self.target.dtype)
        if self.offset == 0 and array.size == self.target.size:
            return array.reshape(self.target.tc_shape)
        return array.reshape(-1)[self.offset : self.offset + self.target.size].reshape(self.target.tc_shape)


def values_read(step) -> list[Value]:
    """What a step reads: a kernel step's ``reads``, a view's ``source``."""
    return [step.source] if isinstance(step, ViewStep) else step.reads


def values_written(step) -> list[Value]:
    """What a step writes: a kernel step's ``writes``, a view's ``target``."""
    return [step.target] if isinstance(step, ViewStep) else step.writes


@dataclass
class Builder:
    """Emits the steps of one node.  ``vector_bits``: the SIMD width the plan's kernels are built
    for (:func:`polyc.runtime.compiler.vector_bits`), which decides layouts made for the gemm
    kernel's register blocks (0: portable C, no such layouts)."""

    node_name: str
    op_type: str
    new_ident: Callable[[], str]
    vector_bits: int
    steps: list = field(default_factory=list)

    # ------------------------------------------------------------------ values
    def new(self, shape, dtype, onnx_name: str = "") -> Value:
        shape = tuple(int(d) for d in shape)
        check_size(self.where, shape, dtype)
        return Value(self.new_ident(), np.dtype(dtype), shape, None, onnx_name)

    def const(self, array, onnx_name: str = "") -> Value:
        array = np.asarray(array)
        if array.dtype not in TC_TYPES:
            raise UnsupportedError(f"{self.where}: constant of type {array.dtype} is not supported")
        return Value(self.new_ident(), array.dtype, array.shape, array, onnx_name)

    def view(self, source: Value, shape) -> Value:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != source.size:
            raise UnsupportedError(f"{self.where}: cannot view {source.shape} as {shape}")
        return self.part(source, shape, 0)

    def part(self, source: Value, shape, offset: int, dtype=None) -> Value:
        """The ``prod(shape)`` elements of ``source`` from flat position ``offset`` on, as a
        value of ``shape``, without a copy; with ``dtype`` (of the same width), their bits read
        as that type."""
        shape = tuple(int(d) for d in shape)
        dtype = source.dtype if dtype is None else np.dtype(dtype)
        if dtype.itemsize != source.dtype.itemsize:
            raise UnsupportedError(f"{self.where}: cannot read {source.dtype} as {dtype}, of another width")
        step = ViewStep(self.node_name, source, Value("", dtype, shape), offset)
        if source.const is not None:
            return self.const(step.of(np.ascontiguousarray(source.const)).reshape(shape))
        step.target = self.new(shape, dtype)
        self.steps.append(step)
        return step.target

    @property
    def where(self) -> str:
        return f"node {self.node_name!r} ({self.op_type})"

    # ------------------------------------------------------------------ TC text
    def ref(self, value: Value, subscripts) -> str:
        """``value`` at ``subscripts`` (strings), or its literal when it is a constant scalar."""
        literal = self.literal(value)
        if literal is not None:
            return literal
        subscripts = list(subscripts) if value.shape else ["0"]
        return f"{value.ident}({', '.join(subscripts)})"

    @staticmethod
    def literal(value: Value) -> str | None:
        """A constant scalar's TC literal (finite numbers only; bools and others stay tensors)."""
        if value.const is None or value.const.size != 1 or value.dtype.kind not in "fiu":
            return None
        number = value.const.reshape(()).item()
        if value.dtype.kind == "f":
            if not math.isfinite(number):
                return None
            text = repr(float(number))
            if value.dtype != np.float32 and value.dtype != np.float64:
                # float16 and bfloat16 have no literals: a cast of the float, which is exact.
                return f"{tc_type(value.dtype)}({text})"
            return f"({text})" if number < 0 else text
        if value.dtype != np.int64 and value.dtype != np.int32:
            return None
        # Typed: a statement of literals alone would otherwise compute in TC's default int.
        return f"{tc_type(value.dtype)}({int(number)})"

    def broadcast_subscripts(self, value: Value, out_shape, indices) -> list[str]:
        """Subscripts of ``value`` inside an output of ``out_shape`` indexed by ``indices``
        (numpy broadcasting: dimensions aligned right, extent 1 read at 0)."""
        offset = len(out_shape) - value.rank
        if offset < 0:
            raise UnsupportedError(f"{self.where}: cannot broadcast {value.shape} to {tuple(out_shape)}")
        subscripts = []
        for d, extent in enumerate(value.shape):
            if extent == out_shape[offset + d]:
                subscripts.append(indices[offset + d])
            elif extent == 1:
                subscripts.append("0")
            else:
                raise UnsupportedError(f"{self.where}: cannot broadcast {value.shape} to {tuple(out_shape)}")
        return subscripts

    @staticmethod
    def ranges(names, extents) -> str:
        parts = [f"{n} in 0:{e}" for n, e in zip(names, extents)]
        return " where " + ", ".join(parts) if parts else ""

    def statement(self, target: Value, indices, op: str, rhs: str, reductions=()) -> str:
        """``target(indices) op rhs where <every index and reduction index with its range>``;
        ``reductions`` are (name, extent) pairs."""
        indices = list(indices) if target.shape else ["z0"]
        extents = list(target.tc_shape)
        # A reduction over one element of an operand inlined as a literal (a folded constant of
        # one element) no longer reads its index, which TC refuses: it is the value itself.
        if any(e == 1 for _, e in reductions):
            read = self.indices_read(rhs)
            reductions = [(r, e) for r, e in reductions if e != 1 or r in read]
        if not reductions and op.endswith("=!"):
            op = "="
        names = indices + [r for r, _ in reductions]
        extents += [e for _, e in reductions]
        return f"{target.ident}({', '.join(indices)}) {op} {rhs}{self.ranges(names, extents)}"

    def indices_read(self, rhs: str) -> set[str]:
        """The bare names (indices) that the right-hand side ``rhs`` reads."""
        (parsed,) = self.parsed(f"_rhs(z0) = {rhs}")
        return {node.name for node in walk(parsed.rhs) if isinstance(node, ast.Name)}

    def emit(self, statements, reads, writes, kind: str, options: dict | None = None, states=()) -> None:
        """A kernel step of ``statements`` (TC text: statements, or a ``for`` block each)."""
        reads = [r for r in reads if self.literal(r) is None]
        parsed = [s for text in statements for s in self.parsed(text)]
        self.steps.append(
            KernelStep(self.node_name, parsed, _unique(reads), list(writes), kind, dict(options or {}), list(states))
        )

    def parsed(self, text: str) -> tuple[ast.Statement, ...]:
        """The statements of ``text``, which this node's converter wrote."""
        try:
            return _parsed_statements(text)
        except TCSyntaxError as error:
            raise PolycError(
                f"{self.where}: polyc's converter wrote TC that does not parse (a bug in the ONNX "
                f"lowering; please report it): {error}"
            ) from error


@functools.lru_cache(maxsize=4096)
def _parsed_statements(text: str) -> tuple[ast.Statement, ...]:
    """The statements of ``text``, remembered: the trees are immutable, and a plan made again
    for the same nodes (a detector's stages for each new image, a new session of a model) writes
    the same text, whose parse would otherwise be a large share of its planning.  (Their
    locations name no node: a def is checked from its printed text, :mod:`.plan`.)"""
    return parse_statements(text, "<onnx>")


def _unique(values):
    seen, result = set(), []
    for v in values:
        if id(v) not in seen:
            seen.add(id(v))
            result.append(v)
    return result


#: (id of a constant, how it is laid out) -> (a weak reference to the constant, the layout).
_DERIVED: dict[tuple[int, tuple], tuple[weakref.ref, np.ndarray]] = {}
_DERIVED_LOCK = threading.Lock()


def derived_constant(source: np.ndarray, how: tuple, make: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``make(source)``, remembered while ``source`` lives: a layout made of a constant (weights
    blocked as the gemm kernel reads them) is made once for all the plans that read it, not
    once per plan (a detector's stages are planned anew for each new count: Faster R-CNN's
    box head, 51 MB of weights, was laid out again in every new image)."""
    key = (id(source), how)
    with _DERIVED_LOCK:
        entry = _DERIVED.get(key)
        if entry is not None and entry[0]() is source:
            return entry[1]
    derived = make(source)
    with _DERIVED_LOCK:
        _DERIVED[key] = (weakref.ref(source, functools.partial(_forget_derived, key)), derived)
    return derived


def _forget_derived(key: tuple[int, tuple], _: weakref.ref) -> None:
    """Drops the layout made of a constant that no longer lives."""
    _DERIVED.pop(key, None)


@functools.cache
def machine_memory() -> int:
    """This machine's physical memory in bytes (2^63 where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 2**63


def check_size(where: str, shape: tuple[int, ...], dtype) -> None:
    """Refuses a value of ``shape`` with a negative extent, or larger than this machine's memory
    (pads of 10^9, a ConstantOfShape of 2^62 rows: a clear error at once, not a MemoryError
    when the session runs)."""
    if any(extent < 0 for extent in shape):
        raise ModelError(f"{where}: a value of shape {shape}, with a negative extent")
    size = math.prod(shape) * np.dtype(dtype).itemsize
    if size > machine_memory():
        raise ModelError(
            f"{where}: a value of shape {shape} ({np.dtype(dtype)}) needs {size / 2**30:.3g} GiB, "
            f"more than this machine's memory ({machine_memory() / 2**30:.3g} GiB)"
        )


def indices(rank: int, prefix: str = "i") -> list[str]:
    return [f"{prefix}{d}" for d in range(rank)]


def broadcast_shape(where: str, *shapes) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError as error:
        raise UnsupportedError(
            f"{where}: shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast"
        ) from error


def tc_type(dtype) -> str:
    return TC_TYPES[np.dtype(dtype)]
