"""Sequence parallelism (Korthikanti et al. 2022) on top of the tensor-parallel plan: between blocks the
residual stream is split by sequence positions, norms run on their positions (``SequenceParallel``), the
projections that split by heads or hidden units all-gather the positions first, and those that sum partial
results reduce-scatter them back. Decoder LMs, whole sequences only: the embedding and the position table
see the whole sequence, the first block takes this rank's positions, the head gathers them again.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

from ..analysis.layouts.tensor_plan import Rule
from ..errors import SpecError
from ..ir.graph import LayerGraph
from .fsdp import block_scopes
from .styles import ShardSequence, TiedWeight

NORMS = ("layernorm", "rmsnorm")


def sequence_plan(graph: LayerGraph, rules: dict[str, Rule], plan: dict[str, ParallelStyle]) -> None:
    """Replace the styles of ``plan`` inside the sequence-split region (from the first block to the head)."""
    name = graph.meta.get("name", "the model")
    if graph.meta.get("family") != "decoder":
        raise SpecError(f"{name}: sequence parallelism covers decoder LMs", hint="sequence_parallel=False")
    blocks = block_scopes(graph)
    ops = list(graph.ops())
    start = next(i for i, op in enumerate(ops) if op.name.startswith(f"{blocks[0]}."))
    for op in ops[start:]:
        rule = rules.get(op.name)
        if rule is None or op.kind == "attention" or rule.style in ("head_norm", "full_norm"):  # gathered positions
            continue
        if rule.style in ("heads", "colwise"):
            plan[op.name] = ColwiseParallel(input_layouts=Shard(1))
        elif rule.style == "rowwise":
            plan[op.name] = RowwiseParallel(output_layouts=Shard(1))
        elif rule.style == "vocab_head":
            plan[op.name] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
        elif rule.style == "tied_head":
            plan[op.name] = TiedWeight(Shard(0), inputs=Shard(1))
        elif op.kind in NORMS:
            plan[op.name] = SequenceParallel(use_local_output=True)
        else:
            raise SpecError(
                f"{name}: {op.name} ({op.kind}) has no sequence-parallel rule", hint="sequence_parallel=False"
            )
    plan[blocks[0]] = ShardSequence()


def guard(model: nn.Module, mesh: DeviceMesh) -> None:
    """Refuse calls a sequence split cannot serve: decoding with a cache, lengths tp does not divide."""
    tp = mesh.size()

    def check(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = args[0] if args else next(iter(kwargs.values()))
        if kwargs.get("state") is not None or (len(args) > 2 and args[2] is not None):
            raise SpecError("a sequence-parallel model runs whole sequences: no cached decoding (generate)")
        if ids.shape[1] % tp:
            raise SpecError(f"a sequence-parallel model needs sequences of a multiple of tp={tp} tokens")

    model.register_forward_pre_hook(check, with_kwargs=True)
