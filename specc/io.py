"""The writing layer: every file specc writes goes through here.

An output is written to a temporary file beside its target (``.NAME.XXXXXXXX.tmp``) and renamed over it, so a
reader sees the old file or the new one, never half of one. Around that, the rules (DESIGN.md §9):

- **Regular files only.** An existing target that is a directory, a device (``/dev/null``, ``/dev/full``), a
  FIFO or a socket is refused with a located message, never replaced: a rename would swap the device node for a
  plain file. (specc does not write *through* to devices either: a discarded output is an output written to a
  temporary folder.) A symbolic link to a regular file is followed: the file it points to is replaced, the link
  stays; a dangling link, or one to anything else, is refused.
- **Never an input.** An output that is the same file (same device and inode, so hard links and other spellings
  count) as one of the command's inputs is refused. Inputs are those a command names (``output_target(...,
  inputs=)``) plus, inside ``command_scope()`` (the CLI runs every command in one), every file ``note_input``
  recorded. A command that deliberately rewrites an input (``train --resume CK -o CK``) says so with ``replaces=``.
- **Checked before long work.** ``output_target`` (the same checks, plus creating and removing a probe file in
  the target folder) runs before training or exporting starts, so an unwritable output costs nothing.
- **Modes kept.** A replaced file keeps its permission bits (and, where the process may, its owner); a new file
  gets 0666 less the umask, like any other new file.
- **Pairs.** ``atomic_files`` stages several outputs in one folder and renames them in the order given, with
  SIGINT/SIGTERM/SIGHUP blocked between the first rename and the last; the ONNX writer names the external data
  file afresh whenever the current one is in use, so a model never points at data of another export.
- **Clean on every exit.** Temporary files and staging folders are removed on success, on errors, on Ctrl-C
  and on SIGTERM/SIGHUP (which raise ``SystemExit(128 + signal)`` while a write is in progress); what a SIGKILL
  leaves behind is removed by a later write into the same folder once it is older than ``STALE_AFTER_S``.
- **Located errors.** A full disk, a file-size limit, a read-only folder: ``SpecError`` naming the target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError

STALE_AFTER_S = 3600  # leftovers of a killed run older than this are removed by the next write to the folder
TMP_SUFFIX = ".tmp"
_TMP_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")  # mkstemp / mkdtemp with prefix ".NAME." and suffix ".tmp"
_LEGACY_STAGING = re.compile(r"^\..+\.onnx\.[a-z0-9_]{8}$")  # staging folders of specc ≤ 0.1 ONNX saves
_MAX_PREFIX = 120  # keep temporary names well under NAME_MAX however long the target's name is
_WRITE_ERRNOS = {
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EIO", "ENXIO", "ENAMETOOLONG", "ETXTBSY",
                 "EISDIR", "ENOTDIR", "EXDEV", "EMLINK", "ELOOP")
    if hasattr(errno, name)
}  # fmt: skip
_OS_ERROR_IN_TEXT = re.compile(r"(?:os error |code: )(\d+)")  # how Rust (safetensors) spells an OSError


# ---------------------------------------------------------------------------------------------- inputs


@dataclass
class _Scope:
    inputs: dict[tuple[int, int], str] = field(default_factory=dict)  # (st_dev, st_ino) → how it was named
    replaces: set[tuple[int, int]] = field(default_factory=set)


_scopes: list[_Scope] = []


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """One command's inputs: files recorded by ``note_input`` inside it are refused as outputs inside it."""
    _scopes.append(_Scope())
    try:
        yield
    finally:
        _scopes.pop()


def note_input(path: str | os.PathLike[str], role: str | None = None) -> None:
    """Record a file the running command reads (the reading layer calls this for every file it opens).
    Outside ``command_scope`` nothing is recorded."""
    if not _scopes:
        return
    key = _key(path)
    if key is not None:
        _scopes[-1].inputs.setdefault(key, role or f"the input {path}")


