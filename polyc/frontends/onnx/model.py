"""Loading an ONNX model: from a ModelProto, a path or bytes, checked, shapes inferred.

The user's ModelProto is never modified: the importer works on a copy.  Every failure to read,
parse or validate the model is a :class:`polyc.PolycError` naming the model and the problem.
"""

from __future__ import annotations

import io
import os
import re
import stat
from dataclasses import dataclass

import numpy as np

from polyc.errors import ModelError, PolycError

#: The element types polyc computes in, as numpy dtypes, and their TC spelling.
TC_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8",
    np.dtype(np.int16): "int16",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
    np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32",
    np.dtype(np.uint64): "uint64",
    np.dtype(np.bool_): "bool",
}
#: The oldest opset of the default domain polyc converts (onnx's own "light" real models are opset 9).
MIN_OPSET = 7


def _onnx():
    try:
        import onnx
    except ImportError as error:  # pragma: no cover - the onnx extra brings it
        raise PolycError("polyc.onnx needs the onnx package: pip install 'polyc[onnx]'") from error
    return onnx


def numpy_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype of an ONNX TensorProto element type, or None for ones polyc cannot compute in."""
    onnx = _onnx()
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None
    return dtype if dtype in TC_TYPES else None


def type_name(elem_type: int) -> str:
    """onnxruntime's spelling of a tensor type: ``tensor(float)``, ``tensor(int64)``, ..."""
    onnx = _onnx()
    name = onnx.TensorProto.DataType.Name(elem_type).lower()
    return f"tensor({ {'float': 'float', 'double': 'double'}.get(name, name) })"


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output: its name, element type and shape (ints, or strings for symbolic dims)."""

    name: str
    elem_type: int
    shape: tuple[int | str | None, ...] | None

    @property
    def dtype(self) -> np.dtype | None:
        return numpy_dtype(self.elem_type)

    @property
    def type(self) -> str:
        return type_name(self.elem_type)


def tensor_info(value_info) -> TensorInfo:
    tensor_type = value_info.type.tensor_type
    shape = None
    if tensor_type.HasField("shape"):
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return TensorInfo(value_info.name, tensor_type.elem_type, shape)


#: The largest model file read: protobuf's limit on one message (a larger model keeps its
#: weights in external data files).
MAX_MODEL_BYTES = 2**31 - 1

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_model_file(path: str, where: str) -> bytes:
    """The bytes of the model file at ``path`` (symbolic links followed), read only when it is a
    regular file of at most :data:`MAX_MODEL_BYTES`: a link to /dev/zero or a FIFO is refused at
    once instead of read until memory runs out or waited on forever.  Opened without blocking,
    so that opening a FIFO does not wait for a writer."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError as error:
        raise PolycError(f"{where}: no such file") from error
    except OSError as error:
        raise PolycError(f"{where}: cannot be opened ({error.strerror or error})") from error
    try:
        facts = os.fstat(descriptor)
        kind = next((name for is_kind, name in _FILE_KINDS if is_kind(facts.st_mode)), None)
        if kind is not None or not stat.S_ISREG(facts.st_mode):
            raise PolycError(
                f"{where}: not a regular file but {kind or 'something else'}; an ONNX model is read from a regular file"
            )
        if facts.st_size > MAX_MODEL_BYTES:
            raise PolycError(
                f"{where}: {facts.st_size} bytes, more than protobuf's limit of {MAX_MODEL_BYTES} for a model "
                "file (a larger model keeps its weights in external data files)"
            )
        with os.fdopen(os.dup(descriptor), "rb") as file:
            data = file.read(MAX_MODEL_BYTES + 1)  # bounded even if the file grows meanwhile
    finally:
        os.close(descriptor)
    if len(data) > MAX_MODEL_BYTES:
        raise PolycError(f"{where}: more than {MAX_MODEL_BYTES} bytes (the file grew as it was read)")
    return data


