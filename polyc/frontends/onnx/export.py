"""A planned ONNX model as a C project (:mod:`polyc.runtime.model_export`): what
``InferenceSession.export`` writes.

The plan (:class:`~polyc.frontends.onnx.plan.Plan`) already holds everything a run does: its
groups in order, the views between them, the arena's offsets (:mod:`.memory`), the constants.
This module only says where each tensor lives in C:

* the model's inputs are the caller's pointers; a graph output computed by a kernel (or a
  reshape of one) is written straight into the caller's output buffer;
* the constants are packed, 64-byte aligned, into the weights;
* the values the memory plan placed keep their offsets in the arena; after them come the kernel
  outputs it leaves out (those read before they are all written, which start as zeros in every
  run), then one region that every call's temporaries share;
* a view is its source's place, moved by its offset;
* a graph output that is none of its kernel's (an input passed through, a constant, a part of
  a tensor) is copied at the end of the run.

Each distinct kernel is generated again under a name of its own (``polyc_PREFIX_kN``: the def
renamed, so the code generators name the entry function), for the target's flags and caches.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, cast

import numpy as np

from polyc.driver import compile_stages
from polyc.errors import PolycError, UnsupportedError
from polyc.frontends.onnx.lowering import Value, ViewStep
from polyc.frontends.onnx.memory import ALIGNMENT
from polyc.frontends.onnx.plan import Group, Plan
from polyc.lang.checked import Role
from polyc.runtime.model_export import ExportCall, ExportTensor, ModelExport, Place
from polyc.runtime.pool import POOL_C
from polyc.runtime.tuning_records import tuned_options
from polyc.target import Target

if TYPE_CHECKING:
    from polyc.api import Kernel
    from polyc.codegen.c import GeneratedKernel


def export_plan(plan: Plan, target: Target, prefix: str, tuned: bool, about: list[str]) -> ModelExport:
    """The C project of ``plan`` for ``target`` (``tuned``: generate each kernel with this
    machine's tuning records, as the session's own calls do: only for the host)."""
    if plan.continuation is not None:
        raise data_dependent_error(plan)
    kernels, kernel_of = _generated_kernels(plan, prefix, tuned)
    places, direct, arena_end = _places(plan)
    weights = _Weights()
    view_of = {item.target.ident: item for item in plan.order if isinstance(item, ViewStep)}

    def place(value: Value) -> Place:
        if value.const is not None:
            return weights.place(value)
        if value.ident in places:
            return places[value.ident]
        view = view_of.get(value.ident)
        if view is None:
            raise AssertionError(f"value {value.ident} ({value.onnx_name}) has no place in the export")
        return place(view.source).moved(view.offset * value.dtype.itemsize)

    calls, temporaries_end = [], arena_end
    for group in (item for item in plan.order if isinstance(item, Group)):
        compiled = cast("Kernel", group.kernel)
        number = kernel_of[id(compiled)]
        kernel = kernels[number]
        definition = compiled.definition
        by_name = {name: ident for ident, name in group.tensor_names.items()}
        values = {v.ident: v for v in group.inputs + group.outputs}
        arguments, zeroed = [], []
        temporary_at = arena_end
        for name in kernel.tensor_arguments:
            tensor = definition.tensor(name)
            if tensor.role is Role.TEMPORARY:
                nbytes = int(np.prod(tensor.concrete_shape({}), dtype=np.int64)) * tensor.dtype.itemsize
                where = Place("arena", temporary_at)
                temporary_at += _rounded(nbytes)
                if name not in compiled.written_before_read:
                    zeroed.append((where, nbytes))
                arguments.append(where)
                continue
            value = values[by_name[name]]
            where = place(value)
            if tensor.role is Role.OUTPUT and not group.starts_unread(value):
                zeroed.append((where, _nbytes(value)))
            arguments.append(where)
        temporaries_end = max(temporaries_end, temporary_at)
        calls.append(
            ExportCall(number, tuple(arguments), tuple(zeroed), f"{group.name} (nodes {', '.join(group.nodes)})")
        )
    outputs = tuple(
        (ExportTensor(name, np.dtype(value.dtype), tuple(value.shape)), None if direct.get(k) else place(value))
        for k, (name, value) in enumerate(zip(plan.output_names, plan.outputs))
    )
    inputs = tuple(ExportTensor(v.onnx_name, np.dtype(v.dtype), tuple(v.shape)) for v in plan.inputs)
    groups = [item for item in plan.order if isinstance(item, Group)]
    description = [
        *about,
        f"{len(groups)} kernel calls of {len(kernels)} kernels:",
        *(
            f"  call {n}: kernel {kernel_of[id(g.kernel)]}, {g.name} (nodes {', '.join(g.nodes)})"
            for n, g in enumerate(groups)
        ),
    ]
    return ModelExport(
        prefix,
        target,
        tuple(kernels),
        tuple(calls),
        inputs,
        outputs,
        weights.data(),
        temporaries_end,
        tuple(description),
        support=(("polyc_pool.c", POOL_C),),
    )


def data_dependent_error(plan: Plan) -> UnsupportedError:
    """The error for a plan that stops to learn values computed from data (:mod:`.stages`)."""
    continuation = plan.continuation
    assert continuation is not None
    waiting = [item.proto for item in continuation.nodes if hasattr(item, "proto")]
    probes = set(continuation.probes)
    needing = [p for p in waiting if probes & set(p.input)] or waiting
    named = ", ".join(f"{p.op_type} {p.name!r}" if p.name else p.op_type for p in needing[:8])
    return UnsupportedError(
        "the model cannot be exported: it is planned in stages, because "
        f"{'some nodes need' if len(needing) > 1 else 'a node needs'} values computed from data "
        f"({', '.join(map(repr, continuation.probes))}) before their shapes are known: {named}"
        f"{' ...' if len(needing) > 8 else ''}. Data-dependent operators (NonZero, NonMaxSuppression, TopK "
        "with a computed k, ...) and values such an operator's output shapes depend on do not export; "
        "run the model with polyc.onnx.InferenceSession instead"
    )


def _generated_kernels(plan: Plan, prefix: str, tuned: bool):
    """Each distinct kernel of ``plan`` generated as ``polyc_PREFIX_kN``, in the order of its
    first call; and kernel (by id) -> N."""
    kernels: list[GeneratedKernel] = []
    kernel_of: dict[int, int] = {}
    for group in plan.groups:
        kernel = cast("Kernel", group.kernel)
        if id(kernel) in kernel_of:
            continue
        if kernel.definition.sizes:
            raise PolycError(
                f"{group.name} (nodes {', '.join(group.nodes)}): its kernel takes sizes known only when it "
                f"runs ({', '.join(kernel.definition.sizes)}), which an export cannot fix"
            )
        if kernel.options.backend != "c":
            raise PolycError(f"an export is C: the session's kernels are built for backend={kernel.options.backend!r}")
        number = len(kernels)
        definition = dataclasses.replace(kernel.definition, name=f"{prefix}_k{number}")
        options = tuned_options(kernel.definition, kernel.options, {}) if tuned else kernel.options
        kernels.append(compile_stages(definition, options, {}, None, kernel.options).kernel)
        kernel_of[id(kernel)] = number
    return kernels, kernel_of


def _places(plan: Plan) -> tuple[dict[str, Place], dict[int, bool], int]:
    """Where each kernel output lives (ident -> place), which graph outputs their kernel writes
    in place (output index -> True), and the arena's end before the temporaries."""
    places: dict[str, Place] = {v.ident: Place("input", 0, k) for k, v in enumerate(plan.inputs)}
    view_of = {item.target.ident: item for item in plan.order if isinstance(item, ViewStep)}
    written = {v.ident: v for group in plan.groups for v in group.outputs}
    for ident, offset in plan.memory.offsets.items():
        places[ident] = Place("arena", offset)
    direct: dict[int, bool] = {}
    for k, value in enumerate(plan.outputs):
        root, offset = value, 0
        while root.ident in view_of and root.const is None:
            view = view_of[root.ident]
            offset += view.offset * root.dtype.itemsize
            root = view.source
        if (
            root.const is None
            and root.ident in written
            and root.ident not in places
            and offset == 0
            and _nbytes(root) == _nbytes(value)
        ):
            places[root.ident] = Place("output", 0, k)
            direct[k] = True
    end = _rounded(plan.memory.size) if plan.memory.size else 0
    for ident, value in written.items():
        if ident not in places:
            places[ident] = Place("arena", end)
            end += _rounded(_nbytes(value))
    return places, direct, end


class _Weights:
    """The constants packed one after the other, each at a multiple of :data:`ALIGNMENT`."""

    def __init__(self):
        self._chunks: list[bytes] = []
        self._size = 0
        self._offsets: dict[int, int] = {}
        self._kept: list[np.ndarray] = []  # (ids stay unique while the arrays live)

    def place(self, value: Value) -> Place:
        array = value.const
        assert array is not None
        offset = self._offsets.get(id(array))
        if offset is None:
            data = np.ascontiguousarray(array, dtype=value.dtype).astype(value.dtype.newbyteorder("<"), copy=False)
            offset = self._size
            self._chunks.append(data.tobytes().ljust(_rounded(data.nbytes), b"\0"))
            self._size += _rounded(data.nbytes)
            self._offsets[id(array)] = offset
            self._kept.append(array)
        return Place("weights", offset)

    def data(self) -> bytes:
        return b"".join(self._chunks)


def _nbytes(value: Value) -> int:
    return int(value.size) * np.dtype(value.dtype).itemsize


def _rounded(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
