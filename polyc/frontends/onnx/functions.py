"""Nodes that stand for other nodes: operators that ONNX defines as functions, expanded into
their bodies; If, replaced by the branch its condition selects; Scan and Loop, unrolled.

Many ONNX operators come with a body of other operators in their schema: RMSNormalization,
GroupNormalization, Attention, RotaryEmbedding, SoftmaxCrossEntropyLoss, ReduceLogSumExp,
Celu, ... Some bodies are fixed (a ``FunctionProto``); others are built for the node at hand,
from its attributes and its inputs' element types ("context-dependent" functions).  Where
polyc has no converter of its own for an operator at the model's opset, the node is replaced
by its body, as onnxruntime does; graph fusion then puts the body's nodes back into few
kernels.  A converter of polyc's own always wins: it knows the operator as a whole.

A body's nodes mean what they meant at the opset the function was written for (its
``opset_import``), which may be older than the model's; each expanded node carries that opset.

An If is the nodes of the branch its condition selects: polyc compiles straight-line
kernels.  The condition is known when the model is planned (a constant, computed from shapes,
or an input the plan is specialised on), or learned by a stage when it is computed from data
(:mod:`.stages`).  A Scan is its body once per step of its sequence, a Loop once per iteration
while its trip count and conditions say so (known, or learned the same way); the copies share
their compiled kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from polyc.errors import UnsupportedError

if TYPE_CHECKING:
    from onnx import NodeProto

#: Bodies may use operators that are functions themselves (SoftmaxCrossEntropyLoss uses
#: NegativeLogLikelihoodLoss); deeper nesting than this is a loop in the schemas.
MAX_DEPTH = 8


@dataclass(frozen=True)
class FlatNode:
    """A node to convert: ``proto`` at ``opset`` (of the default domain), named ``name``;
    ``origin`` is the name of the model's node it came from (itself, if not expanded)."""

    proto: NodeProto
    opset: int
    name: str
    origin: str


#: Inputs of the nodes handled here that must be known when the model is planned, by position
#: (as converters' ``CONSTANT_INPUTS``).
CONSTANT_INPUTS = {"If": (0,), "Loop": (0, 1)}

#: The most iterations a Loop is unrolled to (a loop that runs on would never finish planning).
MAX_LOOP_ITERATIONS = 4096


def is_if(proto) -> bool:
    return proto.op_type == "If" and proto.domain in ("", "ai.onnx")


def is_scan(proto) -> bool:
    return proto.op_type == "Scan" and proto.domain in ("", "ai.onnx")


def is_loop(proto) -> bool:
    return proto.op_type == "Loop" and proto.domain in ("", "ai.onnx")


def _graph_attribute(proto, name: str):
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in proto.attribute if a.name == name), None)


def scan_body(proto):
    """A Scan's or a Loop's body graph."""
    return _graph_attribute(proto, "body")


def _body_copy(body, prefix: str, opset: int, origin: str) -> tuple[list[FlatNode], Callable[[str], str]]:
    """The nodes of ``body`` (a Scan's or a Loop's) renamed for one iteration, its
    initializers as Constant nodes; and the renaming (names of the graphs around are kept)."""
    from onnx import helper, numpy_helper

    defined = (
        {v.name for v in body.input}
        | {t.name for t in body.initializer}
        | {o for node in body.node for o in node.output if o}
    )

    def edge(value: str) -> str:
        return f"{prefix}/{value}" if value in defined else value

    flat = [
        FlatNode(
            helper.make_node(
                "Constant",
                [],
                [edge(t.name)],
                name=edge(t.name),
                value=numpy_helper.from_array(numpy_helper.to_array(t), edge(t.name)),
            ),
            opset,
            edge(t.name),
            origin,
        )
        for t in body.initializer
    ]
    for position, node in enumerate(body.node):
        renamed = helper.make_node(
            node.op_type,
            [edge(v) if v else "" for v in node.input],
            [edge(v) if v else "" for v in node.output],
            name=f"{prefix}/{node.name or f'{node.op_type}_{position}'}",
            domain=node.domain,
        )
        for attribute in node.attribute:
            if attribute.HasField("g"):
                attribute = _named(attribute, attribute.name)
                _rename_graph(attribute.g, edge)
            renamed.attribute.append(attribute)
        flat.append(FlatNode(renamed, opset, renamed.name, origin))
    return flat, edge


