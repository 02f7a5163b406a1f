"""Preset specs: the YAML files in the repository's ``specs/`` folder (or ``$SPECC_PRESETS``)."""

from __future__ import annotations

import os
from pathlib import Path


def presets_dir() -> Path:
    env = os.environ.get("SPECC_PRESETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "specs"


def preset_names() -> list[str]:
    d = presets_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def find_preset(name: str) -> Path | None:
    p = presets_dir() / f"{name}.yaml"
    return p if p.is_file() else None


def resolve_source(ref: str | os.PathLike[str]) -> Path:
    """A spec argument is a path, or a preset name (``gpt2``)."""
    p = Path(ref)
    if p.exists() or p.suffix in (".yaml", ".yml") or os.sep in str(ref):
        return p
    return find_preset(str(ref)) or p
