"""Atomic output: write to a temporary file beside the target, then rename, so nothing is half-written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import SpecError


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yields a temporary path in the target's folder; on success it replaces ``target``, else it is removed."""
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise SpecError(f"output folder does not exist: {folder}", file=str(target))
    if target.is_dir():
        raise SpecError(f"{target} is a directory", file=str(target), hint="give a file name")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600; give the output the mode any new file would get (0666 less the umask)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp_path, 0o666 & ~mask)
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


IMAGE_FORMATS = ("png", "svg", "pdf")


def image_format(path: str | os.PathLike[str]) -> str:
    """The image format a plot path asks for, refused (as a user error) unless matplotlib's Agg writes it."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in IMAGE_FORMATS:
        raise SpecError(f"unsupported image format {Path(path).suffix or '(none)'!r}", file=str(path),
                        hint="use .png, .svg or .pdf")
    return fmt


def atomic_write(target: str | os.PathLike[str], data: bytes | str | Callable[[Path], None]) -> Path:
    """Write bytes/text, or call ``data(tmp_path)`` to produce the file, atomically."""
    with atomic_path(target) as tmp:
        if callable(data):
            data(tmp)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(target)
