"""Parameter counts from the graph: total, active (MoE), embedding / head / the rest, by category.

``total`` is the count the model's reference implementation reports. For specs written for specc that is
simply the tensors specc stores (``stored``). For a spec imported from Hugging Face (``specc import-hf``
records ``source: Hugging Face <Architecture>, ...``) it is ``num_parameters()`` of the transformers model,
and the keys below say how the two differ (each 0 for everything else):

- ``frozen``: tensors the reference counts as parameters but never trains, which specc computes instead
  (Marian's sinusoidal position tables, ``requires_grad=False`` in transformers);
- ``unused``: tables the reference stores but never reads (the ``shared`` table of an untied BART; BART's 2
  leading position rows are specc's ``position.offset`` rows, stored alike);
- ``buffers``: specc parameters the reference holds as buffers (BART/Marian ``final_logits_bias``, specc's
  ``lm_head.bias``; for every spec, a MoE's ``score_bias``: DeepSeek-V3's ``e_score_correction_bias``, set by
  load balancing, not trained, a buffer in DeepSeek's and transformers' code).

So ``total = stored + frozen + unused − buffers`` and ``trainable = total − frozen`` (transformers'
``num_parameters(only_trainable=True)``). ``active``, ``embedding``, ``non_embedding`` (= stored − embedding),
``head`` and ``by_category`` count what specc stores. Tied parameters are counted once, by the op that owns
them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..ir.graph import LayerGraph, Op
from .costs import numel

EMBEDDING_CATEGORIES = ("embed", "pos")  # token, type and position tables, patch projection, class token
HEAD_CATEGORIES = ("lm_head", "head")
_HF_SOURCE = re.compile(r"^\s*Hugging Face (\w+)")


def active_fraction(op: Op) -> Fraction:
    """Share of an op's parameters one token uses: top-``active`` of ``experts`` for MoE, else all."""
    if op.kind == "moe":
        return Fraction(op.attrs.active, op.attrs.experts)
    return Fraction(1)


@dataclass
class ParamCounts:
    stored: int = 0
    active: int = 0
    embedding: int = 0
    head: int = 0
    by_category: dict[str, int] = field(default_factory=dict)
    frozen: int = 0
    unused: int = 0
    buffers: int = 0
    reference: str | None = None  # "transformers MarianMTModel" when the counts follow that implementation

    @property
    def total(self) -> int:
        return self.stored + self.frozen + self.unused - self.buffers

    @property
    def trainable(self) -> int:
        return self.total - self.frozen

    @property
    def non_embedding(self) -> int:
        return self.stored - self.embedding

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "active": self.active,
            "embedding": self.embedding,
            "non_embedding": self.non_embedding,
            "head": self.head,
            "by_category": dict(self.by_category),
            "stored": self.stored,
            "trainable": self.trainable,
            "frozen": self.frozen,
            "unused": self.unused,
            "buffers": self.buffers,
            "reference": self.reference,
        }


def count_params(g: LayerGraph) -> ParamCounts:
    """Tied parameters are counted once, by the op that owns them."""
    pc = ParamCounts()
    for op in g.ops():
        n = sum(numel(p.shape) for p in op.params.values())
        if not n:
            continue
        pc.stored += n
        pc.active += int(n * active_fraction(op))
        pc.by_category[op.category] = pc.by_category.get(op.category, 0) + n
        if op.category in EMBEDDING_CATEGORIES:
            pc.embedding += n
        elif op.category in HEAD_CATEGORIES:
            pc.head += n
    _reference_counts(g, pc)
    pc.buffers += sum(numel(op.params["score_bias"].shape) for op in g.ops() if "score_bias" in op.params)
    return pc


def hf_architecture(g: LayerGraph) -> str | None:
    """The transformers class a spec was imported from (``source: Hugging Face <Architecture>, ...``)."""
    m = _HF_SOURCE.match(str(g.meta.get("source") or ""))
    return m.group(1) if m else None


def _reference_counts(g: LayerGraph, pc: ParamCounts) -> None:
    arch = hf_architecture(g)
    if arch not in ("BartForConditionalGeneration", "MarianMTModel") or g.meta.get("family") != "encoder_decoder":
        return
    pc.reference = f"transformers {arch}"
    ops = {op.name: op for op in g.ops()}
    head_bias = ops["lm_head"].params.get("bias") if "lm_head" in ops else None
    pc.buffers = numel(head_bias.shape) if head_bias is not None else 0  # final_logits_bias
    context = int(g.meta.get("context") or 0)
    for op in g.ops():
        if op.kind == "sinusoidal_pos":  # Marian: a frozen max_position_embeddings × d_model table per stack
            pc.frozen += context * int(op.attrs.dim)
    decoder_embed = ops.get("decoder.embed")
    encoder_embed = ops.get("encoder.embed")
    untied = decoder_embed is not None and decoder_embed.attrs.tied_to is None
    if arch == "BartForConditionalGeneration" and untied and encoder_embed is not None:
        pc.unused += sum(numel(p.shape) for p in encoder_embed.params.values())  # the unread `shared` table
