"""Token, position, patch and class-token embeddings, and RMSNorm."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .state import State


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(same); positions [...]."""
    inv = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) * (-math.log(1e4) / dim))
    angles = positions.float()[..., None] * inv
    return torch.stack((angles.sin(), angles.cos()), -1).flatten(-2)[..., :dim]


def scaled(x: Tensor, scale: float) -> Tensor:
    """x · scale with the scale rounded to x's dtype first (Gemma: embeddings × torch.tensor(√d, dtype))."""
    return x * x.new_full((), scale)


class LearnedPositions(nn.Embedding):
    """x + table[position] (GPT-2, BERT); positions follow the padding mask when the call has one."""

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:  # type: ignore[override]
        return x + super().forward((State() if state is None else state).positions(x.shape[1], x.device))


class OffsetPositions(nn.Embedding):
    """x + table[offset + position]: OPT and RoBERTa store ``offset`` rows before position 0; with a padding mask
    a padded slot reads row offset - 1 (HF: cumsum(mask) · mask - 1 + offset)."""

    def __init__(self, positions: int, dim: int, offset: int):
        super().__init__(offset + positions, dim)
        self.offset = offset

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:  # type: ignore[override]
        state = State() if state is None else state
        pos, mask = state.positions(x.shape[1], x.device), state.positions_from
        if mask is not None:
            pos = pos.masked_fill(mask[:, -x.shape[1] :] == 0, -1)
        return x + super().forward(pos + self.offset)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, offset={self.offset}"


class SinusoidalPositions(nn.Module):
    """x + the fixed sin/cos table at each token's position."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, state: State | None = None) -> Tensor:
        pos = (State() if state is None else state).positions(x.shape[1], x.device)
        return x + sinusoids(pos, self.dim).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class TypeEmbedding(nn.Embedding):
    """x + table[token_type_ids] (BERT segments); without ids every token is type 0."""

    def forward(self, x: Tensor, token_type_ids: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return x + (self.weight[0] if token_type_ids is None else super().forward(token_type_ids))


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm; half precision normalises in fp32 and scales after casting back, as LLaMA does."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class PatchEmbed(nn.Conv2d):
    """pixel_values [B, C, S, S] → conv (kernel = stride = patch) → [B, grid², dim], patches row-major."""

    def __init__(self, channels: int, dim: int, patch: int, bias: bool = True):
        super().__init__(channels, dim, patch, stride=patch, bias=bias)

    def forward(self, pixel_values: Tensor) -> Tensor:  # type: ignore[override]
        return super().forward(pixel_values).flatten(2).transpose(1, 2)


class ClsToken(nn.Module):
    """Prepends a learned class token: [B, N, D] → [B, N + 1, D]."""

    def __init__(self, dim: int):
        super().__init__()
        self.token = nn.Parameter(torch.empty(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat((self.token.expand(x.shape[0], -1, -1), x), 1)


class Probe(nn.Module):
    """A learned query token per example: [B, N, D] → [B, 1, D] (SigLIP's attention-pooling probe)."""

    def __init__(self, dim: int):
        super().__init__()
        self.token = nn.Parameter(torch.empty(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.token.repeat(x.shape[0], 1, 1)  # a copy: a view of a parameter under no_grad trips hooks


class LearnedPositions2d(nn.Module):
    """x + row[i] + col[j] for patch (i, j); the class token (first, if any) has its own vector."""

    def __init__(self, grid: int, dim: int, cls: bool = False):
        super().__init__()
        self.grid, self.dim = grid, dim
        self.row = nn.Parameter(torch.empty(grid, dim))
        self.col = nn.Parameter(torch.empty(grid, dim))
        self.cls = nn.Parameter(torch.empty(1, dim)) if cls else None

    def forward(self, x: Tensor) -> Tensor:
        pos = (self.row[:, None, :] + self.col[None, :, :]).reshape(self.grid * self.grid, self.dim)
        return x + (pos if self.cls is None else torch.cat((self.cls, pos)))


class SinusoidalPositions2d(nn.Module):
    """x + a fixed 2-D sin/cos table: half the dims encode the row, half the column; class token gets zeros."""

    def __init__(self, grid: int, dim: int, cls: bool = False):
        super().__init__()
        self.grid, self.dim, self.cls = grid, dim, cls

    def forward(self, x: Tensor) -> Tensor:
        g, d = self.grid, self.dim
        idx = torch.arange(g, device=x.device)
        rows = sinusoids(idx, d // 2)[:, None, :].expand(g, g, -1)
        cols = sinusoids(idx, d - d // 2)[None, :, :].expand(g, g, -1)
        pos = torch.cat((rows, cols), -1).reshape(g * g, d)
        if self.cls:
            pos = torch.cat((pos.new_zeros(1, d), pos))
        return x + pos.to(x.dtype)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, dim={self.dim}, cls={self.cls}"
