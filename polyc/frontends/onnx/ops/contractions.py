"""Contractions: MatMul, Gemm and Einsum, and the products by constant weights laid out in
slivers as polyc's gemm kernel reads them (:data:`BLOCKED_WEIGHT_ROWS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyc.errors import ModelError, UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, broadcast_shape, derived_constant, indices
from polyc.frontends.onnx.ops.base import Converter, _number


@dataclass(frozen=True)
class ProductLayout:
    """Where ``a @ c`` (numpy's matmul: 1-D operands promoted, batch dimensions broadcast) reads
    and writes: the output's shape and subscripts, each operand's subscripts (``r0`` the summed
    index), the full index space ``full`` (batch, rows, columns) and its index names, and K."""

    shape: list
    full: tuple
    indices: list
    out: list
    a: list
    c: list
    inner: int


def product_layout(b: Builder, a: Value, c: Value, what: str) -> ProductLayout:
    """The :class:`ProductLayout` of ``a @ c``; ``what`` names the operator in errors."""
    if a.rank == 0 or c.rank == 0:
        raise UnsupportedError(f"{b.where}: {what} of a scalar")
    a_shape = ((1,) + a.shape) if a.rank == 1 else a.shape
    c_shape = (c.shape + (1,)) if c.rank == 1 else c.shape
    if a_shape[-1] != c_shape[-2]:
        raise UnsupportedError(f"{b.where}: {what} of {a.shape} and {c.shape}: inner extents differ")
    batch = broadcast_shape(b.where, a_shape[:-2], c_shape[:-2])
    full = batch + (a_shape[-2], c_shape[-1])
    shape = list(batch) + ([a.shape[-2]] if a.rank > 1 else []) + ([c.shape[-1]] if c.rank > 1 else [])
    idx = indices(len(full))
    out_idx = idx[: len(batch)] + ([idx[-2]] if a.rank > 1 else []) + ([idx[-1]] if c.rank > 1 else [])
    a_sub = (
        b.broadcast_subscripts(Value("", a.dtype, a_shape[:-2]), batch, idx[: len(batch)])
        + ([idx[-2]] if a.rank > 1 else [])
        + ["r0"]
    )
    c_sub = (
        b.broadcast_subscripts(Value("", c.dtype, c_shape[:-2]), batch, idx[: len(batch)])
        + ["r0"]
        + ([idx[-1]] if c.rank > 1 else [])
    )
    return ProductLayout(shape, full, idx, out_idx, a_sub, c_sub, a_shape[-1])


class MatMul(Converter):
    @staticmethod
    def _impl_v1(b, node, inputs):
        a, c = inputs[:2]
        layout = product_layout(b, a, c, "MatMul")
        shape, out_idx, a_sub, c_sub = layout.shape, layout.out, layout.a, layout.c
        sliver = _weight_sliver(b, a, c)
        if sliver:
            return [_product_by_blocked_weights(b, a, c, sliver, shape, out_idx[:-1], a_sub)]
        out = b.new(shape, a.dtype)
        rhs = f"{b.ref(a, a_sub)} * {b.ref(c, c_sub)}"
        b.emit([b.statement(out, out_idx, "+=!", rhs, [("r0", layout.inner)])], [a, c], [out], "contraction")
        return [out]


#: A product by constant weights ``W(K, N)`` of at most this many rows reads them blocked, as
#: ``W'(N / NR, K, NR)`` made at plan time: each NR-wide sliver of N is then laid out as the gemm
#: kernel packs it, so the kernel reads it in place instead of packing all of W on every call
#: (as onnxruntime pre-packs its weights).  Few rows amortise that packing least: a BERT layer's
#: eight products at 128 rows ran faster blocked; at 1024 rows alike.  Since a bias or
#: activation fuses through the view of the blocked product, more rows read blocked weights
#: too: with 4096 rows at most rather than 256, mobilenet_v2 at batch 8 (1x1 convolutions of
#: 392 and 1568 pixels) ran a little faster and the encoder at batch 8 (1024 rows) the same
#: (``python -m benchmarks.onnx_bench --models mobilenet_v2,encoder --batches 8``).
BLOCKED_WEIGHT_ROWS = 4096


def _weight_sliver(b: Builder, a: Value, c: Value, padded: bool = False) -> int:
    """NR when ``a @ c`` should read ``c`` blocked (see :data:`BLOCKED_WEIGHT_ROWS`), else 0:
    the width of the widest register block of the gemm kernel the plan builds (``b.vector_bits``),
    which it picks for such N.  ``padded``: the caller pads ``c`` with zero columns up to a
    multiple of NR."""
    from polyc.codegen.gemm import micro_kernel_shapes

    if c.const is None or c.rank != 2 or a.rank < 2:
        return 0
    if a.dtype != c.dtype or a.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return 0
    isa = {512: "avx512", 256: "avx2"}.get(b.vector_bits)
    if isa is None or math.prod(a.shape[:-1]) > BLOCKED_WEIGHT_ROWS:
        return 0
    sliver = micro_kernel_shapes(isa, a.dtype)[0].nr
    return sliver if (padded or c.shape[1] % sliver == 0) and c.shape[1] > sliver else 0


def zero_padded_columns(matrix: np.ndarray, sliver: int) -> np.ndarray:
    """``matrix`` with zero columns up to a multiple of ``sliver``."""
    rows, columns = matrix.shape
    padded = np.zeros((rows, -(-columns // sliver) * sliver), matrix.dtype)
    padded[:, :columns] = matrix
    return padded


def _product_by_blocked_weights(b: Builder, a: Value, c: Value, sliver: int, shape, row_idx, a_sub) -> Value:
    """``a @ c`` with ``c`` blocked: ``O(.., nb, nr) +=! A(.., r0) * W'(nb, r0, nr)``, viewed as
    ``shape``."""
    k, n = c.shape
    if c.const is None:
        raise TypeError(f"{b.where}: only constant weights are blocked (a polyc bug)")
    blocked = b.const(
        derived_constant(
            c.const,
            ("blocked", sliver),
            lambda matrix: np.ascontiguousarray(matrix.reshape(k, n // sliver, sliver).transpose(1, 0, 2)),
        )
    )
    target = b.new(list(shape[:-1]) + [n // sliver, sliver], a.dtype)
    rhs = f"{b.ref(a, a_sub)} * {b.ref(blocked, ['nb', 'r0', 'nr'])}"
    b.emit(
        [b.statement(target, list(row_idx) + ["nb", "nr"], "+=!", rhs, [("r0", k)])],
        [a, blocked],
        [target],
        "contraction",
    )
    return b.view(target, shape)


class Gemm(Converter):
    @staticmethod
    def _impl_v7(b, node, inputs):
        a, c = inputs[:2]
        bias = inputs[2] if len(inputs) > 2 else None
        alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
        trans_a, trans_b = node.attr("transA", 0), node.attr("transB", 0)
        if a.rank != 2 or c.rank != 2:
            raise ModelError(f"{b.where}: A and B must be matrices, not of shapes {a.shape} and {c.shape}")
        m = a.shape[1] if trans_a else a.shape[0]
        k = a.shape[0] if trans_a else a.shape[1]
        n = c.shape[0] if trans_b else c.shape[1]
        if (c.shape[1] if trans_b else c.shape[0]) != k:
            raise ModelError(
                f"{b.where}: A of shape {a.shape} (transA={trans_a}) and B of shape {c.shape} "
                f"(transB={trans_b}): inner extents differ"
            )
        if m == 1 and (bias is None or beta == 0 or bias.size in (1, n)):
            return Gemm._as_matrix_vector(b, a, c, bias, k, n, alpha, beta, trans_b)
        a_sub = ["r0", "i0"] if trans_a else ["i0", "r0"]
        if c.const is not None and c.rank == 2:
            # Constant weights (a fully connected layer) read blocked, as MatMul's, with zero
            # columns up to a whole sliver: the gemm kernel packed all of them on every call,
            # from memory (mobilenet_v2's classifier at batch 8, 8 x 1280 by 1280 x 1000, ran
            # far behind onnxruntime's so).
            matrix = c.const.T if trans_b else c.const
            rows = Value("", a.dtype, (m, k))  # a's rows, also when transA
            sliver = _weight_sliver(b, rows, Value("", c.dtype, matrix.shape, const=matrix), padded=True)
            if sliver:
                padded = derived_constant(
                    c.const,
                    ("gemm columns", trans_b, sliver),
                    lambda weights: zero_padded_columns(weights.T if trans_b else weights, sliver),
                )
                product = _product_by_blocked_weights(
                    b, a, b.const(padded), sliver, (m, padded.shape[1]), ["i0"], a_sub
                )
                return [Gemm._epilogue(b, product, bias, m, n, alpha, beta)]
        out = b.new((m, n), a.dtype)
        a_ref = b.ref(a, a_sub)
        c_ref = b.ref(c, ["i1", "r0"] if trans_b else ["r0", "i1"])
        statements = [b.statement(out, ["i0", "i1"], "+=!", f"{a_ref} * {c_ref}", [("r0", k)])]
        epilogue = f"{out.ident}(i0, i1)" if alpha == 1 else f"{_number(alpha)} * {out.ident}(i0, i1)"
        if bias is not None and beta != 0:
            bias_ref = b.ref(bias, b.broadcast_subscripts(bias, (m, n), ["i0", "i1"]))
            epilogue += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
        if epilogue != f"{out.ident}(i0, i1)":
            statements.append(b.statement(out, ["i0", "i1"], "=", epilogue))
        b.emit(statements, [a, c] + ([bias] if bias is not None else []), [out], "contraction")
        return [out]

    @staticmethod
    def _epilogue(b, product, bias, m, n, alpha, beta):
        """``alpha * product + beta * bias`` of the first ``n`` columns of ``product`` (its
        others are the blocked weights' zero columns) as an elementwise step, which the fusion
        rules make the epilogue of the product's kernel when there are no others; ``product``
        itself when that is all."""
        rhs = b.ref(product, ["i0", "i1"]) if alpha == 1 else f"{_number(alpha)} * {b.ref(product, ['i0', 'i1'])}"
        reads = [product]
        if bias is not None and beta != 0:
            bias_ref = b.ref(bias, b.broadcast_subscripts(bias, (m, n), ["i0", "i1"]))
            rhs += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
            reads.append(bias)
        if len(reads) == 1 and alpha == 1 and product.shape[-1] == n:
            return product
        out = b.new((m, n), product.dtype)
        b.emit([b.statement(out, ["i0", "i1"], "=", rhs)], reads, [out], "elementwise")
        return out

    @staticmethod
    def _as_matrix_vector(b, a, c, bias, k, n, alpha, beta, trans_b):
        """A one-row Gemm (a fully connected layer at batch 1) as a matrix-vector product, which
        polyc's matrix-vector kernel streams (the gemm kernel would pack all of the weights
        for one row: several times slower than numpy for 1x1280 by 1280x1000)."""
        vector = b.view(a, [k])
        out = b.new((n,), a.dtype)
        matrix = b.ref(c, ["i0", "r0"] if trans_b else ["r0", "i0"])
        statements = [b.statement(out, ["i0"], "+=!", f"{matrix} * {b.ref(vector, ['r0'])}", [("r0", k)])]
        reads = [c, vector]
        epilogue = f"{out.ident}(i0)" if alpha == 1 else f"{_number(alpha)} * {out.ident}(i0)"
        if bias is not None and beta != 0:
            flat = b.view(bias, [bias.size])
            bias_ref = b.ref(flat, ["i0"] if bias.size == n else ["0"])
            epilogue += f" + {bias_ref}" if beta == 1 else f" + {_number(beta)} * {bias_ref}"
            reads.append(flat)
        if epilogue != f"{out.ident}(i0)":
            statements.append(b.statement(out, ["i0"], "=", epilogue))
        b.emit(statements, reads, [out], "contraction")
        return [b.view(out, [1, n])]


class Einsum(Converter):
    """Einsum as one TC statement: each letter an index, those not in the output summed.  An
    ellipsis stands for the same run of axes in every term, aligned right and broadcast as
    numpy broadcasts (an axis of extent 1 is read at 0); a letter repeated in a term reads its
    diagonal.  Without ``->`` the output is the ellipsis' axes, then the letters that appear
    once, in alphabetical order (numpy's implicit mode)."""

    @staticmethod
    def _impl_v12(b, node, inputs):
        equation = node.attr("equation").replace(" ", "")
        left, arrow, right = equation.partition("->")
        terms = left.split(",")
        if len(terms) != len(inputs) or any(v is None for v in inputs):
            raise UnsupportedError(
                f"{b.where}: the equation {equation!r} has {len(terms)} terms for {len(inputs)} inputs"
            )
        # The ellipsis' axes get letters of their own (not in the equation), aligned right.
        unused = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in equation]
        spans = [v.rank - len(term.replace("...", "")) if "..." in term else 0 for term, v in zip(terms, inputs)]
        if any(span < 0 for span in spans) or any(
            "..." not in term and len(term) != v.rank for term, v in zip(terms, inputs)
        ):
            raise UnsupportedError(
                f"{b.where}: the equation {equation!r} does not fit inputs of shapes "
                f"{', '.join(str(v.shape) for v in inputs)}"
            )
        broadcast = "".join(unused[: max(spans, default=0)])
        terms = [term.replace("...", broadcast[len(broadcast) - span :]) for term, span in zip(terms, spans)]
        if arrow:
            right = right.replace("...", broadcast)
        else:
            letters = "".join(terms)
            right = broadcast + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in broadcast))
        extents: dict[str, int] = {}
        for term, value in zip(terms, inputs):
            for letter, extent in zip(term, value.shape):
                if extents.get(letter, 1) != 1 and extent not in (1, extents[letter]):
                    raise UnsupportedError(
                        f"{b.where}: {letter!r} of {equation!r} has extents {extents[letter]} and {extent}"
                    )
                extents[letter] = max(extents.get(letter, 1), extent)
        missing = [c for c in right if c not in extents]
        if missing or len(set(right)) != len(right):
            raise UnsupportedError(f"{b.where}: the output of {equation!r} names {right!r}")
        out = b.new([extents[c] for c in right], inputs[0].dtype)
        name = {c: (f"i{right.index(c)}" if c in right else f"r_{c}") for c in extents}

        def read(value, term):  # an axis of extent 1 where the letter's is larger is broadcast
            return b.ref(value, [name[c] if e == extents[c] else "0" for c, e in zip(term, value.shape)])

        rhs = " * ".join(read(v, term) for term, v in zip(terms, inputs))
        reductions = [(name[c], extents[c]) for c in extents if c not in right]
        op = "+=!" if reductions else "="
        b.emit([b.statement(out, [name[c] for c in right], op, rhs, reductions)], inputs, [out], "contraction")
        return [out]
