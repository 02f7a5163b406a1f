"""The lowering context and the helpers every model kind shares: graph facts, linear and norm ops, the
embedding tail, the output head and the pooler. The Transformer stack is ``blocks``; each model kind its own
module."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...spec.schema import _Transformer
from ..graph import LayerGraph


@dataclass
class Context:
    """What one Transformer stack needs while lowering, resolved once."""

    g: LayerGraph
    spec: _Transformer
    stack: str | None
    pad: str | None  # graph input holding the key padding mask, if any
    ids: str | None = None  # the stack's token ids (what a relative position bias reads its lengths off)
    bias: str | None = None  # the stack's shared relative position bias [1, H, N_q, N_k] (T5), if any

    @property
    def d(self) -> int:
        return self.spec.d_model


def graph_meta(spec: Any, family: str, task: str, layers: int, **extra: Any) -> dict[str, Any]:
    """The graph's model-wide facts (``LayerGraph.meta``): name, family, task, dtype and the init rule."""
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


def text_facts(s: Any) -> dict[str, Any]:
    """What runtimes check inputs against: vocabulary, context, and the longest sequence a learned position
    table can index (None when positions are not a table)."""
    learned = s.position.type == "learned"
    return {"context": s.context, "vocab_size": s.vocab_size, "max_positions": s.context if learned else None}


def linear(
    c: Context, name: str, x: str, n_in: int, n_out: int, category: str, layer: int | None, bias: bool, **attrs: Any
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


def norm(c: Context, name: str, x: str, layer: int | None) -> str:
    n = c.spec.norm
    attrs: dict[str, Any] = {"dim": c.d, "eps": n.eps}
    if n.type == "layernorm":
        attrs["bias"] = c.spec.bias.norm
    else:
        attrs["unit_offset"] = n.unit_offset
    return c.g.add(n.type, name, [x], "norm", layer=layer, stack=c.stack, **attrs)


def relative_bias(c: Context, name: str, bidirectional: bool, layer: int | None = None) -> str:
    """T5's bucketed relative position bias of one stack (or, per_layer, one self-attention layer)."""
    p = c.spec.position
    assert c.ids is not None
    return c.g.add(
        "relative_bias",
        name,
        [c.ids],
        "pos",
        layer=layer,
        stack=c.stack,
        heads=c.spec.attention.heads,
        buckets=p.buckets,
        max_distance=p.max_distance,
        bidirectional=bidirectional,
    )


def embed_tail(c: Context, x: str, prefix: str, positions: int | None) -> str:
    """Positions (additive kinds), embedding norm and dropout after the token embedding."""
    s, g = c.spec, c.g
    pos = s.position.type
    if pos == "learned" and positions is not None:
        x = g.add(
            "learned_pos", f"{prefix}pos", [x], "pos", stack=c.stack, positions=positions, dim=c.d, **pos_offset(s)
        )
    elif pos == "sinusoidal":
        x = g.add("sinusoidal_pos", f"{prefix}pos", [x], "pos", stack=c.stack, dim=c.d)
    return embed_norm_dropout(c, x, prefix)


def pos_offset(s: Any) -> dict[str, int]:
    """A learned table's leading rows (the attribute only when there are some, as older graphs had none)."""
    return {"offset": s.position.offset} if s.position.offset else {}


def embed_norm_dropout(c: Context, x: str, prefix: str) -> str:
    if c.spec.norm.embedding:
        x = norm(c, f"{prefix}embed_norm", x, None)
    if c.spec.dropout.embedding > 0:
        x = c.g.add("dropout", f"{prefix}embed_dropout", [x], "embed", stack=c.stack, p=c.spec.dropout.embedding)
    return x


def head(c: Context, x: str, vocab: int, tied_to: str | None, name: str = "lm_head", category: str = "lm_head") -> str:
    """The head's linear, then the logit transforms: softcap(scale · head(x))."""
    extra = {"tied_to": tied_to} if tied_to else {}
    y = linear(c, name, x, c.d, vocab, category, None, c.spec.bias.head, **extra)
    out = c.spec.output
    if out.scale != 1.0:
        y = c.g.add("scale", "logit_scale", [y], category, stack=c.stack, factor=out.scale)
    if out.softcap is not None:
        y = c.g.add("softcap", "logit_softcap", [y], category, stack=c.stack, cap=out.softcap)
    return y


def pooler(c: Context, x: str, mode: str, prefix: str = "") -> str:
    """BERT / HF ViTModel pooler: tanh(dense(first token)) (or of the mean, for mean-pooled ViTs)."""
    h = c.g.add("pool", f"{prefix}pooler.select", [x], "head", stack=c.stack, mode=mode)
    h = linear(c, f"{prefix}pooler.dense", h, c.d, c.d, "head", None, True)
    return c.g.add("activation", f"{prefix}pooler.act", [h], "activation", stack=c.stack, fn="tanh")
