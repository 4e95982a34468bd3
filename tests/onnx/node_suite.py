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
The set of skips is pinned in node_suite_skips.txt: a converter dropped or broken fails its cases
instead of quietly skipping them.
"""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path

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
    r"^test_attention_4d_causal_fp16_expanded$": "its expected values round every numpy step of the expanded "
    "softmax (the exponentials, their sum, the quotients) to float16; polyc computes each operator of a float16 "
    "model in float32 and rounds once at its end (polyc/frontends/onnx/float16.py): 2 of 192 elements are 2.5 "
    "float16 steps of their size apart (0.4690 against 0.4695), beyond the case's rtol of 1e-3",
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


#: The cases expected to skip, one a line: the name, then the kind of reason and what it names.
#: A case that skips without its line here, or for another reason, fails; so does a listed case
#: that runs.  Change the file on purpose: ``python -m tests.onnx.node_suite --write-skips``.
SKIPS_FILE = Path(__file__).with_name("node_suite_skips.txt")


@functools.cache
def expected_skips() -> dict[str, str]:
    lines = [line.split(None, 1) for line in SKIPS_FILE.read_text().splitlines() if line and not line.startswith("#")]
    return {name: reason.strip() for name, reason in lines}


def skip_reason(name: str) -> tuple[str, str] | None:
    """Why case ``name`` is not run, found before compiling it: (the pinned key, the message), or
    None.  Training cases are found while compiling (an UnsupportedError; see EXCLUDED)."""
    model = cases()[name].model
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            kind = kind.removesuffix("_type")
            article = "an" if kind[0] in "aeiou" else "a"
            return (
                f"non-tensor {kind}",
                f"{value.name!r} is {article} {kind}, not a tensor: polyc compiles tensors only",
            )
    for elem_type in _types(model):
        if numpy_dtype(elem_type) is None:
            dtype = onnx.TensorProto.DataType.Name(elem_type).lower()
            computed = ", ".join(sorted(set(TC_TYPES.values())))
            return f"dtype {dtype}", f"dtype {dtype} is not one polyc computes in ({computed})"
    missing = unconverted(model)
    if missing:
        return f"operator {','.join(missing)}", f"operator {', '.join(missing)} is not converted by polyc"
    for pattern, reason in IMPRECISE_EXPECTATIONS.items():
        if re.search(pattern, name):
            return "imprecise expectation", reason
    return None


def _skip(name: str, key: str, message: str) -> None:
    pinned = expected_skips().get(name)
    if pinned != key:
        pytest.fail(
            f"{name} skips ({key}: {message}) but {SKIPS_FILE.name} "
            + (f"expects {pinned!r}" if pinned else "does not list it")
            + ": a converter lost, or the list to change on purpose (python -m tests.onnx.node_suite --write-skips)"
        )
    pytest.skip(message)


def run_case(name: str) -> None:
    case = cases()[name]
    reason = skip_reason(name)
    if reason is not None:
        _skip(name, *reason)
    try:
        prepared = backend.prepare(case.model)
        for inputs, expected in case.data_sets:
            got = prepared.run([_array(i) for i in inputs])
            assert len(got) == len(expected)
            for position, (g, e) in enumerate(zip(got, expected, strict=True)):
                e = np.asarray(_array(e))
                assert g.dtype == e.dtype, f"output {position}: dtype {g.dtype}, expected {e.dtype}"
                assert g.shape == e.shape, f"output {position}: shape {g.shape}, expected {e.shape}"
                np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
    except UnsupportedError as error:
        for pattern, reason in EXCLUDED.items():
            if re.search(pattern, name):
                _skip(name, "training mode", f"{reason} ({error})")
        raise
    if name in expected_skips():
        pytest.fail(f"{name} passes now, but {SKIPS_FILE.name} expects it to skip: remove its line")


def write_skips() -> None:
    """Write SKIPS_FILE from the cases of the installed onnx (training cases by EXCLUDED's names)."""
    rows = []
    for name in sorted(cases()):
        reason = skip_reason(name)
        if reason is None and any(re.search(pattern, name) for pattern in EXCLUDED):
            reason = ("training mode", "")
        if reason is not None:
            rows.append(f"{name} {reason[0]}")
    header = (
        f"# onnx {onnx.__version__} backend node cases that tests/onnx/node_suite.py expects to skip "
        f"({len(rows)} of {len(cases())}): name, then why.\n"
    )
    SKIPS_FILE.write_text(header + "\n".join(rows) + "\n")


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


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-skips"]:
        raise SystemExit("usage: python -m tests.onnx.node_suite --write-skips")
    write_skips()
