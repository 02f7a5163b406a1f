"""Attention cores: packed heads in, heads merged out; RoPE, the KV cache, masks, SDPA or explicit softmax.

Self-attention reads a packed projection ``[q heads | k heads | v heads]`` (each ``head_dim`` wide); cross-
attention reads ``q`` and a packed ``[k | v]``. ``attention_mask`` is the key padding mask [B, N_k]
(1 = keep, 0 = pad). ``impl = "math"`` (or recording) uses the explicit softmax path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .state import State, positions_of


def visible(mask: str, q_pos: Tensor, k_pos: Tensor, window: int | None, prefix: int | None) -> Tensor:
    """[N_q, N_k] boolean visibility of a structural mask (True = may attend)."""
    q, k = q_pos[:, None], k_pos[None, :]
    if mask == "causal":
        return k <= q
    if mask == "sliding_window":
        assert window is not None
        return (k <= q) & (k > q - window)  # `window` keys back, self included
    if mask == "prefix":
        assert prefix is not None
        return k <= q.clamp(min=prefix - 1)  # the prefix sees itself whole; the rest is causal
    return torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)


def build_mask(
    mask: str, n_q: int, n_k: int, pad: Tensor | None, state: State | None, window: int | None, prefix: int | None
) -> tuple[Tensor | None, bool]:
    """(boolean mask [B | 1, 1, N_q, N_k] or None, is_causal), built once per call and kind."""
    offset = state.offset if state is not None else 0
    key = ("mask", mask, window, prefix, pad is None)  # one query and key length per call
    if state is not None and key in state.memo:
        return state.memo[key]
    if pad is None and mask == "none":
        out: tuple[Tensor | None, bool] = (None, False)
    elif pad is None and mask == "causal" and offset == 0 and n_q == n_k:
        out = (None, True)  # purely causal: SDPA picks its fused causal kernel
    elif pad is None and mask == "causal" and n_q == 1:
        out = (None, False)  # one new token after the cache sees every cached key
    elif mask == "prefix" and state is not None and state.positions_from is not None and pad is not None:
        # Positions follow the padding mask: a row's prefix is its first `prefix` real tokens, wherever they sit.
        pos = (pad.long().cumsum(-1) - 1).clamp(min=0)  # [B, N_k]
        k_pos, q_pos = pos[:, None, None, :], pos[:, -n_q:, None][:, None]
        allowed = (k_pos <= q_pos.clamp(min=prefix - 1)) & pad[:, None, None, :].bool()
        allowed = allowed | ~allowed.any(-1, keepdim=True)
        out = (allowed, False)
    else:
        device = pad.device if pad is not None else None
        q_pos = torch.arange(offset, offset + n_q, device=device)
        allowed = visible(mask, q_pos, torch.arange(n_k, device=device), window, prefix)[None, None]
        if pad is not None:
            allowed = allowed & pad[:, None, None, :].bool()
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # fully padded query rows: avoid NaN, ignored
        out = (allowed, False)
    if state is not None:
        state.memo[key] = out
    return out


class Rotary(nn.Module):
    """RoPE on the first ``dims`` dims of each q/k head (GPT-NeoX half split), cos/sin built once per call."""

    def __init__(self, dims: int, theta: float = 10000.0):
        super().__init__()
        self.dims, self.theta = dims, theta

    def forward(self, q: Tensor, k: Tensor, state: State | None) -> tuple[Tensor, Tensor]:
        key = ("rope", self.dims, self.theta, q.dtype)
        if state is not None and key in state.memo:
            cos, sin = state.memo[key]
        else:
            pos = positions_of(state, q.shape[2], q.device).float()
            inv = self.theta ** (-torch.arange(0, self.dims, 2, device=q.device, dtype=torch.float32) / self.dims)
            angles = pos[:, None, :, None] * inv  # [B | 1, 1, N, dims / 2]
            cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
            if state is not None:
                state.memo[key] = cos, sin
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin)

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = self.dims // 2
        x1, x2 = x[..., :half], x[..., half : self.dims]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
        return rotated if self.dims == x.shape[-1] else torch.cat((rotated, x[..., self.dims :]), -1)

    def extra_repr(self) -> str:
        return f"dims={self.dims}, theta={self.theta:g}"


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float, p: float
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, explicitly: returns (output, probabilities [B, H, N_q, N_k])."""
    if k.shape[1] != q.shape[1]:  # GQA: query head j reads kv head j // group, as SDPA's enable_gqa does
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.matmul(F.dropout(probs, p, True) if p else probs, v), probs


