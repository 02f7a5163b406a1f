"""Defaults that depend on other fields, computed in one place (rules and lowering both use them)."""

from __future__ import annotations

import math

from .schema import ClassicMLP, MoEMLP, SwiGLUMLP, _Transformer


def head_dim(spec: _Transformer) -> int:
    """Q/K head size: attention.head_dim, MLA's nope + rope part, or d_model / heads."""
    a = spec.attention
    if a.latent is not None:
        return a.latent.nope_head_dim + a.latent.rope_head_dim
    return a.head_dim if a.head_dim is not None else spec.d_model // a.heads


def v_head_dim(spec: _Transformer) -> int:
    """Value head size: MLA's v_head_dim (default nope_head_dim), else head_dim."""
    lat = spec.attention.latent
    if lat is not None:
        return lat.v_head_dim if lat.v_head_dim is not None else lat.nope_head_dim
    return head_dim(spec)


def attention_scale(spec: _Transformer) -> float:
    """attention.scale, or head_dim^-½; MLA under YaRN with mscale_all_dim also × mscale(factor, mscale_all_dim)²
    (DeepSeek's softmax_scale, transformers' yarn_apply_mscale)."""
    a = spec.attention
    if a.scale is not None:
        return float(a.scale)
    scale = 1.0 / math.sqrt(head_dim(spec))
    sc = spec.position.scaling if spec.position.type == "rotary" else None
    if a.latent is not None and sc is not None:
        scale *= latent_yarn_factor(sc.type, sc.factor, sc.mscale_all_dim)
    return scale


def latent_yarn_factor(kind: str | None, factor: float | None, mscale_all_dim: float | None) -> float:
    """What latent attention's scale carries beyond head_dim^-½: mscale(factor, mscale_all_dim)² under YaRN with
    mscale_all_dim and a factor over 1, else 1."""
    if kind != "yarn" or not mscale_all_dim or (factor or 1) <= 1:
        return 1.0
    m = 0.1 * mscale_all_dim * math.log(factor or 1) + 1.0
    return m * m


def kv_heads(spec: _Transformer) -> int:
    a = spec.attention
    return a.kv_heads if a.kv_heads is not None else a.heads


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def mlp_hidden(spec: _Transformer) -> int:
    """Hidden width of the MLP (of one expert for MoE)."""
    m = spec.mlp
    if m.hidden is not None:
        return m.hidden
    if isinstance(m, ClassicMLP) or (isinstance(m, MoEMLP) and m.expert == "classic"):
        return 4 * spec.d_model
    assert isinstance(m, (SwiGLUMLP, MoEMLP))
    return round_up(int(8 * spec.d_model / 3), m.multiple_of)


def mlp_activation(spec: _Transformer) -> str:
    m = spec.mlp
    if isinstance(m, MoEMLP) and m.activation is None:
        return "silu" if m.expert == "swiglu" else "gelu"
    assert m.activation is not None
    return m.activation


def final_norm(spec: _Transformer) -> bool:
    n = spec.norm
    return n.final if n.final is not None else n.placement != "post"


def embedding_scale(spec: _Transformer) -> float:
    s = spec.embedding_scale
    if s is None:
        return 1.0
    if s == "sqrt_d_model":
        return float(spec.d_model) ** 0.5
    return float(s)


def rotary_dims(spec: _Transformer) -> float:
    """Dims of each head that RoPE rotates: head_dim × fraction (valid only when an even whole number); MLA's
    rope_head_dim."""
    if spec.attention.latent is not None:
        return spec.attention.latent.rope_head_dim * spec.position.fraction
    return head_dim(spec) * spec.position.fraction


def qkv_bias(spec: _Transformer) -> tuple[bool, bool, bool]:
    """Whether the query, key and value projections carry a bias: each its own flag, else ``bias.qkv``."""
    b = spec.bias
    return tuple(b.qkv if f is None else f for f in (b.q, b.k, b.v))  # type: ignore[return-value]


def mask(spec: _Transformer) -> str:
    m = spec.attention.mask
    if m is not None:
        return m
    return "causal" if getattr(spec, "kind", None) == "decoder" else "none"