def _stacked(name: str, outer: str, pieces: list[str], axis: int, opset: int, origin: str) -> list[FlatNode]:
    """Nodes stacking the values ``pieces`` along a new axis ``axis`` into ``outer``."""
    from onnx import helper, numpy_helper

    flat, expanded = [], []
    for step, piece in enumerate(pieces):
        target = f"{name}/{outer}/{step}"
        if opset >= 13:
            axes = f"{target}/axes"
            flat.append(
                FlatNode(
                    helper.make_node(
                        "Constant",
                        [],
                        [axes],
                        name=axes,
                        value=numpy_helper.from_array(np.array([axis], np.int64), axes),
                    ),
                    opset,
                    axes,
                    origin,
                )
            )
            node = helper.make_node("Unsqueeze", [piece, axes], [target], name=target)
        else:
            node = helper.make_node("Unsqueeze", [piece], [target], axes=[axis], name=target)
        flat.append(FlatNode(node, opset, target, origin))
        expanded.append(target)
    flat.append(
        FlatNode(
            helper.make_node("Concat", expanded, [outer], axis=axis, name=f"{name}/{outer}"),
            opset,
            f"{name}/{outer}",
            origin,
        )
    )
    return flat


@dataclass
class LoopIterations:
    """A Loop node unrolled one iteration at a time, as the plan learns whether the next one
    runs: the trip count and each iteration's condition must be known when planning (constants,
    shapes, inputs the plan is specialised on).  :meth:`next` gives the nodes that follow."""

    proto: NodeProto
    name: str
    opset: int
    iteration: int = 0
    #: The names of the carried values' latest versions (None before the first iteration).
    carried: list[str] | None = None
    condition: str = ""
    #: Each scan output's pieces so far, one a finished iteration.
    pieces: list[list[str]] | None = None

    def next(self, constant_of) -> list:
        """The next iteration's nodes and this object again, or the nodes giving the Loop's
        outputs.  ``constant_of(value name)``: its value when known when planning, else None."""
        from onnx import helper

        proto, where = self.proto, f"node {self.name!r} (Loop)"
        body = scan_body(proto)
        carried_count = len(proto.input) - 2
        if self.carried is None or self.pieces is None:  # (set together, at the first iteration)
            self.carried = list(proto.input[2:])
            self.condition = proto.input[1] if len(proto.input) > 1 else ""
            self.pieces = [[] for _ in range(len(body.output) - 1 - carried_count)]
        limit = None
        if proto.input and proto.input[0]:
            limit = constant_of(proto.input[0])
            if limit is None:
                raise UnsupportedError(f"{where}: its trip count must be known when the model is planned")
            limit = int(np.asarray(limit).reshape(()))
        going = True
        if self.condition:
            value = constant_of(self.condition)
            if value is None:
                raise UnsupportedError(
                    f"{where}: its condition must be known when the model is planned (a stage "
                    f"learns one computed from data, see stages.py)"
                )
            going = bool(np.asarray(value).reshape(()))
        if limit is None and self.iteration >= MAX_LOOP_ITERATIONS:
            raise UnsupportedError(f"{where}: still running after {MAX_LOOP_ITERATIONS} iterations")
        if going and (limit is None or self.iteration < limit):
            return self._iteration(self.carried, self.pieces)
        outputs = []
        for state, outer in zip(self.carried, proto.output[:carried_count]):
            if outer:
                outputs.append(
                    FlatNode(
                        helper.make_node("Identity", [state], [outer]), self.opset, f"{self.name}/{outer}", self.name
                    )
                )
        for pieces, outer in zip(self.pieces, proto.output[carried_count:]):
            if outer:
                if not pieces:
                    raise UnsupportedError(f"{where}: no iteration ran, so its scan output {outer!r} has no shape")
                outputs += _stacked(self.name, outer, pieces, 0, self.opset, self.name)
        return outputs

    def _iteration(self, carried: list[str], scan_pieces: list[list[str]]) -> list:
        """The nodes of the next iteration, from ``carried`` (the carried values' names now) and
        ``scan_pieces`` (each scan output's pieces so far, to which it adds its own)."""
        from onnx import helper, numpy_helper

        body = scan_body(self.proto)
        prefix = f"{self.name}/iteration{self.iteration}"
        nodes, edge = _body_copy(body, prefix, self.opset, self.name)
        counter = edge(body.input[0].name)
        heads = [
            FlatNode(
                helper.make_node(
                    "Constant",
                    [],
                    [counter],
                    name=counter,
                    value=numpy_helper.from_array(np.array(self.iteration, np.int64), counter),
                ),
                self.opset,
                counter,
                self.name,
            )
        ]
        sources = [self.condition] + carried
        for source, body_input in zip(sources, body.input[1:]):
            target = edge(body_input.name)
            if source:
                node = helper.make_node("Identity", [source], [target])
            else:  # no condition given: true
                node = helper.make_node("Constant", [], [target], value=numpy_helper.from_array(np.array(True), target))
            heads.append(FlatNode(node, self.opset, target, self.name))
        carried_count = len(carried)
        self.condition = edge(body.output[0].name)
        self.carried = [edge(o.name) for o in body.output[1 : 1 + carried_count]]
        for pieces, output in zip(scan_pieces, body.output[1 + carried_count :]):
            pieces.append(edge(output.name))
        self.iteration += 1
        return heads + nodes + [self]


