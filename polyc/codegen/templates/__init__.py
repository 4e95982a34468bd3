"""The C that kernels share, kept as ``.c`` files beside this module (package data).

Each file is a fragment of a translation unit, not a program: the module named by the file's
prefix reads it (``gemm_common.c`` by :mod:`polyc.codegen.gemm`) and fills in what it leaves
open, such as the element type ``T`` (:func:`polyc.codegen.pattern_kernel.typed`) or
``string.Template`` fields, before printing it into a kernel.  Keeping them as C files lets an
editor, a C linter and a reader see them as C.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def package_text(package: str, name: str) -> str:
    """The text of the file ``name`` stored in ``package`` (package data), exactly as stored."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def c_template(name: str) -> str:
    """The text of the C template file ``name`` in this package, exactly as stored."""
    return package_text(__package__, name)


__all__ = ["c_template", "package_text"]
