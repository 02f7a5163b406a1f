"""The attention core → exactly one fused node: ai.onnx ``Attention`` or com.microsoft MHA / GQA.

All variants take 3-D ``[B, N, heads·head_dim]`` Q/K/V split off the packed projection (no transposes),
RoPE applied beforehand by the opset-23 ``RotaryEmbedding`` op (cos / sin at each row's position ids), and
the KV cache as ``[B, kv_heads, N, D]``.

Masks (see masks.py): causal → ``is_causal=1`` (standard, bottom-right aligned with a cache) /
``unidirectional=1`` (MHA) / intrinsic (GQA); ALiBi → an additive [1 | B, H, N_q, N_k] mask holding the bias and
every mask (is_causal 0); sliding_window, chunked and prefix → a bool [N_q, N_k] mask (prefix:
[B, 1, N_q, N_k] when positions follow the padding mask); padding →
bool [B, 1, N_q, N_k] from ``attention_mask``, and'ed with the structural mask; the contrib ops take the same
as an additive ``attention_bias``. Attention sinks: the standard op has no sink input, so its keys and values end in
one zero row whose mask entry is the sink logit (``_standard_sinks``); GroupQueryAttention takes them as
``head_sink``. GQA / MQA: the standard op takes ``kv_num_heads`` < ``q_num_heads``
directly; contrib uses GroupQueryAttention (always causal). The scale is the ``scale`` attribute.
"""

from __future__ import annotations

import numpy as np

from ...ir.graph import Op
from ..torch.layers.rope import attention_factor
from .builder import CONTRIB, GraphBuilder, symbolic
from .contrib import check_contrib, uses_gqa
from .fuse import bias_add
from .masks import additive, alibi_bias, combined_keep, sink_mask
from .op_registry import emits
from .ops_relative import biased_mask
from .positions import position_ids, span
from .tables import angles, rope_inv_freq, to_model_dtype


@emits("attention")
def make_attention(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    pad = xs[-1] if op.attrs.padding else ""
    cached = b.cache is not None and op.name in b.cache.index
    if b.opts.attention == "contrib":
        return _contrib(b, op, xs, pad, cached)
    bias = xs[1] if op.attrs.position_bias else ""  # T5's relative position bias [1, H, N_q, N_k]
    return _standard(b, op, *_split(b, op, xs[0], xs[1] if op.attrs.cross else ""), pad, cached, bias)


def _split(b: GraphBuilder, op: Op, packed: str, kv_packed: str = "") -> tuple[str, str, str]:
    """Q, K, V off the packed projection(s), RoPE applied to Q and K."""
    a = op.attrs
    h, kv, hd = a.heads, a.kv_heads, a.head_dim
    if kv_packed:
        q = packed
        k, v = b.op("Split", [kv_packed, b.i64(kv * hd, kv * hd)], scope=op.name, outputs=2, axis=-1)
    else:
        q, k, v = b.op("Split", [packed, b.i64(h * hd, kv * hd, kv * hd)], scope=op.name, outputs=3, axis=-1)
    if a.rope_dims:
        q = rope(b, op, q, h, packed)
        k = rope(b, op, k, kv, packed)
    if a.temperature_floor is not None:
        q = b.op("Mul", [q, temperature(b, op, packed)], scope=op.name)
    return q, k, v


def temperature(b: GraphBuilder, op: Op, source: str) -> str:
    """Llama 4's q scale [1, N, 1] at this call's indices p (past + arange(N)): 1 + scale · log(1 + floor((p + 1) /
    floor)), in fp32 as the torch layer computes it; a pre-op on q, so the attention node stays one."""
    a = op.attrs
    key = ("temperature", op.stack, a.temperature_floor, float(a.temperature_scale))
    if key not in b.memo:
        f32 = np.float32
        start, end = span(b, source, op.stack)
        p = b.op("Cast", [b.op("Range", [start, end, b.scalar_i64(1)], scope="temperature")], scope="temperature", to=1)
        one = b.const(np.array(1.0, f32), "one_f32", f32)
        steps = b.op("Floor", [b.op("Div", [b.op("Add", [p, one], scope="temperature"),
                                            b.const(np.array(a.temperature_floor, f32), "floor", f32)],
                                     scope="temperature")], scope="temperature")  # fmt: skip
        log = b.op("Log", [b.op("Add", [steps, one], scope="temperature")], scope="temperature")
        scaled = b.op("Mul", [log, b.const(np.array(a.temperature_scale, f32), "temperature_scale", f32)],
                      scope="temperature")  # fmt: skip
        factor = b.op("Add", [scaled, one], scope="temperature")
        factor = b.op("Unsqueeze", [factor, b.i64(0, 2)], scope="temperature")  # [1, N, 1]
        b.memo[key] = to_model_dtype(b, factor, "temperature")
    return b.memo[key]


def _standard(b: GraphBuilder, op: Op, q: str, k: str, v: str, pad: str, cached: bool, bias: str = "") -> str:
    a = op.attrs
    if a.sinks:
        return _standard_sinks(b, op, q, k, v, pad, cached)
    alibi = a.alibi_max_bias is not None or a.position_bias  # the mask input carries the bias and every mask
    if a.position_bias:  # T5: the relative_bias op's output
        keep = biased_mask(b, op, q, bias, pad)
    else:
        keep = alibi_bias(b, op, q, pad) if alibi else combined_keep(b, op, q, pad)  # ALiBi: an additive mask
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
        q_num_heads=a.heads,
        kv_num_heads=a.kv_heads,
        scale=float(a.scale),
        softcap=float(a.softcap) if a.softcap else None,  # applied before the mask, as torch does
        is_causal=1 if a.mask == "causal" and not alibi else 0,
    )
    return y if isinstance(y, str) else y[0]


