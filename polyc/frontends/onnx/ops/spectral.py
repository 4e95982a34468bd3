"""Signal processing: DFT and STFT, each a product by the transform's matrix, and the windows
(HannWindow, HammingWindow, BlackmanWindow) and MelWeightMatrix, constants.  The matrices and
the constants are computed when the model is compiled, by onnx's reference implementation.
"""

from __future__ import annotations

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _axis, _float_only, _require_const


def _by_reference(op_type: str, inputs: list, opset: int, **attributes) -> list[np.ndarray]:
    """The outputs of one ``op_type`` node on constant ``inputs`` (None for an omitted optional
    one), by onnx's reference implementation at ``opset``: for operators that only make
    constants (window functions, filter banks) and for the matrices of linear ones."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if value is not None else "" for k, value in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["out"], **attributes)
    given = [numpy_helper.from_array(np.asarray(value), name) for name, value in zip(names, inputs) if name]
    graph = helper.make_graph([node], op_type, [], [helper.make_empty_tensor_value_info("out")], given)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return [np.asarray(output) for output in ReferenceEvaluator(model).run(None, {})]


class _Constant(Converter):
    """An operator whose inputs are all known when the model is compiled and whose output is a
    table (HannWindow, MelWeightMatrix, ...): computed then by onnx's reference.  ``SINCE``:
    the first opset that has it."""

    SINCE = 17

    @classmethod
    def version_for(cls, opset: int) -> int | None:
        return cls.SINCE if opset >= cls.SINCE else None

    @classmethod
    def convert(cls, b, node, inputs, opset):
        values = [
            _require_const(b, value, f"{node.op_type}'s input {k}") if value is not None else None
            for k, value in enumerate(inputs)
        ]
        attributes = {name: value for name, value in node.attributes.items()}
        return [b.const(out) for out in _by_reference(node.op_type, values, opset, **attributes)]


class HannWindow(_Constant):
    CONSTANT_INPUTS = (0,)


class HammingWindow(HannWindow):
    pass


class BlackmanWindow(HannWindow):
    pass


class MelWeightMatrix(_Constant):
    CONSTANT_INPUTS = (0, 1, 2, 3, 4)


def _fourier(
    b: Builder, x: Value, axis: int, length: int | None, inverse: bool, onesided: bool, signal, out_shape
) -> Value:
    """The DFT of ``x`` along ``axis`` (its last axis the real, or real and imaginary, parts) as a
    product by its matrix, which onnx's reference gives applied to each basis signal: every
    mode (inverse, one-sided, a DFT length that pads or cuts) means what onnx says.  n x K
    multiply-adds a signal of n samples and K bins: fine for the frames of audio features.
    ``signal(n, c)``: the subscripts of ``x`` for sample ``n``'s part ``c`` at the output's
    indices; ``out_shape``: the output's shape, its axis of bins at ``axis``."""
    _float_only(b, x)
    n, parts = x.shape[axis], x.shape[-1]
    if parts not in (1, 2):
        raise UnsupportedError(
            f"{b.where}: {b.op_type}'s last axis must hold 1 (real) or 2 (complex) parts, not {parts}"
        )
    basis = np.eye(n * parts, dtype=np.float64).reshape(n * parts, n, parts)
    attributes = {"inverse": int(inverse), "onesided": int(onesided)}
    (transformed,) = _by_reference(
        "DFT", [basis, None if length is None else np.array(length, np.int64), np.array(1, np.int64)], 20, **attributes
    )
    bins, outputs = transformed.shape[1], transformed.shape[2]
    # In double, as onnx's reference computes: a part whose exact value is 0 (the imaginary
    # part of a symmetric signal's transform) then comes out near 1e-16, not at the rounding
    # of a float sum of terms of the signal's size, which the suite's atol of 1e-7 can reject.
    matrix = b.const(transformed.reshape(n, parts, bins, outputs))
    shape = list(out_shape(bins, outputs))
    sums, out = b.new(shape, np.float64), b.new(shape, x.dtype)
    idx = indices(len(shape))
    product = f"{b.ref(matrix, ['r0', 'r1', idx[axis], idx[-1]])} * double({b.ref(x, signal(idx, 'r0', 'r1'))})"
    b.emit(
        [
            b.statement(sums, idx, "+=!", product, [("r0", n), ("r1", parts)]),
            b.statement(out, idx, "=", f"{tc_type(x.dtype)}({b.ref(sums, idx)})"),
        ],
        [x, matrix],
        [out],
        "reduction",
    )
    return out


