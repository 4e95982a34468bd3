"""The registry of kernel paths: every way polyc compiles a def, in the order they are tried.

:data:`KERNEL_PATHS` lists them; the first whose back ends include the options' and whose
``recognise`` matches the def compiles it (:func:`choose_path`).  The generic path matches
every def, so it comes last.  The driver, the tuner and the explanations all choose through
here.  Adding a path is one module that builds a :class:`~polyc.paths.base.KernelPath` (see
:mod:`polyc.paths.base` and the architecture page's "Adding a kernel path") and one entry below,
placed before the paths it should win over.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from polyc.errors import PolycError
from polyc.options import BLOCK_OPTIONS, Options
from polyc.paths import (
    depthwise,
    direct_convolution,
    gemm,
    gemv,
    generic,
    gpu_mapping,
    integer_depthwise,
    integer_gemm,
    pointwise_depthwise,
    segments,
    transpose,
    user_schedule,
    winograd,
)
from polyc.paths.base import KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning

KERNEL_PATHS: tuple[KernelPath, ...] = (
    gpu_mapping.PATH,
    user_schedule.PATH,
    gemv.PATH,
    gemm.PATH,
    integer_gemm.PATH,
    integer_depthwise.PATH,
    winograd.PATH,
    depthwise.PATH,
    direct_convolution.PATH,
    pointwise_depthwise.PATH,
    segments.PATH,
    transpose.PATH,
    generic.PATH,
)

_BY_NAME = {path.name: path for path in KERNEL_PATHS}


def kernel_path(name: str) -> KernelPath:
    """The registered path called ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise PolycError(f"no kernel path is called {name!r}; the paths are: {', '.join(_BY_NAME)}") from None


def choose_path(request: PathRequest) -> tuple[KernelPath, object]:
    """The path that compiles ``request``'s def, and what it recognised."""
    recurrence = request.definition.has_sequential_loops
    for path in KERNEL_PATHS:
        if request.options.backend in path.backends and (path.sequential_loops or not recurrence):
            match = path.recognise(request)
            if match is not None:
                return path, match
    if recurrence:
        raise PolycError(
            f"{request.definition.name}: a def with a recurrence (a sequential loop) compiles on the C back end "
            f"only, not on {request.options.backend!r}"
        )
    raise PolycError(f"{request.definition.name}: no kernel path compiles for the back end {request.options.backend!r}")


def settle_options(path: KernelPath, options: Options, requested: Options | None) -> Options:
    """The options ``path`` compiles its def with.

    A deprecated ``tile_sizes`` becomes the path's own block option (:attr:`KernelPath.tile_alias`),
    with a DeprecationWarning naming it when the user gave ``tile_sizes`` (``requested``: the
    options the user asked for, before tuning records were applied).  A block option
    (:data:`polyc.options.BLOCK_OPTIONS`) the path does not read is a PolycError when the user
    gave it, and dropped when a tuning record did.  ``requested`` None: the def is a part of a
    larger one (a segment), whose other parts may read what this one does not: dropped.
    """
    if path.compiles_parts:
        return options
    changes: dict[str, object] = {}
    if options.tile_sizes is not None:
        became = path.tile_alias(options.tile_sizes) if path.tile_alias is not None else {}
        changes.update({name: value for name, value in became.items() if getattr(options, name) is None})
        changes["tile_sizes"] = None
        if requested is not None and requested.tile_sizes is not None:
            what = ", ".join(f"{name}={value!r}" for name, value in became.items()) or "nothing (it takes no sizes)"
            warnings.warn(
                f"tile_sizes is deprecated: on the {path.name} path, which compiles this def, "
                f"tile_sizes={options.tile_sizes!r} became {what}; pass that instead",
                DeprecationWarning,
                stacklevel=2,
            )
    for name, meaning in BLOCK_OPTIONS.items():
        if name in path.options or getattr(options, name) is None or name in changes:
            continue
        if requested is not None and getattr(requested, name) is not None:
            takes = [n for n in BLOCK_OPTIONS if n in path.options]
            raise PolycError(
                f"{name} sets {meaning}, but this def compiles on the {path.name} path, which takes "
                + (f"{', '.join(takes)} instead" if takes else "no block sizes")
            )
        changes[name] = None
    return options.replace(**changes) if changes else options


def upgraded_options(path: KernelPath, options: Mapping) -> dict:
    """Options a tuning record holds, as this polyc names them: a ``tile_sizes`` (records written
    before the block options had names of their own) becomes the path's own block option."""
    options = dict(options)
    if "tile_sizes" in options:
        sizes = options.pop("tile_sizes")
        if sizes is not None and path.tile_alias is not None:
            became = path.tile_alias(tuple(sizes))
            options.update({name: list(v) if isinstance(v, tuple) else v for name, v in became.items()})
    return options


__all__ = [
    "KERNEL_PATHS",
    "KernelPath",
    "Knob",
    "PathKernel",
    "PathRequest",
    "SpaceRequest",
    "Tuning",
    "choose_path",
    "kernel_path",
    "settle_options",
    "upgraded_options",
]
