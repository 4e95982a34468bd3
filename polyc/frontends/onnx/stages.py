"""Plans in stages: values a plan must know that the model computes from tensor data.

A plan is compiled for known shapes, and some nodes need to know more than shapes: an If's
condition, a Loop's trip count and conditions, a Reshape's shape, a Slice's starts, a Range's
limit (the converters' ``CONSTANT_INPUTS``), or how many elements a NonZero finds.  Mostly
these are computed from shapes or come from the model's inputs, and the plan knows them.  When
one is computed from tensor data, the node that needs it waits, with every node that reads
what the waiting nodes give, and the plan goes on with the others; at the end:

1. the plan so far is compiled and runs; its outputs are the values the waiting nodes read
   (the *carried* values, the graph's outputs among them), among them those it has to know
   (the *probes*, a few elements each at most: all those the plan could compute, so that
   independent counts, as a detector's per class, are learned in one stage);
2. the waiting nodes are planned as a model of their own whose inputs are the carried
   values, with the probes' contents as constants: the If takes its branch, the Reshape its
   shape.  That plan may stop again (a loop whose condition is data stops at every iteration).

Like the input shapes, the probes' contents select the plan of the rest, made on first use and
kept (the last :data:`MAX_PLANS_PER_STAGE`); its kernels land in the disk cache, and stages
planned for other contents share them where their defs are the same.  So a model whose
control flow or shapes depend on its data runs, compiled, at the cost of a plan per distinct
value; a value that changes in every run (a count of detections) compiles in every run.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from polyc.frontends.onnx.functions import CONSTANT_INPUTS, LoopIterations, is_if, is_loop

#: A value needed when planning is probed only if it has at most this many elements (shapes,
#: axes, pads, conditions, counts); a larger one stays an error of its converter.
MAX_PROBE_ELEMENTS = 1024

#: Plans kept per stage, for the last distinct contents of its probe.
MAX_PLANS_PER_STAGE = 64


def value_to_probe(item, values: dict, converters: dict) -> str | None:
    """The name of a value that ``item`` (a FlatNode or a LoopIterations about to run) must
    know when planning but that is computed at run time (``values``: name -> Value), or None."""
    if isinstance(item, LoopIterations):
        proto = item.proto
        condition = item.condition if item.carried is not None else (proto.input[1] if len(proto.input) > 1 else "")
        names = [proto.input[0] if proto.input else "", condition]
    else:
        proto = item.proto
        if is_if(proto) or is_loop(proto):
            positions = CONSTANT_INPUTS[proto.op_type]
        else:
            converter = converters.get(proto.op_type) if proto.domain in ("", "ai.onnx") else None
            positions = (
                converter.constant_inputs(proto)
                if converter is not None and hasattr(converter, "constant_inputs")
                else getattr(converter, "CONSTANT_INPUTS", ())
            )
        names = [proto.input[p] for p in positions if p < len(proto.input)]
    for name in names:
        value = values.get(name) if name else None
        if value is not None and value.const is None and value.size <= MAX_PROBE_ELEMENTS:
            return name
    return None


def names_read(items) -> set[str]:
    """Every value name that ``items`` (FlatNodes, LoopIterations) may read, including the
    names of the graphs around that their subgraphs (branches, bodies) read."""
    names: set[str] = set()
    for item in items:
        names.update(item.proto.input)
        if isinstance(item, LoopIterations):
            names.update(item.carried or ())
            names.add(item.condition)
            for pieces in item.pieces or ():
                names.update(pieces)
        _names_read_by_subgraphs(item.proto, names)
    names.discard("")
    return names


def _names_read_by_subgraphs(proto, names: set) -> None:
    for attribute in proto.attribute:
        for graph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            for node in graph.node:
                names.update(node.input)
                _names_read_by_subgraphs(node, names)


def fresh_copy(items) -> list:
    """``items`` for a new plan: a LoopIterations part-way through is copied (plans advance it)."""
    return [
        dataclasses.replace(
            item,
            carried=list(item.carried) if item.carried is not None else None,
            pieces=[list(p) for p in item.pieces] if item.pieces is not None else None,
        )
        if isinstance(item, LoopIterations)
        else item
        for item in items
    ]


@dataclasses.dataclass
class Carried:
    """A value the rest of the graph reads, computed by the stage before: its ONNX name, shape
    and dtype as the rest's plan takes it as an input."""

    name: str
    shape: tuple
    dtype: np.dtype


class Continuation:
    """The rest of a graph after a plan that stopped to learn the contents of ``probes``.
    ``make_plan(nodes, shapes, dtypes, constants)`` plans ``nodes`` (FlatNodes and
    LoopIterations) for inputs of ``shapes`` and ``dtypes`` (the carried values) and the
    constants given (those the stages before knew, and the probes)."""

    def __init__(self, nodes: list, carried: list[Carried], probes: list[str], constants: dict, make_plan):
        self.nodes = fresh_copy(nodes)
        self.carried = carried
        self.probes = list(probes)
        self.constants = constants
        self._make_plan = make_plan
        self._plans: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        #: The plan the last run took.
        self.last = None

    def next(self, results: dict):
        """The plan of the rest for the probes' contents in ``results`` (the stage's outputs by
        ONNX name), made on first use; and its feeds."""
        known = {name: np.asarray(results[name]) for name in self.probes}
        key = tuple((v.dtype.str, v.shape, v.tobytes()) for v in known.values())
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                shapes = {c.name: c.shape for c in self.carried if c.name not in known}
                plan = self._make_plan(
                    fresh_copy(self.nodes), shapes, {c.name: c.dtype for c in self.carried}, {**self.constants, **known}
                )
                self._plans[key] = plan
                while len(self._plans) > MAX_PLANS_PER_STAGE:
                    self._plans.popitem(last=False)
            else:
                self._plans.move_to_end(key)
            self.last = plan
        return plan, {c.name: results[c.name] for c in self.carried if c.name not in known}

    def plans(self) -> list:
        with self._lock:
            return list(self._plans.values())
