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
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


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
