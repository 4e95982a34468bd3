"""onnx's backend node tests, run on polyc.onnx.backend (shared by test_node_suite_*.py).

The installed onnx wheel has no node test data on disk, so the cases come from onnx's own
generators (``onnx.backend.test.case.node.collect_testcases``): each holds the model, its
inputs and the expected outputs, computed by onnx's reference implementation.  Outputs are
compared with the case's tolerances (rtol 1e-3 and atol 1e-7 unless the case says otherwise),
as onnx's runner does.

A case is skipped only for a reason stated here: it
uses an element type polyc does not compute in (the reason names the type) or a value that
is not a tensor (a sequence, an optional: named), one of its
operators is not converted (named), or it is listed in EXCLUDED or IMPRECISE_EXPECTATIONS with why.
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from polyc.errors import UnsupportedError  # noqa: E402
from polyc.frontends.onnx import backend  # noqa: E402
from polyc.frontends.onnx.functions import flatten, function_bodies, is_if, is_loop, is_scan  # noqa: E402
from polyc.frontends.onnx.model import TC_TYPES, default_opset, load_model, numpy_dtype  # noqa: E402
from polyc.frontends.onnx.ops import CONVERTERS  # noqa: E402
from polyc.frontends.onnx.plan import is_converted  # noqa: E402

#: Cases polyc declines on purpose (an UnsupportedError with this reason is a skip, not a failure).
EXCLUDED = {
    r"training_mode|training_dropout": "training mode: polyc compiles models for inference",
}

#: Cases whose expected outputs are further from the exact answer than their own tolerance, so
#: that a more exact result fails; each is checked against an exact answer in
#: tests/onnx/test_more_operators.py instead.
IMPRECISE_EXPECTATIONS = {
    r"^test_dft_inverse(_opset19)?$": "its expected values come from numpy's float32 FFT: imaginary parts that are exactly 0 hold "
    "that FFT's rounding, 1.9e-7, above the case's atol of 1e-7 (polyc, computing in double as "
    "onnx's reference does, gives 5.6e-16 there and agrees everywhere else)",
}


@functools.cache
def cases() -> dict:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in node.collect_testcases(None)}


def names(part: int, parts: int) -> list[str]:
    return sorted(cases())[part::parts]


def _array(value):
    return onnx.numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else value


def _types(model) -> list[int]:
    graph = model.graph
    return [v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)]


def unconverted(model) -> list[str]:
    """The operators of ``model`` that polyc neither converts nor expands (as ONNX functions)
    into operators it converts, each with what its function lacks."""
    bodies = function_bodies()
    plain = sorted(
        {
            n.op_type
            for n in model.graph.node
            if n.op_type not in CONVERTERS
            and n.op_type not in bodies
            and not is_if(n)
            and not is_scan(n)
            and not is_loop(n)
        }
    )
    if plain:  # (before loading: a model of a training domain has no default opset polyc loads)
        return plain
    loaded, _ = load_model(model)
    _, missing = flatten(loaded.graph, default_opset(loaded), is_converted)
    return sorted({label for label, _, _ in missing})


def run_case(name: str) -> None:
    case = cases()[name]
    model = case.model
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            kind = kind.removesuffix("_type")
            pytest.skip(
                f"{value.name!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not a tensor: polyc compiles tensors only"
            )
    for elem_type in _types(model):
        if numpy_dtype(elem_type) is None:
            pytest.skip(
                f"dtype {onnx.TensorProto.DataType.Name(elem_type).lower()} is not one polyc computes in "
                f"({', '.join(sorted(set(TC_TYPES.values())))})"
            )
    missing = unconverted(model)
    if missing:
        pytest.skip(f"operator {', '.join(missing)} is not converted by polyc")
    for pattern, reason in IMPRECISE_EXPECTATIONS.items():
        if re.search(pattern, name):
            pytest.skip(reason)
    try:
        prepared = backend.prepare(model)
        for inputs, expected in case.data_sets:
            got = prepared.run([_array(i) for i in inputs])
            assert len(got) == len(expected)
            for position, (g, e) in enumerate(zip(got, expected)):
                e = np.asarray(_array(e))
                assert g.dtype == e.dtype, f"output {position}: dtype {g.dtype}, expected {e.dtype}"
                assert g.shape == e.shape, f"output {position}: shape {g.shape}, expected {e.shape}"
                np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
    except UnsupportedError as error:
        for pattern, reason in EXCLUDED.items():
            if re.search(pattern, name):
                pytest.skip(f"{reason} ({error})")
        raise


def operator_under_test(name: str) -> str:
    """The operator a case tests: onnx records the node each case was made from (a private
    table, read defensively); an ``_expanded`` case tests the same operator through its function
    body.  Falls back to the case's only node, or to its first."""
    from onnx.backend.test.case import node

    cases()
    recorded = getattr(node, "_existing_names", {})
    base = re.sub(r"_expanded(_ver\d+)?$", "", name)
    if base in recorded:
        return recorded[base].op_type
    graph_nodes = cases()[name].model.graph.node
    return graph_nodes[0].op_type if graph_nodes else "(none)"
