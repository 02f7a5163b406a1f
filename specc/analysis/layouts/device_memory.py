"""Per-device memory of one layout, by item, for each pipeline stage.

- Model states follow ZeRO (Rajbhandari et al. 2020, §5): with Ψ parameters on a device and mixed-precision
  Adam, 2Ψ bytes of 16-bit weights, 2Ψ of gradients and 12Ψ of fp32 optimizer states (master weights,
  momentum, variance); an fp32 model keeps 4Ψ + 4Ψ + 8Ψ. Stage 1 divides the optimizer states by the N_d
  ranks holding the same weights (dp × cp; dp × cp / ep for expert tensors), stage 2 also the gradients,
  stage 3 also the weights.
- Activations follow Korthikanti et al. 2022 from the graph's own accounting (see ``profile.py``): per layer
  and micro-batch of b sequences of s tokens, sharded terms / t, replicated terms / t with sequence
  parallelism; selective recompute drops the attention scores, full recompute keeps each block's input
  (2·s·b·h in 16-bit). 1F1B keeps min(pp − stage, micro-batches) micro-batches in flight on a stage, so the
  first stage holds pp of them (their eq. 5). Context parallelism divides every term by cp.
- KV cache (inference only): the global batch's G / dp sequences on each replica, KV heads / tp, tokens / cp.
  Inference keeps no activations for a backward pass (0, as the single-device report counts it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model_memory import ADAM_STATES
from .layout import Layout, Training
from .profile import GraphProfile

ITEMS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "total")
EXTRA = ("recompute_transient", "optimizer_transient", "comm_buffers", "runtime_context", "allocator_reserve")


def _div(x: int, n: int) -> int:
    return -(-x // n)


def model_states(dense: int, expert: int, elem_bytes: int, zero: int, n_dense: int, n_expert: int) -> dict[str, int]:
    """ZeRO stage ``zero``: weights, gradients and Adam states of ``dense`` + ``expert`` parameter elements."""

    def part(elems: int, per: int, shard: bool, n: int) -> int:
        return _div(elems * per, n) if shard else elems * per

    opt = ADAM_STATES[elem_bytes]
    return {
        "weights": part(dense, elem_bytes, zero >= 3, n_dense) + part(expert, elem_bytes, zero >= 3, n_expert),
        "gradients": part(dense, elem_bytes, zero >= 2, n_dense) + part(expert, elem_bytes, zero >= 2, n_expert),
        "optimizer_states": part(dense, opt, zero >= 1, n_dense) + part(expert, opt, zero >= 1, n_expert),
    }


def activations_per_microbatch(
    prof: GraphProfile, stage: int, lay: Layout, t: Training, attention: str = "math"
) -> int:
    """Bytes one micro-batch leaves on a device of ``stage`` for the backward pass. ``attention``: ``math``
    keeps the N² scores (softmax output, dropout mask and output); ``flash`` keeps Q, K, V and per-row
    statistics. ``op`` (torchtitan's op-level checkpointing, see ``profile.py``): the block inputs and the
    outputs the policy saves (addmm, odd-numbered mm, attention core)."""
    st = prof.stages(lay.pp)[stage]
    tp, cp, b = lay.tp, lay.cp, t.micro_batch
    rep_div = (tp if t.sequence_parallel else 1) * cp
    cpu = t.kernels == "torch-cpu"
    ids = _div(st.token_ids * b, cp) + _div(st.call_ids, cp)  # every tp rank looks up all ids (and keeps them)
    outside = _div(st.outside_sharded * b, tp * cp) + _div(st.outside_replicated * b, rep_div) + ids
    if t.kernels != "fused":  # what torch's eager ops keep beyond fused kernels outside the blocks (the final norm)
        outside += _div((st.torch_outside + (st.torch_cpu_outside if cpu else 0)) * b, rep_div)
    if t.recompute in ("full", "op") and not t.loss_parallel:  # logits gathered on each tp rank: all kept
        outside += _div(st.logits * b, cp) - _div(st.logits * b, tp * cp)
    if t.recompute == "full":
        return _div(st.full_kept * b, rep_div) + outside  # one block input per block
    if t.recompute == "op":
        sharded = st.op_sharded + (st.op_math if attention == "math" else st.cpu_math_op if cpu else 0)
        kept = _div((st.full_kept + st.op_replicated) * b, rep_div) + _div(sharded * b, tp * cp)
        return kept + outside
    sharded = st.selective_sharded if t.recompute == "selective" else st.saved_sharded
    replicated = st.saved_replicated
    if t.recompute == "none" and attention == "flash":
        sharded -= st.flash_saving
    if t.kernels != "fused":  # what torch's eager ops keep beyond fused kernels (a checkpointed core: its input)
        sharded += st.torch_sharded - (st.torch_attention if t.recompute == "selective" else 0)
        replicated += st.torch_replicated + (st.torch_cpu if cpu else 0)
    if cpu and t.recompute == "none":  # cores without a fused CPU kernel keep what their math path keeps
        sharded += st.cpu_math_flash if attention == "flash" else st.cpu_math_math
    gathered = _div(st.logits * b, cp) - _div(st.logits * b, tp * cp) if not t.loss_parallel else 0
    shared = _div(st.shared_bias, tp * cp) if t.kernels != "fused" and t.recompute == "none" else 0  # not × b
    shared += _div(st.rope_tables, cp) if t.recompute == "none" else 0  # built inside a checkpointed block: rebuilt
    shared += _div(st.masks, cp) if t.kernels != "fused" and t.recompute == "none" else 0
    return _div(sharded * b, tp * cp) + _div(replicated * b, rep_div) + gathered + shared + ids


def recompute_transient(prof: GraphProfile, stage: int, lay: Layout, t: Training, attention: str = "math") -> int:
    """Bytes a recomputing backward holds on top of what was kept: one block's activations as the policy
    regenerates them (its full set for ``full``, the recomputed part for ``selective`` and ``op``)."""
    if t.recompute == "none":
        return 0
    st = prof.stages(lay.pp)[stage]
    blocks = sum(c for p, c in st.ops if p.attention and p.in_block)
    if not blocks:
        return 0
    none = activations_per_microbatch(prof, stage, lay, replace(t, recompute="none"), attention)
    kept = activations_per_microbatch(prof, stage, lay, t, attention)
    return max(0, none - kept) // blocks


def in_flight(stage: int, lay: Layout, t: Training, micro_batches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, by schedule: GPipe all of them; 1F1B and
    ZB-H1 min(pp − stage, M) (Narayanan et al. 2021; Qi et al. 2023); interleaved 1F1B Megatron-LM's warm-up
    of 2(pp − stage − 1) + (V − 1)·pp chunks plus one, each 1/V of the stage."""
    pp, m = lay.pp, micro_batches
    if t.schedule == "gpipe":
        return m
    if t.schedule == "interleaved-1f1b" and t.virtual_stages > 1:
        v = t.virtual_stages
        chunks = min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
        return chunks / v
    return min(pp - stage, m)


def representatives(prof: GraphProfile, weights: list[tuple[int, int]], pp: int) -> list[int]:
    """The first of each run of stages that hold the same ops and weights: an earlier stage keeps at least as
    many micro-batches in flight, so the stage that needs most is among these."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for s, st in enumerate(prof.stages(pp)):
        key = (st.key, *weights[s])
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def stage_memory(
    prof: GraphProfile,
    weights: list[tuple[int, int]],
    lay: Layout,
    t: Training,
    micro_batches: int,
    training: bool,
    only: list[int] | None = None,
    attention: str = "math",
    runtime: Any = None,
) -> list[dict[str, int]]:
    """Memory items per pipeline stage (every device of a stage alike); ``only``: of these stages alone."""
    out = []
    n_dense = lay.dp * lay.cp
    n_expert = n_dense // lay.ep
    stages = prof.stages(lay.pp)
    for s in only if only is not None else range(lay.pp):
        dense, expert = weights[s]
        if training:
            items = model_states(dense, expert, prof.elem_bytes, t.zero, n_dense, n_expert)
            held = in_flight(s, lay, t, micro_batches)
            items["activations"] = round(held * activations_per_microbatch(prof, s, lay, t, attention))
            items["kv_cache"] = 0
        else:
            items = {"weights": (dense + expert) * prof.elem_bytes, "gradients": 0, "optimizer_states": 0}
            items["activations"] = 0
            seqs = t.global_batch // lay.dp
            whole = stages[s].kv_cache_whole  # MLA's latent: on every tp rank (its heads are split after it)
            items["kv_cache"] = _div((stages[s].kv_cache - whole) * seqs, lay.tp * lay.cp) + _div(whole * seqs, lay.cp)
        keys = ITEMS[:-1]
        if runtime is not None:  # what the runtime holds besides the model's tensors (device profile data)
            local = dense + expert
            items["recompute_transient"] = recompute_transient(prof, s, lay, t, attention) if training else 0
            items["optimizer_transient"] = 4 * local if training and t.zero < 1 else 0  # fp32 unscaled grads
            if training and t.zero >= 3:  # FSDP: two gathered blocks in flight (current + prefetched)
                items["comm_buffers"] = int(runtime.comm_buffers) + 2 * _largest_block(prof, dense, stages[s])
            else:
                items["comm_buffers"] = int(runtime.comm_buffers)
            items["runtime_context"] = int(runtime.context)
            allocated = sum(items[k] for k in (*ITEMS[:-1], "recompute_transient", "optimizer_transient",
                                               "comm_buffers"))  # fmt: skip
            items["allocator_reserve"] = int(runtime.reserve * allocated)
            keys = (*ITEMS[:-1], *EXTRA)
        items["total"] = sum(items[k] for k in keys)
        out.append({k: items[k] for k in (*keys, "total")})
    return out


def _largest_block(prof: GraphProfile, dense: int, stage: Any) -> int:
    """Bytes of one block's weights unsharded (ZeRO-3 gathers a block at a time): the stage's weights over its
    blocks, at the analysis dtype."""
    blocks = max(1, sum(c for p, c in stage.ops if p.attention))
    return dense * prof.elem_bytes // blocks
