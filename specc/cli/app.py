"""The typer application and what every command shares: global flags, spec loading, consoles."""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..errors import SpecError
from ..version import __version__

app = typer.Typer(
    name="specc",
    help="Compile declarative Transformer specs to PyTorch, ONNX and cost reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# Piped output is read by programs and people with wide windows: do not wrap tables at 80 columns.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)
state = {"debug": False}


class Dtype(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"


SpecArg = Annotated[str, typer.Argument(help="spec file (YAML) or preset name, e.g. gpt2")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="override a spec key: --set blocks=6 --set attention.heads=8"),
]
TrustPickleOpt = Annotated[
    bool,
    typer.Option(
        "--trust-pickled-checkpoint",
        help="read a checkpoint folder written by an older specc (pickled .metadata: reading it runs code the file "
        "names; only for folders you wrote yourself)",
    ),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"specc {__version__}")
        raise typer.Exit()


@app.callback()
def _global(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks for user errors too")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    state["debug"] = debug


def load(spec: str, sets: list[str] | None = None):  # -> SpecModel
    """A validated spec; its file is one of the command's inputs (never to be overwritten by an output)."""
    from ..spec.loader import load_spec

    refuse_extends(sets)
    note_spec(spec)
    return load_spec(spec, sets or None)


def note_spec(spec: str) -> None:
    from ..io import note_input
    from ..spec.presets import resolve_source

    note_input(resolve_source(spec), f"the spec {spec}")


def refuse_extends(sets: list[str] | None) -> None:
    """``--set extends=...`` cannot work (``extends:`` is resolved while the file is read, before overrides),
    so it is an error rather than silently ignored."""
    for item in sets or []:
        key = item.partition("=")[0].strip()
        if key == "extends" or key.startswith("extends."):
            raise SpecError(
                f"--set {key}=... cannot change what a spec inherits",
                hint="`extends:` is resolved when the file is read: write it in the spec file, "
                "or give the parent spec itself and --set what differs",
            )


def output(path: str | os.PathLike[str], *inputs: object, replaces: tuple[object, ...] = ()) -> Path:
    """Check an output path before any work (``specc.io.output_target``): a regular file or a new name, not
    one of ``inputs`` (paths or (path, role) pairs; None entries skipped), in a writable folder."""
    from ..io import output_target

    named = [i for i in inputs if i is not None]
    return output_target(path, inputs=named, replaces=[r for r in replaces if r is not None])  # type: ignore[arg-type]