def unrolled_scan(proto, name: str, opset: int, shapes: dict) -> list[FlatNode]:
    """Scan node ``proto`` (opset 9 on) as its body repeated once per step of the sequence,
    ``shapes`` giving its inputs' shapes: each step's scan inputs are Gathers of one index
    along their axes (from the end, for a reversed input), its states the step before's, its
    values renamed ``name/stepK/...`` (names from the graphs around are kept); then the final
    states, and each scan output stacked along its axis by Unsqueeze and Concat."""
    from onnx import helper, numpy_helper

    where = f"node {name!r} (Scan)"
    if opset < 9:
        raise UnsupportedError(f"{where}: Scan of opset 8 (with a batch axis) is not supported")
    body = scan_body(proto)
    attributes = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    scanned = int(attributes.get("num_scan_inputs", 0))
    states = len(proto.input) - scanned
    if scanned < 1 or states < 0 or len(body.input) != len(proto.input):
        raise UnsupportedError(
            f"{where}: {scanned} scan input(s) for {len(proto.input)} inputs and a body of {len(body.input)}"
        )
    scan_outputs = len(body.output) - states
    input_axes = list(attributes.get("scan_input_axes") or [0] * scanned)
    input_reversed = list(attributes.get("scan_input_directions") or [0] * scanned)
    output_axes = list(attributes.get("scan_output_axes") or [0] * scan_outputs)
    output_reversed = list(attributes.get("scan_output_directions") or [0] * scan_outputs)
    sources = proto.input[states:]
    ranks = [len(shapes[s]) for s in sources]
    input_axes = [a % r for a, r in zip(input_axes, ranks)]
    lengths = {shapes[s][a] for s, a in zip(sources, input_axes)}
    if len(lengths) != 1 or 0 in lengths:
        raise UnsupportedError(
            f"{where}: scan inputs of lengths {sorted(lengths)} along their axes (one length, at least 1)"
        )
    steps = lengths.pop()
    flat: list[FlatNode] = []

    def add(node) -> None:
        flat.append(FlatNode(node, opset, node.name, name))

    current = list(proto.input[:states])
    per_step: list[list[str]] = [[] for _ in range(scan_outputs)]
    for step in range(steps):
        prefix = f"{name}/step{step}"
        body_nodes, edge = _body_copy(body, prefix, opset, name)
        for state, body_input in zip(current, body.input[:states]):
            add(helper.make_node("Identity", [state], [edge(body_input.name)], name=f"{prefix}/{body_input.name}"))
        for k, (source, body_input) in enumerate(zip(sources, body.input[states:])):
            at = steps - 1 - step if input_reversed[k] else step
            index = f"{prefix}/{body_input.name}/index"
            add(
                helper.make_node(
                    "Constant", [], [index], name=index, value=numpy_helper.from_array(np.array(at, np.int64), index)
                )
            )
            add(
                helper.make_node(
                    "Gather",
                    [source, index],
                    [edge(body_input.name)],
                    axis=input_axes[k],
                    name=f"{prefix}/{body_input.name}/slice",
                )
            )
        flat += body_nodes
        current = [edge(o.name) for o in body.output[:states]]
        for m, output in enumerate(body.output[states:]):
            per_step[m].append(edge(output.name))
    for state, outer in zip(current, proto.output[:states]):
        if outer:
            add(helper.make_node("Identity", [state], [outer], name=f"{name}/{outer}"))
    for m, outer in enumerate(proto.output[states:]):
        if outer:
            pieces = per_step[m][::-1] if output_reversed[m] else per_step[m]
            flat += _stacked(name, outer, pieces, output_axes[m], opset, name)
    return flat


