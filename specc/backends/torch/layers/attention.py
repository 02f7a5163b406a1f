"""Attention cores: packed heads in, heads merged out, with RoPE, the KV cache and masks, through SDPA.

Self-attention reads a packed projection ``[q heads | k heads | v heads]`` (each ``head_dim`` wide); cross-
attention reads ``q`` and a packed ``[k | v]``. ``attention_mask`` is the key padding mask [B, N_k] (1 = keep,
0 = pad). A core's ``product`` is SDPA (soft-capped cores: the explicit softmax); specc's attention maps and
FLOP counts set an explicit-softmax ``product`` on the instance.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .state import State


class AttentionCore(nn.Module):
    """Heads [B, H, N, D] → merged [B, N, H·D] through SDPA."""

    mask, window, prefix, chunk = "none", None, None, None  # padding comes from attention_mask alone

    def __init__(self, heads: int, kv_heads: int, head_dim: int, scale: float | None = None, dropout: float = 0.0):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale, self.dropout = scale or 1.0 / head_dim**0.5, dropout

    def mask_for(
        self, n_q: int, n_k: int, pad: Tensor | None, state: State | None, queries: Tensor
    ) -> tuple[Tensor | None, bool]:
        """(boolean mask [B | 1, 1, N_q, N_k] or None, is_causal) on the queries' device, built once per call."""
        mask = "none" if self.mask == "padding" else self.mask
        if pad is None and (mask == "none" or (mask == "causal" and n_q == 1)):
            return None, False  # one new token after the cache sees every key
        if pad is None and mask == "causal" and n_q == n_k:  # no cache before these queries
            return None, True  # purely causal: SDPA's fused causal kernel (a literal: tracing keeps it)
        key = ("mask", mask, self.window, self.prefix, self.chunk, pad is None)
        if state is not None and key in state.memo:
            return state.memo[key]
        device = queries.device
        q, k = torch.arange(n_k - n_q, n_k, device=device)[:, None], torch.arange(n_k, device=device)  # after cache
        if mask in ("prefix", "chunked") and state is not None and state.positions_from is not None and pad is not None:
            # each row's own positions: its prefix (its chunks, as HF counts them) start at its first real token
            k = (pad.long().cumsum(-1) - 1).clamp(min=0)[:, None, None, :]
            q = k[..., -n_q:].transpose(-1, -2)
        allowed = self.allows(k, q).reshape(-1, 1, n_q, n_k)
        if pad is not None:
            allowed = allowed & pad[:, None, None, :].bool()
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # fully padded query rows: no NaN (ignored)
        if state is not None:
            state.memo[key] = (allowed, False)
        return allowed, False

    def allows(self, k: Tensor, q: Tensor) -> Tensor:
        """Which keys (positions ``k``) the queries (positions ``q``) may see under this core's mask, padding aside
        (broadcast: [N_k] against [N_q, 1], or per row)."""
        if self.mask == "prefix":  # the prefix sees itself whole; the rest is causal
            return k <= q.clamp(min=(self.prefix or 0) - 1)
        seen = k <= q if self.mask in ("causal", "sliding_window", "chunked") else torch.ones_like(k <= q)
        if self.mask == "sliding_window":  # `window` keys back, self included
            seen = seen & (k > q - (self.window or 0))
        if self.mask == "local":  # two-sided: window // 2 keys either side, self included (ModernBERT)
            seen = (k - q).abs() <= (self.window or 0) // 2
        if self.mask == "chunked":  # causal inside each chunk of positions
            seen = seen & (k // self.chunk == q // self.chunk)
        return seen

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        y = self.product(q, k, v, mask, causal, self.dropout if self.training else 0.0)
        return y.transpose(1, 2).flatten(2)

    def product(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
        """softmax(q kᵀ · scale + mask) v by SDPA, heads [B, H, N_q, D]."""
        gqa = self.kv_heads != self.heads
        return F.scaled_dot_product_attention(q, k, v, mask, p, causal, scale=self.scale, enable_gqa=gqa)

    def extra_repr(self) -> str:
        kv = f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else ""
        extra = "".join(f", {k}={v!r}" for k in ("mask", "window", "prefix", "chunk") if (v := getattr(self, k, None)))
        return f"heads={self.heads}{kv}, head_dim={self.head_dim}{extra}"


class SelfAttention(AttentionCore):
    """softmax(q kᵀ · scale + mask) v over a packed [q | k | v] projection, with the KV cache."""

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
        chunk: int | None = None,
    ):
        super().__init__(heads, kv_heads, head_dim, scale, dropout)
        self.mask, self.window, self.prefix, self.rope, self.chunk = mask, window, prefix, rope, chunk

    def forward(self, qkv: Tensor, attention_mask: Tensor | None = None, state: State | None = None) -> Tensor:
        b, n, _ = qkv.shape
        q, k, v = qkv.view(b, n, -1, self.head_dim).transpose(1, 2).split([self.heads, self.kv_heads, self.kv_heads], 1)
        if self.rope is not None:
            q, k = self.rope(q, k, state)
        if state is not None and state.cache is not None:
            k, v = state.cache.update(self, k, v)
        m, causal = self.mask_for(n, k.shape[2], attention_mask, state, q)
        return self.attend(q, k, v, m, causal)


def math_attention(
    core: AttentionCore, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float
) -> tuple[Tensor, Tensor]:
    """softmax(cap(q kᵀ · scale) + mask) v, explicitly: (output, probabilities [B, H, N_q, N_k]); cap is
    softcap · tanh(s / softcap) when the core has a ``softcap``, applied before the mask; a core's ``sinks``
    (one logit per head) join the softmax as one more column whose share is dropped."""
    if k.shape[1] != q.shape[1]:  # GQA: query head j reads kv head j // group, as SDPA's enable_gqa does
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * core.scale
    cap = getattr(core, "softcap", None)
    if cap:
        scores = torch.tanh(scores / cap) * cap
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:  # an additive bias (ALiBi), -inf where masked
        scores = scores + mask.to(scores.dtype)
    sinks = getattr(core, "sinks", None)
    if sinks is not None:  # one more logit per head in the denominator, its share dropped (GPT-OSS)
        column = sinks.reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        probs = torch.cat([scores, column], -1).float().softmax(-1)[..., :-1].to(q.dtype)
        return torch.matmul(F.dropout(probs, p, True) if p else probs, v), probs
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.matmul(F.dropout(probs, p, True) if p else probs, v), probs


class WindowedAttention(SelfAttention):
    """SelfAttention that cuts the keys no new query can see before attending: a decoding step of a sliding-window
    (chunked) layer reads its last ``window`` (``chunk``) cache entries, as a rolling cache would."""

    def visible(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        offset = k.shape[2] - q.shape[2]  # cached entries before the new queries
        first = 0
        if self.mask == "sliding_window" and self.window:
            first = max(0, offset - self.window + 1)
        elif self.mask == "chunked" and self.chunk:
            # the chunk of a left-padded row starts at its own first token: keep what any row's chunk may hold
            first = max(0, offset - self.chunk + 1)
        if not first or mask is None:
            return k, v, mask
        return k[:, :, first:], v[:, :, first:], mask[..., first:]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        return super().attend(q, *self.visible(q, k, v, mask), causal)


class SoftcapAttention(WindowedAttention):
    """SelfAttention with soft-capped scores, softcap · tanh(scores / softcap) before the mask (Gemma 2).

    SDPA cannot cap scores, so the core runs the explicit softmax (``math_attention``)."""

    def __init__(self, *args: Any, softcap: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.softcap = softcap

    def product(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
        return math_attention(self, q, k, v, mask, causal, p)[0]


def alibi_slopes(heads: int, max_bias: float = 8.0) -> list[float]:
    """ALiBi slopes (Press 2022), MPT's rule: head h of P = heads (a power of 2) has 2^(-max_bias·h/P); otherwise P
    is the next power of 2 and the heads take the slopes of h = 2, 4, .., P then 1, 3, .. (BLOOM's and Falcon's
    rule is the same with max_bias 8)."""
    p = 2 ** math.ceil(math.log2(heads))
    slopes = [2.0 ** (-max_bias * h / p) for h in range(1, p + 1)]
    return slopes if p == heads else (slopes[1::2] + slopes[::2])[:heads]


class AlibiAttention(WindowedAttention):
    """SelfAttention whose head h adds slope_h · (k - q) to its scores (ALiBi: BLOOM, MPT, Falcon-RW), times the
    score scale too when ``scaled`` (Falcon-RW); the mask is that additive bias, -inf where a key is hidden."""

    def __init__(self, *args: Any, max_bias: float = 8.0, scaled: bool = False, bf16: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_bias, self.scaled, self.bf16 = max_bias, scaled, bf16
        self.slopes = alibi_slopes(self.heads, max_bias)  # of every head: tensor parallelism keeps a slice
        self.head_start = 0  # the first of this module's heads (tensor parallelism: its rank's)

    def mask_for(
        self, n_q: int, n_k: int, pad: Tensor | None, state: State | None, queries: Tensor
    ) -> tuple[Tensor | None, bool]:
        """(additive bias [B | 1, H, N_q, N_k] in the queries' dtype, False), built once per call: one tensor the
        layers share (and autograd keeps once)."""
        key = (
            "alibi",
            queries.dtype,
            self.head_start,
            self.heads,
            self.max_bias,
            self.scaled and self.scale,
            self.bf16,
            self.mask,
            self.window,
            self.chunk,
            self.prefix,
            pad is None,
        )
        if state is not None and key in state.memo:
            return state.memo[key]
        allowed, causal = super().mask_for(n_q, n_k, pad, state, queries)
        device = pad.device if pad is not None else queries.device
        offset = state.offset if state is not None else 0
        q, k = torch.arange(offset, offset + n_q, device=device)[:, None], torch.arange(n_k, device=device)
        if causal:
            allowed = k <= q
        slopes = torch.tensor(self.slopes[self.head_start : self.head_start + self.heads], device=device)
        if self.bf16:  # Falcon-RW: bf16(bf16(slope) · position) at each key's own position, the same for every query
            at = (
                k if pad is None else ((pad.long().cumsum(-1) - 1) * pad.long())[:, None, None, :]
            )  # [B | 1, 1, 1, N_k]
            bias = (slopes.bfloat16()[:, None, None] * at).float()  # bf16 · int64 stays bf16, as in Falcon's code
        else:
            bias = slopes[:, None, None] * (k - q)  # [H, N_q, N_k]
        if self.scaled:
            bias = bias * self.scale
        if allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf"))  # [B | 1, H, N_q, N_k]
        bias = (bias if bias.dim() == 4 else bias[None]).to(queries.dtype)  # computed in fp32
        out: tuple[Tensor | None, bool] = (bias, False)
        if state is not None:
            state.memo[key] = out
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alibi_max_bias={self.max_bias}{', scaled=True' if self.scaled else ''}"


class SinkAttention(WindowedAttention):
    """SelfAttention with attention sinks: a learned logit per head in the softmax denominator, softmax over
    [scores, sink] with the sink's share dropped (GPT-OSS). SDPA has no sinks: the explicit softmax
    (``math_attention``), soft-capped too when ``softcap`` is given."""

    def __init__(self, *args: Any, softcap: float | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.softcap = softcap
        self.sinks = nn.Parameter(torch.empty(self.heads))

    def product(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
        return math_attention(self, q, k, v, mask, causal, p)[0]


class CrossAttention(AttentionCore):
    """Queries [B, N_q, H·D] attend to a packed [k | v] projection of another sequence (the encoder's)."""

    def forward(self, q: Tensor, kv: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        b, n, _ = q.shape
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = kv.view(b, kv.shape[1], 2 * self.kv_heads, self.head_dim).transpose(1, 2).chunk(2, 1)
        return self.attend(q, k, v, self.mask_for(n, k.shape[2], attention_mask, None, q)[0], False)


class LatentAttention(AttentionCore):
    """Multi-head latent attention (DeepSeek-V2/V3): q [B, N, H·(nope + rope)] and the KV latent [B, N, rank +
    rope] (normalised latent, then the one rotary key all heads share). ``kv_b`` expands the latent into each
    head's [k_nope | v]; k = [k_nope | rotary key]. The KV cache holds the latent and the rotated key only;
    decoding steps (a cache with a past) run the weight-absorbed form (``absorbed``), which never re-expands it."""

    def __init__(
        self,
        heads: int,
        nope_head_dim: int,
        rope_head_dim: int,
        v_head_dim: int,
        kv_rank: int,
        mask="causal",
        scale=None,
        window=None,
        prefix=None,
        rope: nn.Module | None = None,
        dropout=0.0,
        chunk=None,
    ):
        super().__init__(heads, heads, nope_head_dim + rope_head_dim, scale, dropout)
        self.nope, self.rope_dim, self.v_dim, self.rank = nope_head_dim, rope_head_dim, v_head_dim, kv_rank
        self.mask, self.window, self.prefix, self.rope, self.chunk = mask, window, prefix, rope, chunk
        self.kv_b = nn.Linear(kv_rank, heads * (nope_head_dim + v_head_dim), bias=False)

    def forward(self, q: Tensor, latent: Tensor, attention_mask: Tensor | None = None, state: State | None = None):
        b, n, _ = q.shape
        q_pass, q_rot = q.view(b, n, self.heads, self.head_dim).transpose(1, 2).split([self.nope, self.rope_dim], -1)
        c, k_rot = latent.unsqueeze(1).split([self.rank, self.rope_dim], -1)  # [B, 1, N, rank], [B, 1, N, rope]
        if self.rope is not None:
            q_rot, k_rot = self.rope(q_rot, k_rot, state)
        decoding = state is not None and state.cache is not None and state.offset > 0
        if state is not None and state.cache is not None:
            c, k_rot = state.cache.update(self, c, k_rot)
        t = c.shape[2]
        m, causal = self.mask_for(n, t, attention_mask, state, q)
        if decoding:  # weight-absorbed: attend over the cached latent itself, never re-expanding it
            return self.absorbed(q_pass, q_rot, c, k_rot, m, causal)
        kv = self.kv_b(c).view(b, t, self.heads, self.nope + self.v_dim).transpose(1, 2)  # (B, H, T, nope + v)
        k_nope, v = kv.split([self.nope, self.v_dim], -1)
        k = torch.cat((k_nope, k_rot.expand(-1, self.heads, -1, -1)), -1)
        return self.attend(torch.cat((q_pass, q_rot), -1), k, v, m, causal)

    def absorbed(self, q_pass: Tensor, q_rot: Tensor, c: Tensor, k_rot: Tensor, m: Tensor | None, causal: bool):
        """kv_b's K half folded into the query and its V half applied after: q_lat = q_nope · W_ukᵀ, attention
        with one shared K/V head (K = [latent | rotary key], V = latent), then y · W_uv; the same function."""
        w = self.kv_b.weight.view(self.heads, self.nope + self.v_dim, self.rank)
        w_uk, w_uv = w.split([self.nope, self.v_dim], 1)  # (H, nope, rank), (H, v, rank)
        q = torch.cat((torch.matmul(q_pass, w_uk), q_rot), -1)  # (B, H, N, rank + rope)
        y = self.product(q, torch.cat((c, k_rot), -1), c, m, causal, self.dropout if self.training else 0.0)
        return torch.matmul(y, w_uv.transpose(1, 2)).transpose(1, 2).flatten(2)  # (B, N, H·v)

    def product(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
        gqa = bool(k.shape[1] != q.shape[1])  # the absorbed form's one K/V head (a constant when traced)
        return F.scaled_dot_product_attention(q, k, v, mask, p, causal, scale=self.scale, enable_gqa=gqa)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, nope={self.nope}, rope={self.rope_dim}, v={self.v_dim}, kv_rank={self.rank}" + (
            f", mask={self.mask!r}" if self.mask != "causal" else ""
        )
