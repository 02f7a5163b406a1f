"""The one exception type for user errors. It carries every problem found, each with its location and hint."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnostic:
    message: str
    file: str | None = None
    line: int | None = None  # 1-based
    col: int | None = None  # 1-based
    hint: str | None = None

    def where(self) -> str:
        if self.file is None:
            return ""
        if self.line is None:
            return f"{self.file}: "
        return f"{self.file}:{self.line}:{self.col or 1}: "

    def format(self) -> str:
        text = f"{self.where()}error: {self.message}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


def check_ids(ids: Iterable[int], vocab: int | None, what: str) -> None:
    """Token ids index a vocabulary: 0 ≤ id < vocab (no check when the vocabulary is unknown)."""
    if vocab is None:
        return
    bad = next((int(i) for i in ids if not 0 <= int(i) < vocab), None)
    if bad is not None:
        raise SpecError(f"{what} {bad} is outside the vocabulary (0..{vocab - 1})")


class SpecError(Exception):
    """A problem with user input (spec, flags, files). The CLI prints it and exits 2."""

    def __init__(self, diagnostics: list[Diagnostic] | str, *, hint: str | None = None, file: str | None = None):
        if isinstance(diagnostics, str):
            diagnostics = [Diagnostic(diagnostics, file=file, hint=hint)]
        self.diagnostics = diagnostics
        super().__init__(self.format())

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)