def load_model(model, where: str | None = None):
    """A checked, shape-inferred copy of ``model`` (a ModelProto, a path or the bytes of one)."""
    onnx = _onnx()
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        where = where or f"model {model.graph.name or '(unnamed)'}"
    elif isinstance(model, (bytes, bytearray, memoryview)):
        where = where or "model bytes"
        copy = onnx.ModelProto()
        try:
            copy.ParseFromString(bytes(model))
        except (DecodeError, RuntimeError, ValueError) as error:
            raise PolycError(f"{where}: not an ONNX model ({error})") from error
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        where = where or path
        data = read_model_file(path, where)
        extension_format = onnx.serialization.registry.get_format_from_file_extension(os.path.splitext(path)[1])
        try:
            copy = onnx.load(io.BytesIO(data), format=extension_format, load_external_data=False)
            onnx.external_data_helper.load_external_data_for_model(copy, os.path.dirname(path))
        except (DecodeError, RuntimeError, ValueError, OSError, onnx.checker.ValidationError) as error:
            raise PolycError(f"{where}: not a readable ONNX model ({type(error).__name__}: {error})") from error
    else:
        raise PolycError(f"an ONNX model is a ModelProto, a path or bytes, not {type(model).__name__}")
    if not copy.graph.node and not copy.graph.output:
        raise PolycError(f"{where}: the model has no graph (an empty or truncated file?)")
    _check_text(copy, "model", where)
    _check_element_types(copy.graph, "model.graph", where)
    skeleton = _skeleton(copy)
    try:
        onnx.checker.check_model(_with_any_shapes(skeleton))
    except onnx.checker.ValidationError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelError(f"{where}: the ONNX checker rejects the model: {first}") from error
    opset = default_opset(copy)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise PolycError(
            f"{where}: opset {opset} of the default domain; polyc converts opsets "
            f"{MIN_OPSET} to {newest} (the newest the installed onnx knows)"
        )
    if opset < MIN_OPSET:
        copy = _upgraded(copy, opset, where)
        skeleton = _skeleton(copy)
    _check_nodes(skeleton, where)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes are also computed per call; inference only helps
        inferred = None
    if inferred is not None:
        del copy.graph.value_info[:]
        copy.graph.value_info.extend(inferred.graph.value_info)
        del copy.graph.output[:]
        copy.graph.output.extend(inferred.graph.output)
    _check_input_types(copy.graph, default_opset(copy), where)
    return copy, where


def _check_input_types(graph, opset: int, where: str) -> None:
    """Every node of the default domain against its schema's inputs, as onnxruntime checks them
    when it loads a model and onnx's inference lets pass: a required input left empty, and an
    input whose known element type is not one its type parameter allows or differs from the
    type another input bound that parameter to (a Gemm of float and int32 matrices)."""
    onnx = _onnx()
    types = {t.name: t.data_type for t in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types.setdefault(value.name, value.type.tensor_type.elem_type)
    option = onnx.defs.OpSchema.FormalParameterOption
    for position, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        if not schema.inputs:
            continue
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        name = node.name or f"{node.op_type}_{position}"
        bound: dict[str, tuple[str, int]] = {}
        for index, value in enumerate(node.input):
            formal = schema.inputs[min(index, len(schema.inputs) - 1)]
            if index >= len(schema.inputs) and formal.option != option.Variadic:
                break  # more inputs than the schema has: the checker's to refuse
            if not value:
                if formal.option != option.Optional:
                    raise ModelError(
                        f"{where}: node {name!r} ({node.op_type}): input {index} ({formal.name}) is required but empty"
                    )
                continue
            if value not in types:
                continue
            elem_type = types[value]
            if elem_type not in onnx.TensorProto.DataType.values():
                continue
            actual = f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})"
            if formal.type_str in allowed:
                if actual not in allowed[formal.type_str]:
                    raise ModelError(
                        f"{where}: node {name!r} ({node.op_type}): input {index} {value!r} is {actual}, "
                        f"which its type parameter {formal.type_str} does not allow"
                    )
                if formal.option == option.Variadic and not formal.is_homogeneous:
                    continue
                first = bound.setdefault(formal.type_str, (actual, index))
                if first[0] != actual:
                    raise ModelError(
                        f"{where}: node {name!r} ({node.op_type}): input {index} {value!r} is {actual}, "
                        f"but input {first[1]} bound its type parameter {formal.type_str} to {first[0]}"
                    )
            elif formal.type_str.startswith("tensor(") and actual != formal.type_str:
                raise ModelError(
                    f"{where}: node {name!r} ({node.op_type}): input {index} {value!r} is {actual}, not {formal.type_str}"
                )


