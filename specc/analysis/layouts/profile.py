"""The graph measured once at batch 1: per op what it computes, moves, keeps for backward and communicates,
and how tensor parallelism divides each of those. Everything a layout costs scales from these numbers
(activations, FLOPs and traffic are linear in the batch), so a plan search never evaluates the graph again.

Tensor-parallel classes of what an op keeps for the backward pass (Korthikanti et al. 2022, §4):
``sharded`` is divided by tp (attention core, the inputs of row-parallel linears and of MLP activations, the
experts' hidden states); ``replicated`` is divided by tp only with sequence parallelism (norm inputs, the
inputs of column-parallel linears, dropout masks). With a causal LM the cross-entropy keeps the logits in fp32
(vocabulary-parallel: sharded), as their 4·s·b·v/t output-layer term does.

Recompute ``op`` is torchtitan's op-level selective checkpointing (torchtitan/distributed/activation_checkpoint.py,
``SelectiveAC``): each block is one checkpoint region that keeps its input; inside it an op's output is saved iff
the op is in torch's compute-intensive list (``get_default_op_list``: mm, addmm, bmm, the SDPA kernels …), except
that the ``aten.mm`` calls are counted per region and the even-numbered ones (2nd, 4th …) are recomputed. specc's
torch linears call ``aten.addmm`` with a bias (always saved, not counted) and ``aten.mm`` without (counted), in
the block's graph order; the attention core is one SDPA call (output and its log-sum-exp saved; the ``math``
implementation's bmm outputs: output and N² scores), a latent one (MLA) after kv_b's counted ``aten.mm``. A MoE
layer's expert GEMMs are a data-dependent number of mm calls: half of them are taken as saved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ...ir.graph import LayerGraph, dims
from ...ir.ops import ATTENTION_KINDS, LatentAttentionAttrs
from ...spec.schema import DTYPE_BYTES
from ..costs import Ctx, numel
from ..op_costs import KEEP_THEIR_INPUT, decode_ops, evaluate, kept_by_several_blocks
from ..rules.attention_core import cpu_sdpa_unfused
from .shard import tp_roles
from .stages import anchors, block_count, stage_of

LOSS_BYTES = 4  # the cross-entropy works on fp32 logits


@dataclass(frozen=True)
class OpProfile:
    """One op at batch 1 (bytes at the analysis dtype; FLOPs of one forward)."""

    sharded: bool  # compute (and traffic) divided by tp
    matmul: int
    other: int
    io: int  # activation bytes read + written
    weights_read: int  # parameter elements the forward reads, before any split
    saved_sharded: int  # kept for backward, no recompute
    saved_replicated: int
    selective_sharded: int  # the same under selective recompute (attention scores recomputed)
    block_input: int  # bytes of the residual stream entering the block (attention ops: one per block)
    kv_cache: int  # bytes cached for generation
    tp_fwd: int  # tensor an all-reduce (g: row-parallel output) closes in the forward pass
    tp_bwd: int  # tensor an all-reduce (f: column-parallel input) closes in the backward pass
    kv_bytes: int  # full-sequence K and V (context parallelism passes them round the ring)
    routed: int  # tokens × active experts × width, bytes (expert-parallel all-to-all)
    attention: bool
    in_block: bool
    # what the kernel cost model (timing.py) needs beyond the totals
    matmul_causal: int = 0  # attention: the QK and AV FLOPs a causal fused kernel really runs (masked tiles skipped)
    scores: int = 0  # attention: score elements of one (batch-1) evaluation, heads × queries × keys
    op_math: int = 0  # recompute op, math attention: what it saves beyond op_kept (N² scores − LSE; batch 1)
    attn_dropout: bool = False  # attention: dropout on the probabilities (math: a mask and a copy through memory)
    saved_flash: int = 0  # attention: kept for backward by a fused kernel (Q, K, V, output statistics)
    gemm: tuple[int, int] = (0, 0)  # linear: (in, out) features; attention: (head_dim, head_dim)
    role: str = ""  # column | row | vocab | replicated (how tp splits the GEMM)
    keys: int = 0  # attention: keys each query attends over (before any mask)
    out_bytes: int = 0  # bytes of the op's output (batch 1)
    op_kept: int = 0  # recompute op: bytes of its outputs the policy saves (flash attention: output + LSE)
    op_rerun: float = 0.0  # recompute op: the fraction of its forward the backward reruns
    logits: int = 0  # output head: the fp32 logits the cross-entropy keeps (part of saved_sharded)
    torch_extra: int = 0  # kept beyond saved_* by torch's eager ops (Mem.saved_torch; sharded iff ``sharded``)
    torch_cpu_extra: int = 0  # … and beyond that on the CPU (Mem.saved_torch_cpu: norms, replicated)
    kv_cache_whole: int = 0  # the part of kv_cache every tp rank holds whole (MLA's latent and rotary key)
    cpu_math_kept: int = 0  # a core torch's CPU SDPA has no fused kernel for: its math path's (Mem.saved_cpu_math)
    cpu_math_inference: bool = False  # … and none without dropout either (cpu_sdpa_unfused at inference)
    dropout: bool = False  # a dropout op: in inference the identity, which launches no kernel
    shared_bias: int = 0  # ALiBi: torch's layers build one [1, H, N, N] bias per call, shared by every layer
    # a tensor from outside the block that ops of several blocks keep (the encoder's output every decoder
    # layer's cross-attention K/V projection reads): (its name, bytes), kept once per stage, not in saved_*
    shared_input: tuple[str, int] = ("", 0)
    # a rotary core: (its tables' configuration, bytes of the cos and sin tables [1, 1, N, dims / 2] in the compute
    # dtype): built once per call and shared by every layer of that configuration, kept once per stage
    rope_tables: tuple[str, int] = ("", 0)
    token_ids: int = 0  # an embedding's int64 ids its backward keeps: whole on each tp rank, sequence parallel too
    mask_kept: int = 0  # kernels torch / torch-cpu: the [1, 1, N, N] mask a core keeps (SDPA's in the dtype, bool)
    call_ids: int = 0  # ids one call computes for all its rows (T5's bucket of each query–key pair): not × batch


@dataclass(frozen=True, eq=False)
class Stage:
    """What one pipeline stage holds: its ops (profile → count), an id shared by stages holding the same,
    and the sums that memory and communication need."""

    ops: tuple[tuple[OpProfile, int], ...]
    key: int
    saved_sharded: int
    saved_replicated: int
    selective_sharded: int
    full_kept: int  # block inputs of its blocks (full recompute keeps only these) …
    outside_sharded: int  # … plus what ops outside the blocks keep
    outside_replicated: int
    kv_cache: int
    tp_fwd: int
    tp_bwd: int
    tp_fwd_blocks: int
    tp_bwd_blocks: int
    kv_bytes: int
    routed: int
    boundary: int  # the residual stream one micro-batch sends to the next stage
    flash_saving: int = 0  # what a fused attention kernel does not keep of the materialised scores (sharded)
    op_sharded: int = 0  # recompute op: matmul outputs kept, split by tp (column linears, attention cores)
    op_replicated: int = 0  # … and those whole on each tp rank (row-parallel outputs)
    op_math: int = 0  # … and what math attention saves beyond that (the N² scores, a bmm output; sharded)
    torch_sharded: int = 0  # kernels torch / torch-cpu: what torch's eager ops keep beyond the fused kernels'
    torch_replicated: int = 0
    torch_cpu: int = 0  # … on the CPU only (replicated)
    torch_outside: int = 0  # the part of the three above outside the blocks (kept under any recompute)
    torch_cpu_outside: int = 0
    torch_attention: int = 0  # the attention cores' part of torch_sharded (the packed q|k|v rotary leaves)
    logits: int = 0  # the fp32 logits the cross-entropy keeps (in outside_sharded: vocabulary-parallel)
    kv_cache_whole: int = 0  # the part of kv_cache not split by tp (MLA's replicated latent)
    # kernels torch-cpu: what the attention cores without a fused CPU kernel keep beyond the fused accounting
    # (flash: kept − saved_flash − torch extras; math: kept − saved − torch extras) and their math bmm outputs
    cpu_math_flash: int = 0
    cpu_math_math: int = 0
    cpu_math_op: int = 0
    shared_bias: int = 0  # kernels torch / torch-cpu: ALiBi's one bias per call (the largest; split by tp)
    rope_tables: int = 0  # the cos / sin tables of each rotary configuration, once per call (not split by tp)
    token_ids: int = 0  # the embeddings' int64 ids (outside the blocks, never split by tp)
    masks: int = 0  # kernels torch / torch-cpu: the masks the cores keep (one per layer and call, not × batch)
    call_ids: int = 0  # T5's relative-position buckets, once per stack and call (outside the blocks)


def _stage(ops: Counter[OpProfile], key: int) -> Stage:
    items = tuple(ops.items())
    shared = sum(dict(p.shared_input for p, _ in items if p.shared_input[1]).values())  # each tensor once

    def total(attr: str, pick: object = None) -> int:
        return sum(c * getattr(p, attr) for p, c in items if pick is None or p.in_block == pick)

    return Stage(
        items,
        key,
        total("saved_sharded"),
        total("saved_replicated") + shared,
        total("selective_sharded"),
        total("block_input", True) + shared,  # full recompute: an input of each checkpointed block, kept once
        total("saved_sharded", False),
        total("saved_replicated", False),
        total("kv_cache"),
        total("tp_fwd"),
        total("tp_bwd"),
        total("tp_fwd", True),
        total("tp_bwd", True),
        total("kv_bytes"),
        total("routed"),
        max((p.block_input for p, _ in items), default=0),
        sum(c * (p.saved_sharded - p.saved_flash) for p, c in items if p.attention),
        sum(c * p.op_kept for p, c in items if p.in_block and p.role != "row"),
        sum(c * p.op_kept for p, c in items if p.in_block and p.role == "row"),
        sum(c * p.op_math for p, c in items if p.in_block),
        sum(c * p.torch_extra for p, c in items if p.sharded),
        sum(c * p.torch_extra for p, c in items if not p.sharded),
        total("torch_cpu_extra"),
        total("torch_extra", False),
        total("torch_cpu_extra", False),
        sum(c * p.torch_extra for p, c in items if p.attention),
        total("logits"),
        total("kv_cache_whole"),
        sum(c * (p.cpu_math_kept - p.saved_flash - p.torch_extra) for p, c in items if p.cpu_math_kept),
        sum(c * (p.cpu_math_kept - p.saved_sharded - p.torch_extra) for p, c in items if p.cpu_math_kept),
        sum(c * p.op_math for p, c in items if p.cpu_math_kept and p.in_block),
        max((p.shared_bias for p, _ in items), default=0),
        sum(dict(p.rope_tables for p, _ in items if p.rope_tables[1]).values()),
        total("token_ids"),
        total("mask_kept"),
        total("call_ids"),
    )


@dataclass
class GraphProfile:
    graph: LayerGraph
    seq: int
    dtype: str
    elem_bytes: int
    training: bool
    ops: list[tuple[int, OpProfile]]  # (anchor block, profile) in graph order
    _stages: dict[int, list[Stage]] = field(default_factory=dict)
    _same: dict[frozenset[tuple[OpProfile, int]], Stage] = field(default_factory=dict)
    memo: dict[tuple[object, ...], Any] = field(default_factory=dict)  # stage times (timing.py)

    @cached_property
    def blocks(self) -> int:
        return block_count(self.graph)

    def stages(self, pp: int) -> list[Stage]:
        """Per pipeline stage, what it holds (equal blocks share profiles; equal stages share a key)."""
        if pp not in self._stages:
            counts: list[Counter[OpProfile]] = [Counter() for _ in range(pp)]
            for block, p in self.ops:
                counts[stage_of(block, self.blocks, pp)][p] += 1
            out = []
            for c in counts:
                content = frozenset(c.items())
                if content not in self._same:
                    self._same[content] = _stage(c, len(self._same))
                out.append(self._same[content])
            self._stages[pp] = out
        return self._stages[pp]

    @cached_property
    def forward_flops(self) -> int:
        return sum(p.matmul + p.other for _, p in self.ops)


def profile(g: LayerGraph, seq: int, dec_seq: int | None, dtype: str, training: bool) -> GraphProfile:
    elem_bytes = DTYPE_BYTES[dtype]
    env = {"B": 1, "N": seq, "N_dec": dec_seq or seq}
    costs = evaluate(g, env, Ctx(bytes=elem_bytes))
    dec = decode_ops(g)
    where, roles = anchors(g), tp_roles(g)
    outputs = set(g.outputs.values())
    f_inputs: set[str] = set()
    several = kept_by_several_blocks(g)
    mm_count: Counter[object] = Counter()  # per block (checkpoint region): aten.mm calls so far
    out = []
    for c in costs:
        op = c.op
        role = roles[op.name]
        ins = [dims(g.shape_of(i), env) for i in op.inputs]
        shape = dims(op.shape, env)
        width = numel(shape) * elem_bytes
        saved_s, saved_r, sel_s = 0, c.mem.saved, 0
        token_ids = c.mem.saved if op.kind == "embedding" else 0  # what a lookup keeps is its ids
        call_ids = c.mem.saved if op.kind == "relative_bias" else 0  # [N_q, N_k] buckets: the same for every row
        saved_r -= token_ids + call_ids
        sharded = role in ("column", "row", "vocab") and op.kind == "linear"
        core = op.kind in ATTENTION_KINDS  # a fused SDPA call (MLA: after kv_b's expansion, split by heads)
        if core:
            sharded, saved_s, saved_r = True, c.mem.saved, 0
            sel_s = c.mem.fused - c.mem.scores_fused  # Q, K, V kept; scores, softmax, dropout recomputed
        elif op.kind in ("glu", "activation") and op.layer is not None:
            sharded, saved_s, saved_r = True, c.mem.saved, 0
        elif op.kind == "moe":
            k, h, mats = op.attrs.active, op.attrs.hidden, 3 if op.attrs.expert == "swiglu" else 2
            saved_s = numel(ins[0][:-1]) * k * h * mats * elem_bytes
            sharded, saved_r = True, c.mem.saved - saved_s
        elif role == "row":
            saved_s, saved_r = c.mem.saved, 0
        shared_input = ("", 0)
        if op.kind in KEEP_THEIR_INPUT and op.inputs[0] in several and not saved_s:
            shared_input, saved_r = (op.inputs[0], numel(ins[0]) * elem_bytes), 0  # once per stage (_stage)
        if not core:
            sel_s = saved_s
        logits = 0
        if training and op.name in outputs and op.category == "lm_head":
            logits = numel(shape) * LOSS_BYTES
            saved_s += logits  # vocabulary-parallel cross-entropy keeps fp32 logits
            sel_s = saved_s
        tp_fwd = width if role == "row" or op.kind == "moe" or (op.kind == "embedding") else 0
        tp_bwd = 0
        column = (role in ("column", "vocab") and op.kind == "linear") or op.kind == "moe"
        # the tensor whose gradient the backward sums over tp (once, though gate and up both read it): a
        # column-parallel input; MLA's whole latent, which each rank's kv_b rows and heads read
        f_input = 1 if op.kind == "latent_attention" else 0 if column else None
        if f_input is not None and op.inputs[f_input] not in f_inputs:
            f_inputs.add(op.inputs[f_input])
            tp_bwd = numel(ins[f_input]) * elem_bytes
        kv_bytes = block_input = keys = 0
        if core:
            keys = ins[1][1] if op.attrs.cross else ins[0][1]
            kv_bytes = keys * _kv_width(op.attrs) * elem_bytes
            if not op.attrs.cross:
                block_input = numel(ins[0][:-1]) * _width(g, op.name) * elem_bytes
        routed = numel(ins[0][:-1]) * op.attrs.active * op.attrs.dim * elem_bytes if op.kind == "moe" else 0
        kv = c.mem.kv_cache if dec is not None and op.name in dec else 0
        causal = scores = 0
        gemm = (0, 0)
        if core:
            causal = sum(f.useful_matmul for f in c.flops)
            scores = c.mem.scores // elem_bytes if elem_bytes else 0
            gemm = (int(op.attrs.head_dim), int(op.attrs.head_dim))
        elif op.kind == "linear":
            gemm = (int(op.attrs.in_features), int(op.attrs.out_features))
        op_kept, op_rerun, op_math = _op_policy(op, c, width, ins, elem_bytes, saved_s, mm_count)
        dropout = core and float(op.attrs.dropout or 0) > 0
        out.append(
            (
                where[op.name],
                OpProfile(
                    sharded=sharded,
                    matmul=c.matmul,
                    other=c.total - c.matmul,
                    io=c.mem.io,
                    weights_read=c.mem.weights_read,
                    saved_sharded=saved_s,
                    saved_replicated=saved_r,
                    selective_sharded=sel_s,
                    block_input=block_input,
                    kv_cache=kv,
                    kv_cache_whole=kv if op.kind == "latent_attention" else 0,
                    tp_fwd=tp_fwd,
                    tp_bwd=tp_bwd,
                    kv_bytes=kv_bytes,
                    routed=routed,
                    attention=core,
                    in_block=op.layer is not None,
                    matmul_causal=causal,
                    scores=scores,
                    attn_dropout=dropout,
                    saved_flash=c.mem.fused if core else 0,
                    gemm=gemm,
                    role=role,
                    out_bytes=width,
                    keys=keys,
                    op_kept=op_kept,
                    op_rerun=op_rerun,
                    op_math=op_math,
                    torch_extra=c.mem.saved_torch,
                    torch_cpu_extra=c.mem.saved_torch_cpu,
                    logits=logits,
                    cpu_math_kept=c.mem.saved_cpu_math,
                    cpu_math_inference=core and cpu_sdpa_unfused(op.attrs, training=False),
                    dropout=op.kind == "dropout",
                    shared_bias=_shared_bias(op, ins, elem_bytes) if core else 0,
                    rope_tables=_rope_tables(op, ins, elem_bytes) if core else ("", 0),
                    token_ids=token_ids,
                    mask_kept=_mask_kept(op, ins, elem_bytes) if core else 0,
                    call_ids=call_ids,
                    shared_input=shared_input,
                ),
            )
        )
    return GraphProfile(g, seq, dtype, elem_bytes, training, out)


def _op_policy(
    op: Any, c: Any, width: int, ins: list[tuple[int, ...]], elem_bytes: int, moe_saved: int, mm_count: Counter[object]
) -> tuple[int, float, int]:
    """(bytes saved, fraction of the forward rerun, math attention's saved scores) of one op under torchtitan's
    op-level policy; ``mm_count`` counts the block's aten.mm calls in forward order."""
    if op.layer is None:
        return 0, 0.0, 0  # outside the checkpointed blocks: kept as without recompute
    if op.kind == "linear":
        if op.attrs.bias:
            return width, 0.0, 0  # aten.addmm: saved, not counted
        mm_count[op.layer] += 1
        return (width, 0.0, 0) if mm_count[op.layer] % 2 else (0, 1.0, 0)
    if op.kind in ATTENTION_KINDS:
        lse = int(op.attrs.heads) * ins[0][1] * LOSS_BYTES  # fused SDPA: output and fp32 log-sum-exp
        kept, rerun = width + lse, 0.0
        if op.kind == "latent_attention":  # kv_b's expansion is a counted aten.mm before the SDPA call
            mm_count[op.layer] += 1
            a, tokens = op.attrs, ins[0][1]
            if mm_count[op.layer] % 2:
                kept += tokens * a.heads * (a.nope_head_dim + a.v_head_dim) * elem_bytes
            else:
                rerun = next(f.matmul for f in c.flops if f.part == "qkv_proj") / c.total
        return kept, rerun, c.mem.scores - lse  # math: output and the QKᵀ bmm's scores
    if op.kind == "moe":
        return moe_saved // 2, 0.5, 0
    return 0, 1.0, 0


def _shared_bias(op: Any, ins: list[Any], elem_bytes: int) -> int:
    """The [1, H, N_q, N_k] additive bias specc's torch layers build once per call for ALiBi self-attention (in
    the compute dtype) and SDPA keeps for its backward: one tensor however many layers and rows read it."""
    a = op.attrs
    if op.kind != "attention" or a.cross or a.alibi_max_bias is None:
        return 0
    return int(a.heads) * ins[0][1] * ins[0][1] * elem_bytes


def _mask_kept(op: Any, ins: list[Any], elem_bytes: int) -> int:
    """The [1, 1, N, N] mask a self-attention core of specc's torch layers keeps for its backward, one per layer and
    call: a windowed core (sliding, local, chunked, prefix) hands SDPA a boolean mask, which SDPA keeps as an
    additive one in the dtype; the explicit softmax (soft-capped scores, sinks) keeps its boolean mask, causal too.
    A causal SDPA core needs none (its causal flag); ALiBi folds the mask into its bias (``_shared_bias``)."""
    a = op.attrs
    if op.kind != "attention" or a.cross or a.mask in ("none", "padding") or a.alibi_max_bias is not None:
        return 0
    n = ins[0][1] * ins[0][1]
    if a.softcap or a.sinks:
        return n  # torch.bool
    return n * elem_bytes if a.mask != "causal" else 0


def _rope_tables(op: Any, ins: list[Any], elem_bytes: int) -> tuple[str, int]:
    """A rotary core's cos and sin tables, [1, 1, N, dims / 2] each in the compute dtype: specc's torch layers build
    them once per call for all layers of one configuration (dims, theta, scaling) and the rotations keep them."""
    a = op.attrs
    if not a.rope_dims or getattr(a, "cross", False):
        return "", 0
    return repr((a.rope_dims, a.rope_theta, a.rope_scaling, a.rope_interleaved)), ins[0][1] * a.rope_dims * elem_bytes


def _kv_width(a: Any) -> int:
    """K and V elements per key that the SDPA call reads (what context parallelism rings): MLA's are kv_b's
    per-head expansion, [k_nope | rotary key] and v, as Megatron-Core's MLA hands them to its core attention."""
    if isinstance(a, LatentAttentionAttrs):
        return a.heads * (a.head_dim + a.v_head_dim)
    return 2 * a.kv_heads * a.head_dim


def _width(g: LayerGraph, attention: str) -> int:
    """Residual width: the output width of the projection that consumes the attention core."""
    for succ in g.graph.successors(attention):
        return int(g.op(succ).attrs.out_features)
    raise ValueError(f"{attention} has no output projection")
