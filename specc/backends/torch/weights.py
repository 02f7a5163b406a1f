"""Reading weights: safetensors files or dicts, renamed to specc names and checked against the IR by name."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...errors import SpecError
from ...interop.names import to_specc_names
from ...ir.graph import LayerGraph


def read_weights(source: str | os.PathLike[str] | dict[str, Any], graph: LayerGraph) -> dict[str, torch.Tensor]:
    """Tensors by IR parameter name; missing, unexpected and mis-shaped tensors are reported by name."""
    if isinstance(source, dict):
        tensors = dict(source)
        origin = "weights"
    else:
        origin = os.fspath(source)
        tensors = load_safetensors(origin)
    tensors = to_specc_names(graph, tensors)
    if isinstance(source, dict):  # the model takes ownership of what it loads: never alias the caller's tensors
        tensors = {name: t.detach().clone() for name, t in tensors.items()}
    want = {name: tuple(p.shape) for name, p in graph.params().items()}
    missing = sorted(set(want) - set(tensors))
    unexpected = sorted(set(tensors) - set(want))
    shapes = sorted(
        f"{n}: {list(tensors[n].shape)} (expected {list(want[n])})"
        for n in set(want) & set(tensors)
        if tuple(tensors[n].shape) != want[n]
    )
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:6])}{', ...' if len(items) > 6 else ''}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes))
        if items
    ]
    if problems:
        raise SpecError(
            f"weights do not match {graph.meta.get('name', 'the spec')}: " + "; ".join(problems),
            file=origin,
            hint="tensor names must be specc scope names (see `specc graph SPEC`) or a known checkpoint layout",
        )
    return tensors


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """One .safetensors file, a sharded checkpoint's index, or a folder holding either (as save_pretrained writes)."""
    from safetensors import SafetensorError

    from ...interop.checkpoint import load

    if not os.path.exists(path):
        raise SpecError(f"no such weights file: {path}", file=path)
    try:
        return load(path)
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise SpecError(f"cannot read safetensors: {e}", file=path) from None
