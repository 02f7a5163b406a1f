"""Activations torch.nn does not have."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def quick_gelu(x: Tensor) -> Tensor:
    """x·σ(1.702x): CLIP's sigmoid approximation of GELU."""
    return x * torch.sigmoid(1.702 * x)


class QuickGELU(nn.Module):
    """x·σ(1.702x) (CLIP)."""

    def forward(self, x: Tensor) -> Tensor:
        return quick_gelu(x)
