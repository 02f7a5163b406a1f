"""What the decoder-only families share when mapping a config.json to a spec: the common sizes, HF's
``layer_types`` (per-layer attention kinds) as specc ``layer_kinds`` + ``layer_pattern``, and RoPE per kind.
"""

from __future__ import annotations

from typing import Any

from .hf_config import HFConfig

# HF layer type → specc kind name (the name is the spec's; the attention settings are what counts)
KIND_NAMES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


def sizes(cfg: HFConfig) -> dict[str, Any]:
    """vocab, context, width, depth and attention heads under the Llama-style key names."""
    d, heads = cfg.positive_int("hidden_size"), cfg.positive_int("num_attention_heads")
    hd = cfg.optional_int("head_dim") or d // heads
    attention: dict[str, Any] = {"heads": heads, "kv_heads": cfg.positive_int("num_key_value_heads", heads)}
    if hd * heads != d or d % heads:
        attention["head_dim"] = hd
    return {
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": d,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": attention,
    }


def swiglu(cfg: HFConfig) -> dict[str, Any]:
    """The gated MLP most decoder families share: ``intermediate_size`` units, ``hidden_act`` (silu by default)."""
    return {
        "type": "swiglu",
        "hidden": cfg.positive_int("intermediate_size"),
        "activation": cfg.activation("hidden_act", "silu"),
    }


def layer_types(cfg: HFConfig, default: list[str]) -> list[str]:
    """``layer_types`` as config.json states it (transformers 5 writes it), else the family's own rule."""
    n = cfg.positive_int("num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None:
        return default
    if not isinstance(types, list) or len(types) != n or any(t not in KIND_NAMES for t in types):
        raise cfg.refuse(
            "layer_types",
            f"expected a list of {n} layer types (one per layer), each one of {', '.join(KIND_NAMES)}",
        )
    return list(types)


def period(items: list[Any]) -> list[Any]:
    """The shortest prefix that, repeated cyclically and truncated, gives ``items``."""
    for p in range(1, len(items) + 1):
        if all(items[i] == items[i % p] for i in range(len(items))):
            return items[:p]
    return items


Layer = tuple[str, dict[str, dict[str, Any]]]  # (kind name, {section: settings}) of one layer


def per_layer(doc: dict[str, Any], layers: list[Layer]) -> dict[str, Any]:
    """Write per-layer variants into ``doc``. A kind's ``attention`` / ``position`` settings are merged onto the
    top level and its ``mlp`` replaces the top level's (as the spec's ``layer_kinds`` do). A single kind is
    folded into the top level; several become ``layer_kinds`` + the shortest cyclic ``layer_pattern``."""
    kinds: dict[str, dict[str, dict[str, Any]]] = {}
    for name, settings in layers:
        if kinds.setdefault(name, settings) != settings:
            raise ValueError(f"layer kind {name!r} named for two different settings")  # a family's naming bug
    if len(kinds) == 1:
        for section, values in next(iter(kinds.values())).items():
            doc[section] = values if section == "mlp" else {**doc.get(section, {}), **values}
        return doc
    doc["layer_kinds"] = kinds
    doc["layer_pattern"] = period([name for name, _ in layers])
    return doc


def attention_kind(cfg: HFConfig, layer_type: str, window: int | None) -> tuple[str, dict[str, Any]]:
    """(kind name, attention settings) of one HF full / sliding layer; ``window`` is the sliding layers' window."""
    name = KIND_NAMES[layer_type]
    if name == "chunked":
        raise cfg.refuse("layer_types", "chunked attention layers are not supported by this family")
    if name == "full":
        return name, {}
    if window is None:
        raise cfg.refuse("layer_types", "there are sliding layers but no sliding_window is set")
    return name, {"mask": "sliding_window", "window": window}


def name(*parts: str) -> str:
    return "_".join(p for p in parts if p) or "block"
