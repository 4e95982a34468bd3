"""The registry of kernel paths: every way polyc compiles a def, in the order they are tried.

:data:`KERNEL_PATHS` lists them; the first whose back ends include the options' and whose
``recognise`` matches the def compiles it (:func:`choose_path`).  The generic path matches
every def, so it comes last.  The driver, the tuner and the explanations all choose through
here.  Adding a path is one module that builds a :class:`~polyc.paths.base.KernelPath` (see
:mod:`polyc.paths.base` and the architecture page's "Adding a kernel path") and one entry below,
placed before the paths it should win over.
"""

from __future__ import annotations

from polyc.errors import PolycError
from polyc.paths import (
    depthwise,
    direct_convolution,
    gemm,
    gemv,
    generic,
    gpu_mapping,
    pointwise_depthwise,
    segments,
    winograd,
)
from polyc.paths.base import KernelPath, Knob, PathKernel, PathRequest, SpaceRequest, Tuning

KERNEL_PATHS: tuple[KernelPath, ...] = (
    gpu_mapping.PATH,
    gemv.PATH,
    gemm.PATH,
    winograd.PATH,
    depthwise.PATH,
    direct_convolution.PATH,
    pointwise_depthwise.PATH,
    segments.PATH,
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
    for path in KERNEL_PATHS:
        if request.options.backend in path.backends:
            match = path.recognise(request)
            if match is not None:
                return path, match
    raise PolycError(f"{request.definition.name}: no kernel path compiles for the back end {request.options.backend!r}")


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
]
