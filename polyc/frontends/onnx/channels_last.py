"""Channels-last layout: 2-D convolutions and what lies between them computed in NHWC.

ONNX images are NCHW.  polyc's convolution kernel is fastest when the output channels are the
innermost dimension (:mod:`polyc.codegen.conv_channels`: each step of the reduction loads
vectors of weights for consecutive channels and broadcasts one image element per point), and
a 1 x 1 convolution in NHWC is one matrix product over all pixels.  So, as onnxruntime and
TVM change the layout of convolution chains, a plan with ``channels_last`` (the default with
graph fusion) converts the nodes below in NHWC as it meets them:

- **Conv** (2-D, constant weights, one group): the weights are transposed once to
  ``(KH, KW, C, F)``; the input is taken in NHWC;
- **pools** (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) of an input that already
  is in NHWC;
- **elementwise** operators (activations, arithmetic with broadcasting, Clip, Where, Cast, ...)
  with at least one rank-4 input in NHWC: every other rank-4 input is taken in NHWC too, and a
  constant that broadcasts against them is transposed to match (``(C, 1, 1)`` -> ``(1, 1, C)``);
- **Concat** along the channels, of such inputs, as a Concat along the last axis;
- **Transpose** between the layouts, as a view: NCHW -> NHWC of a value in NHWC is its storage,
  and NHWC -> NCHW of any rank-4 value is a value in NHWC (a network that permutes to
  channels-last around its own layers, as ConvNeXt does, moves no data for them).

Every value a node produces this way exists in NHWC only.  A node that needs it in ONNX's
layout (a Flatten, a Gemm, a graph output) gets it through a transpose emitted just before,
once per value; a value needed in NHWC that exists in NCHW only (the graph's input image) is
transposed the other way, once.  A transpose of an image whose spatial extent or channel count
is 1 (a global pool's output) moves nothing: it is a view.  Nothing else changes: the rest of
the plan (fusion, memory, compilation) sees ordinary values and steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from polyc.frontends.onnx.lowering import Builder, Value, derived_constant
from polyc.frontends.onnx.ops import _FLOAT_FUNCTIONS, CONVERTERS
from polyc.frontends.onnx.ops.base import Node, _affine, _require_const
from polyc.frontends.onnx.ops.contractions import _product_by_blocked_weights, _weight_sliver, zero_padded_columns
from polyc.frontends.onnx.ops.convolutions import (
    AveragePool,
    MaxPool,
    _spatial,
    check_convolution_operands,
    global_pool,
    image_indices,
)
from polyc.frontends.onnx.ops.shapes import transposed

#: NCHW -> NHWC and back, as Transpose perms.
TO_CHANNELS_LAST = (0, 2, 3, 1)
TO_CHANNELS_FIRST = (0, 3, 1, 2)

#: Operators computed element by element (with numpy broadcasting): they commute with a
#: transpose of all their inputs.
ELEMENTWISE = frozenset(_FLOAT_FUNCTIONS) | {
    "Relu",
    "Neg",
    "Abs",
    "Sign",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Mod",
    "Not",
    "Where",
    "Cast",
    "Clip",
    "LeakyRelu",
    "Elu",
    "Selu",
    "HardSigmoid",
    "Gelu",
    "PRelu",
    "Identity",
}

#: The pools' lowerings, called as (builder, node, inputs, channels_last).
_POOLS = {
    "MaxPool": MaxPool.lower,
    "AveragePool": AveragePool.lower,
    "GlobalAveragePool": lambda b, node, inputs, channels_last: [global_pool(b, inputs[0], "average", channels_last)],
    "GlobalMaxPool": lambda b, node, inputs, channels_last: [global_pool(b, inputs[0], "max", channels_last)],
}

#: Element types of polyc's convolution kernel.
_CONV_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ChannelsLast:
    """The NHWC values of a plan being converted.  ``values`` is the plan's map from ONNX names
    to values in ONNX's layout; a value produced here is in ``nhwc`` instead until a node
    needs it in NCHW (:meth:`need_nchw`)."""

    def __init__(self, values: dict[str, Value], new_ident, vector_bits: int, options: Mapping = MappingProxyType({})):
        self.values = values
        self.nhwc: dict[str, Value] = {}
        self.new_ident = new_ident
        self.vector_bits = vector_bits  # of the build (see Builder)
        self.options = options  # the session's: its back end and kernel options

    # ------------------------------------------------------------------ node conversion
    def convert(self, node: Node, opset: int) -> list | None:
        """The steps computing ``node`` in NHWC (its outputs then in ``nhwc``), or None when the
        node is not converted (the plan converts it as usual, after :meth:`need_nchw`)."""
        proto = node.proto
        op = node.op_type
        if proto.domain not in ("", "ai.onnx"):
            return None
        known = [self._value(name) for name in proto.input if name]
        if all(value.const is not None for value in known):
            return None  # folded by the plan
        b = Builder(node.name, op, self.new_ident, self.vector_bits)
        if op in ("Shape", "Size") and proto.input[0] in self.nhwc and proto.input[0] not in self.values:
            return self._shape_of(b, node, opset)
        if op == "Transpose":
            return self._transpose(b, node)
        if op == "Conv":
            outputs = self._conv(b, node)
        elif op in _POOLS:
            outputs = self._pool(b, node)
        elif op in ELEMENTWISE or (op == "Dropout" and len([o for o in node.outputs if o]) == 1):
            outputs = self._elementwise(b, node, opset)
        elif op == "Concat":
            outputs = self._concat(b, node, opset)
        else:
            outputs = None
        if outputs is None:
            return None
        for name, value in zip(proto.output, outputs):
            if name:
                value.onnx_name = name
                self.nhwc[name] = value
        return b.steps

    def _transpose(self, b: Builder, node: Node) -> list | None:
        """A Transpose between the two layouts, as a view: NCHW -> NHWC of a value held in NHWC
        is that NHWC storage (an ordinary value from then on), and NHWC -> NCHW of an ordinary
        rank-4 value is a value whose NHWC form is that value (held in ``nhwc``, transposed only
        if a node needs it in NCHW).  A network that permutes to channels-last around its own
        layers (ConvNeXt's blocks, a LayerNorm over the channels) then moves no data for them,
        and the layers between stay in NHWC."""
        proto = node.proto
        if len(proto.input) != 1 or not proto.output or not proto.output[0]:
            return None
        perm = tuple(node.attr("perm", ()) or ())
        source, target = proto.input[0], proto.output[0]
        if perm == TO_CHANNELS_LAST and source in self.nhwc:
            image = self.nhwc[source]
            value = b.view(image, image.shape)
            value.onnx_name = target
            self.values[target] = value
            return b.steps
        if perm == TO_CHANNELS_FIRST and source not in self.nhwc and source in self.values:
            value = self.values[source]
            if value.rank != 4 or value.const is not None:
                return None
            image = b.view(value, value.shape)
            image.onnx_name = target
            self.nhwc[target] = image
            return b.steps
        return None

    def _shape_of(self, b: Builder, node: Node, opset: int) -> list:
        """Shape or Size of a value in NHWC only: its NCHW shape, with no transpose (an
        exporter's Shape -> Gather -> Concat -> Reshape reads the shape long before the data)."""
        image = self.nhwc[node.proto.input[0]]
        stand_in = Value("", image.dtype, tuple(image.shape[p] for p in TO_CHANNELS_FIRST))
        for name, value in zip(node.proto.output, CONVERTERS[node.op_type].convert(b, node, [stand_in], opset)):
            if name:
                value.onnx_name = name
                self.values[name] = value
        return b.steps

    def _known(self, name: str) -> Value | None:
        """A value of the node's input ``name`` in either layout (None: an omitted input)."""
        if not name:
            return None
        return self._value(name)

    def _value(self, name: str) -> Value:
        """The value of the node's input ``name`` (given) in either layout."""
        return self.nhwc.get(name) or self.values[name]

    def _image(self, b: Builder, name: str) -> Value:
        """Input ``name`` in NHWC, transposed from NCHW (once) if that is all there is (a step
        of its own node, ``<name> to NHWC``, before the steps of ``b``)."""
        if name not in self.nhwc:
            transpose = Builder(f"{name} to NHWC", "Transpose", self.new_ident, self.vector_bits)
            self.nhwc[name] = _moved(transpose, self.values[name], TO_CHANNELS_LAST)
            b.steps += transpose.steps
        return self.nhwc[name]

    def _conv(self, b: Builder, node: Node) -> list | None:
        proto = node.proto
        x, w = self._known(proto.input[0]), self._known(proto.input[1])
        bias = self._known(proto.input[2]) if len(proto.input) > 2 else None
        if (
            x is None
            or w is None
            or w.const is None
            or w.rank != 4
            or x.rank != 4
            or x.dtype not in _CONV_DTYPES
            or w.dtype != x.dtype
            or (bias is not None and bias.rank != 1)
        ):
            return None
        x_shape = tuple(x.shape[p] for p in TO_CHANNELS_FIRST) if proto.input[0] in self.nhwc else x.shape
        check_convolution_operands(b, node, x_shape, w, bias)
        groups = node.attr("group", 1)
        if groups != 1:
            return self._depthwise(b, node, x, w, bias) if groups == w.shape[0] and w.shape[1] == 1 else None
        if not _pays_in_channels_last(b, node, x, w, proto.input[0] in self.nhwc):
            return None
        if proto.input[0] not in self.nhwc and w.shape[1] <= IMAGE_CHANNELS_READ_IN_PLACE and w.shape[2:] != (1, 1):
            return [conv_channels_last(b, node, x, w, bias, image_channels_last=False, options=self.options)]
        x = self._image(b, proto.input[0])
        return [conv_channels_last(b, node, x, w, bias, options=self.options)]

    def _depthwise(self, b: Builder, node: Node, x: Value, w: Value, bias: Value | None) -> list | None:
        """A depthwise convolution (one filter per channel) of an image in NHWC already, as one
        statement with its zero padding in the condition, for polyc's depthwise kernel
        (:mod:`polyc.codegen.depthwise`: channels vectorised, each tap's weights loaded once per
        row and the image vectors that neighbouring outputs share once), which runs
        mobilenet_v2's 3 x 3 depthwise layers in about half the time of the generic path's
        statements per region of positions (``python -m benchmarks.onnx_segments mobilenet_v2``)."""
        name = node.proto.input[0]
        if name not in self.nhwc or self.nhwc[name].shape[-1] != w.shape[0]:
            return None
        x = self.nhwc[name]
        channels, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        outs, begin, end, strides, dilations = _spatial(b, node, x, [kh, kw], channels_last=True)
        out = b.new([x.shape[0], *outs, channels], x.dtype)
        idx = ["n", "s0", "s1", "c"]
        weights = b.const(
            np.ascontiguousarray(np.moveaxis(_require_const(b, w, "the weights").reshape(channels, kh, kw), 0, -1))
        )
        window = [
            f"{_affine(strides[d], f's{d}', 0)} + {_affine(dilations[d], f'r_k{d}', -begin[d])}" for d in range(2)
        ]
        inside = [f"{window[d]} >= 0" for d in range(2) if begin[d] > 0]
        inside += [f"{window[d]} < {x.shape[1 + d]}" for d in range(2) if end[d] > 0]
        rhs = f"{b.ref(x, ['n', *window, 'c'])} * {b.ref(weights, ['r_k0', 'r_k1', 'c'])}"
        if inside:
            rhs = f"({' && '.join(inside)}) ? {rhs} : 0.0"
        statements = [b.statement(out, idx, "+=!", rhs, [("r_k0", kh), ("r_k1", kw)])]
        reads = [x, weights]
        if bias is not None:
            statements.append(b.statement(out, idx, "=", f"{out.ident}(n, s0, s1, c) + {b.ref(bias, ['c'])}"))
            reads.append(bias)
        b.emit(statements, reads, [out], "convolution")
        return [out]

    def _pool(self, b: Builder, node: Node) -> list | None:
        proto = node.proto
        if proto.input[0] not in self.nhwc or self.nhwc[proto.input[0]].rank != 4:
            return None
        if node.op_type == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
            return None
        return _POOLS[node.op_type](b, node, [self.nhwc[proto.input[0]]], True)

    def _channels_last_inputs(self, b: Builder, names) -> list | None:
        """The inputs of an elementwise node or a Concat in NHWC, or None when none of them is
        in NHWC already or one cannot be (a run-time value of another rank, a constant that
        does not broadcast to rank 4)."""
        known = [self._known(name) for name in names]
        if not any(name in self.nhwc for name in names if name):
            return None
        inputs: list[Value | None] = []
        for _name, value in zip(names, known):
            if value is None:
                inputs.append(None)
            elif value.const is not None:
                if value.rank > 4:
                    return None
                if value.rank == 0:
                    inputs.append(value)
                else:
                    array = value.const.reshape((1,) * (4 - value.rank) + value.const.shape)
                    inputs.append(b.const(np.ascontiguousarray(array.transpose(TO_CHANNELS_LAST))))
            elif value.rank != 4:
                return None
            else:
                inputs.append(None)  # a run-time image: taken in NHWC below, once all are known to be
        return [self._image(b, name) if value is None and name else value for name, value in zip(names, inputs)]

    def _elementwise(self, b: Builder, node: Node, opset: int) -> list | None:
        inputs = self._channels_last_inputs(b, list(node.proto.input))
        if inputs is None:
            return None
        return CONVERTERS[node.op_type].convert(b, node, inputs, opset)

    def _concat(self, b: Builder, node: Node, opset: int) -> list | None:
        if node.attr("axis") not in (1, -3):
            return None
        names = list(node.proto.input)
        if any((value := self._known(name)) is None or value.rank != 4 for name in names):
            return None
        inputs = self._channels_last_inputs(b, names)
        if inputs is None:
            return None
        along_channels = Node(node.proto, node.name)
        along_channels.attributes["axis"] = 3
        return CONVERTERS["Concat"].convert(b, along_channels, inputs, opset)

    # ------------------------------------------------------------------ back to ONNX's layout
    def need_nchw(self, names) -> list:
        """Steps giving every value of ``names`` that exists in NHWC only its NCHW form (in
        ``values``), for a node that reads them so: each a node of its own, ``<name> to NCHW``."""
        steps = []
        for name in names:
            if name and name not in self.values and name in self.nhwc:
                b = Builder(f"{name} to NCHW", "Transpose", self.new_ident, self.vector_bits)
                value = _moved(b, self.nhwc[name], TO_CHANNELS_FIRST)
                value.onnx_name = name
                self.values[name] = value
                steps += b.steps
        return steps


def _moved(b: Builder, x: Value, perm) -> Value:
    """``x`` with its dimensions in ``perm``'s order: a view when only dimensions of extent 1
    move (a 1 x 1 image, one channel), else a transpose step."""
    shape = [x.shape[p] for p in perm]
    moving = [d for d in range(x.rank) if x.shape[d] != 1]
    if [p for p in perm if x.shape[p] != 1] == moving:
        return b.view(x, shape)
    return transposed(b, x, perm)


#: A stride-1 convolution stays in NCHW when it has fewer output pixels than this (over the
#: batch) and more bytes of weights than CHANNELS_LAST_WEIGHT_BYTES: its weights, read once per
#: call, dominate, and the NCHW kernel streams each filter's weights in one run (and reads the
#: image in place at stride 1), where the NHWC kernel reads stretches of every row of
#: W(kh, kw, c, f).  With weights not in cache (a model's), resnet18's 512 -> 512 3 x 3 layers
#: at 7 x 7, batch 1, ran faster in NCHW; but 256 -> 256 at 14 x 14, and strided layers
#: (packed tiles in NCHW) such as 256 -> 512 to 7 x 7, ran faster in NHWC.  A padded one runs
#: in NHWC all the same: the NHWC kernel skips the taps that fall in the padding (a fifth of a
#: 3 x 3's products at 7 x 7), which made a 512 -> 512 3 x 3 layer at 7 x 7 faster in NHWC
#: (``python -m benchmarks.onnx_segments resnet18``).
CHANNELS_LAST_MIN_PIXELS = 64
CHANNELS_LAST_WEIGHT_BYTES = 1 << 20


def _pays_in_channels_last(b: Builder, node: Node, x: Value, w: Value, x_channels_last: bool) -> bool:
    """Whether a Conv (one group) runs faster in NHWC (see CHANNELS_LAST_MIN_PIXELS: a padded or
    strided one does); a 1 x 1 one without padding is measured at least as fast in NHWC
    (mobilenet_v2's 320 -> 1280 at 7 x 7: ``python -m benchmarks.onnx_segments mobilenet_v2``)."""
    outs, begin, end, strides, _ = _spatial(b, node, x, list(w.shape[2:]), channels_last=x_channels_last)
    padded = any(begin) or any(end)
    pointwise = w.shape[2:] == (1, 1) and not padded
    if (
        pointwise
        or padded
        or any(s != 1 for s in strides)
        or _require_const(b, w, "the weights").nbytes <= CHANNELS_LAST_WEIGHT_BYTES
    ):
        return True
    return x.shape[0] * int(np.prod(outs)) >= CHANNELS_LAST_MIN_PIXELS


def _add_channel_bias(b: Builder, x: Value, bias: Value | None, shape=None) -> Value:
    """``x + bias`` along the last (channel) axis (``x`` itself without ``bias``) of the first
    ``shape[-1]`` channels of ``x`` (all by default), an elementwise step (an epilogue of the
    kernel computing ``x``, through its view if need be)."""
    out = b.new(x.shape if shape is None else shape, x.dtype)
    idx = ["n", "s0", "s1", "f"]
    rhs = b.ref(x, idx) if bias is None else f"{b.ref(x, idx)} + {b.ref(bias, ['f'])}"
    b.emit([b.statement(out, idx, "=", rhs)], [x] + ([bias] if bias is not None else []), [out], "elementwise")
    return out


#: A 1 x 1 stride-1 convolution with at least this many filters is a matrix product over
#: every pixel (the gemm kernel); one with fewer runs through the convolution kernel, which
#: reads its weights in place and needs no packing: faster for mobilenet_v2's 16 -> 96 layer at
#: 112 x 112 and 576 -> 96 at 14 x 14, slower for 320 -> 1280 at 7 x 7 (``python -m
#: benchmarks.onnx_segments mobilenet_v2``).
POINTWISE_GEMM_FILTERS = 512


#: A Conv of an image in NCHW with at most this many channels (a photograph's three) reads it
#: in place, without a transpose first: every step of the convolution kernel's reduction
#: broadcasts one element per point wherever it lies.  resnet18's input: the transpose cost
#: a tenth of the first layer's time.
IMAGE_CHANNELS_READ_IN_PLACE = 4


#: A convolution's constant weights are blocked by this many bytes of output channels: AVX-512's
#: register block of the convolution kernel's channel mode (four vectors), a multiple of the
#: others' (see :func:`filter_block`).
FILTER_BLOCK_BYTES = 256


def filter_block(w: Value, strides, dilations, images: int, outs, options: Mapping) -> int:
    """B when the direct convolution kernel should read the weights ``w`` (``(F, C, KH, KW)``)
    blocked, as ``(F / B, KH, KW, C, B)``, else 0.

    In ``(KH, KW, C, F)`` the kernel reads each reduction step's B channels from a row F
    apart; blocked, its steps' rows are consecutive (:mod:`polyc.codegen.conv_channels`), as
    onnxruntime and oneDNN block their filters.  On an Intel core, whose prefetchers follow
    rows F apart poorly, resnet18's 512 -> 512 3 x 3 layer at 7 x 7 ran much faster blocked, as
    fast as onnxruntime's (``python -m benchmarks.onnx_segments resnet18``).  Not for: F that is
    not a multiple of B or is one block (its rows
    are consecutive already), a 1 x 1 stride-1 convolution (the pair fused with a depthwise
    layer after it reads ``(1, 1, C, F)``, :mod:`polyc.codegen.pointwise_depthwise`), one that
    the Winograd kernel takes (it transforms the weights from ``(KH, KW, C, F)`` on every call),
    and back ends or options without the direct kernel."""
    from polyc.codegen.winograd import winograd_sizes

    filters, channels, kh, kw = w.shape
    block = FILTER_BLOCK_BYTES // w.dtype.itemsize
    if (
        options.get("backend", "c") != "c"
        or options.get("direct_convolutions") is False
        or filters % block
        or filters == block
    ):
        return 0
    if (kh, kw) == (1, 1) and all(s == 1 for s in strides):
        return 0
    if options.get("winograd") and winograd_sizes(
        w.dtype, (kh, kw), strides, dilations, channels, filters, images, outs
    ):
        return 0
    return block


def conv_channels_last(
    b: Builder,
    node: Node,
    x: Value,
    w: Value,
    bias: Value | None,
    image_channels_last: bool = True,
    options: Mapping = MappingProxyType({}),
) -> Value:
    """A 2-D Conv (one group) of the image ``x`` (NHWC, or NCHW when not
    ``image_channels_last``) with ONNX's ``(F, C, KH, KW)`` constant weights ``w``: the NHWC
    output.  A 1 x 1 stride-1 convolution without padding and with many filters is a matrix
    product over every pixel (polyc's gemm kernel; the image in NHWC); others are one
    statement with the padding in its condition and weights ``(KH, KW, C, F)``, or blocked as
    ``(F / B, KH, KW, C, B)`` into an output ``(N, OH, OW, F / B, B)`` viewed as NHWC
    (:func:`filter_block`; the plan fuses what follows through the view): the convolution
    kernel's channel mode reads both the image and the weights in place.  ``options``: the
    session's (its back end, ``winograd``)."""
    filters, channels, kh, kw = w.shape
    outs, begin, end, strides, dilations = _spatial(b, node, x, [kh, kw], channels_last=image_channels_last)
    n = x.shape[0]
    out = b.new([n, *outs, filters], x.dtype)
    idx = ["n", "s0", "s1", "f"]
    if (
        (kh, kw) == (1, 1)
        and list(strides) == [1, 1]
        and not any(begin)
        and not any(end)
        and filters >= POINTWISE_GEMM_FILTERS
        and image_channels_last
    ):
        matrix = derived_constant(
            _require_const(b, w, "the weights"),
            ("pointwise matrix",),
            lambda weights: np.ascontiguousarray(weights.reshape(filters, channels).T),
        )
        pixels = n * math.prod(outs)
        sliver = _weight_sliver(b, x, Value("", w.dtype, matrix.shape, const=matrix), padded=channels >= pixels)
        if sliver:
            # Up to BLOCKED_WEIGHT_ROWS pixels: weights blocked as the gemm kernel reads them.
            # Where they outweigh the output, with zero filters up to a whole sliver, and the
            # real filters copied out after (an elementwise step, with the bias): squeezenet1_1's
            # last layer, 512 -> 1000 at 13 x 13, with its 2 MB of weights, ran faster blocked
            # than read in place, the copy costing little (``python -m benchmarks.onnx_bench
            # --models squeezenet1_1``).
            padded = derived_constant(
                _require_const(b, w, "the weights"),
                ("pointwise columns", sliver),
                lambda _: zero_padded_columns(matrix, sliver),
            )
            wide = padded.shape[1]
            product = _product_by_blocked_weights(
                b, x, b.const(padded), sliver, [n, *outs, wide], ["n", "s0", "s1"], ["n", "s0", "s1", "r0"]
            )
            if bias is None and wide == filters:
                return product
            return _add_channel_bias(b, product, bias, out.shape)
        weights = b.const(matrix)
        rhs = f"{b.ref(x, ['n', 's0', 's1', 'r_c'])} * {b.ref(weights, ['r_c', 'f'])}"
        reductions, kind = [("r_c", channels)], "contraction"
    else:
        # The padding is the statement's condition: the kernel reads the image in place and
        # computes each tap of a tile of points only for the points that read it inside the
        # image (none: the tap is skipped).  A padded copy of an image of few channels, as a step
        # of its own, whose taps are a few reduction steps each, was no faster: resnet18's first
        # layer (3 channels, 7 x 7 taps at stride 2) took as long with the copy as without, and
        # the model at batch 1 no less (``python -m benchmarks.onnx_bench --models resnet18``).
        window = [
            f"{_affine(strides[d], f's{d}', 0)} + {_affine(dilations[d], f'r_k{d}', -begin[d])}" for d in range(2)
        ]
        extents = list(x.tc_shape)[1:3] if image_channels_last else list(x.tc_shape)[2:4]
        inside = [f"{window[d]} >= 0" for d in range(2) if begin[d] > 0]
        inside += [f"{window[d]} < {extents[d]}" for d in range(2) if end[d] > 0]
        image = b.ref(x, image_indices(image_channels_last, "n", "r_c", window))
        reductions = [("r_k0", kh), ("r_k1", kw), ("r_c", channels)]
        block = filter_block(w, strides, dilations, n, outs, options) if isinstance(n, int) else 0
        if block:
            blocked = (
                _require_const(b, w, "the weights")
                .transpose(0, 2, 3, 1)
                .reshape(filters // block, block, kh, kw, channels)
            )
            weights = b.const(np.ascontiguousarray(blocked.transpose(0, 2, 3, 4, 1)))
            rhs = f"{image} * {b.ref(weights, ['fb', 'r_k0', 'r_k1', 'r_c', 'fi'])}"
        else:
            weights = b.const(np.ascontiguousarray(_require_const(b, w, "the weights").transpose(2, 3, 1, 0)))
            rhs = f"{image} * {b.ref(weights, ['r_k0', 'r_k1', 'r_c', 'f'])}"
        if inside:
            rhs = f"({' && '.join(inside)}) ? {rhs} : 0.0"
        if block:
            target = b.new([n, *outs, filters // block, block], x.dtype)
            b.emit(
                [b.statement(target, ["n", "s0", "s1", "fb", "fi"], "+=!", rhs, reductions)],
                [x, weights],
                [target],
                "convolution",
            )
            product = b.view(target, out.shape)
            return product if bias is None else _add_channel_bias(b, product, bias)
        kind = "convolution"
    statements = [b.statement(out, idx, "+=!", rhs, reductions)]
    reads = [x, weights]
    if bias is not None:
        statements.append(b.statement(out, idx, "=", f"{out.ident}(n, s0, s1, f) + {b.ref(bias, ['f'])}"))
        reads.append(bias)
    b.emit(statements, reads, [out], kind)
    return out
