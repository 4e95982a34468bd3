"""Self-contained HTML pages for the views that draw themselves in HTML."""

from __future__ import annotations

import html


def write_page(path, title: str, fragment: str) -> None:
    """Write ``fragment`` (a view's HTML, with its style and script) as a page of its own."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
            f"<body>\n{fragment}\n</body></html>\n"
        )
