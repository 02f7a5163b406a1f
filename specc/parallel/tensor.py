"""Tensor parallelism of a built specc model: the IR's plan (``tensor_plan.tensor_plan``) as torch parallel styles,
applied with ``parallelize_module``.

Packed projections (``attn.qkv`` = ``[q heads | k heads | v heads]``) are re-ordered *rank-major* before
they are split: ``[q_0 | k_0 | v_0 | q_1 | k_1 | v_1 | ...]`` with ``q_r`` the query heads of rank r and
``k_r``/``v_r`` its KV heads, so that a plain row split (``ColwiseParallel``) gives each rank the q, k and v
of its own heads in the layout the attention layer reads; the attention layer is then told its local head
counts. ``packed_order`` is that permutation; the module's state dict undoes it (``specc.parallel.packed``),
so ``state_dict()`` and everything saved from it hold the single-process layout.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from ..analysis.layouts.tensor_plan import Rule, check_tensor_parallel, split_axis, tensor_plan
from ..errors import SpecError
from ..ir.graph import LayerGraph
from . import qknorm
from .packed import canonical_state
from .styles import LocalParams, TiedWeight


def packed_order(rule: Rule, tp: int) -> torch.Tensor:
    """Row indices that turn the packed ``parts`` layout into the rank-major one (new = old[order])."""
    starts, start = [], 0
    for heads in rule.parts:
        starts.append(start)
        start += heads * rule.head_dim
    rows = []
    for r in range(tp):
        for s, heads in zip(starts, rule.parts, strict=True):
            per = heads // tp * rule.head_dim
            rows.append(torch.arange(s + r * per, s + (r + 1) * per))
    return torch.cat(rows)


def packed_params(graph: LayerGraph, tp: int) -> dict[str, torch.Tensor]:
    """Parameter name → rank-major row order, for every packed projection of the plan."""
    out = {}
    if tp == 1:
        return out
    for name, rule in tensor_plan(graph).items():
        op = graph.op(name)
        if op.kind == "linear" and rule.style == "heads" and len(rule.parts) > 1:
            order = packed_order(rule, tp)
            out.update({f"{name}.{local}": order for local in op.params})
    return out


def _style(rule: Rule) -> ParallelStyle | None:
    if rule.style in ("heads", "colwise"):
        return ColwiseParallel()
    if rule.style == "rowwise":
        return RowwiseParallel()
    if rule.style == "vocab_embed":
        return RowwiseParallel(input_layouts=Replicate())
    if rule.style == "vocab_head":
        return ColwiseParallel(output_layouts=Replicate())
    if rule.style in ("tied_head", "tied_embed"):
        return TiedWeight(Shard(0))
    return None


def apply_tensor_parallel(
    model: nn.Module, graph: LayerGraph, mesh: DeviceMesh, sequence: bool = False, experts: bool = True
) -> None:
    """Split ``model`` (built from ``graph``) over the 1-D ``mesh`` by the IR's plan, in place; ``sequence``:
    the residual stream between blocks split by positions too (``specc.parallel.sequence``); ``experts=False``:
    the MoE layers are left to expert parallelism (``specc.parallel.expert_parallel`` splits them over dp and tp)."""
    tp = mesh.size()
    check_tensor_parallel(graph, tp)
    with torch.no_grad():
        for name, order in packed_params(graph, tp).items():
            if not _held(model, name.rpartition(".")[0]):
                continue
            param = model.get_parameter(name)
            param.copy_(param[order.to(param.device)])
    plan: dict[str, ParallelStyle] = {}
    for name, rule in tensor_plan(graph).items():
        op = graph.op(name)
        if op.kind == "moe" and not experts:
            continue
        if not _held(model, name):  # another pipeline stage holds it (specc.parallel.pipeline)
            continue
        module = model.get_submodule(name)
        if op.kind == "latent_attention":  # its heads' rows of kv_b; the latent whole, its gradient summed
            module.heads = module.kv_heads = rule.parts[0] // tp
            plan[name] = LocalParams({"kv_b.weight": Shard(0)}, summed=(1,))
            continue
        if op.kind == "attention":
            module.heads, module.kv_heads = rule.parts[0] // tp, rule.parts[1] // tp
            if hasattr(module, "head_start"):  # per-head constants (ALiBi's slopes): this rank's heads
                module.head_start = mesh.get_local_rank() * module.heads
            if op.params:  # attention sinks: one per head, split as the heads are
                plan[name] = LocalParams({local: Shard(0) for local in op.params})
            continue
        if rule.style in ("head_norm", "full_norm"):  # its q (or k) heads, in the rank-major [q_r | k_r | v_r]
            module.start, module.width = op.attrs.start // tp, op.attrs.width // tp
        if rule.style == "full_norm":
            qknorm.split(module, mesh)
        style = _style(rule)
        if style is None:
            placements = {}
            for local in op.params:
                axis = split_axis(rule, local)
                placements[local] = Replicate() if axis is None else Shard(axis)
            if rule.style == "experts" and op.attrs.bias:
                raise SpecError(f"{name}: tensor parallelism of experts with biases is not supported", hint="tp=1")
            style = LocalParams(placements, partial=rule.style == "experts", own=rule.style == "head_norm")
        plan[name] = style
    moe = {op.name for op in graph.ops() if op.kind == "moe"} if not experts else set()
    for pname, _ in model.named_parameters():  # every parameter is an IR op's: none stays a plain tensor
        scope = pname.rpartition(".")[0]
        held = scope in plan or scope in moe or scope.rpartition(".")[0] in plan  # latent attention's kv_b
        if not held:
            raise AssertionError(f"{pname}: no tensor-parallel rule")
    if sequence:
        from .sequence import guard, sequence_plan

        sequence_plan(graph, tensor_plan(graph), plan)
        guard(model, mesh)
    parallelize_module(model, mesh, plan)
    model.tie_weights()  # a tied head's (embedding's) weight: the owner's DTensor (TiedWeight left it alone)
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for name, order in packed_params(graph, tp).items():
        scope, _, local = name.rpartition(".")
        by_module.setdefault(scope, {})[local] = order
    for scope, orders in by_module.items():  # state dicts in the [q | k | v] layout (specc.parallel.packed)
        if _held(model, scope):
            canonical_state(model.get_submodule(scope), orders)


def _held(model: nn.Module, path: str) -> bool:
    """Whether ``model`` runs the module at ``path`` itself (a pipeline stage holds only its own)."""
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False
    return not getattr(module, "stands_in", False)
