"""The specc PyTorch runtime: one step function per op kind and an executor that runs a layer graph.

This file imports only torch and the standard library, because ``specc compile --target python`` copies it
into a standalone ``model.py``. The graph arrives as plain data (``Graph``: ops in topological order, each
with its scope name, kind, inputs, attributes and parameters). ``Model`` installs one parameter holder per op
at its dotted scope name, so ``state_dict()`` keys are the IR's parameter names, then precompiles the walk
into a flat list of closures (one per op) so a forward costs one Python call per op and nothing else.
Intermediate values are freed after their last use. Attention runs through SDPA (``is_causal`` when the mask
is purely causal, boolean masks otherwise); linear layers pick their kernel in ``dense`` (oneDNN for fp32 CPU
inference GEMMs, row-split batched GEMVs while decoding, F.linear otherwise).

Conventions (see specc/ir/ops.py): linear weights are [out, in]; self-attention reads a packed
``[q heads | k heads | v heads]`` projection, cross-attention ``q`` and a packed ``[k | v]``; an optional last
attention input is the key padding mask [B, N_k] (1 = keep); RoPE is the GPT-NeoX half split; MoE expert
weights are [E, out, in].
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


class Op(NamedTuple):
    name: str  # scope name: blocks.3.attn.qkv
    kind: str  # op kind of the catalogue: linear, attention, ...
    inputs: tuple[str, ...]  # names of the ops / graph inputs it reads, in order
    attrs: dict[str, Any]
    params: dict[str, tuple[tuple[int, ...], str]]  # local name → (shape, init rule)
    stack: str | None = None  # encoder | decoder | None: ops of one stack share sequence length and masks


class Graph(NamedTuple):
    meta: dict[str, Any]  # model-wide facts: task, dtype, init_std, residual_std, seed, ...
    inputs: dict[str, tuple[tuple[Any, ...], str, bool]]  # graph input → (symbolic shape, dtype, optional)
    outputs: dict[str, str]  # output name → op name
    ops: list[Op]


Step = Callable[..., Tensor]  # step(ctx, *input values) → output value


class Context:
    """State shared by the steps of one call: decoding cache, position offset, and values computed once."""

    def __init__(self, training: bool, impl: str, cache: Cache | None = None, record: dict | None = None):
        self.training = training
        self.impl = impl  # "sdpa" (fused kernels) | "math" (explicit softmax; can record probabilities)
        self.cache = cache
        self.offset = cache.length if cache is not None else 0  # positions already in the cache
        self.parts = torch.get_num_threads() if cache is not None else 1  # row blocks of decoding GEMVs
        # oneDNN's linear has no autograd and is opaque to tracing: only for plain inference calls.
        plain = not torch.is_grad_enabled() and not torch.compiler.is_compiling()
        self.onednn = ONEDNN_LINEAR if plain else None
        self.record = record
        self.memo: dict[Any, Any] = {}  # masks and position tables, shared by all layers of this call


class Cache:
    """Decoding state: preallocated K/V per self-attention op, recurrent decoder states, encoder values."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self.kv: dict[str, tuple[Tensor, Tensor]] = {}
        self.rnn: dict[str, dict[str, Any]] = {}
        self.static: dict[str, Tensor | None] = {}  # values the decoding steps read but never change

    def update(self, name: str, k: Tensor, v: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """Write the new keys/values at ``offset``; return views of everything cached so far."""
        if name not in self.kv:
            shape = (k.shape[0], k.shape[1], self.max_len, k.shape[3])
            self.kv[name] = (k.new_empty(shape), v.new_empty(shape))
        ck, cv = self.kv[name]
        end = offset + k.shape[2]
        ck[:, :, offset:end] = k
        cv[:, :, offset:end] = v
        return ck[:, :, :end], cv[:, :, :end]


# ================================================================================= parameter holders


class Scope(nn.Module):
    """One level of the dotted scope hierarchy (``blocks``, ``blocks.3``, ``blocks.3.attn``)."""


class Params(nn.Module):
    """The parameters of one op under the IR's local names; a dotted local name makes a child holder."""

    def __init__(self, params: dict[str, tuple[tuple[int, ...], str]]):
        super().__init__()
        for local, (shape, _) in params.items():
            *path, leaf = local.split(".")
            owner: nn.Module = self
            for part in path:
                if part not in owner._modules:
                    owner.add_module(part, Params({}))
                owner = owner._modules[part]
            owner.register_parameter(leaf, nn.Parameter(torch.empty(shape)))


RNN_CLASSES = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}


def make_module(op: Op) -> nn.Module | None:
    """The module holding an op's parameters (nn.GRU/LSTM/RNN for ``rnn``: its names are the IR's)."""
    if op.kind == "rnn":
        a = op.attrs
        return RNN_CLASSES[a["cell"]](
            a["input_size"], a["hidden"], a["layers"], batch_first=True, bidirectional=a["bidirectional"]
        )
    return Params(op.params) if op.params else None


