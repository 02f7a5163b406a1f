"""Which com.microsoft attention op serves an attention layer (GroupQueryAttention or MultiHeadAttention), and
what the contrib ops cannot express. The attention emitter and the KV-cache metadata both ask."""

from __future__ import annotations

from ...errors import SpecError
from ...ir.graph import Op


def uses_gqa(op: Op, dtype: str) -> bool:
    """GroupQueryAttention for causal self-attention when kv_heads < heads, and for every causal self-attention
    of an fp32 graph: on the CPU EP its kernel is the faster one (bench/profile_onnx.py), and it reads the packed
    projection without a Split. fp16 / bf16 graphs with kv_heads == heads keep MultiHeadAttention, which the
    CUDA EP backs with its fused kernels in every dtype (its GroupQueryAttention has no fp32 kernel at all)."""
    a = op.attrs
    causal = not a.cross and a.mask in ("causal", "sliding_window", "chunked")
    # its kernels need head_dim % 8 == 0; MultiHeadAttention takes any
    # attention sinks: only GroupQueryAttention has them (head_sink)
    return causal and (a.kv_heads < a.heads or a.sinks or (dtype == "fp32" and a.head_dim % 8 == 0))


def check_contrib(op: Op, dtype: str = "fp32") -> None:
    """What the contrib ops cannot express: GroupQueryAttention is always causal, MultiHeadAttention has no
    softcap."""
    a = op.attrs
    if a.softcap and not uses_gqa(op, dtype):
        raise SpecError(
            f"{op.name}: com.microsoft MultiHeadAttention has no softcap; this layer caps its scores at {a.softcap}",
            hint="export with --attention standard",
        )
    if a.sinks and not uses_gqa(op, dtype):
        raise SpecError(
            f"{op.name}: com.microsoft MultiHeadAttention has no attention sinks, and GroupQueryAttention (which "
            f"has) is causal only; this layer's mask is {a.mask}",
            hint="export with --attention standard",
        )
    if a.kv_heads != a.heads and (a.cross or a.mask not in ("causal", "sliding_window", "chunked")):
        raise SpecError(
            f"{op.name}: com.microsoft GroupQueryAttention is always causal; this layer has kv_heads < heads "
            f"with mask {'cross' if a.cross else a.mask}",
            hint="export with --attention standard",
        )
