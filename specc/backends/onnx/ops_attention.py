"""The attention core → exactly one fused node: ai.onnx ``Attention`` or com.microsoft MHA / GQA.

All variants take 3-D ``[B, N, heads·head_dim]`` Q/K/V split off the packed projection (no transposes),
RoPE applied beforehand by the opset-23 ``RotaryEmbedding`` op (cos / sin at each row's position ids), and
the KV cache as ``[B, kv_heads, N, D]``.

Masks (see masks.py): causal → ``is_causal=1`` (standard, bottom-right aligned with a cache) /
``unidirectional=1`` (MHA) / intrinsic (GQA); sliding_window, chunked and prefix → a bool [N_q, N_k] mask (prefix:
[B, 1, N_q, N_k] when positions follow the padding mask); padding →
bool [B, 1, N_q, N_k] from ``attention_mask``, and'ed with the structural mask; the contrib ops take the same
as an additive ``attention_bias``. GQA / MQA: the standard op takes ``kv_num_heads`` < ``q_num_heads``
directly; contrib uses GroupQueryAttention (always causal). The scale is the ``scale`` attribute.
"""

from __future__ import annotations

import numpy as np

from ...errors import SpecError
from ...ir.graph import Op
from ..torch.layers.rope import attention_factor
from .builder import CONTRIB, GraphBuilder, symbolic
from .emit import emits
from .masks import additive, combined_keep
from .positions import position_ids, span
from .tables import angles, rope_inv_freq, to_model_dtype


