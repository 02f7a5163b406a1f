"""A dual encoder's scoring of texts against images (CLIP, SigLIP)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Contrastive(nn.Module):
    """logits_per_text = exp(logit_scale) · text · imageᵀ (+ logit_bias) for unit embeddings [B_t, D], [B_i, D]."""

    def __init__(self, logit_scale: float = 2.6592, logit_bias: float | None = None):
        super().__init__()
        self.constants = {"logit_scale": logit_scale}  # init_weights' starting values
        self.logit_scale = nn.Parameter(torch.full((1,), logit_scale))
        self.logit_bias = None if logit_bias is None else nn.Parameter(torch.full((1,), logit_bias))
        if logit_bias is not None:
            self.constants["logit_bias"] = logit_bias

    def forward(self, text: Tensor, image: Tensor) -> Tensor:
        logits = text @ image.t() * self.logit_scale.exp()
        return logits if self.logit_bias is None else logits + self.logit_bias
