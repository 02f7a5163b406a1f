"""Picking the next token: greedy, or sampled after temperature, top-k and top-p."""

from __future__ import annotations

import torch
from torch import Tensor


class GenerationError(ValueError):
    """A generation request the model cannot serve, such as one longer than its learned positions."""


def pick_tokens(logits: Tensor, gen=None, temperature: float | None = 0, top_k: int = 0, top_p: float = 1) -> Tensor:
    """Next token per row of logits [B, V]: greedy at temperature 0, else sampled after top-k / top-p."""
    if not temperature:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        logits = logits.masked_fill(logits < logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:], -torch.inf)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)  # keep the most probable tokens whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(probs.cumsum(-1) - probs > top_p, -torch.inf))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
