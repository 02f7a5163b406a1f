"""Parallel layouts in the analyzer: per-device weights from the IR's tensors, ZeRO, Korthikanti activations."""

from __future__ import annotations

import specc
from specc.analysis.parallel import param_shards, per_device_weight_bytes


def _graph(name: str, *sets: str) -> specc.LayerGraph:
    return specc.lower(specc.load_spec(name, list(sets) or None))


def test_tp2_halves_weights_up_to_replicated_norms() -> None:
    g = _graph("llama2-7b")
    norms = sum(p.shape[0] for n, p in g.params().items() if "norm" in n)  # 65 RMSNorm weights of 4096
    assert norms == 65 * 4096
    one = per_device_weight_bytes(g, tp=1)
    assert one == g.num_params() * 2  # bf16, the spec's dtype
    assert per_device_weight_bytes(g, tp=2) == (one - norms * 2) // 2 + norms * 2
    assert per_device_weight_bytes(g, tp=2, dtype="fp32") == 2 * per_device_weight_bytes(g, tp=2)


def test_uneven_vocabulary_splits_as_torch_chunk() -> None:
    """GPT-2: 50,257 rows → 25,129 on rank 0 and 25,128 on rank 1; replicated: norms, positions, row biases."""
    g = _graph("gpt2")
    replicated = 12 * 2 * 2 * 768 + 2 * 768 + 1024 * 768 + 12 * 2 * 768
    split = g.num_params() - replicated - 50257 * 768
    rank0 = per_device_weight_bytes(g, tp=2, dtype="fp32", tp_rank=0) // 4
    rank1 = per_device_weight_bytes(g, tp=2, dtype="fp32", tp_rank=1) // 4
    assert rank0 == replicated + split // 2 + 25129 * 768
    assert rank1 == replicated + split // 2 + 25128 * 768
    assert per_device_weight_bytes(g, tp=2, dtype="fp32") == rank0 * 4


def test_shard_dims_follow_the_graph() -> None:
    g = _graph("mixtral-8x7b", "blocks=1")
    dims = {p.name: (p.tp_dim, p.ep_dim) for p in param_shards(g)}
    assert dims["blocks.0.attn.qkv.weight"] == (0, None)  # column: heads
    assert dims["blocks.0.attn.out.weight"] == (1, None)  # row
    assert dims["blocks.0.mlp.router.weight"] == (None, None)  # replicated
    assert dims["blocks.0.mlp.experts.w_gate"] == (1, 0)  # experts over ep, hidden units over tp
    assert dims["blocks.0.mlp.experts.w_down"] == (2, 0)
    assert dims["embed.weight"] == (0, None) and dims["lm_head.weight"] == (0, None)  # vocabulary-parallel
    assert dims["blocks.0.norm1.weight"] == (None, None)


def test_pipeline_stage_keeps_a_tied_copy() -> None:
    """pp=2 with a tied head: the last stage holds its own copy of the embedding table (Megatron-LM)."""
    g = _graph("gpt2")
    table = 50257 * 768
    first = per_device_weight_bytes(g, pp=2, stage=0, dtype="fp32") // 4
    last = per_device_weight_bytes(g, pp=2, stage=1, dtype="fp32") // 4
    assert first + last == g.num_params() + table
    assert last - table == 6 * (g.num_params() - table - 1024 * 768 - 2 * 768) // 12 + 2 * 768
