"""The reference model every benchmark compares against: HF transformers' GPT2LMHeadModel (sdpa) of a
GPT-2-shaped spec, and specc's model of the same spec loaded with HF's random weights (HF names are mapped
by specc's interop), so both sides of a comparison compute the same function."""

from __future__ import annotations

from typing import Any

import torch

import specc


def gpt2_twins(spec: Any, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """(specc model, HF model) with identical weights, both in eval mode on ``device`` in ``dtype``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=spec.blocks,
        n_embd=spec.d_model,
        n_head=spec.attention.heads,
        n_inner=spec.mlp.hidden,
        n_positions=spec.context,
        vocab_size=spec.vocab_size,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        hf = GPT2LMHeadModel(config).to(dtype).eval()
    weights = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    ours = specc.build_torch(spec, weights=weights, device=device, dtype=dtype)
    return ours, hf
