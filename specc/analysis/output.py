"""Render a result in one of the formats: table (rich), markdown, json, csv; print it or write it atomically."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from ..io import atomic_write
from .sections import Section, to_markdown, to_rich

FORMATS = ("table", "json", "csv", "markdown")


def render_text(
    fmt: str, title: str, sections: list[Section], data: dict[str, Any], rows: list[list[Any]], width: int = 160
) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        return buf.getvalue()
    if fmt == "markdown":
        return to_markdown(title, sections)
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=False, color_system=None)
    for item in to_rich(title, sections):
        console.print(item)
    return console.file.getvalue()  # type: ignore[attr-defined]


def emit(
    fmt: str,
    title: str,
    sections: list[Section],
    data: dict[str, Any],
    rows: list[list[Any]],
    output: str | None,
    console: Any,
) -> None:
    """Print to ``console`` (table with rich styling) or write to ``output`` atomically."""
    if output:
        atomic_write(output, render_text(fmt, title, sections, data, rows))
        return
    if fmt == "table":
        for item in to_rich(title, sections):
            console.print(item)
        return
    console.out(render_text(fmt, title, sections, data, rows), end="")