@emits("attention")
def make_attention(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    a = op.attrs
    h, kv, hd = a["heads"], a["kv_heads"], a["head_dim"]
    if a["cross"]:
        q = xs[0]
        k, v = b.op("Split", [xs[1], b.i64(kv * hd, kv * hd)], scope=op.name, outputs=2, axis=-1)
    else:
        q, k, v = b.op("Split", [xs[0], b.i64(h * hd, kv * hd, kv * hd)], scope=op.name, outputs=3, axis=-1)
    pad = xs[-1] if a.get("padding") else ""
    if a.get("rope_dims"):
        q = rope(b, op, q, h, xs[0])
        k = rope(b, op, k, kv, xs[0])
    cached = b.cache is not None and op.name in b.cache.index
    if b.opts.attention == "contrib":
        return _contrib(b, op, q, k, v, pad, cached)
    return _standard(b, op, q, k, v, pad, cached)


def _standard(b: GraphBuilder, op: Op, q: str, k: str, v: str, pad: str, cached: bool) -> str:
    a = op.attrs
    keep = combined_keep(b, op, q, pad)
    ins = [q, k, v, keep or ""]
    outs: list[str] = [b.fresh(f"{op.name}/Attention")]
    if cached:
        ins += list(b.cache.past(op))
        outs += list(b.cache.present(op))
    y = b.op(
        "Attention",
        ins,
        scope=op.name,
        outputs=outs,
        q_num_heads=a["heads"],
        kv_num_heads=a["kv_heads"],
        scale=float(a["scale"]),
        softcap=float(a["softcap"]) if a.get("softcap") else None,  # applied before the mask, as torch does
        is_causal=1 if a["mask"] == "causal" else 0,
    )
    return y if isinstance(y, str) else y[0]


def _contrib(b: GraphBuilder, op: Op, q: str, k: str, v: str, pad: str, cached: bool) -> str:
    a = op.attrs
    h, kv, hd = a["heads"], a["kv_heads"], a["head_dim"]
    keep = combined_keep(b, op, q, pad)
    bias = additive(b, keep) if keep else ""
    y = b.fresh(f"{op.name}/{'MultiHeadAttention' if kv == h else 'GroupQueryAttention'}")
    presents = list(b.cache.present(op)) if cached else [f"{op.name}/present_key", f"{op.name}/present_value"]
    pasts = list(b.cache.past(op)) if cached else ["", ""]
    if kv == h:
        b.op(
            "MultiHeadAttention",
            [q, k, v, "", "", bias, *pasts],
            scope=op.name,
            outputs=[y, *presents] if cached else [y],
            domain=CONTRIB,
            num_heads=h,
            scale=float(a["scale"]),
            unidirectional=1 if a["mask"] == "causal" else 0,
        )
    else:
        check_contrib(op)
        _, end = span(b, q, op.stack)
        total = b.op("Cast", [end], scope=op.name, to=6)  # int32 scalar
        batch = b.dim(q, 0)
        seqlens = b.op("Expand", [b.op("Sub", [total, b.const(1, "one_i32", "int32")], scope=op.name), batch])
        b.op(
            "GroupQueryAttention",
            [q, k, v, *pasts, seqlens, total, "", "", "", bias],
            scope=op.name,
            outputs=[y, *presents],
            domain=CONTRIB,
            num_heads=h,
            kv_num_heads=kv,
            scale=float(a["scale"]),
            softcap=float(a["softcap"]) if a.get("softcap") else None,
        )
        batch_dim = symbolic(op.shape)[0]
        if not cached:  # unused outputs still need declared shapes for the checker
            for p in presents:
                b.declare(p, b.ftype, [batch_dim, kv, None, hd])
    b.declare(y, b.ftype, symbolic(op.shape))
    return y


def check_contrib(op: Op) -> None:
    """GroupQueryAttention (the contrib op for kv_heads < heads) is always causal."""
    a = op.attrs
    if a.get("softcap") and a["kv_heads"] == a["heads"]:
        raise SpecError(
            f"{op.name}: com.microsoft MultiHeadAttention has no softcap; this layer caps its scores at {a['softcap']}",
            hint="export with --attention standard",
        )
    if a["kv_heads"] != a["heads"] and (a["cross"] or a["mask"] not in ("causal", "sliding_window", "chunked")):
        raise SpecError(
            f"{op.name}: com.microsoft GroupQueryAttention is always causal; this layer has kv_heads < heads "
            f"with mask {'cross' if a['cross'] else a['mask']}",
            hint="export with --attention standard",
        )


def rope(b: GraphBuilder, op: Op, x: str, heads: int, source: str) -> str:
    """Rotate the first ``rope_dims`` dims of each head (halves, or adjacent pairs when ``rope_interleaved``) at
    this call's position ids (past + arange(N), or following attention_mask: see positions.py). cos / sin
    [B, N, rope_dims / 2] are computed in-graph from them (fp32, as the torch backend does, scaled by the
    scaling's attention factor), so there is no table and no length limit."""
    a = op.attrs
    dims, theta, scaling = a["rope_dims"], float(a["rope_theta"]), a.get("rope_scaling")
    key = ("rope", op.stack, dims, theta, repr(scaling))
    if key not in b.memo:
        pos = position_ids(b, source, op.stack)  # [B or 1, N]
        ang = angles(b, pos, rope_inv_freq(b, pos, dims, theta, scaling), "rope")  # [B or 1, N, dims / 2]
        batch = b.op("Concat", [b.dim(source, 0), b.i64(1, 1)], scope="rope", axis=0)  # [B, 1, 1]
        scale = attention_factor(scaling)
        tables = []
        for fn in ("Cos", "Sin"):
            t = b.op(fn, [ang], scope="rope")
            if scale != 1.0:
                t = b.op("Mul", [t, b.const(np.array(scale, np.float32), "rope_scale", np.float32)], scope="rope")
            tables.append(b.op("Expand", [to_model_dtype(b, t, "rope"), batch], scope="rope"))
        b.memo[key] = tuple(tables)
    cos, sin = b.memo[key]
    interleaved = 1 if a.get("rope_interleaved") else 0
    return b.op(
        "RotaryEmbedding",
        [x, cos, sin],
        scope=op.name,
        num_heads=heads,
        rotary_embedding_dim=dims,
        interleaved=interleaved,
    )