def _key(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


# ---------------------------------------------------------------------------------------------- target checks


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse(target: Path | str, message: str, hint: str | None = None) -> SpecError:
    return SpecError(message, file=str(target), hint=hint)


InputsArg = Iterable["str | os.PathLike[str] | tuple[str | os.PathLike[str], str]"]


def output_target(
    path: str | os.PathLike[str],
    *,
    inputs: InputsArg = (),
    replaces: Iterable[str | os.PathLike[str]] = (),
    probe: bool = True,
) -> Path:
    """Check that ``path`` may be written, before any work; returns the file that will be replaced or created
    (``path`` itself, or the regular file a symbolic link at ``path`` points to).

    ``inputs``: paths (or (path, role) pairs) the command reads; ``replaces``: inputs it rewrites on purpose.
    ``probe``: create and remove a temporary file in the target folder (catches read-only folders, /proc, ...).
    """
    given = Path(path)
    if not str(path) or given.name in ("", ".", ".."):
        raise _refuse(given, "not a file name", "give the path of the file to write, e.g. out/model.onnx")
    target = given
    try:
        st: os.stat_result | None = os.lstat(given)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _refuse(given, f"cannot write here: {e.strerror}") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        real = Path(os.path.realpath(given))
        try:
            st = os.stat(given)
        except FileNotFoundError:
            raise _refuse(
                given, f"is a symbolic link to {real}, which does not exist", "give the real path to create"
            ) from None
        except OSError as e:
            raise _refuse(given, f"is a symbolic link that cannot be followed: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(
                given, f"is a symbolic link to {real}, which is {_kind(st.st_mode)}", "give a regular file's path"
            )
        target = real
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            raise _refuse(given, "is a directory", f"give a file name inside it, e.g. {given / 'NAME'}")
        raise _refuse(
            given,
            f"is {kind}, not a regular file; specc writes an output by renaming a finished file over the old one "
            f"and never replaces {kind}",
            "give the path of a regular file (to discard an output, write it into a temporary folder)",
        )
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise _refuse(given, f"output folder does not exist: {folder}", "create it first, or give another path")
    named = _named_inputs(inputs)
    if st is not None:
        _check_not_input(given, (st.st_dev, st.st_ino), named, replaces)
    if probe:
        try:
            fd, tmp = tempfile.mkstemp(prefix=_prefix(target), suffix=TMP_SUFFIX, dir=folder)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise _refuse(given, f"cannot write in {folder}: {e.strerror}", "choose a writable folder") from None
    return target


def _named_inputs(inputs: InputsArg) -> dict[tuple[int, int], str]:
    """Explicit inputs by file identity; inside a command scope they are recorded for its later writes too."""
    named: dict[tuple[int, int], str] = {}
    for item in inputs:
        p, role = item if isinstance(item, tuple) else (item, None)
        k = _key(p)
        if k is not None:
            named.setdefault(k, role or f"the input {p}")
    if _scopes:
        for k, role in named.items():
            _scopes[-1].inputs.setdefault(k, role)
    return named


def _check_not_input(
    given: Path, key: tuple[int, int], named: dict[tuple[int, int], str], replaces: Iterable[str | os.PathLike[str]]
) -> None:
    allowed = {k for k in map(_key, replaces) if k is not None}
    for scope in _scopes:
        allowed |= scope.replaces
    if _scopes:
        _scopes[-1].replaces |= allowed  # the later atomic write of the same file is allowed too
    if key in allowed:
        return
    named = dict(named)
    for scope in _scopes:
        for k, role in scope.inputs.items():
            named.setdefault(k, role)
    if key in named:
        raise _refuse(
            given,
            f"is also {named[key]} of this command; specc never overwrites an input",
            "write the output to another path",
        )


def _prefix(target: Path) -> str:
    return f".{target.name[:_MAX_PREFIX]}."


# ---------------------------------------------------------------------------------------------- signals


_signal_depth = 0
_saved_handlers: dict[int, object] = {}
_CATCH = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While a write is in progress, SIGTERM / SIGHUP raise SystemExit (Ctrl-C already raises KeyboardInterrupt),
    so the ``finally`` that removes temporary files runs. Handlers a program installed itself are left alone."""
    global _signal_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _signal_depth == 0:
        for sig in _CATCH:
            prev = signal.getsignal(sig)
            if prev in (signal.SIG_DFL, None):
                _saved_handlers[sig] = prev
                signal.signal(sig, _exit_on_signal)
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, None):
            _saved_handlers[signal.SIGINT] = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, signal.default_int_handler)
    _signal_depth += 1
    try:
        yield
    finally:
        _signal_depth -= 1
        if _signal_depth == 0:
            for sig, prev in _saved_handlers.items():
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)  # type: ignore[arg-type]
            _saved_handlers.clear()


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while renames that belong together run (delivered right after)."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGINT, *_CATCH}
    old = mask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------------------------------------- stale files


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


# ---------------------------------------------------------------------------------------------- writing


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _finish(tmp: Path, target: Path, like: Path | None = None) -> None:
    """Give ``tmp`` the mode (and owner, where allowed) of the file it replaces, flush it to disk."""
    ref = target if target.exists() else like
    try:
        st = os.stat(ref) if ref is not None and ref.exists() else None
    except OSError:
        st = None
    os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else _new_file_mode())
    if st is not None and hasattr(os, "chown"):
        mine = os.stat(tmp)
        if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
            with contextlib.suppress(OSError):
                os.chown(tmp, st.st_uid, st.st_gid)
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_error(target: str | os.PathLike[str], e: BaseException) -> SpecError | None:
    """A ``SpecError`` naming ``target`` when ``e`` is a failure to write (disk full, size limit, read-only,
    permissions), else None (a bug, left to propagate with its traceback)."""
    code: int | None = None
    if isinstance(e, OSError):
        code = e.errno
    elif not isinstance(e, SpecError) and type(e).__name__ in ("SafetensorError", "RuntimeError"):
        m = _OS_ERROR_IN_TEXT.search(str(e))
        code = int(m.group(1)) if m else None
    if code is None or code not in _WRITE_ERRNOS:
        return None
    hints = {
        "ENOSPC": "free some space or write elsewhere; nothing was replaced",
        "EDQUOT": "the disk quota is exhausted; nothing was replaced",
        "EFBIG": "the file exceeds a size limit (ulimit -f, or the file system's); nothing was replaced",
    }
    hint = next((h for name, h in hints.items() if getattr(errno, name, None) == code), "nothing was replaced")
    return SpecError(f"cannot write: {os.strerror(code)}", file=str(target), hint=hint)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, inputs: InputsArg = ()) -> Iterator[Path]:
    """Yields a temporary path in the target's folder; on success it replaces ``target``, else it is removed."""
    with atomic_files([target], inputs=inputs, staging=False) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_files(
    targets: Sequence[str | os.PathLike[str]],
    *,
    like: str | os.PathLike[str] | None = None,
    inputs: InputsArg = (),
    staging: bool = True,
) -> Iterator[list[Path]]:
    """Yields one temporary path per target; on success they replace the targets, renamed in the given order
    (put the file that refers to the others last), else they are removed.

    ``staging``: the temporary paths are ``STAGE/<target name>`` in one staging folder (needed when a file
    refers to another by name, as an ONNX model does to its external data); all targets share one folder.
    ``like``: a new target takes this file's mode (the model's, for its data file) instead of the umask's.
    """
    given = [Path(t) for t in targets]
    real = [output_target(t, inputs=inputs, probe=False) for t in given]
    folder = real[-1].parent if str(real[-1].parent) else Path(".")
    if staging and len({p.parent.resolve() for p in real}) != 1:
        raise ValueError("atomic_files: every target must be in one folder")
    clean_stale(folder)
    like_path = Path(like) if like is not None else None
    made: list[Path] = []
    stage: Path | None = None
    with _signals_raise():
        try:
            if staging:
                stage = Path(tempfile.mkdtemp(prefix=_prefix(real[-1]), suffix=TMP_SUFFIX, dir=folder))
                tmps = [stage / p.name for p in real]
            else:
                tmps = []
                for p in real:
                    fd, tmp = tempfile.mkstemp(prefix=_prefix(p), suffix=TMP_SUFFIX, dir=p.parent)
                    os.close(fd)
                    tmps.append(Path(tmp))
                    made.append(Path(tmp))
            yield tmps
            for tmp, target in zip(tmps, real, strict=True):
                if not tmp.is_file():
                    raise FileNotFoundError(errno.ENOENT, f"the writer did not produce {target.name}")
                _finish(tmp, target, like_path)
            for target in real:  # the target may have been swapped for something else meanwhile
                output_target(target, inputs=inputs, probe=False)
            with _signals_blocked():
                for tmp, target in zip(tmps, real, strict=True):
                    os.replace(tmp, target)
        except Exception as e:
            err = write_error(given[-1], e)
            if err is None:
                raise
            raise err from None
        finally:
            for tmp in made:
                with contextlib.suppress(OSError):
                    tmp.unlink()
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)


def atomic_write(
    target: str | os.PathLike[str], data: bytes | str | Callable[[Path], None], *, inputs: InputsArg = ()
) -> Path:
    """Write bytes/text, or call ``data(tmp_path)`` to produce the file, atomically; returns ``target``."""
    with atomic_path(target, inputs=inputs) as tmp:
        if callable(data):
            data(tmp)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(target)


# ---------------------------------------------------------------------------------------------- images


IMAGE_FORMATS = ("png", "svg", "pdf")


def image_format(path: str | os.PathLike[str]) -> str:
    """The image format a plot path asks for, refused (as a user error) unless matplotlib's Agg writes it."""
    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in IMAGE_FORMATS:
        raise SpecError(
            f"unsupported image format {Path(path).suffix or '(none)'!r}", file=str(path), hint="use .png, .svg or .pdf"
        )
    return fmt
