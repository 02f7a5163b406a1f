"""The writing layer: every file specc writes goes through here.

An output is written to a temporary file beside its target (``.NAME.specc-<pid>-XXXXXXXX.tmp``) and renamed over
it, so a reader sees the old file or the new one, never half of one. Around that, the rules (DESIGN.md §9):

- **Regular files only.** An existing target that is a directory, a device (``/dev/null``, ``/dev/full``), a
  FIFO or a socket is refused with a located message, never replaced: a rename would swap the device node for a
  plain file. (specc does not write *through* to devices either: a discarded output is an output written to a
  temporary folder.) A symbolic link to a regular file is followed: the file it points to is replaced, the link
  stays; a dangling link, or one to anything else, is refused.
- **Folders whole.** A folder output (a distributed checkpoint) is written into a temporary folder beside it
  (``folder_stage``) and swapped in by rename (``replace_folder``: ``renameat2(RENAME_EXCHANGE)`` where the
  kernel offers it, so there is no moment without the folder), then the old contents are removed: nothing of
  the old folder survives in the new one, and until the swap the old one is complete.
- **Never an input.** An output that is the same file (same device and inode, so hard links and other spellings
  count) as one of the command's inputs is refused. Inputs are those a command names (``output_target(...,
  inputs=)``) plus, inside ``command_scope()`` (the CLI runs every command in one), every file ``note_input``
  recorded. A command that deliberately rewrites an input (``train --resume CK -o CK``) says so with ``replaces=``.
- **Checked before long work.** ``output_target`` and ``folder_target`` (the same checks, plus creating and
  removing a temporary file or folder beside the target) run before training or exporting starts, so an
  unwritable output (``/proc/x``, a read-only folder) costs nothing.
- **Modes kept.** A replaced file keeps its permission bits (and, where the process may, its owner); a new file
  gets 0666 less the umask, like any other new file.
- **Pairs.** ``atomic_files`` stages several outputs and renames them in the order given, with
  SIGINT/SIGTERM/SIGHUP blocked between the first rename and the last; the ONNX writer names the external data
  file afresh whenever the current one is in use, so a model never points at data of another export.
- **Clean on every exit.** Temporary files and folders are removed on success, on errors, on Ctrl-C and on
  SIGTERM/SIGHUP (which raise ``SystemExit(128 + signal)`` while a write is in progress). What a SIGKILL leaves
  behind is removed by a later write into the same folder (``clean_stale``) once the process named in it is
  gone and it is older than ``STALE_AFTER_S``; no other name is ever removed, however much it looks like one.
- **Done is done.** A command's final output is written with ``last=True``: once it is in place
  (``outputs_complete``) SIGINT/SIGTERM/SIGHUP are ignored until the command ends, so a signal cannot turn a
  finished command into a failure.
- **Located errors.** A full disk, a file-size limit, a read-only folder: ``SpecError`` naming the target.
"""

from __future__ import annotations

from .atomic import (
    atomic_files,
    atomic_path,
    atomic_write,
    discard_stage,
    folder_stage,
    replace_folder,
    write_error,
)
from .images import IMAGE_FORMATS, image_format
from .signals import command_signals, outputs_complete, signals_raise
from .stale import STALE_AFTER_S, clean_stale
from .targets import TMP_SUFFIX, command_scope, folder_target, note_input, output_target

__all__ = [
    "IMAGE_FORMATS",
    "STALE_AFTER_S",
    "TMP_SUFFIX",
    "atomic_files",
    "atomic_path",
    "atomic_write",
    "clean_stale",
    "command_scope",
    "command_signals",
    "discard_stage",
    "folder_stage",
    "folder_target",
    "image_format",
    "note_input",
    "output_target",
    "outputs_complete",
    "replace_folder",
    "signals_raise",
    "write_error",
]