class DFT(Converter):
    CONSTANT_INPUTS = (1, 2)

    @staticmethod
    def _lower(b, node, x, length, axis):
        if x.rank < 2:
            raise UnsupportedError(f"{b.where}: DFT of a rank-{x.rank} tensor (a signal axis and a last axis of parts)")
        axis = _axis(b, axis, x.rank)
        if axis == x.rank - 1:
            raise UnsupportedError(f"{b.where}: DFT along the last axis, which holds the real and imaginary parts")
        length = None if length is None else int(_require_const(b, length, "DFT's dft_length").reshape(-1)[0])
        return [
            _fourier(
                b,
                x,
                axis,
                length,
                bool(node.attr("inverse", 0)),
                bool(node.attr("onesided", 0)),
                lambda p, n, c: p[:axis] + [n] + p[axis + 1 : -1] + [c],
                lambda bins, parts: list(x.shape[:axis]) + [bins] + list(x.shape[axis + 1 : -1]) + [parts],
            )
        ]

    @staticmethod
    def _impl_v17(b, node, inputs):
        length = inputs[1] if len(inputs) > 1 else None
        return DFT._lower(b, node, inputs[0], length, node.attr("axis", 1))

    @staticmethod
    def _impl_v20(b, node, inputs):
        length = inputs[1] if len(inputs) > 1 else None
        axis = (
            int(_require_const(b, inputs[2], "DFT's axis").reshape(-1)[0])
            if len(inputs) > 2 and inputs[2] is not None
            else -2
        )
        return DFT._lower(b, node, inputs[0], length, axis)


class STFT(Converter):
    """Frames of ``frame_length`` samples every ``frame_step``, each weighed by the window and
    transformed: ``(batch, frames, bins, 2)``."""

    CONSTANT_INPUTS = (1, 3)

    @staticmethod
    def _impl_v17(b, node, inputs):
        signal, step = inputs[:2]
        window = inputs[2] if len(inputs) > 2 else None
        length = inputs[3] if len(inputs) > 3 else None
        step = int(_require_const(b, step, "STFT's frame_step").reshape(-1)[0])
        if length is not None:
            length = int(_require_const(b, length, "STFT's frame_length").reshape(-1)[0])
        elif window is not None:
            length = window.shape[0]
        else:
            raise UnsupportedError(f"{b.where}: STFT needs a window or a frame_length")
        if signal.rank != 3 or step < 1 or not 1 <= length <= signal.shape[1]:
            raise UnsupportedError(
                f"{b.where}: STFT of a {list(signal.shape)} signal with frames of {length} "
                f"every {step} (a (batch, samples, 1 or 2) signal)"
            )
        frames = (signal.shape[1] - length) // step + 1
        # The frames as a view of the signal would overlap; the window multiplies them first.
        framed = b.new([signal.shape[0], frames, length, signal.shape[2]], signal.dtype)
        idx = indices(4)
        sample = [idx[0], f"{step} * {idx[1]} + {idx[2]}", idx[3]]
        weighed = b.ref(signal, sample) if window is None else f"{b.ref(signal, sample)} * {b.ref(window, [idx[2]])}"
        b.emit(
            [b.statement(framed, idx, "=", weighed)],
            [signal] + ([window] if window is not None else []),
            [framed],
            "other",
        )
        return [
            _fourier(
                b,
                framed,
                2,
                None,
                False,
                bool(node.attr("onesided", 1)),
                lambda p, n, c: p[:2] + [n, c],
                lambda bins, parts: [signal.shape[0], frames, bins, parts],
            )
        ]
