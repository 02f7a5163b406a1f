"""specc's code cache: one private folder for what specc writes once and executes later.

The root is ``$SPECC_CACHE``, else ``$XDG_CACHE_HOME/specc`` (an absolute ``XDG_CACHE_HOME``), else
``~/.cache/specc``. It holds ``generated/`` (model source), ``kernels/`` (the native library) and ``inductor/``
(torch.compile's cache for compiled decoding).

**Private, checked before every use.** The root is created with mode 0700, and the root and each of its folders
must be a real folder (not a symbolic link), owned by this user and not writable by group or others. Where one is
not, ``folder()`` prints one warning line and returns None: the caller then runs without the cache (generated
source executes from memory, the native library is not loaded), so a folder another user can write into is never
read.

**Content-verified entries.** An entry is read without following a symbolic link, opened non-blocking and judged
by ``fstat`` (a FIFO or device is never read, so never hangs), and its bytes are checked against a SHA-256 digest
before they are used: the digest in the entry's name (``read_entry``) or the one recorded when specc wrote it
(``write_entry(manifest=True)`` writes ``NAME.sha256`` beside it; ``open_entry``). A missing, truncated, foreign or
non-regular entry reads as absent, and writing it again replaces it whole (a folder or a link in its place is
removed first; temporary files are removed on every failure, a full disk included).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .io.read import ReadError, open_regular, read_bounded

ENV = "SPECC_CACHE"
MANIFEST = ".sha256"  # NAME.sha256 beside NAME: "<hex digest>  NAME\n", as sha256sum writes it
_MANIFEST_BYTES = 4096
_warned: set[str] = set()


def root() -> Path:
    """The cache root (not checked: ``folder`` checks it)."""
    base = os.environ.get(ENV)
    if base:
        return Path(base).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")  # the XDG spec: a relative value is ignored
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "specc"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def why_not_private(path: Path) -> str | None:
    """Why ``path`` is not a private folder of this user (None where it is one)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be inspected ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def folder(name: str) -> Path | None:
    """``root()/name``, created 0700 where missing, where it and the root are private; else None after one
    warning line (once per folder and reason in a process)."""
    base = root()
    for path in (base, base / name):
        try:
            if path == base:
                path.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            return _refuse(path, f"cannot be created ({e.strerror})")
        why = why_not_private(path)
        if why is not None:
            return _refuse(path, why)
    return base / name


def _refuse(path: Path, why: str) -> None:
    line = f"warning: specc's cache folder {path} {why}: not used (cached code is neither read nor written)"
    if line not in _warned:
        _warned.add(line)
        print(line, file=sys.stderr)
    return None


def temporary_folder(name: str) -> Path:
    """A fresh private folder for this process alone (removed at exit), for a cache that cannot be skipped."""
    path = Path(tempfile.mkdtemp(prefix=f"specc-{name}-"))  # mode 0700
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# ================================================================================================== entries


def read_entry(where: Path, name: str, sha256: str, limit: int) -> bytes | None:
    """The bytes of ``where/name`` where its SHA-256 digest starts with ``sha256``; None where the entry is
    missing, not a regular file, larger than ``limit`` or different."""
    with _opened(where / name, limit) as opened:
        if opened is not None and digest(opened[1]).startswith(sha256):
            return opened[1]
    return None


@contextlib.contextmanager
def open_entry(where: Path, name: str, limit: int) -> Iterator[int | None]:
    """A file descriptor of ``where/name`` (open while the block runs) whose content is what specc recorded in
    its manifest; None where either is missing, damaged or different. Load the library through
    ``/proc/self/fd/FD``: exactly the bytes checked, whatever replaces the name meanwhile."""
    recorded = _recorded(where, name)
    with _opened(where / name, limit) as opened:
        ok = opened is not None and recorded is not None and digest(opened[1]) == recorded
        yield opened[0] if ok else None  # type: ignore[index]


def _recorded(where: Path, name: str) -> str | None:
    with _opened(where / (name + MANIFEST), _MANIFEST_BYTES) as opened:
        if opened is None:
            return None
        try:
            hexdigest, _, named = opened[1].decode("ascii").strip().partition("  ")
        except UnicodeDecodeError:
            return None
    ok = named == name and len(hexdigest) == 64 and all(c in "0123456789abcdef" for c in hexdigest)
    return hexdigest if ok else None


@contextlib.contextmanager
def _opened(path: Path, limit: int) -> Iterator[tuple[int, bytes] | None]:
    """(descriptor, bytes) of a regular file (no link followed, nothing blocking), or None."""
    stack = contextlib.ExitStack()
    try:
        f, _ = stack.enter_context(open_regular(path, "a cache entry", limit=limit, follow=False))
        data = read_bounded(f, limit + 1)
    except (ReadError, OSError):
        stack.close()
        yield None
        return
    with stack:
        yield (f.fileno(), data) if len(data) <= limit else None


def write_entry(where: Path, name: str, data: bytes, *, manifest: bool = False) -> Path | None:
    """Write ``data`` to ``where/name`` whole (a temporary file renamed over it), with its manifest where asked;
    the path, or None where it cannot be written (nothing is left behind then)."""
    target, temps = where / name, []
    try:
        temps.append((_temporary(where, name, data), target))
        if manifest:
            record = f"{digest(data)}  {name}\n".encode()
            temps.append((_temporary(where, name + MANIFEST, record), where / (name + MANIFEST)))
        for tmp, final in temps:
            _clear(final)
            os.replace(tmp, final)
        temps.clear()
        return target
    except OSError:
        return None
    finally:
        for tmp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _temporary(where: Path, name: str, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=where)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _clear(path: Path) -> None:
    """Remove a folder in a cache entry's place (a rename does not replace one; links and FIFOs it does)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
