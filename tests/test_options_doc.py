"""help(polyc.define) describes every option Options accepts, from Options' own docstring."""

from __future__ import annotations

import dataclasses
import pydoc

import polyc
from polyc.options import Options, options_reference


def test_help_of_define_lists_every_option():
    options = pydoc.render_doc(polyc.define, renderer=pydoc.plaintext).split("Options:", 1)[1]
    for field in dataclasses.fields(Options):
        assert f"``{field.name}``" in options, field.name


def test_an_option_left_out_of_the_description_is_caught(monkeypatch):
    # Negative control: Options' docstring without the ``threads`` item.
    doc = Options.__doc__
    start = doc.index("    - ``threads``")
    monkeypatch.setattr(Options, "__doc__", doc[:start] + doc[doc.index("\n    - ", start + 1) + 1 :])
    described = options_reference()
    assert "``threads``" not in described and "``tuning``" in described
