"""Progress bars over long compiles (a model's first run, :func:`polyc.driver.build_ahead`).

A bar is shown where someone watches: tqdm (``tqdm.auto``, a widget in a notebook) when it is
installed and the output is a terminal or a notebook.  ``progress=False`` (the option of
:class:`polyc.onnx.InferenceSession` and of ``build_ahead``) turns it off and
``progress=True`` on; left to the default, ``POLYC_PROGRESS`` decides: ``0`` (``off``, ``no``,
``false``) never, ``1`` (``on``, ``yes``, ``true``) always, even into a pipe or a file,
``auto`` (or unset) as above.  Another value is warned about once
(:func:`polyc.runtime.environment.check_environment`) and read as ``auto``.
"""

from __future__ import annotations

import os
import sys

from polyc.runtime.environment import PROGRESS_OFF, PROGRESS_ON, PROGRESS_VARIABLE, check_environment


def progress_wanted(progress: bool | None = None) -> bool:
    """Whether to show a bar: ``progress`` when given, else as ``POLYC_PROGRESS`` says, else
    when the output (standard error) is a terminal or a notebook; never without tqdm."""
    if progress is None:
        check_environment()  # a bad POLYC_PROGRESS is warned about before the compile it watches
        setting = os.environ.get(PROGRESS_VARIABLE, "").strip().lower()
        if setting in PROGRESS_OFF:
            return False
        progress = True if setting in PROGRESS_ON else _watched(sys.stderr)
    return progress and _tqdm() is not None


def progress_bar(total: int, description: str, *, initial: int = 0, unit: str = "kernel"):
    """A tqdm bar on standard error (a widget in a notebook), or None without tqdm."""
    tqdm = _tqdm()
    if tqdm is None:
        return None
    size = _unknown_terminal_size(sys.stderr)
    return tqdm(total=total, initial=initial, desc=description, unit=unit, file=sys.stderr, **size)


def _unknown_terminal_size(stream) -> dict:
    """A width and height for tqdm where the terminal says it has none (a pseudo-terminal
    nobody sized: tqdm 4.70 then trims its bar to nothing)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return {}
    return {"ncols": 80, "nrows": 24} if size.columns < 2 or size.lines < 2 else {}


def _watched(stream) -> bool:
    """Whether ``stream`` is a terminal or a Jupyter kernel's output (what tqdm.auto draws in)."""
    isatty = getattr(stream, "isatty", None)
    try:
        if isatty is not None and isatty():
            return True
    except ValueError:  # a closed stream
        return False
    return type(stream).__module__.startswith("ipykernel")


def _tqdm():
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm
