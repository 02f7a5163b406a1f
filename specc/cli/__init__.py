"""Command-line front end. ``main()`` maps user errors to exit 2 with located messages, no traceback."""

from __future__ import annotations

import sys
import traceback

import typer

from ..errors import SpecError
from . import (  # noqa: F401  (each module registers its commands on ``app``)
    analyze_cmds,
    compile_cmd,
    hf_cmds,
    onnx_cmds,
    spec_cmds,
    torch_cmds,
    train_cmds,
)
from .app import app, err, state

try:  # typer ≥ 0.20 carries its own copy of click
    from typer._click.exceptions import ClickException as _UsageError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import ClickException as _UsageError


def run(argv: list[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (used by ``main`` and the tests)."""
    state["debug"] = False
    try:
        app(args=argv, prog_name="specc", standalone_mode=False)
        return 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except _UsageError as e:  # bad flags or arguments: click's own message, exit 2
        e.show()
        return 2
    except SpecError as e:
        if state["debug"]:
            traceback.print_exc()
        print(e.format(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def main() -> None:
    sys.exit(run())
