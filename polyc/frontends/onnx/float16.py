"""float16 models computed in float32, rounded to float16 between operators.

A float16 model (weights and activations in float16, as onnxconverter-common's conversion makes
them) is rewritten, on polyc's own copy, into the float32 model that computes the same values:
its float16 weights become float32 (exactly), its float16 inputs are widened by a Cast as they
enter, and after each operator that computes (a convolution, a product, an addition, a
softmax...) its float16 outputs are rounded to float16 and widened again by two Casts, so that
every value between operators is one that a float16 tensor holds, as ONNX's float16 operators
require.  A float16 graph output is the rounded value itself.  Operators that only move or pick
float16 values (Reshape, Transpose, Concat, MaxPool, Relu...) are exact and get no rounding.

Inside an operator, everything is then float32, rounded once at its end: a convolution's or a
product's sums (as :mod:`polyc.lang.float16_sums` already does for float16 reductions), and the
steps of a softmax or a normalisation too, where polyc's float16 lowering rounded after each.
onnxruntime's CPU provider computes float16 operators it has no float16 kernel for the same way
(in float32 between Casts).  The kernel paths see float32 definitions, so every float16 model
takes the gemm, convolution, depthwise and Winograd kernels that its float32 twin takes, the
weights packed in float32 once, and the fusion passes inline each rounding
(``float(float16(x))``) into the kernel writing ``x``, where the register epilogues round a
vector of accumulators at a time (:mod:`polyc.codegen.register_epilogue`).

A model is left as it is (its float16 operators each computed in float and rounded per step)
where the rewrite could change what it means: an operator with a subgraph (If, Loop, Scan), an
operator that makes float16 values from an attribute other than Cast's ``to``, Constant's and
ConstantOfShape's ``value``, or a value whose element type shape inference did not find.
"""

from __future__ import annotations

import numpy as np

from polyc.frontends.onnx.model import initializer_array

#: Operators whose float16 outputs are float16 inputs moved, picked or compared, never computed
#: (a value already held in float16 passes unchanged), so that rounding them again changes nothing.
EXACT_OPERATORS = frozenset(
    {
        "Concat",
        "Constant",
        "ConstantOfShape",
        "DepthToSpace",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "GatherND",
        "GlobalMaxPool",
        "Identity",
        "Max",
        "MaxPool",
        "Min",
        "Pad",
        "Relu",
        "Reshape",
        "ReduceMax",
        "ReduceMin",
        "Slice",
        "SpaceToDepth",
        "Split",
        "Squeeze",
        "Tile",
        "Transpose",
        "Unsqueeze",
        "Where",
    }
)

#: Operators whose float16 outputs this module knows how to make float32 (besides those whose
#: outputs follow their inputs' type): what their attributes say.
_TYPED_BY_ATTRIBUTE = {"Cast": "to", "Constant": "value", "ConstantOfShape": "value"}


def _element_types(graph) -> dict[str, int] | None:
    """The element type of each of ``graph``'s values, or None where a node's output has none."""
    types = {}
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for tensor in graph.initializer:
        types[tensor.name] = tensor.data_type
    for node in graph.node:
        for output in node.output:
            if output and types.get(output, 0) == 0:
                return None
    return types


def _rewritable(graph, float16: int) -> bool:
    """Whether no node of ``graph`` holds a subgraph or makes float16 values from an attribute
    this module does not rewrite."""
    from onnx import AttributeProto

    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                return False
            typed = _TYPED_BY_ATTRIBUTE.get(node.op_type) == attribute.name
            names_a_type = attribute.name in ("dtype", "to", "output_dtype")
            if attribute.type == AttributeProto.INT and attribute.i == float16 and names_a_type and not typed:
                return False
            if attribute.type == AttributeProto.TENSOR and attribute.t.data_type == float16 and not typed:
                return False
    return True


