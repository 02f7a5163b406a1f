"""Communication volume per device per step, by collective and by process group.

Bytes are what each device sends with ring algorithms (NCCL's "bus bytes"): an all-reduce of S bytes over n
ranks sends 2(n−1)/n·S, an all-gather or reduce-scatter of a tensor that is S bytes whole sends (n−1)/n·S, an
all-to-all (n−1)/n of the bytes it holds, a point-to-point send its tensor.

- tp (Shoeybi et al. 2019; Korthikanti et al. 2022 §4.2.2): each row-parallel output (and the
  vocabulary-parallel embedding) is all-reduced in the forward pass, each column-parallel input (and MLA's
  latent, read whole by every rank's heads) in the backward pass; with sequence parallelism each all-reduce
  becomes a reduce-scatter plus an all-gather (the same bytes). Full recompute runs the forward collectives
  again. The loss's own reductions (two floats per token) and ``qk_norm: full``'s sums of squares (one float per
  token and norm) are left out.
- cp (ring attention, as Megatron-LM's context parallelism): K and V are all-gathered in the forward pass,
  again in the backward pass, and their gradients reduce-scattered.
- ep: dispatch and combine all-to-alls of the routed tokens (tokens × active × width), in both passes.
- pp: each micro-batch's boundary activation is sent forward and its gradient back, split across the tp
  ranks (Narayanan et al. 2021's scatter/gather optimisation); a middle stage sends both.
- dp (ZeRO paper §7): stage 0 all-reduces the gradients; stages 1–2 reduce-scatter the gradients and
  all-gather the updated weights (the same 2Ψ volume); stage 3 all-gathers the weights in the forward and
  again in the backward pass of every micro-batch. Expert tensors sync over dp × cp / ep ranks.
"""

from __future__ import annotations

from .layout import Layout, Training
from .profile import GraphProfile

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
GROUPS = ("tp", "cp", "ep", "pp", "dp")


def _ring(n: int) -> float:
    return (n - 1) / n


def stage_comm(
    prof: GraphProfile,
    weights: tuple[int, int],
    stage: int,
    lay: Layout,
    t: Training,
    micro_batches: int,
    training: bool,
) -> dict[str, dict[str, float]]:
    """group → collective → bytes one device of ``stage`` sends per step."""
    groups: dict[str, dict[str, float]] = {g: {} for g in GROUPS}
    st = prof.stages(lay.pp)[stage]
    m, b, tp, cp = micro_batches, t.micro_batch, lay.tp, lay.cp
    tokens = b / cp  # this device's share of a micro-batch, as a factor on batch-1 bytes
    if tp > 1:
        g_bytes, f_bytes = st.tp_fwd * tokens, st.tp_bwd * tokens
        full = t.recompute == "full"
        g_redo, f_redo = (st.tp_fwd_blocks * tokens, st.tp_bwd_blocks * tokens) if full else (0.0, 0.0)
        r = _ring(tp)
        if t.sequence_parallel:  # f: all-gather forward / reduce-scatter backward; g: the reverse
            rs = g_bytes + (f_bytes if training else 0) + g_redo
            ag = f_bytes + (g_bytes if training else 0) + f_redo
            groups["tp"] = {"reduce_scatter": m * r * rs, "all_gather": m * r * ag}
        else:
            ar = g_bytes + (f_bytes if training else 0) + g_redo
            groups["tp"] = {"all_reduce": m * 2 * r * ar}
    if cp > 1:
        kv, r = st.kv_bytes * b / tp, _ring(cp)
        groups["cp"] = {"all_gather": m * r * kv * (2 if training else 1), "reduce_scatter": m * r * kv * training}
    if lay.ep > 1:
        routed = st.routed * tokens / (tp if t.sequence_parallel else 1)
        groups["ep"] = {"all_to_all": m * _ring(lay.ep) * routed * (4 if training else 2)}
    if lay.pp > 1:
        sends = (stage < lay.pp - 1) + (training and stage > 0)
        groups["pp"] = {"p2p": m * st.boundary * tokens / tp * sends}
    n = lay.dp * cp
    if training and n > 1:
        dense, expert = weights
        groups["dp"] = _dp(dense, expert, prof.elem_bytes, t.zero, n, n // lay.ep, m)
    return {g: v for g, v in groups.items() if v}


def _dp(dense: int, expert: int, elem_bytes: int, zero: int, n_dense: int, n_expert: int, m: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for elems, n in ((dense, n_dense), (expert, n_expert)):
        if n <= 1 or not elems:
            continue
        size, r = elems * elem_bytes, _ring(n)
        if zero == 0:
            parts = {"all_reduce": 2 * r * size}
        elif zero in (1, 2):
            parts = {"reduce_scatter": r * size, "all_gather": r * size}
        else:
            parts = {"reduce_scatter": r * size, "all_gather": 2 * m * r * size}
        for k, v in parts.items():
            out[k] = out.get(k, 0.0) + v
    return out


def by_collective(groups: dict[str, dict[str, float]]) -> dict[str, int]:
    return {c: round(sum(g.get(c, 0.0) for g in groups.values())) for c in COLLECTIVES}
