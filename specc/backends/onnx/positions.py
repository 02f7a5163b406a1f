"""Absolute positions of each stack's new tokens, shared by learned and sinusoidal positions, RoPE and the
prefix mask (one small subgraph per stack).

Which positions (as HF counts them, so that a left-padded batch equals each row run alone):
- The logits stack of a graph whose lowering set ``meta["positions_follow"]`` (decoder-only models):
  positions follow ``attention_mask`` as HF's ``generate`` does: ``cumsum(attention_mask, -1) - 1`` with padded
  slots set to 1, computed over the whole mask (past + new tokens with a KV cache) and sliced to the new
  tokens. The graph also takes an optional ``position_ids`` input (int64 ``[batch, sequence]``, as optimum's
  decoder exports do) that overrides them; negative entries (the default, ``[[-1]]``) mean "derive". Without
  ``attention_mask`` (exported with ``padding_mask=False``, or no position_ids fed to such a model): past length
  + arange(N).
- An encoder whose lowering set ``positions_follow`` (``position.skip_padding``: RoBERTa) likewise.
- Every other stack (encoders, the decoder of encoder-decoder models): past length + arange(N). HF's BERT,
  BART and Marian count positions by index, and ``decoder_input_ids`` are never left-padded.

``position_ids`` is an overridable initializer (an input with a default value): onnxruntime lists it under
``get_overridable_initializers()``, not ``get_inputs()``, and callers that never feed it keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from ...ir.graph import LayerGraph
from ...ir.ops import ATTENTION_KINDS
from .builder import GraphBuilder
from .kv_cache import offset

INPUT = "position_ids"
USES_POSITIONS = ("learned_pos", "sinusoidal_pos")
INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class PositionPlan:
    """The stack whose positions follow its padding mask, the mask's graph input, and whether the graph takes
    ``position_ids`` (only when something in that stack reads positions)."""

    stack: str | None
    mask: str
    takes_input: bool


def plan(g: LayerGraph) -> PositionPlan | None:
    """The logits stack, when lowering says its positions follow a padding-mask graph input."""
    # the logits stack (an encoder without a head: its hidden states' stack)
    head = g.outputs.get("logits") or g.outputs.get("last_hidden_state")
    mask = g.meta.get("positions_follow")
    if head is None or mask is None or mask not in g.inputs:
        return None
    stack = g.op(head).stack
    ops = [op for op in g.ops() if op.stack == stack]
    uses = any(op.kind in USES_POSITIONS or (op.kind in ATTENTION_KINDS and op.attrs.rope_dims) for op in ops)
    return PositionPlan(stack, mask, uses)


def add_input(b: GraphBuilder) -> None:
    """``position_ids`` [batch, sequence] int64, defaulting to ``[[-1]]`` (derive every position)."""
    p = b.positions
    if p is None or not p.takes_input:
        return
    b.add_input(INPUT, TensorProto.INT64, ["batch", "sequence"])
    b.initializers[INPUT] = np.array([[-1]], np.int64)
    b.values[INPUT] = INPUT


def span(b: GraphBuilder, x: str, stack: str | None) -> tuple[str, str]:
    """Index range of a stack's new tokens in its sequence: (start, end) scalars, start = past length. ``x``
    is any [B, N, ·] tensor of the stack."""
    key = ("span", stack)
    if key not in b.memo:
        start = offset(b, stack)
        end = b.op("Add", [start, b.scalar_dim(x, 1)], scope="positions")
        b.memo[key] = (start, end)
    return b.memo[key]


def follows_mask(b: GraphBuilder, stack: str | None) -> str:
    """The ONNX name of the mask this stack's positions follow ("" when they are indices)."""
    p = b.positions
    if p is None or p.stack != stack:
        return ""
    return b.values.get(p.mask, "")


def mask_positions(b: GraphBuilder, mask: str) -> str:
    """int64 [B, N_k]: cumsum(mask) - 1 over every key (past + new), padded slots 1 (HF's generate)."""
    key = ("mask_positions", mask)
    if key not in b.memo:
        count = b.op("CumSum", [mask, b.scalar_i64(1)], scope="positions")
        pos = b.op("Sub", [count, b.scalar_i64(1)], scope="positions")
        keep = b.op("Cast", [mask], scope="positions", to=TensorProto.BOOL)
        b.memo[key] = b.op("Where", [keep, pos, b.scalar_i64(1)], scope="positions")
    return b.memo[key]


def new_tokens_mask(b: GraphBuilder, x: str, stack: str | None) -> str:
    """bool [B, N]: which of the N new tokens of ``x`` are real, when the stack's positions follow a mask ("")."""
    mask = follows_mask(b, stack)
    if not mask:
        return ""
    key = ("new_tokens_mask", stack)
    if key not in b.memo:
        new = b.op("Neg", [b.dim(x, 1)], scope="positions")
        part = b.op("Slice", [mask, new, b.i64(INT64_MAX), b.i64(1)], scope="positions")
        b.memo[key] = b.op("Cast", [part], scope="positions", to=TensorProto.BOOL)
    return b.memo[key]


def position_ids(b: GraphBuilder, x: str, stack: str | None) -> str:
    """int64 [B or 1, N]: the positions of the N new tokens of ``x`` ([B, N, ·]) in ``stack``."""
    key = ("position_ids", stack)
    if key in b.memo:
        return b.memo[key]
    mask = follows_mask(b, stack)
    if mask:
        new = b.op("Neg", [b.dim(x, 1)], scope="positions")
        pos = b.op("Slice", [mask_positions(b, mask), new, b.i64(INT64_MAX), b.i64(1)], scope="positions")
    else:
        start, end = span(b, x, stack)
        pos = b.op("Range", [start, end, b.scalar_i64(1)], scope="positions")
        pos = b.op("Unsqueeze", [pos, b.i64(0)], scope="positions")  # [1, N]
    p = b.positions
    if p is not None and p.stack == stack and p.takes_input:
        given = b.values[INPUT]
        derive = b.op("Less", [given, b.scalar_i64(0)], scope="positions")
        pos = b.op("Where", [derive, pos, given], scope="positions")
    b.memo[key] = pos
    return pos
