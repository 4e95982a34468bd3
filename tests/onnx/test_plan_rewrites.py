"""The ONNX plan's graph rewrites edit kernel statements as syntax trees: substitutions,
merged views, epilogues folded into a writer's boxes, transposes read through, and the
canonical def's renaming, each on names a regex on the text would confuse (``v1`` and ``v12``,
an index spelt as a builtin, a read inside another read's subscripts)."""

import numpy as np

from polyc.frontends.onnx import plan
from polyc.frontends.onnx.lowering import Builder, KernelStep, Value
from polyc.frontends.onnx.permutations import fold_transposes
from polyc.lang.parser import parse
from polyc.lang.printer import format_statement


def builder() -> Builder:
    counter = iter(range(100, 1000))
    return Builder("node", "Test", lambda: f"v{next(counter)}", 0)


def value(ident: str, shape: tuple[int, ...], dtype=np.float32) -> Value:
    return Value(ident, np.dtype(dtype), shape)


def step(text: str, reads: list[Value], writes: list[Value], kind: str = "elementwise") -> KernelStep:
    b = builder()
    b.emit([text], reads, writes, kind)
    return b.steps[0]


def texts(step: KernelStep) -> list[str]:
    return [format_statement(s) for s in step.statements]


def test_an_elementwise_statement_is_substituted_into_its_only_reader_and_not_into_a_prefix_name():
    x, x12, s, y = value("v1", (4,)), value("v12", (4,)), value("v2", (4,)), value("v21", (4,))
    producer = step("v2(i0) = exp(v1(i0)) where i0 in 0:4", [x], [s])
    consumer = step("v21(i0) = v2(i0) * v12(i0) + v1(i0) where i0 in 0:4", [s, x12, x], [y])
    kept = plan.inline_elementwise([producer, consumer], [y])
    assert kept == [consumer]
    assert texts(consumer) == ["v21(i0) = exp(v1(i0)) * v12(i0) + v1(i0) where i0 in 0:4"]
    assert consumer.reads == [x12, x]


def test_a_statement_over_a_view_is_rewritten_over_the_tensor_it_merges():
    tensor, view, bias, result = value("v3", (2, 3, 4)), value("v4", (6, 4)), value("v5", (4,)), value("v6", (6, 4))
    (statement,) = step(
        "v6(i0, i1) = v4(i0, i1) + v5(i1) where i0 in 0:6, i1 in 0:4", [view, bias], [result]
    ).statements
    merged = plan._merged_statement(statement, view, tensor)
    assert format_statement(merged) == (
        "v3(i0_0, i0_1, i1) = v3(i0_0, i0_1, i1) + v5(i1) where i0_0 in 0:2, i0_1 in 0:3, i1 in 0:4"
    )


def test_an_epilogue_is_folded_into_each_box_of_its_writer_with_the_indices_renamed():
    # The epilogue's index is `exp`, a builtin's name: only the index is renamed.
    out, bias, x = value("v7", (8,)), value("v71", (8,)), value("v1", (8,))
    writer = step("v7(a) = v1(a) * 2.0 where a in 0:3\nv7(a) = v1(a) where a in 3:8", [x], [out], kind="convolution")
    epilogue_value = value("v9", (8,))
    epilogue = step("v9(exp) = exp(v7(exp)) + v71(exp) where exp in 0:8", [out, bias], [epilogue_value])
    epilogue_value.ident = out.ident  # (fusion gives an epilogue its producer's tensor)
    assert plan._fold_into_writer(writer, epilogue, out)
    assert texts(writer) == [
        "v7(a) = exp(v1(a) * 2.0) + v71(a) where a in 0:3",
        "v7(a) = exp(v1(a)) + v71(a) where a in 3:8",
    ]
    assert writer.writes == [epilogue_value] and writer.reads == [x, bias]


def test_boxes_that_do_not_partition_the_tensor_are_left_alone():
    out, x = value("v7", (8,)), value("v1", (8,))
    writer = step("v7(a) = v1(a) where a in 0:4\nv7(a) = v1(a) where a in 3:8", [x], [out], kind="convolution")
    epilogue = step("v9(i0) = exp(v7(i0)) where i0 in 0:8", [out], [value("v9", (8,))])
    before = list(writer.statements)
    assert not plan._fold_into_writer(writer, epilogue, out)
    assert writer.statements == before


