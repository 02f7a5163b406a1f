"""What the layers of one forward call share: the decoding cache, token positions, and tables built once."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class KVCache:
    """Decoding state: preallocated keys/values per attention module, recurrent states, values computed once."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0  # tokens already in the cache
        self.kv: dict[nn.Module, tuple[Tensor, Tensor]] = {}
        self.recurrent: dict[nn.Module, dict[str, Any]] = {}
        self.static: dict[nn.Module, Any] = {}  # outputs that do not depend on the generated tokens
        self.inputs: dict[str, Tensor | None] = {}  # inputs that do not grow (the source sequence)

    def update(self, layer: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write new keys/values [B, H, n, D] after the cached ones; return views of everything so far."""
        if layer not in self.kv:
            shape = (k.shape[0], k.shape[1], self.max_len, k.shape[3])
            self.kv[layer] = (k.new_empty(shape), v.new_empty(shape))
        ck, cv = self.kv[layer]
        end = self.length + k.shape[2]
        ck[:, :, self.length : end] = k
        cv[:, :, self.length : end] = v
        return ck[:, :, :end], cv[:, :, :end]


class State:
    """Per-call context: ``cache`` (None outside decoding), the padding mask positions follow, and a memo so
    that masks and rotary tables are built once per call instead of once per layer."""

    def __init__(self, cache: KVCache | None = None, positions_from: Tensor | None = None, last_only: bool = False):
        self.cache = cache
        self.offset = cache.length if cache is not None else 0
        self.positions_from = positions_from  # [B, offset + n] mask (1 = token, 0 = padding), or None
        self.last_only = last_only  # decoding: only the last position's logits are needed
        self.memo: dict[Any, Any] = {}

    def positions(self, n: int, device: torch.device) -> Tensor:
        """Positions [B | 1, n] of the n new tokens: counted over real tokens only when a padding mask is given
        (a left-padded row starts at 0, as HF does), else offset, offset + 1, ..."""
        key = "positions"  # one length per call
        if key not in self.memo:
            mask = self.positions_from
            if mask is None:
                pos = torch.arange(self.offset, self.offset + n, device=device)[None]
            else:
                pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n:]
            self.memo[key] = pos
        return self.memo[key]


def positions_of(state: State | None, n: int, device: torch.device) -> Tensor:
    return state.positions(n, device) if state is not None else torch.arange(n, device=device)[None]


def contiguous_offset(state: State | None) -> int | None:
    """The first position when positions are a plain range (no padding mask to follow), else None."""
    if state is None:
        return 0
    return state.offset if state.positions_from is None else None


def reuse(state: State | None, layer: nn.Module, *args: Any) -> Any:
    """``layer(*args)``, computed once per generated sequence while decoding (encoder outputs, cross K/V)."""
    cache = state.cache if state is not None else None
    if cache is None:
        return layer(*args)
    if layer not in cache.static:
        cache.static[layer] = layer(*args)
    return cache.static[layer]


def last_positions(x: Tensor, state: State | None) -> Tensor:
    """While decoding only the next token's logits are needed: keep the last position of [B, N, D]."""
    return x[:, -1:] if state is not None and state.last_only else x
