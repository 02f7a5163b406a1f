"""Rules of the ops that turn inputs into token vectors: lookups, positions, patches, class token."""

from __future__ import annotations

from ...ir.ops import (
    ClsTokenAttrs,
    Conv1dAttrs,
    EmbeddingAttrs,
    LearnedPos2dAttrs,
    LearnedPosAttrs,
    PatchEmbedAttrs,
    ProbeAttrs,
    RelativeBiasAttrs,
    SinusoidTableAttrs,
    TypeEmbeddingAttrs,
)
from .. import constants as C
from .common import ID_BYTES, Attrs, Ctx, Dims, Flop, Mem, io_bytes, numel


def embedding_flops(a: EmbeddingAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.EMBED_SCALE * numel(out) if a.scale != 1.0 else 0)]


def embedding_memory(a: EmbeddingAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    rows = min(a.vocab, numel(ins[0]))
    ids = numel(ins[0]) * ID_BYTES  # the table's gradient is scattered by the ids: its backward keeps them
    return Mem(saved=ids, io=io_bytes(ins, out, ctx, int_inputs=1), weights_read=rows * a.dim)


def type_embedding_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=numel(out))]


def type_embedding_memory(a: TypeEmbeddingAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    ids = numel(ins[1]) * ID_BYTES if len(ins) > 1 else 0  # inputs: [x, token_type_ids]
    return Mem(io=io_bytes(ins[:1], out, ctx) + ids, weights_read=a.vocab * a.dim)


def position_add_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.POSITION_ADD * numel(out))]


def learned_pos_memory(a: LearnedPosAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    rows = min(a.positions, ins[0][1])
    return Mem(io=io_bytes(ins, out, ctx), weights_read=rows * a.dim)


def fixed_pos_memory(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    return Mem(io=io_bytes(ins, out, ctx))


def learned_pos_2d_flops(a: LearnedPos2dAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    cls = out[0] * out[-1] if a.cls else 0  # the class token gets one vector, patches row + column
    return [Flop(other=C.POSITION_2D_ADD * (numel(out) - cls) + C.POSITION_ADD * cls)]


def learned_pos_2d_memory(a: LearnedPos2dAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    table = (2 * a.grid + (1 if a.cls else 0)) * a.dim
    return Mem(io=io_bytes(ins, out, ctx), weights_read=table)


def patch_embed_flops(a: PatchEmbedAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    # A conv with kernel = stride = patch is a matmul [B·grid², C·p²] × [C·p², D]; FlopCounterMode counts it.
    k = a.channels * a.patch * a.patch
    bias = C.BIAS * numel(out) if a.bias else 0
    return [Flop(matmul=2 * numel(out) * k, other=bias)]


def patch_embed_memory(a: PatchEmbedAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    k = a.channels * a.patch * a.patch
    weights = a.dim * k + (a.dim if a.bias else 0)
    return Mem(saved=numel(ins[0]) * ctx.bytes, io=io_bytes(ins, out, ctx), weights_read=weights)


def conv1d_flops(a: Conv1dAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    # Each output element is a dot product over C_in · kernel inputs: FlopCounterMode's 2 · B · T_out · C_out ·
    # C_in · kernel (padding taps included, as cuDNN and FlopCounterMode count them).
    bias = C.BIAS * numel(out) if a.bias else 0
    return [Flop(matmul=2 * numel(out) * a.in_channels * a.kernel, other=bias)]


def conv1d_memory(a: Conv1dAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    weights = a.out_channels * a.in_channels * a.kernel + (a.out_channels if a.bias else 0)
    return Mem(saved=numel(ins[0]) * ctx.bytes, io=io_bytes(ins, out, ctx), weights_read=weights)


def sinusoid_table_memory(a: SinusoidTableAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    return Mem(io=io_bytes(ins, out, ctx), weights_read=min(a.positions, ins[0][1]) * a.dim)


def cls_token_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop()]


def cls_token_memory(a: ClsTokenAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    return Mem(io=io_bytes(ins, out, ctx), weights_read=a.dim)


def relative_bias_flops(a: RelativeBiasAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop("pos", other=0)]  # integer bucketing and a gather; the attention core adds the bias


def relative_bias_memory(a: RelativeBiasAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    nk = ctx.kv_len if ctx.kv_len is not None else ins[0][1]
    ids = ins[0][1] * nk * ID_BYTES  # the bucket of each query–key pair: the table's backward scatters by them
    return Mem(saved=ids, io=a.heads * ins[0][1] * nk * ctx.bytes, weights_read=a.buckets * a.heads)


def probe_memory(a: ProbeAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    return Mem(io=numel(out) * ctx.bytes, weights_read=a.dim)  # reads only the batch size of its input


RULES = {
    "relative_bias": (relative_bias_flops, relative_bias_memory),
    "embedding": (embedding_flops, embedding_memory),
    "type_embedding": (type_embedding_flops, type_embedding_memory),
    "learned_pos": (position_add_flops, learned_pos_memory),
    "sinusoid_table": (position_add_flops, sinusoid_table_memory),
    "conv1d": (conv1d_flops, conv1d_memory),
    "sinusoidal_pos": (position_add_flops, fixed_pos_memory),
    "learned_pos_2d": (learned_pos_2d_flops, learned_pos_2d_memory),
    "sinusoidal_pos_2d": (position_add_flops, fixed_pos_memory),
    "patch_embed": (patch_embed_flops, patch_embed_memory),
    "cls_token": (cls_token_flops, cls_token_memory),
    "probe": (cls_token_flops, probe_memory),
}
