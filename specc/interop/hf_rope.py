"""The ``position:`` of a decoder family's layers (of one HF layer type, for per-layer-type RoPE)."""

from __future__ import annotations

from typing import Any

from . import hf_llama
from .hf_config import HFConfig


def position(cfg: HFConfig, layer_type: str | None = None) -> dict[str, Any]:
    if layer_type is not None:
        raise cfg.refuse("rope_parameters", "RoPE per layer type is not supported by this specc")
    return hf_llama._rotary(cfg)
