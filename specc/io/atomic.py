"""Atomic writes: temporary files beside the targets, modes kept, renamed in order; write failures located."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..errors import SpecError
from .signals import outputs_complete, signals_blocked, signals_raise
from .stale import clean_stale
from .targets import InputsArg, output_target, temp_dir, temp_file

_WRITE_ERRNOS = {
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM", "EIO", "ENXIO", "ENAMETOOLONG", "ETXTBSY",
                 "EISDIR", "ENOTDIR", "EXDEV", "EMLINK", "ELOOP")
    if hasattr(errno, name)
}  # fmt: skip
_OS_ERROR_IN_TEXT = re.compile(r"(?:os error |code: )(\d+)")  # how Rust (safetensors) spells an OSError


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
def atomic_path(target: str | os.PathLike[str], *, inputs: InputsArg = (), last: bool = False) -> Iterator[Path]:
    """Yields a temporary path in the target's folder; on success it replaces ``target``, else it is removed.
    ``last``: the command's final output (see ``atomic_files``)."""
    with atomic_files([target], inputs=inputs, staging=False, last=last) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_files(
    targets: Sequence[str | os.PathLike[str]],
    *,
    like: str | os.PathLike[str] | None = None,
    inputs: InputsArg = (),
    staging: bool = True,
    last: bool = False,
) -> Iterator[list[Path]]:
    """Yields one temporary path per target; on success they replace the targets, renamed in the given order
    (put the file that refers to the others last), else they are removed.

    ``staging``: the temporary paths are ``STAGE/<target name>`` in one staging folder (needed when a file
    refers to another by name, as an ONNX model does to its external data); all targets share one folder.
    ``like``: a new target takes this file's mode (the model's, for its data file) instead of the umask's.
    ``last``: these are the command's final outputs (``outputs_complete`` once they are in place).
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
    with signals_raise():
        try:
            if staging:
                stage = temp_dir(folder, real[-1])
                tmps = [stage / p.name for p in real]
            else:
                tmps = []
                for p in real:
                    tmp = temp_file(p.parent, p)
                    tmps.append(tmp)
                    made.append(tmp)
            yield tmps
            for tmp, target in zip(tmps, real, strict=True):
                if not tmp.is_file():
                    raise FileNotFoundError(errno.ENOENT, f"the writer did not produce {target.name}")
                _finish(tmp, target, like_path)
            for target in real:  # the target may have been swapped for something else meanwhile
                output_target(target, inputs=inputs, probe=False)
            with signals_blocked():
                for tmp, target in zip(tmps, real, strict=True):
                    os.replace(tmp, target)
                if last:
                    outputs_complete()
        except Exception as e:
            err = write_error(given[-1], e)
            if err is None:
                raise
            raise err from None
        finally:
            with signals_blocked():  # a second signal waits until the temporary files are gone
                for tmp in made:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
                if stage is not None:
                    shutil.rmtree(stage, ignore_errors=True)


def atomic_write(
    target: str | os.PathLike[str],
    data: bytes | str | Callable[[Path], None],
    *,
    inputs: InputsArg = (),
    last: bool = False,
) -> Path:
    """Write bytes/text, or call ``data(tmp_path)`` to produce the file, atomically; returns ``target``.
    ``last``: the command's final output (see ``atomic_files``)."""
    with atomic_path(target, inputs=inputs, last=last) as tmp:
        if callable(data):
            data(tmp)
        elif isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
    return Path(target)


# ---------------------------------------------------------------------------------------------- folders


def folder_stage(target: str | os.PathLike[str]) -> Path:
    """A new, empty temporary folder beside the folder output ``target`` (``.NAME.specc-<pid>-XXXXXXXX.tmp``)
    to write its new contents into; ``replace_folder`` swaps it in, ``discard_stage`` removes it."""
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    clean_stale(parent)
    try:
        return temp_dir(parent, target)
    except OSError as e:
        err = write_error(target, e)
        if err is None:
            raise
        raise err from None


def discard_stage(stage: Path) -> None:
    shutil.rmtree(stage, ignore_errors=True)


def replace_folder(stage: Path, target: str | os.PathLike[str], last: bool = False) -> Path:
    """Put the finished folder ``stage`` in place of ``target`` by rename: a reader sees the old folder whole or
    the new one whole, and nothing of the old one survives (no stale shard of a larger layout). Where the
    kernel can exchange two names at once (``renameat2``), there is no moment without a ``target``; the old
    contents are then removed. Signals are held back while the names change; ``last``: this is the
    command's final output (``outputs_complete`` once it is in place)."""
    target = Path(target)
    if target.is_symlink() and target.is_dir():
        target = Path(os.path.realpath(target))  # the folder a link names is replaced, the link stays
    parent = target.parent if str(target.parent) else Path(".")
    try:
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            mode = 0o777 & ~_umask()
        os.chmod(stage, mode)
        _sync_tree(stage)
        with signals_blocked():
            if os.path.lexists(target):
                old = stage if _exchange(stage, target) else _move_aside(target, parent)
                if old is not stage:
                    try:
                        os.rename(stage, target)
                    except OSError:
                        os.rename(old, target)  # the old folder back in place
                        raise
            else:
                os.rename(stage, target)
                old = None
            if last:
                outputs_complete()
        _sync(parent)
    except OSError as e:
        discard_stage(stage)
        err = write_error(target, e)
        if err is None:
            raise
        raise err from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _exchange(a: Path, b: Path) -> bool:
    """Swap two names in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is not offered."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL)):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _move_aside(target: Path, parent: Path) -> Path:
    """The old folder under a specc temporary name (so that a crash right now leaves it to the cleaner)."""
    aside = temp_dir(parent, target)
    os.rename(target, aside)  # onto the empty folder just made
    return aside


def _sync_tree(folder: Path) -> None:
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            _sync(Path(entry.path))
    _sync(folder)


def _sync(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
