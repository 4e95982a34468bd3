"""QDQ models into integer operators, as onnxruntime's graph optimiser rewrites them.

A QDQ model (``onnxruntime.quantization.quantize_static(..., quant_format=QDQ)``, TensorRT and
PyTorch exports) keeps every operator in float and marks its quantization with
DequantizeLinear (DQ) nodes on its inputs and a QuantizeLinear (Q) node on its output. Read
literally, each such operator runs in float between a dequantization and a quantization. A
runtime is expected to recognise the *node unit* DQ... -> op -> Q and compute it on the integers
instead: onnxruntime does so with graph optimisations on, and its results are the ones users
compare with.  :func:`integer_node_units` makes the same rewrite on a plan's nodes:

=======================  ==========================================================
node unit                becomes
=======================  ==========================================================
DQ(x), DQ(w)[, DQ(b)]    QLinearConv (the bias an int32 DQ whose scale is x's times w's)
-> Conv -> Q
DQ(a), DQ(b) -> MatMul   QLinearMatMul
-> Q
DQ(a), DQ(b)[, DQ(c)]    com.microsoft.QGemm
-> Gemm -> Q
DQ(a), DQ(b) -> Add/Mul  com.microsoft.QLinearAdd / QLinearMul
-> Q
DQ(x) -> GlobalAverage-  com.microsoft.QLinearGlobalAveragePool / QLinearAveragePool
Pool/AveragePool -> Q
DQ(x) -> Sigmoid/Leaky-  com.microsoft.QLinearSigmoid / QLinearLeakyRelu
Relu -> Q
DQ(x)... -> Concat -> Q  com.microsoft.QLinearConcat
DQ(x) -> Softmax -> Q    com.microsoft.QLinearSoftmax (its ``opset`` the node's)
DQ(x) -> MaxPool, Re-    the operator on the integers, where the DQ and the Q have the
shape, Flatten, Trans-   same scale and zero point (these operators only move or select
pose, Squeeze, Unsqueeze values, and quantization is monotonic)
-> Q
=======================  ==========================================================

A unit is rewritten only where every scale and zero point is a constant (per tensor, or per
channel where the integer operator takes it: Conv's and MatMul's weights), the operator's
output feeds the Q alone and is no output of the graph, and polyc converts the integer operator
(``supported``).  The DQ nodes stay where something else reads them and are dropped where
nothing does.  Everything else runs as the QDQ semantics say, in float.  Sessions with
``graph_fusion=False`` skip the rewrite, as onnxruntime's ``ORT_DISABLE_ALL`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

MICROSOFT = "com.microsoft"

#: Operators that only move, select or compare values: on the integers of one quantization
#: they give exactly what DQ -> op -> Q gives.
_MOVING = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"})

#: Element-wise and pooling operators with a com.microsoft integer form of one input.
_UNARY = {
    "GlobalAveragePool": "QLinearGlobalAveragePool",
    "AveragePool": "QLinearAveragePool",
    "Sigmoid": "QLinearSigmoid",
    "LeakyRelu": "QLinearLeakyRelu",
}
_BINARY = {"Add": "QLinearAdd", "Mul": "QLinearMul"}

_EIGHT_BITS = (np.dtype(np.int8), np.dtype(np.uint8))


@dataclass(frozen=True)
class _Quantization:
    """A DQ or a Q node with constant parameters: its integer side (a DQ's input, a Q's
    output), the scale's and zero point's names and values, and the axis of a per-channel scale."""

    node: Any
    integer: str
    scale: str
    zero: str | None
    scale_value: np.ndarray
    zero_value: np.ndarray
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale_value.size == 1

    def same_as(self, other: _Quantization) -> bool:
        return (
            self.per_tensor
            and other.per_tensor
            and self.zero_value.dtype == other.zero_value.dtype
            and np.array_equal(self.scale_value.reshape(-1), other.scale_value.reshape(-1))
            and np.array_equal(self.zero_value.reshape(-1), other.zero_value.reshape(-1))
        )


def integer_node_units(
    nodes: list,
    graph_outputs: set[str],
    constant: Callable[[str], np.ndarray | None],
    add_constant: Callable[[str, np.ndarray], None],
    supported: Callable[[str, str], bool],
    opset: int,
) -> list:
    """``nodes`` (NodeProtos in graph order) with every QDQ node unit polyc can compute on
    the integers replaced by its integer operator (see the module's docstring).

    ``constant(name)``: a constant's array, or None; ``add_constant(name, array)``: makes a new
    constant (the zero points a DQ or Q leaves implicit); ``supported(op_type, domain)``:
    whether polyc converts an operator; ``opset``: the default domain's, which the nodes are
    read at.  The given NodeProtos are not modified."""
    from onnx import NodeProto, helper

    consumers: dict[str, list[int]] = {}
    for position, node in enumerate(nodes):
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(position)
    producer = {name: position for position, node in enumerate(nodes) for name in node.output if name}

    def quantization(node) -> _Quantization | None:
        if node.op_type not in ("DequantizeLinear", "QuantizeLinear") or node.domain not in ("", "ai.onnx"):
            return None
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("block_size", 0) or attributes.get("output_dtype", 0) or len(node.input) < 2:
            return None
        scale = constant(node.input[1])
        zero_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        zero = constant(zero_name) if zero_name else None
        if scale is None or scale.dtype != np.float32 or (zero_name and zero is None):
            return None
        if node.op_type == "QuantizeLinear" and zero is None:
            zero = np.zeros((), np.uint8)  # QuantizeLinear's default type
        if zero is None:
            source = constant(node.input[0])
            dtype = source.dtype if source is not None else None
            if dtype not in _EIGHT_BITS and dtype != np.dtype(np.int32):
                return None  # an activation whose type the DQ alone does not say
            zero = np.zeros((), dtype)
        if scale.size != 1 and (scale.ndim != 1 or zero.shape != scale.shape):
            return None
        integer = node.input[0] if node.op_type == "DequantizeLinear" else node.output[0]
        return _Quantization(node, integer, node.input[1], zero_name, scale, zero, int(attributes.get("axis", 1)))

    def dequantized(name: str) -> _Quantization | None:
        position = producer.get(name)
        return quantization(nodes[position]) if position is not None else None

    def zero_name(q: _Quantization) -> str:
        if q.zero is not None:
            return q.zero
        name = f"polyc_qdq_zero_{q.zero_value.dtype.name}"
        if constant(name) is None:
            add_constant(name, np.zeros((), q.zero_value.dtype))
        return name

    def eight_bit(q: _Quantization) -> bool:
        return q.zero_value.dtype in _EIGHT_BITS

    replaced: dict[int, object] = {}
    dropped: set[int] = set()
    for position, node in enumerate(nodes):
        outputs = [o for o in node.output if o]
        if node.domain not in ("", "ai.onnx") or len(outputs) != 1 or outputs[0] in graph_outputs:
            continue
        readers = consumers.get(outputs[0], [])
        if len(readers) != 1:
            continue
        q = quantization(nodes[readers[0]])
        if q is None or q.node.op_type != "QuantizeLinear" or not q.per_tensor or not eight_bit(q):
            continue
        inputs = [dequantized(name) if name else None for name in node.input]
        new = _integer_form(node, inputs, q, constant, supported, zero_name, eight_bit, opset)
        if new is None:
            continue
        unit = NodeProto()
        unit.CopyFrom(new)
        del unit.output[:]
        unit.output.extend([q.integer])
        unit.name = f"{node.name or node.op_type}+{q.node.name or 'QuantizeLinear'}"
        replaced[position] = unit
        dropped.add(readers[0])
    result = [replaced.get(position, node) for position, node in enumerate(nodes) if position not in dropped]
    return _without_unread_dequantizations(result, graph_outputs)


def _integer_form(node, inputs, q: _Quantization, constant, supported, zero_name, eight_bit, opset: int):
    """The integer NodeProto computing ``node`` between the DQs ``inputs`` (None where an input
    is not a DQ's) and the Q ``q``, or None where the unit stays in float."""
    from onnx import helper

    op = node.op_type
    attributes = list(node.attribute)

    def make(op_type: str, names: list[str], domain: str = ""):
        if not supported(op_type, domain):
            return None
        made = helper.make_node(op_type, names, ["?"], domain=domain)
        made.attribute.extend(attributes)
        return made

    def activation(x: _Quantization | None) -> bool:
        return x is not None and x.per_tensor and eight_bit(x)

    def operand(x: _Quantization) -> list[str]:
        return [x.integer, x.scale, zero_name(x)]

    output = [q.scale, zero_name(q)]
    if op == "Conv" and len(inputs) >= 2:
        x, w = inputs[:2]
        if not activation(x) or w is None or not eight_bit(w) or constant(w.integer) is None:
            return None
        if not (w.per_tensor or w.axis in (0, -constant(w.integer).ndim)):
            return None
        names = operand(x) + operand(w) + output
        if len(inputs) > 2 and node.input[2]:
            bias = _integer_bias(inputs[2], x, w, constant)
            if bias is None:
                return None
            names.append(bias)
        return make("QLinearConv", names)
    if op == "MatMul" and len(inputs) == 2:
        a, b = inputs
        if not activation(a) or b is None or not eight_bit(b):
            return None
        rank = len(constant(b.integer).shape) if constant(b.integer) is not None else None
        if not (b.per_tensor or (rank == 2 and b.axis in (1, -1))):
            return None
        return make("QLinearMatMul", operand(a) + operand(b) + output)
    if op == "Gemm" and len(inputs) >= 2:
        a, b = inputs[:2]
        gemm = {at.name: helper.get_attribute_value(at) for at in attributes}
        columns_axis = 0 if gemm.get("transB", 0) else 1  # the axis of B along the output's columns
        if not activation(a) or b is None or not eight_bit(b) or not (b.per_tensor or b.axis == columns_axis):
            return None
        names = operand(a) + operand(b)
        if len(inputs) > 2 and node.input[2]:
            bias = _integer_bias(inputs[2], a, b, constant)
            if bias is None or gemm.get("beta", 1.0) != 1.0:
                return None
            names.append(bias)
        else:
            names.append("")
        attributes = [at for at in attributes if at.name != "beta"]  # QGemm adds its bias as it is
        return make("QGemm", names + output, MICROSOFT)
    if op in _BINARY and len(inputs) == 2:
        a, b = inputs
        if not activation(a) or not activation(b):
            return None
        return make(_BINARY[op], operand(a) + operand(b) + output, MICROSOFT)
    if op in _UNARY and len(inputs) == 1:
        (x,) = inputs
        if not activation(x):
            return None
        return make(_UNARY[op], operand(x) + output, MICROSOFT)
    if op == "Softmax" and len(inputs) == 1 and activation(inputs[0]):
        attributes = attributes + [helper.make_attribute("opset", opset)]  # the axis's meaning
        return make("QLinearSoftmax", operand(inputs[0]) + output, MICROSOFT)
    if op == "Concat" and inputs and all(activation(x) for x in inputs):
        return make("QLinearConcat", output + [name for x in inputs for name in operand(x)], MICROSOFT)
    if op in _MOVING and inputs and inputs[0] is not None and inputs[0].same_as(q) and len(node.output) == 1:
        return make(op, [inputs[0].integer] + list(node.input[1:]))
    return None


def _integer_bias(bias: _Quantization | None, x: _Quantization, w: _Quantization, constant) -> str | None:
    """The int32 bias of an integer Conv or Gemm: the input of the bias's DQ, where its zero
    point is 0 and its scale is the input's times the weights' (as quantizers make it: then
    adding it to the int32 product is adding the float bias), else None."""
    if bias is None or bias.zero_value.dtype != np.int32 or np.any(bias.zero_value != 0):
        return None
    if constant(bias.integer) is None:
        return None
    expected = (x.scale_value.reshape(-1)[0] * w.scale_value.reshape(-1)).astype(np.float32)
    got = bias.scale_value.reshape(-1)
    if got.size not in (1, expected.size) or not np.allclose(got, expected, rtol=2.0**-20, atol=0.0):
        return None
    return bias.integer


def _without_unread_dequantizations(nodes: list, graph_outputs: set[str]) -> list:
    """``nodes`` without the DequantizeLinear nodes whose output nothing reads any more."""
    read = {name for node in nodes for name in node.input if name} | graph_outputs
    return [n for n in nodes if not (n.op_type == "DequantizeLinear" and n.output and n.output[0] not in read)]
