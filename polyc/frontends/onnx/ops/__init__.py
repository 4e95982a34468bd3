"""ONNX operators as TC: one converter class per operator, one ``_impl_vN`` per opset change.

A converter's ``_impl_vN(b, node, inputs)`` gets a :class:`~polyc.frontends.onnx.lowering.Builder`,
the node's attributes (``node.attr(name, default)``) and its inputs as
:class:`~polyc.frontends.onnx.lowering.Value` s (None for an omitted optional input), and returns
its outputs as values.  The version used is the newest ``N`` not above the model's opset.
Adding an operator is adding a class in the module of its family and a line in :data:`CONVERTERS`.

The modules, one per family of operators:

- :mod:`.base`: :class:`~.base.Node`, :class:`~.base.Converter` and the helpers the families share;
- :mod:`.elementwise`: the float functions, arithmetic, comparisons, logic, bitwise operators,
  activations, Clip, Where, Cast, Identity, Dropout;
- :mod:`.shapes`: shapes and views: Shape, the constants and Range, Reshape, Squeeze, Transpose,
  Expand, Tile, Concat, Split, Slice, Pad, ...;
- :mod:`.indexing`: gathers and scatters (Gather, GatherElements, GatherND, the Scatters,
  TensorScatter, ReverseSequence);
- :mod:`.contractions`: MatMul, Gemm, Einsum;
- :mod:`.convolutions`: Conv, ConvTranspose, the pools, BatchNormalization;
- :mod:`.sampling`: image sampling: Resize, Upsample, GridSample, RoiAlign, DeformConv, Col2Im;
- :mod:`.spectral`: DFT, STFT, the windows, MelWeightMatrix;
- :mod:`.text`: TfIdfVectorizer's n-gram counts;
- :mod:`.quantization`: QuantizeLinear, DequantizeLinear and the integer and QLinear products;
- :mod:`.quantized_contrib`: onnxruntime's quantized operators of the domain ``com.microsoft``
  (QLinearAdd, QGemm, ...), in :data:`DOMAIN_CONVERTERS`;
- :mod:`.reductions`: the Reduce operators, ArgMax, Softmax, Hardmax, TopK, CumSum, CumProd and the
  normalizations along axes;
- :mod:`.recurrent`: RNN, GRU and LSTM, unrolled over the sequence;
- :mod:`.data_dependent`: the operators whose output shapes come from data (NonZero, Compress,
  Unique, NonMaxSuppression), replaced by nodes of other operators and planned in stages.
"""

from __future__ import annotations

from polyc.frontends.onnx.ops.base import Converter
from polyc.frontends.onnx.ops.contractions import Einsum, Gemm, MatMul
from polyc.frontends.onnx.ops.convolutions import (
    AveragePool,
    BatchNormalization,
    Conv,
    ConvTranspose,
    GlobalAveragePool,
    GlobalMaxPool,
    LpPool,
    MaxPool,
)
from polyc.frontends.onnx.ops.data_dependent import DATA_DEPENDENT
from polyc.frontends.onnx.ops.elementwise import (
    BitCast,
    BitShift,
    Cast,
    CastLike,
    Clip,
    Dropout,
    Elu,
    Gelu,
    HardSigmoid,
    Identity,
    IsInf,
    IsNaN,
    LeakyRelu,
    Mod,
    Not,
    OptionalGetElement,
    OptionalHasElement,
    Pow,
    PRelu,
    Selu,
    Shrink,
    Sign,
    SwiGLU,
    Swish,
    Where,
    _binary,
    _bitwise,
    _unary,
    _variadic,
)
from polyc.frontends.onnx.ops.indexing import (
    Gather,
    GatherElements,
    GatherND,
    ReverseSequence,
    Scatter,
    ScatterElements,
    ScatterND,
    TensorScatter,
)
from polyc.frontends.onnx.ops.quantization import (
    ConvInteger,
    DequantizeLinear,
    MatMulInteger,
    QLinearConv,
    QLinearMatMul,
    QuantizeLinear,
)
from polyc.frontends.onnx.ops.quantized_contrib import CONTRIB_QUANTIZED
from polyc.frontends.onnx.ops.recurrent import RECURRENT
from polyc.frontends.onnx.ops.reductions import (
    LRN,
    ArgMax,
    ArgMin,
    CumProd,
    CumSum,
    Hardmax,
    InstanceNormalization,
    LayerNormalization,
    LpNormalization,
    ReduceSum,
    Softmax,
    TopK,
    _reduce,
)
from polyc.frontends.onnx.ops.sampling import Col2Im, DeformConv, GridSample, Resize, RoiAlign, Upsample
from polyc.frontends.onnx.ops.shapes import (
    Concat,
    Constant,
    ConstantOfShape,
    DepthToSpace,
    Expand,
    EyeLike,
    Flatten,
    OneHot,
    Pad,
    Range,
    Reshape,
    Shape,
    Size,
    Slice,
    SpaceToDepth,
    Split,
    Squeeze,
    Tile,
    Transpose,
    Trilu,
    Unsqueeze,
)
from polyc.frontends.onnx.ops.spectral import DFT, STFT, BlackmanWindow, HammingWindow, HannWindow, MelWeightMatrix
from polyc.frontends.onnx.ops.text import TfIdfVectorizer