def _install(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    node = root
    for part in parents:
        if part not in node._modules:
            node.add_module(part, Scope())
        node = node._modules[part]
    if leaf in node._modules:
        raise ValueError(f"scope {path} is both an op and a parent of ops")
    node.add_module(leaf, module)


def _param_ref(model: nn.Module, full_name: str) -> tuple[nn.Module, str]:
    """(module, local name) of a parameter: read at call time, so reloading or moving weights is seen."""
    owner, _, local = full_name.rpartition(".")
    return model.get_submodule(owner), local


def _weight(op: Op, m: nn.Module | None, model: nn.Module) -> tuple[nn.Module, str]:
    tied = op.attrs.get("tied_to")
    if tied:
        return _param_ref(model, tied)
    assert m is not None
    return m, "weight"


# ================================================================================= steps, one per op kind

MAKERS: dict[str, Callable[[Op, Any, nn.Module], Step]] = {}


def maker(kind: str) -> Callable[[Callable[[Op, Any, nn.Module], Step]], Callable[[Op, Any, nn.Module], Step]]:
    def register(fn: Callable[[Op, Any, nn.Module], Step]) -> Callable[[Op, Any, nn.Module], Step]:
        MAKERS[kind] = fn
        return fn

    return register


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "tanh": torch.tanh,
}


@maker("embedding")
def _embedding(op: Op, m: Any, model: nn.Module) -> Step:
    owner, local = _weight(op, m, model)
    scale = float(op.attrs.get("scale", 1.0))

    def embedding(ctx: Context, ids: Tensor) -> Tensor:
        x = F.embedding(ids, getattr(owner, local))
        return x * scale if scale != 1.0 else x

    return embedding


@maker("type_embedding")
def _type_embedding(op: Op, m: Any, model: nn.Module) -> Step:
    def type_embedding(ctx: Context, x: Tensor, types: Tensor | None) -> Tensor:
        return x + (m.weight[0] if types is None else F.embedding(types, m.weight))  # no ids: all type 0

    return type_embedding


@maker("learned_pos")
def _learned_pos(op: Op, m: Any, model: nn.Module) -> Step:
    def learned_pos(ctx: Context, x: Tensor) -> Tensor:
        return x + m.weight[ctx.offset : ctx.offset + x.shape[1]]

    return learned_pos


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(same)."""
    inv = torch.exp(torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) * (-math.log(1e4) / dim))
    angles = positions.float()[:, None] * inv[None, :]
    return torch.stack((angles.sin(), angles.cos()), -1).flatten(-2)[:, :dim]


@maker("sinusoidal_pos")
def _sinusoidal_pos(op: Op, m: Any, model: nn.Module) -> Step:
    dim = op.attrs["dim"]

    def sinusoidal_pos(ctx: Context, x: Tensor) -> Tensor:
        pos = torch.arange(x.shape[1], device=x.device) + ctx.offset
        return x + sinusoids(pos, dim).to(x.dtype)

    return sinusoidal_pos


@maker("patch_embed")
def _patch_embed(op: Op, m: Any, model: nn.Module) -> Step:
    patch, bias = op.attrs["patch"], op.attrs.get("bias")

    def patch_embed(ctx: Context, pixels: Tensor) -> Tensor:
        x = F.conv2d(pixels, m.weight, m.bias if bias else None, stride=patch)  # kernel = stride = patch
        return x.flatten(2).transpose(1, 2)  # [B, grid², dim], patches in row-major order

    return patch_embed


@maker("cls_token")
def _cls_token(op: Op, m: Any, model: nn.Module) -> Step:
    def cls_token(ctx: Context, x: Tensor) -> Tensor:
        return torch.cat((m.token.expand(x.shape[0], -1, -1), x), 1)

    return cls_token


@maker("learned_pos_2d")
def _learned_pos_2d(op: Op, m: Any, model: nn.Module) -> Step:
    grid, dim, cls = op.attrs["grid"], op.attrs["dim"], op.attrs.get("cls")

    def learned_pos_2d(ctx: Context, x: Tensor) -> Tensor:
        pos = (m.row[:, None, :] + m.col[None, :, :]).reshape(grid * grid, dim)  # patch (i, j): row[i] + col[j]
        return x + (torch.cat((m.cls, pos)) if cls else pos)

    return learned_pos_2d


@maker("sinusoidal_pos_2d")
def _sinusoidal_pos_2d(op: Op, m: Any, model: nn.Module) -> Step:
    grid, dim, cls = op.attrs["grid"], op.attrs["dim"], op.attrs.get("cls")

    def sinusoidal_pos_2d(ctx: Context, x: Tensor) -> Tensor:
        idx = torch.arange(grid, device=x.device)
        rows = sinusoids(idx, dim // 2)[:, None, :].expand(grid, grid, -1)  # first half encodes the row
        cols = sinusoids(idx, dim - dim // 2)[None, :, :].expand(grid, grid, -1)  # second half the column
        pos = torch.cat((rows, cols), -1).reshape(grid * grid, dim)
        if cls:
            pos = torch.cat((pos.new_zeros(1, dim), pos))
        return x + pos.to(x.dtype)

    return sinusoidal_pos_2d


@maker("layernorm")
def _layernorm(op: Op, m: Any, model: nn.Module) -> Step:
    shape, eps, bias = (op.attrs["dim"],), op.attrs["eps"], op.attrs.get("bias")

    def layernorm(ctx: Context, x: Tensor) -> Tensor:
        return F.layer_norm(x, shape, m.weight, m.bias if bias else None, eps)

    return layernorm


@maker("rmsnorm")
def _rmsnorm(op: Op, m: Any, model: nn.Module) -> Step:
    shape, eps = (op.attrs["dim"],), op.attrs["eps"]

    def rmsnorm(ctx: Context, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, shape, m.weight, eps)
        h = x.float()  # half precision: normalise in fp32, scale after casting back (as LLaMA does)
        return m.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    return rmsnorm


FEW_ROWS = 8  # up to this many tokens a linear layer is a weight-streaming GEMV


def onednn_linear() -> Callable[..., Tensor] | None:
    """oneDNN's linear (the kernel inductor uses on x86 CPUs) if this torch build has it and it agrees with
    F.linear. On CPUs where MKL's sgemm avoids AVX-512 (AMD) it runs fp32 GEMMs about twice as fast."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        x, w, b = torch.randn(3, 5), torch.randn(4, 5), torch.randn(4)
        if not torch.allclose(op(x, w, b, "none", [], ""), F.linear(x, w, b), atol=1e-5):
            return None
    except (AttributeError, RuntimeError):
        return None
    _count_flops(op)
    return lambda x, w, b: op(x, w, b, "none", [], "")