class _Core(nn.Module):
    """Shared by both cores: the kernel choice and the attention-map recorder."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, scale: float, dropout: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale, self.dropout = scale, dropout
        self.impl = "sdpa"  # sdpa (fused kernels) | math (explicit softmax)
        self.recorder: tuple[dict[str, Tensor], str] | None = None  # set by Model.attention_maps()

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        p = self.dropout if self.training else 0.0
        if self.impl == "math" or self.recorder is not None:
            y, probs = math_attention(q, k, v, mask, causal, self.scale, p)
            if self.recorder is not None:
                maps, name = self.recorder
                maps[name] = probs.detach()
        else:
            gqa = self.kv_heads != self.heads
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=self.scale, enable_gqa=gqa
            )
        b, _, n, _ = y.shape
        return y.transpose(1, 2).reshape(b, n, self.heads * self.head_dim)

    def extra_repr(self) -> str:
        extra = f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"heads={self.heads}{extra}, head_dim={self.head_dim}"


class SelfAttention(_Core):
    """softmax(q kᵀ · scale + mask) v over a packed qkv projection, with RoPE and the KV cache."""

    def __init__(
        self,
        heads: int,
        kv_heads: int,
        head_dim: int,
        mask: str = "causal",
        scale: float | None = None,
        window: int | None = None,
        prefix: int | None = None,
        rope: nn.Module | None = None,
        dropout: float = 0.0,
    ):
        super().__init__(heads, kv_heads, head_dim, scale or 1.0 / math.sqrt(head_dim), dropout)
        self.mask, self.window, self.prefix = mask, window, prefix
        self.rope = rope

    def forward(self, qkv: Tensor, attention_mask: Tensor | None = None, state: State | None = None) -> Tensor:
        b, n, _ = qkv.shape
        h, kv = self.heads, self.kv_heads
        packed = qkv.view(b, n, h + 2 * kv, self.head_dim).transpose(1, 2)  # views, no copies
        q, k, v = packed[:, :h], packed[:, h : h + kv], packed[:, h + kv :]
        if self.rope is not None:
            q, k = self.rope(q, k, state)
        if state is not None and state.cache is not None:
            k, v = state.cache.update(self, k, v)
        mask = "none" if self.mask == "padding" else self.mask  # padding comes from attention_mask alone
        m, causal = build_mask(mask, n, k.shape[2], attention_mask, state, self.window, self.prefix)
        return self.attend(q, k, v, m, causal)

    def extra_repr(self) -> str:
        out = f"{super().extra_repr()}, mask={self.mask!r}"
        if self.window:
            out += f", window={self.window}"
        if self.prefix:
            out += f", prefix={self.prefix}"
        return out


class CrossAttention(_Core):
    """Queries of one sequence attend to a packed [k | v] projection of another (the encoder's output)."""

    def forward(
        self, q: Tensor, kv: Tensor, attention_mask: Tensor | None = None, state: State | None = None
    ) -> Tensor:
        b, n, _ = q.shape
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        packed = kv.view(b, kv.shape[1], 2 * self.kv_heads, self.head_dim).transpose(1, 2)
        k, v = packed[:, : self.kv_heads], packed[:, self.kv_heads :]
        m, _ = build_mask("none", n, k.shape[2], attention_mask, None, None, None)
        return self.attend(q, k, v, m, False)
