"""The one reading layer: every file specc opens goes through here.

A file is opened with ``O_NONBLOCK`` and judged by ``fstat`` of what was opened, so a FIFO never hangs and a
device is never read: only regular files are read (symbolic links are followed to the file they name).
Reads are bounded: a file over its limit is refused with its own message, and nothing is read past the limit
even where ``st_size`` says 0 (``/proc`` files). JSON is strict: duplicate keys, ``NaN``/``Infinity``, numbers
that overflow to infinity and nesting deeper than a limit are errors at their line and column. Text must be
UTF-8 (UTF-16, NUL bytes and invalid bytes are located errors). Names that a file gives for other files (a
sharded index's ``weight_map``, an ONNX export's companion graph) must be bare file names inside the folder of
the file that names them.

Every problem is a :class:`ReadError`, a :class:`~specc.errors.SpecError` that names the file.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import Diagnostic, SpecError
from .targets import note_input

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

# Limits by what a file is. A spec, profile or config.json is a few KB; a megabyte or more is not one.
SPEC_BYTES = 1 * MIB  # specs, extends: targets, device profiles
JSON_BYTES = 16 * MIB  # config.json, model.safetensors.index.json
HEADER_BYTES = 16 * MIB  # a safetensors header (JSON: tensor table and metadata)
METADATA_BYTES = 4 * MIB  # one metadata value (an embedded spec, training state) in a checkpoint or ONNX file
TEXT_BYTES = 256 * MIB  # training text
ARRAY_BYTES = 1 * GIB  # a .npy/.npz input of ``specc run``
ONNX_BYTES = 2 * GIB  # protobuf's own limit for one ONNX file (weights beyond it are external data)
MAX_DEPTH = 32  # nesting of JSON arrays/objects and YAML collections; specs and configs use fewer than 6

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),  # seen only where links are not followed
)


class ReadError(SpecError):
    """A file that cannot be read as what it should be (missing, not a regular file, too large, malformed)."""


def _fail(message: str, file: str, hint: str | None = None, line: int | None = None, col: int | None = None):
    return ReadError([Diagnostic(message, file, line, col, hint)])


def size_text(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


# ---------------------------------------------------------------------------------------------- files


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike[str],
    what: str = "a file",
    *,
    limit: int | None = None,
    missing: str | None = None,
    hint: str | None = None,
    dir_hint: str | None = None,
    follow: bool = True,
) -> Iterator[tuple[BinaryIO, int]]:
    """Open ``path`` for reading if it is a regular file (after symbolic links) of at most ``limit`` bytes.

    Yields the binary file object and its size. ``what`` names the file in messages ("a spec file");
    ``missing`` replaces the "no such file" message, ``hint`` goes with it. ``follow=False``: a symbolic link
    in the last component is refused like a FIFO (specc's own cache entries are never links).
    """
    name = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:  # judged before opening, so no device is ever opened; then again on what was opened (no race)
        _judge((os.stat if follow else os.lstat)(name), name, what, limit, dir_hint)
        fd = os.open(name, flags)
    except OSError as e:
        raise _os_error(e, name, what, missing, hint, dir_hint) from None
    except ValueError:  # a NUL byte in the name
        raise _fail(f"{name!r} is not a valid file name (it holds a NUL byte)", name.replace("\x00", "\\x00")) from None
    try:
        st = os.fstat(fd)
        _judge(st, name, what, limit, dir_hint)
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    note_input(name, what)  # a command may not write its output over a file it read
    with f:
        yield f, st.st_size  # type: ignore[misc]


def _judge(st: os.stat_result, name: str, what: str, limit: int | None, dir_hint: str | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        if kind == "a directory":
            raise _fail(f"{name} is a directory, not {what}", name, dir_hint)
        raise _fail(f"{name} is {kind}, not {what}", name, "give a regular file")
    if limit is not None and st.st_size > limit:
        raise _fail(f"{what} is at most {size_text(limit)}; this file is {st.st_size:,} bytes", name)


def _os_error(
    e: OSError, name: str, what: str, missing: str | None, hint: str | None, dir_hint: str | None
) -> ReadError:
    if isinstance(e, FileNotFoundError) or e.errno == errno.ENOTDIR:
        if os.path.islink(name):
            return _fail(f"{name} is a symbolic link to {os.readlink(name)}, which does not exist", name)
        return _fail(missing or f"no such file: {name}", name, hint)
    if isinstance(e, IsADirectoryError):
        return _fail(f"{name} is a directory, not {what}", name, dir_hint)
    if isinstance(e, PermissionError):
        return _fail(f"cannot read {name}: permission denied", name)
    if e.errno == errno.ELOOP:
        return _fail(f"cannot read {name}: too many levels of symbolic links", name)
    if e.errno == errno.ENXIO:  # a socket
        return _fail(f"{name} is a socket or a special file, not {what}", name)
    if e.errno == errno.ENAMETOOLONG:
        return _fail(f"the file name is too long ({len(name):,} characters)", name[:80] + "...")
    return _fail(f"cannot read {name}: {e.strerror}", name)


def read_bytes(path: str | os.PathLike[str], what: str = "a file", limit: int = SPEC_BYTES, **kw: Any) -> bytes:
    """All bytes of a regular file of at most ``limit`` bytes (read with a bound, whatever ``st_size`` says)."""
    name = os.fspath(path)
    with open_regular(path, what, limit=limit, **kw) as (f, _):
        try:
            raw = read_bounded(f, limit + 1)
        except OSError as e:
            raise _fail(f"cannot read {name}: {e.strerror}", name) from None
    if len(raw) > limit:
        raise _fail(f"{what} is at most {size_text(limit)}; this file is larger", name)
    return raw


def read_bounded(f: BinaryIO, most: int) -> bytes:
    chunks, left = [], most
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_exact(f: BinaryIO, offset: int, count: int, name: str, what: str) -> bytearray:
    """``count`` bytes at ``offset``; a file that ends sooner is truncated (a located error)."""
    buf = bytearray(count)
    read_into(f, offset, memoryview(buf), name, what)
    return buf


def read_into(f: BinaryIO, offset: int, view: memoryview, name: str, what: str) -> None:
    """Fill ``view`` (bytes) from ``offset``; a file that ends sooner is truncated (a located error)."""
    count, done = view.nbytes, 0
    while done < count:
        try:
            n = os.preadv(f.fileno(), [view[done:]], offset + done)
        except OSError as e:
            raise _fail(f"cannot read {name}: {e.strerror}", name) from None
        if n == 0:
            raise _fail(f"{what} is truncated: it ends at byte {offset + done:,}, {count - done:,} bytes early", name)
        done += n


def regular_file(path: str | os.PathLike[str], what: str = "a file", limit: int | None = None, **kw: Any) -> Path:
    """Check that ``path`` is a regular file (within ``limit``) before a library opens it by name."""
    with open_regular(path, what, limit=limit, **kw):
        pass
    return Path(path)


def sibling(folder: Path, entry: Any, file: str, what: str) -> Path:
    """A file named by ``file`` (an index, a model) for its own folder: a bare file name, never a path.

    Absolute names, ``..``, separators and empty names would let a downloaded file point anywhere on the disk.
    A symbolic link that the folder itself holds is followed (Hugging Face's cache links files into its blob
    store); the file it reaches must be a regular file like any other.
    """
    if not isinstance(entry, str) or not entry:
        raise _fail(f"{what}: expected a file name, got {_show(entry)}", file)
    if entry in (".", "..") or "/" in entry or "\\" in entry or "\x00" in entry or os.path.isabs(entry):
        raise _fail(
            f"{what}: {_show(entry)} is not a file name in the folder of {os.path.basename(file)}",
            file,
            "names in an index are bare file names beside it; paths elsewhere are refused",
        )
    return folder / entry


def _show(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else text[: most - 3] + "..."


# ---------------------------------------------------------------------------------------------- text


def decode_text(raw: bytes, file: str, what: str = "a text file", hint: str = "save it as UTF-8") -> str:
    """UTF-8 text (a leading byte-order mark dropped); UTF-16/32, NUL bytes and invalid bytes are errors."""
    for bom, enc in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                     (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):  # fmt: skip
        if raw.startswith(bom):
            raise ReadError([Diagnostic(f"{enc} text; {what} must be UTF-8", file, 1, 1, hint)])
    if b"\x00" in raw:
        first = raw.index(b"\x00")
        if _looks_utf16(raw[:64]):
            raise ReadError([Diagnostic(f"UTF-16 text; {what} must be UTF-8", file, 1, 1, hint)])
        line = raw[:first].count(b"\n") + 1
        raise ReadError([Diagnostic(f"binary data (NUL byte) in {what}", file, line, 1)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ReadError(
            [Diagnostic(f"not UTF-8 text: byte 0x{raw[e.start]:02x} is invalid", file, line, col, hint)]
        ) from None
    return text.removeprefix("\ufeff")


def _looks_utf16(head: bytes) -> bool:
    """Text of ASCII characters in UTF-16 without a byte-order mark: every other byte is zero."""
    if len(head) < 4:
        return False
    odd, even = head[1::2], head[0::2]
    return (odd.count(0) >= 0.75 * len(odd) and even.count(0) == 0) or (
        even.count(0) >= 0.75 * len(even) and odd.count(0) == 0
    )


def read_text(path: str | os.PathLike[str], what: str = "a text file", limit: int = SPEC_BYTES, **kw: Any) -> str:
    return decode_text(read_bytes(path, what, limit, **kw), os.fspath(path), what)


# ---------------------------------------------------------------------------------------------- JSON

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")
_CONSTANT = re.compile(r"-?\b(?:NaN|Infinity)\b")


class _Problem(Exception):
    def __init__(self, message: str, pos: int | None = None, key: str | None = None):
        super().__init__(message)
        self.message, self.pos, self.key = message, pos, key


def _skeleton(text: str) -> str:
    """``text`` with the inside of every string blanked (same length), so brackets and words are structure."""
    return _STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def parse_json(
    text: str,
    file: str,
    what: str = "JSON",
    *,
    max_depth: int = MAX_DEPTH,
    located: bool = True,
    nonfinite: bool = False,
) -> Any:
    """Strict JSON. ``located``: ``text`` is the whole file, so errors carry its line and column; otherwise
    (a JSON string inside a file, such as checkpoint metadata) the message says where in ``what`` it is.
    ``nonfinite``: NaN and ±Infinity are data here (a diverged loss in a training history), not errors."""

    def fail(message: str, pos: int | None, hint: str | None = None) -> ReadError:
        if pos is None:
            return _fail(f"{what}: {message}" if not located else message, file, hint)
        line, col = _line_col(text, pos)
        if located:
            return _fail(message, file, hint, line, col)
        return _fail(f"{what}: {message} (line {line}, column {col})", file, hint)

    skeleton = _skeleton(text)
    depth = 0
    for m in _BRACKET.finditer(skeleton):
        depth += 1 if m.group() in "[{" else -1
        if depth > max_depth:
            raise fail(f"nested deeper than {max_depth} levels", m.start(), "no specc input nests this deep")
    bad = None if nonfinite else _CONSTANT.search(skeleton)
    if bad:
        raise fail(f"{bad.group()} is not a JSON number", bad.start(), "write a finite number")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise _Problem(f"duplicate key {_show(k)}", key=k)
            out[k] = v
        return out

    def number(s: str) -> float:
        x = float(s)
        if not math.isfinite(x) and not nonfinite:
            raise _Problem(f"{s} overflows to infinity", skeleton.find(s))
        return x

    decoder = json.JSONDecoder(object_pairs_hook=pairs, parse_float=number)
    try:
        return decoder.decode(text)
    except json.JSONDecodeError as e:
        raise fail(f"not valid JSON: {e.msg}", e.pos) from None
    except _Problem as p:
        pos = p.pos if p.key is None else _second_key(text, p.key)
        hint = "give each key once (JSON readers differ on which copy wins)" if p.key is not None else None
        raise fail(p.message, pos, hint) from None
    except ValueError as e:  # an integer longer than Python converts (4300 digits)
        reason = "a number with too many digits" if "digits" in str(e) else str(e).splitlines()[0][:100]
        raise fail(f"not valid JSON: {reason}", None) from None
    except RecursionError:  # unreachable after the depth check; kept so no traceback ever escapes
        raise fail(f"nested deeper than {max_depth} levels", None) from None


def _second_key(text: str, key: str) -> int | None:
    """Where ``key`` is given as a key the second time (its first two occurrences)."""
    seen = 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"(?=\s*:)', text):
        try:
            literal = json.loads(m.group())
        except ValueError:
            continue
        if literal == key:
            seen += 1
            if seen == 2:
                return m.start()
    return None


def read_json(
    path: str | os.PathLike[str], what: str = "a JSON file", limit: int = JSON_BYTES, **kw: Any
) -> tuple[Any, str]:
    """The data of a strict JSON file, and its text (for locating keys later)."""
    name = os.fspath(path)
    text = decode_text(read_bytes(path, what, limit, **kw), name, what)
    if not text.strip():
        raise ReadError([Diagnostic(f"{what} is empty", name, 1, 1, "it should hold a JSON object")])
    return parse_json(text, name, what), text


def json_object(value: Any, file: str, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object, else a one-line error saying what it is instead."""
    if not isinstance(value, dict):
        raise _fail(f"{what} must be a JSON object, not {json_kind(value)}", file)
    return value


def json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {_show(value)}"
    if isinstance(value, str):
        return f"the string {_show(value, 40)}"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
