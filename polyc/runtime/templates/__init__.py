"""The C of an exported model that does not depend on the model, kept as ``.c`` files beside
this module (package data): :mod:`polyc.runtime.model_export` reads them and fills in the
model's prefix (``${prefix}``, ``${PREFIX}``) with :class:`string.Template`."""

from __future__ import annotations

from polyc.codegen.templates import package_text


def export_template(name: str) -> str:
    """The text of the C template file ``name`` in this package, exactly as stored."""
    return package_text(__package__, name)


__all__ = ["export_template"]
