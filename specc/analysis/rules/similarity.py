"""Rules of a dual encoder's scoring: L2-normalised embeddings and the image-text logits."""

from __future__ import annotations

from ...ir.ops import ContrastiveAttrs, L2NormalizeAttrs
from .. import constants as C
from .common import Attrs, Ctx, Dims, Flop, Mem, io_bytes, numel, tokens


def l2_normalize_flops(a: L2NormalizeAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop(other=C.L2_NORMALIZE * numel(out) + tokens(out))]


def contrastive_flops(a: ContrastiveAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    per = C.LOGIT_SCALE + (1 if a.logit_bias is not None else 0)
    return [Flop(matmul=2 * numel(out) * a.dim, other=per * numel(out))]


def saves_inputs(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    """Both kept for the backward pass (the norm's input, or the two embeddings of the product)."""
    return Mem(saved=sum(numel(s) for s in ins) * ctx.bytes, io=io_bytes(ins, out, ctx))


def no_flops(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    return [Flop()]  # a transpose moves no number through arithmetic


def transpose_memory(a: Attrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    return Mem(io=io_bytes(ins, out, ctx))


RULES = {
    "l2_normalize": (l2_normalize_flops, saves_inputs),
    "contrastive": (contrastive_flops, saves_inputs),
    "transpose": (no_flops, transpose_memory),
}
