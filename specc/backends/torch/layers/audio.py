"""Whisper's audio front-end: strided 1-D convolutions over the mel frames, and the fixed sinusoid table."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


def whisper_sinusoids(length: int, dim: int) -> Tensor:
    """[length, dim]: [sin | cos] halves of position × timescales log-spaced from 1 to 10⁴ (transformers'
    modeling_whisper.sinusoids, OpenAI's)."""
    inv = torch.exp(-math.log(10000) / (dim // 2 - 1) * torch.arange(dim // 2))
    angles = torch.arange(length).view(-1, 1) * inv.view(1, -1)
    return torch.cat([angles.sin(), angles.cos()], dim=1)


class FrameConv1d(nn.Conv1d):
    """nn.Conv1d over audio frames [B, C, T]: the input in the weights' dtype (features arrive as fp32), the
    output laid out as a sequence of tokens [B, T, C] when ``tokens_out``."""

    def __init__(self, *args: Any, tokens_out: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.tokens_out = tokens_out

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        y = super().forward(x.to(self.weight.dtype))
        return y.transpose(1, 2) if self.tokens_out else y


class SinusoidTable(nn.Module):
    """x + weight[:N]: a table holding Whisper's sinusoids, a parameter (as transformers holds it) never trained."""

    def __init__(self, positions: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(positions, dim), requires_grad=False)

    def sinusoids(self) -> Tensor:
        return whisper_sinusoids(*self.weight.shape)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.weight[: x.shape[1]]
