"""Fused q/k/v projections stored in another row order than specc's ``[q heads | k heads | v heads]``:
GPT-NeoX and multi-head Falcon interleave per head ``[q_h, k_h, v_h]``; Falcon's new decoder architecture stores
per KV group ``[q_{g,0} .. q_{g,r-1}, k_g, v_g]``.
"""

from __future__ import annotations

from ..ir.graph import LayerGraph
from .plan import Rule, ShapeT, reordered


def _index(blocks: list[tuple[str, int]], heads: int, kv_heads: int, head_dim: int) -> list[int]:
    """specc row → HF row, for an HF layout given as its sequence of (q | k | v, head) blocks of head_dim rows."""
    start = {"q": 0, "k": heads, "v": heads + kv_heads}  # specc's block order
    at = {(which, h): i for i, (which, h) in enumerate(blocks)}
    order = sorted(at, key=lambda b: start[b[0]] + b[1])
    return [at[b] * head_dim + r for b in order for r in range(head_dim)]


def per_head(heads: int, head_dim: int) -> list[int]:
    """``[heads, 3, head_dim]`` (GPT-NeoX, multi-head Falcon)."""
    blocks = [(w, h) for h in range(heads) for w in "qkv"]
    return _index(blocks, heads, heads, head_dim)


def per_group(heads: int, kv_heads: int, head_dim: int) -> list[int]:
    """``[kv_heads, heads / kv_heads + 2, head_dim]`` (Falcon new_decoder_architecture)."""
    r = heads // kv_heads
    blocks = [b for g in range(kv_heads) for b in [*(("q", g * r + j) for j in range(r)), ("k", g), ("v", g)]]
    return _index(blocks, heads, kv_heads, head_dim)


def fused_rule(g: LayerGraph, target: str, src: str, shape: ShapeT, layout: str) -> Rule:
    """The rule for ``blocks.i.attn.qkv.{weight,bias}`` from a fused HF tensor in ``layout``."""
    core = g.op(target.rsplit(".", 2)[0] + ".core").attrs
    h, kv, hd = core["heads"], core["kv_heads"], core["head_dim"]
    index = per_head(h, hd) if layout == "per_head" else per_group(h, kv, hd)
    return reordered(src, shape, index, f"{layout.replace('_', ' ')} q/k/v")
