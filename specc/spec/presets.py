"""Preset specs and device profiles: package data (``specc/presets/*.yaml``, ``specc/presets/devices/*.yaml``).

In the checkout ``specc/presets`` is a link to the repository's ``specs/`` folder; a built wheel holds the files
themselves, so an installed specc finds its presets from any working directory. ``$SPECC_PRESETS`` adds
folders (separated by ``os.pathsep``), searched before the built-in ones: a preset there shadows a built-in
preset of the same name, and its ``devices/`` subfolder adds device profiles.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "SPECC_PRESETS"


def presets_dir() -> Path:
    """The built-in presets folder."""
    packaged = Path(__file__).resolve().parents[1] / "presets"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "specs"  # a checkout without symbolic links


def extra_dirs() -> list[Path]:
    """Folders ``$SPECC_PRESETS`` adds, in order."""
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]


def preset_dirs() -> list[Path]:
    return [*extra_dirs(), presets_dir()]


def preset_names() -> list[str]:
    names = {p.stem for d in preset_dirs() if d.is_dir() for p in d.glob("*.yaml")}
    return sorted(names)


def find_preset(name: str) -> Path | None:
    if not name or os.sep in name or (os.altsep and os.altsep in name) or name.startswith("."):
        return None
    for d in preset_dirs():
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    return None


def devices_dir() -> Path:
    """The built-in device profiles folder."""
    return presets_dir() / "devices"


def find_device_profile(name: str) -> Path | None:
    """A device profile by name (``rtx4090``): ``$SPECC_PRESETS/*/devices`` first, then the built-in ones."""
    if not name or os.sep in name or (os.altsep and os.altsep in name) or name.startswith("."):
        return None
    for d in [*(e / "devices" for e in extra_dirs()), devices_dir()]:
        p = d / f"{name}.yaml"
        if p.is_file():
            return p
    return None


def resolve_source(ref: str | os.PathLike[str]) -> Path:
    """A spec argument is a path, or a preset name (``gpt2``)."""
    p = Path(ref)
    if p.exists() or p.suffix in (".yaml", ".yml") or os.sep in str(ref):
        return p
    return find_preset(str(ref)) or p
