"""polyc: a polyhedral compiler for Tensor-Comprehensions-style tensor kernels.

``polyc.define(source)`` compiles TC source into callable kernels; ``polyc.einsum`` is a
drop-in for ``numpy.einsum`` built on the same compiler.
"""

import logging

from polyc.api import Kernel, Module, define
from polyc.errors import (
    BoundsError,
    BroadcastInputError,
    CacheError,
    CompilationError,
    IllegalScheduleError,
    ModelError,
    PolycError,
    PolycWarning,
    RangeInferenceError,
    SignatureError,
    TCSemanticError,
    TCSyntaxError,
    UnsupportedError,
)
from polyc.frontends.einsum import einsum
from polyc.tuning import tune
from polyc.version import __version__

__all__ = [
    "define",
    "einsum",
    "tune",
    "Module",
    "Kernel",
    "PolycError",
    "TCSyntaxError",
    "TCSemanticError",
    "RangeInferenceError",
    "BoundsError",
    "SignatureError",
    "BroadcastInputError",
    "UnsupportedError",
    "ModelError",
    "CompilationError",
    "IllegalScheduleError",
    "CacheError",
    "PolycWarning",
    "__version__",
]

# polyc logs on "polyc" and its children (polyc.runtime.cache, polyc.frontends.onnx.plan, ...);
# nothing is shown unless the application configures logging.
logging.getLogger("polyc").addHandler(logging.NullHandler())