def _standard_sinks(b: GraphBuilder, op: Op, q: str, k: str, v: str, pad: str, cached: bool) -> str:
    """Attention sinks in one standard ``Attention`` node (the op has no sink input): the keys and values end in
    one extra zero row whose mask entry is each head's sink logit, so its score is q·0·scale + sink = sink and its
    value adds nothing: softmax over [scores, sink] with the sink's share dropped, exactly. The KV cache is
    concatenated outside the node, so the extra row never enters it; the mask carries causality (is_causal 0)."""
    a = op.attrs
    width = a.kv_heads * a.head_dim
    if cached:
        k, v = (
            _grown(b, op, x, past, present)
            for x, past, present in zip((k, v), b.cache.past(op), b.cache.present(op), strict=True)
        )
    rows = b.op("Concat", [b.dim(k, 0), b.i64(1, width)], scope=op.name, axis=0)
    zero = b.op("Expand", [b.const(np.zeros((1, 1, width)), "zero_key"), rows], scope=op.name)  # [B, 1, kv·D]
    k, v = (b.op("Concat", [x, zero], scope=op.name, axis=1) for x in (k, v))
    y = b.op(
        "Attention",
        [q, k, v, sink_mask(b, op, q, pad)],
        scope=op.name,
        outputs=[b.fresh(f"{op.name}/Attention")],
        q_num_heads=a.heads,
        kv_num_heads=a.kv_heads,
        scale=float(a.scale),
        softcap=float(a.softcap) if a.softcap else None,
        is_causal=0,
    )
    return y


def _grown(b: GraphBuilder, op: Op, x: str, past: str, present: str) -> str:
    """The cache [B, kv_heads, P, D] grown by this call's keys (values) x [B, N, kv_heads·D] into ``present``;
    returned as all of them, [B, P + N, kv_heads·D]."""
    a = op.attrs
    heads = b.op("Reshape", [x, b.i64(0, 0, a.kv_heads, a.head_dim)], scope=op.name)
    new = b.op("Transpose", [heads], scope=op.name, perm=[0, 2, 1, 3])
    full = b.op("Concat", [past, new], scope=op.name, outputs=[present], axis=2)
    back = b.op("Transpose", [full], scope=op.name, perm=[0, 2, 1, 3])
    return b.op("Reshape", [back, b.i64(0, 0, a.kv_heads * a.head_dim)], scope=op.name)