def computed_in_float32(model):
    """``model`` (polyc's own copy, shape-inferred), with float16 computed in float32 and rounded
    to float16 between operators as the module docstring says; ``model`` itself where it has no
    float16 value or cannot be rewritten.  The graph's inputs and outputs keep their types."""
    from onnx import TensorProto, helper, numpy_helper

    float16, float32 = TensorProto.FLOAT16, TensorProto.FLOAT
    graph = model.graph
    types = _element_types(graph)
    halves = {name for name, elem_type in (types or {}).items() if elem_type == float16}
    if not halves or not _rewritable(graph, float16):
        return model
    assert types is not None
    taken = {name for node in graph.node for name in list(node.input) + list(node.output)}
    taken |= {value.name for value in list(graph.input) + list(graph.output) + list(graph.initializer)}

    def fresh(base: str) -> str:
        name, count = base, 0
        while name in taken:
            count += 1
            name = f"{base}_{count}"
        taken.add(name)
        return name

    def widened(tensor):
        return numpy_helper.from_array(initializer_array(tensor).astype(np.float32), tensor.name)

    for index, tensor in enumerate(graph.initializer):
        if tensor.data_type == float16:
            graph.initializer[index].CopyFrom(widened(tensor))
    constants = {tensor.name for tensor in graph.initializer}
    renamed: dict[str, str] = {}  # a float16 graph input or output -> its float32 value inside
    nodes = []
    for value in graph.input:
        if value.name in halves and value.name not in constants:
            renamed[value.name] = fresh(f"{value.name}/float32")
            nodes.append(helper.make_node("Cast", [value.name], [renamed[value.name]], to=float32))
    outputs = {value.name for value in graph.output if value.name in halves}
    if not outputs <= {name for node in graph.node for name in node.output}:
        return model  # a float16 output that is an input or a weight: nothing to round
    for name in outputs:
        renamed.setdefault(name, fresh(f"{name}/float32"))
    for node in graph.node:
        rewritten = type(node)()
        rewritten.CopyFrom(node)
        for position, name in enumerate(rewritten.input):
            rewritten.input[position] = renamed.get(name, name)
        if node.op_type == "Clip" and node.input and types.get(node.input[0]) == float16 and not node.attribute:
            # A bound left out is float16's largest finite value, not float32's (onnxruntime's).
            bounds = (list(rewritten.input[1:3]) + ["", ""])[:2]
            for position, sign in ((0, -1.0), (1, 1.0)):
                if not bounds[position]:
                    bounds[position] = fresh(f"{node.name or 'Clip'}/float16_bound")
                    graph.initializer.append(
                        numpy_helper.from_array(np.array(sign * 65504.0, np.float32), bounds[position])
                    )
            del rewritten.input[1:]
            rewritten.input.extend(bounds)
        for attribute in rewritten.attribute:
            # (A double cast to float16 stays one rounding: through float32, a tie could round twice.)
            from_double = types.get(node.input[0] if node.input else "") == TensorProto.DOUBLE
            if attribute.name == "to" and attribute.i == float16 and not from_double:
                attribute.i = float32
            elif attribute.name == "value" and attribute.t.data_type == float16:
                attribute.t.CopyFrom(widened(attribute.t))
        nodes.append(rewritten)
        for position, name in enumerate(node.output):
            if name not in halves:
                continue
            inside = renamed.get(name, name)  # the float32 value the graph's other nodes read
            if node.op_type in EXACT_OPERATORS and name not in outputs:
                continue
            if node.op_type in EXACT_OPERATORS:
                rewritten.output[position] = inside
                nodes.append(helper.make_node("Cast", [inside], [name], to=float16))
                continue
            computed = fresh(f"{name}/computed")
            rewritten.output[position] = computed
            rounded = name if name in outputs else fresh(f"{name}/float16")
            nodes.append(helper.make_node("Cast", [computed], [rounded], to=float16))
            nodes.append(helper.make_node("Cast", [rounded], [inside], to=float32))
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.value_info:
        if value.type.tensor_type.elem_type == float16:
            value.type.tensor_type.elem_type = float32
    return model
