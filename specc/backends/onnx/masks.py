"""Attention masks as small shared subgraphs (built once per stack, reused by every layer).

A boolean ``keep`` mask broadcastable to ``[B, 1, N_q, N_k]`` (True = attend) is the common form: the
padding mask ``[B, 1, 1, N_k]`` from ``attention_mask`` (1 = keep) and the structural mask ``[N_q, N_k]``
for sliding-window, prefix and chunked attention. Plain causal masks are never materialised: the standard op's
``is_causal`` (bottom-right aligned with a KV cache) and the contrib ops' built-in causality express them.
Structure is by index (a left-padded row's tokens keep their distances), except the prefix and the chunks, which count
each row's own positions when they follow the padding mask (positions.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ...ir.graph import Op
from ..torch.layers.attention import alibi_slopes
from .builder import GraphBuilder
from .positions import follows_mask, mask_positions, span
from .tables import to_model_dtype


def padding_keep(b: GraphBuilder, pad: str) -> str:
    """``attention_mask`` [B, N_k] int → bool [B, 1, 1, N_k] (1 = keep)."""
    key = ("pad", pad)
    if key not in b.memo:
        keep = b.op("Cast", [pad], scope="mask", to=9)  # 9 = BOOL
        b.memo[key] = b.op("Unsqueeze", [keep, b.i64(1, 2)], scope="mask")
    return b.memo[key]


def structural_keep(b: GraphBuilder, op: Op, q: str) -> str | None:
    """Bool [N_q, N_k] for sliding_window / prefix / chunked self-attention ([B, 1, N_q, N_k] for a prefix counted in
    positions that follow the padding mask); None for none / padding / causal."""
    a = op.attrs
    kind = a.mask
    if kind in ("none", "padding", "causal"):
        return None
    key = ("struct", kind, a.window, a.prefix, a.chunk, op.stack)
    if key in b.memo:
        return b.memo[key]
    start, end = span(b, q, op.stack)
    one, zero = b.scalar_i64(1), b.scalar_i64(0)
    qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope="mask"), b.i64(1)], scope="mask")  # [Nq, 1]
    kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope="mask"), b.i64(0)], scope="mask")  # [1, Nk]
    causal = b.op("LessOrEqual", [kpos, qpos], scope="mask")
    if kind == "sliding_window":
        # `window` keys visible, self included: q - window < k <= q
        low = b.op("Sub", [qpos, b.const(np.array(int(a.window), np.int64), "window")], scope="mask")
        keep = b.op("And", [causal, b.op("Greater", [kpos, low], scope="mask")], scope="mask")
    elif kind == "local":  # two-sided: |k - q| <= window // 2
        half = b.const(np.array(int(a.window) // 2, np.int64), "half_window")
        dist = b.op("Abs", [b.op("Sub", [kpos, qpos], scope="mask")], scope="mask")
        keep = b.op("LessOrEqual", [dist, half], scope="mask")
    elif kind == "prefix":
        # the first `prefix` positions see each other (and every later position sees them); the rest are causal.
        # When positions follow the padding mask they are each row's own (a left-padded row's prefix starts at
        # its first token): [B, 1, N_q, N_k].
        mask = follows_mask(b, op.stack)
        if mask:
            kpos = b.op("Unsqueeze", [mask_positions(b, mask), b.i64(1, 2)], scope="mask")  # [B, 1, 1, Nk]
        in_prefix = b.op("Less", [kpos, b.const(np.array(int(a.prefix), np.int64), "prefix")], scope="mask")
        keep = b.op("Or", [causal, in_prefix], scope="mask")
    elif kind == "chunked":
        # causal inside each chunk of `chunk` positions: k // chunk == q // chunk. When positions follow the
        # padding mask they are each row's own (a left-padded row's chunks start at its first token, as HF's):
        # [B, 1, N_q, N_k].
        chunk = b.const(np.array(int(a.chunk), np.int64), "chunk")
        mask = follows_mask(b, op.stack)
        kc, qc = kpos, qpos
        if mask:
            kc = b.op("Unsqueeze", [mask_positions(b, mask), b.i64(1, 2)], scope="mask")  # [B, 1, 1, Nk]
            rows = b.op(
                "Slice", [kc, b.op("Unsqueeze", [start, b.i64(0)], scope="mask"), b.i64(2**62), b.i64(3)], scope="mask"
            )
            qc = b.op("Transpose", [rows], scope="mask", perm=[0, 1, 3, 2])  # [B, 1, Nq, 1]
        same = b.op("Equal", [b.op("Div", [kc, chunk], scope="mask"), b.op("Div", [qc, chunk], scope="mask")])
        keep = b.op("And", [causal, same], scope="mask")
    else:
        raise NotImplementedError(f"mask {kind}")
    b.memo[key] = keep
    return keep


def combined_keep(b: GraphBuilder, op: Op, q: str, pad: str) -> str | None:
    """Structural ∧ padding, or whichever exists; None when neither does. Always [.., N_q, N_k]: ORT's
    Attention kernel does not broadcast the mask over the query axis."""
    struct = structural_keep(b, op, q)
    padk = padding_keep(b, pad) if pad else None
    if struct is None and padk is not None:
        key = ("padq", padk, op.stack, bool(op.attrs.cross))
        if key not in b.memo:
            rows = b.op("Concat", [b.i64(1, 1), b.dim(q, 1), b.i64(1)], scope="mask", axis=0)
            b.memo[key] = b.op("Expand", [padk, rows], scope="mask")  # [B, 1, N_q, N_k]
        return b.memo[key]
    if struct is None or padk is None:
        return struct
    key = ("and", struct, padk)
    if key not in b.memo:
        b.memo[key] = b.op("And", [struct, padk], scope="mask")
    return b.memo[key]


def additive(b: GraphBuilder, keep: str) -> str:
    """Bool keep → additive bias in the model dtype (0 or the dtype's lowest value) for the contrib ops."""
    key = ("add", keep)
    if key not in b.memo:
        low = b.const(np.array(ml_dtypes.finfo(b.np_ftype).min, dtype=b.np_ftype), "mask_min")
        b.memo[key] = b.op("Where", [keep, b.const(np.array(0.0), "zero"), low], scope="mask")
    return b.memo[key]


def alibi_bias(b: GraphBuilder, op: Op, q: str, pad: str) -> str:
    """ALiBi as the attention op's additive mask [1 | B, H, N_q, N_k] in the model dtype: slope_h · (k - q)
    (× the score scale when ``alibi_scaled``) where the structural, causal and padding masks keep a key, the
    dtype's lowest value elsewhere. Causality is in the bias, so the attention node runs with is_causal 0."""
    a = op.attrs
    scaled = a.scale if a.alibi_scaled else None
    key = ("alibi", a.heads, a.alibi_max_bias, scaled, a.alibi_bf16, a.mask, a.window, a.prefix, a.chunk, op.stack, pad)
    if key in b.memo:
        return b.memo[key]
    start, end = span(b, q, op.stack)
    one, zero = b.scalar_i64(1), b.scalar_i64(0)
    qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope="alibi"), b.i64(1)], scope="alibi")  # [Nq, 1]
    kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope="alibi"), b.i64(0)], scope="alibi")  # [1, Nk]
    slopes = np.array(alibi_slopes(a.heads, a.alibi_max_bias), np.float32)
    if a.alibi_bf16:  # Falcon-RW: bf16(bf16(slope) · k) at each key's own position (over the padding mask)
        at = kpos if not pad else b.op("Unsqueeze", [_real_positions(b, pad), b.i64(1, 2)], scope="alibi")
        slopes_c = b.const(slopes.astype(ml_dtypes.bfloat16).astype(np.float32).reshape(1, a.heads, 1, 1),
                           "alibi_slopes", np.float32)  # fmt: skip
        product = b.op("Mul", [slopes_c, b.op("Cast", [at], scope="alibi", to=1)], scope="alibi")
        rounded = b.op("Cast", [b.op("Cast", [product], scope="alibi", to=16)], scope="alibi", to=1)  # 16: BFLOAT16
        bias = b.op("Mul", [rounded, b.const(np.float32(scaled or 1.0), "alibi_scale", np.float32)], scope="alibi")
    else:
        dist = b.op("Cast", [b.op("Sub", [kpos, qpos], scope="alibi")], scope="alibi", to=1)  # float [Nq, Nk]
        slopes_c = b.const((slopes * np.float32(scaled or 1.0)).reshape(1, a.heads, 1, 1), "alibi_slopes", np.float32)
        bias = b.op("Mul", [slopes_c, dist], scope="alibi")  # [1, H, Nq, Nk]
    bias = to_model_dtype(b, bias, "alibi")
    keep = full_keep(b, op, q, pad)
    if keep is not None:
        low = b.const(np.array(ml_dtypes.finfo(b.np_ftype).min, dtype=b.np_ftype), "mask_min")
        bias = b.op("Where", [keep, bias, low], scope="alibi")
    b.memo[key] = bias
    return bias


