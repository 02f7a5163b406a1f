"""Where an output may go: inputs recorded per command, and the checks on an output path before any work."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError

TMP_SUFFIX = ".tmp"
TMP_MARK = "specc"  # temporary names: ``.NAME.specc-<pid>-XXXXXXXX.tmp`` (specc made it; <pid> owns it)
_MAX_PREFIX = 120  # keep temporary names well under NAME_MAX however long the target's name is


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
        probe_folder(given, folder, target)
    return target


def probe_folder(given: Path, folder: Path, target: Path) -> None:
    """Create and remove a temporary file in ``folder`` (a read-only mount, /proc, a folder of another user):
    a located error before any work."""
    try:
        os.unlink(temp_file(folder, target))
    except OSError as e:
        raise _refuse(given, f"cannot write in {folder}: {e.strerror}", "choose a writable folder") from None


def folder_target(path: str | os.PathLike[str]) -> Path:
    """Check a folder output (a distributed checkpoint) before any work: a new name or an existing folder, in
    a folder where specc can create the temporary folder it writes the new one into. Returns the folder that
    will be replaced or created (a symbolic link to a folder is followed)."""
    given = Path(path)
    if not str(path) or given.name in ("", ".", ".."):
        raise _refuse(given, "not a folder name", "give the path of the folder to write, e.g. out/ckpt")
    target = given
    try:
        st = os.stat(given)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _refuse(given, f"cannot write here: {e.strerror}") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(given, f"is {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}, not a folder")
        target = Path(os.path.realpath(given))
    elif os.path.islink(given):
        raise _refuse(given, "is a symbolic link to nothing", "give the real path to create")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise _refuse(given, f"output folder does not exist: {folder}", "create it first, or give another path")
    try:
        os.rmdir(temp_dir(folder, target))
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


def temp_prefix(target: Path) -> str:
    """``.NAME.specc-<pid>-``: the stale-temp cleaner (``specc.io.stale``) removes only names of this form, and
    only once the process that made them is gone."""
    return f".{target.name[:_MAX_PREFIX]}.{TMP_MARK}-{os.getpid()}-"


def temp_file(folder: Path, target: Path) -> Path:
    """A new empty temporary file for ``target`` in ``folder``, named by ``temp_prefix``."""
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(target), suffix=TMP_SUFFIX, dir=folder)
    os.close(fd)
    return Path(tmp)


def temp_dir(folder: Path, target: Path) -> Path:
    """A new empty temporary folder (mode 0700) for ``target`` in ``folder``, named by ``temp_prefix``."""
    return Path(tempfile.mkdtemp(prefix=temp_prefix(target), suffix=TMP_SUFFIX, dir=folder))
