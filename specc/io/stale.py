"""Leftovers of killed runs (temporary files and staging folders of specc's naming), removed once they are old."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

STALE_AFTER_S = 3600  # leftovers of a killed run older than this are removed by the next write to the folder
_TMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # mkstemp / mkdtemp with prefix ".NAME." and suffix ".tmp"
_LEGACY_STAGING = re.compile(r"^\..+\.onnx\.[a-z0-9_]{8}$")  # staging folders of specc ≤ 0.1 ONNX saves


def clean_stale(folder: str | os.PathLike[str], older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove temporary files and staging folders of specc's own naming (``.NAME.XXXXXXXX.tmp``) that a killed
    run left in ``folder``, once they are older than ``older_than_s`` and owned by this user; returns them."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for entry in entries:
        name = entry.name
        if not (_TMP_NAME.match(name) or _LEGACY_STAGING.match(name)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if uid is not None and st.st_uid != uid:
            continue
        path = Path(entry.path)
        if now - _newest_mtime(path, st) < older_than_s:  # still being written (a long export touches its files)
            continue
        try:
            if stat.S_ISREG(st.st_mode) and _TMP_NAME.match(name):
                path.unlink()
            elif stat.S_ISDIR(st.st_mode) and _only_regular_files(path):
                shutil.rmtree(path)
            else:
                continue
        except OSError:
            continue
        removed.append(path)
    return removed


def _newest_mtime(path: Path, st: os.stat_result) -> float:
    newest = st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError):
            for e in os.scandir(path):
                newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
    return newest


def _only_regular_files(folder: Path) -> bool:
    try:
        return all(e.is_file(follow_symlinks=False) for e in os.scandir(folder))
    except OSError:
        return False
