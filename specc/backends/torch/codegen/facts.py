"""What the layer library's branches test, decided for one model from its layer graph (typed op attributes).

``model_facts(graph)`` maps expressions of the library source (``self.mask``, ``'prefix' in self.META``) to the
values they can take in this model; ``specialise`` cuts the branches they decide when model.py is written.
A fact is only stated where the graph fixes it: an expression missing here keeps all its branches.
"""

from __future__ import annotations

from typing import Any

from ....ir.graph import LayerGraph
from ..layers.rope import attention_factor
from .specialise import SOMETHING, Facts

STEP_INPUTS = {"causal_lm": "input_ids", "seq2seq": "decoder_input_ids"}
RUNTIME_FACTS = ("dtype", "seed", "init_std", "residual_std", "max_positions", "positions_follow", "prefix")
RUNTIME_FACTS += ("rebuild_cache_after", "decoder_start_token_id")


def runtime_meta(graph: LayerGraph) -> dict[str, Any]:
    """The graph facts the generated code reads at run time (the root class's META)."""
    meta = dict(graph.meta)
    prefixes = [op.attrs.prefix for op in graph.ops() if op.kind == "attention" and op.attrs.mask == "prefix"]
    if prefixes:
        meta["prefix"] = max(prefixes)  # cached decoding starts once the sequence covers the prefix
    return {k: meta[k] for k in RUNTIME_FACTS if meta.get(k) is not None}


SPANS = ("window", "prefix", "chunk")  # the sizes of the mask kinds


def _values(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _rope_scaling_facts(ops: list) -> Facts:
    """What ScaledRotary and the frequency functions test of a scaling (only ScaledRotary calls them, always
    with one): its type, whether it depends on the length, the cos/sin scale, yarn's options."""
    scalings = [op.attrs.rope_scaling for op in ops if getattr(op.attrs, "rope_scaling", None)]
    if not scalings:
        return {}
    types = {s["type"] for s in scalings}
    yarn = [s for s in scalings if s["type"] == "yarn"]
    return {
        'scaling["type"] if scaling else None': sorted(types),
        "by_length(self.scaling)": sorted({t in ("dynamic", "longrope") for t in types}),
        "self.scale != 1.0": sorted({attention_factor(s) != 1.0 for s in scalings}),
        'scaling.get("attention_factor") is not None': sorted(  # the cos/sin scale stated, or from the factor
            {s.get("attention_factor") is not None for s in scalings}
        ),
        'scaling.get("mscale") and scaling.get("mscale_all_dim")': sorted(
            {bool(s.get("mscale") and s.get("mscale_all_dim")) for s in scalings}
        ),
        's["truncate"]': sorted({bool(s.get("truncate")) for s in yarn}),
    }


def model_facts(graph: LayerGraph) -> Facts:
    ops = list(graph.ops())
    kinds = {op.kind for op in ops}
    attention = [op.attrs for op in ops if op.kind == "attention"]
    own = [a for a in attention if not a.cross]
    rotary = [a for a in own if a.rope_dims]
    masks = {a.mask for a in own} | ({"none"} if len(own) < len(attention) else set())  # cross: the core's "none"
    alibi = [a for a in own if a.alibi_max_bias is not None]
    meta = runtime_meta(graph)
    facts: Facts = {
        "self.bf16": sorted({a.alibi_bf16 for a in alibi}),  # AlibiAttention's rounding and scaling
        "self.scaled": sorted({a.alibi_scaled for a in alibi}),
        "self.mask": sorted(masks),
        "self.rope": [*([None] if len(rotary) < len(own) else []), *([SOMETHING] if rotary else [])],
        **{f"self.{k}": _values([getattr(a, k) for a in own] + [None] * (len(own) < len(attention))) for k in SPANS},
        "self.interleaved": sorted({a.rope_interleaved for a in rotary}),
        "self.kv_heads != self.heads": sorted({a.kv_heads != a.heads for a in attention}),  # GQA in SDPA
        "self.STEP_INPUT": [STEP_INPUTS.get(graph.meta["task"])],
        '"attention_mask" not in self.INPUTS': ["attention_mask" not in graph.inputs],
        "self.TIED": [{op.name: op.attrs.tied_to for op in ops if getattr(op.attrs, "tied_to", None)}],
        "self.positions_from": [None] if "positions_follow" not in meta else [None, SOMETHING],
    }
    facts.update(_rope_scaling_facts(ops))
    for key in ("max_positions", "prefix", "rebuild_cache_after"):  # the META facts generation tests for
        facts[f"{key!r} in self.META"] = [key in meta]
        facts[f"{key!r} not in self.META"] = [key not in meta]
    recurrent = kinds & {"rnn", "rnn_decoder"}
    if "rnn" not in kinds:
        facts["isinstance(module, nn.RNNBase)"] = [False]
    if "rnn_decoder" not in kinds:
        facts['hasattr(module, "cell")'] = [False]
    if not recurrent:
        facts['rule == "rnn"'] = [False]
    if "contrastive" not in kinds:  # the only layer with parameters starting at a constant (its logit scale)
        facts['local in getattr(module, "constants", ())'] = [False]
        facts['rule == "constant"'] = [False]
    if "moe" not in kinds:  # the only layer whose biases have other names (init_rule's ``zeros``)
        facts['local in getattr(module, "zeros", ())'] = [False]
    if not any(getattr(op.attrs, "unit_offset", False) for op in ops):  # (1 + w) norms: Gemma's weight starts at 0
        facts['getattr(module, "unit_offset", False)'] = [False]
    if "sinusoid_table" not in kinds:  # Whisper's computed position table
        facts['hasattr(module, "sinusoids")'] = [False]
        facts['rule == "sinusoids"'] = [False]
    return {k: v for k, v in facts.items() if v}
