"""RMSNorm variants: the (1 + weight) form (Gemma) and QK-norm on a slice of a packed q/k/v projection."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def rms(x: Tensor, weight: Tensor | None, eps: float, unit_offset: bool, mean_square=None) -> Tensor:
    """x / sqrt(mean(x²) + eps) over the last axis, in fp32; times weight after casting back (LLaMA), or
    times (1 + weight) in fp32 before casting back (Gemma), or nothing without a weight (Llama 4's L2 norm).
    ``mean_square(h)``: another mean of h² (one taken over features other processes hold too)."""
    h = x.float()
    h = h * torch.rsqrt((h.pow(2).mean(-1, keepdim=True) if mean_square is None else mean_square(h)) + eps)
    if weight is None:
        return h.to(x.dtype)
    if unit_offset:
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


class OffsetRMSNorm(nn.RMSNorm):
    """RMSNorm scaled by (1 + weight), the weight starting at zero (Gemma)."""

    unit_offset = True  # init_weights: the weight starts at 0

    def forward(self, x: Tensor) -> Tensor:
        return rms(x, self.weight, self.eps or 1e-6, True)


class SliceRMSNorm(nn.RMSNorm):
    """RMSNorm of features [start, start + width) of the last axis in groups of ``dim`` (QK-norm per head, or
    over the whole slice when dim = width); the other features pass through. Without ``affine``, no weight."""

    def __init__(
        self, dim: int, start: int, width: int, eps: float = 1e-6, unit_offset: bool = False, affine: bool = True
    ):
        super().__init__(dim, eps=eps, elementwise_affine=affine)
        self.start, self.width, self.unit_offset = start, width, unit_offset

    def forward(self, x: Tensor) -> Tensor:
        s, e = self.start, self.start + self.width
        part = x[..., s:e].unflatten(-1, (-1, self.normalized_shape[0]))
        part = rms(part, self.weight, self.eps or 1e-6, self.unit_offset).flatten(-2)
        return torch.cat((x[..., :s], part, x[..., e:]), -1)

    def extra_repr(self) -> str:
        offset = ", unit_offset=True" if self.unit_offset else ""
        offset += "" if self.weight is not None else ", affine=False"
        return f"{self.normalized_shape[0]}, start={self.start}, width={self.width}, eps={self.eps}{offset}"
