"""Text features: TfIdfVectorizer's n-gram counts (over integer token ids; string pools are
refused with their element type, as polyc computes in numbers)."""

from __future__ import annotations

import numpy as np

from polyc.errors import PolycError, UnsupportedError
from polyc.frontends.onnx.ops.base import Converter


class TfIdfVectorizer(Converter):
    """Counts of the pool's n-grams in each row of token ids, weighted by ``mode``, as onnx's
    reference counts them: an n-gram of length L is its tokens at positions p, p + d, ...,
    p + (L - 1) d of a row, for every start p and every distance d from 1 to max_skip_count + 1
    (1-grams once, at d = 1).  An n-gram listed twice in the pool is an error, as in onnxruntime.
    IDF and TFIDF weigh each n-gram's count by its own weight, as the operator's definition and
    onnxruntime do (onnx's reference takes the weight of the output column instead: the two
    agree where ``ngram_indexes`` lists the columns in order, as in onnx's node cases).

    One statement per n-gram length, a sum over starts and distances of the comparisons of the
    L tokens: rows x pool x row length x distances x L comparisons."""

    @staticmethod
    def _impl_v9(b, node, inputs):
        x = inputs[0]
        if node.attr("pool_strings"):
            raise UnsupportedError(f"{b.where}: TfIdfVectorizer of strings (polyc computes in numbers)")
        if x.dtype.kind not in "iu" or x.rank not in (1, 2):
            raise UnsupportedError(
                f"{b.where}: TfIdfVectorizer of {x.dtype} of rank {x.rank} (integer token ids of rank 1 or 2)"
            )
        pool = [int(v) for v in node.attr("pool_int64s") or []]
        starts = [int(v) for v in node.attr("ngram_counts") or []]
        columns = [int(v) for v in node.attr("ngram_indexes") or []]
        shortest, longest = int(node.attr("min_gram_length")), int(node.attr("max_gram_length"))
        distances = int(node.attr("max_skip_count", 0)) + 1
        mode = node.attr("mode")
        if mode not in ("TF", "IDF", "TFIDF") or not columns or not 1 <= shortest <= longest:
            raise UnsupportedError(
                f"{b.where}: TfIdfVectorizer with mode {mode!r}, n-gram lengths {shortest} to "
                f"{longest} and {len(columns)} output indexes"
            )
        width = max(columns) + 1
        rows = b.view(x, (1,) + x.shape) if x.rank == 1 else x
        batch, length = rows.shape
        weights = [float(w) for w in node.attr("weights") or []]
        if weights and len(weights) != len(columns):
            raise PolycError(f"{b.where}: TfIdfVectorizer has {len(weights)} weights for {len(columns)} n-grams")
        # The pool's n-grams by length: tokens -> (output column, weight).
        grams: dict[int, dict[tuple, tuple[int, float]]] = {}
        number = 0
        for size, start in enumerate(starts, 1):
            end = starts[size] if size < len(starts) else len(pool)
            for offset in range(start, end - size + 1, size):
                gram = tuple(pool[offset : offset + size])
                if gram in grams.get(size, {}):
                    raise PolycError(f"{b.where}: the n-gram {list(gram)} is in the pool twice")
                if shortest <= size <= longest and number < len(columns):
                    grams.setdefault(size, {})[gram] = (columns[number], weights[number] if weights else 1.0)
                number += 1
        if not grams:  # no n-gram of a counted length: all zeros
            return [b.const(np.zeros(x.shape[:-1] + (width,), np.float32))]
        out = b.new((batch, width), np.float32)
        statements, reads = [], [rows]
        for size, table in sorted(grams.items()):
            tokens = b.const(np.array(list(table), np.int64).reshape(len(table), size))
            places = b.const(np.array([column for column, _ in table.values()], np.int64))
            scale = b.const(np.array([weight for _, weight in table.values()], np.float32))
            found = b.new((batch, len(table)), np.int64)  # each n-gram's count in each row
            reads += [tokens, places, scale]
            match = " && ".join(
                f"int64({b.ref(rows, ['i0', f'r_p + {j} * (r_d + 1)'])}) == {b.ref(tokens, ['i1', str(j)])}"
                for j in range(size)
            )
            statements.append(
                b.statement(
                    found,
                    ["i0", "i1"],
                    "+=!",
                    f"(r_p + {size - 1} * (r_d + 1) < {length}) ? (({match}) ? int64(1) : int64(0)) : int64(0)",
                    [("r_p", length), ("r_d", distances if size > 1 else 1)],
                )
            )
            # The counts weighed as the mode says (by the n-gram's weight, as onnxruntime and
            # the operator's definition do), each into its output column.
            count, weight = b.ref(found, ["i0", "r_g"]), b.ref(scale, ["r_g"])
            value = {
                "TF": f"float({count})",
                "IDF": f"({count} > 0) ? {weight} : float(0)",
                "TFIDF": f"{weight} * float({count})",
            }[mode]
            statements.append(
                b.statement(
                    out,
                    ["i0", "i1"],
                    "+=" if len(statements) > 1 else "+=!",
                    f"({b.ref(places, ['r_g'])} == i1) ? ({value}) : float(0)",
                    [("r_g", len(table))],
                )
            )
        b.emit(statements, reads, [out], "other")
        return [b.view(out, x.shape[:-1] + (width,))] if x.rank == 1 else [out]
