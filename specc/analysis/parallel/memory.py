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

from ..memory import ADAM_STATES
from .layout import Layout, Training
from .profile import GraphProfile

ITEMS = ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "total")


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


def activations_per_microbatch(prof: GraphProfile, stage: int, lay: Layout, t: Training) -> int:
    """Bytes one micro-batch leaves on a device of ``stage`` for the backward pass."""
    st = prof.stages(lay.pp)[stage]
    tp, cp, b = lay.tp, lay.cp, t.micro_batch
    rep_div = (tp if t.sequence_parallel else 1) * cp
    if t.recompute == "full":
        kept = _div(st.full_kept * b, rep_div)  # one block input per block
        return kept + _div(st.outside_sharded * b, tp * cp) + _div(st.outside_replicated * b, rep_div)
    sharded = st.selective_sharded if t.recompute == "selective" else st.saved_sharded
    return _div(sharded * b, tp * cp) + _div(st.saved_replicated * b, rep_div)


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
            in_flight = min(lay.pp - s, micro_batches)
            items["activations"] = in_flight * activations_per_microbatch(prof, s, lay, t)
            items["kv_cache"] = 0
        else:
            items = {"weights": (dense + expert) * prof.elem_bytes, "gradients": 0, "optimizer_states": 0}
            items["activations"] = 0
            seqs = t.global_batch // lay.dp
            items["kv_cache"] = _div(stages[s].kv_cache * seqs, lay.tp * lay.cp)
        items["total"] = sum(items[k] for k in ITEMS[:-1])
        out.append({k: items[k] for k in ITEMS})
    return out
