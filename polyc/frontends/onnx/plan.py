"""A model planned for one set of concrete input shapes: folded, fused, compiled to polyc kernels.

1. **Convert** every node in graph order (:mod:`polyc.frontends.onnx.ops`).  A node whose inputs
   are all constants (initializers, shapes, folded results) is **folded**: its TC statements are
   evaluated now by polyc's reference interpreter, so shape subgraphs (Shape -> Gather -> Concat
   -> Reshape) and constant arithmetic cost nothing at run time.
   With ``channels_last``, 2-D convolutions and the pools and elementwise operators between
   them are converted in NHWC instead (:mod:`polyc.frontends.onnx.channels_last`), with
   transposes only where a value crosses between the layouts.
2. **Fuse** (``graph_fusion=True``), in the spirit of TVM's rules: an elementwise step joins the
   kernel that produces its input when that input has no other use (a convolution's or a
   contraction's epilogue: bias, batch normalization, activation; chains of elementwise steps),
   updating the producer's tensor in place so that polyc's convolution and gemm kernels still
   recognise the def; a reduction joins a kernel of elementwise steps that feeds it.  Each group
   becomes ONE TC def whose intermediate tensors are temporaries.
3. **Compile** each group with ``polyc.define`` (so the bounds proof, the schedule and the
   kernel cache are polyc's own), and run them in order; views (Reshape, Flatten, ...) are
   reshapes of the buffers, without a copy.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from polyc.driver import build_ahead, compiler_options
from polyc.errors import ModelError, PolycError, UnsupportedError
from polyc.frontends.onnx.channels_last import ChannelsLast
from polyc.frontends.onnx.functions import (
    FlatNode,
    LoopIterations,
    expand,
    if_branch,
    is_if,
    is_loop,
    is_scan,
    tensor_type,
    unrolled_scan,
)
from polyc.frontends.onnx.lowering import Builder, KernelStep, Value, ViewStep, tc_type, values_read, values_written
from polyc.frontends.onnx.memory import Arena, plan_memory
from polyc.frontends.onnx.ops import CONVERTERS, converter_for
from polyc.frontends.onnx.ops.base import Node
from polyc.frontends.onnx.permutations import fold_transposes
from polyc.frontends.onnx.qdq import integer_node_units
from polyc.frontends.onnx.stages import Carried, Continuation, names_read, value_to_probe
from polyc.lang import ast
from polyc.lang.printer import format_def
from polyc.lang.rewrite import (
    index_names,
    integer_literal,
    reads_of,
    rename_def_tensors,
    rename_tensors,
    replace_expr,
    replace_in_statement,
    statement_expressions,
    tensors_written_and_read,
    whole_ranges,
)
from polyc.options import Options
from polyc.runtime.arguments import allocate
from polyc.runtime.compiler import vector_bits as build_vector_bits
from polyc.runtime.sequence import sequence_runner

if TYPE_CHECKING:
    from polyc.api import Kernel

logger = logging.getLogger(__name__)

#: The most statements one fused group may hold (isl's scheduler grows with them).
MAX_GROUP_STATEMENTS = 12
_FUSABLE_INTO = {
    "elementwise": ("elementwise", "contraction", "convolution", "reduction", "other", "integer_product", "requantize"),
    "reduction": ("elementwise",),
    # (the integer kernel applies these to each block of its int32 sums: polyc.paths.integer_gemm)
    "requantize": ("integer_product",),
}


@dataclass(eq=False)
class Group:
    """One TC def: the steps fused into it, and after planning its inputs, outputs and kernel."""

    index: int
    steps: list[KernelStep]
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    #: The def, once its inputs and outputs are known (:func:`_def_tree`).
    definition: ast.Def | None = None
    #: The compiled def, once planned (:meth:`Plan._compile`); see :attr:`compiled`.
    kernel: Kernel | None = None
    #: The values' idents -> their names in the kernel's def (see :func:`_canonical_def`).
    tensor_names: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        """The def as TC text, after a comment naming the group's ONNX nodes."""
        definition = self.definition if self.definition is not None else _def_tree(self)
        return f"# {', '.join(self.nodes)}\n{format_def(definition)}"

    @property
    def compiled(self) -> Kernel:
        """The group's kernel, which a plan compiles before it runs."""
        if self.kernel is None:
            raise PolycError(f"{self.name} is not compiled yet (a polyc bug)")
        return self.kernel

    def starts_unread(self, value: Value) -> bool:
        """Whether the kernel writes all of ``value`` before it reads any of it."""
        return self.tensor_names[value.ident] in self.compiled._written_before_read

    @property
    def name(self) -> str:
        return f"group{self.index}"

    @property
    def nodes(self) -> list[str]:
        seen = []
        for step in self.steps:
            if step.node not in seen:
                seen.append(step.node)
        return seen

    @property
    def kinds(self) -> set[str]:
        return {s.kind for s in self.steps}

    @property
    def statement_count(self) -> int:
        return sum(len(s.statements) for s in self.steps)


@contextlib.contextmanager
def _raw_errors_named(node: Node):
    """A converter's Python error (an index out of range, a division by zero...) as a
    :class:`ModelError` naming the node: a malformed node that no check above caught."""
    try:
        yield
    except (ArithmeticError, IndexError, KeyError, TypeError, ValueError, MemoryError) as error:
        raise ModelError(
            f"node {node.name!r} ({node.op_type}) cannot be converted ({type(error).__name__}: {error}): "
            "its attributes or inputs break the ONNX specification, or polyc has a bug (please report it)"
        ) from error


