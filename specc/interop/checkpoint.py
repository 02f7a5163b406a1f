"""Reading safetensors checkpoints as ``save_pretrained`` writes them: one file, or shards with an index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import SpecError

INDEX = "model.safetensors.index.json"


def files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint file or folder (sharded folders through their index)."""
    p = Path(path)
    if p.is_file():
        if p.name.endswith(".index.json"):
            shards = sorted(set(json.loads(p.read_text(encoding="utf-8"))["weight_map"].values()))
            return [p.parent / s for s in shards]
        return [p]
    if (p / INDEX).is_file():
        return files(p / INDEX)
    if (p / "model.safetensors").is_file():
        return [p / "model.safetensors"]
    raise SpecError(f"no safetensors weights at {p}", file=str(p), hint="expected model.safetensors or " + INDEX)


def find(folder: str | Path) -> Path | None:
    """The checkpoint beside a config.json, if there is one."""
    p = Path(folder)
    p = p.parent if p.is_file() else p
    for name in (INDEX, "model.safetensors"):
        if (p / name).is_file():
            return p / name
    return None


def shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from the headers only (no tensor data is read)."""
    from safetensors import safe_open

    out: dict[str, tuple[int, ...]] = {}
    for f in files(path):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                out[k] = tuple(st.get_slice(k).get_shape())
    return out


def load(path: str | Path) -> dict[str, Any]:
    """All tensors of a checkpoint as torch tensors, under their stored names."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for f in files(path):
        out.update(load_file(str(f)))
    return out
