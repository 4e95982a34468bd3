"""Epilogue statements applied to a kernel's accumulators in registers, before their one store.

A convolution's or product's epilogue (bias, ReLU, Clip, a residual added) is otherwise a second
pass over the finished output: every element stored by the kernel is loaded, changed and stored
again, with the per-point bookkeeping of a loop the compiler vectorises.  For a convolution of
few input channels that pass costs a large share of the convolution's time (mobilenet_v2's 1x1
16 -> 96 at 112 x 112, measured with ``python -m benchmarks.onnx_segments mobilenet_v2``).
Here the statements become intrinsics on one vector of accumulators, as oneDNN's post-ops and
MLAS's kernels do: the accumulators of consecutive channels of one output point.

The vector form covers what models put after a convolution, with the interpreter's semantics:
``+ - * /`` on floats, fmax/fmin/max/min (NaN rules of polyc's scalar ``polyc_fmaxf``: a NaN
second argument gives the first, else ``a >= b ? a : b``), constants, the target itself, a
vector indexed by the channel alone (a bias, a scale), and a tensor of the target's shape at the
target's own point (a residual), selects on comparisons of those (ONNX's Relu is
``x < 0 ? 0 : x``; C's comparisons are false on a NaN but ``!=``, as the vector predicates chosen
below), and the float logistic quotient ``1 / (1 + exp(-x))`` (ONNX's Sigmoid, SiLU's second
factor) as the vector form of ``polyc_sigmoidf`` (:func:`polyc.codegen.vector_math.sigmoid_vector_c`,
the same results).  Anything else (another exp, an index value, a gather) keeps the scalar
pass: :meth:`RegisterEpilogue.of` returns None.  In a pass, SiLU after efficientnet_b0's
expanding 1x1 convolution (16 -> 96 at 112 x 112) cost more than the function alone
(``python -m benchmarks.onnx_segments efficientnet_b0``).  A float16 rounding of a float
(``float(float16(x))``, which a float16 model computed in float32 puts after each operator,
:mod:`polyc.frontends.onnx.float16`) is F16C's conversion there and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from polyc.codegen.c_expr import c_constant, logistic_operand
from polyc.codegen.gemm import _VECTOR_SPELLINGS
from polyc.codegen.vector_math import (
    round_float16_vector_c,
    round_float16_vector_name,
    sigmoid_vector_c,
    sigmoid_vector_name,
)
from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine

_ARITHMETIC = {"+": "add", "-": "sub", "*": "mul", "/": "div"}

#: C's comparisons -> the vector predicate with the same answer on NaN operands.
_PREDICATES = {
    "<": "_CMP_LT_OQ",
    "<=": "_CMP_LE_OQ",
    ">": "_CMP_GT_OQ",
    ">=": "_CMP_GE_OQ",
    "==": "_CMP_EQ_OQ",
    "!=": "_CMP_NEQ_UQ",
}

#: fmax-like builtins -> the comparison that keeps the first argument.
_KEEP_FIRST = {"fmax": "_CMP_GE_OQ", "max": "_CMP_GE_OQ", "fmin": "_CMP_LE_OQ", "min": "_CMP_LE_OQ"}


def _rounded_to_float16(expr: ir.TExpr) -> ir.TExpr | None:
    """``x`` of ``float(float16(x))`` for a float ``x`` (a float16 value widened, as a float16
    model computed in float32 rounds between operators), else None."""
    if (
        isinstance(expr, ir.Cast)
        and np.dtype(expr.dtype) == np.float32
        and isinstance(expr.operand, ir.Cast)
        and np.dtype(expr.operand.dtype) == np.float16
        and np.dtype(expr.operand.operand.dtype) == np.float32
    ):
        return expr.operand.operand
    return None


class _Unsupported(Exception):
    """The epilogue has something the vector form does not cover."""


@dataclass(frozen=True)
class _Operand:
    """A tensor the epilogue reads: by the channel alone (``per_channel``) or at the target's point."""

    name: str
    per_channel: bool


