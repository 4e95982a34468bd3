"""Element types: the TC type names, their numpy dtypes and their C spellings."""

from __future__ import annotations

import numpy as np

#: TC type name -> numpy dtype.  ``float`` is float32 as in TC.
TC_TYPES: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "half": np.dtype(np.float16),
    "float": np.dtype(np.float32),
    "float32": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "float64": np.dtype(np.float64),
}

#: numpy dtype -> C type used in generated code.  float16 is computed as _Float16 (gcc >= 12, x86).
C_TYPES: dict[np.dtype, str] = {
    np.dtype(np.bool_): "_Bool",
    np.dtype(np.int8): "int8_t",
    np.dtype(np.int16): "int16_t",
    np.dtype(np.int32): "int32_t",
    np.dtype(np.int64): "int64_t",
    np.dtype(np.uint8): "uint8_t",
    np.dtype(np.uint16): "uint16_t",
    np.dtype(np.uint32): "uint32_t",
    np.dtype(np.uint64): "uint64_t",
    np.dtype(np.float16): "_Float16",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}

FLOAT32 = np.dtype(np.float32)
INT32 = np.dtype(np.int32)
INT64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)


def tc_name(dtype: np.dtype) -> str:
    """The canonical TC spelling of a dtype (``float32``, ``int64``...)."""
    return np.dtype(dtype).name


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f"


def is_integer(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "iu"


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """The type of a binary arithmetic operation on values of types ``a`` and ``b``.

    numpy's promotion, except that bool takes part in arithmetic as int32 (as in C), an
    integer mixed with a float takes the float's type (as in C and TC: float32 * int32 and
    float32 / size are float32, where numpy would widen to float64), and mixing signed and
    unsigned 64-bit integers gives int64 rather than float64.
    """
    a, b = np.dtype(a), np.dtype(b)
    if a == BOOL and b == BOOL:
        return INT32
    if a == BOOL:
        return b if b != BOOL else INT32
    if b == BOOL:
        return a
    if (a.kind == "f") != (b.kind == "f"):
        return a if a.kind == "f" else b
    result = np.promote_types(a, b)
    if result.kind == "f" and a.kind in "iu" and b.kind in "iu":
        return INT64
    return result


def identity(op: str, dtype: np.dtype):
    """The identity of a reduction operator (``+``, ``*``, ``min``, ``max``) in ``dtype``: for a
    float sum -0, since x + -0 is x for every x (+0 + -0 is +0), while -0 + +0 is +0."""
    dtype = np.dtype(dtype)
    if op == "+":
        return dtype.type(-0.0 if dtype.kind == "f" else 0)
    if op == "*":
        return dtype.type(1)
    if dtype.kind == "f":
        return dtype.type(np.inf if op == "min" else -np.inf)
    if dtype == BOOL:
        return dtype.type(op == "min")
    info = np.iinfo(dtype)
    return dtype.type(info.max if op == "min" else info.min)
