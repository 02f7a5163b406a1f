"""Multi-head latent attention (DeepSeek-V2/V3) → exactly one fused ai.onnx ``Attention`` node, in one of two forms:

- ``expanded`` (graphs without a KV cache): the latent of every key goes through ``kv_b`` to each head's
  ``[k_nope | v]``, k = ``[k_nope | shared rotary key]``, then ``Attention`` with q/k heads of nope + rope and v
  heads of v_head_dim (ONNX's Attention allows a v head size other than the q/k one). Cheapest for prefill: kv_b
  runs once per key and the scores are nope + rope wide.
- ``absorbed`` (KV-cache graphs, for decoding): kv_b's K half is absorbed into the query, q_lat = q_nope · W_ukᵀ per
  head, and attention runs over the cached latent itself as one shared K/V head (MQA, ``kv_num_heads`` = 1):
  K = ``[latent | rotary key]``, V = latent; its V half is applied after, y · W_uv. No step re-expands the cache
  (kv_b's cost is per new query, not per cached key), which is the point of caching the latent.

Both take the cache as ``past_key_values.{i}.key`` = the latent [B, 1, T, kv_rank] and ``.value`` = the rotated
key [B, 1, T, rope_head_dim] (kv_cache.py), concatenated outside the Attention node, so the causal mask of a cached
graph is explicit (bottom-right aligned at the past length). Q/K/V are 3-D ``[B, N, heads · size]``.
"""

from __future__ import annotations

from ...ir.graph import Op
from .builder import GraphBuilder
from .masks import combined_keep, padding_keep
from .op_registry import emits
from .ops_attention import rope
from .positions import span

FORMS = ("expanded", "absorbed")


def form(b: GraphBuilder) -> str:
    """The KV-cache graph decodes: absorbed; a graph without a cache runs whole sequences: expanded."""
    return "absorbed" if b.cache is not None else "expanded"


def _causal_keep(b: GraphBuilder, op: Op, q: str) -> str:
    """Bool [N_q, N_k]: key k visible to query q (at past + i) when k ≤ past + i."""
    key = ("struct", "causal", op.stack)
    if key not in b.memo:
        start, end = span(b, q, op.stack)
        one, zero = b.scalar_i64(1), b.scalar_i64(0)
        qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope="mask"), b.i64(1)], scope="mask")
        kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope="mask"), b.i64(0)], scope="mask")
        b.memo[key] = b.op("LessOrEqual", [kpos, qpos], scope="mask")
    return b.memo[key]


def _keep(b: GraphBuilder, op: Op, q: str, pad: str, cached: bool) -> tuple[str, int]:
    """(bool keep mask or "", is_causal): the past is concatenated outside the node, so a cached causal layer
    gets an explicit mask."""
    if cached and op.attrs.mask == "causal":
        keep = _causal_keep(b, op, q)
        if pad:
            keep = b.op("And", [keep, padding_keep(b, pad)], scope="mask")
        return keep, 0
    return combined_keep(b, op, q, pad) or "", 1 if op.attrs.mask == "causal" else 0


