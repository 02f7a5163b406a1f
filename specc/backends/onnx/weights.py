"""Parameter tensors for export, from the torch backend so both backends share one initialisation and one
weight loader (safetensors with specc names, a ``specc compile --target torch`` checkpoint, or a dict)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ...ir.graph import LayerGraph


def export_weights(spec: Any, g: LayerGraph, weights: Any = None) -> Mapping[str, np.ndarray]:
    """IR parameter name → fp32 array, for every parameter of ``g`` (tied ones under their owner)."""
    import torch

    from ..torch.build import build_torch

    model = build_torch(spec, weights=weights, device="cpu", dtype=torch.float32)
    state = model.state_dict()
    out: dict[str, np.ndarray] = {}
    for name in g.params():
        t = state[name]
        out[name] = t.detach().to(torch.float32).contiguous().numpy()
    return out
