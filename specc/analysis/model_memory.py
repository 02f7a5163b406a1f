"""Model-level memory items (bytes) from the per-op memory rules."""

from __future__ import annotations

from ..ir.graph import LayerGraph, dims
from ..ir.ops import ATTENTION_KINDS
from .costs import numel
from .op_costs import OpCost, kept_by_several_blocks

ADAM_STATES = {2: 12, 4: 8}  # bytes/param: fp32 master + m + v in mixed precision; m + v in fp32


def korthikanti(g: LayerGraph, costs: list[OpCost], env: dict[str, int]) -> int:
    """Σ over self-attention layers of s·b·h·(34 + 5·a·s/h) bytes (Korthikanti et al. 2022, eq. 2, 16-bit)."""
    total = 0
    for c in costs:
        op = c.op
        if op.kind not in ATTENTION_KINDS or op.attrs.cross or op.layer is None:
            continue
        b, s = dims(g.shape_of(op.inputs[0]), env)[:2]
        h = _model_width(g, op.name)
        total += 34 * s * b * h + 5 * op.attrs.heads * s * s * b
    return total


def _model_width(g: LayerGraph, attention: str) -> int:
    """Residual width h: the output width of the projection that consumes the attention core."""
    for succ in g.graph.successors(attention):
        return int(g.op(succ).attrs.out_features)
    raise ValueError(f"{attention} has no output projection")


def memory_items(
    g: LayerGraph,
    costs: list[OpCost],
    env: dict[str, int],
    params: int,
    elem_bytes: int,
    decode: set[str] | None,
    training: bool,
    recompute: str,
) -> dict[str, int]:
    attention = [c.mem for c in costs if c.op.kind in ATTENTION_KINDS]
    saved = sum(c.mem.saved for c in costs)
    items = {
        "weights": params * elem_bytes,
        "activations": saved,
        "activations_fused": sum(c.mem.fused for c in costs),
    }
    if attention:
        items["activations_korthikanti"] = korthikanti(g, costs, env)
        items["attention_scores_materialized"] = max(m.scores for m in attention)
        items["attention_scores_materialized_all_layers"] = sum(m.scores for m in attention)
        items["attention_scores_fused"] = max(m.scores_fused for m in attention)
    items["kv_cache"] = sum(c.mem.kv_cache for c in costs if decode is not None and c.op.name in decode)
    items["inference_total"] = items["weights"] + items["kv_cache"]
    if training:
        items["gradients"] = params * elem_bytes
        items["optimizer_states"] = params * ADAM_STATES[elem_bytes]
        items["activations_training"] = _training_activations(g, costs, env, elem_bytes, recompute, items)
        items["training_total"] = (
            items["weights"] + items["gradients"] + items["optimizer_states"] + items["activations_training"]
        )
    return items


def _training_activations(
    g: LayerGraph, costs: list[OpCost], env: dict[str, int], elem_bytes: int, recompute: str, items: dict[str, int]
) -> int:
    """Activations kept under the chosen recomputation: none (all), selective (attention core recomputed),
    full (only each block's inputs, plus what lives outside the blocks: the residual stream into each block,
    and once a tensor several blocks read, as the encoder output every decoder layer's cross-attention takes)."""
    if recompute == "none":
        return items["activations"]
    if recompute == "selective":
        return items["activations_fused"]
    outside = sum(c.mem.saved for c in costs if c.op.layer is None)
    inputs = 0
    for c in costs:
        if c.op.layer is not None and c.op.kind in ATTENTION_KINDS and not c.op.attrs.cross:
            b, s = dims(g.shape_of(c.op.inputs[0]), env)[:2]
            inputs += b * s * _model_width(g, c.op.name) * elem_bytes
    return outside + inputs + _shared_block_inputs(g, env, elem_bytes)


def _shared_block_inputs(g: LayerGraph, env: dict[str, int], elem_bytes: int) -> int:
    """Bytes of the tensors ops of more than one block keep as their input: each a checkpoint input, kept once."""
    return sum(numel(dims(g.shape_of(t), env)) * elem_bytes for t in kept_by_several_blocks(g))
