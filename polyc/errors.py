"""The exceptions polyc raises.  Every error a user can cause derives from :class:`PolycError`.

Errors that come from a place in TC source carry a :class:`SourceLocation`; their message
starts with ``file:line:col`` and, when the source text is known, ends with the offending line
and a caret under the column, as compilers do.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    """A position in TC source: 1-based line and column, plus the file name for messages."""

    line: int
    col: int
    filename: str = "<tc>"

    def __str__(self) -> str:
        return f"{self.filename}:{self.line}:{self.col}"


class PolycError(Exception):
    """Base class of every error polyc reports to its users."""

    def __init__(self, message: str, location: SourceLocation | None = None, source: str | None = None):
        self.message = message
        self.location = location
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        if self.location is None:
            return self.message
        text = f"{self.location}: {self.message}"
        if self.source is not None:
            lines = self.source.split("\n")  # the lexer counts lines by "\n" alone
            if 1 <= self.location.line <= len(lines):
                line = lines[self.location.line - 1].rstrip("\r").expandtabs(1)
                text += "\n    " + line + "\n    " + " " * (self.location.col - 1) + "^"
        return text


class TCSyntaxError(PolycError):
    """The source text is not valid TC: a bad token or a construct the grammar does not allow."""


class TCSemanticError(PolycError):
    """The source parses but means nothing: unknown names, rank or type mismatches, bad statements."""


class RangeInferenceError(TCSemanticError):
    """The range of an index cannot be inferred from the accesses; a ``where`` clause is needed."""


class BoundsError(PolycError):
    """An access can fall outside its tensor, found at define time (isl) or at run time (gathers)."""


class SignatureError(PolycError):
    """A call's arguments do not fit the definition: wrong count, shapes, dtypes or sizes."""


class BroadcastInputError(SignatureError):
    """An input is a broadcast view (a stride-0 axis, as ``numpy.broadcast_to`` makes) whose
    contiguous copy, which compiled kernels read, would exceed the memory polyc spends on its own."""


class UnsupportedError(PolycError):
    """A valid request polyc does not support (yet): an option value, an einsum form, an ONNX op."""


class ModelError(PolycError):
    """An ONNX model breaks the ONNX specification: a node's attributes, input types or shapes,
    or an initializer's data (the message names the node or initializer)."""


class CompilationError(PolycError):
    """The C compiler failed on generated code, or could not be run at all."""


class CacheError(PolycError):
    """The kernel cache cannot be used (an unwritable directory, say)."""


class PolycWarning(UserWarning):
    """A def that is valid but probably not what its author meant (shown with Python's warnings)."""


class IllegalScheduleError(PolycError):
    """A schedule given with ``schedule=`` breaks a dependence: ``violations`` lists each broken
    kind with a witness pair of statement instances (:class:`polyc.schedule.user.Violation`)."""

    def __init__(self, message: str, violations: tuple = ()):
        super().__init__(message)
        self.violations = violations
