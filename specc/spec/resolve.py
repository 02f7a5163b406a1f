"""Defaults that depend on other fields, computed in one place (rules and lowering both use them)."""

from __future__ import annotations

from .schema import ClassicMLP, MoEMLP, SwiGLUMLP, _Transformer


def head_dim(spec: _Transformer) -> int:
    a = spec.attention
    return a.head_dim if a.head_dim is not None else spec.d_model // a.heads


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
    """Dims of each head that RoPE rotates: head_dim × fraction (valid only when an even whole number)."""
    return head_dim(spec) * spec.position.fraction


def mask(spec: _Transformer) -> str:
    m = spec.attention.mask
    if m is not None:
        return m
    return "causal" if getattr(spec, "kind", None) == "decoder" else "none"