def _real_positions(b: GraphBuilder, pad: str) -> str:
    """int64 [B, N_k]: (cumsum(attention_mask) - 1) · attention_mask, each key's position among its row's real
    tokens (transformers' Falcon and BLOOM count ALiBi positions so)."""
    key = ("alibi_positions", pad)
    if key not in b.memo:
        mask = b.op("Cast", [pad], scope="alibi", to=7)  # 7: INT64
        count = b.op("CumSum", [mask, b.scalar_i64(1)], scope="alibi")
        b.memo[key] = b.op("Mul", [b.op("Sub", [count, b.scalar_i64(1)], scope="alibi"), mask], scope="alibi")
    return b.memo[key]


def full_keep(b: GraphBuilder, op: Op, q: str, pad: str) -> str | None:
    """``combined_keep`` with a causal mask materialised too ([N_q, N_k], bottom-right aligned with a cache), for
    nodes whose mask input carries every mask (is_causal 0); None when nothing is masked."""
    keep = combined_keep(b, op, q, pad)
    if op.attrs.mask != "causal":
        return keep
    key = ("full", keep, op.stack)
    if key not in b.memo:
        start, end = span(b, q, op.stack)
        one, zero = b.scalar_i64(1), b.scalar_i64(0)
        qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope="mask"), b.i64(1)], scope="mask")
        kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope="mask"), b.i64(0)], scope="mask")
        causal = b.op("LessOrEqual", [kpos, qpos], scope="mask")  # [Nq, Nk]
        b.memo[key] = causal if keep is None else b.op("And", [keep, causal], scope="mask")
    return b.memo[key]


