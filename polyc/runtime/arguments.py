"""Checking a call's arguments against a def's signature and binding its sizes.

Shared by the reference interpreter and compiled kernels, so both accept and reject exactly the
same calls with the same messages.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from polyc.errors import BroadcastInputError, SignatureError
from polyc.lang.checked import CheckedDef, Role, Tensor


@dataclass(frozen=True)
class BoundCall:
    """A call's concrete sizes and arrays: inputs as given, outputs as given or freshly
    allocated (see :meth:`new_array`)."""

    sizes: dict[str, int]
    arrays: dict[str, np.ndarray]
    #: every tensor's concrete shape (temporaries too)
    shapes: dict[str, tuple[int, ...]]
    #: outputs and temporaries the def overwrites entirely before reading them
    written_before_read: frozenset[str] = frozenset()

    def shape_of(self, definition: CheckedDef, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def new_array(self, tensor: Tensor) -> np.ndarray:
        """A fresh array for an output or temporary: zeroed, as TC starts them, unless the def
        overwrites it entirely before reading it."""
        return allocate(self.shapes[tensor.name], tensor.dtype, tensor.name in self.written_before_read)


def allocate(shape: tuple[int, ...], dtype: np.dtype, uninitialised: bool) -> np.ndarray:
    """A fresh output or temporary: zeroed, or not when the def overwrites it before reading."""
    return (allocate_uninitialised if uninitialised else np.zeros)(shape, dtype=dtype)


def as_input_array(definition: CheckedDef, tensor: Tensor, value) -> np.ndarray:
    where = f"{definition.name}: input '{tensor.name}'"
    if tensor.rank == 0 and isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, np.ndarray):
        return _scalar_to_array(where, tensor, value)
    if not isinstance(value, np.ndarray):
        raise SignatureError(f"{where} must be a numpy array, not {type(value).__name__}")
    if value.ndim == tensor.rank and value.dtype.newbyteorder("=") == tensor.dtype:
        _check_broadcast_copy(where, value)
    if value.dtype != tensor.dtype and value.dtype.newbyteorder("=") == tensor.dtype:
        # The same type in the other byte order: read through a native copy, as numpy's own
        # functions do (the caller's array is left as it is).
        value = value.astype(tensor.dtype)
    if value.dtype != tensor.dtype:
        raise SignatureError(
            f"{where} must have dtype {tensor.dtype.name}, not {value.dtype.name} "
            f"(convert it with .astype(numpy.{tensor.dtype.name}))"
        )
    if value.ndim != tensor.rank:
        raise SignatureError(f"{where} must have {tensor.rank} dimension(s), not {value.ndim} (shape {value.shape})")
    return value


#: The largest contiguous copy (bytes) polyc makes of a broadcast input by itself: kernels read
#: C-contiguous arrays, and a stride-0 view of one element can stand for gigabytes.
BROADCAST_COPY_LIMIT = 1 << 30


def _check_broadcast_copy(where: str, value: np.ndarray) -> None:
    """Refuse a broadcast view (an axis of extent > 1 with stride 0) whose contiguous copy would
    take more than :data:`BROADCAST_COPY_LIMIT` bytes, saying how to pass it instead."""
    axes = [axis for axis, (extent, stride) in enumerate(zip(value.shape, value.strides)) if stride == 0 and extent > 1]
    copy_bytes = value.size * value.dtype.itemsize
    if not axes or copy_bytes <= BROADCAST_COPY_LIMIT:
        return
    distinct = value[tuple(0 if axis in axes else slice(None) for axis in range(value.ndim))]
    raise BroadcastInputError(
        f"{where} is a broadcast view (stride 0 along {'axis' if len(axes) == 1 else 'axes'} "
        f"{', '.join(map(str, axes))} of shape "
        f"{value.shape}, {distinct.size} distinct element(s)): compiled kernels read C-contiguous "
        f"arrays, and its copy would take {_bytes(copy_bytes)}, more than the {_bytes(BROADCAST_COPY_LIMIT)} "
        f"polyc copies by itself. Pass numpy.ascontiguousarray(...) of it if that memory is meant to "
        f"be spent; otherwise pass the array before broadcasting and broadcast inside the def (an "
        f"input of the smaller shape, indexed without the broadcast axes)"
    )


def _bytes(count: int) -> str:
    """``count`` bytes in GiB or MiB, for messages."""
    return f"{count / (1 << 30):.1f} GiB" if count >= 1 << 30 else f"{count / (1 << 20):.1f} MiB"


def _scalar_to_array(where: str, tensor: Tensor, value) -> np.ndarray:
    """A Python or numpy scalar for a 0-d input, converted only when no value is lost."""
    dtype = tensor.dtype
    if isinstance(value, np.generic) and value.dtype == dtype:
        return np.asarray(value)
    if dtype.kind in "iu":
        if (
            isinstance(value, (bool, np.bool_))
            or not float(value).is_integer()
            or isinstance(value, (float, np.floating))
        ):
            raise SignatureError(f"{where} is {dtype.name}; got {value!r}")
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise SignatureError(f"{where} is {dtype.name}; {value} is out of its range")
        return np.asarray(int(value), dtype=dtype)
    if dtype.kind == "b" and not isinstance(value, (bool, np.bool_)):
        raise SignatureError(f"{where} is bool; got {value!r}")
    if isinstance(value, complex) or isinstance(value, np.complexfloating):
        raise SignatureError(f"{where} is {dtype.name}; got the complex value {value!r}")
    return np.asarray(value, dtype=dtype)


#: The most size signatures a shape memo keeps.
_SHAPE_MEMO_SIZE = 256

#: How outputs that need no zeros are allocated (the tests poison them through this).
allocate_uninitialised = np.empty


def bind_arguments(
    definition: CheckedDef,
    args,
    outputs=None,
    written_before_read: frozenset[str] = frozenset(),
    shape_memo: dict | None = None,
) -> BoundCall:
    """Check ``args`` (one per input) and ``outputs`` (None, or one array per output) against
    the signature; infer the sizes from the inputs; allocate outputs when none are given:
    zeroed, except those named in ``written_before_read``, which the def overwrites entirely
    before reading (:func:`polyc.ir.coverage.written_before_read`; temporaries named there are
    allocated the same way by :meth:`BoundCall.new_array`).

    ``shape_memo``, a dict the caller keeps for one def, remembers the tensors' shapes per size
    signature: evaluating them is a third of the Python time of a call on small arrays.

    Raises SignatureError naming the argument and what was expected.
    """
    args = tuple(args)
    if len(args) != len(definition.inputs):
        names = ", ".join(definition.inputs) or "none"
        raise SignatureError(f"{definition.name} takes {len(definition.inputs)} input(s) ({names}), got {len(args)}")
    arrays = {
        name: as_input_array(definition, definition.tensor(name), value) for name, value in zip(definition.inputs, args)
    }

    sizes: dict[str, int] = {}
    for binding in definition.size_bindings:
        array = arrays[binding.tensor]
        if binding.dim is None:
            value = int(array)
            if value < 0:
                raise SignatureError(
                    f"{definition.name}: input '{binding.tensor}' is used as a size "
                    f"and must not be negative (got {value})"
                )
        else:
            value = array.shape[binding.dim]
        sizes[binding.size] = value

    signature = tuple(sizes[s] for s in definition.sizes)
    shapes = shape_memo.get(signature) if shape_memo is not None else None
    if shapes is None:
        shapes = {tensor.name: tensor.concrete_shape(sizes) for tensor in definition.tensors}
        if shape_memo is not None and len(shape_memo) < _SHAPE_MEMO_SIZE:
            shape_memo[signature] = shapes

    for name in definition.inputs:
        tensor = definition.tensor(name)
        expected = shapes[name]
        if arrays[name].shape != expected:
            detail = ", ".join(f"{s}={sizes[s]}" for s in definition.sizes)
            raise SignatureError(
                f"{definition.name}: input '{name}' has shape {arrays[name].shape} but the "
                f"signature requires {_spell_shape(tensor)} = {expected} (sizes {detail})"
            )

    for tensor in definition.tensors:
        if tensor.role is Role.INPUT:
            continue
        shape = shapes[tensor.name]
        if any(extent < 0 for extent in shape):
            detail = ", ".join(f"{s}={sizes[s]}" for s in definition.sizes)
            raise SignatureError(
                f"{definition.name}: for sizes {detail}, {tensor.role.value} '{tensor.name}' "
                f"would have shape {shape}; the inputs are too small"
            )

    call = BoundCall(sizes, arrays, shapes, written_before_read)
    if outputs is None:
        for name in definition.outputs:
            arrays[name] = call.new_array(definition.tensor(name))
    else:
        outputs = tuple(outputs)
        if len(outputs) != len(definition.outputs):
            raise SignatureError(
                f"{definition.name} has {len(definition.outputs)} output(s), got {len(outputs)} in outputs="
            )
        for name, array in zip(definition.outputs, outputs):
            tensor = definition.tensor(name)
            where = f"{definition.name}: output '{name}'"
            if not isinstance(array, np.ndarray):
                raise SignatureError(f"{where} must be a numpy array, not {type(array).__name__}")
            expected = shapes[name]
            if array.dtype != tensor.dtype and array.dtype.newbyteorder("=") == tensor.dtype:
                raise SignatureError(
                    f"{where} is {tensor.dtype.name} in {_byte_order(array.dtype)} byte order "
                    f"('{array.dtype.str}'); kernels write in the machine's byte order: pass "
                    f"numpy.empty({expected}, numpy.{tensor.dtype.name}), and convert the result "
                    f"with .astype('{array.dtype.str}') if needed"
                )
            if array.dtype != tensor.dtype or array.shape != expected:
                raise SignatureError(
                    f"{where} must be a {tensor.dtype.name} array of shape {expected}, "
                    f"not {array.dtype.name} {array.shape}"
                )
            if not array.flags.writeable:
                raise SignatureError(f"{where} is read-only")
            if any(_overlap(array, other) for other in arrays.values()):
                raise SignatureError(f"{where} overlaps another argument")
            arrays[name] = array
    return call


def _byte_order(dtype: np.dtype) -> str:
    return "big-endian" if dtype.byteorder == ">" else "little-endian"


def _overlap(a: np.ndarray, b: np.ndarray) -> bool:
    try:
        # numpy's stub allows only -1 and 0, but the function takes any bound on the work.
        return bool(np.shares_memory(a, b, max_work=100_000))  # type: ignore[arg-type]
    except np.exceptions.TooHardError:
        return True  # cannot tell cheaply; refusing is safer than a silently wrong result


def _spell_shape(tensor: Tensor) -> str:
    return "(" + ", ".join(str(e) for e in tensor.shape) + ("," if tensor.rank == 1 else "") + ")"