def if_branch(proto, name: str, condition: bool, opset: int) -> list[FlatNode]:
    """The nodes of the branch of If node ``proto`` (named ``name``) that ``condition`` selects:
    its initializers as Constant nodes, its nodes, and Identity nodes giving its outputs the
    If's output names.  Names need no change: ONNX forbids a subgraph to reuse a name of the
    graphs around it, and only one branch is taken."""
    from onnx import helper

    label = "then" if condition else "else"
    graph = next((helper.get_attribute_value(a) for a in proto.attribute if a.name == f"{label}_branch"), None)
    if graph is None:
        raise UnsupportedError(f"node {name!r} (If): no {label}_branch")
    if len(graph.output) != len(proto.output):
        raise UnsupportedError(
            f"node {name!r} (If): its {label}_branch has {len(graph.output)} outputs, the node {len(proto.output)}"
        )
    prefix = f"{name}/{label}"
    flat = [
        FlatNode(helper.make_node("Constant", [], [tensor.name], value=tensor), opset, f"{prefix}/{tensor.name}", name)
        for tensor in graph.initializer
    ]
    flat += [
        FlatNode(node, opset, f"{prefix}/{node.name or f'{node.op_type}_{position}'}", name)
        for position, node in enumerate(graph.node)
    ]
    flat += [
        FlatNode(helper.make_node("Identity", [inner.name], [outer]), opset, f"{prefix}/{outer}", name)
        for inner, outer in zip(graph.output, proto.output)
        if outer
    ]
    return flat


def _schema(op_type: str, opset: int):
    from onnx import defs

    try:
        return defs.get_schema(op_type, opset, "")
    except defs.SchemaError:
        return None


def _body_version(schema, opset: int) -> tuple[int, bool] | None:
    """(function opset, context-dependent?) of the body to use for ``schema`` in a model of
    ``opset``: the newest not above it, else the oldest.  Every body of a schema means that
    schema's operator; they differ in the opset their own nodes are written in (ThresholdedRelu
    of opset 10 has a body in opset 18's operators only), and each node is converted at its own."""
    versions = [(v, False) for v in schema.function_opset_versions]
    versions += [(v, True) for v in schema.context_dependent_function_opset_versions]
    if not versions:
        return None
    usable = [entry for entry in versions if entry[0] <= opset]
    return max(usable) if usable else min(versions)


def has_function(op_type: str, domain: str, opset: int) -> bool:
    """Whether ONNX defines ``op_type`` at ``opset`` by a body polyc can expand."""
    if domain not in ("", "ai.onnx"):
        return False
    schema = _schema(op_type, opset)
    return schema is not None and _body_version(schema, opset) is not None


@functools.cache
def function_bodies() -> dict[str, list[int]]:
    """Operator of the default domain -> the opsets at which ONNX gives it a body (shared: do
    not modify)."""
    from onnx import defs

    bodies: dict[str, set[int]] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain in ("", "ai.onnx"):
            # (onnx's type stubs lack these two properties of OpSchema)
            versions = set(schema.function_opset_versions) | set(  # type: ignore[attr-defined]
                schema.context_dependent_function_opset_versions  # type: ignore[attr-defined]
            )
            if versions:
                bodies.setdefault(schema.name, set()).update(versions)
    return {op: sorted(versions) for op, versions in bodies.items()}


