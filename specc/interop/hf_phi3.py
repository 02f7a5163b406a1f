"""Phi-3 (``Phi3ForCausalLM``): a Llama-style decoder whose checkpoints fuse ``qkv_proj`` and ``gate_up_proj``
(hf_llama's plan slices them), with an optional sliding window on every layer and LongRoPE configs.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    window = cfg.optional_int("sliding_window")
    if window is not None and window < doc["context"]:
        doc["attention"].update(mask="sliding_window", window=window)
    # original_max_position_embeddings only shapes LongRoPE (read there). Phi-3's generate recomputes the cache
    # when a sequence first crosses it, so that every key is rotated with the long factors: rebuild_cache.
    cfg.ignore("original_max_position_embeddings")
    rope = position(cfg, partial=True)
    if rope.get("scaling", {}).get("type") == "longrope":
        rope["scaling"]["rebuild_cache"] = True
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp=dec.swiglu(cfg),
        position=rope,
        bias=False,
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(embedding="embd_pdrop", attention="attention_dropout", residual="resid_pdrop"),
    )
    return doc


FAMILY = Family(
    "Phi-3", ("Phi3ForCausalLM",), ("phi3",), ("decoder",), spec, hf_llama_weights.detect, hf_llama_weights.plan
)
