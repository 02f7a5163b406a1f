"""A linear layer whose bias covers only some output features (Whisper's packed q|k|v: no bias on k)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SpanBiasLinear(nn.Module):
    """x @ weightᵀ + bias on the output features [start, stop) of each span, nothing on the rest; ``bias`` holds
    those features only, in order."""

    def __init__(self, in_features: int, out_features: int, spans: tuple[tuple[int, int], ...]):
        super().__init__()
        self.in_features, self.out_features, self.spans = in_features, out_features, spans
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(sum(b - a for a, b in spans)))

    def full_bias(self) -> Tensor:
        """The bias over every output feature (zeros outside the spans)."""
        parts, at, used = [], 0, 0
        for a, b in self.spans:
            parts += [self.bias.new_zeros(a - at), self.bias[used : used + b - a]]
            at, used = b, used + b - a
        return torch.cat([*parts, self.bias.new_zeros(self.out_features - at)])

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.full_bias())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, spans={self.spans}"
