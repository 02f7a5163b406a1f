"""Lowering: the only code that reads architecture decisions off a Spec. Everything after reads the graph."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..spec import kinds, resolve
from ..spec.schema import (
    DecoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    MoEMLP,
    RNNSeq2SeqSpec,
    SpecModel,
    SwiGLUMLP,
    ViTSpec,
    _Transformer,
)
from .graph import LayerGraph


def lower(spec: SpecModel) -> LayerGraph:
    """Spec → LayerGraph. Pure, fast (no tensors): GPT-3 175B lowers in milliseconds."""
    # The families build on the shared helpers below, so they import this module; import them here.
    from .lower_families import _decoder, _encoder, _encoder_decoder, _rnn_seq2seq, _vit

    if isinstance(spec, DecoderSpec):
        return _decoder(spec)
    if isinstance(spec, EncoderSpec):
        return _encoder(spec)
    if isinstance(spec, EncoderDecoderSpec):
        return _encoder_decoder(spec)
    if isinstance(spec, ViTSpec):
        return _vit(spec)
    if isinstance(spec, RNNSeq2SeqSpec):
        return _rnn_seq2seq(spec)
    raise TypeError(f"cannot lower {type(spec).__name__}")


# ---------------------------------------------------------------------------------------------- shared


@dataclass
class _Ctx:
    """What one Transformer stack needs while lowering, resolved once."""

    g: LayerGraph
    spec: _Transformer
    stack: str | None
    pad: str | None  # graph input holding the key padding mask, if any

    @property
    def d(self) -> int:
        return self.spec.d_model


def _meta(spec: Any, family: str, task: str, layers: int, **extra: Any) -> dict[str, Any]:
    std = spec.init.std
    residual = std / math.sqrt(2 * layers) if getattr(spec.init, "scaled_residual", False) and layers else std
    return {
        "name": spec.name,
        "family": family,
        "task": task,
        "dtype": spec.dtype,
        "init_std": std,
        "residual_std": residual,
        "seed": spec.init.seed,
        "source": getattr(spec, "source", None),  # an imported model's reference counts follow it (analysis.params)
        **extra,
    }


def _text_facts(s: Any) -> dict[str, Any]:
    """What runtimes check inputs against: vocabulary, context, and the longest sequence a learned position
    table can index (None when positions are not a table)."""
    learned = s.position.type == "learned"
    return {"context": s.context, "vocab_size": s.vocab_size, "max_positions": s.context if learned else None}


def _embed_tail(c: _Ctx, x: str, prefix: str, positions: int | None) -> str:
    """Positions (additive kinds), embedding norm and dropout after the token embedding."""
    s, g = c.spec, c.g
    pos = s.position.type
    if pos == "learned" and positions is not None:
        x = g.add("learned_pos", f"{prefix}pos", [x], "pos", stack=c.stack, positions=positions, dim=c.d)
    elif pos == "sinusoidal":
        x = g.add("sinusoidal_pos", f"{prefix}pos", [x], "pos", stack=c.stack, dim=c.d)
    return _embed_norm_dropout(c, x, prefix)


def _embed_norm_dropout(c: _Ctx, x: str, prefix: str) -> str:
    if c.spec.norm.embedding:
        x = _norm(c, f"{prefix}embed_norm", x, None)
    if c.spec.dropout.embedding > 0:
        x = c.g.add("dropout", f"{prefix}embed_dropout", [x], "embed", stack=c.stack, p=c.spec.dropout.embedding)
    return x


def _norm(c: _Ctx, name: str, x: str, layer: int | None) -> str:
    n = c.spec.norm
    attrs: dict[str, Any] = {"dim": c.d, "eps": n.eps}
    if n.type == "layernorm":
        attrs["bias"] = c.spec.bias.norm
    else:
        attrs["unit_offset"] = n.unit_offset
    return c.g.add(n.type, name, [x], "norm", layer=layer, stack=c.stack, **attrs)


def _linear(
    c: _Ctx, name: str, x: str, n_in: int, n_out: int, category: str, layer: int | None, bias: bool, **attrs: Any
) -> str:
    return c.g.add(
        "linear",
        name,
        [x],
        category,
        layer=layer,
        stack=c.stack,
        in_features=n_in,
        out_features=n_out,
        bias=bias,
        **attrs,
    )


def _attention(c: _Ctx, p: str, x: str, layer: int, mask: str, memory: str | None = None) -> str:
    """QKV projection, fused attention core, output projection. ``memory`` makes it cross-attention."""
    s, g = c.spec, c.g
    h, kv, hd = s.attention.heads, resolve.kv_heads(s), resolve.head_dim(s)
    rope = s.position.type == "rotary" and memory is None
    cross = "cross_" if memory is not None else ""
    residual = "residual" if s.init.scaled_residual else "normal"
    if memory is None:
        packed = _linear(c, f"{p}.qkv", x, c.d, (h + 2 * kv) * hd, "qkv_proj", layer, s.bias.qkv)
        packed = _qk_norm(c, f"{p}.q_norm", packed, 0, h * hd, layer)
        core_in = [_qk_norm(c, f"{p}.k_norm", packed, h * hd, kv * hd, layer)]
    else:
        q = _linear(c, f"{p}.q", x, c.d, h * hd, "cross_qkv_proj", layer, s.bias.qkv)
        kvp = _linear(c, f"{p}.kv", memory, c.d, 2 * kv * hd, "cross_qkv_proj", layer, s.bias.qkv)
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
        softcap=s.attention.softcap,
        chunk=s.attention.chunk,
        rope_dims=int(resolve.rotary_dims(s)) if rope else 0,  # a rule made it an even whole number
        rope_theta=s.position.theta,
        rope_scaling=_rope_scaling(s) if rope else None,  # rebuild_cache: a generation fact, in the meta
        rope_interleaved=rope and s.position.rotation == "interleaved",
        dropout=s.dropout.attention,
        cross=memory is not None,
        padding=c.pad is not None,
    )
    sc = s.position.scaling if rope else None
    if sc is not None and sc.rebuild_cache:  # generation recomputes the cache once past the original context
        g.meta["rebuild_cache_after"] = min(sc.original_max_positions, g.meta.get("rebuild_cache_after", 1 << 62))
    return _linear(c, f"{p}.out", core, h * hd, c.d, f"{cross}out_proj", layer, s.bias.out, init=residual)


def _qk_norm(c: _Ctx, name: str, x: str, start: int, width: int, layer: int) -> str:
    """QK-norm of the q (or k) features [start, start + width) of a packed projection; x itself without one."""
    s = c.spec
    if s.attention.qk_norm == "none":
        return x
    group = resolve.head_dim(s) if s.attention.qk_norm == "head" else width
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
        unit_offset=s.norm.unit_offset,
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


def _mlp(c: _Ctx, p: str, x: str, layer: int) -> str:
    s, g, d = c.spec, c.g, c.d
    m, hidden, act = s.mlp, resolve.mlp_hidden(s), resolve.mlp_activation(s)
    residual = "residual" if s.init.scaled_residual else "normal"
    if isinstance(m, MoEMLP):
        logits = _linear(c, f"{p}.router", x, d, m.experts, "router", layer, False)
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
        )
        return routed if m.shared is None else _shared_expert(c, p, x, routed, layer)
    if isinstance(m, SwiGLUMLP):
        gate = _linear(c, f"{p}.gate", x, d, hidden, "mlp", layer, s.bias.mlp)
        up = _linear(c, f"{p}.up", x, d, hidden, "mlp", layer, s.bias.mlp)
        h = g.add("glu", f"{p}.act", [gate, up], "activation", layer=layer, stack=c.stack, fn=act)
        return _linear(c, f"{p}.down", h, hidden, d, "mlp", layer, s.bias.mlp, init=residual)
    h = _linear(c, f"{p}.fc1", x, d, hidden, "mlp", layer, s.bias.mlp)
    h = g.add("activation", f"{p}.act", [h], "activation", layer=layer, stack=c.stack, fn=act)
    return _linear(c, f"{p}.fc2", h, hidden, d, "mlp", layer, s.bias.mlp, init=residual)


def _shared_expert(c: _Ctx, p: str, x: str, routed: str, layer: int) -> str:
    """routed + shared(x), the shared expert gated by sigmoid(Linear(D, 1)(x)) when asked (Qwen2-MoE); its
    own nodes, so the ``moe`` op stays the routed experts alone."""
    s, g, d = c.spec, c.g, c.d
    m = s.mlp
    assert isinstance(m, MoEMLP) and m.shared is not None
    hidden, act, bias = m.shared.hidden, resolve.mlp_activation(s), s.bias.mlp
    init = "residual" if s.init.scaled_residual else "normal"
    q = f"{p}.shared"
    if m.expert == "swiglu":
        gate = _linear(c, f"{q}.gate", x, d, hidden, "mlp", layer, bias)
        up = _linear(c, f"{q}.up", x, d, hidden, "mlp", layer, bias)
        h = g.add("glu", f"{q}.act", [gate, up], "activation", layer=layer, stack=c.stack, fn=act)
        out = _linear(c, f"{q}.down", h, hidden, d, "mlp", layer, bias, init=init)
    else:
        h = _linear(c, f"{q}.fc1", x, d, hidden, "mlp", layer, bias)
        h = g.add("activation", f"{q}.act", [h], "activation", layer=layer, stack=c.stack, fn=act)
        out = _linear(c, f"{q}.fc2", h, hidden, d, "mlp", layer, bias, init=init)
    if m.shared.gate == "sigmoid":
        logit = _linear(c, f"{p}.shared_gate", x, d, 1, "mlp", layer, False)
        out = g.add("sigmoid_gate", f"{p}.shared_scale", [out, logit], "activation", layer=layer, stack=c.stack)
    return g.add("add", f"{p}.add_shared", [routed, out], "mlp", layer=layer, stack=c.stack, dropout=0.0)


def _residual(c: _Ctx, name: str, x: str, branch: str, layer: int) -> str:
    return c.g.add("add", name, [x, branch], "residual", layer=layer, stack=c.stack, dropout=c.spec.dropout.residual)


def _block(
    c: _Ctx, p: str, x: str, layer: int, mask: str, memory: str | None = None, mem_pad: str | None = None
) -> str:
    """One Transformer block with cross-attention when ``memory`` is given. Each sublayer f, by placement: pre
    x + f(normK(x)); post normK(x + f(x)); sandwich x + normK_post(f(normK(x))); output x + normK_post(f(x)).
    Parallel sublayers (pre only): x + attn(norm1(x)) + mlp(norm1(x) or norm2(x))."""
    placement, parallel = c.spec.norm.placement, c.spec.parallel

    def norm(name: str, v: str) -> str:
        return _norm(c, f"{p}.{name}", v, layer)

    def sub(name: str, nk: str, x: str, make: Any) -> str:
        add = f"{p}.add_{name}"
        if placement == "pre":
            return _residual(c, add, x, make(norm(nk, x)), layer)
        if placement == "post":
            return norm(nk, _residual(c, add, x, make(x), layer))
        branch = make(norm(nk, x)) if placement == "sandwich" else make(x)
        return _residual(c, add, x, norm(f"{nk}_post", branch), layer)

    if parallel != "none":  # a rule keeps these to pre-norm self-attention blocks
        h = norm("norm1", x)
        attn = _attention(c, f"{p}.attn", h, layer, mask)
        mlp = _mlp(c, f"{p}.mlp", h if parallel == "shared_norm" else norm("norm2", x), layer)
        return _residual(c, f"{p}.add_mlp", _residual(c, f"{p}.add_attn", x, attn, layer), mlp, layer)
    x = sub("attn", "norm1", x, lambda h: _attention(c, f"{p}.attn", h, layer, mask))
    if memory is not None:
        cross = _Ctx(c.g, c.spec, c.stack, mem_pad)
        x = sub("cross", "norm_cross", x, lambda h: _attention(cross, f"{p}.cross_attn", h, layer, "none", memory))
    return sub("mlp", "norm2", x, lambda h: _mlp(c, f"{p}.mlp", h, layer))


def _stack(
    c: _Ctx, prefix: str, x: str, blocks: int, mask: str, memory: str | None = None, mem_pad: str | None = None
) -> str:
    kinds_of = kinds.pattern(c.spec)
    per_kind = {k: _Ctx(c.g, kinds.effective(c.spec, k), c.stack, c.pad) for k in set(kinds_of or ())}
    for i in range(blocks):
        ck = per_kind[kinds_of[i]] if kinds_of else c
        x = _block(ck, f"{prefix}blocks.{i}", x, i, resolve.mask(ck.spec) if kinds_of else mask, memory, mem_pad)
    if kinds_of:
        c.g.meta["layer_kinds"] = kinds_of  # the kind of each block, for per-kind costs
    if resolve.final_norm(c.spec):
        x = _norm(c, f"{prefix}norm_f", x, None)
    return x


def _head(c: _Ctx, x: str, vocab: int, tied_to: str | None, name: str = "lm_head", category: str = "lm_head") -> str:
    """The head's linear, then the logit transforms: softcap(scale · head(x))."""
    extra = {"tied_to": tied_to} if tied_to else {}
    y = _linear(c, name, x, c.d, vocab, category, None, c.spec.bias.head, **extra)
    out = c.spec.output
    if out.scale != 1.0:
        y = c.g.add("scale", "logit_scale", [y], category, stack=c.stack, factor=out.scale)
    if out.softcap is not None:
        y = c.g.add("softcap", "logit_softcap", [y], category, stack=c.stack, cap=out.softcap)
    return y


def _pooler(c: _Ctx, x: str, mode: str) -> str:
    """BERT / HF ViTModel pooler: tanh(dense(first token)) (or of the mean, for mean-pooled ViTs)."""
    h = c.g.add("pool", "pooler.select", [x], "head", mode=mode)
    h = _linear(c, "pooler.dense", h, c.d, c.d, "head", None, True)
    return c.g.add("activation", "pooler.act", [h], "activation", fn="tanh")