def _check_text(message, path: str, where: str) -> None:
    """Refuses text fields (names, op types, attributes' strings...) anywhere in ``message``
    that are not UTF-8, as onnxruntime does: protobuf hands them over as bytes, or fails when
    one is read.  Tensors are not visited (their data are not text)."""
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message

    try:
        fields = message.ListFields()
    except UnicodeDecodeError as error:
        raise ModelError(f"{where}: {path} holds text that is not UTF-8 ({error.object[:40]!r})") from error
    for field, value in fields:
        if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
            continue
        repeated = not isinstance(value, (str, bytes, Message))
        for position, item in enumerate(value if repeated else [value]):
            at = f"{path}.{field.name}" + (f"[{position}]" if repeated else "")
            if isinstance(item, bytes):
                raise ModelError(f"{where}: {at} is not UTF-8 text ({item[:40]!r})")
            if isinstance(item, Message) and field.message_type.name != "TensorProto":
                _check_text(item, at, where)


def _check_element_types(graph, path: str, where: str) -> None:
    """Refuses an element type that is no ONNX data type (a number TensorProto.DataType does not
    name) in an initializer, a constant attribute or a declared value of ``graph`` or of its
    subgraphs, as onnxruntime does; onnx's own readers fail on one with a raw ValueError."""
    onnx = _onnx()
    known = set(onnx.TensorProto.DataType.values())
    for field in ("initializer", "input", "output", "value_info"):
        for position, item in enumerate(getattr(graph, field)):
            if field == "initializer":
                elem_type, undefined_allowed = item.data_type, False
            elif item.type.HasField("tensor_type"):
                elem_type, undefined_allowed = item.type.tensor_type.elem_type, field == "value_info"
            else:
                continue
            if elem_type not in known or (elem_type == onnx.TensorProto.UNDEFINED and not undefined_allowed):
                raise ModelError(
                    f"{where}: {path}.{field}[{position}] {item.name!r} has element type {elem_type}, no ONNX data type"
                )
    for position, node in enumerate(graph.node):
        for attribute in node.attribute:
            at = f"{path}.node[{position}] {node.name or node.op_type!r} attribute {attribute.name!r}"
            for tensor in [attribute.t] if attribute.HasField("t") else list(attribute.tensors):
                if tensor.data_type not in known or tensor.data_type == onnx.TensorProto.UNDEFINED:
                    raise ModelError(f"{where}: {at} is a tensor of element type {tensor.data_type}, no ONNX data type")
            for index, subgraph in enumerate([attribute.g] if attribute.HasField("g") else list(attribute.graphs)):
                _check_element_types(subgraph, f"{at}[{index}]", where)


