"""Pipeline parallelism from the layer graph, on ``torch.distributed.pipelining``.

The model is cut into ``pp × V`` chunks of consecutive blocks by the analyzer's own rule
(``specc.analysis.layouts.stages``): each pipeline rank gets as many blocks as ``split(blocks, pp)`` gives its
stage, spread over its V chunks by the same ``split``, and ``anchors`` places the ops outside the blocks (the
embedding with the first block, the final norm and head with the last); chunk ``c`` runs on pipeline rank
``c % pp`` (torch's loop placement: V chunks per rank for ``interleaved-1f1b``), so every rank holds what the
analyzer prices for its stage, virtual stages or not. Each rank
builds the model on the meta device, drops what its chunks do not hold and allocates the rest alone, filled with
the values ``build_torch(spec)`` gives (the seeded draw replayed in the whole model's parameter order).

One pruned model per rank (``root``) keeps the single-process names (``blocks.5.attn.qkv.weight``), so state
dicts, checkpoints and optimizer states need nothing pipeline-specific. A chunk runs the generated ``forward``
of ``root`` itself: its blocks alone in the block list, the modules of other chunks replaced by stand-ins, the
received hidden state put in front of its first block (a forward pre-hook) and the hidden state after its last
block handed on (a forward hook) unless the chunk ends the model.

A head tied to the embedding (``lm_head`` reads ``embed.weight``) sits on the last stage, the embedding on the
first: the last stage holds a copy of the table under the same name, and after every backward the two copies'
gradients are summed over the ranks holding them, so both get the single-process gradient and stay equal
(Megatron-LM's shared embedding). With ``tp`` each rank's modules take the IR's tensor-parallel plan
(``specc.parallel.tensor``; the modules other stages hold are skipped), and the hidden states travel whole
between the stages of a tensor-parallel rank; with ``dp`` the chunks are FSDP2-sharded over the data-parallel
ranks (each block, then each chunk).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.layouts.layout import SCHEDULES
from ..analysis.layouts.stages import anchors, block_ids, split
from ..errors import SpecError
from ..ir.graph import LayerGraph


@dataclass(frozen=True)
class PipelineOptions:
    """How a pipelined step runs: the schedule, model chunks per rank, sequences per micro-batch (None: the
    replica's rows split into pp micro-batches where they divide, else micro-batches of one sequence)."""

    schedule: str = "1f1b"
    virtual: int = 1
    micro_batch: int | None = None

    def micro_batches(self, rows: int, pp: int) -> int:
        """Micro-batches per step of a replica holding ``rows`` sequences (checked: they divide)."""
        size = self.micro_batch
        if size is None:
            size = rows // pp if rows % pp == 0 and rows >= pp else 1
        if size < 1 or rows % size:
            raise SpecError(
                f"--micro-batch {size} does not divide the {rows} sequences each data-parallel replica takes per step",
                hint="--batch (the global batch) / dp must be a multiple of --micro-batch",
            )
        return rows // size


@dataclass(frozen=True)
class Chunk:
    """One model chunk: its index, its blocks (global numbers, consecutive) and the outer ops it holds."""

    index: int
    blocks: tuple[int, ...]
    outer: tuple[str, ...]  # ops outside the blocks placed with this chunk (module paths)
    first: bool
    last: bool


def chunk_sizes(blocks: int, pp: int, virtual: int = 1) -> list[int]:
    """Blocks per chunk: each pipeline rank gets the blocks the analyzer gives its stage (``split(blocks,
    pp)``), spread over its ``virtual`` chunks by the same rule; chunk c is chunk c // pp of rank c % pp."""
    per_rank = [split(n, virtual) for n in split(blocks, pp)]
    return [per_rank[c % pp][c // pp] for c in range(pp * virtual)]


def chunk_plan(graph: LayerGraph, pp: int, virtual: int = 1) -> list[Chunk]:
    """The ``pp × virtual`` chunks of ``graph``, in model order; the ops outside the blocks go with the chunk
    of the block the analyzer places them with (``anchors``)."""
    blocks = len(block_ids(graph))
    n = pp * virtual
    sizes = chunk_sizes(blocks, pp, virtual)
    owner, start = [], 0
    for c, size in enumerate(sizes):
        owner += [c] * size
        start += size
    where = anchors(graph)
    outer: list[list[str]] = [[] for _ in range(n)]
    for op in graph.ops():
        if op.layer is None:
            outer[owner[where[op.name]] if owner else 0].append(op.name)
    out, start = [], 0
    for c, size in enumerate(sizes):
        out.append(Chunk(c, tuple(range(start, start + size)), tuple(outer[c]), c == 0, c == n - 1))
        start += size
    return out


def chunk_of(plan: list[Chunk], op: str) -> int:
    """The chunk that holds outer op ``op``."""
    return next(c.index for c in plan if op in c.outer)


def check_pipeline(
    graph: LayerGraph, pp: int, schedule: str, virtual: int, micro_batches: int, dp: int = 1, tp: int = 1
) -> None:
    """Refuse, before any work, a pipeline this graph or torch's schedules cannot run (``dp``: FSDP2 ranks,
    ``tp``: tensor-parallel ranks per stage, whose divisibility ``plan.check_tensor_parallel`` checks)."""
    if tp > 1:
        from ..analysis.layouts.tensor_plan import check_tensor_parallel

        check_tensor_parallel(graph, tp)
    name = graph.meta.get("name", "the model")
    if schedule not in SCHEDULES:
        raise SpecError(f"--pipeline-schedule {schedule} is unknown", hint=f"use one of {', '.join(SCHEDULES)}")
    if schedule == "zero-bubble" and dp > 1:
        raise SpecError(
            f"--pipeline-schedule zero-bubble with dp={dp}: its separate weight-gradient pass does not reach "
            "FSDP2's sharded parameters (torch.distributed.pipelining computes no weight gradients for them)",
            hint="with dp > 1 use gpipe, 1f1b or interleaved-1f1b",
        )
    if virtual < 1:
        raise SpecError(f"--virtual-stages {virtual} must be at least 1")
    if virtual > 1 and schedule not in ("interleaved-1f1b", "zero-bubble"):
        raise SpecError(
            f"--virtual-stages {virtual}: {schedule} runs one chunk per rank",
            hint="--pipeline-schedule interleaved-1f1b (or zero-bubble) for virtual stages",
        )
    if graph.meta.get("task") != "causal_lm" or any(op.stack not in (None, "decoder") for op in graph.ops()):
        raise SpecError(
            f"{name} is a {graph.meta.get('family')} model: pipeline parallelism runs decoder LMs (one stack of "
            "blocks) so far",
            hint="use --parallel dp=N,tp=N (pp=1)",
        )
    blocks = len(block_ids(graph))
    if blocks < pp * virtual:
        what = f"pp={pp}" + (f" × {virtual} virtual stages" if virtual > 1 else " pipeline stages")
        raise SpecError(f"{blocks} blocks cannot fill {what} (one block each at least)", hint=f"pp ≤ {blocks}")
    if any(op.kind == "moe" and float(op.attrs.aux_loss_coef or 0) for op in graph.ops()):
        raise SpecError(
            f"{name}: the MoE load-balancing loss is summed over every block's router, which pipeline stages "
            "do not share yet",
            hint="--set mlp.router.aux_loss_coef=0 under pp, or pp=1",
        )
    for op in graph.ops():  # a table shared across chunks is copied only outside the blocks (embedding, head)
        owner = graph.op(op.tied_to.rsplit(".", 1)[0]) if op.tied_to else None
        if owner is not None and (owner.layer is not None or op.layer is not None) and owner.layer != op.layer:
            raise SpecError(f"{name}: {op.name} shares {op.tied_to} across blocks: no pipeline split for it")
    if micro_batches < 1:
        raise SpecError("--micro-batch must leave at least one micro-batch per step")
    if schedule in ("interleaved-1f1b", "zero-bubble") and micro_batches % pp:
        raise SpecError(
            f"{micro_batches} micro-batches per step: {schedule} needs a multiple of pp={pp}",
            hint="choose --micro-batch so that the per-replica batch / micro-batch is a multiple of pp",
        )


class _Absent(nn.Module):
    """What stands in for a module another chunk runs: its input passed on (or zeros of the hidden width for
    token ids), which the next block's pre-hook replaces by the received hidden state. ``source``: the module
    it covers for, whose tensors (a tied table) stay readable through it."""

    stands_in = True  # passes that walk the IR's ops (the tensor-parallel plan) skip it

    def __init__(self, width: int, source: nn.Module | None = None):
        super().__init__()
        self.width = width
        self.__dict__["source"] = source

    def forward(self, x: Tensor, *rest: Any, **kw: Any) -> Tensor:
        if torch.is_floating_point(x):
            return x
        return x.new_zeros(*x.shape, self.width, dtype=torch.float32)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            source = self.__dict__.get("source")
            if source is None:
                raise
            return getattr(source, name)


class _Handoff(Exception):
    """Raised by a chunk's last block (not the model's): its output is what the chunk sends on."""

    def __init__(self, value: Tensor):
        super().__init__()
        self.value = value


class ChunkModule(nn.Module):
    """One chunk as a ``PipelineStage`` submodule: registers exactly the chunk's parameters (its blocks and its
    outer modules, shared with ``root``) and runs ``root``'s forward restricted to them."""

    def __init__(self, root: nn.Module, chunk: Chunk, blocks: dict[str, nn.Module], outer: dict[str, nn.Module],
                 width: int) -> None:  # fmt: skip
        super().__init__()
        self.__dict__["root"] = root
        self.chunk = chunk
        self.width = width
        self.blocks = nn.ModuleDict(blocks)
        self.outer = nn.ModuleDict({k.replace(".", "_"): m for k, m in outer.items()})
        self.received: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        root = self.__dict__["root"]
        try:
            with _restricted(root, self):
                if self.chunk.first:
                    return root(x)
                self.received = x
                ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)  # positions follow the shape
                return root(ids)
        except _Handoff as h:  # caught inside forward: FSDP's hooks around the chunk run in full
            return h.value
        finally:
            self.received = None


@contextmanager
def _restricted(root: nn.Module, chunk: ChunkModule) -> Iterator[None]:
    """``root`` as ``chunk`` sees it: its blocks alone in the block list, the outer modules of earlier chunks
    (those before the blocks) replaced by stand-ins when the chunk does not start the model."""
    saved_blocks = root.blocks._modules
    saved: dict[str, nn.Module] = {}
    if "view" not in chunk.__dict__:  # every block number, another chunk's a pass-through stand-in: a forward
        # that indexes its blocks (self.blocks[0]: blocks of different kinds) finds each; a loop passes them by
        held = dict(chunk.blocks.items())
        stand_in = {str(b): _Absent(chunk.width) for b in range(root._pp_blocks) if str(b) not in held}
        chunk.__dict__["view"] = {str(b): held.get(str(b), stand_in.get(str(b))) for b in range(root._pp_blocks)}
    root.blocks._modules = chunk.__dict__["view"]
    root.__dict__["_active_chunk"] = chunk
    try:
        if not chunk.chunk.first:
            for name in root._pre_modules:
                mod = root.get_submodule(name)
                saved[name] = mod
                _set(root, name, _Absent(chunk.width, mod))
        yield
    finally:
        for name, mod in saved.items():
            _set(root, name, mod)
        root.blocks._modules = saved_blocks
        root.__dict__["_active_chunk"] = None


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    (root.get_submodule(parent) if parent else root)._modules[leaf] = module


def _pre_hook(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    chunk = block._pp_root.__dict__.get("_active_chunk")
    if chunk is not None and not chunk.chunk.first and block is chunk.first_block:
        return (chunk.received, *args[1:]), kwargs
    return None


def _handoff_hook(block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    chunk = block._pp_root.__dict__.get("_active_chunk")
    if chunk is not None and not chunk.chunk.last and block is chunk.last_block:
        raise _Handoff(out)
    return None


@dataclass
class TiedCopy:
    """A parameter held on more than one pipeline rank (a tied table): the group of ranks holding it and
    whether this rank's copy is the owner's (counted once in the gradient norm)."""

    name: str
    param: nn.Parameter
    group: Any
    owner: bool


@dataclass
class Timeline:
    """Busy intervals of this rank's stage computations in the last step (perf_counter seconds)."""

    start: float = 0.0
    end: float = 0.0
    busy: list[tuple[str, float, float]] = field(default_factory=list)

    def bubble(self) -> float:
        wall = self.end - self.start
        return max(0.0, 1.0 - sum(b - a for _, a, b in self.busy) / wall) if wall > 0 else 0.0


class Pipeline:
    """This rank's chunks, their ``PipelineStage`` and the schedule; ``root`` holds the rank's parameters."""

    def __init__(self, root: nn.Module, graph: LayerGraph, mesh: Any, chunks: list[ChunkModule], schedule: str,
                 virtual: int, micro_batches: int, tied: list[TiedCopy], device: torch.device) -> None:  # fmt: skip
        from torch.distributed.pipelining import PipelineStage

        self.root, self.graph, self.mesh, self.chunks = root, graph, mesh, chunks
        self.schedule_name, self.virtual, self.micro_batches, self.tied = schedule, virtual, micro_batches, tied
        self.device = device
        self.pp_mesh = mesh["pp"]
        self.pp, self.pp_rank = self.pp_mesh.size(), self.pp_mesh.get_local_rank()
        names = tuple(mesh.mesh_dim_names or ())
        self.tp_rank = mesh["tp"].get_local_rank() if "tp" in names else 0
        self.n_chunks = self.pp * virtual
        group = self.pp_mesh.get_group()
        self.stages = [PipelineStage(c, c.chunk.index, self.n_chunks, device, group=group) for c in chunks]
        self.timeline = Timeline()
        for stage in self.stages:
            _time_stage(stage, self.timeline)
        self._loss_stats: list[Tensor] = []
        self._count = 1.0
        self._scale = 1.0
        self._ignore = -100
        self.schedule = self._make_schedule()
        self.training = True

    # ------------------------------------------------------------------------------------------- training

    def _loss(self, logits: Tensor, target: Tensor) -> Tensor:
        flat, gold = logits.flatten(0, 1).float(), target.flatten()
        total = F.cross_entropy(flat, gold, ignore_index=self._ignore, reduction="sum")
        right = ((flat.argmax(-1) == gold) & (gold != self._ignore)).sum()
        self._loss_stats.append(torch.stack([total.detach(), right.to(total.dtype)]))
        return total / self._count * self._scale

    def _make_schedule(self) -> Any:
        from torch.distributed.pipelining import (
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleInterleavedZeroBubble,
        )

        kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
                 "zero-bubble": ScheduleInterleavedZeroBubble}  # fmt: skip
        cls = kinds[self.schedule_name]
        if self.schedule_name in ("gpipe", "1f1b"):
            return cls(self.stages[0], self.micro_batches, loss_fn=self._loss, scale_grads=False)
        return cls(self.stages, self.micro_batches, loss_fn=self._loss, scale_grads=False)

    def train_step(self, x: Tensor, labels: Tensor, ignore: int, count: float, dp: int) -> tuple[float, float]:
        """Forward and backward of this replica's rows ``x`` → ``labels`` through the pipeline; gradients of
        the global mean loss over ``count`` tokens (``dp`` replicas: FSDP2 averages, so each scales by dp).
        Returns (global mean loss, global teacher-forced accuracy) on every rank."""
        self._count, self._scale, self._ignore = max(count, 1.0), float(dp), ignore
        self._loss_stats = []
        self.timeline.busy.clear()
        self.timeline.start = time.perf_counter()
        first = any(c.chunk.first for c in self.chunks)
        last = any(c.chunk.last for c in self.chunks)
        args = (x,) if first else ()
        self.schedule.step(*args, target=labels if last else None, return_outputs=False)
        self.timeline.end = time.perf_counter()
        self.sync_tied()
        done = self._loss_stats[-self.micro_batches :]  # the first step's shape inference also calls the loss
        counted = last and self.tp_rank == 0  # every tp rank of the last stage holds the same logits
        stats = torch.stack(done).sum(0) if done and counted else torch.zeros(2)
        stats = stats.to(torch.float64)
        dist.all_reduce(stats)  # the last stage of every replica holds its rows' sums; the rest add zeros
        return float(stats[0]) / self._count, float(stats[1]) / self._count

    def sync_tied(self) -> None:
        """Sum the gradients of a table held on several pipeline ranks (embedding and tied head)."""
        from torch.distributed.tensor import DTensor

        for t in self.tied:
            g = t.param.grad
            if g is None:
                t.param.grad = g = torch.zeros_like(t.param)
            if isinstance(g, DTensor) and tuple(g.placements) != tuple(t.param.placements):
                # a vocabulary-parallel embedding's gradient comes back replicated: split it as its table
                t.param.grad = g = g.redistribute(g.device_mesh, t.param.placements)
            local = g.to_local() if hasattr(g, "to_local") else g
            dist.all_reduce(local, group=t.group)

    def clip_grad_norm(self, max_norm: float) -> float:
        """``torch.nn.utils.clip_grad_norm_`` over the whole model: squares summed over every rank's shards
        (a tied table once)."""
        copies = {id(t.param) for t in self.tied if not t.owner}
        sq = torch.zeros((), dtype=torch.float64)
        grads = []
        for p in self.root.parameters():
            if p.grad is None:
                continue
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            grads.append(local)
            if id(p) not in copies:  # a tensor replicated over a mesh dimension: once for all its replicas
                sq += local.detach().double().pow(2).sum() / _replicas(p.grad)
        dist.all_reduce(sq)
        norm = float(sq.sqrt())
        coef = max_norm / (norm + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
        return norm

    # ------------------------------------------------------------------------------------------ inference

    def eval(self) -> Pipeline:
        return self.train(False)

    def train(self, mode: bool = True) -> Pipeline:
        self.training = mode
        self.root.train(mode)
        return self

    def aux_loss(self) -> None:
        return None

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits of ``input_ids`` (the same on every rank of a pipeline), chunk after chunk by point-to-point
        sends, broadcast from the last stage to every rank of it."""
        if attention_mask is not None:
            raise SpecError("a pipelined model runs without an attention mask")
        ranks = [int(r) for r in self.pp_mesh.mesh.flatten().tolist()]
        mine = {c.chunk.index: c for c in self.chunks}
        dtype = next(p.dtype for p in self.root.parameters() if torch.is_floating_point(p))
        width = self.chunks[0].width
        h: Tensor | None = None
        for c in range(self.n_chunks):
            if c > 0:
                src, dst = ranks[(c - 1) % self.pp], ranks[c % self.pp]
                if src != dst:
                    if (c - 1) in mine:
                        dist.send(h.contiguous(), dst)
                    elif c in mine:
                        h = torch.empty(*input_ids.shape, width, dtype=dtype, device=input_ids.device)
                        dist.recv(h, src)
            if c in mine:
                h = mine[c](input_ids if c == 0 else h)
        last_rank = ranks[(self.n_chunks - 1) % self.pp]
        vocab = int(self.graph.meta["vocab_size"])
        out = h.float().contiguous() if (self.n_chunks - 1) in mine else None
        if out is None:
            out = torch.empty(*input_ids.shape, vocab, device=input_ids.device)
        dist.broadcast(out, last_rank, group=self.pp_mesh.get_group())
        return out

    def generate(self, input_ids: Tensor, max_new_tokens: int, temperature: float | None = 0.0) -> Tensor:
        """Greedy continuation, one full forward per token (a pipelined model keeps no KV cache)."""
        if temperature not in (None, 0.0):
            raise SpecError("a pipelined model decodes greedily (temperature 0)")
        ids = input_ids
        for _ in range(max_new_tokens):
            nxt = self(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
        return ids


def _replicas(t: Tensor) -> int:
    """How many ranks hold the same values of ``t`` (a DTensor replicated over some mesh dimensions)."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(t, DTensor):
        return 1
    n = 1
    for dim, place in enumerate(t.placements):
        if isinstance(place, Replicate):
            n *= t.device_mesh.size(dim)
    return n


def _time_stage(stage: Any, timeline: Timeline) -> None:
    """Record the compute intervals of ``stage`` (forward, backward, weight-gradient) in ``timeline``."""
    for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
        fn = getattr(stage, name, None)
        if fn is None:
            continue

        def timed(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                timeline.busy.append((_name, t0, time.perf_counter()))

        setattr(stage, name, timed)


# --------------------------------------------------------------------------------------------- building


def _module_width(graph: LayerGraph) -> int:
    width = graph.meta.get("d_model")
    if width:
        return int(width)
    emb = next(op for op in graph.ops() if op.kind == "embedding")
    return int(emb.params["weight"].shape[-1])


def build_pipeline(
    spec: Any,
    graph: LayerGraph,
    mesh: Any,
    *,
    schedule: str = "1f1b",
    virtual: int = 1,
    micro_batches: int = 1,
    init: bool = True,
    build: Any = None,
) -> Pipeline:
    """This rank's share of ``spec``'s model under ``mesh`` (dims ``pp``, ``dp`` and ``tp`` = 1): built on the
    meta device, pruned to this rank's chunks, FSDP2-sharded over ``dp``, materialized (``init``: the
    single-process values; else left for a checkpoint), and wrapped in ``PipelineStage`` s and the schedule.
    ``build(spec, device)``: the model builder (default ``specc.build_torch``)."""
    from .materialize import check_fits, copy_into_shard, mesh_device

    names = tuple(mesh.mesh_dim_names or ())
    if "pp" not in names:
        raise SpecError("build_pipeline needs a device mesh with a pp dimension")
    tp = mesh["tp"].size() if "tp" in names else 1
    pp = mesh["pp"].size()
    check_pipeline(graph, pp, schedule, virtual, micro_batches, mesh["dp"].size() if "dp" in names else 1, tp)
    if build is None:
        from ..backends.torch.build import build_torch

        def build(s: Any, device: torch.device) -> nn.Module:
            return build_torch(s, device=str(device))

    root = build(spec, torch.device("meta"))
    if hasattr(root, "plain"):
        root.plain()
    plan = chunk_plan(graph, pp, virtual)
    rank = mesh["pp"].get_local_rank()
    mine = [c for c in plan if c.index % pp == rank]
    held_blocks = {b for c in mine for b in c.blocks}
    held_outer = {name for c in mine for name in c.outer}
    width = _module_width(graph)
    outer_ops = [op for op in graph.ops() if op.layer is None]
    first_block_op = next(i for i, op in enumerate(graph.ops()) if op.layer is not None)
    pre = [op.name for i, op in enumerate(graph.ops()) if op.layer is None and i < first_block_op]
    # the block list keeps this rank's blocks under their own numbers (iteration runs them in order)
    root.blocks._modules = {str(b): root.blocks._modules[str(b)] for b in sorted(held_blocks)}
    tied: list[tuple[str, int, int]] = []  # (owner parameter, owner chunk, user chunk)
    for op in outer_ops:
        if op.tied_to:
            oc, uc = chunk_of(plan, op.tied_to.rsplit(".", 1)[0]), chunk_of(plan, op.name)
            if oc % pp != uc % pp:
                tied.append((op.tied_to, oc, uc))
    copies: dict[str, str] = {}  # module path → tied parameter this rank holds a copy of
    mine_ids = {c.index for c in mine}
    for op in outer_ops:
        if op.name in held_outer or not _has_module(root, op.name):
            continue
        owned = [owner for owner, _, uc in tied if owner.rsplit(".", 1)[0] == op.name and uc in mine_ids]
        if owned:  # the owner's module itself, kept (never run here): its table is this rank's copy
            copies[op.name] = owned[0]
            continue
        _set(root, op.name, _Absent(width))
    root.tie_weights()  # a tied head held here: its weight IS this rank's copy of the table (before FSDP2 sees it)
    root._pre_modules = [n for n in pre if _has_module(root, n)]
    root._pp_blocks = len(block_ids(graph))
    root.__dict__["_active_chunk"] = None
    chunks = []
    for c in mine:
        blocks = {str(b): root.blocks._modules[str(b)] for b in c.blocks}
        outer = {n: root.get_submodule(n) for n in c.outer if _has_module(root, n)}
        outer.update({n: root.get_submodule(n) for n, owner in copies.items() if c.index == _user_chunk(tied, owner)})
        chunks.append(ChunkModule(root, c, blocks, outer, width))
    if tp > 1:  # the IR's tensor-parallel plan on the modules this rank holds (stand-ins skipped)
        from .tensor import apply_tensor_parallel

        apply_tensor_parallel(root, graph, mesh["tp"])
    dp = mesh["dp"] if "dp" in names else None
    if dp is not None and dp.size() > 1:
        from torch.distributed.fsdp import fully_shard

        for c in chunks:
            for block in c.blocks.values():
                fully_shard(block, mesh=dp)
            fully_shard(c, mesh=dp)
    for c in chunks:  # hooks after FSDP's own: its post-forward runs before a hand-off
        block_list = list(c.blocks.values())
        c.__dict__["first_block"], c.__dict__["last_block"] = block_list[0], block_list[-1]
        for block in block_list:
            block.__dict__["_pp_root"] = root
            block.register_forward_pre_hook(_pre_hook, with_kwargs=True)
            block.register_forward_hook(_handoff_hook, with_kwargs=True)
    root.graph = graph
    root.mesh = mesh
    device = mesh_device(mesh)
    check_fits(root, device, init)
    root.to_empty(device=device)
    if init:
        from .tensor import packed_params

        local = dict(root.named_parameters())
        packed = packed_params(graph, tp)
        full = build(spec, torch.device("meta"))
        full.init_weights(
            lambda name, _p, values: copy_into_shard(local[name], values, packed.get(name)) if name in local else None
        )
    groups = _tied_groups(mesh, tied, pp)
    tied_copies = []
    for owner, oc, uc in tied:
        if oc % pp == rank or uc % pp == rank:
            tied_copies.append(TiedCopy(owner, root.get_parameter(owner), groups[owner], oc % pp == rank))
    pipe = Pipeline(root, graph, mesh, chunks, schedule, virtual, micro_batches, tied_copies, device)
    root.pipeline = pipe
    return pipe


def _user_chunk(tied: list[tuple[str, int, int]], owner: str) -> int:
    return next(uc for o, _, uc in tied if o == owner)


def _has_module(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def _tied_groups(mesh: Any, tied: list[tuple[str, int, int]], pp: int) -> dict[str, Any]:
    """A process group per tied table: the pipeline ranks holding it, one group per data-parallel coordinate
    (``new_group`` is collective: every rank creates every group, in the same order)."""
    out: dict[str, Any] = {}
    grid = mesh.mesh  # ranks laid out (pp, dp[, tp])
    me = dist.get_rank()
    for owner, oc, uc in tied:
        holders = sorted({oc % pp, uc % pp})
        flat = grid.reshape(pp, -1)
        for col in range(flat.shape[1]):
            ranks = [int(flat[p, col]) for p in holders]
            group = dist.new_group(ranks) if dist.get_world_size() > 1 else dist.group.WORLD
            if me in ranks:
                out[owner] = group
    return out
