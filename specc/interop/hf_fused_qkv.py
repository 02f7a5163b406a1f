"""Fused q/k/v projections stored in another row order than specc's ``[q heads | k heads | v heads]``:
GPT-NeoX and multi-head Falcon interleave per head ``[q_h, k_h, v_h]``; Falcon's new decoder architecture stores
per KV group ``[q_{g,0} .. q_{g,r-1}, k_g, v_g]``. Both are ``tensor_ops.regroup`` of the rows: (groups, blocks of
q, k, v per group).
"""

from __future__ import annotations

from ..ir.graph import LayerGraph
from .weight_map import Rule, ShapeT, regrouped


def per_head(heads: int) -> tuple[int, tuple[int, int, int]]:
    """``[heads, 3, head_dim]`` (GPT-NeoX, multi-head Falcon): a group per head, one block each of q, k, v."""
    return heads, (1, 1, 1)


def per_group(heads: int, kv_heads: int) -> tuple[int, tuple[int, int, int]]:
    """``[kv_heads, heads / kv_heads + 2, head_dim]`` (Falcon new_decoder_architecture): a group per KV head, its
    query heads then its k and v; one group (multi-query) is specc's order already."""
    return kv_heads, (heads // kv_heads, 1, 1)


def fused_rule(g: LayerGraph, target: str, src: str, shape: ShapeT, layout: str) -> Rule:
    """The rule for ``blocks.i.attn.qkv.{weight,bias}`` from a fused HF tensor in ``layout``."""
    core = g.op(target.rsplit(".", 2)[0] + ".core").attrs
    h, kv = core.heads, core.kv_heads
    groups, sizes = per_head(h) if layout == "per_head" else per_group(h, kv)
    return regrouped(src, shape, groups, sizes, f"{layout.replace('_', ' ')} q/k/v")
