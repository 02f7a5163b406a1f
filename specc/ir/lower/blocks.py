"""The Transformer stack: blocks of (self-, cross-) attention and MLP sublayers with their norms and residuals,
in every placement the spec language has."""

from __future__ import annotations

import math
from typing import Any

from ...spec import kinds, resolve
from ...spec.schema import MoEMLP, SwiGLUMLP
from .context import Context, linear, norm, relative_bias


def _attention(c: Context, p: str, x: str, layer: int, mask: str, memory: str | None = None) -> str:
    """QKV projection, fused attention core, output projection. ``memory`` makes it cross-attention."""
    s, g = c.spec, c.g
    if s.attention.latent is not None:
        return _latent_attention(c, p, x, layer, mask)
    h, kv, hd = s.attention.heads, resolve.kv_heads(s), resolve.head_dim(s)
    rope = s.position.type == "rotary" and memory is None
    cross = "cross_" if memory is not None else ""
    residual = "residual" if s.init.scaled_residual else "normal"
    qb, kb, vb = resolve.qkv_bias(s)
    if memory is None:
        bias = _bias_parts(((h * hd, qb), (kv * hd, kb), (kv * hd, vb)))
        packed = linear(c, f"{p}.qkv", x, c.d, (h + 2 * kv) * hd, "qkv_proj", layer, **bias)
        packed = _qk_norm(c, f"{p}.q_norm", packed, 0, h * hd, layer)
        core_in = [_qk_norm(c, f"{p}.k_norm", packed, h * hd, kv * hd, layer)]
        if s.position.type == "relative":  # T5: the stack's bias, or (per_layer, UMT5) this layer's own
            own = s.position.per_layer or c.bias is None
            core_in.append(relative_bias(c, f"{p}.rel_bias", mask != "causal", layer) if own else c.bias)
    else:
        q = linear(c, f"{p}.q", x, c.d, h * hd, "cross_qkv_proj", layer, qb)
        bias = _bias_parts(((kv * hd, kb), (kv * hd, vb)))
        kvp = linear(c, f"{p}.kv", memory, c.d, 2 * kv * hd, "cross_qkv_proj", layer, **bias)
        core_in = [_qk_norm(c, f"{p}.q_norm", q, 0, h * hd, layer), _qk_norm(c, f"{p}.k_norm", kvp, 0, kv * hd, layer)]
    if c.pad is not None:
        core_in.append(c.pad)
    core = g.add(
        "attention",
        f"{p}.core",
        core_in,
        f"{cross}attention",
        layer=layer,
        stack=c.stack,
        heads=h,
        kv_heads=kv,
        head_dim=hd,
        mask=mask,
        window=s.attention.window,
        prefix=s.attention.prefix,
        scale=s.attention.scale if s.attention.scale is not None else 1.0 / math.sqrt(hd),
        scale_stated=s.attention.scale is not None,
        softcap=s.attention.softcap,
        chunk=s.attention.chunk,
        rope_dims=int(resolve.rotary_dims(s)) if rope else 0,  # a rule made it an even whole number
        rope_theta=s.position.theta,
        rope_scaling=_rope_scaling(s) if rope else None,  # rebuild_cache: a generation fact, in the meta
        rope_interleaved=rope and s.position.rotation == "interleaved",
        dropout=s.dropout.attention,
        cross=memory is not None,
        padding=c.pad is not None,
        **_alibi(s, memory is None),
        sinks=bool(s.attention.sinks) and memory is None,
        position_bias=s.position.type == "relative" and memory is None,
        **_temperature(s, memory is None),
    )
    sc = s.position.scaling if rope else None
    if sc is not None and sc.rebuild_cache:  # generation recomputes the cache once past the original context
        g.meta["rebuild_cache_after"] = min(sc.original_max_positions, g.meta.get("rebuild_cache_after", 1 << 62))
    return linear(c, f"{p}.out", core, h * hd, c.d, f"{cross}out_proj", layer, s.bias.out, init=residual)


def _bias_parts(parts: tuple[tuple[int, bool], ...]) -> dict[str, Any]:
    """A packed projection's bias from its parts' (width, biased): all, none, or the biased spans only."""
    if len({on for _, on in parts}) == 1:
        return {"bias": parts[0][1]}
    spans, at = [], 0
    for width, on in parts:
        if on:
            spans.append((at, at + width))
        at += width
    return {"bias": True, "bias_spans": tuple(spans)}


def _latent_attention(c: Context, p: str, x: str, layer: int, mask: str) -> str:
    """Multi-head latent attention (DeepSeek-V2/V3, transformers' names in brackets): q from x (``q``) or from a
    normalised low-rank latent (``q_a`` → ``q_a_norm`` → ``q_b``); the KV latent and the shared rotary key
    (``kv_a``, its latent part normalised by ``kv_a_norm``); the core expands the latent per head; ``out``.
    Biases as transformers': on q_a, kv_a and out (bias.qkv, bias.out), never on q, q_b or kv_b."""
    s, g = c.spec, c.g
    lat = s.attention.latent
    assert lat is not None
    h, qk, v, rank = s.attention.heads, resolve.head_dim(s), resolve.v_head_dim(s), lat.kv_rank
    rope = s.position.type == "rotary"
    residual = "residual" if s.init.scaled_residual else "normal"
    if lat.q_rank is not None:
        q = linear(c, f"{p}.q_a", x, c.d, lat.q_rank, "qkv_proj", layer, s.bias.qkv)
        q = g.add("rmsnorm", f"{p}.q_a_norm", [q], "norm", layer=layer, stack=c.stack, dim=lat.q_rank, eps=lat.eps)
        q = linear(c, f"{p}.q_b", q, lat.q_rank, h * qk, "qkv_proj", layer, False)
    else:
        q = linear(c, f"{p}.q", x, c.d, h * qk, "qkv_proj", layer, False)
    kv = linear(c, f"{p}.kv_a", x, c.d, rank + lat.rope_head_dim, "qkv_proj", layer, s.bias.qkv)
    kv = g.add(
        "slice_rmsnorm", f"{p}.kv_a_norm", [kv], "norm", layer=layer, stack=c.stack, dim=rank, start=0, width=rank,
        eps=lat.eps,
    )  # fmt: skip
    core = g.add(
        "latent_attention",
        f"{p}.core",
        [q, kv] + ([c.pad] if c.pad is not None else []),
        "attention",
        layer=layer,
        stack=c.stack,
        heads=h,
        nope_head_dim=lat.nope_head_dim,
        rope_head_dim=lat.rope_head_dim,
        v_head_dim=v,
        kv_rank=rank,
        mask=mask,
        window=s.attention.window,
        prefix=s.attention.prefix,
        chunk=s.attention.chunk,
        scale=resolve.attention_scale(s),
        scale_stated=s.attention.scale is not None,
        rope_dims=int(resolve.rotary_dims(s)) if rope else 0,
        rope_theta=s.position.theta,
        rope_scaling=_rope_scaling(s) if rope else None,
        rope_interleaved=rope and s.position.rotation == "interleaved",
        dropout=s.dropout.attention,
        padding=c.pad is not None,
    )
    sc = s.position.scaling if rope else None
    if sc is not None and sc.rebuild_cache:
        g.meta["rebuild_cache_after"] = min(sc.original_max_positions, g.meta.get("rebuild_cache_after", 1 << 62))
    return linear(c, f"{p}.out", core, h * v, c.d, "out_proj", layer, s.bias.out, init=residual)


def _alibi(s: Any, self_attention: bool) -> dict[str, Any]:
    """The ALiBi attributes of a self-attention core (a rule keeps ALiBi to decoders)."""
    if s.position.type != "alibi" or not self_attention:
        return {}
    return {
        "alibi_max_bias": float(s.position.max_bias),
        "alibi_scaled": bool(s.position.scaled),
        "alibi_bf16": s.position.bias_dtype == "bf16",
    }


def _temperature(s: Any, self_attention: bool) -> dict[str, Any]:
    """Llama 4's temperature tuning of q (a rule keeps it to decoder layers without RoPE)."""
    t = s.attention.temperature
    if t is None or not self_attention:
        return {}
    return {"temperature_floor": t.floor, "temperature_scale": float(t.scale)}


def _qk_norm(c: Context, name: str, x: str, start: int, width: int, layer: int) -> str:
    """QK-norm of the q (or k) features [start, start + width) of a packed projection; x itself without one."""
    s = c.spec
    if s.attention.qk_norm == "none":
        return x
    group = resolve.head_dim(s) if s.attention.qk_norm in ("head", "l2") else width
    return c.g.add(
        "slice_rmsnorm",
        name,
        [x],
        "norm",
        layer=layer,
        stack=c.stack,
        dim=group,
        start=start,
        width=width,
        eps=s.norm.eps,
        **({"affine": False} if s.attention.qk_norm == "l2" else {"unit_offset": s.norm.unit_offset}),
    )


