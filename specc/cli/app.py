"""The typer application and what every command shares: global flags, spec loading, consoles."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated

import typer
from rich.console import Console

from .. import __version__

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
    from ..spec.loader import load_spec

    return load_spec(spec, sets or None)