class Plan:
    """The model's graph for the input shapes ``shapes`` (name -> tuple of ints)."""

    def __init__(
        self,
        graph,
        opset: int,
        shapes: dict[str, tuple[int, ...]],
        dtypes: dict[str, np.dtype],
        constants: dict[str, np.ndarray],
        options: dict,
        graph_fusion: bool,
        channels_last: bool = False,
        nodes: list | None = None,
        progress: bool | None = None,
    ):
        """``nodes``: the FlatNodes (and LoopIterations) to plan, when not the graph's own (the
        rest of a graph after a stage, :mod:`.stages`); ``shapes`` and ``dtypes`` then give the
        values it reads from the stages before.  ``progress``: a progress bar over the kernels
        of the first run's compile (:func:`polyc.driver.build_ahead`; None: where the output
        is a terminal or a notebook, unless ``POLYC_PROGRESS=0``)."""
        started = time.perf_counter()
        self._progress = progress
        self._counter = 0
        self.fed_by_a_stage = nodes is not None
        self.values = _Values(constants, self._new_ident)
        self.inputs: list[Value] = []
        for name, shape in shapes.items():
            value = Value(self._new_ident(), dtypes[name], tuple(shape), None, name)
            self.values[name] = value
            self.inputs.append(value)
        steps: list = []
        #: The rest of the graph, when this plan stops to learn a value computed from data.
        self.continuation: Continuation | None = None
        # The layouts made for the gemm kernel's register blocks follow the instruction set the
        # kernels are built for ($POLYC_CFLAGS or the cflags option), not the processor's.
        vector_bits = build_vector_bits(compiler_options(Options.from_kwargs(**options)))
        layout = ChannelsLast(self.values, self._new_ident, vector_bits, options) if channels_last else None
        if nodes is None:
            protos = list(graph.node)
            if graph_fusion:
                graph_outputs = {o.name for o in graph.output}
                protos = integer_node_units(
                    protos,
                    graph_outputs,
                    lambda name: self.values[name].const if name in self.values else None,
                    self._add_constant,
                    lambda op_type, domain: is_converted(op_type, domain, opset),
                    opset,
                )
                protos = fold_batch_norms(protos, graph_outputs, self.values, self._new_ident)
            nodes = [
                FlatNode(proto, opset, proto.name or f"{proto.op_type}_{position}", "")
                for position, proto in enumerate(protos)
            ]
        node_count = len(nodes)
        pending = collections.deque(nodes)
        # Items that need a value computed from data wait for the next stage, with every item
        # that reads what they give; the others are planned now, so that a stage learns all
        # the values it can at once (SSDlite's 90 per-class counts: one stage, not 90).
        waiting: list = []
        waiting_for: set[str] = set()
        probes: list[str] = []
        while pending:
            flat = pending.popleft()
            probe = value_to_probe(flat, self.values, CONVERTERS)
            if probe is not None or waiting_for and not waiting_for.isdisjoint(names_read([flat])):
                if probe is not None and probe not in probes:
                    probes.append(probe)
                waiting.append(flat)
                waiting_for.update(flat.proto.output)
                continue
            replaced = _replaced(flat, self.values)
            if replaced is not None:  # an operator planned in stages (ops/data_dependent.py)
                pending.extendleft(reversed(replaced))
                continue
            if isinstance(flat, LoopIterations):  # the next iteration, or the loop's outputs
                pending.extendleft(reversed(flat.next(self._constant_of)))
                continue
            proto, node_opset = flat.proto, flat.opset
            if is_loop(proto):
                pending.appendleft(LoopIterations(proto, flat.name, node_opset))
                continue
            if is_if(proto):
                pending.extendleft(reversed(if_branch(proto, flat.name, self._condition(proto, flat.name), node_opset)))
                continue
            if is_scan(proto):
                shapes = {n: self.values[n].shape for n in proto.input if n in self.values}
                pending.extendleft(reversed(unrolled_scan(proto, flat.name, node_opset, shapes)))
                continue
            if not is_converted(proto.op_type, proto.domain, node_opset):
                pending.extendleft(reversed(expand(proto, flat.name, node_opset, self._types_of(proto.input))))
                continue
            node = Node(proto, flat.name)
            if layout is not None:
                with _raw_errors_named(node):
                    converted = layout.convert(node, node_opset)
                if converted is not None:
                    steps += converted
                    continue
                steps += layout.need_nchw(proto.input)
            inputs = [self.values[name] if name else None for name in proto.input]
            builder = Builder(node.name, node.op_type, self._new_ident, vector_bits)
            converter = converter_for(node.op_type, proto.domain)
            if converter is None:  # (is_converted said there is one)
                raise UnsupportedError(f"node {node.name!r}: no converter of {node.op_type}")
            with _raw_errors_named(node):
                outputs = converter.convert(builder, node, inputs, node_opset)
            if _foldable(builder.steps, inputs):
                _fold(builder.steps, node.name)
            else:
                steps += builder.steps
            for name, value in zip(proto.output, outputs):
                if name:
                    value.onnx_name = value.onnx_name or name
                    self.values[name] = value
        if waiting:

            def plan_rest(rest, shapes, dtypes, known):
                return Plan(graph, opset, shapes, dtypes, known, options, graph_fusion, channels_last, rest, progress)

            steps += self._stop_before(waiting, probes, graph, layout, plan_rest)
        if self.continuation is not None:
            self.output_names: list[str] = [c.name for c in self.continuation.carried]
        else:
            self.output_names = [o.name for o in graph.output]
            if layout is not None:
                steps += layout.need_nchw(self.output_names)
            missing = [name for name in self.output_names if name not in self.values]
            if missing:
                raise PolycError(f"the graph's outputs {', '.join(missing)} are not computed by any node")
        self.outputs = [self.values[name] for name in self.output_names]
        if graph_fusion:
            steps = fold_transposes(steps, self.outputs)
            steps = inline_elementwise(steps, self.outputs)
        self.order = self._fuse(steps, graph_fusion)
        if graph_fusion:
            self.order = self._fuse_pointwise_into_depthwise(self.order, options)
        self.groups = [item for item in self.order if isinstance(item, Group)]
        self._compile(options)
        read = {v.ident for item in self.order for v in ([item.source] if isinstance(item, ViewStep) else item.inputs)}
        #: The inputs a kernel or a view reads: a stage's others are only passed on, as they came.
        self._fed = [v for v in self.inputs if v.ident in read]
        # The kernels' outputs that they overwrite before reading go to the arena (memory.py).
        starts_unread = [v for g in self.groups for v in g.outputs if g.starts_unread(v)]
        self.memory = plan_memory(self.order, self.outputs, starts_unread)
        self._arena_values = [v for v in starts_unread if v.ident in self.memory.offsets]
        self._idle_arenas: list[Arena] = []
        self._arenas_lock = threading.Lock()
        self._built = False
        self._build_lock = threading.Lock()
        self._ran = False
        distinct = len({id(g.kernel) for g in self.groups})
        logger.info(
            "planned %d node(s) as %d kernel(s) (%d distinct) and %d view(s) in %.2f s%s",
            node_count,
            len(self.groups),
            distinct,
            len(self.order) - len(self.groups),
            time.perf_counter() - started,
            (
                f"; the rest of the graph is planned once {', '.join(map(repr, self.continuation.probes))} "
                "is known (computed from data)"
                if self.continuation is not None
                else ""
            ),
        )

    def _stop_before(self, rest: list, probes: list[str], graph, layout, make_plan) -> list:
        """Ends the plan before ``rest`` (items that need the contents of ``probes``, computed at
        run time, and the items that read what those give): the values ``rest`` and the
        graph's outputs read become this plan's outputs, and the continuation plans ``rest``
        once they are known.  Returns the steps giving NHWC values back their NCHW form."""
        wanted = sorted(names_read(rest) | {o.name for o in graph.output})
        steps = layout.need_nchw(wanted) if layout is not None else []
        carried = [
            Carried(name, self.values[name].shape, self.values[name].dtype)
            for name in wanted
            if name in self.values and self.values[name].const is None
        ]
        constants = self.values.constants()
        self.continuation = Continuation(rest, carried, probes, constants, make_plan)
        return steps

    def stages(self) -> list[Plan]:
        """This plan and, when it stops for a value computed from data, the plans of the rest
        that the last run took, in order."""
        chain = [self]
        while chain[-1].continuation is not None and chain[-1].continuation.last is not None:
            chain.append(chain[-1].continuation.last)
        return chain

    def every_plan(self) -> list[Plan]:
        """This plan and every plan made for the rest of its graph so far."""
        found, pending = [], [self]
        while pending:
            plan = pending.pop()
            found.append(plan)
            if plan.continuation is not None:
                pending += plan.continuation.plans()
        return found

    def _constant_of(self, name: str):
        value = self.values.get(name)
        return None if value is None else value.const

    def _condition(self, proto, name: str) -> bool:
        condition = self.values.get(proto.input[0]) if proto.input else None
        if condition is None or condition.size != 1:
            raise PolycError(
                f"node {name!r} (If): its condition must be one boolean, not "
                f"{'missing' if condition is None else f'of shape {condition.shape}'}"
            )
        if condition.const is None:  # (a stage learns a condition computed from data: stages.py)
            raise UnsupportedError(f"node {name!r} (If): its condition is not known when the model is planned")
        return bool(condition.const.reshape(()))

    def _types_of(self, names) -> list:
        """The TypeProtos of the values named, as the functions' bodies are built from them."""
        from onnx import helper

        return [
            tensor_type(helper.np_dtype_to_tensor_dtype(self.values[n].dtype), self.values[n].shape)
            if n in self.values
            else None
            for n in names
        ]

    def _add_constant(self, name: str, array: np.ndarray) -> None:
        """A constant the plan makes (see :func:`.qdq.integer_node_units`)."""
        self.values[name] = Value(self._new_ident(), array.dtype, array.shape, array, name)

    def _new_ident(self) -> str:
        self._counter += 1
        return f"v{self._counter}"

    # ------------------------------------------------------------------ fusion
    def _fuse(self, steps: list, graph_fusion: bool) -> list:
        uses: dict[int, int] = {}
        for step in steps:
            for value in values_read(step):
                uses[id(value)] = uses.get(id(value), 0) + 1
        for value in self.outputs:
            uses[id(value)] = uses.get(id(value), 0) + 1
        order: list = []
        made_by: dict[int, int] = {}  # value id -> position in order of the item writing it
        renamed: dict[str, Value] = {}  # an epilogue's old tensor name -> its value (now the producer's name)
        for step in steps:
            if isinstance(step, ViewStep):
                made_by[id(step.target)] = len(order)
                order.append(step)
                continue
            written = list(step.writes)
            target = self._fusion_target(step, order, made_by, uses) if graph_fusion else None
            if target is None and graph_fusion and self._fuse_through_view(step, order, made_by, uses):
                continue
            if target is None:
                group = Group(len(order), [step])
                position = len(order)
                order.append(group)
            else:
                position, producer = target
                group = order[position]
                writer = (
                    next((s for s in reversed(group.steps) if any(w is producer for w in s.writes)), None)
                    if producer is not None
                    else None
                )
                if producer is not None:  # an epilogue: it updates the producer's tensor
                    renamed[step.writes[0].ident] = step.writes[0]
                    step.writes[0].ident = producer.ident
                if writer is not None and _fold_into_writer(writer, step, producer):
                    step.statements, step.reads, step.writes = [], [], []  # listed, computed by `writer`
                group.steps.append(step)
            for value in written:
                made_by[id(value)] = position
        if renamed:  # the statements reading or writing those values name them as they were
            renaming = {old: value.ident for old, value in renamed.items()}
            touched = {id(value) for value in renamed.values()}
            for item in order:
                if isinstance(item, Group):
                    for step in item.steps:
                        if any(id(v) in touched for v in step.reads + step.writes):
                            step.statements = [rename_tensors(s, renaming) for s in step.statements]
        groups = [item for item in order if isinstance(item, Group)]
        for number, group in enumerate(groups):
            group.index = number
        return order

    def _fusion_target(self, step: KernelStep, order, made_by, uses):
        """(position of the group ``step`` joins, the value it may update in place or None)."""
        if step.kind not in _FUSABLE_INTO:
            return None
        best = None
        for value in step.reads:
            position = made_by.get(id(value))
            if position is None or not isinstance(order[position], Group) or uses.get(id(value)) != 1:
                continue
            group = order[position]
            if (
                not group.kinds <= set(_FUSABLE_INTO[step.kind])
                or group.statement_count + len(step.statements) > MAX_GROUP_STATEMENTS
            ):
                continue
            if "integer_product" in group.kinds and any(w.size != value.size for w in step.writes):
                continue  # the integer kernel's epilogues compute one element of its output each
            # Every other input must exist when that group runs.
            if any(made_by.get(id(other), -1) > position for other in step.reads if other is not value):
                continue
            if best is None or position > best[0]:
                best = (position, value)
        if best is None:
            return None
        position, value = best
        # Not a scalar: its statements write it at index z0 but read it at 0 (Builder.ref), and
        # TC rejects a statement that reads its target at other indices than it writes.
        in_place = (
            step.kind == "elementwise"
            and len(step.writes) == 1
            and step.writes[0].shape == value.shape
            and step.writes[0].dtype == value.dtype
            and value not in self.outputs
            and len(value.shape) > 0
        )
        return position, (value if in_place else None)

    def _fuse_through_view(self, step: KernelStep, order, made_by, uses) -> bool:
        """Makes ``step``, elementwise on a view ``v`` that merges dimensions of a kernel's
        tensor ``t`` (a product by blocked weights ``(.., N / NR, NR)`` viewed as ``(.., N)``),
        an epilogue of that kernel, updating ``t`` in place at ``t``'s indices; the view then
        gives the step's result.  Only where ``v`` and ``t`` have no other use.  Returns
        whether it did."""
        if step.kind != "elementwise" or len(step.statements) != 1 or len(step.writes) != 1:
            return False
        result, statement = step.writes[0], step.statements[0]
        if not _plain_assignment(statement) or statement.target != result.ident:
            return False
        for view in step.reads:
            position = made_by.get(id(view))
            item = order[position] if position is not None else None
            if not isinstance(item, ViewStep) or item.target is not view or item.offset or uses.get(id(view)) != 1:
                continue
            tensor = item.source
            producer = made_by.get(id(tensor))
            group = order[producer] if producer is not None else None
            if (
                not isinstance(group, Group)
                or uses.get(id(tensor)) != 1
                or id(tensor) in {id(v) for v in self.outputs}
                or not group.kinds <= set(_FUSABLE_INTO["elementwise"])
                or group.statement_count + 1 > MAX_GROUP_STATEMENTS
                or result.shape != view.shape
                or result.dtype != tensor.dtype
                or any(made_by.get(id(other), -1) > producer for other in step.reads if other is not view)
            ):
                continue
            merged = _merged_statement(statement, view, tensor)
            if merged is None:
                continue
            step.statements = [merged]
            step.reads = [tensor if r is view else r for r in step.reads]
            step.writes = [tensor]
            group.steps.append(step)
            item.target = result  # the view of the updated tensor is the step's result
            made_by[id(result)] = position
            return True
        return False

    def _fuse_pointwise_into_depthwise(self, order: list, options: dict) -> list:
        """Merges a group that computes a 1 x 1 convolution (with its epilogues) into the next
        group when that is a depthwise convolution alone reading the result, where polyc compiles
        the pair as one kernel (:func:`polyc.schedule.convolution.recognise_pointwise_depthwise_def`):
        the expanded tensor of an inverted-residual block then never goes to memory (mobilenet_v2's
        first is 4.8 MB an image)."""
        if options.get("backend", "c") != "c" or options.get("direct_convolutions") is False:
            return order
        uses: dict[int, int] = {}
        for value in self.outputs + [v for item in order for v in _reads_of(item)]:
            uses[id(value)] = uses.get(id(value), 0) + 1
        merged: list = []
        for item in order:
            previous = merged[-1] if merged else None
            if not isinstance(item, Group) or not isinstance(previous, Group):
                merged.append(item)
                continue
            pair = Group(0, previous.steps + item.steps)
            if (
                previous.steps[0].kind == item.steps[0].kind == "convolution"
                and pair.statement_count <= MAX_GROUP_STATEMENTS
                and _fused_pair(pair, previous, uses)
            ):
                merged[-1] = pair
            else:
                merged.append(item)
        for number, group in enumerate(item for item in merged if isinstance(item, Group)):
            group.index = number
        return merged

    # ------------------------------------------------------------------ compilation
    def _compile(self, options: dict) -> None:
        from polyc.api import define

        needed_later: dict[int, int] = {}
        for position, item in enumerate(self.order):
            for value in _reads_of(item):
                needed_later[id(value)] = max(needed_later.get(id(value), -1), position)
        outputs = {id(v) for v in self.outputs}
        for position, group in enumerate(self.order):
            if not isinstance(group, Group):
                continue
            written = _written_by(group)
            group.inputs = _inputs_of(group, written)
            states = {id(v) for step in group.steps for v in step.states}
            group.outputs = [
                v
                for key, v in written.items()
                if key in outputs or key in states or needed_later.get(key, -1) > position
            ]
            if not group.outputs:  # nothing of it is used: keep the last value so the def has an output
                group.outputs = [list(written.values())[-1]]
            group.definition = _def_tree(group)
            canonical, group.tensor_names = _canonical_def(group.definition)
            try:
                wanted = {k: v for step in group.steps for k, v in step.options.items()}
                given = {**wanted, **options}
                if wanted.get("winograd") is False:  # a step whose sums must stay exact (integer convolutions)
                    given["winograd"] = False
                # (the compiler and its flags as the environment gives them now: $POLYC_CFLAGS)
                key = (canonical, repr(sorted(given.items())), compiler_options(Options.from_kwargs(**given)))
                group.kernel = _shared_kernel(
                    key, lambda: define(canonical, filename=f"<onnx {group.name}>", **given)[CANONICAL_NAME]
                )
            except PolycError as error:
                raise PolycError(
                    f"nodes {', '.join(group.nodes)}: polyc cannot compile their TC "
                    f"(a bug in the ONNX lowering; please report it):\n{group.source}\n{error}"
                ) from error

    # ------------------------------------------------------------------ running
    def run(self, feeds: dict[str, np.ndarray], seconds: list | None = None) -> dict[str, np.ndarray]:
        """The outputs by ONNX name.  ``seconds``: a list that gets each kernel call's wall time,
        in the plan's order, when the run takes the resolved calls (every run after the first
        on an arena).  A plan that stops to learn a value computed from data runs the plan of
        the rest for it after (:mod:`.stages`), and so on."""
        first, started = not self._ran, time.perf_counter()
        plan, results = self, self._run_stage(feeds, seconds)
        while plan.continuation is not None:
            plan, feeds = plan.continuation.next(results)
            results = plan._run_stage(feeds, seconds)
        if first:
            self._ran = True
            logger.info("first run (compiling what the cache lacks) in %.2f s", time.perf_counter() - started)
        return results

    def _run_stage(self, feeds: dict[str, np.ndarray], seconds: list | None = None) -> dict[str, np.ndarray]:
        """This plan's outputs by ONNX name (the graph's, or the values its rest reads)."""
        with self._arenas_lock:
            arena = self._idle_arenas.pop() if self._idle_arenas else None
        arena = arena or Arena(self.memory, self._arena_values)
        try:
            buffers = self._run_in(arena, feeds, seconds)
        finally:
            with self._arenas_lock:
                self._idle_arenas.append(arena)
        # Values that go on to the next stage, which only reads them, are not copied (those
        # this stage was given go on as they came); the user's outputs never share memory with
        # the feeds.
        given = {id(v) for v in self.inputs}
        outputs = {}
        if self.continuation is not None:
            for name, value in zip(self.output_names, self.outputs):
                if id(value) in given:
                    outputs[name] = feeds[value.onnx_name]
                else:
                    array = _array(value, buffers)
                    outputs[name] = array if array.shape == value.shape else array.reshape(value.shape)
            return outputs
        for name, value in zip(self.output_names, self.outputs):
            if id(value) in given:
                outputs[name] = np.array(feeds[value.onnx_name], copy=True).reshape(value.shape)
                continue
            array = _array(value, buffers).reshape(value.shape)
            if value.const is not None or not array.flags.owndata and _aliases_input(array, buffers, self._fed):
                array = np.array(array, copy=True)
            outputs[name] = array
        return outputs

    def _run_in(self, arena: Arena, feeds: dict[str, np.ndarray], seconds: list | None = None) -> dict[str, np.ndarray]:
        buffers = self._feed_buffers(feeds)
        # (A stage's feeds are the stage before's values, of the dtypes its plan was made for.)
        if arena.resolved is not None and (self.fed_by_a_stage or arena.resolved.takes(buffers)):
            return arena.resolved.run(buffers, seconds)
        calls = list(self._checked_steps(arena, buffers))
        if arena.resolved is None:
            arena.resolved = _ResolvedRun(self, arena, calls)
        return buffers

    def _feed_buffers(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The feeds (ONNX input name -> array) by ident, C-contiguous, in their TC shapes.
        (A stage of a detector passes on some 60 values: each is taken as it is when it is
        already so, which halved the time between the kernels of SSDlite's 188 stages.)"""
        buffers = {}
        for value in self._fed:
            array, shape = feeds[value.onnx_name], value.tc_shape
            if type(array) is not np.ndarray or array.shape != shape or not array.flags.c_contiguous:
                array = np.ascontiguousarray(array).reshape(shape)
            buffers[value.ident] = array
        return buffers

    def _checked_steps(self, arena: Arena, buffers: dict):
        """Runs the plan's steps on ``arena`` through the checked path, yielding each kernel
        call (:meth:`_checked_call`) as it returns."""
        self._build_kernels()
        for item in self.order:
            if isinstance(item, ViewStep):
                buffers[item.target.ident] = item.of(_array(item.source, buffers))
                continue
            yield self._checked_call(item, arena, buffers)

    def _build_kernels(self) -> None:
        """Before the first run: every kernel's library, the C compiler running on every
        processor while the next kernel's C is generated (:func:`polyc.driver.build_ahead`).
        The plan's sizes are fixed, so its defs have none (those of any other def are known
        only at its call, which compiles it)."""
        with self._build_lock:
            if not self._built:
                named: dict[int, tuple] = {}  # (groups may share one kernel: named after the first)
                for group in self.groups:
                    if id(group.kernel) not in named and not group.compiled.definition.sizes:
                        named[id(group.kernel)] = (group.compiled, {}, _kernel_label(group))
                logger.info("compiling %d kernel(s)", len(named))
                build_ahead(named.values(), progress=self._progress, description="polyc: compiling the model")
                self._built = True

    @staticmethod
    def _checked_call(item: Group, arena: Arena, buffers: dict) -> tuple:
        """Call a group's kernel through :class:`polyc.api.Kernel` on its input arrays and its
        outputs: the arena's, or fresh (the values returned to the user, and outputs that must
        start as zeros), which join ``buffers``.  Returns (item, inputs, outputs)."""
        inputs = [_array(v, buffers) for v in item.inputs]
        outputs = [arena.arrays.get(v.ident) for v in item.outputs]
        if any(array is None for array in outputs):
            outputs = [
                array if array is not None else allocate(v.tc_shape, v.dtype, item.starts_unread(v))
                for array, v in zip(outputs, item.outputs)
            ]
        try:
            results = item.compiled(*inputs, outputs=outputs)
        except PolycError as error:
            raise _in_group(error, item) from error
        results = results if isinstance(results, tuple) else (results,)
        for value, array in zip(item.outputs, results):
            buffers[value.ident] = array
        return item, inputs, outputs

    def kernel_inputs(self, feeds: dict[str, np.ndarray]) -> list[tuple[Group, list[np.ndarray]]]:
        """Each kernel call of a run on ``feeds`` (ONNX input name -> array), in order, with the
        arrays it reads: what a tuner measures the kernels on.  The run has an arena of its
        own, whose memory later kernels reuse, so the arrays read from it are copies."""
        calls, plan = [], self
        while True:
            steps = plan._checked_steps(Arena(plan.memory, plan._arena_values), plan._feed_buffers(feeds))
            calls += [
                (
                    item,
                    [
                        array if value.const is not None else np.array(array, copy=True)
                        for value, array in zip(item.inputs, inputs)
                    ],
                )
                for item, inputs, _ in steps
            ]  # copied as each call returns, before later ones
            if plan.continuation is None:
                return calls
            plan, feeds = plan.continuation.next(plan._run_stage(feeds))

    def forget_resolved_calls(self) -> None:
        """Make the next runs call every kernel through its checked path again, which compiles
        it anew where it has to (after tuning) before the calls are resolved again."""
        with self._arenas_lock:
            for arena in self._idle_arenas:
                arena.resolved = None
        for kernel in {id(g.kernel): g.compiled for g in self.groups}.values():
            kernel._forget_compiled()

    def tc_source(self) -> str:
        """The whole model as TC: one def per kernel, then the sequence of calls and views."""
        parts = [g.source for g in self.groups]
        lines = ["# The model, in order (views reshape a buffer or take a contiguous part of it; they copy nothing):"]
        for item in self.order:
            if isinstance(item, ViewStep):
                part = f" from element {item.offset}" if item.offset or item.target.size != item.source.size else ""
                lines.append(f"#   {item.target.ident} = view of {item.source.ident}{part} as {item.target.shape}")
            else:
                outs = ", ".join(v.ident for v in item.outputs)
                ins = ", ".join(v.ident for v in item.inputs)
                lines.append(f"#   {outs} = {item.name}({ins})    # {', '.join(item.nodes)}")
        names = ", ".join(f"{v.ident} = {v.onnx_name!r}" for v in self.inputs + self.outputs)
        lines.append(f"# inputs and outputs: {names}")
        return "\n\n".join(parts) + "\n\n" + "\n".join(lines) + "\n"


class _ResolvedRun:
    """The plan's kernel calls on one arena with their C functions' pointer arguments read
    once: a call through :class:`polyc.api.Kernel` checks its arguments and reads their
    addresses every time, microseconds a call, a visible share of mobilenet_v2's run at batch 1
    (``python -m benchmarks.onnx_bench --models mobilenet_v2 --batches 1``).  The
    arena's arrays, the constants and the kernels' temporaries stay where they are between
    runs; the feeds and the fresh outputs (the values returned to the user, outputs that start
    as zeros), and the views of them, are new in every run and read by name then.  Built from a
    run of the plan on the arena through the checked path, whose arrays it keeps alive; a
    kernel without a resolved call (see :meth:`polyc.api.Kernel.repeat_call`) keeps that path.
    """

    def __init__(self, plan: Plan, arena: Arena, calls: list):
        self.plan = plan
        self.arena = arena
        self.keep_alive: list[np.ndarray] = []
        new_each_run = {v.ident for v in plan.inputs}
        self.steps: list = []
        resolved = iter(calls)
        for item in plan.order:
            if isinstance(item, ViewStep):
                if item.source.ident in new_each_run:
                    new_each_run.add(item.target.ident)
                self.steps.append(item)
                continue
            _, inputs, outputs = next(resolved)
            fresh = [
                (v.ident, v.tc_shape, v.dtype, item.starts_unread(v))
                for v in item.outputs
                if v.ident not in arena.arrays
            ]
            new_each_run.update(ident for ident, *_ in fresh)
            repeat = item.kernel.repeat_call(tuple(inputs), outputs)
            arguments = None if repeat is None else self._arguments(item, repeat, inputs, outputs, new_each_run)
            self.steps.append((item, repeat, arguments, fresh))
        self._sequence = _CallSequence(self.steps)

    def _arguments(self, item: Group, repeat, inputs: list, outputs: list, new_each_run: set) -> list:
        """The C function's tensor arguments: a pointer (int) where the memory stays put, a
        value's ident (str) where it is new in every run, (shape, dtype) for a temporary that
        must start as zeros in every run."""
        arguments = []
        for source in repeat.argument_sources():
            if source[0] in ("input", "output"):
                value = (item.inputs if source[0] == "input" else item.outputs)[source[1]]
                array = (inputs if source[0] == "input" else outputs)[source[1]]
                if value.ident in new_each_run:
                    arguments.append(value.ident)
                    continue
            elif source[3]:  # a temporary written before it is read: one for every run
                array = allocate(source[1], source[2], True)
            else:
                arguments.append(tuple(source[1:3]))
                continue
            self.keep_alive.append(array)
            arguments.append(array.ctypes.data)
        return arguments

    def takes(self, buffers: dict) -> bool:
        """Whether the feeds (in ``buffers``, made C-contiguous by the caller) have the dtypes
        the calls were resolved for, byte order included (a guard for callers of Plan.run that
        bypass the session's feed checks)."""
        return all(buffers[v.ident].dtype == v.dtype for v in self.plan._fed)

    def run(self, buffers: dict, seconds: list | None = None) -> dict:
        """Run the plan on the arena; ``buffers`` holds the feeds by ident, and then the arrays
        of every value run() may return; ``seconds`` (a list) gets each kernel call's time (each
        call is then a runner call of its own)."""
        buffers.update(self.arena.arrays)
        self._sequence.run(self.arena, buffers, seconds)
        return buffers


class _CallSequence:
    """A resolved run's kernel calls made from C (:mod:`polyc.runtime.sequence`): each stretch
    of resolved calls (up to a call through the checked path) is one call of the runner, on a
    table of their arguments that holds the fixed pointers and sizes; before a stretch runs,
    the pointers of the arrays new in every run (feeds, fresh outputs, temporaries that start
    as zeros, views of them) are written into it.  Views and calls through the checked path
    stay in Python, between stretches.  The runner is built with the kernels' C compiler."""

    VIEW, CALL, FLUSH, CHECKED = range(4)

    def __init__(self, steps: list):
        signatures: dict[tuple[int, int], int] = {}
        functions: list[int] = []
        kinds: list[int] = []
        table: list[int] = []
        self.ops: list[tuple] = []
        self.steps: list[tuple] = []  # the resolved calls' steps, in call order (for their statuses)
        stretch = (0, 0)  # the first call of the open stretch, and its first entry in the table
        for step in steps:
            if isinstance(step, ViewStep):
                self.ops.append((self.VIEW, step))
                continue
            item, repeat, arguments, fresh = step
            if repeat is None:
                self._close(stretch, len(functions))
                stretch = (len(functions), len(table))
                self.ops.append((self.CHECKED, item))
                continue
            signature = (len(arguments), len(repeat.sizes))
            kinds.append(signatures.setdefault(signature, len(signatures)))
            functions.append(repeat.address)
            call, entry = len(self.steps), len(table)
            named, zeros = [], []
            for argument in arguments:
                slot = len(table)
                if type(argument) is int:
                    table.append(argument)
                elif type(argument) is str:
                    named.append((slot, argument))
                    table.append(0)
                else:
                    zeros.append((slot, argument[0], argument[1]))
                    table.append(0)
            table.extend(repeat.sizes)
            self.steps.append(step)
            self.ops.append((self.CALL, call, entry, fresh, named, zeros))
        self._close(stretch, len(functions))
        self.functions = np.array(functions, np.uint64)
        self.kinds = np.array(kinds, np.int64)
        self.table = np.array(table, np.int64)
        self.failed = np.zeros(1, np.int64)
        self.addresses = tuple(a.ctypes.data for a in (self.functions, self.kinds, self.table, self.failed))
        self.runner = sequence_runner(tuple(signatures), self.steps[0][0].kernel.options.cc) if functions else None

    def _close(self, stretch: tuple[int, int], end: int) -> None:
        first, entry = stretch
        if end > first:
            self.ops.append((self.FLUSH, first, end - first, entry))

    def run(self, arena: Arena, buffers: dict, seconds: list | None = None) -> None:
        """The run's steps; with ``seconds``, each kernel call made and timed on its own."""
        table = self.table
        zeros = []  # the temporaries that start as zeros, alive until their stretch returns
        for op in self.ops:
            kind = op[0]
            if kind == self.CALL:
                _, call, entry, fresh, named, zero_slots = op
                for ident, shape, dtype, uninitialised in fresh:
                    buffers[ident] = allocate(shape, dtype, uninitialised)
                for slot, ident in named:
                    table[slot] = buffers[ident].ctypes.data
                for slot, shape, dtype in zero_slots:
                    zeros.append(allocate(shape, dtype, False))
                    table[slot] = zeros[-1].ctypes.data
                if seconds is not None:
                    started = time.perf_counter()
                    self._calls(call, 1, entry)
                    seconds.append(time.perf_counter() - started)
                    zeros.clear()
            elif kind == self.VIEW:
                step = op[1]
                buffers[step.target.ident] = step.of(_array(step.source, buffers))
            elif kind == self.FLUSH:
                if seconds is None:
                    self._calls(*op[1:])
                    zeros.clear()
            else:
                started = time.perf_counter()
                Plan._checked_call(op[1], arena, buffers)
                if seconds is not None:
                    seconds.append(time.perf_counter() - started)

    def _calls(self, first: int, count: int, entry: int) -> None:
        """Calls ``first`` .. ``first + count - 1``, their arguments from ``table[entry]`` on;
        the error of the first that fails."""
        functions, kinds, table, failed = self.addresses
        if self.runner is None:
            raise PolycError("polyc's call sequence has no runner: it resolved no call (a polyc bug)")
        status = self.runner(functions + 8 * first, kinds + 8 * first, table + 8 * entry, count, failed)
        if status:
            self._fail(first + int(self.failed[0]), status)

    def _fail(self, call: int, status: int) -> None:
        if status < 0:
            raise PolycError(f"polyc's call sequence met an unknown signature at call {call} (a polyc bug)")
        item = self.steps[call][0]
        try:
            self.steps[call][1].status(status)
        except PolycError as error:
            raise _in_group(error, item) from error
        raise PolycError(f"kernel {item.name} (nodes {', '.join(item.nodes)}) returned status {status}")


#: The kernels of every plan of the process by (canonical def, options): groups with the same
#: statements on the same shapes share one (a transformer's layers, a network's repeated blocks),
#: and so do the plans of a model's stages, made for each new value learned, and new sessions of
#: a model, which then define nothing again.  The last MAX_SHARED_KERNELS are kept.
_SHARED_KERNELS: collections.OrderedDict = collections.OrderedDict()
_SHARED_KERNELS_LOCK = threading.Lock()
MAX_SHARED_KERNELS = 1024


class _Values(dict):
    """A plan's values by ONNX name.  A constant given to the plan (an initializer, or a value
    a stage before learned) becomes a Value when first looked up: a stage plans a few nodes of
    a graph whose initializers number thousands (torchvision's SSDlite: 2,300 Values made per
    stage, a large share of the planning of a new image's 188 stages)."""

    def __init__(self, constants: dict, new_ident):
        super().__init__()
        self._constants, self._new_ident = constants, new_ident

    def __missing__(self, name: str) -> Value:
        array = self._constants.get(name)
        if array is None:
            raise KeyError(name)
        value = self[name] = Value(self._new_ident(), array.dtype, array.shape, array, name)
        return value

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name) or name in self._constants

    def get(self, name, default=None):
        return self[name] if name in self else default

    def constants(self) -> dict:
        """Every constant's array by name: those given and those the plan computed."""
        return {**self._constants, **{name: value.const for name, value in self.items() if value.const is not None}}


def _kernel_label(group: Group) -> str:
    """What the log and the progress bar call a group's kernel: its name and ONNX nodes."""
    nodes = group.nodes
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    return f"{group.name} ({shown})"


def _shared_kernel(key: tuple, define):
    """The kernel for ``key``, made by ``define()`` unless a plan made it before."""
    with _SHARED_KERNELS_LOCK:
        kernel = _SHARED_KERNELS.get(key)
        if kernel is not None:
            _SHARED_KERNELS.move_to_end(key)
            return kernel
    kernel = define()
    with _SHARED_KERNELS_LOCK:
        kernel = _SHARED_KERNELS.setdefault(key, kernel)
        while len(_SHARED_KERNELS) > MAX_SHARED_KERNELS:
            _SHARED_KERNELS.popitem(last=False)
    return kernel


def _in_group(error: PolycError, group: Group) -> PolycError:
    """``error``, raised by ``group``'s kernel at run time, naming the group and its ONNX nodes
    (the kernel knows itself only by its canonical def's name)."""
    message = f"{group.name} (nodes {', '.join(group.nodes)}): {error.message}"
    try:
        return type(error)(message)
    except TypeError:  # an error class of another signature
        return PolycError(message)


def _plain_assignment(statement: ast.Statement) -> bool:
    """Whether ``statement`` is ``T(i, ..) = e where ..``: a plain assignment (no reduction, no
    ``<=>`` note), outside any ``for`` block: what the graph passes below may edit."""
    return statement.op == "=" and not statement.init and statement.equivalent is None and statement.loop is None


def _reads_in(value: Value, statement: ast.Statement) -> list[tuple[ast.Expr, ...]]:
    """The subscripts of each read of ``value`` anywhere in ``statement``."""
    return [args for expr in statement_expressions(statement) for args in reads_of(value.ident, expr)]


def _reads_only_at(value: Value, expr: ast.Expr, indices: tuple[str, ...]) -> bool:
    """Whether ``expr`` reads ``value``, and only at the indices ``indices`` themselves."""
    reads = reads_of(value.ident, expr)
    return bool(reads) and all(args == index_names(indices) for args in reads)


def inline_elementwise(steps: list, outputs: list) -> list:
    """Substitutes an elementwise statement ``s(i..) = e`` into the one elementwise statement
    that reads ``s``, once, at the same indices over the same ranges, and drops it.  A value
    read twice by a chain of elementwise operators (SiLU's ``x * sigmoid(x)``, GELU's ``x * (1
    + erf(x / sqrt 2)) / 2``) then has one reader left, which the fusion rules make an epilogue
    of the convolution or product computing ``x``, instead of a kernel of its own that reads
    and writes ``x`` in memory (efficientnet_b0 at batch 1: 175 kernels -> 127).
    Nothing is computed twice, since ``s`` had no other use.  Only floating-point values whose
    statement reads values of their own type, so that no conversion is lost."""
    readers: dict[int, list] = {}
    for step in steps:
        for value in values_read(step):
            readers.setdefault(id(value), []).append(step)
    kept = {id(v) for v in outputs}
    dropped = set()
    for step in steps:
        inlined = _inlinable(step, kept)
        consumers = readers.get(id(step.writes[0]), []) if inlined is not None else []
        if inlined is None or len(consumers) != 1 or not _inlines_into(consumers[0], step.writes[0], inlined):
            continue
        consumer, value = consumers[0], step.writes[0]
        consumer.statements = [_substituted(consumer.statements[0], value, inlined)]
        consumer.reads = [v for v in consumer.reads if v is not value]
        for read in step.reads:
            if all(read is not v for v in consumer.reads):
                consumer.reads.append(read)
            moved = [consumer if r is step else r for r in readers[id(read)]]
            readers[id(read)] = [r for n, r in enumerate(moved) if all(r is not q for q in moved[:n])]
        dropped.add(id(step))
    return [step for step in steps if id(step) not in dropped]


def _substituted(statement: ast.Statement, value: Value, definition: ast.Statement) -> ast.Statement:
    """``statement`` with its reads of ``value`` at ``definition``'s own indices replaced by
    ``definition``'s right-hand side (the expression that computes ``value`` there)."""
    at = index_names(definition.indices)

    def replaced(expr: ast.Expr) -> ast.Expr | None:
        is_read = isinstance(expr, ast.Access) and expr.tensor == value.ident and expr.args == at
        return definition.rhs if is_read else None

    return replace_in_statement(statement, replaced)


def _literal_ranges(where: tuple[ast.WhereClause, ...]) -> dict[str, tuple[int, int]]:
    """The ranges ``i in lo:hi`` of ``where`` whose bounds are integer literals, by index."""
    ranges = {}
    for clause in where:
        if isinstance(clause, ast.RangeClause):
            low, high = integer_literal(clause.lo), integer_literal(clause.hi)
            if low is not None and high is not None:
                ranges[clause.index] = (low, high)
    return ranges


def _fold_into_writer(writer: KernelStep, epilogue: KernelStep, value: Value) -> bool:
    """Folds ``epilogue``, one elementwise statement over the whole of ``value`` that reads it
    only at its own point, into each statement of ``writer``, when these are several that
    assign ``value`` in boxes partitioning it (a depthwise convolution's interior and border
    slabs): each then computes the epilogue of its own expression, where the epilogue was a
    second pass over the whole output (mobilenet_v2's 3x3 depthwise layers with their Clip).
    ``epilogue`` already writes ``value``'s name.  Returns whether it did; then ``writer``
    writes the epilogue's value and reads its operands."""
    own = epilogue.statements[0] if len(epilogue.statements) == 1 else None
    # (One statement the scheduler fuses with its epilogue itself, in one loop nest.)
    if (
        own is None
        or not _plain_assignment(own)
        or len(writer.statements) < 2
        or len(epilogue.writes) != 1
        or value.dtype.kind != "f"
        or epilogue.writes[0].dtype != value.dtype
        or epilogue.writes[0].shape != value.shape
    ):
        return False
    names = own.indices
    if own.where != whole_ranges(names, value.tc_shape) or not _reads_only_at(value, own.rhs, names):
        return False
    statements, boxes = [], []
    for assigned in writer.statements:
        if (
            not _plain_assignment(assigned)
            or assigned.target != value.ident
            or not assigned.where
            or reads_of(value.ident, assigned.rhs)
        ):
            return False
        mine = assigned.indices
        ranges = _literal_ranges(assigned.where)
        if len(mine) != len(names) or len(set(mine)) != len(mine) or set(ranges) != set(mine):
            return False
        boxes.append([ranges[n] for n in mine])
        renaming = dict(zip(names, mine))

        # The epilogue at this statement's indices, reading this statement's expression where
        # it read `value` (at its own point, checked above).
        def edited(expr: ast.Expr, assigned=assigned, renaming=renaming) -> ast.Expr | None:
            if isinstance(expr, ast.Access) and expr.tensor == value.ident:
                return assigned.rhs
            if isinstance(expr, ast.Name) and expr.name in renaming:
                return dataclasses.replace(expr, name=renaming[expr.name])
            return None

        statements.append(dataclasses.replace(assigned, rhs=replace_expr(own.rhs, edited)))
    # The boxes must partition the tensor: inside it, pairwise disjoint, as many points as it.
    inside = all(0 <= low <= high <= extent for box in boxes for (low, high), extent in zip(box, value.tc_shape))
    disjoint = all(
        any(a[1] <= b[0] or b[1] <= a[0] for a, b in zip(first, second))
        for n, first in enumerate(boxes)
        for second in boxes[n + 1 :]
    )
    points = sum(math.prod(high - low for low, high in box) for box in boxes)
    if not inside or not disjoint or points != math.prod(value.tc_shape):
        return False
    writer.statements = statements
    writer.writes = [epilogue.writes[0] if w is value else w for w in writer.writes]
    writer.reads += [r for r in epilogue.reads if r is not value and all(r is not q for q in writer.reads)]
    return True


def _merged_statement(statement: ast.Statement, view: Value, tensor: Value) -> ast.Statement | None:
    """The elementwise ``statement`` (over ``view``'s indices, reading ``view`` there)
    rewritten over the indices of ``tensor``, of which ``view`` merges runs of consecutive
    dimensions: each merged index becomes its affine combination of ``tensor``'s, and the
    statement updates ``tensor`` in place.  None when the shapes or the reads do not allow it."""
    names = statement.indices
    if not view.shape or len(names) != len(view.shape) or statement.where != whole_ranges(names, view.shape):
        return None  # (an elementwise step covers its whole output: anything else is left alone)
    if not _reads_only_at(view, statement.rhs, names):
        return None
    runs, start = [], 0  # the dimensions of `tensor` each dimension of `view` merges
    for extent in view.shape:
        stop, product = start, 1
        while stop < len(tensor.shape) and (product < extent or stop == start):
            product *= tensor.shape[stop]
            stop += 1
        if product != extent:
            return None
        runs.append(range(start, stop))
        start = stop
    if start != len(tensor.shape):
        return None
    indices: list[str] = []
    combined: dict[str, ast.Expr] = {}
    for name, run in zip(names, runs):
        if len(run) == 1:
            indices.append(name)
            continue
        if not run:  # a dimension of extent 1 that `tensor` does not have: the index is 0
            combined[name] = ast.Number(0, False)
            continue
        split = [f"{name}_{m}" for m in range(len(run))]
        strides = [math.prod(tensor.shape[d] for d in run[m + 1 :]) for m in range(len(run))]
        terms: list[ast.Expr] = [
            ast.Binary("*", ast.Number(stride, False), ast.Name(part)) if stride != 1 else ast.Name(part)
            for part, stride in zip(split, strides)
        ]
        combined[name] = functools.reduce(lambda total, term: ast.Binary("+", total, term), terms)
        indices += split
    updated = ast.Access(tensor.ident, index_names(tuple(indices)))

    def edited(expr: ast.Expr) -> ast.Expr | None:
        if isinstance(expr, ast.Access) and expr.tensor == view.ident:
            return updated  # (every read of the view is at the statement's indices, checked above)
        if isinstance(expr, ast.Name) and expr.name in combined:
            return combined[expr.name]
        return None

    rhs = replace_expr(statement.rhs, edited)
    return ast.Statement(tensor.ident, tuple(indices), "=", False, rhs, whole_ranges(indices, tensor.tc_shape))


def _inlinable(step, kept: set) -> ast.Statement | None:
    """``step``'s statement when it may be substituted into its reader, else None."""
    if (
        not isinstance(step, KernelStep)
        or step.kind != "elementwise"
        or len(step.statements) != 1
        or len(step.writes) != 1
        or id(step.writes[0]) in kept
    ):
        return None
    value, statement = step.writes[0], step.statements[0]
    if value.dtype.kind != "f" or not _plain_assignment(statement) or reads_of(value.ident, statement.rhs):
        return None
    if any(read.dtype != value.dtype for read in step.reads) and not _is_float_cast(value, statement):
        return None
    return statement


def _is_float_cast(value: Value, statement: ast.Statement) -> bool:
    """Whether ``statement`` writing ``value`` is one explicit cast to ``value``'s float type of
    the whole right-hand side: substituted into a reader of another type, the cast keeps its
    rounding (a float16 model computed in float32 rounds to float16 so, between operators:
    :mod:`polyc.frontends.onnx.float16`)."""
    rhs = statement.rhs
    return value.dtype.kind == "f" and isinstance(rhs, ast.Call) and rhs.func == tc_type(value.dtype)


def _inlines_into(consumer, value: Value, definition: ast.Statement) -> bool:
    """Whether ``consumer`` is one elementwise statement over the same indices and ranges as
    ``definition`` (which computes ``value``), reading ``value`` once, there, of ``value``'s
    type (or of another, where ``value`` or the statement is an explicit cast)."""
    if not isinstance(consumer, KernelStep) or consumer.kind != "elementwise" or len(consumer.statements) != 1:
        return False
    target = consumer.statements[0]
    plain = _plain_assignment(target)
    # A reader of another type takes the value as it is only through an explicit cast, of the
    # value or of the reader's whole statement (whose operand is then computed in its own type).
    converted = consumer.writes[0].dtype != value.dtype
    if converted and not (_is_float_cast(value, definition) or (plain and _is_float_cast(consumer.writes[0], target))):
        return False
    return (
        plain
        and target.where == definition.where
        and target.indices == definition.indices
        and _reads_in(value, target) == [index_names(definition.indices)]
    )


def _array(value: Value, buffers: dict) -> np.ndarray:
    if value.const is not None:
        return np.ascontiguousarray(value.const).reshape(value.tc_shape)
    return buffers[value.ident]


def _aliases_input(array, buffers, inputs) -> bool:
    return any(np.shares_memory(array, buffers[v.ident]) for v in inputs)


def _foldable(steps: list, inputs: list) -> bool:
    if not steps or not any(isinstance(s, KernelStep) for s in steps):
        return False
    reads = [v for s in steps for v in values_read(s)]
    written = {id(v) for s in steps for v in values_written(s)}
    return all(v.const is not None or id(v) in written for v in reads)


#: Folds already evaluated: (canonical def, its inputs' digests) -> the results, for small ones
#: (a detector's stages fold the same shape computations for every class and every image: of
#: SSDlite's 220-280 folds a new image, 75-90% had been done before).
_FOLDED: collections.OrderedDict = collections.OrderedDict()
_FOLDED_LOCK = threading.Lock()
MAX_FOLDED = 4096
#: Folds of larger inputs or results are not remembered (weights folded once per session).
MAX_FOLDED_BYTES = 1 << 16


def _fold(steps: list, node: str) -> None:
    """Evaluate a node's steps on constants with the reference interpreter (compile time)."""
    from polyc.api import define

    for step in steps:
        if isinstance(step, ViewStep):
            step.target.const = step.of(np.ascontiguousarray(step.source.const)).reshape(step.target.shape)
            continue
        group = Group(0, [step], [v for v in step.reads], list(step.writes))
        group.definition = _def_tree(group)
        inputs = [np.ascontiguousarray(v.const).reshape(v.tc_shape) for v in step.reads]
        key = None
        if sum(a.nbytes for a in inputs) <= MAX_FOLDED_BYTES:
            # (the canonical def holds the shapes and types; the digests, the values)
            key = (_canonical_def(group.definition)[0], *(hashlib.sha256(a.tobytes()).digest() for a in inputs))
            with _FOLDED_LOCK:
                results = _FOLDED.get(key)
                if results is not None:
                    _FOLDED.move_to_end(key)
            if results is not None:
                for value, array in zip(step.writes, results):
                    value.const = array.copy()
                continue
        kernel = define(group.source, filename=f"<onnx fold {node}>", backend="interpreter")[group.name]
        results = kernel(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        results = [
            np.asarray(array).astype(value.dtype, copy=False).reshape(value.shape)
            for value, array in zip(step.writes, results)
        ]
        for value, array in zip(step.writes, results):
            value.const = array
        if key is not None and sum(a.nbytes for a in results) <= MAX_FOLDED_BYTES:
            with _FOLDED_LOCK:
                _FOLDED[key] = [array.copy() for array in results]
                while len(_FOLDED) > MAX_FOLDED:
                    _FOLDED.popitem(last=False)


def _reads_of(item) -> list[Value]:
    return [item.source] if isinstance(item, ViewStep) else [v for s in item.steps for v in s.reads]


def _written_by(group: Group) -> dict[int, Value]:
    return {id(v): v for s in group.steps for v in s.writes}


def _inputs_of(group: Group, written: dict[int, Value]) -> list[Value]:
    """The values ``group`` reads and does not write, in order of first read."""
    return list({id(v): v for v in _reads_of(group) if id(v) not in written}.values())


def _fused_pair(pair: Group, first: Group, uses: dict[int, int]) -> bool:
    """Whether ``pair`` (``first``'s steps then the next group's), whose values of ``first``
    nothing outside it reads, is one kernel: a pointwise then a depthwise convolution."""
    from polyc.lang.sema import check_source
    from polyc.schedule.convolution import recognise_pointwise_depthwise_def

    if not _reads_one_by_one_weights(first.steps[0]):
        return False  # (checking the pair's def costs milliseconds: resnet18 has 18 pairs, none of them this)
    inside: dict[int, int] = {}
    for value in _reads_of(pair):
        inside[id(value)] = inside.get(id(value), 0) + 1
    if any(uses.get(key, 0) != inside.get(key, 0) for key in _written_by(first)):
        return False  # a value of the first group is read after the pair, or is an output of the model
    written = _written_by(pair)
    outputs = [v for key, v in written.items() if uses.get(key, 0) > inside.get(key, 0)]
    if not outputs:
        return False
    try:  # the pair's def as Plan._compile will write it
        definition = check_source(Group(pair.index, pair.steps, _inputs_of(pair, written), outputs).source)[0]
    except PolycError:
        return False
    return recognise_pointwise_depthwise_def(definition) is not None


def _reads_one_by_one_weights(step) -> bool:
    """Whether ``step`` reads constant weights of a 1 x 1 convolution in the channels-last
    layout, ``(1, 1, C, F)``: what a pointwise convolution's statement reads."""
    return isinstance(step, KernelStep) and any(
        value.const is not None and value.rank == 4 and value.shape[:2] == (1, 1) for value in step.reads
    )


#: The name of every kernel's def as compiled (see :func:`_canonical_def`).
CANONICAL_NAME = "fused"


def _canonical_def(definition: ast.Def) -> tuple[str, dict[str, str]]:
    """A group's def (:func:`_def_tree`) as it is compiled: its tensors renamed ``_t0``, ``_t1``,
    ... in the order they are written, the def named :data:`CANONICAL_NAME`, so that groups of
    the same statements on the same shapes (a transformer's layers, a network's repeated
    blocks) share one kernel and compile once; and the renaming (ident -> name)."""
    names: dict[str, str] = {}
    # (a leading underscore: no index the converters write begins so)
    for param in definition.inputs + definition.outputs:
        names.setdefault(param.name, f"_t{len(names)}")
    for statement in definition.statements:
        for tensor in tensors_written_and_read(statement):
            names.setdefault(tensor, f"_t{len(names)}")
    canonical = dataclasses.replace(rename_def_tensors(definition, names), name=CANONICAL_NAME)
    return format_def(canonical), names


def _def_tree(group: Group) -> ast.Def:
    """The group's def: its inputs declared with their types and shapes, its outputs by name
    (a recurrence's states declared too), its steps' statements in order, the ``for`` blocks
    numbered again across the steps (each step's are numbered from 0)."""
    states = {id(v) for step in group.steps for v in step.states}
    outputs = tuple(_declared(v) if id(v) in states else ast.Param(v.ident, None, None) for v in group.outputs)
    statements: list[ast.Statement] = []
    blocks = 0
    for step in group.steps:
        renumbered: dict[int, ast.SequentialLoop] = {}
        for statement in step.statements:
            loop = statement.loop
            if loop is not None:
                if loop.number not in renumbered:
                    renumbered[loop.number] = dataclasses.replace(loop, number=blocks)
                    blocks += 1
                if renumbered[loop.number] != loop:
                    statement = dataclasses.replace(statement, loop=renumbered[loop.number])
            statements.append(statement)
    return ast.Def(group.name, tuple(_declared(v) for v in group.inputs), outputs, tuple(statements))


def _declared(value: Value) -> ast.Param:
    """``value`` declared in a def's signature: ``float(2, 3) v7``."""
    return ast.Param(value.ident, tc_type(value.dtype), tuple(ast.Number(int(e), False) for e in value.tc_shape))


def _replaced(flat, values: dict) -> list | None:
    """The nodes that stand for ``flat`` given what the plan knows (``values``), when its
    converter replaces it (``replaced``: NonZero's counting nodes, Compress's NonZero and Gather)."""
    if not isinstance(flat, FlatNode) or flat.proto.domain not in ("", "ai.onnx"):
        return None
    replaced = getattr(CONVERTERS.get(flat.proto.op_type), "replaced", None)
    return replaced(flat, values) if replaced is not None else None


def is_converted(op_type: str, domain: str, opset: int) -> bool:
    """Whether a converter of polyc's own handles ``op_type`` at ``opset``."""
    converter = converter_for(op_type, domain)
    return converter is not None and converter.version_for(opset) is not None


def unsupported_error(missing, where: str) -> UnsupportedError:
    """``missing``: (op type, opset, node name); the op type may be followed by " (why)"."""

    def entry(label, opset, name):
        op, _, why = label.partition(" (")
        # the opset is the default domain's: an operator of another domain ("com.microsoft.X") has none of it
        version = "" if "." in op else f" (opset {opset})"
        return f"{op}{version} at node {name!r}" + (f" ({why}" if why else "")

    listed = "; ".join(entry(*m) for m in missing)
    kinds = sorted({label.partition(" (")[0] for label, _, _ in missing})
    return UnsupportedError(
        f"{where}: {len(missing)} node(s) use operators polyc does not support: {listed} "
        f"[unsupported: {', '.join(kinds)}]"
    )


def fold_batch_norms(nodes: list, graph_outputs: set, values: dict, new_ident) -> list:
    """The nodes with every inference BatchNormalization that follows a Conv folded into the
    Conv's weights and bias, as onnxruntime and TVM do: per filter f, with
    ``k = scale / sqrt(var + epsilon)``, ``W'[f] = W[f] * k[f]`` and ``B'[f] = (B[f] - mean[f])
    * k[f] + shift[f]``.  Only where the Conv's output feeds the BatchNormalization alone and
    every parameter is a constant.  New NodeProtos replace the two; the model's are not
    touched.  The folded weights join ``values`` as constants (``new_ident`` names them in TC)."""
    from onnx import NodeProto

    uses: dict[str, int] = {}
    for node in nodes:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    producer = {name: position for position, node in enumerate(nodes) for name in node.output}
    result: list = list(nodes)
    dropped: set[int] = set()
    for position, norm in enumerate(nodes):
        if norm.op_type != "BatchNormalization" or len(norm.input) < 5 or len([o for o in norm.output if o]) != 1:
            continue
        attributes = {a.name: a for a in norm.attribute}
        if "training_mode" in attributes and attributes["training_mode"].i:
            continue
        conv_position = producer.get(norm.input[0])
        if conv_position is None or nodes[conv_position].op_type != "Conv":
            continue
        conv = nodes[conv_position]
        if uses.get(conv.output[0], 0) != 1 or conv.output[0] in graph_outputs:
            continue
        parameters = [values.get(name) for name in list(norm.input[1:5]) + list(conv.input[1:3])]
        if any(v is None or v.const is None for v in parameters[:5]) or (
            len(conv.input) > 2 and conv.input[2] and parameters[5] is None
        ):
            continue
        scale, shift, mean, var, weights = (v.const for v in parameters[:5] if v is not None and v.const is not None)
        bias = parameters[5].const if len(parameters) > 5 and parameters[5] is not None else None
        epsilon = attributes["epsilon"].f if "epsilon" in attributes else 1e-5
        if weights.dtype.kind != "f" or weights.shape[0] != scale.shape[0]:
            continue
        k = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
        folded_weights = (weights * k.reshape((-1,) + (1,) * (weights.ndim - 1))).astype(weights.dtype)
        base = bias.astype(np.float64) if bias is not None else np.zeros_like(k)
        folded_bias = ((base - mean) * k + shift).astype(weights.dtype)
        names = []
        for suffix, array in (("weights", folded_weights), ("bias", folded_bias)):
            name = f"polyc_folded_{norm.output[0]}_{suffix}"
            values[name] = Value(new_ident(), array.dtype, array.shape, array, name)
            names.append(name)
        merged = NodeProto()
        merged.CopyFrom(conv)
        del merged.input[:]
        merged.input.extend([conv.input[0], *names])
        del merged.output[:]
        merged.output.extend([norm.output[0]])
        merged.name = f"{conv.name or 'Conv'}+{norm.name or 'BatchNormalization'}"
        result[conv_position] = merged
        dropped.add(position)
    return [node for position, node in enumerate(result) if position not in dropped]