def _rope_scaling(s: Any) -> dict[str, Any] | None:
    """The spec's RoPE scaling with every default resolved (transformers' defaults), for the rope math."""
    sc = s.position.scaling
    if sc is None:
        return None
    given = {k: v for k, v in sc.model_dump().items() if v is not None and k != "rebuild_cache"}
    defaults: dict[str, Any] = {}
    if sc.type == "dynamic":
        defaults["original_max_positions"] = s.context  # HF: max_position_embeddings
    if sc.type == "yarn":
        defaults.update(beta_fast=32.0, beta_slow=1.0, truncate=True)
    if sc.type == "longrope" and sc.original_max_positions:
        defaults["factor"] = s.context / sc.original_max_positions  # HF: max_position_embeddings / original
    return {"type": sc.type, **defaults, **given}


def _mlp(c: Context, p: str, x: str, layer: int) -> str:
    s, g, d = c.spec, c.g, c.d
    m, hidden, act = s.mlp, resolve.mlp_hidden(s), resolve.mlp_activation(s)
    residual = "residual" if s.init.scaled_residual else "normal"
    if isinstance(m, MoEMLP):
        logits = linear(c, f"{p}.router", x, d, m.experts, "router", layer, m.router.bias)
        routed = g.add(
            "moe",
            f"{p}.experts",
            [x, logits],
            "mlp",
            layer=layer,
            stack=c.stack,
            experts=m.experts,
            active=m.active,
            expert=m.expert,
            dim=d,
            hidden=hidden,
            activation=act,
            normalize=m.router.normalize,
            # Training only (Switch Transformer): router input jitter and the load-balancing loss weight.
            aux_loss_coef=float(m.router.aux_loss_coef),
            jitter=float(m.router.jitter),
            bias=s.bias.mlp,
            score=m.router.score,
            score_bias=m.router.score_bias,
            groups=m.router.groups,
            top_groups=m.router.top_groups if m.router.top_groups is not None else m.router.groups,
            group_score=m.router.group_score,
            routed_scale=float(m.router.scale),
            weigh_input=m.router.weighs == "input",
            **({} if m.clamp is None else {"clamp_limit": float(m.clamp.limit), "clamp_alpha": float(m.clamp.alpha)}),
        )
        return routed if m.shared is None else _shared_expert(c, p, x, routed, layer)
    if isinstance(m, SwiGLUMLP):
        gate = linear(c, f"{p}.gate", x, d, hidden, "mlp", layer, s.bias.mlp)
        up = linear(c, f"{p}.up", x, d, hidden, "mlp", layer, s.bias.mlp)
        h = g.add("glu", f"{p}.act", [gate, up], "activation", layer=layer, stack=c.stack, fn=act)
        return linear(c, f"{p}.down", h, hidden, d, "mlp", layer, s.bias.mlp, init=residual)
    h = linear(c, f"{p}.fc1", x, d, hidden, "mlp", layer, s.bias.mlp)
    h = g.add("activation", f"{p}.act", [h], "activation", layer=layer, stack=c.stack, fn=act)
    return linear(c, f"{p}.fc2", h, hidden, d, "mlp", layer, s.bias.mlp, init=residual)


def _shared_expert(c: Context, p: str, x: str, routed: str, layer: int) -> str:
    """routed + shared(x), the shared expert gated by sigmoid(Linear(D, 1)(x)) when asked (Qwen2-MoE); its
    own nodes, so the ``moe`` op stays the routed experts alone."""
    s, g, d = c.spec, c.g, c.d
    m = s.mlp
    assert isinstance(m, MoEMLP) and m.shared is not None
    hidden, act, bias = m.shared.hidden, resolve.mlp_activation(s), s.bias.mlp
    init = "residual" if s.init.scaled_residual else "normal"
    q = f"{p}.shared"
    if m.expert == "swiglu":
        gate = linear(c, f"{q}.gate", x, d, hidden, "mlp", layer, bias)
        up = linear(c, f"{q}.up", x, d, hidden, "mlp", layer, bias)
        h = g.add("glu", f"{q}.act", [gate, up], "activation", layer=layer, stack=c.stack, fn=act)
        out = linear(c, f"{q}.down", h, hidden, d, "mlp", layer, bias, init=init)
    else:
        h = linear(c, f"{q}.fc1", x, d, hidden, "mlp", layer, bias)
        h = g.add("activation", f"{q}.act", [h], "activation", layer=layer, stack=c.stack, fn=act)
        out = linear(c, f"{q}.fc2", h, hidden, d, "mlp", layer, bias, init=init)
    if m.shared.gate == "sigmoid":
        logit = linear(c, f"{p}.shared_gate", x, d, 1, "mlp", layer, False)
        out = g.add("sigmoid_gate", f"{p}.shared_scale", [out, logit], "activation", layer=layer, stack=c.stack)
    return g.add("add", f"{p}.add_shared", [routed, out], "mlp", layer=layer, stack=c.stack, dropout=0.0)


