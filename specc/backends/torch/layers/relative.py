"""T5's relative position bias (Raffel 2020): a learned bias per head and bucketed distance k - q, added to the
scores as the attention's additive mask."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .attention import WindowedAttention
from .state import State


def relative_buckets(distance: Tensor, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """The bucket of each distance k - q, as transformers' ``T5Attention._relative_position_bucket``: half the
    buckets (per direction when bidirectional) exact, the rest logarithmic up to ``max_distance``; a causal stack
    buckets only the keys behind the query."""
    out = torch.zeros_like(distance)
    if bidirectional:
        buckets //= 2
        out = out + (distance > 0).long() * buckets
        distance = distance.abs()
    else:
        distance = -torch.clamp(distance, max=0)
    exact = buckets // 2
    large = exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (buckets - exact)).long()
    large = torch.clamp(large, max=buckets - 1)
    return out + torch.where(distance < exact, distance, large)


class RelativeBias(nn.Module):
    """The bias [1, H, N_q, N_k] of the new tokens (queries after the cached ones) over all keys so far:
    ``weight[bucket(k - q), h]``, ``weight`` [buckets, H] as transformers' ``relative_attention_bias``."""

    def __init__(self, heads: int, buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.heads, self.buckets, self.max_distance, self.bidirectional = heads, buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.empty(buckets, heads))

    def forward(self, ids: Tensor, state: State | None = None) -> Tensor:
        offset, n = (state.offset if state is not None else 0), ids.shape[1]
        q = torch.arange(offset, offset + n, device=ids.device)[:, None]
        k = torch.arange(offset + n, device=ids.device)[None]
        b = relative_buckets(k - q, self.bidirectional, self.buckets, self.max_distance)
        return self.weight[b].permute(2, 0, 1)[None]  # (1, H, N_q, N_k)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, buckets={self.buckets}, max_distance={self.max_distance}, " + (
            f"bidirectional={self.bidirectional}"
        )


class BiasedAttention(WindowedAttention):
    """SelfAttention whose scores add a given bias [1 | B, H, N_q, N_k] (T5's relative position bias), the
    structural and padding masks folded into it as -inf; SDPA with that float mask."""

    def forward(  # type: ignore[override]
        self, qkv: Tensor, bias: Tensor, attention_mask: Tensor | None = None, state: State | None = None
    ) -> Tensor:
        b, n, _ = qkv.shape
        q, k, v = qkv.view(b, n, -1, self.head_dim).transpose(1, 2).split([self.heads, self.kv_heads, self.kv_heads], 1)
        if state is not None and state.cache is not None:
            k, v = state.cache.update(self, k, v)
        # the masked bias once per call for all layers of a stack (as transformers' T5 passes its position_bias
        # on): a copy per layer would be kept per layer for the backward, [B, H, N_q, N_k] each with padding
        key = ("biased", id(bias), q.dtype, self.mask, self.window, self.prefix, self.chunk, attention_mask is None)
        held = state.memo.get(key) if state is not None else None
        if held is None or held[0] is not bias:
            held = (bias, self.masked(bias.to(q.dtype), n, k.shape[2], attention_mask, state, q))
            if state is not None:
                state.memo[key] = held  # the bias itself held too: its id is not reused while the entry lives
        return self.attend(q, k, v, held[1], False)

    def masked(self, bias: Tensor, n_q: int, n_k: int, pad: Tensor | None, state: State | None, q: Tensor) -> Tensor:
        """The bias with the structural and padding masks folded in as -inf."""
        allowed, causal = self.mask_for(n_q, n_k, pad, state, q)
        if causal:
            allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        return bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