_FLOAT_FUNCTIONS = {
    "Exp": "exp({x})",
    "Log": "log({x})",
    "Sqrt": "sqrt({x})",
    "Tanh": "tanh({x})",
    "Erf": "erf({x})",
    "Sin": "sin({x})",
    "Cos": "cos({x})",
    "Tan": "tan({x})",
    "Asin": "asin({x})",
    "Acos": "acos({x})",
    "Atan": "atan({x})",
    "Sinh": "sinh({x})",
    "Cosh": "cosh({x})",
    "Asinh": "asinh({x})",
    "Acosh": "acosh({x})",
    "Atanh": "atanh({x})",
    "Floor": "floor({x})",
    "Ceil": "ceil({x})",
    "Reciprocal": "1 / {x}",
    "Sigmoid": "1 / (1 + exp(-{x}))",
    "Softplus": "log1p(exp({x}))",
    "Softsign": "{x} / (1 + fabs({x}))",
    "HardSwish": "{x} * fmax(0, fmin(1, {x} / 6 + 0.5))",
    "Mish": "{x} * tanh(log1p(exp({x})))",
}


CONVERTERS: dict[str, type[Converter]] = {
    "ConvTranspose": ConvTranspose,
    "Resize": Resize,
    **{op: _unary(expression) for op, expression in _FLOAT_FUNCTIONS.items()},
    # (as onnxruntime: NaN and -0 pass through)
    "Relu": _unary("({x} < 0 ? 0 : {x})", floats_only=False),
    "Neg": _unary("-{x}", floats_only=False),
    "Abs": _unary("abs({x})", floats_only=False),
    "Sign": Sign,
    "Add": _binary("+"),
    "Sub": _binary("-"),
    "Mul": _binary("*"),
    "Div": _binary("/"),
    "Pow": Pow,
    "Equal": _binary("==", True),
    "Less": _binary("<", True),
    "Greater": _binary(">", True),
    "LessOrEqual": _binary("<=", True),
    "GreaterOrEqual": _binary(">=", True),
    "And": _binary("&&", True),
    "Or": _binary("||", True),
    "Xor": _binary("!=", True),
    "Max": _variadic("max"),
    "Min": _variadic("min"),
    "Sum": _variadic("+"),
    "Mean": _variadic("+", mean=True),
    "Mod": Mod,
    "Not": Not,
    "Where": Where,
    "Cast": Cast,
    "CastLike": CastLike,
    "Clip": Clip,
    "LeakyRelu": LeakyRelu,
    "Elu": Elu,
    "Selu": Selu,
    "HardSigmoid": HardSigmoid,
    "Gelu": Gelu,
    "PRelu": PRelu,
    "Identity": Identity,
    "Dropout": Dropout,
    "BitCast": BitCast,
    "OptionalHasElement": OptionalHasElement,
    "OptionalGetElement": OptionalGetElement,
    "Shape": Shape,
    "Size": Size,
    "Constant": Constant,
    "ConstantOfShape": ConstantOfShape,
    "Range": Range,
    "Reshape": Reshape,
    "Flatten": Flatten,
    "Squeeze": Squeeze,
    "Unsqueeze": Unsqueeze,
    "Transpose": Transpose,
    "Expand": Expand,
    "Concat": Concat,
    "Split": Split,
    "Slice": Slice,
    "Gather": Gather,
    "Pad": Pad,
    "MatMul": MatMul,
    "Gemm": Gemm,
    "Einsum": Einsum,
    "Conv": Conv,
    "MaxPool": MaxPool,
    "AveragePool": AveragePool,
    "GlobalAveragePool": GlobalAveragePool,
    "GlobalMaxPool": GlobalMaxPool,
    "BatchNormalization": BatchNormalization,
    "LayerNormalization": LayerNormalization,
    "LRN": LRN,
    "InstanceNormalization": InstanceNormalization,
    "Tile": Tile,
    "Shrink": Shrink,
    "ReduceSum": ReduceSum,
    "ReduceMean": _reduce("mean"),
    "ReduceMax": _reduce("max"),
    "ReduceMin": _reduce("min"),
    "ReduceProd": _reduce("prod"),
    "ReduceSumSquare": _reduce("sumsquare"),
    "ReduceL1": _reduce("l1"),
    "ReduceL2": _reduce("l2"),
    "ReduceLogSum": _reduce("logsum"),
    "ReduceLogSumExp": _reduce("logsumexp"),
    "DepthToSpace": DepthToSpace,
    "SpaceToDepth": SpaceToDepth,
    "QuantizeLinear": QuantizeLinear,
    "DequantizeLinear": DequantizeLinear,
    "MatMulInteger": MatMulInteger,
    "QLinearMatMul": QLinearMatMul,
    "ConvInteger": ConvInteger,
    "QLinearConv": QLinearConv,
    "ArgMax": ArgMax,
    "ArgMin": ArgMin,
    "Softmax": Softmax,
    "LogSoftmax": Softmax,
    "Round": _unary("rint({x})"),
    "IsNaN": IsNaN,
    "IsInf": IsInf,
    "Swish": Swish,
    "SwiGLU": SwiGLU,
    "Trilu": Trilu,
    "EyeLike": EyeLike,
    "OneHot": OneHot,
    "GatherElements": GatherElements,
    "GatherND": GatherND,
    "Hardmax": Hardmax,
    "LpNormalization": LpNormalization,
    "CumSum": CumSum,
    "CumProd": CumProd,
    "BitwiseAnd": _bitwise("bitand"),
    "BitwiseOr": _bitwise("bitor"),
    "BitwiseXor": _bitwise("bitxor"),
    "BitwiseNot": _bitwise("bitnot"),
    "BitShift": BitShift,
    "GridSample": GridSample,
    "ReverseSequence": ReverseSequence,
    "Col2Im": Col2Im,
    "RoiAlign": RoiAlign,
    "DeformConv": DeformConv,
    "TensorScatter": TensorScatter,
    "LpPool": LpPool,
    "Upsample": Upsample,
    "TopK": TopK,
    "ScatterElements": ScatterElements,
    "Scatter": Scatter,
    "ScatterND": ScatterND,
    "DFT": DFT,
    "STFT": STFT,
    "HannWindow": HannWindow,
    "HammingWindow": HammingWindow,
    "BlackmanWindow": BlackmanWindow,
    "MelWeightMatrix": MelWeightMatrix,
    "TfIdfVectorizer": TfIdfVectorizer,
}


# The recurrent layers, RNN, GRU and LSTM, in a module of their own.
CONVERTERS.update(RECURRENT)
# Operators whose output shapes come from data, planned in stages (data_dependent.py).
CONVERTERS.update(DATA_DEPENDENT)

#: The converters of operators of other domains than ONNX's default, by domain.
DOMAIN_CONVERTERS: dict[str, dict[str, type[Converter]]] = {"com.microsoft": CONTRIB_QUANTIZED}


def converter_for(op_type: str, domain: str) -> type[Converter] | None:
    """The converter of ``op_type`` of ``domain`` ("" or "ai.onnx": ONNX's own), or None."""
    if domain in ("", "ai.onnx"):
        return CONVERTERS.get(op_type)
    return DOMAIN_CONVERTERS.get(domain, {}).get(op_type)
