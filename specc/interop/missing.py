"""What specc lacks, per Hugging Face class it does not import: a table of feature detectors, so that such a
config is refused at the line of the first field specc cannot express, naming the feature ("attention sinks
are not supported"), never only the class. A class leaves this table when its family lands in the registry.

Each row names a feature, the classes that have it, and the config fields that state it (dotted for nested
objects: ``attn_config.alibi``). Of the rows a config triggers, the one whose field comes first in the file wins.
A feature a class always has, with no field of its own (Llama 4's vision encoder, without pixel_shuffle_ratio), is
blamed on ``model_type``, after every feature a field states (the first such row in the table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Diagnostic, SpecError
from .hf_config import HFConfig


def _always(data: dict[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class Missing:
    feature: str  # the message: "attention sinks are not supported"
    architectures: tuple[str, ...]  # the HF classes that have it
    keys: tuple[str, ...]  # the config fields stating it; the first one present in the file is blamed
    when: Callable[[dict[str, Any]], bool] = _always  # does this config use it?
    hint: str | None = None


def _set(key: str, off: Any = None) -> Callable[[dict[str, Any]], bool]:
    """The field is present and not ``off`` (a feature switched on)."""
    return lambda d: d.get(key, off) not in (off, None)


def _nested(key: str, sub: str) -> Callable[[dict[str, Any]], bool]:
    return lambda d: isinstance(d.get(key), dict) and bool(d[key].get(sub))


ROWS: tuple[Missing, ...] = (
    Missing(
        "Llama 4's vision encoder (an unfolded patch projection, 2-D rotary positions, pixel shuffle into the "
        "text model's inputs) is not supported",
        ("Llama4VisionModel",),
        ("pixel_shuffle_ratio", "model_type"),
        hint="a Llama4ForConditionalGeneration config imports its text model",
    ),
)


def refusal(cfg: HFConfig, arch: str) -> SpecError | None:
    """The error naming the first feature of ``arch`` this config uses that specc lacks (None: no row knows)."""
    found: list[tuple[int, int, str, Missing]] = []  # (stated by a field?, where, field, row)
    for row in ROWS:
        if arch not in row.architectures or not row.when(cfg.data):
            continue
        at = [(pos, key) for key in row.keys if key != "model_type" and (pos := cfg.offset(key)) is not None]
        if at:
            found.append((0, *min(at), row))
        elif "model_type" in row.keys and (pos := cfg.offset("model_type")) is not None:
            found.append((1, len(found), "model_type", row))
    if not found:
        return None
    _, _, key, row = min(found, key=lambda f: f[:2])
    w = cfg.where_path(key)
    hint = row.hint or f"{arch} needs it; specc imports this class once the feature lands"
    return SpecError([Diagnostic(f"{key}: {row.feature}", w.file, w.line, w.col, hint)])