@dataclass(frozen=True)
class RegisterEpilogue:
    """The epilogue of a kernel writing ``target``, as vector code on its accumulators."""

    statements: tuple[ir.CheckedStatement, ...]
    target: str
    #: Per statement: its indices at the kernel's channel positions.
    channel_indices: tuple[tuple[str, ...], ...]
    dtype: np.dtype
    #: The target's extents at the channel positions (all constants when there are several).
    channel_extents: tuple[int, ...] = (0,)

    @classmethod
    def of(
        cls, statements, definition, kernel_indices: tuple[str, ...], channel: str | tuple[str, ...]
    ) -> RegisterEpilogue | None:
        """The vector form of ``statements`` (epilogue statements on the target at the kernel's
        indices ``kernel_indices``, of which ``channel`` is the vectorised one), or None.
        ``channel`` may be several indices, the target's last dimensions, which the kernel
        numbers as one channel in row-major order (a blocked layout's ``(f / B, f % B)``): then
        a vector read by that number or a tensor of the target's shape with those dimensions
        merged, read at the target's point, is one the vector form reads."""
        if not statements:
            return None
        channel = (channel,) if isinstance(channel, str) else tuple(channel)
        target = statements[0].target
        dtype = np.dtype(definition.tensor(target).dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)) or not set(channel) <= set(kernel_indices):
            return None
        positions = [kernel_indices.index(c) for c in channel]
        extents = (0,)
        if len(channel) > 1:
            shape = definition.tensor(target).shape
            if positions != list(range(len(kernel_indices) - len(channel), len(kernel_indices))) or not all(
                shape[p].is_constant for p in positions
            ):
                return None
            extents = tuple(shape[p].constant for p in positions)
        channels = []
        for statement in statements:
            if statement.target != target or statement.op != "=" or len(statement.indices) != len(kernel_indices):
                return None
            channels.append(tuple(statement.indices[p] for p in positions))
        epilogue = cls(tuple(statements), target, tuple(channels), dtype, extents)
        try:
            epilogue.function(definition, "avx512", "{ptr}")
        except _Unsupported:
            return None
        return epilogue

    def _flat_channel(self, channel: tuple[str, ...]) -> Affine:
        """The kernel's channel number in a statement's channel indices (row-major)."""
        if len(channel) == 1:
            return Affine.var(channel[0])
        flat, stride = Affine.const(0), 1
        for index, extent in reversed(list(zip(channel, self.channel_extents))):
            flat, stride = flat + Affine.var(index) * stride, stride * extent
        return flat

    def function(
        self,
        definition,
        isa: str,
        load_format: str,
        mask_type: str | None = None,
        context: str = "polyc_conv_t",
        name: str = "polyc_epilogue_vector",
    ) -> str:
        """``polyc_epilogue_vector[_masked](g, acc, f, e[, km])``: the statements on ``acc``, the
        target's lanes at channel ``f`` and element ``e`` onwards, other tensors read by
        ``load_format`` (of ``{ptr}``; with ``mask_type``, the ``_masked`` function's loads under
        its lane mask ``km``); ``g`` is the kernel's ``context`` record, holding each tensor's
        address as ``t_<name>``.  ``name``: the function's, for a kernel with two epilogues."""
        vec, pre, suffix = _VECTOR_SPELLINGS[(isa, self.dtype.itemsize)]
        masked = mask_type is not None
        lines: list[str] = []
        helpers: list[str] = []  # C the function needs defined before it
        loaded: dict[_Operand, str] = {}
        target_shape = definition.tensor(self.target).shape

        def temporary(text: str) -> str:
            name = f"v{len(lines)}"
            lines.append(f"const {vec} {name} = {text};")
            return name

        def load(operand: _Operand) -> str:
            if operand not in loaded:
                pointer = f"g->t_{operand.name} + {'f' if operand.per_channel else 'e'}"
                loaded[operand] = temporary(load_format.format(ptr=pointer))
            return loaded[operand]

        def compare(a: str, b: str, predicate: str) -> str:
            """The lane mask of ``a predicate b``: a k-mask (AVX-512) or a vector (AVX2)."""
            return f"{pre}_cmp_{suffix}{'_mask' if isa == 'avx512' else ''}({a}, {b}, {predicate})"

        def either(mask: str, other: str) -> str:
            return f"{mask} | {other}" if isa == "avx512" else f"{pre}_or_{suffix}({mask}, {other})"

        def choose(mask: str, then: str, otherwise: str) -> str:
            if isa == "avx512":
                return temporary(f"{pre}_mask_blend_{suffix}({mask}, {otherwise}, {then})")
            return temporary(f"{pre}_blendv_{suffix}({otherwise}, {then}, {mask})")

        def keep_first(comparison: str, a: str, b: str, b_is_number: bool) -> str:
            keep = compare(a, b, comparison)
            if not b_is_number:
                keep = either(keep, compare(b, b, "_CMP_UNORD_Q"))
            return choose(keep, a, b)

        def vector(expr: ir.TExpr, channel: tuple[str, ...], own_point: tuple) -> str:
            if np.dtype(expr.dtype) != self.dtype:
                raise _Unsupported
            if isinstance(expr, ir.Const):
                return temporary(f"{pre}_set1_{suffix}({c_constant(expr.value, self.dtype)})")
            if isinstance(expr, ir.Read):
                tensor = definition.tensor(expr.tensor)
                if np.dtype(tensor.dtype) != self.dtype:
                    raise _Unsupported
                if expr.subscripts == own_point and expr.tensor == self.target:
                    return "acc"
                if expr.subscripts == own_point and tensor.shape == target_shape:
                    return load(_Operand(expr.tensor, False))
                flat = self._flat_channel(channel)
                if expr.subscripts == (flat,):
                    return load(_Operand(expr.tensor, True))
                merged = len(channel)  # the channel dimensions read as one (the same elements)
                merged_shape = tuple(target_shape[:-merged]) + (Affine.const(prod(self.channel_extents)),)
                if (
                    merged > 1
                    and expr.subscripts == own_point[:-merged] + (flat,)
                    and tuple(tensor.shape) == merged_shape
                ):
                    return load(_Operand(expr.tensor, False))
                raise _Unsupported
            logistic = logistic_operand(expr) if isinstance(expr, ir.Binary) and self.dtype.itemsize == 4 else None
            if logistic is not None:
                operand = vector(logistic, channel, own_point)
                if sigmoid_vector_c(isa) not in helpers:
                    helpers.append(sigmoid_vector_c(isa))
                return temporary(f"{sigmoid_vector_name(isa)}({operand})")
            rounded = _rounded_to_float16(expr) if self.dtype.itemsize == 4 else None
            if rounded is not None:
                operand = vector(rounded, channel, own_point)
                helper = round_float16_vector_c(isa)
                if helper not in helpers:
                    helpers.append(helper)
                return temporary(f"{round_float16_vector_name(isa)}({operand})")
            if isinstance(expr, ir.Binary) and expr.op in _ARITHMETIC:
                lhs = vector(expr.lhs, channel, own_point)
                rhs = vector(expr.rhs, channel, own_point)
                return temporary(f"{pre}_{_ARITHMETIC[expr.op]}_{suffix}({lhs}, {rhs})")
            if isinstance(expr, ir.Select):
                cond = expr.cond
                if not isinstance(cond, ir.Binary) or cond.op not in _PREDICATES:
                    raise _Unsupported
                a, b = vector(cond.lhs, channel, own_point), vector(cond.rhs, channel, own_point)
                then = vector(expr.then, channel, own_point)
                otherwise = vector(expr.otherwise, channel, own_point)
                return choose(compare(a, b, _PREDICATES[cond.op]), then, otherwise)
            if isinstance(expr, ir.Call) and expr.func in _KEEP_FIRST and len(expr.args) == 2:
                a = vector(expr.args[0], channel, own_point)
                b = vector(expr.args[1], channel, own_point)
                second = expr.args[1]
                is_number = isinstance(second, ir.Const) and not np.isnan(second.value)
                return keep_first(_KEEP_FIRST[expr.func], a, b, is_number)
            raise _Unsupported

        for statement, channel in zip(self.statements, self.channel_indices):
            own_point = tuple(Affine.var(i) for i in statement.indices)
            result = vector(statement.rhs, channel, own_point)
            lines.append(f"acc = {result};")
        name += "_masked" if masked else ""
        mask = f", {mask_type} km" if masked else ""
        return (
            "".join(helpers) + f"/* The epilogue on one vector of accumulators: channels f.., target elements e... */\n"
            f"static inline {vec} {name}(const {context} *restrict g, {vec} acc, int64_t f, int64_t e{mask})\n"
            f"{{\n    (void)g; (void)f; (void)e;{' (void)km;' if masked else ''}\n"
            + "\n".join(f"    {line}" for line in lines)
            + "\n    return acc;\n}"
        )
