"""Rules of the ops that act on each token alone: linear, norms, activations, residual adds, pooling."""

from __future__ import annotations

from dataclasses import replace

from ...ir.ops import (
    ActivationAttrs,
    AddAttrs,
    DropoutAttrs,
    GluAttrs,
    LayerNormAttrs,
    LinearAttrs,
    PoolAttrs,
    RMSNormAttrs,
    SliceRMSNormAttrs,
)
from .. import constants as C
from .common import Attrs, Ctx, Dims, Flop, Mem, io_bytes, numel, tokens


def linear_flops(a: LinearAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    m, k, n = tokens(out), a.in_features, a.out_features
    return [Flop(matmul=2 * m * k * n, other=C.BIAS * m * a.bias_width)]


def linear_memory(a: LinearAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    k, n = a.in_features, a.out_features
    weights = k * n + a.bias_width  # a tied head reads the shared matrix all the same
    return Mem(saved=numel(ins[0]) * ctx.bytes, io=io_bytes(ins, out, ctx), weights_read=weights)


def layernorm_flops(a: LayerNormAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    per = C.LAYERNORM + (C.LAYERNORM_BIAS if a.bias else 0)
    return [Flop(other=per * numel(out))]


def rmsnorm_flops(a: RMSNormAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    offset = C.UNIT_OFFSET * a.dim if a.unit_offset else 0
    return [Flop(other=C.RMSNORM * numel(out) + offset)]


def slice_rmsnorm_flops(a: SliceRMSNormAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    offset = C.UNIT_OFFSET * a.dim if a.unit_offset else 0
    return [Flop(other=C.RMSNORM * tokens(out) * a.width + offset)]


def slice_norm_memory(a: SliceRMSNormAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """The normalised slice is kept for the backward pass of its weight (a weightless L2 norm, Llama 4's, keeps
    none); the whole packed tensor is read and rewritten. The torch layer's x² and x·rstd also keep their x: a view
    of the whole packed input in fp32, an fp32 copy of the slice otherwise; and rstd, one per row and group."""
    x = numel(ins[0]) * ctx.bytes if ctx.bytes == C.STAT_BYTES else tokens(out) * a.width * C.STAT_BYTES
    rstd = tokens(out) * (a.width // a.dim) * C.STAT_BYTES
    normalised = tokens(out) * a.width * ctx.bytes if a.affine else 0
    return Mem(saved=normalised, io=io_bytes(ins, out, ctx), weights_read=a.dim * a.affine, saved_torch=x + rstd)


def norm_memory(a: LayerNormAttrs | RMSNormAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    weights = a.dim * (2 if isinstance(a, LayerNormAttrs) and a.bias else 1)
    saved = numel(ins[0]) * ctx.bytes
    torch_extra = cpu_extra = 0
    if isinstance(a, LayerNormAttrs):  # torch's layer_norm keeps mean and rstd per row: fp32 on a GPU (its
        torch_extra = 2 * tokens(ins[0]) * C.STAT_BYTES  # accumulate type), the weights' dtype on the CPU
        cpu_extra = 2 * tokens(ins[0]) * ctx.bytes - torch_extra
    else:
        fp32, rstd = numel(ins[0]) * C.STAT_BYTES, tokens(ins[0]) * C.STAT_BYTES
        if a.unit_offset:  # the (1 + w) composite, on any device: x and x·rstd in fp32, rstd per row
            torch_extra = 2 * fp32 + rstd - saved
        elif ctx.bytes < C.STAT_BYTES:  # half precision: specc's composite on any device (x in fp32, rstd, and
            torch_extra = fp32 + rstd  # x·rstd cast back, the size of the input ``saved`` counts)
        else:  # fp32: torch's rms_norm, one fused kernel on a GPU (x and rstd), the composite on the CPU
            torch_extra, cpu_extra = rstd, 2 * fp32 - saved
    return Mem(saved=saved, io=io_bytes(ins, out, ctx), weights_read=weights, saved_torch=torch_extra,
               saved_torch_cpu=cpu_extra)  # fmt: skip


def activation_flops(a: ActivationAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.ACTIVATION[a.fn] * numel(out))]


def glu_memory(a: GluAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """Gate and up kept; torch's act(gate) · up keeps act(gate) too (a fused kernel recomputes it)."""
    return replace(elementwise_memory(a, ins, out, ctx), saved_torch=numel(out) * ctx.bytes)


def glu_flops(a: GluAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=(C.ACTIVATION[a.fn] + C.GLU_PRODUCT) * numel(out))]


def elementwise_memory(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """Activations and GLU keep their inputs for the backward pass."""
    return Mem(saved=sum(numel(s) for s in ins) * ctx.bytes, io=io_bytes(ins, out, ctx))


def scale_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.SCALE * numel(out))]


def scale_memory(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """x · a constant: its backward is the gradient times the constant, so nothing is kept."""
    return Mem(io=io_bytes(ins, out, ctx))


def softcap_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.SOFTCAP * numel(out))]


def sigmoid_gate_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.ACTIVATION["sigmoid"] * numel(ins[1]) + C.GATE_PRODUCT * numel(out))]


def add_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.RESIDUAL * numel(out))]


def add_memory(a: AddAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    mask = numel(out) if a.dropout > 0 else 0  # dropout on the branch (on the CPU: a mask of the input's dtype)
    return Mem(saved=mask * C.MASK_BYTES, io=io_bytes(ins, out, ctx), saved_torch_cpu=mask * (ctx.bytes - C.MASK_BYTES))


def dropout_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop()]  # identity in inference


def dropout_memory(a: DropoutAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """A bool mask (CUDA's native dropout); torch's CPU dropout keeps its mask in the input's dtype."""
    if a.p <= 0:
        return Mem()
    return Mem(saved=numel(out) * C.MASK_BYTES, saved_torch_cpu=numel(out) * (ctx.bytes - C.MASK_BYTES))


def pool_flops(a: PoolAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.MEAN_POOL * numel(ins[0]) if a.mode == "mean" else 0)]


def pool_memory(a: PoolAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    read = numel(ins[0]) if a.mode == "mean" else numel(out)  # cls reads one token
    return Mem(io=(read + numel(out)) * ctx.bytes)


RULES = {
    "linear": (linear_flops, linear_memory),
    "layernorm": (layernorm_flops, norm_memory),
    "rmsnorm": (rmsnorm_flops, norm_memory),
    "slice_rmsnorm": (slice_rmsnorm_flops, slice_norm_memory),
    "scale": (scale_flops, scale_memory),
    "softcap": (softcap_flops, elementwise_memory),
    "sigmoid_gate": (sigmoid_gate_flops, elementwise_memory),
    "activation": (activation_flops, elementwise_memory),
    "glu": (glu_flops, glu_memory),
    "add": (add_flops, add_memory),
    "dropout": (dropout_flops, dropout_memory),
    "pool": (pool_flops, pool_memory),
}