def expand(proto, name: str, opset: int, input_types: list) -> list[FlatNode]:
    """The body of node ``proto`` (named ``name``) at ``opset``, its edges renamed into the
    graph: the function's formal inputs and outputs become the node's, every other value and
    node gets ``name + "/"`` in front.  ``input_types``: a ``TypeProto`` (or None when unknown)
    per input of the node, which context-dependent bodies are built from."""
    from onnx import FunctionProto, TypeProto, helper

    where = f"node {name!r} ({proto.op_type})"
    schema = _schema(proto.op_type, opset)
    version = _body_version(schema, opset) if schema is not None else None
    if version is None:
        raise UnsupportedError(f"{where}: ONNX defines no function body for it at opset {opset}")
    body_opset, context_dependent = version
    node = helper.make_node(proto.op_type, list(proto.input), list(proto.output), name=name)
    node.attribute.extend(proto.attribute)
    given = {a.name for a in proto.attribute}
    # A body refers to the node's attributes by name; those left out take the schema's defaults.
    for attribute_name, attribute in schema.attributes.items():
        default = attribute.default_value
        if attribute_name not in given and default.type != 0:
            node.attribute.append(default)
    function = FunctionProto()
    try:
        if context_dependent:
            types = [
                (t if t is not None and input_name else TypeProto()).SerializeToString()
                for input_name, t in zip(proto.input, input_types)
            ]
            function.ParseFromString(
                schema.get_context_dependent_function_with_opset_version(body_opset, node.SerializeToString(), types)
            )
        else:
            function.ParseFromString(schema.get_function_with_opset_version(body_opset))
    except Exception as error:  # noqa: BLE001 - onnx's builders raise several kinds
        raise UnsupportedError(f"{where}: ONNX could not build its function body ({error})") from error
    if not function.node:
        raise UnsupportedError(f"{where}: ONNX could not build its function body for these input types")
    function_opset = next((o.version for o in function.opset_import if o.domain in ("", "ai.onnx")), body_opset)
    return _renamed(function, node, name, function_opset)


def _renamed(function, node, name: str, function_opset: int) -> list[FlatNode]:
    from onnx import helper

    edges = {formal: (node.input[i] if i < len(node.input) else "") for i, formal in enumerate(function.input)}
    for i, formal in enumerate(function.output):
        # An output the node leaves out stays internal: the body may still read it.
        if i < len(node.output) and node.output[i]:
            edges[formal] = node.output[i]
    attributes = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in function.attribute_proto}

    def edge(value: str) -> str:
        if not value:
            return ""
        return edges.get(value, f"{name}/{value}")

    flat = []
    for position, inner in enumerate(function.node):
        inner_name = f"{name}/{inner.name or f'{inner.op_type}_{position}'}"
        renamed = helper.make_node(
            inner.op_type,
            [edge(v) for v in inner.input],
            [edge(v) for v in inner.output],
            name=inner_name,
            domain=inner.domain,
        )
        for attribute in inner.attribute:
            if attribute.ref_attr_name:
                source = attributes.get(attribute.ref_attr_name) or defaults.get(attribute.ref_attr_name)
                if source is None:
                    continue  # neither given nor defaulted: the inner operator's own default holds
                attribute = _named(source, attribute.name)
            elif attribute.HasField("g"):  # an If's branch reads the body's values by their names
                attribute = _named(attribute, attribute.name)
                _rename_graph(attribute.g, edge)
            renamed.attribute.append(attribute)
        flat.append(FlatNode(renamed, function_opset, inner_name, name))
    return flat


def _rename_graph(graph, edge) -> None:
    """Every value name in ``graph`` (and the graphs in it) through ``edge``, in place."""
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        value.name = edge(value.name)
    for tensor in graph.initializer:
        tensor.name = edge(tensor.name)
    for node in graph.node:
        node.input[:] = [edge(v) for v in node.input]
        node.output[:] = [edge(v) for v in node.output]
        for attribute in node.attribute:
            if attribute.HasField("g"):
                _rename_graph(attribute.g, edge)


