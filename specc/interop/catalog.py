"""The README's list of Hugging Face classes, written from the importer's registry (never kept by hand): what
``import-hf`` reads, what ``export-hf`` writes, and, for the classes it refuses, the feature specc lacks
(``missing.ROWS``). ``scripts/readme_classes.py`` writes the block; a test checks the README holds it."""

from __future__ import annotations

from .hf_config_write import WRITERS
from .missing import ROWS
from .registry import FAMILIES

BEGIN = "<!-- hf-classes: begin (written by scripts/readme_classes.py from specc/interop/registry.py) -->"
END = "<!-- hf-classes: end -->"


def markdown() -> str:
    """The block between ``BEGIN`` and ``END``, markers included."""
    lines = [BEGIN, "", "| family | Hugging Face classes (`import-hf`) | `model_type` | `export-hf` |"]
    lines.append("|---|---|---|---|")
    for f in FAMILIES:
        classes = ", ".join(f"`{a}`" for a in f.architectures)
        back = [a for a in f.architectures if a in WRITERS]
        writes = "all" if len(back) == len(f.architectures) else ", ".join(f"`{a}`" for a in back) or "—"
        lines.append(f"| {f.name} | {classes} | {', '.join(f'`{t}`' for t in f.model_types)} | {writes} |")
    n = sum(len(f.architectures) for f in FAMILIES)
    lines += ["", f"{n} classes. Refused, at the line of the first config field stating a feature specc lacks:", ""]
    lines += ["| Hugging Face classes | refused with |", "|---|---|"]
    for row in ROWS:
        lines.append(f"| {', '.join(f'`{a}`' for a in row.architectures)} | {row.feature} |")
    return "\n".join([*lines, "", END])


def replace_block(text: str) -> str:
    """``text`` (the README) with its block rewritten; a README without the markers is an error."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"README has no {BEGIN!r} ... {END!r} block")
    return text[:start] + markdown() + text[stop + len(END) :]
