"""Plot outputs: the image formats matplotlib's Agg backend writes."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SpecError

IMAGE_FORMATS = ("png", "svg", "pdf")


def image_format(path: str | os.PathLike[str]) -> str:
    """The image format a plot path asks for, refused (as a user error) unless matplotlib's Agg writes it."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in IMAGE_FORMATS:
        raise SpecError(
            f"unsupported image format {Path(path).suffix or '(none)'!r}", file=str(path), hint="use .png, .svg or .pdf"
        )
    return fmt