def _count_flops(op: Any) -> None:
    """Let torch.utils.flop_counter.FlopCounterMode count oneDNN's linear as it counts F.linear: 2·M·K·N."""
    from torch.utils import flop_counter

    if op in flop_counter.flop_registry:  # registered by another copy of this runtime (a model.py)
        return

    @flop_counter.register_flop_formula(op)
    def linear_flops(x_shape: Any, w_shape: Any, *args: Any, **kwargs: Any) -> int:
        return 2 * math.prod(x_shape[:-1]) * x_shape[-1] * w_shape[0]


# Probed once at import, outside any FlopCounterMode (a counter built later sees the registered formula).
ONEDNN_LINEAR = onednn_linear()


def dense(ctx: Context, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x @ wᵀ + b, by the fastest kernel that applies.

    Decoding a few tokens is a weight-streaming GEMV that MKL runs on one core at about half the memory
    bandwidth: a batched matmul over ``ctx.parts`` row blocks of w (views, no copies) streams on every core.
    Larger fp32 CPU inference GEMMs go to oneDNN when available; everything else (training, tracing, other
    devices and dtypes) to F.linear.
    """
    k = ctx.parts
    # The split only pays for a CPU GEMV with enough output rows per thread (and cannot split fewer than k).
    if k == 1 or x.device.type != "cpu" or w.shape[0] < 8 * k or x.numel() > FEW_ROWS * x.shape[-1]:
        fast = ctx.onednn
        if fast is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous():
            return fast(x, w, b)
        return F.linear(x, w, b)
    rows = x.reshape(-1, x.shape[-1])
    n_out = w.shape[0]
    main = n_out - n_out % k
    y = torch.bmm(w[:main].view(k, main // k, -1), rows.t().expand(k, -1, -1))  # [k, main / k, rows]
    y = y.permute(2, 0, 1).reshape(rows.shape[0], main)
    if main < n_out:
        y = torch.cat((y, F.linear(rows, w[main:])), 1)
    if b is not None:
        y = y + b
    return y.view(*x.shape[:-1], n_out)


@maker("linear")
def _linear(op: Op, m: Any, model: nn.Module) -> Step:
    owner, local = _weight(op, m, model)
    bias = op.attrs.get("bias")

    def linear(ctx: Context, x: Tensor) -> Tensor:
        return dense(ctx, x, getattr(owner, local), m.bias if bias else None)

    return linear


@maker("activation")
def _activation(op: Op, m: Any, model: nn.Module) -> Step:
    fn = ACTIVATIONS[op.attrs["fn"]]

    def activation(ctx: Context, x: Tensor) -> Tensor:
        return fn(x)

    return activation


@maker("glu")
def _glu(op: Op, m: Any, model: nn.Module) -> Step:
    fn = ACTIVATIONS[op.attrs["fn"]]

    def glu(ctx: Context, gate: Tensor, up: Tensor) -> Tensor:
        return fn(gate) * up

    return glu


@maker("add")
def _add(op: Op, m: Any, model: nn.Module) -> Step:
    p = op.attrs.get("dropout", 0.0)

    def add(ctx: Context, x: Tensor, branch: Tensor) -> Tensor:
        return x + (F.dropout(branch, p, True) if p and ctx.training else branch)

    return add


@maker("dropout")
def _dropout(op: Op, m: Any, model: nn.Module) -> Step:
    p = op.attrs["p"]

    def dropout(ctx: Context, x: Tensor) -> Tensor:
        return F.dropout(x, p, True) if ctx.training else x

    return dropout


@maker("pool")
def _pool(op: Op, m: Any, model: nn.Module) -> Step:
    mean = op.attrs["mode"] == "mean"

    def pool(ctx: Context, x: Tensor) -> Tensor:
        return x.mean(1) if mean else x[:, 0]

    return pool


# ----------------------------------------------------------------------------------------- attention


def _structure(kind: str, q_pos: Tensor, k_pos: Tensor, attrs: dict[str, Any]) -> Tensor:
    """[N_q, N_k] boolean visibility of the structural mask (True = may attend)."""
    q, k = q_pos[:, None], k_pos[None, :]
    if kind == "causal":
        return k <= q
    if kind == "sliding_window":
        return (k <= q) & (k > q - attrs["window"])  # `window` keys back, self included
    if kind == "prefix":
        return k <= q.clamp(min=attrs["prefix"] - 1)  # the prefix sees itself whole; the rest is causal
    return torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)


def attention_mask(
    ctx: Context, op: Op, n_q: int, n_k: int, pad: Tensor | None, device: torch.device
) -> tuple[Tensor | None, bool]:
    """(boolean mask [B|1, 1, N_q, N_k] or None, is_causal) of an attention op; built once per call and stack."""
    attrs = op.attrs
    cross = attrs.get("cross", False)
    key = ("mask", op.stack, cross, pad is None, attrs["mask"], attrs.get("window"), attrs.get("prefix"))
    if key in ctx.memo:
        return ctx.memo[key]
    kind = "none" if cross or attrs["mask"] == "padding" else attrs["mask"]  # padding comes from `pad` alone
    if pad is None and kind == "none":
        out: tuple[Tensor | None, bool] = (None, False)
    elif pad is None and kind == "causal" and ctx.offset == 0:
        out = (None, True)  # purely causal: let SDPA pick its fused causal kernel
    elif pad is None and kind == "causal" and n_q == 1:
        out = (None, False)  # one new token after the cache sees every cached key
    else:
        q_pos = torch.arange(n_q, device=device) + ctx.offset
        allowed = _structure(kind, q_pos, torch.arange(n_k, device=device), attrs)[None, None]
        if pad is not None:
            allowed = allowed & pad[:, None, None, :].bool()
            allowed = allowed | ~allowed.any(-1, keepdim=True)  # rows of padded queries: avoid NaN, ignored
        out = (allowed, False)
    ctx.memo[key] = out
    return out


def rotary(ctx: Context, x: Tensor, dims: int, theta: float, stack: str | None) -> Tensor:
    """RoPE on the first ``dims`` dims of each head of x [B, H, N, D] (GPT-NeoX half split)."""
    key = ("rope", stack, dims, theta, x.dtype)
    if key not in ctx.memo:
        pos = torch.arange(x.shape[2], device=x.device, dtype=torch.float32) + ctx.offset
        inv = theta ** (-torch.arange(0, dims, 2, device=x.device, dtype=torch.float32) / dims)
        angles = pos[:, None] * inv[None, :]
        ctx.memo[key] = (angles.cos().to(x.dtype), angles.sin().to(x.dtype))
    cos, sin = ctx.memo[key]
    half = dims // 2
    x1, x2 = x[..., :half], x[..., half:dims]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
    return rotated if dims == x.shape[-1] else torch.cat((rotated, x[..., dims:]), -1)


def math_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, scale: float, p: float
) -> tuple[Tensor, Tensor]:
    """softmax(q kᵀ · scale + mask) v, explicitly: returns (output, probabilities [B, H, N_q, N_k])."""
    if k.shape[1] != q.shape[1]:  # GQA: query head j reads kv head j // group, as SDPA's enable_gqa does
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.matmul(F.dropout(probs, p, True) if p else probs, v), probs


@maker("attention")
def _attention(op: Op, m: Any, model: nn.Module) -> Step:
    a, name = op.attrs, op.name
    h, kv, hd, scale = a["heads"], a["kv_heads"], a["head_dim"], a["scale"]
    cross, rope, theta, has_pad = a.get("cross", False), a.get("rope_dims", 0), a.get("rope_theta"), a["padding"]
    p_drop = a.get("dropout", 0.0)

    def attention(ctx: Context, *xs: Tensor) -> Tensor:
        x = xs[0]
        b, n = x.shape[0], x.shape[1]
        if cross:  # q [B, N_q, H·D] and packed kv [B, N_k, 2·KV·D]
            q = x.view(b, n, h, hd).transpose(1, 2)
            packed = xs[1].view(b, xs[1].shape[1], 2 * kv, hd).transpose(1, 2)
            k, v = packed[:, :kv], packed[:, kv:]
        else:  # packed [q heads | k heads | v heads]: views, no copies
            packed = x.view(b, n, h + 2 * kv, hd).transpose(1, 2)
            q, k, v = packed[:, :h], packed[:, h : h + kv], packed[:, h + kv :]
            if rope:
                q, k = rotary(ctx, q, rope, theta, op.stack), rotary(ctx, k, rope, theta, op.stack)
            if ctx.cache is not None:
                k, v = ctx.cache.update(name, k, v, ctx.offset)
        pad = xs[-1] if has_pad else None
        mask, causal = attention_mask(ctx, op, n, k.shape[2], pad, x.device)
        p = p_drop if ctx.training else 0.0
        if ctx.impl == "math" or ctx.record is not None:
            y, probs = math_attention(q, k, v, mask, causal, scale, p)
            if ctx.record is not None:
                ctx.record[name] = probs.detach()
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal, scale=scale, enable_gqa=kv != h
            )
        return y.transpose(1, 2).reshape(b, n, h * hd)

    return attention


# ----------------------------------------------------------------------------------- mixture of experts


@maker("moe")
def _moe(op: Op, m: Any, model: nn.Module) -> Step:
    a = op.attrs
    n_exp, active, normalize, dim = a["experts"], a["active"], a["normalize"], a["dim"]
    act, swiglu, bias = ACTIVATIONS[a["activation"]], a["expert"] == "swiglu", a.get("bias")

    def expert(ctx: Context, e: int, x: Tensor) -> Tensor:
        if swiglu:
            g = dense(ctx, x, m.w_gate[e], m.b_gate[e] if bias else None)
            u = dense(ctx, x, m.w_up[e], m.b_up[e] if bias else None)
            return dense(ctx, act(g) * u, m.w_down[e], m.b_down[e] if bias else None)
        h = act(dense(ctx, x, m.w_in[e], m.b_in[e] if bias else None))
        return dense(ctx, h, m.w_out[e], m.b_out[e] if bias else None)

    def moe(ctx: Context, x: Tensor, router_logits: Tensor) -> Tensor:
        tokens = x.reshape(-1, dim)
        gates = router_logits.reshape(-1, n_exp).float().softmax(-1)
        weights, chosen = gates.topk(active, -1)  # [T, A]
        if normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights.to(x.dtype)
        if torch.compiler.is_compiling():
            # Traced graphs cannot have data-dependent shapes: run every expert on every token, keep the chosen.
            combine = torch.zeros(tokens.shape[0], n_exp, dtype=x.dtype, device=x.device)
            combine = combine.scatter(1, chosen, weights)
            out = sum(combine[:, e, None] * expert(ctx, e, tokens) for e in range(n_exp))
            return out.reshape(x.shape)
        # Dispatch: sort the T·A (token, expert) assignments by expert, run each expert once on its tokens.
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        token_of = order // active
        counts = torch.bincount(flat, minlength=n_exp).tolist()  # the one host sync per layer
        routed = tokens[token_of]
        out_sorted = torch.empty_like(routed)
        start = 0
        for e, count in enumerate(counts):
            if count:
                out_sorted[start : start + count] = expert(ctx, e, routed[start : start + count])
                start += count
        out_sorted = out_sorted * weights.reshape(-1)[order, None]
        return torch.zeros_like(tokens).index_add_(0, token_of, out_sorted).reshape(x.shape)

    return moe


# ----------------------------------------------------------------------------------------- recurrent


@maker("rnn")
def _rnn(op: Op, m: Any, model: nn.Module) -> Step:
    def rnn(ctx: Context, x: Tensor, pad: Tensor | None = None) -> Tensor:
        if pad is None:
            return m(x)[0]
        lengths = pad.sum(1).cpu()  # right padding: the first `length` tokens of each row are real
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return nn.utils.rnn.pad_packed_sequence(m(packed)[0], batch_first=True, total_length=x.shape[1])[0]

    return rnn


CELLS = {"gru": torch.gru_cell, "lstm": torch.lstm_cell, "rnn": torch.rnn_tanh_cell}


@maker("rnn_decoder")
def _rnn_decoder(op: Op, m: Any, model: nn.Module) -> Step:
    a, name = op.attrs, op.name
    cell, layers, hidden, attn = CELLS[a["cell"]], a["layers"], a["hidden"], a["attention"]
    lstm, two_way = a["cell"] == "lstm", a.get("enc_directions", 1) == 2

    def cell_weights(k: int) -> tuple[Tensor, ...]:
        return tuple(getattr(m, f"{w}_l{k}") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def begin(enc: Tensor, pad: Tensor | None) -> dict[str, Any]:
        """Initial state: s_0 = tanh(bridge(h_final)) in every layer; keys of the attention precomputed."""
        b, n = enc.shape[0], enc.shape[1]
        last = pad.sum(1) - 1 if pad is not None else torch.full((b,), n - 1, device=enc.device)
        h_final = enc[torch.arange(b, device=enc.device), last]
        if two_way:  # forward direction ends at the last real token, backward at the first
            h_final = torch.cat((h_final[:, :hidden], enc[:, 0, hidden:]), -1)
        s0 = torch.tanh(F.linear(h_final, m.bridge.weight, m.bridge.bias))
        state: dict[str, Any] = {"h": [s0] * layers, "c": [torch.zeros_like(s0)] * layers, "context": h_final}
        if attn == "bahdanau":
            state["keys"] = F.linear(enc, m.attn_key.weight, m.attn_key.bias)  # U h_i + b, once
        elif attn == "luong_general":
            state["keys"] = F.linear(enc, m.attn_general.weight)  # W h_i, so score = s · (W h_i)
        elif attn == "luong_dot":
            state["keys"] = enc
        return state

    def attend(state: dict[str, Any], s: Tensor, enc: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor]:
        if attn == "bahdanau":  # e_i = vᵀ tanh(W s + U h_i)
            e = F.linear(torch.tanh(state["keys"] + F.linear(s, m.attn_query.weight)[:, None]), m.attn_v.weight)[..., 0]
        else:  # Luong: e_i = s · h_i (dot) or s · W h_i (general)
            e = torch.bmm(state["keys"], s[:, :, None])[..., 0]
        if pad is not None:
            e = e.masked_fill(pad == 0, float("-inf"))
        probs = e.float().softmax(-1).to(enc.dtype)
        return torch.bmm(probs[:, None], enc)[:, 0], probs

    def rnn_decoder(ctx: Context, y: Tensor, enc: Tensor, pad: Tensor | None = None) -> Tensor:
        state = ctx.cache.rnn.get(name) if ctx.cache is not None else None
        if state is None:
            state = begin(enc, pad)
            if ctx.cache is not None:
                ctx.cache.rnn[name] = state
        h, c = list(state["h"]), list(state["c"])
        outputs, maps = [], []
        for t in range(y.shape[1]):  # recurrence: one step per target token
            context = state["context"]
            if attn == "bahdanau":  # attend with s_{t-1}, feed the context into the cell
                context, probs = attend(state, h[-1], enc, pad)
                maps.append(probs)
            inp = y[:, t] if attn.startswith("luong") else torch.cat((y[:, t], context), -1)
            for k in range(layers):
                if lstm:
                    h[k], c[k] = cell(inp, (h[k], c[k]), *cell_weights(k))
                else:
                    h[k] = cell(inp, h[k], *cell_weights(k))
                inp = h[k]
            if attn.startswith("luong"):  # attend with s_t, after the cell
                context, probs = attend(state, h[-1], enc, pad)
                maps.append(probs)
            outputs.append(torch.cat((h[-1], context), -1))
        state["h"], state["c"] = h, c
        if ctx.record is not None and maps:
            ctx.record[name] = torch.stack(maps, 1).detach()  # [B, N_dec, N]
        return torch.stack(outputs, 1)

    return rnn_decoder


# ================================================================================= the executor


class Model(nn.Module):
    """Runs a layer graph. ``run(inputs)`` returns every graph output; subclasses give ``forward`` its signature.

    Attention goes through ``F.scaled_dot_product_attention``; set ``attention_impl = "math"`` for the explicit
    softmax path, or use ``with model.attention_maps() as maps:`` to record attention probabilities.
    """

    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.attention_impl = "sdpa"
        self._record: dict[str, Tensor] | None = None
        for op in graph.ops:
            module = make_module(op)
            if module is not None:
                _install(self, op.name, module)
        self._build_plans()

    # -- plans: the graph walk precompiled into (name, step, inputs, values to free) tuples ---------------

    def _build_plans(self) -> None:
        self._plans: dict[str, Any] = {"full": self._plan(self.graph.ops, keep=set(self.graph.outputs.values()))}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_plans", None)  # closures point at this instance's modules: rebuilt on unpickle / deepcopy
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._build_plans()

    def _plan(self, ops: list[Op], keep: set[str], last_only: str | None = None) -> list[tuple]:
        last_use: dict[str, int] = {}
        for i, op in enumerate(ops):
            for value in op.inputs:
                last_use[value] = i
        produced = {op.name for op in ops}
        steps = []
        for i, op in enumerate(ops):
            module = self.get_submodule(op.name) if op.params or op.kind == "rnn" else None
            fn = MAKERS[op.kind](op, module, self)
            if op.name == last_only:
                fn = _on_last_position(fn)
            free = [v for v in dict.fromkeys(op.inputs) if last_use[v] == i and v in produced and v not in keep]
            if op.name not in last_use and op.name not in keep:
                free.append(op.name)
            steps.append((op.name, fn, op.inputs, tuple(free)))
        return steps

    def _execute(self, steps: list[tuple], env: dict[str, Any], ctx: Context) -> dict[str, Any]:
        for name, fn, args, free in steps:
            env[name] = fn(ctx, *[env[a] for a in args])
            for value in free:
                del env[value]
        return env

    def run(self, inputs: dict[str, Tensor | None]) -> dict[str, Tensor]:
        """Run the whole graph on named inputs (missing optional inputs are None); returns outputs by name."""
        env: dict[str, Any] = {name: inputs.get(name) for name in self.graph.inputs}
        ctx = Context(self.training, self.attention_impl, record=self._record)
        env = self._execute(self._plans["full"], env, ctx)
        return {out: env[op] for out, op in self.graph.outputs.items()}

    @contextlib.contextmanager
    def attention_maps(self) -> Iterator[dict[str, Tensor]]:
        """Record attention probabilities of every call inside the block, on the explicit math path.

        Yields a dict filled by scope name: attention ops give [B, H, N_q, N_k], ``rnn_decoder`` ops
        [B, N_dec, N] (the alignment a_{t,i} of Bahdanau / Luong attention).
        """
        maps: dict[str, Tensor] = {}
        saved = self._record
        self._record = maps
        try:
            yield maps
        finally:
            self._record = saved

    # -- incremental decoding ---------------------------------------------------------------------------

    @property
    def step_input(self) -> str:
        """The graph input that grows by one token per generated token."""
        return "decoder_input_ids" if "decoder_input_ids" in self.graph.inputs else "input_ids"

    def growing_inputs(self) -> list[str]:
        """Other graph inputs laid out along the generated sequence (a decoder's attention_mask)."""
        shape = self.graph.inputs[self.step_input][0]
        return [n for n, i in self.graph.inputs.items() if n != self.step_input and tuple(i[0]) == tuple(shape)]

    def _decoding_plans(self) -> tuple[list[tuple], list[tuple], list[str]]:
        if "decoding" not in self._plans:
            moving = {self.step_input, *self.growing_inputs()}
            static_ops, step_ops = [], []
            for op in self.graph.ops:
                depends = any(i in moving for i in op.inputs)
                (step_ops if depends else static_ops).append(op)
                if depends:
                    moving.add(op.name)
            static_values = {op.name for op in static_ops} | (set(self.graph.inputs) - moving)
            needed = sorted({i for op in step_ops for i in op.inputs if i in static_values})
            logits = self.graph.outputs["logits"]
            self._plans["decoding"] = (
                self._plan(static_ops, keep=set(needed)),
                self._plan(step_ops, keep={logits}, last_only=logits),
                needed,
            )
        return self._plans["decoding"]

    def max_positions(self) -> int | None:
        """Longest sequence the learned position tables cover (None: unbounded)."""
        sizes = [op.attrs["positions"] for op in self.graph.ops if op.kind == "learned_pos"]
        return min(sizes) if sizes else None

    def start(self, inputs: dict[str, Tensor | None], max_len: int) -> Cache:
        """Run what does not depend on the generated tokens (the encoder, cross-attention K/V) once."""
        static_steps, _, needed = self._decoding_plans()
        cache = Cache(max_len)
        env: dict[str, Any] = {name: inputs.get(name) for name in self.graph.inputs}
        env = self._execute(static_steps, env, Context(False, self.attention_impl))
        cache.static = {name: env.get(name) for name in needed}
        return cache

    def step(self, cache: Cache, tokens: Tensor, **growing: Tensor | None) -> Tensor:
        """Feed new tokens [B, n] after the cached ones; returns the logits of the last position [B, 1, V]."""
        _, step_steps, _ = self._decoding_plans()
        env: dict[str, Any] = dict(cache.static)
        env[self.step_input] = tokens
        for name in self.growing_inputs():
            env[name] = growing.get(name)
        ctx = Context(False, self.attention_impl, cache=cache)
        env = self._execute(step_steps, env, ctx)
        cache.length += tokens.shape[1]
        return env[self.graph.outputs["logits"]]


def _on_last_position(fn: Step) -> Step:
    def last_position(ctx: Context, x: Tensor, *rest: Tensor) -> Tensor:
        return fn(ctx, x[:, -1:], *rest)  # during decoding only the next token's logits are needed

    return last_position


class CausalLM(Model):
    """Decoder-only language model: ``forward(input_ids, attention_mask=None)`` → logits [B, N, V]."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.run({"input_ids": input_ids, "attention_mask": attention_mask})["logits"]

    def generate(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
        return generate(self, input_ids, max_new_tokens, **options)


class Encoder(Model):
    """Encoder: ``forward(input_ids, attention_mask=None, token_type_ids=None)`` → MLM logits [B, N, V] when the
    graph has an LM head, else the dict of its outputs (``last_hidden_state`` and, pooled, ``pooler_output``)."""

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor | dict[str, Tensor]:
        out = self.run({"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids})
        return out.get("logits", out)


class Seq2Seq(Model):
    """Encoder-decoder: ``forward(input_ids, decoder_input_ids, attention_mask=None)`` → logits [B, N_dec, V]."""

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        inputs = {"input_ids": input_ids, "decoder_input_ids": decoder_input_ids, "attention_mask": attention_mask}
        return self.run(inputs)["logits"]

    def generate(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
        return generate(self, input_ids, max_new_tokens, **options)


class ImageClassifier(Model):
    """ViT: ``forward(pixel_values)`` → class logits [B, classes] when the graph has a classifier head, else
    the dict of its outputs (``last_hidden_state`` and, pooled, ``pooler_output``)."""

    def forward(self, pixel_values: Tensor) -> Tensor | dict[str, Tensor]:
        out = self.run({"pixel_values": pixel_values})
        return out.get("logits", out)


TASKS: dict[str, type[Model]] = {
    "causal_lm": CausalLM,
    "masked_lm": Encoder,
    "pooled_encoder": Encoder,
    "encoder": Encoder,
    "seq2seq": Seq2Seq,
    "image_classification": ImageClassifier,
    "image_encoder": ImageClassifier,
}


# ================================================================================= weights


def init_parameters(model: Model) -> None:
    """Deterministic initialisation from ``meta`` (seed, init_std, residual_std) and each parameter's rule.

    Values are drawn on the CPU in fp32 from one seeded generator in graph order, so a seed gives the same
    weights on every device and dtype.
    """
    meta = model.graph.meta
    gen = torch.Generator().manual_seed(int(meta.get("seed", 0)))
    with torch.no_grad():
        for op in model.graph.ops:
            for local, (shape, rule) in op.params.items():
                param = model.get_parameter(f"{op.name}.{local}")
                if rule == "zeros":
                    param.zero_()
                elif rule == "ones":
                    param.fill_(1.0)
                else:
                    t = torch.empty(shape)
                    if rule == "rnn":  # PyTorch's recurrent default, U(±1/√H)
                        bound = 1.0 / math.sqrt(op.attrs["hidden"])
                        t.uniform_(-bound, bound, generator=gen)
                    else:
                        std = meta["residual_std"] if rule == "residual" else meta["init_std"]
                        t.normal_(0.0, std, generator=gen)
                    param.copy_(t)


def create(
    graph: Graph,
    tensors: dict[str, Tensor] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> Model:
    """Build the model on the meta device, then materialise it with ``tensors`` (by name) or a seeded init."""
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype or DTYPES[graph.meta.get("dtype", "fp32")]
    device = torch.device(device or "cpu")
    with torch.device("meta"):
        model = TASKS[graph.meta["task"]](graph).to(dtype)
    if device.type == "meta":
        return model.eval()
    if tensors is not None:
        model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}, assign=True)
    else:
        model.to_empty(device=device)
        init_parameters(model)
    return model.eval()


def example_inputs(graph: Graph, batch: int = 1, length: int = 8, seed: int = 0) -> dict[str, Tensor]:
    """Random values for the required graph inputs (ids below the vocabulary, pixels ~ N(0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    sizes = {"B": batch, "N": length, "N_dec": length}
    out = {}
    for name, (shape, dtype, optional) in graph.inputs.items():
        if optional:
            continue
        dims = [sizes[d] if isinstance(d, str) else d for d in shape]
        if dtype == "int64":
            vocab = graph.meta.get("target_vocab_size") if name == "decoder_input_ids" else None
            out[name] = torch.randint(0, vocab or graph.meta["vocab_size"], dims, generator=gen)
        else:
            out[name] = torch.randn(dims, generator=gen)
    return out


# ================================================================================= generation


class GenerationError(ValueError):
    """A generation request the model cannot serve (e.g. longer than its learned positions)."""


def pick_tokens(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """Next token per row of logits [B, V]: greedy at temperature 0, else sampled after top-k / top-p."""
    if not temperature:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@torch.no_grad()  # not inference_mode: the returned ids may feed a model that trains
def generate(
    model: Model,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    attention_mask: Tensor | None = None,
    decoder_input_ids: Tensor | None = None,
    decoder_start_token_id: int = 1,  # specc's <bos> (specc train: <pad> 0, <bos> 1, <eos> 2)
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Extend a sequence token by token; returns it with the new tokens appended.

    Decoders extend ``input_ids`` (left-to-right prompt); encoder-decoders read ``input_ids`` as the source and
    extend ``decoder_input_ids`` (default: one ``decoder_start_token_id`` per row). With ``use_cache`` the prompt
    runs once and each step feeds one token against preallocated K/V caches; without it every step recomputes
    the whole sequence (the reference the cache is tested against). Sampling is seeded by ``seed``; the model
    runs in eval mode (no dropout) throughout.
    """
    seq2seq = model.step_input == "decoder_input_ids"
    if seq2seq and decoder_input_ids is None:
        decoder_input_ids = torch.full((input_ids.shape[0], 1), decoder_start_token_id, device=input_ids.device)
    prompt = decoder_input_ids if seq2seq else input_ids
    assert prompt is not None
    b, n0 = prompt.shape
    total = n0 + max_new_tokens
    limit = model.max_positions()
    if limit is not None and total > limit:
        raise GenerationError(f"{n0} prompt + {max_new_tokens} new tokens exceed the {limit} learned positions")
    tokens = prompt.new_empty(b, total)  # preallocated: each step writes one column
    tokens[:, :n0] = prompt
    mask = None
    if attention_mask is not None and not seq2seq:  # a decoder's mask grows with the sequence
        mask = attention_mask.new_ones(b, total)
        mask[:, :n0] = attention_mask
    growing = dict.fromkeys(model.growing_inputs(), mask)

    def logits_up_to(n: int, cache: Cache | None) -> Tensor:
        """Logits of position n-1: one cached step (the whole prompt first), or a full recomputation."""
        if cache is not None:
            grown = {k: v[:, :n] if v is not None else None for k, v in growing.items()}
            return model.step(cache, tokens[:, cache.length : n], **grown)
        if seq2seq:
            inputs = {"input_ids": input_ids, "decoder_input_ids": tokens[:, :n], "attention_mask": attention_mask}
        else:
            inputs = {"input_ids": tokens[:, :n], "attention_mask": mask[:, :n] if mask is not None else None}
        return model.run(inputs)["logits"]

    gen = torch.Generator(prompt.device).manual_seed(seed) if seed is not None else None
    done = torch.zeros(b, dtype=torch.bool, device=prompt.device) if eos_token_id is not None else None
    n = n0
    with eval_mode(model):
        cache = model.start({"input_ids": input_ids, "attention_mask": attention_mask}, total) if use_cache else None
        while n < total:
            nxt = pick_tokens(logits_up_to(n, cache)[:, -1], temperature, top_k, top_p, gen)
            if done is not None:
                nxt = nxt.masked_fill(done, eos_token_id)
                done |= nxt == eos_token_id
            tokens[:, n] = nxt
            n += 1
            if done is not None and bool(done.all()):
                break
    return tokens[:, :n]
