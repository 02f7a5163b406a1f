"""The KV cache of one self-attention stack: which attention ops are cached, and the past length.

Layout (every attention op kind): ``past_key_values.{i}.key|value`` and ``present.{i}.key|value`` are
``[batch, kv_heads, past_sequence, head_dim]`` in the model dtype; ``i`` counts the cached stack's
self-attention layers in order. ``attention_mask`` of a cached decoder-only model covers past + new tokens.
A latent-attention layer (MLA) caches its compressed latent as ``.key`` ``[batch, 1, past_sequence, kv_rank]`` and
the shared rotated key as ``.value`` ``[batch, 1, past_sequence, rope_head_dim]`` (ops_latent.py).
The decoder graph of an encoder-decoder export (graph_encdec.py) tags its self-attention cache
``past_key_values.{i}.decoder.key|value`` → ``present.{i}.decoder.key|value`` (optimum's names) and carries the
cross-attention K/V beside it as ``.encoder.``.

The past length of a decoder-only graph is ``attention_mask``'s length minus the new tokens' (the mask covers
past + new), not the past tensors' length. So when every cached layer is GroupQueryAttention (the contrib fp32
graph), the past tensors may instead be one max-length buffer per layer that the graph writes in place: bound
(IO binding) as both ``past_key_values.{i}.*`` and ``present.{i}.*``, GroupQueryAttention appends the new
tokens' K/V at the past length without copying the cache (``specc.kv_buffer`` = ``shared`` in the metadata;
runtime/generate.py does this). Every layout works with a cache of exactly the past length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from onnx import helper

from ...errors import SpecError
from ...ir.graph import LayerGraph, Op
from ...ir.ops import ATTENTION_KINDS
from .builder import ExportOptions, GraphBuilder
from .contrib import uses_gqa

LAYOUT = "past_key_values.{i}.key|value -> present.{i}.key|value: [batch, kv_heads, past_sequence, head_dim]"
LATENT_LAYOUT = (
    "past_key_values.{i}.key|value -> present.{i}.key|value: latent [batch, 1, past_sequence, kv_rank] | "
    "rotary key [batch, 1, past_sequence, rope_head_dim]"
)


def layout(g: LayerGraph) -> str:
    """The cache layout the metadata states: per-head K/V, or MLA's latent and rotary key."""
    return LATENT_LAYOUT if any(op.kind == "latent_attention" for op in g.ops()) else LAYOUT


SHARED = "shared"  # metadata specc.kv_buffer: past and present may be one max-length buffer (see above)


@dataclass
class KVCache:
    stack: str | None
    index: dict[str, int]  # attention op name → cache layer
    ops: list[Op]
    past_len: str = ""  # scalar int64 tensor: past_sequence
    tag: str = ""  # ".decoder" in an encoder-decoder's decoder graph
    presents: list[tuple[str, str]] = field(default_factory=list)

    @staticmethod
    def plan(g: LayerGraph) -> KVCache:
        """The stack whose causal self-attention gets the cache: the one producing ``logits``."""
        head = g.outputs.get("logits")
        stack = g.op(head).stack if head else None
        ops = [op for op in g.ops() if op.kind in ATTENTION_KINDS and not op.attrs.cross and op.stack == stack]
        if not ops or any(op.attrs.mask not in ("causal", "sliding_window", "prefix", "chunked") for op in ops):
            raise SpecError(
                f"--kv-cache needs a causal decoder; {g.meta.get('name')} ({g.meta.get('family')}) has none",
                hint="drop --kv-cache for encoders and ViTs",
            )
        return KVCache(stack, {op.name: i for i, op in enumerate(ops)}, ops)

    def add_inputs(self, b: GraphBuilder) -> None:
        for i, op in enumerate(self.ops):
            key, value = _shapes(op, "past_sequence")
            b.add_input(f"past_key_values.{i}{self.tag}.key", b.ftype, key)
            b.add_input(f"past_key_values.{i}{self.tag}.value", b.ftype, value)
        self.past_len = self._past_from_mask(b) or b.scalar_dim(f"past_key_values.0{self.tag}.key", 2)

    def _past_from_mask(self, b: GraphBuilder) -> str:
        """len(attention_mask) - len(input_ids) where the mask covers past + new tokens (decoder-only), else ""."""
        p, ids = b.positions, b.values.get("input_ids", "")
        mask = b.values.get(p.mask, "") if p is not None and p.stack == self.stack else ""
        if not mask or not ids:
            return ""
        return b.op("Sub", [b.scalar_dim(mask, 1), b.scalar_dim(ids, 1)], scope="past_sequence")

    def past(self, op: Op) -> tuple[str, str]:
        i = self.index[op.name]
        return f"past_key_values.{i}{self.tag}.key", f"past_key_values.{i}{self.tag}.value"

    def present(self, op: Op) -> tuple[str, str]:
        i = self.index[op.name]
        names = f"present.{i}{self.tag}.key", f"present.{i}{self.tag}.value"
        self.presents.append(names)
        return names

    def add_outputs(self, b: GraphBuilder, total: str) -> None:
        for (k, v), op in zip(self.presents, self.ops, strict=True):
            key, value = _shapes(op, total)
            b.outputs.append(helper.make_tensor_value_info(k, b.ftype, key))
            b.outputs.append(helper.make_tensor_value_info(v, b.ftype, value))


def _shapes(op: Op, length: str) -> tuple[list[Any], list[Any]]:
    """The cached key and value shapes of one layer: per KV head, or MLA's latent and rotary key."""
    a = op.attrs
    if op.kind == "latent_attention":
        return ["batch", 1, length, a.kv_rank], ["batch", 1, length, a.rope_head_dim]
    shape = ["batch", a.kv_heads, length, a.head_dim]
    return shape, shape


def buffer_metadata(g: LayerGraph, opts: ExportOptions) -> dict[str, str]:
    """``specc.kv_buffer``: ``shared`` when the KV-cache graph lets past and present be one buffer."""
    if not opts.kv_cache or opts.attention != "contrib" or not opts.padding_mask:
        return {}
    if g.meta.get("positions_follow") != "attention_mask" or "input_ids" not in g.inputs:
        return {}
    ops = KVCache.plan(g).ops
    return {"specc.kv_buffer": SHARED} if all(uses_gqa(op, opts.dtype) for op in ops) else {}


def offset(b: GraphBuilder, stack: str | None) -> str:
    """Absolute position of the first new token: the past length for the cached stack, else 0."""
    if b.cache is not None and b.cache.stack == stack:
        return b.cache.past_len
    return b.scalar_i64(0)