def _residual(c: Context, name: str, x: str, branch: str, layer: int) -> str:
    scale = c.spec.residual_scale
    if scale != 1.0:  # Granite: x + residual_multiplier · f(x)
        branch = c.g.add("scale", f"{name}_scale", [branch], "residual", layer=layer, stack=c.stack, factor=scale)
    return c.g.add("add", name, [x, branch], "residual", layer=layer, stack=c.stack, dropout=c.spec.dropout.residual)


def block(
    c: Context, p: str, x: str, layer: int, mask: str, memory: str | None = None, mem_pad: str | None = None
) -> str:
    """One Transformer block with cross-attention when ``memory`` is given. Each sublayer f, by placement: pre
    x + f(normK(x)); post normK(x + f(x)); sandwich x + normK_post(f(normK(x))); output x + normK_post(f(x)).
    Parallel sublayers (pre only): x + attn(norm1(x)) + mlp(norm1(x) or norm2(x))."""
    placement, parallel = c.spec.norm.placement, c.spec.parallel

    def norm_at(name: str, v: str) -> str:
        return norm(c, f"{p}.{name}", v, layer)

    def sub(name: str, nk: str, x: str, make: Any) -> str:
        add = f"{p}.add_{name}"
        if placement == "pre":
            skip = nk == "norm1" and layer == 0 and c.spec.norm.skip_first  # ModernBERT's first block
            return _residual(c, add, x, make(x if skip else norm_at(nk, x)), layer)
        if placement == "post":
            return norm_at(nk, _residual(c, add, x, make(x), layer))
        branch = make(norm_at(nk, x)) if placement == "sandwich" else make(x)
        return _residual(c, add, x, norm_at(f"{nk}_post", branch), layer)

    if parallel != "none":  # a rule keeps these to pre-norm self-attention blocks
        h = norm_at("norm1", x)
        attn = _attention(c, f"{p}.attn", h, layer, mask)
        mlp = _mlp(c, f"{p}.mlp", h if parallel == "shared_norm" else norm_at("norm2", x), layer)
        return _residual(c, f"{p}.add_mlp", _residual(c, f"{p}.add_attn", x, attn, layer), mlp, layer)
    x = sub("attn", "norm1", x, lambda h: _attention(c, f"{p}.attn", h, layer, mask))
    if memory is not None:
        cross = Context(c.g, c.spec, c.stack, mem_pad)  # no position bias: T5's cross-attention has none
        x = sub("cross", "norm_cross", x, lambda h: _attention(cross, f"{p}.cross_attn", h, layer, "none", memory))
    return sub("mlp", "norm2", x, lambda h: _mlp(c, f"{p}.mlp", h, layer))


def stack(
    c: Context, prefix: str, x: str, blocks: int, mask: str, memory: str | None = None, mem_pad: str | None = None
) -> str:
    """``blocks`` blocks named ``{prefix}blocks.{i}`` (each of its layer kind, when the spec mixes kinds), then
    the final norm."""
    kinds_of = kinds.pattern(c.spec)
    per_kind = {k: Context(c.g, kinds.effective(c.spec, k), c.stack, c.pad, c.ids, c.bias) for k in set(kinds_of or ())}
    for i in range(blocks):
        ck = per_kind[kinds_of[i]] if kinds_of else c
        x = block(ck, f"{prefix}blocks.{i}", x, i, resolve.mask(ck.spec) if kinds_of else mask, memory, mem_pad)
    if kinds_of:
        c.g.meta["layer_kinds"] = kinds_of  # the kind of each block, for per-kind costs
    if resolve.final_norm(c.spec):
        x = norm(c, f"{prefix}norm_f", x, None)
    return x


def attention_pool(c: Context, p: str, x: str) -> str:
    """SigLIP's attention-pooling head: a learned probe attends over the tokens (cross-attention of the model's
    own heads), then h + mlp(norm(h)); the probe's one token is the pooled vector [B, D]."""
    probe = c.g.add("probe", f"{p}.probe", [x], "head", stack=c.stack, dim=c.d)
    h = _attention(Context(c.g, c.spec, c.stack, None), f"{p}.attn", probe, None, "none", x)  # type: ignore[arg-type]
    h = _residual(c, f"{p}.add_mlp", h, _mlp(c, f"{p}.mlp", norm(c, f"{p}.norm", h, None), None), None)  # type: ignore[arg-type]
    return c.g.add("pool", f"{p}.select", [h], "head", stack=c.stack, mode="cls")
