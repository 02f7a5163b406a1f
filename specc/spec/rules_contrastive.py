"""Rules of the embedding heads: a tower's projection needs a pooled output, and a dual encoder's towers each
pool into one shared embedding width and take the model's dtype and init."""

from __future__ import annotations

from typing import Any

from .schema import DualEncoderSpec, EncoderSpec, ViTSpec
from .violation import Violation

POOLED_HEADS = {"vit": ("pooled", "pooled_norm", "attention_pool"), "encoder": ("pooled", "eos", "last")}


def projection_rules(spec: EncoderSpec | ViTSpec) -> Any:
    pooled = POOLED_HEADS["vit" if isinstance(spec, ViTSpec) else "encoder"]
    if spec.projection is not None and spec.head not in pooled:
        yield Violation(
            ("projection",),
            f"projection maps the pooled output, but head {spec.head} pools none",
            f"use head: {' | '.join(pooled)}",
            also=(("head",),),
        )


def embed_width(tower: EncoderSpec | ViTSpec) -> int:
    """The width of the tower's embedding: its projection's, or the pooled output's."""
    if tower.projection is not None:
        return tower.projection.dim
    return tower.d_model


def dual_encoder_rules(spec: DualEncoderSpec) -> Any:
    for part, tower in (("vision", spec.vision), ("text", spec.text)):
        pooled = POOLED_HEADS[tower.kind]
        if tower.head not in pooled:
            yield Violation(
                (part, "head"),
                f"a dual encoder's {part} tower embeds its pooled output, but head {tower.head} pools none",
                f"use head: {' | '.join(pooled)}",
            )
        for key in ("dtype", "init"):
            if key in tower.model_fields_set:
                message = f"{part}.{key}: the towers take the model's {key}"
                yield Violation((part, key), message, "set it at the top level")
    vision, text = embed_width(spec.vision), embed_width(spec.text)
    if vision != text:
        yield Violation(
            ("text", "projection") if spec.text.projection is not None else ("text", "d_model"),
            f"the towers embed into different widths: vision {vision}, text {text}",
            "give both towers a projection of one dim",
            also=(("vision", "projection"), ("vision", "d_model")),
        )
