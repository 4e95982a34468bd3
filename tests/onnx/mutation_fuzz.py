"""A mutation fuzzer of the ONNX front end: seeded random mutants of small valid models, each run
by polyc and by onnxruntime in a worker process (issue 81).

Three small models built with onnx.helper are the seeds (:data:`SEEDS`): a CNN (Conv, Relu,
MaxPool, Flatten, Gemm), an attention block (MatMul, Transpose, Softmax, Add,
LayerNormalization, Reshape) and a model of tensor plumbing (Split, Slice, Concat, Gather,
ConstantOfShape, Add, Cast).  A mutant is a seed with one to three random mutations
(:data:`MUTATIONS`): attribute values out of range, negative, huge or of the wrong type, attributes
removed or added, element types and dims of graph inputs, outputs and initializers, initializer
data truncated or extended, node inputs dropped, duplicated or renamed to missing names, node
outputs dropped or added, op types swapped, nodes removed or repeated, the opset changed, and
names with odd characters (renamed everywhere, or in one place).

Each mutant runs in a worker process (a crash or a hang is caught there: the worker is killed
after the per-mutant timeout and a fresh one started) first in a polyc session (with graph
fusion, or for one mutant in four without), then in onnxruntime, on the same seeded inputs
(shaped as the mutant's inputs declare, or as the seed's).
Outcomes (:func:`classify`):

- ``refused``: polyc raised a :class:`polyc.errors.PolycError` subclass; ``refused, unplaced``
  where its message names no node, initializer, input, output or model field;
- ``agreed``: polyc and onnxruntime (its kernels, with its graph optimisations off) both ran it and every output has onnxruntime's dtype and shape
  and matches within the tolerance of ``test_graph_fuzz.py`` (rtol 1e-3, atol 1e-5 x magnitude);
- ``lenient``: polyc ran a model onnxruntime refuses (a problem worth a look, not a failure here);
- ``onnxruntime crashed``: onnxruntime's process died or hung, nothing to compare with;
- failures: ``raw exception`` (any other exception type), ``crash``, ``hang``, ``mismatch``,
  ``inputs modified`` (polyc wrote into the caller's arrays).

``python -m tests.onnx.mutation_fuzz --mutants 1000 --seed 0 -j 2`` prints a table of the
outcomes and every failure with the mutations that made it (``--show lenient`` also lists those);
``mutant(seed, index)`` rebuilds one mutant.  ``tests/onnx/test_mutation_fuzz.py`` runs a few
(``POLYC_MUTATION_FUZZ_MUTANTS``).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT
FAILURES = ("raw exception", "crash", "hang", "mismatch", "inputs modified")
OUTCOMES = ("refused", "refused, unplaced", "agreed", "lenient", "onnxruntime crashed", *FAILURES)
#: what places a refusal (a quoted name, a node, an initializer, a graph input or output, the opset),
#: looked for after the model's own name
PLACES = ("'", "node", "initializer", "input", "output", "opset", "attribute", "tensor name", "Op registered for")


# ----------------------------------------------------------------------------- the seeds
def _weights(rng, name, shape, dtype=np.float32):
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(max(1, shape[-1]))).astype(dtype), name)


def _ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def cnn() -> onnx.ModelProto:
    """x (1, 3, 8, 8) -> Conv 3x3 -> Relu -> MaxPool 2x2 -> Flatten -> Gemm -> y (1, 5)."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1, alpha=1.0),
    ]
    initializers = [
        _weights(rng, "w", (4, 3, 3, 3)),
        _weights(rng, "b", (4,)),
        _weights(rng, "fc_w", (5, 64)),
        _weights(rng, "fc_b", (5,)),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", FLOAT, [1, 5])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def attention() -> onnx.ModelProto:
    """x (2, 4, 8): softmax(q k^T) x + x, layer-normalized and reshaped to (2, 32)."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="query"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="key"),
        helper.make_node("Transpose", ["k"], ["kt"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["a"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["a", "x"], ["h"], name="mix"),
        helper.make_node("Add", ["h", "x"], ["res"], name="residual"),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["n"], name="norm", axis=-1, epsilon=1e-5),
        helper.make_node("Reshape", ["n", "shape"], ["y"], name="reshape"),
    ]
    initializers = [
        _weights(rng, "wq", (8, 8)),
        _weights(rng, "wk", (8, 8)),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "gamma"),
        _weights(rng, "beta", (8,)),
        _ints("shape", [2, 32]),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("y", FLOAT, [2, 32])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def plumbing() -> onnx.ModelProto:
    """x (2, 6): split, slice, concat, gather, a ConstantOfShape added, cast to int32."""
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["lo", "hi"], name="split", axis=1),
        helper.make_node("Slice", ["hi", "starts", "ends", "axes"], ["mid"], name="slice"),
        helper.make_node("Concat", ["lo", "mid"], ["cat"], name="concat", axis=1),
        helper.make_node("Gather", ["cat", "indices"], ["g"], name="gather", axis=1),
        helper.make_node(
            "ConstantOfShape",
            ["fill_shape"],
            ["ones"],
            name="fill",
            value=helper.make_tensor("value", FLOAT, [1], [1.5]),
        ),
        helper.make_node("Add", ["g", "ones"], ["y"], name="add"),
        helper.make_node("Cast", ["y"], ["z"], name="cast", to=TensorProto.INT32),
    ]
    initializers = [
        _ints("sizes", [2, 4]),
        _ints("starts", [1]),
        _ints("ends", [3]),
        _ints("axes", [1]),
        _ints("indices", [0, 3, 1]),
        _ints("fill_shape", [2, 3]),
    ]
    graph = helper.make_graph(
        nodes,
        "plumbing",
        [helper.make_tensor_value_info("x", FLOAT, [2, 6])],
        [
            helper.make_tensor_value_info("y", FLOAT, [2, 3]),
            helper.make_tensor_value_info("z", TensorProto.INT32, [2, 3]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


SEEDS = {"cnn": cnn, "attention": attention, "plumbing": plumbing}


# ----------------------------------------------------------------------------- the mutations
ODD_NAMES = ["a b", "x/y:0", "ünïcödé", "", "1x", 'q"uote', "back\\slash", "new\nline", "a" * 300, "%s%d", "-"]
OP_TYPES = [
    "Relu", "Conv", "MaxPool", "Gemm", "MatMul", "Add", "Softmax", "LayerNormalization", "Transpose",
    "Reshape", "Concat", "Split", "Slice", "Gather", "ConstantOfShape", "Cast", "Flatten", "Sub",
    "AveragePool", "ReduceSum", "Identity", "Squeeze", "Unsqueeze", "Where", "NoSuchOp",
]  # fmt: skip
ELEMENT_TYPES = [
    TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32,
    TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL, TensorProto.STRING, TensorProto.UNDEFINED, 999,
]  # fmt: skip
ATTRIBUTES = ["axis", "perm", "kernel_shape", "strides", "pads", "group", "to", "epsilon", "transA", "bogus"]


def _pick(rng, options: list):
    return options[rng.integers(len(options))]


def _int_value(rng, old: int) -> int:
    return int(rng.choice([-1, 0, -5, 1, 2, 3, old + 1, old - 1, old * 2, 2**31, -(2**31), 2**62, 7]))


def _nodes_with_attributes(model):
    return [n for n in model.graph.node if n.attribute]


def mutate_attribute_value(rng, model):
    nodes = _nodes_with_attributes(model)
    if not nodes:
        return None
    node = nodes[rng.integers(len(nodes))]
    attribute = node.attribute[rng.integers(len(node.attribute))]
    if attribute.type == AttributeProto.INT:
        attribute.i = _int_value(rng, attribute.i)
    elif attribute.type == AttributeProto.INTS and attribute.ints:
        values = list(attribute.ints)
        form = rng.integers(4)
        if form == 0:
            values[rng.integers(len(values))] = _int_value(rng, values[0])
        elif form == 1:
            values = values[:-1]
        elif form == 2:
            values = values + [values[-1]]
        else:
            values = [_int_value(rng, v) for v in values]
        del attribute.ints[:]
        attribute.ints.extend(values)
    elif attribute.type == AttributeProto.FLOAT:
        attribute.f = float(rng.choice([-1.0, 0.0, np.inf, np.nan, 1e30, -1e-30]))
    elif attribute.type == AttributeProto.TENSOR:
        value = attribute.t
        form = rng.integers(3)
        if form == 0:
            value.data_type = int(rng.choice(ELEMENT_TYPES))
        elif form == 1:
            del value.dims[:]
            value.dims.extend(_pick(rng, [[2], [1, 1], [0], [3]]))
        else:
            del value.float_data[:]
    else:
        return None
    return f"attribute {node.name}.{attribute.name} -> {helper.get_attribute_value(attribute)!r}"[:160]


def mutate_attribute_type(rng, model):
    nodes = _nodes_with_attributes(model)
    if not nodes:
        return None
    node = nodes[rng.integers(len(nodes))]
    index = int(rng.integers(len(node.attribute)))
    name = node.attribute[index].name
    replacement = [
        helper.make_attribute(name, 1.5),
        helper.make_attribute(name, "text"),
        helper.make_attribute(name, [1, 2]),
        helper.make_attribute(name, 3),
        helper.make_attribute(name, [0.5]),
        helper.make_attribute(name, helper.make_tensor("t", FLOAT, [1], [2.0])),
    ][rng.integers(6)]
    node.attribute[index].CopyFrom(replacement)
    return f"attribute {node.name}.{name} typed {AttributeProto.AttributeType.Name(replacement.type)}"


def remove_attribute(rng, model):
    nodes = _nodes_with_attributes(model)
    if not nodes:
        return None
    node = nodes[rng.integers(len(nodes))]
    index = int(rng.integers(len(node.attribute)))
    name = node.attribute[index].name
    del node.attribute[index]
    return f"attribute {node.name}.{name} removed"


def add_attribute(rng, model):
    node = model.graph.node[rng.integers(len(model.graph.node))]
    name = ATTRIBUTES[rng.integers(len(ATTRIBUTES))]
    if any(a.name == name for a in node.attribute):
        node.attribute.append(helper.make_attribute(name, 1))  # the same attribute twice
        return f"attribute {node.name}.{name} repeated"
    value = [_int_value(rng, 1), [1, 1], [0, 0, 0, 0], 0.5][rng.integers(4)]
    node.attribute.append(helper.make_attribute(name, value))
    return f"attribute {node.name}.{name} = {value!r} added"


def mutate_value_info(rng, model):
    values = list(model.graph.input) + list(model.graph.output)
    value = values[rng.integers(len(values))]
    tensor = value.type.tensor_type
    form = rng.integers(4)
    if form == 0:
        tensor.elem_type = int(rng.choice(ELEMENT_TYPES))
        return f"{value.name} typed {tensor.elem_type}"
    dims = tensor.shape.dim
    if form == 1 and dims:
        dim = dims[rng.integers(len(dims))]
        dim.dim_value = int(rng.choice([0, 1, 2, 3, 7, 100]))
    elif form == 2 and dims:
        del dims[-1]
    elif form == 3:
        dims.add().dim_value = int(rng.choice([1, 2]))
    else:
        tensor.ClearField("shape")
    return f"{value.name} shaped {[d.dim_value or d.dim_param for d in dims]}"


def mutate_initializer(rng, model):
    initializers = model.graph.initializer
    if not initializers:
        return None
    tensor = initializers[rng.integers(len(initializers))]
    try:
        array = numpy_helper.to_array(tensor)
    except Exception:  # mutated before: its data no longer read
        return None
    form = rng.integers(5)
    if form == 0:  # truncated data
        tensor.raw_data = array.tobytes()[: max(0, array.nbytes - array.itemsize * int(rng.integers(1, 3)))]
        what = "truncated"
    elif form == 1:  # extended data
        tensor.raw_data = array.tobytes() + array.tobytes()[: array.itemsize * 2]
        what = "extended"
    elif form == 2:  # dims that do not fit the data
        del tensor.dims[:]
        tensor.dims.extend(_pick(rng, [[1], [2, 2], [0], [array.size + 1], [-1, 2]]))
        what = f"dims {list(tensor.dims)}"
    elif form == 3:  # another element type for the same bytes
        tensor.data_type = int(rng.choice(ELEMENT_TYPES))
        what = f"typed {tensor.data_type}"
    else:  # other values of the same type and shape
        if array.dtype.kind == "i":
            replaced = rng.integers(-3, 10, array.shape).astype(array.dtype)
        else:
            replaced = rng.standard_normal(array.shape).astype(array.dtype)
        tensor.CopyFrom(numpy_helper.from_array(replaced, tensor.name))
        what = f"values {replaced.ravel()[:8].tolist()}"
    return f"initializer {tensor.name} {what}"


def mutate_node_inputs(rng, model):
    node = model.graph.node[rng.integers(len(model.graph.node))]
    inputs = list(node.input)
    form = rng.integers(5)
    if form == 0 and inputs:
        del inputs[rng.integers(len(inputs))]
        what = "one dropped"
    elif form == 1 and inputs:
        inputs.append(inputs[rng.integers(len(inputs))])
        what = "one repeated"
    elif form == 2 and inputs:
        inputs[rng.integers(len(inputs))] = "missing"
        what = "one renamed to a missing name"
    elif form == 3 and len(inputs) > 1:
        inputs = inputs[::-1]
        what = "reversed"
    else:
        inputs.insert(int(rng.integers(len(inputs) + 1)), "")
        what = "an empty name inserted"
    del node.input[:]
    node.input.extend(inputs)
    return f"inputs of {node.name} {what}: {inputs}"


def mutate_node_outputs(rng, model):
    node = model.graph.node[rng.integers(len(model.graph.node))]
    if rng.integers(2) and len(node.output) > 0:
        dropped = node.output[-1]
        del node.output[-1]
        return f"output {dropped} of {node.name} dropped"
    node.output.append(f"{node.name}_extra")
    return f"output added to {node.name}"


def swap_op_type(rng, model):
    node = model.graph.node[rng.integers(len(model.graph.node))]
    old, node.op_type = node.op_type, OP_TYPES[rng.integers(len(OP_TYPES))]
    return f"{node.name}: {old} -> {node.op_type}"


def remove_or_repeat_node(rng, model):
    nodes = model.graph.node
    index = int(rng.integers(len(nodes)))
    name = nodes[index].name
    if rng.integers(2):
        del nodes[index]
        return f"node {name} removed"
    nodes.append(nodes[index])
    return f"node {name} repeated"


def change_opset(rng, model):
    version = int(rng.choice([1, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 21, 22, 30, -1]))
    model.opset_import[0].version = version
    if rng.integers(4) == 0:
        model.opset_import[0].domain = "ai.onnx.unknown"
    return f"opset {model.opset_import[0].domain or 'ai.onnx'} {version}"


def odd_name(rng, model):
    graph = model.graph
    names = sorted({n for node in graph.node for n in [*node.input, *node.output] if n})
    old = names[rng.integers(len(names))]
    new = ODD_NAMES[rng.integers(len(ODD_NAMES))]
    everywhere = bool(rng.integers(2))
    for node in graph.node:
        for values in (node.input, node.output):
            for i, name in enumerate(values):
                if name == old:
                    values[i] = new
                    if not everywhere:
                        return f"{old!r} -> {new!r} in node {node.name} only"
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.name == old:
            value.name = new
    for tensor in graph.initializer:
        if tensor.name == old:
            tensor.name = new
    if rng.integers(3) == 0:  # an odd node name too
        graph.node[rng.integers(len(graph.node))].name = new
    return f"{old!r} -> {new!r} everywhere"


MUTATIONS = [
    mutate_attribute_value,
    mutate_attribute_value,
    mutate_attribute_type,
    remove_attribute,
    add_attribute,
    mutate_value_info,
    mutate_initializer,
    mutate_initializer,
    mutate_node_inputs,
    mutate_node_outputs,
    swap_op_type,
    remove_or_repeat_node,
    change_opset,
    odd_name,
]


@dataclass
class Mutant:
    """One mutant: its seed model's name, the mutations applied, the model's bytes, its inputs and
    whether polyc's session fuses the graph (both ways are fuzzed)."""

    index: int
    seed_model: str
    mutations: list[str]
    model: bytes
    feeds: dict = field(default_factory=dict)
    graph_fusion: bool = True


def mutant(seed: int, index: int) -> Mutant:
    """The ``index``-th mutant of the run seeded ``seed`` (the same for any count and any -j)."""
    rng = np.random.default_rng([seed, index])
    seed_name = list(SEEDS)[index % len(SEEDS)]
    model = SEEDS[seed_name]()
    declared = rng.integers(2) == 0  # feeds shaped as the mutant declares, or as the seed does
    original = _feeds(model, rng)
    mutations = []
    for _ in range(int(rng.choice([1, 1, 2, 3]))):
        for _attempt in range(5):
            done = MUTATIONS[rng.integers(len(MUTATIONS))](rng, model)
            if done is not None:
                mutations.append(done)
                break
    feeds = (_feeds(model, np.random.default_rng([seed, index, 1])) if declared else None) or original
    graph_fusion = bool(np.random.default_rng([seed, index, 2]).integers(4))  # off for one in four
    return Mutant(index, seed_name, mutations, model.SerializeToString(), feeds, graph_fusion)


def _feeds(model, rng) -> dict | None:
    """Seeded inputs of the shapes and types ``model``'s graph inputs declare (None where those say
    no type numpy has or a shape of more than 4096 elements)."""
    feeds = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        except (KeyError, ValueError):  # a mutated element type
            return None
        if dtype.kind not in "fiub":
            return None
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        if any(d < 0 for d in shape) or int(np.prod(shape)) > 4096:
            return None
        feeds[value.name] = (rng.standard_normal(shape) * 2).astype(dtype)
    return feeds


# ----------------------------------------------------------------------------- the worker
def _worker(connection) -> None:
    """Runs mutants sent on ``connection``: sends polyc's result, then onnxruntime's."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import onnxruntime as ort

    import polyc.onnx
    from polyc.errors import PolycError

    while True:
        try:
            model, feeds, graph_fusion = connection.recv()
        except EOFError:
            return
        copies = {name: array.copy() for name, array in feeds.items()}
        try:
            session = polyc.onnx.InferenceSession(model, threads=1, progress=False, graph_fusion=graph_fusion)
            result = ("ran", session.run(None, feeds))
        except PolycError as error:
            result = ("refused", f"{type(error).__name__}: {error}")
        except Exception as error:  # what the fuzzer looks for
            result = ("raw", f"{type(error).__name__}: {error}\n{traceback.format_exc(limit=-4)}")
        modified = [n for n in feeds if not np.array_equal(feeds[n], copies[n], equal_nan=True)]
        connection.send((result, modified))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 4
        # its kernels, not its graph rewrites: the SkipLayerNormalization fusion of onnxruntime
        # 1.32 drops a LayerNormalization's axis other than -1 (mutant 160 of seed 0)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            connection.send(("ran", session.run(None, copies)))
        except Exception as error:
            connection.send(("refused", f"{type(error).__name__}: {error}"))


def _stuck_worker(connection) -> None:
    """A worker that never answers (the fuzzer's own test of its timeout)."""
    connection.recv()
    time.sleep(3600)


def _dying_worker(connection) -> None:
    """A worker that dies on its first mutant (the fuzzer's own test of a crash)."""
    connection.recv()
    os._exit(3)


class Worker:
    """A worker process running ``target`` (:func:`_worker`), started again after a crash or a hang."""

    def __init__(self, target=_worker):
        self._target = target
        self._process = None
        self._connection = None

    def _start(self):
        context = multiprocessing.get_context("spawn")
        self._connection, theirs = context.Pipe()
        self._process = context.Process(target=self._target, args=(theirs,), daemon=True)
        self._process.start()
        theirs.close()

    def _receive(self, timeout: float):
        """The next message, or "crash" / "hang" (the worker then killed)."""
        try:
            if self._connection.poll(timeout):
                return self._connection.recv()
        except (EOFError, OSError):
            self.stop()
            return "crash"
        self.stop()
        return "hang"

    def run(self, item: Mutant, timeout: float):
        """(polyc's result, modified input names, onnxruntime's result); a result is a (kind, value)
        pair or the string "crash" or "hang"."""
        if self._process is None or not self._process.is_alive():
            self._start()
        self._connection.send((item.model, item.feeds, item.graph_fusion))
        ours = self._receive(timeout)
        if isinstance(ours, str):
            return ours, [], None
        theirs = self._receive(timeout)
        return ours[0], ours[1], theirs

    def stop(self):
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._connection.close()
        self._process = None


def classify(ours, modified, theirs) -> tuple[str, str]:
    """(outcome, detail) of one mutant from the worker's results."""
    if ours in ("crash", "hang"):
        return ours, "polyc's worker " + ("died" if ours == "crash" else "gave no answer in time")
    kind, value = ours
    if kind == "raw":
        return "raw exception", value
    if modified:
        return "inputs modified", f"polyc wrote into {modified}"
    if kind == "refused":
        problem = value.split(": ", 1)[-1].removeprefix("model bytes: ")  # the error's type and model's name
        return ("refused" if any(p in problem for p in PLACES) else "refused, unplaced"), value.split("\n")[0]
    if theirs in ("crash", "hang"):
        return "onnxruntime crashed", f"onnxruntime {theirs}"
    their_kind, expected = theirs
    if their_kind == "refused":
        return "lenient", expected.split("\n")[0][:300]
    if len(value) != len(expected):
        return "mismatch", f"{len(value)} outputs, onnxruntime gives {len(expected)}"
    for number, (got, want) in enumerate(zip(value, expected, strict=True)):
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            return "mismatch", f"output {number}: {got.dtype}{got.shape}, onnxruntime {want.dtype}{want.shape}"
        if want.dtype.kind in "fc":
            finite = np.abs(want[np.isfinite(want)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            close = np.allclose(got, want, rtol=1e-3, atol=1e-5 * scale, equal_nan=True)
        else:
            close = np.array_equal(got, want)
        if not close:
            return "mismatch", f"output {number} differs: {got.ravel()[:6]} vs {want.ravel()[:6]}"
    return "agreed", ""


# ----------------------------------------------------------------------------- the run
@dataclass
class Record:
    """A mutant's outcome (one of :data:`OUTCOMES`) and what it was: the refusal, the difference."""

    mutant: Mutant
    outcome: str
    detail: str


def run_mutants(indices, seed: int, timeout: float, jobs: int = 1, progress=None) -> list[Record]:
    """Runs the mutants ``indices`` of the run seeded ``seed`` on ``jobs`` workers."""
    import concurrent.futures
    import threading

    local = threading.local()
    workers = []

    def one(index):
        if not hasattr(local, "worker"):
            local.worker = Worker()
            workers.append(local.worker)
        item = mutant(seed, index)
        record = Record(item, *classify(*local.worker.run(item, timeout)))
        if progress is not None:
            progress(record)
        return record

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, indices))
    finally:
        for worker in workers:
            worker.stop()


def summary(records: list[Record]) -> str:
    """A table of the outcomes per seed model."""
    counts = collections.Counter((r.mutant.seed_model, r.outcome) for r in records)
    width = max(len(o) for o in OUTCOMES)
    lines = [f"{'outcome':<{width}} " + " ".join(f"{s:>9}" for s in SEEDS) + f" {'all':>6}"]
    for outcome in OUTCOMES:
        row = [counts[(s, outcome)] for s in SEEDS]
        lines.append(f"{outcome:<{width}} " + " ".join(f"{n:>9}" for n in row) + f" {sum(row):>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.onnx.mutation_fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--mutants", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start", type=int, default=0, help="the first mutant's index")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant and engine")
    parser.add_argument("--show", nargs="*", default=[], help="outcomes to list besides the failures")
    arguments = parser.parse_args(argv)
    start = time.monotonic()
    done = collections.Counter()

    def progress(record):
        done[record.outcome] += 1
        if record.outcome in FAILURES:
            print(f"mutant {record.mutant.index}: {record.outcome}", file=sys.stderr, flush=True)

    records = run_mutants(
        range(arguments.start, arguments.start + arguments.mutants),
        arguments.seed,
        arguments.timeout,
        arguments.jobs,
        progress,
    )
    print(f"{len(records)} mutants, seed {arguments.seed}, {time.monotonic() - start:.0f} s\n")
    print(summary(records))
    for record in records:
        if record.outcome in FAILURES or record.outcome in arguments.show:
            item = record.mutant
            fusion = "" if item.graph_fusion else ", graph_fusion=False"
            print(f"\nmutant {item.index} ({item.seed_model}{fusion}: {'; '.join(item.mutations)}): {record.outcome}")
            print("    " + record.detail.replace("\n", "\n    "))
    return 1 if any(r.outcome in FAILURES for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
