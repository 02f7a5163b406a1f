"""Command-line front end. ``main()`` maps user errors to exit 2 with located messages, no traceback.

Every user error -- a ``SpecError``, or a bad flag or argument caught by the option parser -- ends as one
``[where: ]error: message`` line (plus a ``hint:`` line where a fix is known) on stderr and exit code 2; the
traceback only with ``--debug``. Under torchrun every rank runs the same checks on the same files, so rank 0
alone prints the line (the other ranks exit 2 silently). A message line longer than ``MAX_LINE`` characters
(a 100 KB argument echoed back) is cut, saying how long it was. Every command runs in one
``specc.io.command_scope``: no output may replace a file the command read.
"""

from __future__ import annotations

import os
import sys
import traceback

import typer

from ..errors import SpecError
from ..io import command_scope, command_signals
from . import (  # noqa: F401  (each module registers its commands on ``app``)
    analyze_cmds,
    compile_cmd,
    device_cmds,
    hf_cmds,
    onnx_cmds,
    spec_cmds,
    torch_cmds,
    train_cmds,
)
from .app import app, err, state

try:  # typer ≥ 0.20 carries its own copy of click
    from typer._click.exceptions import ClickException as _ClickError
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import ClickException as _ClickError
    from click import UsageError as _UsageError

MAX_LINE = 400


def shorten(text: str, limit: int = MAX_LINE) -> str:
    """Cut each line of ``text`` to ``limit`` characters, saying how long it was."""
    lines = []
    for line in text.splitlines() or [text]:
        if len(line) > limit:
            line = f"{line[: limit - 40]}… ({len(line):,} characters, cut)"
        lines.append(line)
    return "\n".join(lines)


def _usage_message(e: _ClickError) -> str:
    """Click's multi-line usage block as one line: ``error: <message>`` and a hint naming ``--help``."""
    message = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    command = ctx.command_path if ctx is not None else "specc"
    hint = f"\n  hint: see `{command} --help`" if isinstance(e, _UsageError) else ""
    return f"error: {message}{hint}"


def _other_rank() -> bool:
    """A torchrun rank other than 0 (whose messages rank 0 prints)."""
    return os.environ.get("RANK", "0") != "0" and "WORLD_SIZE" in os.environ


def run(argv: list[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (used by ``main`` and the tests)."""
    state["debug"] = False
    try:
        with command_scope(), command_signals():
            # typer returns (not raises) the code of an Exit, and turns Ctrl-C into Exit(130)
            code = app(args=argv, prog_name="specc", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except _ClickError as e:  # bad flags or arguments: click's message, in one line, exit 2
        if state["debug"]:
            traceback.print_exc()
        print(shorten(_usage_message(e)), file=sys.stderr)
        return 2
    except SpecError as e:
        if state["debug"]:
            traceback.print_exc()
        if state["debug"] or not _other_rank():
            print(shorten(e.format()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def main() -> None:
    code = run()
    launch = sys.modules.get("specc.parallel.launch")  # imported only by commands that may start a group
    if launch is not None and launch.STARTED:
        launch.end_process(code)  # never through interpreter finalization with gloo threads alive
    sys.exit(code)
