"""Shared fixtures: a temporary spec writer and the CLI runner."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from specc.cli import run

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    def write(text: str | bytes, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8")
        return p

    return write


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run ``specc ARGS`` in-process; returns (exit code, stdout, stderr)."""

    def invoke(*args: str) -> tuple[int, str, str]:
        code = run([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
