"""The ``position:`` of a decoder family's layers (of one HF layer type, for per-layer-type RoPE)."""

from __future__ import annotations

from typing import Any

from .hf_config import HFConfig
from .rope_config import rope_position


def position(
    cfg: HFConfig, layer_type: str | None = None, partial: bool = False, theta: float = 10000.0
) -> dict[str, Any]:
    """RoPE from either config dialect. ``partial``: the family's attention rotates only the first
    ``partial_rotary_factor`` of each head (Phi, Phi-3, GPT-NeoX); otherwise a factor other than 1 is refused,
    as the family's HF attention would rotate whole heads whatever it says. ``theta``: the family's default base."""
    out = rope_position(cfg, layer_type, theta)
    if not partial and out.get("fraction", 1.0) != 1.0:
        raise cfg.refuse(
            "partial_rotary_factor", f"{out['fraction']!r} is not supported: this family rotates whole heads"
        )
    return out