def _contrib(b: GraphBuilder, op: Op, xs: list[str], pad: str, cached: bool) -> str:
    a = op.attrs
    check_contrib(op, b.opts.dtype)
    gqa = uses_gqa(op, b.opts.dtype)
    # MultiHeadAttention adds the projection bias: fold it before the mask's Shape node reads the projection
    packed, kv_packed, proj_bias = (xs[0], "", "") if gqa else _fold_projection_bias(b, op, xs)
    if op.attrs.position_bias:
        mask_bias = biased_mask(b, op, packed, xs[1], pad)
    elif op.attrs.alibi_max_bias is not None:  # the bias, causal and padding masks in one additive input
        mask_bias = alibi_bias(b, op, packed, pad)
    else:
        keep = combined_keep(b, op, packed, pad)
        mask_bias = additive(b, keep) if keep else ""
    y = b.fresh(f"{op.name}/{'GroupQueryAttention' if gqa else 'MultiHeadAttention'}")
    presents = list(b.cache.present(op)) if cached else [f"{op.name}/present_key", f"{op.name}/present_value"]
    pasts = list(b.cache.past(op)) if cached else ["", ""]
    if gqa:
        # no RoPE: the packed [B, N, (heads + 2 kv_heads) · head_dim] projection is GQA's packed query input
        qkv = list(_split(b, op, xs[0])) if a.rope_dims or a.temperature_floor is not None else [xs[0], "", ""]
        _, end = span(b, xs[0], op.stack)
        total = b.op("Cast", [end], scope=op.name, to=6)  # int32 scalar
        seqlens = b.op("Expand", [b.op("Sub", [total, b.const(1, "one_i32", "int32")], scope=op.name), b.dim(xs[0], 0)])
        b.op(
            "GroupQueryAttention",
            [*qkv, *pasts, seqlens, total, "", "", "", mask_bias, b.param(f"{op.name}.sinks") if a.sinks else ""],
            scope=op.name,
            outputs=[y, *presents],
            domain=CONTRIB,
            num_heads=a.heads,
            kv_num_heads=a.kv_heads,
            scale=float(a.scale),
            softcap=float(a.softcap) if a.softcap else None,
        )
        if not cached:  # unused outputs still need declared shapes for the checker
            for p in presents:
                b.declare(p, b.ftype, [symbolic(op.shape)[0], a.kv_heads, None, a.head_dim])
    else:
        q, k, v = _split(b, op, packed, kv_packed)
        b.op(
            "MultiHeadAttention",
            [q, k, v, proj_bias, "", mask_bias, *pasts],
            scope=op.name,
            outputs=[y, *presents] if cached else [y],
            domain=CONTRIB,
            num_heads=a.heads,
            scale=float(a.scale),
            unidirectional=1 if a.mask == "causal" else 0,
        )
    b.declare(y, b.ftype, symbolic(op.shape))
    return y


def _fold_projection_bias(b: GraphBuilder, op: Op, xs: list[str]) -> tuple[str, str, str]:
    """(packed, kv_packed, bias): the Q/K/V projections before their bias Adds and the packed [q | k | v] bias
    for MultiHeadAttention's ``bias`` input, which adds it while it lays Q/K/V out per head (no separate pass).
    Unchanged (bias "") when RoPE must rotate the biased Q / K or a projection has no plain bias Add."""
    cross = op.attrs.cross
    inputs = [xs[0], xs[1]] if cross else [xs[0]]
    rotated = op.attrs.rope_dims or op.attrs.temperature_floor is not None  # q changes before the node
    found = [] if rotated else [bias_add(b, x) for x in inputs]
    if not found or any(f is None for f in found):
        return xs[0], xs[1] if cross else "", ""
    for node, _, _ in found:
        b.nodes.remove(node)
    bias = b.concat_params([bias for _, _, bias in found], f"{op.name}.qkv_bias") if cross else found[0][2]
    return found[0][1], found[1][1] if cross else "", bias


def rope(b: GraphBuilder, op: Op, x: str, heads: int, source: str) -> str:
    """Rotate the first ``rope_dims`` dims of each head (halves, or adjacent pairs when ``rope_interleaved``) at
    this call's position ids (past + arange(N), or following attention_mask: see positions.py). cos / sin
    [B, N, rope_dims / 2] are computed in-graph from them (fp32, as the torch backend does, scaled by the
    scaling's attention factor), so there is no table and no length limit."""
    a = op.attrs
    dims, theta, scaling = a.rope_dims, float(a.rope_theta), a.rope_scaling
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
    interleaved = 1 if a.rope_interleaved else 0
    return b.op(
        "RotaryEmbedding",
        [x, cos, sin],
        scope=op.name,
        num_heads=heads,
        rotary_embedding_dim=dims,
        interleaved=interleaved,
    )
