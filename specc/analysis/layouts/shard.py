"""How tensor and expert parallelism split each parameter tensor of the IR, and the bytes one device holds.

Which axis tensor parallelism splits is ``tensor_plan``'s rule for the op (its docstring lists them: Megatron-LM's,
as ``torch.distributed.tensor.parallel`` expresses them), the plan ``specc.parallel`` runs, so what is sized here is
what runs. ``moe`` experts ``[E, out, in]`` also split the experts (dim 0) over ``ep``.

A dimension that ``tp`` does not divide (a 50,257-row vocabulary) is split as ``torch.chunk`` and DTensor
``Shard`` split it: ceil(n / tp) rows on the first ranks, the rest on the last; the largest shard is rank 0's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.graph import LayerGraph
from ...spec.schema import DTYPE_BYTES
from .stages import anchors, block_count, stage_of
from .tensor_plan import chunk, split_axis, tensor_plan


@dataclass(frozen=True)
class ParamShard:
    """One parameter tensor and the dims tensor / expert parallelism split (None: not split)."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    ep_dim: int | None
    block: int  # global block it is placed with (pipeline stage = block // (blocks / pp))

    @property
    def expert(self) -> bool:
        return self.ep_dim is not None

    def local_numel(self, tp: int = 1, ep: int = 1, tp_rank: int = 0, ep_rank: int = 0) -> int:
        n = 1
        for i, d in enumerate(self.shape):
            if i == self.tp_dim:
                d = chunk(d, tp, tp_rank)
            if i == self.ep_dim:
                d = chunk(d, ep, ep_rank)
            n *= d
        return n


# the profile's view of a plan rule: a column-parallel output, a row-parallel input, a vocabulary split, or whole
ROLES = {"heads": "column", "colwise": "column", "full_norm": "column", "latent_heads": "column"}
ROLES |= {"rowwise": "row", "vocab_embed": "vocab", "vocab_head": "vocab", "tied_head": "vocab", "tied_embed": "vocab"}


def tp_roles(g: LayerGraph) -> dict[str, str]:
    """Op name → column | row | vocab | replicated, from the tensor-parallel plan the runtime applies."""
    plan = tensor_plan(g)
    return {op.name: ROLES.get(plan[op.name].style if op.name in plan else "", "replicated") for op in g.ops()}


def param_shards(g: LayerGraph) -> list[ParamShard]:
    """Every parameter tensor the graph stores, with its split dims (the plan's ``split_axis``; experts over
    ``ep`` by their first dim); a tied tensor also appears on the block of each op that uses it, when that op
    sits on another pipeline stage (see ``weights_per_stage``)."""
    where, plan = anchors(g), tensor_plan(g)
    out = []
    for op in g.ops():
        rule = plan.get(op.name)
        for local, p in op.params.items():
            tp_dim = split_axis(rule, local) if rule else None
            ep_dim = 0 if op.kind == "moe" else None  # [E, ...]: the experts over ep
            out.append(ParamShard(f"{op.name}.{local}", p.shape, tp_dim, ep_dim, where[op.name]))
    return out


def _tied(g: LayerGraph) -> list[tuple[str, int]]:
    """(owner parameter, block of the op that uses it) for every tied use."""
    where = anchors(g)
    return [(op.tied_to, where[op.name]) for op in g.ops() if op.tied_to]


@dataclass(frozen=True)
class BlockWeights:
    """Per block, (dense, expert) elements one device holds; and each tied use as (its block, the owner's
    block, its elements, expert) — counted again on the user's stage when the two stages differ."""

    blocks: list[tuple[int, int]]
    tied: list[tuple[int, int, int, bool]]


def block_weights(
    g: LayerGraph, *, tp: int = 1, ep: int = 1, tp_rank: int = 0, shards: list[ParamShard] | None = None
) -> BlockWeights:
    shards = shards if shards is not None else param_shards(g)
    per = [[0, 0] for _ in range(max(1, block_count(g)))]
    for ps in shards:
        per[ps.block][ps.expert] += ps.local_numel(tp, ep, tp_rank)
    by_name = {ps.name: ps for ps in shards}
    tied = [
        (block, ps.block, ps.local_numel(tp, ep, tp_rank), ps.expert)
        for owner, block in _tied(g)
        if (ps := by_name.get(owner)) is not None
    ]
    return BlockWeights([(d, e) for d, e in per], tied)


def weights_per_stage(
    g: LayerGraph,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    tp_rank: int = 0,
    by_block: BlockWeights | None = None,
) -> list[tuple[int, int]]:
    """Per pipeline stage, (dense, expert) parameter elements one device holds before ZeRO shards them."""
    bw = by_block if by_block is not None else block_weights(g, tp=tp, ep=ep, tp_rank=tp_rank)
    blocks = len(bw.blocks)
    stages = [[0, 0] for _ in range(pp)]
    for b, (dense, expert) in enumerate(bw.blocks):
        st = stages[stage_of(b, blocks, pp)]
        st[0] += dense
        st[1] += expert
    for block, owner, elems, expert in bw.tied:
        s = stage_of(block, blocks, pp)
        if s != stage_of(owner, blocks, pp):  # the head's stage keeps its own copy of the table (as Megatron-LM)
            stages[s][expert] += elems
    return [(d, e) for d, e in stages]


def per_device_weight_bytes(
    g: LayerGraph,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dtype: str | None = None,
    tp_rank: int | None = None,
    stage: int | None = None,
) -> int:
    """Bytes of the IR's parameter tensors one device holds under ``tp`` / ``pp`` / ``ep`` (before ZeRO-3).

    Counts exactly the tensors of ``LayerGraph.params()`` (a tied tensor once per stage that uses it), each
    split as ``param_shards`` says, times the element size of ``dtype`` (default: the spec's ``dtype``). The
    device is tensor-parallel rank ``tp_rank`` (default: the one holding most, rank 0) of pipeline stage
    ``stage`` (default: the stage holding most). With tp=2 this is what each rank of a DTensor
    ``parallelize_module`` run holds: Σ ``p.to_local().numel() * element_size()`` over its parameters.
    """
    dtype = dtype or g.meta.get("dtype") or "fp32"
    per = weights_per_stage(g, tp=tp, pp=pp, ep=ep, tp_rank=tp_rank or 0)
    elems = [d + e for d, e in per]
    return (max(elems) if stage is None else elems[stage]) * DTYPE_BYTES[dtype]
