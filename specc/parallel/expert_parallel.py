"""Expert parallelism: the experts of every MoE layer sharded over the data-parallel ranks (ep = dp), tokens
dispatched to the rank that holds their expert and combined back by all-to-all (``all_to_all_single`` with
split sizes).

- Layout: rank r of the ``dp`` mesh holds experts ``[r·E/ep, (r+1)·E/ep)`` of each expert tensor (``w_*``,
  ``b_*``: a DTensor ``Shard(0)`` on the dp mesh, so state dicts, checkpoints and ``full_tensor()`` give the
  single-process ``[E, ...]`` tensors). Routers (their linears, a ``score_bias``) and everything else stay
  data-parallel (FSDP2); FSDP2 leaves the expert tensors alone (``ignored_params``). ``ep`` dividing dp:
  the dp ranks form groups of ep consecutive ranks, each group holds all the experts and dispatches among
  itself, and the dp/ep ranks holding the same experts shard them further with FSDP2 (ZeRO-3 over the
  replicas, as the analyzer prices it); their gradients then live on another mesh than the rest, so clipping
  goes through ``clip_grad_norm`` here (``specc train`` does). With tp, each expert is also split by
  hidden units over tp (``Shard(0)`` on dp, the tp plan's split on tp, a DTensor on the ("dp", "tp") mesh):
  every tp rank dispatches its copy of the tokens within its dp group and the partial outputs are summed
  over tp.
- Routing is the module's own (``MoE.select``: top-k softmax, normalized, sigmoid, group-limited, biased);
  dispatch takes only its (indices, weights), so any router runs under it.
- Capacity: none. Every (token, expert) assignment is sent, whatever the load; no token is dropped, and the
  buffers are as large as the routing makes them (a rank may receive up to T·A·ep rows).
- Gradients: a rank's expert weights receive the gradients of every rank's tokens (through the all-to-all's
  backward); they are scaled by 1/dp so they match what FSDP2's mean over dp gives the other parameters.
- Load-balancing loss: computed from the global statistics (assignment fractions and mean probabilities
  summed over the dp ranks), so it, and its gradient, equal the single-process loss of the whole batch.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from ..backends.torch.layers.moe import MoE
from ..errors import SpecError
from ..ir.graph import LayerGraph
from .styles import _sum_grads


def expert_tensors(op_params: Any) -> list[str]:
    """The names of a ``moe`` op's per-expert tensors ([E, ...] weights and biases; not the router's)."""
    return [name for name in op_params if name.startswith(("w_", "b_"))]


def check_expert_parallel(graph: LayerGraph, ep: int, dp: int, tp: int = 1) -> None:
    """Refuse an ``ep`` this runtime cannot run, before any work: no MoE layer, an ep that does not divide dp
    (or that is less than dp with tp > 1), or experts that ep does not divide (with tp > 1 the experts' hidden
    units are checked by the tensor-parallel plan)."""
    if ep == 1:
        return
    name = graph.meta.get("name", "the model")
    moes = [op for op in graph.ops() if op.kind == "moe"]
    if not moes:
        raise SpecError(f"{name} has no MoE layer: ep={ep} has no experts to shard", hint="ep=1")
    if dp % ep:
        raise SpecError(
            f"ep={ep} with dp={dp}: experts are sharded over groups of ep data-parallel ranks, so ep must divide dp",
            hint=f"ep={dp} (or a divisor of dp)",
        )
    if ep != dp and tp > 1:
        raise SpecError(
            f"ep={ep} < dp={dp} with tp={tp}: experts split over tp and sharded over dp/ep replica groups are not "
            "run (FSDP2 composes one split dimension)",
            hint=f"ep={dp}, or tp=1",
        )
    for op in moes:
        if op.attrs.experts % ep:
            raise SpecError(
                f"{name}: {op.name} has {op.attrs.experts} experts, not divisible by ep={ep}",
                hint="an ep that divides the experts",
            )


def apply_expert_parallel(
    model: nn.Module, graph: LayerGraph, mesh: DeviceMesh, dp: DeviceMesh, tp: DeviceMesh | None, ep: int
) -> tuple[set[nn.Parameter], DeviceMesh | None]:
    """Shard the experts of every MoE layer over ``ep`` of the ``dp`` ranks in place (``mesh``: the whole
    mesh); the expert parameters, and with ep < dp the mesh of the groups that hold the same experts (for FSDP2
    to shard them over). With ``tp`` each expert is also split by hidden units over tp, as the tensor-parallel
    plan splits them (``tensor_plan.split_axis``)."""
    from ..analysis.layouts.tensor_plan import Rule, split_axis

    where, ep_mesh, replicas = _expert_meshes(mesh, dp, tp, ep)
    sharded: set[nn.Parameter] = set()
    for op in graph.ops():
        if op.kind != "moe":
            continue
        if tp is not None and op.attrs.bias:
            raise SpecError(f"{op.name}: tensor parallelism of experts with biases is not supported", hint="tp=1")
        module = model.get_submodule(op.name)
        assert isinstance(module, MoE)
        names = expert_tensors(op.params)
        for local in op.params:
            param = getattr(module, local)
            src = None if param.is_meta else 0
            if local in names:
                axis = split_axis(Rule("experts"), local) if tp is not None else None
                places = [Shard(0)] if tp is None else [Shard(0), Replicate() if axis is None else Shard(axis)]
                value = distribute_tensor(param.data, where, places, src_data_rank=src)
            elif tp is not None:  # the router's selection bias: whole on every tp rank, as in the tp plan
                value = distribute_tensor(param.data, tp, [Replicate()], src_data_rank=src)
            else:
                continue
            new = nn.Parameter(value, requires_grad=param.requires_grad)
            module.register_parameter(local, new)
            if local in names:
                sharded.add(new)
        module.__class__ = ExpertParallelMoE
        module.ep_mesh, module.dp_mesh, module.tp_mesh, module.ep_names = ep_mesh, dp, tp, names
    return sharded, replicas


def _expert_meshes(
    mesh: DeviceMesh, dp: DeviceMesh, tp: DeviceMesh | None, ep: int
) -> tuple[DeviceMesh, DeviceMesh, DeviceMesh | None]:
    """(where the experts live, the all-to-all group's mesh, the replica groups' mesh or None). ep = dp: the
    dp mesh itself (with tp: the (dp, tp) mesh). ep < dp: the dp ranks in groups of ep consecutive ones
    (Megatron-LM's expert groups), a new ("edp", "ep") mesh; rank r holds the experts of r mod ep, as do the
    dp/ep ranks of its "edp" column, over which FSDP2 shards them further."""
    if ep == dp.size():
        return (mesh if tp is not None else dp), dp, None
    ranks = dp.mesh.reshape(dp.size() // ep, ep)
    groups = DeviceMesh(dp.device_type, ranks, mesh_dim_names=("edp", "ep"))
    return groups["ep"], groups["ep"], groups["edp"]


class _ScaleGrad(torch.autograd.Function):
    """x in forward; its gradient times ``scale`` in backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.scale, None


def dispatch_combine(
    tokens: Tensor, chosen: Tensor, weights: Tensor, experts: int, group: Any, run: Any, weigh_input: bool = False
) -> Tensor:
    """Σ_a weights[t, a] · expert_{chosen[t, a]}(tokens[t]) (``weigh_input``, Llama 4's: Σ_a expert(weights[t, a] ·
    tokens[t])) with the experts sharded over ``group``'s ranks
    (rank d holds experts [d·E/n, (d+1)·E/n)): each (token, expert) row goes to its expert's rank by
    all-to-all, ``run(rows, sizes)`` applies the local experts to rows grouped by local expert, and the
    results come back by the reverse all-to-all. ``chosen``/``weights``: [T, A] from any router."""
    n = dist.get_world_size(group)
    per = experts // n
    flat = chosen.reshape(-1)
    order = flat.argsort(stable=True)  # rows by expert, so by destination rank
    token_of = order // chosen.shape[1]
    rows = tokens[token_of]
    gate = weights.reshape(-1)[order, None]
    if weigh_input:
        rows = rows * gate
    counts = torch.bincount(flat, minlength=experts)
    received_counts = torch.empty_like(counts)
    dist.all_to_all_single(received_counts, counts, group=group)  # [source rank, local expert]
    send = counts.view(n, per).sum(1).tolist()
    recv = received_counts.view(n, per).sum(1).tolist()
    arrived = _all_to_all(rows, recv, send, group)
    local_of = torch.arange(per, device=counts.device).repeat(n).repeat_interleave(received_counts)
    regroup = local_of.argsort(stable=True)  # rows by local expert, whichever rank sent them
    done = run(arrived[regroup], received_counts.view(n, per).sum(0).tolist())
    done = done[torch.argsort(regroup)]  # back in arrival order
    returned = _all_to_all(done, send, recv, group)
    out = returned if weigh_input else returned * gate
    return torch.zeros_like(tokens).index_add_(0, token_of, out)


def _all_to_all(rows: Tensor, recv: list[int], send: list[int], group: Any) -> Tensor:
    """``all_to_all_single`` with split sizes and a backward (the reverse exchange). The autograd one of
    ``torch.distributed.nn`` returns a plain tensor; the functional-collectives one returns a wrapper without
    storage, which saved-tensor hooks that read storages (``--report``'s memory count) cannot pack."""
    with warnings.catch_warnings():  # deprecated in favour of the functional one, for the reason above
        warnings.simplefilter("ignore", FutureWarning)
        return dist_fn.all_to_all_single(rows.new_empty(sum(recv), rows.shape[1]), rows, recv, send, group=group)


class ExpertParallelMoE(MoE):
    """``MoE`` whose expert tensors are this rank's shard (``Shard(0)`` on ``ep_mesh``; with ``tp_mesh`` also
    split by hidden units, so this rank's output is a partial sum over tp, as ``styles.LocalParams`` does it)."""

    ep_mesh: DeviceMesh  # the ranks that dispatch among themselves (all of dp, or a group of ep of them)
    dp_mesh: DeviceMesh  # every data-parallel rank: the batch the load-balancing loss is taken over
    tp_mesh: DeviceMesh | None
    ep_names: list[str]

    def forward(self, x: Tensor, router_logits: Tensor) -> Tensor:
        group = self.ep_mesh.get_group()
        n, tp = self.ep_mesh.size(), self.tp_mesh
        if tp is not None:  # every tp rank's partial result reads x and the gates: their gradients summed
            x, router_logits = _sum_grads(x, tp), _sum_grads(router_logits, tp)
        tokens = x.reshape(-1, self.dim)
        weights, chosen, probs = self.select(router_logits)
        self._balance(chosen, probs, self.dp_mesh.get_group())
        local = {}
        for name, param in self._parameters.items():
            if isinstance(param, DTensor):  # this rank's experts, their gradients scaled as FSDP2's dp mean
                local[name] = _ScaleGrad.apply(param.to_local(), 1.0 / n) if name in self.ep_names else param.to_local()
        self.__dict__.update(local)  # instance attributes shadow the parameters for expert() and select()
        try:
            out = dispatch_combine(
                tokens, chosen, weights.to(x.dtype), self.experts, group, self._run, self.weigh_input
            )
        finally:
            for name in local:
                self.__dict__.pop(name, None)
        # every local expert tensor joins the graph, also when no token chose it: the same gradients on every
        # rank (clipping and the optimizer run collectives over them)
        out = out + sum(local[name].reshape(-1)[:1].sum() for name in self.ep_names) * 0.0
        if tp is not None:
            out = DTensor.from_local(out, tp, [Partial()], run_check=False).redistribute(tp, [Replicate()]).to_local()
            if isinstance(self.aux_loss, Tensor):  # the same on every tp rank, and its gradient summed over tp
                share = self.aux_loss / tp.size()
                self.aux_loss = share + (self.aux_loss - share).detach()
        return out.reshape(x.shape)

    def _run(self, rows: Tensor, sizes: list[int]) -> Tensor:
        out = torch.empty_like(rows)
        start = 0
        for e, count in enumerate(sizes):
            if count:
                out[start : start + count] = self.expert(e, rows[start : start + count])
                start += count
        return out

    def _balance(self, chosen: Tensor, probs: Tensor, group: Any) -> None:
        """The load-balancing loss of the whole batch (every dp rank's tokens): coef · E · Σ_e f_e · P_e."""
        if not (self.training and self.aux_loss_coef):
            self.aux_loss = None
            return
        counts = F.one_hot(chosen, self.experts).float().sum((0, 1))
        stats = torch.cat([counts, counts.new_tensor([chosen.shape[0]])])
        dist.all_reduce(stats, group=group)
        tokens = stats[-1]
        routed = stats[:-1] / (tokens * self.active)  # f_e
        mean_probs = dist_fn.all_reduce(probs.sum(0), group=group) / tokens  # P_e (gradients summed back)
        self.aux_loss = self.aux_loss_coef * self.experts * (routed * mean_probs).sum()


def shard_replicas(model: nn.Module, graph: LayerGraph, replicas: DeviceMesh) -> None:
    """ep < dp: FSDP2 over the replica groups (``edp``) for each MoE layer's experts, before the blocks are
    sharded over dp (which then leave them to this inner unit); its mean over the dp/ep replicas and the 1/ep
    scale of the expert gradients give the mean over dp. The layer's other parameters (a selection bias) stay
    with the block, sharded over dp."""
    for op in graph.ops():
        if op.kind == "moe":
            module = model.get_submodule(op.name)
            others = {p for name, p in module.named_parameters(recurse=False) if name not in module.ep_names}
            fully_shard(module, mesh=replicas, ignored_params=others or None)


@torch.no_grad()
def clip_grad_norm(params: Any, max_norm: float) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for gradients on different meshes (experts on their groups' mesh,
    the rest on dp): each gradient's norm made whole first, then one total (the same on every rank)."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = []
    for g in grads:
        n = torch.linalg.vector_norm(g)
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    total = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
