"""Leftovers of killed runs: specc's own temporary files and folders, removed once their process is gone.

A name qualifies only in the exact form ``temp_prefix`` makes (``.NAME.specc-<pid>-XXXXXXXX.tmp``), owned by
this user, whose process ``<pid>`` no longer exists, and untouched for ``STALE_AFTER_S`` (a process in another
PID namespace or on another host sharing the folder looks gone from here). Anything else is never touched,
whatever its name or age: a user's ``.notes.20240101.tmp``, ``.photos.backup_1.tmp/`` or ``.model.onnx.old/``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

from .targets import TMP_MARK, TMP_SUFFIX

STALE_AFTER_S = 3600  # leftovers of a killed run older than this are removed by the next write to the folder
_TMP_NAME = re.compile(rf"^\..+\.{TMP_MARK}-([1-9][0-9]{{0,9}})-[a-z0-9_]{{8}}{re.escape(TMP_SUFFIX)}$")


def owner_pid(name: str) -> int | None:
    """The process id in a specc temporary name, None for any other name."""
    m = _TMP_NAME.match(name)
    return int(m.group(1)) if m else None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts: it exists)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists but not ours, or cannot tell: keep
    return True


def clean_stale(folder: str | os.PathLike[str], older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove specc's temporary files and folders in ``folder`` that a killed run left behind (see the module
    docstring for what qualifies); returns them."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    for entry in entries:
        pid = owner_pid(entry.name)
        if pid is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if uid is not None and st.st_uid != uid:
            continue
        path = Path(entry.path)
        if now - _newest_mtime(path, st) < older_than_s or process_alive(pid):
            continue
        try:
            if stat.S_ISREG(st.st_mode):
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