def _check_nodes(skeleton, where: str) -> None:
    """Every node's attributes, input types and shapes, as far as they are known before a run,
    checked against the ONNX specification by onnx's shape inference in strict mode, as
    onnxruntime checks them when it loads a model: a Transpose ``perm`` that is no permutation,
    a Gemm of a 1-D matrix, a float Reshape shape, Conv strides of 0 or negative pads are
    refused here, naming the node, rather than failing later in a converter.  The model's own
    ``value_info`` and output shapes are left out, and a subgraph's declared shape that
    disagrees with inference is let pass: onnxruntime merges shapes leniently, so a hint that
    disagrees with inference is no reason to refuse a model (types are not hints)."""
    onnx = _onnx()
    checked = onnx.ModelProto()
    checked.CopyFrom(skeleton)
    del checked.graph.value_info[:]
    for output in checked.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    for position, node in enumerate(checked.graph.node):
        node.name = node.name or f"{node.op_type}_{position}"  # as the plan names it
    try:
        onnx.shape_inference.infer_shapes(checked, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as error:
        text = " ".join(str(error).split())
        found = re.search(r"\(op_type:([\w.]+), node name: (.*?)\): \[\w+\] (.*)", text)
        if found is None:
            raise ModelError(f"{where}: the model breaks the ONNX specification: {text}") from error
        op_type, node, problem = found.groups()
        if problem.startswith("Inference error(s)"):
            return  # in the body onnx expands a function to (its own slips: MVN of opset 9)
        if problem.startswith("Can't merge shape info"):
            return  # a subgraph's declared shape: onnxruntime merges shapes leniently
        raise ModelError(f"{where}: node {node!r} ({op_type}) breaks the ONNX specification: {problem}") from error


def _upgraded(model, opset: int, where: str):
    """``model``, of an opset older than polyc's converters (PyTorch's exports of 2017 are
    opset 6), brought to :data:`MIN_OPSET` by onnx's version converter: its adapters rewrite
    the few operators whose meaning changed (opset 7 made Add's ``broadcast`` attribute numpy
    broadcasting, BatchNormalization dropped ``spatial``...)."""
    from onnx import version_converter

    _per_channel_prelu_slopes(model)
    try:
        upgraded = version_converter.convert_version(model, MIN_OPSET)
    except Exception as error:  # noqa: BLE001 - the converter raises several kinds
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise PolycError(
            f"{where}: opset {opset} of the default domain; polyc converts opsets {MIN_OPSET} and "
            f"newer, and onnx's version converter could not bring it there ({first})"
        ) from error
    return upgraded


def _per_channel_prelu_slopes(model) -> None:
    """Before opset 7, a PRelu slope of C values applied per channel (axis 1); from opset 7 it
    broadcasts as numpy does, aligned right, and onnx's converter leaves it as it is.  So a
    constant slope of shape (C,) before an input of rank r > 2 becomes (C, 1, ..., 1) here
    (``model`` is polyc's own copy)."""
    onnx = _onnx()
    prelus = [node for node in model.graph.node if node.op_type == "PRelu" and len(node.input) > 1]
    if not prelus:
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - without ranks the slopes stay as they are
        return
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim)
        for v in list(inferred.graph.input) + list(inferred.graph.value_info)
        if v.type.tensor_type.HasField("shape")
    }
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    for node in prelus:
        slope, rank = initializers.get(node.input[1]), ranks.get(node.input[0], 0)
        if slope is not None and len(slope.dims) == 1 and slope.dims[0] > 1 and rank > 2:
            slope.dims.extend([1] * (rank - 2))
            for declared in model.graph.input:  # an initializer may also be declared an input
                if declared.name == slope.name and declared.type.tensor_type.HasField("shape"):
                    for _ in range(rank - 2):
                        declared.type.tensor_type.shape.dim.add().dim_value = 1


#: Initializers with more elements than this are left out of the model that the checker and
#: shape inference see (graph inputs of the same type and shape stand in for them).
_SKELETON_ELEMENTS = 4096


def _with_any_shapes(model):
    """``model`` for onnx's checker, which wants a shape on every graph input and output:
    where one has none (its rank unknown, as onnxruntime accepts), an empty one stands in, on a
    copy (the checker does not compare it with what the nodes compute)."""
    import onnx

    missing = [
        v
        for v in list(model.graph.input) + list(model.graph.output)
        if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")
    ]
    if not missing:
        return model
    checked = onnx.ModelProto()
    checked.CopyFrom(model)
    for value in list(checked.graph.input) + list(checked.graph.output):
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()
    return checked


def _skeleton(model):
    """``model`` with its large initializers as typed graph inputs instead: what onnx's checker
    and shape inference need (small initializers stay, for shapes computed from their values),
    without serialising the weights twice (resnet18's 45 MB: a large share of a warm start)."""
    onnx = _onnx()
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    inputs = {i.name for i in graph.input}
    kept = []
    for tensor in graph.initializer:
        if int(np.prod(tensor.dims, dtype=np.int64)) <= _SKELETON_ELEMENTS:
            kept.append(tensor)
        elif tensor.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    if len(kept) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return skeleton


def default_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def initializers(graph) -> dict[str, np.ndarray]:
    """The graph's initializers as arrays; one whose data do not fill its dims (or overfill
    them) is a :class:`ModelError` naming it, as onnxruntime refuses it."""
    return {tensor.name: initializer_array(tensor) for tensor in graph.initializer}


def initializer_array(tensor) -> np.ndarray:
    """One initializer's array; data that do not fill its dims (or overfill them) are a
    :class:`ModelError` naming it, as onnxruntime refuses them."""
    onnx = _onnx()
    try:
        return onnx.numpy_helper.to_array(tensor)
    except (ValueError, TypeError, KeyError) as error:
        known = tensor.data_type in onnx.TensorProto.DataType.values()
        name = onnx.TensorProto.DataType.Name(tensor.data_type) if known else str(tensor.data_type)
        raise ModelError(
            f"initializer {tensor.name!r}: its data do not match its dims {list(tensor.dims)} and type {name} ({error})"
        ) from error