def test_a_transpose_is_read_through_by_a_product_even_inside_a_subscript():
    source, transposed = value("v1", (3, 4)), value("v2", (4, 3))
    other, table, product = value("v12", (3, 5)), value("v3", (4,), np.int64), value("v4", (4, 5))
    transpose = step("v2(i0, i1) = v1(i1, i0) where i0 in 0:4, i1 in 0:3", [source], [transposed])
    reader = step(
        "v4(i, j) +=! v2(v3(i), r) * v12(r, j) where i in 0:4, j in 0:5, r in 0:3",
        [transposed, table, other],
        [product],
        kind="contraction",
    )
    assert fold_transposes([transpose, reader], [product]) == [reader]
    assert texts(reader) == ["v4(i, j) +=! v1(r, v3(i)) * v12(r, j) where i in 0:4, j in 0:5, r in 0:3"]
    assert reader.reads == [source, table, other]


def test_a_transpose_of_a_products_result_is_written_through():
    a, b = value("v1", (2, 3)), value("v11", (3, 4))
    result, transposed = value("v5", (2, 4)), value("v6", (4, 2))
    product = step(
        "v5(i, j) +=! v1(i, r) * v11(r, j) where i in 0:2, j in 0:4, r in 0:3", [a, b], [result], "contraction"
    )
    transpose = step("v6(i0, i1) = v5(i1, i0) where i0 in 0:4, i1 in 0:2", [result], [transposed])
    assert fold_transposes([product, transpose], [transposed]) == [product]
    assert texts(product) == ["v6(j, i) +=! v1(i, r) * v11(r, j) where i in 0:2, j in 0:4, r in 0:3"]


def test_the_canonical_def_renames_tensors_in_the_order_written_and_numbers_each_steps_block():
    x, x12, s = value("v1", (3,)), value("v12", (3,)), value("v40", (3, 2))
    first = step("for s in 0:3 { v40(s, i0) = v1(s) + v12(s) where i0 in 0:2 }", [x, x12], [s], "recurrence")
    second = step("for s in 0:3 { v40(s, i0) = v40(s, i0) * 2.0 where i0 in 0:2 }", [s], [s], "recurrence")
    group = plan.Group(0, [first, second], [x12, x], [s])
    text, names = plan._canonical_def(plan._def_tree(group))
    assert names == {"v12": "_t0", "v1": "_t1", "v40": "_t2"}
    assert text == (
        "def fused(float(3) _t0, float(3) _t1) -> (_t2) {\n"
        "    for s in 0:3 {\n"
        "        _t2(s, i0) = _t1(s) + _t0(s) where i0 in 0:2\n"
        "    }\n"
        "    for s in 0:3 {\n"
        "        _t2(s, i0) = _t2(s, i0) * 2.0 where i0 in 0:2\n"
        "    }\n"
        "}"
    )
    assert [s.loop.number for s in parse(text).defs[0].statements] == [0, 1]
    assert group.source.startswith("# node\ndef group0(float(3) v12, float(3) v1) -> (v40) {")


def test_a_reduction_over_one_element_is_kept_only_where_the_right_hand_side_reads_its_index():
    b = builder()
    out = value("v2", (3,))
    read = b.statement(out, ["i0"], "+=!", "v1(i0, r0)", [("r0", 1)])
    assert read == "v2(i0) +=! v1(i0, r0) where i0 in 0:3, r0 in 0:1"
    # An operand folded to a literal reads no index: one element, the value itself.  A name that
    # only begins with the index's is another name.
    folded = b.statement(out, ["i0"], "+=!", "2.0 * r0x(i0)", [("r0", 1)])
    assert folded == "v2(i0) = 2.0 * r0x(i0) where i0 in 0:3"
    assert b.statement(out, ["i0"], "+=!", "v1(i0, r0)", [("r0", 4)]).endswith("r0 in 0:4")
