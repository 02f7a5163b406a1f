"""What the layers of one forward call share: the decoding cache, token positions, and tables built once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn


class KVCache:
    """Decoding state: keys/values per attention layer, recurrent states, values computed once, fixed inputs."""

    def __init__(self, max_len: int, inputs: dict[str, Any] | None = None):
        self.max_len, self.length, self.inputs = max_len, 0, inputs or {}  # inputs that do not grow (the source)
        self.kv, self.recurrent, self.static = {}, {}, {}  # per layer: keys/values, recurrent states, fixed outputs

    def update(self, layer: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write keys/values [B, H, n, D] after the cached ones; return views of everything so far."""
        if layer not in self.kv:  # room for max_len tokens
            self.kv[layer] = tuple(t.new_empty(*t.shape[:2], self.max_len, t.shape[3]) for t in (k, v))
        (ck, cv), end = self.kv[layer], self.length + k.shape[2]
        ck[:, :, self.length : end], cv[:, :, self.length : end] = k, v
        return ck[:, :, :end], cv[:, :, :end]


class State:
    """Per call: the cache, the padding mask positions follow, and a memo of masks and tables."""

    def __init__(self, cache: KVCache | None = None, positions_from: Tensor | None = None, last_only: bool = False):
        self.cache, self.positions_from, self.last_only = cache, positions_from, last_only
        self.offset, self.memo = (cache.length if cache is not None else 0), {}  # memo: built once per call, for all

    def positions(self, n: int, device: torch.device) -> Tensor:
        """Positions [B | 1, n] of the new tokens: real tokens counted (left padding starts at 0) or a range."""
        if "positions" not in self.memo:
            mask, pos = self.positions_from, torch.arange(self.offset, self.offset + n, device=device)[None]
            self.memo["positions"] = pos if mask is None else (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n:]
        return self.memo["positions"]


def last_positions(x: Tensor, state: State | None) -> Tensor:
    """While decoding only the next token's logits are needed: the last position of [B, N, D]."""
    return x[:, -1:] if state is not None and state.last_only else x


def reuse(state: State | None, layer: nn.Module, compute: Callable[[], Any]) -> Any:
    """``compute()`` (a call of ``layer``), once per generated sequence while decoding (encoder outputs, cross K/V)."""
    cache = state.cache if state is not None else None
    if cache is None:
        return compute()
    if layer not in cache.static:
        cache.static[layer] = compute()
    return cache.static[layer]