@emits("latent_attention")
def make_latent_attention(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    """3-D Q/K/V ``[B, N, heads · size]`` as the other attention emitters; the absorbed form's per-head products
    are MatMuls with the heads as the batch axis against [H, ·, ·] weights."""
    a = op.attrs
    h, nope, rd, vd, r = a.heads, a.nope_head_dim, a.rope_head_dim, a.v_head_dim, a.kv_rank
    s = op.name
    pad = xs[-1] if a.padding else ""
    cached = b.cache is not None and op.name in b.cache.index
    q4 = b.op("Reshape", [xs[0], b.i64(0, 0, h, nope + rd)], scope=s)  # [B, N, H, nope + rope]
    q_nope, q_rot = b.op("Split", [q4, b.i64(nope, rd)], scope=s, outputs=2, axis=-1)
    c, k_rot = b.op("Split", [xs[1], b.i64(r, rd)], scope=s, outputs=2, axis=-1)  # [B, N, r], [B, N, rope]
    if a.rope_dims:
        q_rot = b.op("Reshape", [q_rot, b.i64(0, 0, h * rd)], scope=s)
        q_rot = b.op("Reshape", [rope(b, op, q_rot, h, xs[0]), b.i64(0, 0, h, rd)], scope=s)
        k_rot = rope(b, op, k_rot, 1, xs[0])
    if cached:  # the cache layout is [B, 1, T, ·] (one "head"): concatenate there, attend on [B, T, ·]
        (past_c, past_k), (present_c, present_k) = b.cache.past(op), b.cache.present(op)
        c = b.op("Concat", [past_c, b.op("Unsqueeze", [c, b.i64(1)], scope=s)], scope=s, outputs=[present_c], axis=2)
        k_rot = b.op(
            "Concat", [past_k, b.op("Unsqueeze", [k_rot, b.i64(1)], scope=s)], scope=s, outputs=[present_k], axis=2
        )
        c, k_rot = (b.op("Squeeze", [t, b.i64(1)], scope=s) for t in (c, k_rot))
    keep, causal = _keep(b, op, xs[0], pad, cached)
    weight = b.param(f"{op.name}.kv_b.weight")  # [H·(nope + v), r]
    if form(b) == "absorbed":
        w = b.op("Reshape", [weight, b.i64(h, nope + vd, r)], scope=s)
        w_uk, w_uv = b.op("Split", [w, b.i64(nope, vd)], scope=s, outputs=2, axis=1)  # [H, nope, r], [H, v, r]
        # per head one [N, nope] × [nope, r] GEMM (heads as the batch axis), not N·H row products
        q_lat = b.op("MatMul", [b.op("Transpose", [q_nope], scope=s, perm=[0, 2, 1, 3]), w_uk], scope=s)
        q_lat = b.op("Transpose", [q_lat], scope=s, perm=[0, 2, 1, 3])  # [B, N, H, r]
        q = b.op("Reshape", [b.op("Concat", [q_lat, q_rot], scope=s, axis=-1), b.i64(0, 0, h * (r + rd))], scope=s)
        k = b.op("Concat", [c, k_rot], scope=s, axis=-1)  # [B, T, r + rope]: one K/V head for all
        y = b.op("Attention", [q, k, c, keep], scope=s, q_num_heads=h, kv_num_heads=1, scale=float(a.scale),
                 is_causal=causal)  # fmt: skip
        y = b.op("Transpose", [b.op("Reshape", [y, b.i64(0, 0, h, r)], scope=s)], scope=s, perm=[0, 2, 1, 3])
        y = b.op("MatMul", [y, b.op("Transpose", [w_uv], scope=s, perm=[0, 2, 1])], scope=s)  # [B, H, N, v]
        y = b.op("Transpose", [y], scope=s, perm=[0, 2, 1, 3])
    else:
        kv = b.op("MatMul", [c, b.op("Transpose", [weight], scope=s, perm=[1, 0])], scope=s)  # [B, T, H·(nope + v)]
        k_nope, v = b.op(
            "Split", [b.op("Reshape", [kv, b.i64(0, 0, h, nope + vd)], scope=s), b.i64(nope, vd)], scope=s,
            outputs=2, axis=-1,
        )  # fmt: skip
        k_rot = b.op("Expand", [b.op("Unsqueeze", [k_rot, b.i64(2)], scope=s), b.i64(1, 1, h, 1)], scope=s)
        k = b.op("Reshape", [b.op("Concat", [k_nope, k_rot], scope=s, axis=-1), b.i64(0, 0, h * (nope + rd))], scope=s)
        q = b.op("Reshape", [b.op("Concat", [q_nope, q_rot], scope=s, axis=-1), b.i64(0, 0, h * (nope + rd))], scope=s)
        v = b.op("Reshape", [v, b.i64(0, 0, h * vd)], scope=s)
        y = b.op("Attention", [q, k, v, keep], scope=s, q_num_heads=h, kv_num_heads=h, scale=float(a.scale),
                 is_causal=causal)  # fmt: skip
    return b.op("Reshape", [y, b.i64(0, 0, h * vd)], scope=s)
