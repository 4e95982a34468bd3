"""onnx's own real models ("light": their weights made by ConstantOfShape nodes, replaced here by
random ones) through polyc.onnx, against onnxruntime on the same input.

The suite runs squeezenet and zfnet512 (its LRN, Gemm and Reshape beside squeezenet's
operators; about 8 s from a cold kernel cache): each model compiles one kernel per fused group,
and the others at their fixed 224x224 inputs took, on two shared cores from a cold cache,
alexnet and vgg19 about 8 s each, inception v1 45 s, shufflenet 20 s, resnet50 40 s, inception v2
57 s, densenet121 194 s: several minutes beside the suite's budget, for operators the suite
meets elsewhere (tests/onnx/test_real_models_*.py: batch normalisation, average pooling, sums,
transposes).  Run all of them with ``POLYC_ONNX_LIGHT_MODELS=all``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import polyc.onnx as ponnx  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
ALL = (
    sorted(name[len("light_") : -len(".onnx")] for name in os.listdir(DATA) if name.endswith(".onnx"))
    if os.path.isdir(DATA)
    else []
)
IN_SUITE = {"squeezenet", "zfnet512"}


def with_random_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """``model`` with each weight its ConstantOfShape node makes (every one 0.02 in these files:
    every class then gets the same logit, the output is a uniform 0.001 whatever a layer
    computes) replaced by random values: He-scaled convolution and Gemm weights, batch-norm
    scales and variances near 1, small biases and means."""
    rng = np.random.default_rng(seed)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    shapes = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    uses = {name: (node, position) for node in graph.node for position, name in enumerate(node.input)}
    made = {}
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in shapes:
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        user, position = uses[node.output[0]]
        if user.op_type == "BatchNormalization" and position in (1, 4):  # scale, variance
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) >= 2:
            transposed = user.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in user.attribute)
            fan_in = shape[0] if transposed else int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * np.sqrt(2 / fan_in)
        else:
            value = rng.standard_normal(shape) * 0.1
        made[node.output[0]] = onnx.numpy_helper.from_array(value.astype(np.float32), node.output[0])
    kept_nodes = [node for node in graph.node if not (node.op_type == "ConstantOfShape" and node.output[0] in made)]
    shape_tables = {node.input[0] for node in graph.node if node.output[0] in made}
    kept_tables = [t for t in graph.initializer if t.name not in made and t.name not in shape_tables]
    kept_inputs = [value for value in graph.input if value.name not in shape_tables]
    del graph.node[:], graph.initializer[:], graph.input[:]
    graph.node.extend(kept_nodes)
    graph.initializer.extend(kept_tables + list(made.values()))
    graph.input.extend(kept_inputs)
    listed = {value.name for value in graph.input}  # (IR version 3: every initializer is an input too)
    graph.input.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, table.dims)
        for name, table in made.items()
        if name not in listed
    )
    return model


@pytest.mark.parametrize("name", ALL)
def test_light_model_matches_onnxruntime(name):
    if name not in IN_SUITE and os.environ.get("POLYC_ONNX_LIGHT_MODELS") != "all":
        pytest.skip("compile time: set POLYC_ONNX_LIGHT_MODELS=all to run it (see the module docstring)")
    model = with_random_weights(onnx.load(os.path.join(DATA, f"light_{name}.onnx")))
    session = ponnx.InferenceSession(model)
    weights = {table.name for table in model.graph.initializer}
    (arg,) = [arg for arg in session.get_inputs() if arg.name not in weights]
    x = np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in arg.shape]).astype(np.float32)
    got = session.run(None, {arg.name: x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {arg.name: x}
    )
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert np.ptp(e) > 1e-3 * np.abs(e).max(), "a constant output: the comparison would not see a wrong layer"
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-7)