def _named(attribute, new_name: str):
    from onnx import AttributeProto

    copy = AttributeProto()
    copy.CopyFrom(attribute)
    copy.name = new_name
    return copy


def flatten(graph, opset: int, converted) -> tuple[list[FlatNode], list[tuple[str, int, str]]]:
    """The graph's nodes with every function expanded that polyc does not convert itself
    (``converted(op_type, domain, opset)``), using the element types shape inference left in
    the graph; and (op type, opset, node name) of every node that is neither converted nor
    expandable into converted nodes."""
    from onnx import shape_inference

    types = {v.name: v.type for v in list(graph.input) + list(graph.value_info) + list(graph.output)}
    for tensor in graph.initializer:
        types.setdefault(tensor.name, tensor_type(tensor.data_type, tensor.dims))
    flat, missing = [], []

    def visit(proto, node_opset, name, origin, depth) -> str | None:
        """None when ``proto`` is handled, else what is missing."""
        label = proto.op_type if proto.domain in ("", "ai.onnx") else f"{proto.domain}.{proto.op_type}"
        if converted(proto.op_type, proto.domain, node_opset):
            flat.append(FlatNode(proto, node_opset, name, origin))
            return None
        if is_scan(proto) and node_opset < 9:
            return f"{label} (opset 8's Scan, with a batch axis, is not supported)"
        if depth >= MAX_DEPTH:
            return label
        if is_loop(proto) or is_scan(proto):  # the body's nodes, once: the iterations repeat them
            flat.append(FlatNode(proto, node_opset, name, origin))
            body = [
                FlatNode(inner, node_opset, f"{name}/{inner.name or f'{inner.op_type}_{position}'}", origin)
                for position, inner in enumerate(scan_body(proto).node)
            ]
            return visit_all(body, label, "its body", origin, depth)
        if is_if(proto):  # either branch may be taken: both must be converted
            flat.append(FlatNode(proto, node_opset, name, origin))
            for condition in (True, False):
                missing_inside = visit_all(
                    if_branch(proto, name, condition, node_opset),
                    label,
                    f"its {'then' if condition else 'else'}_branch",
                    origin,
                    depth,
                )
                if missing_inside is not None:
                    return missing_inside
            return None
        if not has_function(proto.op_type, proto.domain, node_opset):
            return label
        try:
            body = expand(proto, name, node_opset, [types.get(i) for i in proto.input])
        except UnsupportedError as error:
            return f"{label} ({error})"
        return visit_all(body, label, "its ONNX function", origin, depth)

    def visit_all(nodes, label: str, inside: str, origin, depth) -> str | None:
        for inner in nodes:
            inner_missing = visit(inner.proto, inner.opset, inner.name, origin, depth + 1)
            if inner_missing is not None:
                return f"{label} ({inside} uses {inner_missing.split(' (')[0]})"
            _infer_outputs(shape_inference, inner, types)
        return None

    for position, proto in enumerate(graph.node):
        name = proto.name or f"{proto.op_type}_{position}"
        mark = len(flat)
        label = visit(proto, opset, name, name, 0)
        if label is not None:
            del flat[mark:]
            missing.append((label, opset, name))
    return flat, missing


def _infer_outputs(shape_inference, inner: FlatNode, types: dict) -> None:
    """Record the element types of a body node's outputs, which later context-dependent bodies
    may need (best effort: a type left unknown only matters to such a body)."""
    from onnx import helper

    schema = _schema(inner.proto.op_type, inner.opset)
    known = {i: types[i] for i in inner.proto.input if i and i in types}
    if schema is None or len(known) < len([i for i in inner.proto.input if i]):
        return
    try:
        outputs = shape_inference.infer_node_outputs(
            schema, inner.proto, known, opset_imports=[helper.make_opsetid("", inner.opset)]
        )
    except Exception:  # noqa: BLE001 - inference only helps
        return
    types.update(outputs)


def tensor_type(elem_type: int, shape):
    """The TypeProto of a tensor, as context-dependent bodies read their inputs' types."""
    from onnx import helper

    return helper.make_tensor_type_proto(elem_type, list(shape))