def sink_mask(b: GraphBuilder, op: Op, q: str, pad: str) -> str:
    """Attention sinks as the additive mask of a node whose keys end in one extra zero key: [B | 1, H, N_q,
    N_k + 1], every mask as 0 / the dtype's lowest value over the real keys, then each head's sink logit (the
    layer's ``sinks`` parameter) as the extra key's score, so softmax runs over [scores, sink]."""
    a = op.attrs
    keep = full_keep(b, op, q, pad)
    if keep is None:  # nothing masked (an encoder without padding): every key kept, [Nq, Nk]
        start, end = span(b, q, op.stack)
        one, zero = b.scalar_i64(1), b.scalar_i64(0)
        qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope="mask"), b.i64(1)], scope="mask")
        kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope="mask"), b.i64(0)], scope="mask")
        keep = b.op("GreaterOrEqual", [kpos, b.op("Sub", [qpos, qpos], scope="mask")], scope="mask")
    base = additive(b, keep)
    base = b.op("Add", [base, b.const(np.zeros((1, 1, 1, 1)), "zeros4")], scope=op.name)  # rank 4
    heads = b.i64(a.heads)
    shape = b.op("Concat", [b.dim(base, 0), heads, b.dim(base, 2), b.dim(base, 3)], scope=op.name, axis=0)
    base = b.op("Expand", [base, shape], scope=op.name)  # [B | 1, H, Nq, Nk]
    sinks = b.op("Reshape", [b.param(f"{op.name}.sinks"), b.i64(1, a.heads, 1, 1)], scope=op.name)
    column = b.op("Concat", [b.dim(base, 0), heads, b.dim(base, 2), b.i64(1)], scope=op.name, axis=0)
    sinks = b.op("Expand", [sinks, column], scope=op.name)  # [B | 1, H, Nq, 1]
    return b.op("Concat", [base, sinks], scope=op.name, axis=-1)
