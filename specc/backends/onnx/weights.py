"""The parameters an export streams: the seeded initialisation (the torch backend's own, so both backends hold
the same values), a safetensors checkpoint (specc or Hugging Face names) or a dict of tensors (sources.py)."""

from __future__ import annotations

from typing import Any

from ...ir.graph import LayerGraph
from .sources import WeightSource, open_weights


def export_weights(spec: Any, g: LayerGraph, weights: Any = None) -> WeightSource:
    """The source of every parameter of ``g`` (checked from headers and names; no tensor is read yet)."""
    return open_weights(g, weights)
