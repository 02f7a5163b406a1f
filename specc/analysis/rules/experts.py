"""Rules of the mixture-of-experts op: each token runs through its top-``active`` experts only.

The attributes ``jitter`` (router-input noise) and ``aux_loss_coef`` (load-balancing loss) are ignored on
purpose: both act in training only and cost O(T·E) elementwise work (one multiply per router input element;
a mean over tokens of the router probabilities and assignments), negligible next to the experts' matmuls.
"""

from __future__ import annotations

from ...ir.ops import MoEAttrs
from .. import constants as C
from .common import Ctx, Dims, Flop, Mem, io_bytes, tokens


def _mats(a: MoEAttrs) -> int:
    return 3 if a.expert == "swiglu" else 2  # gate, up, down | in, out


def moe_flops(a: MoEAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    t, e, k, d, h = tokens(ins[0]), a.experts, a.active, a.dim, a.hidden
    routed = t * k  # (token, expert) pairs: exactly tokens × active
    swiglu = a.expert == "swiglu"
    bias = routed * (h * (2 if swiglu else 1) + d) * C.BIAS if a.bias else 0
    act = C.ACTIVATION[a.activation] + (C.GLU_PRODUCT if swiglu else 0)
    if swiglu and a.clamp_limit is not None:
        act = C.CLAMPED_SWIGLU
    router = C.SOFTMAX * t * e + (C.MOE_RENORMALISE * routed if a.normalize else 0)
    if a.score_bias:
        router += t * e  # the selection bias: one add per score
    if a.groups > 1:
        router += t * e  # group scores (a max or a top-2 sum per group) and the mask
    if a.routed_scale != 1.0:
        router += routed
    return [
        Flop(matmul=2 * routed * d * h * _mats(a), other=bias + C.MOE_COMBINE * routed * d),
        Flop("activation", other=act * routed * h),
        Flop("router", other=router),
    ]


def _expert_params(a: MoEAttrs) -> int:
    d, h, swiglu = a.dim, a.hidden, a.expert == "swiglu"
    bias = (h * (2 if swiglu else 1) + d) if a.bias else 0
    return d * h * _mats(a) + bias


def moe_memory(a: MoEAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    t, e, k, d, h = tokens(ins[0]), a.experts, a.active, a.dim, a.hidden
    routed = t * k
    saved = routed * d + routed * h * _mats(a)  # dispatched inputs, hidden activations
    probs = t * e * C.STAT_BYTES  # the router's probabilities: its softmax (or sigmoid) runs in fp32
    hidden_trip = 2 * routed * h * (_mats(a) - 1)  # expert hidden states written and read back
    touched = min(e, routed)  # experts that receive at least one token (all of them for big batches)
    # the torch layer's dispatch also keeps act(gate) (SwiGLU), the experts' outputs and their weighted copy, the
    # int64 sort order, token and top-k indices and the fp32 gate weights (per token, gathered per pair) and sums
    act = routed * h if a.expert == "swiglu" else 0
    if a.expert == "swiglu" and a.clamp_limit is not None:  # GPT-OSS: the raw gate and up (clamp's inputs),
        act += 3 * routed * h  # up + 1 and (up + 1)·gate (the products' inputs) beyond σ(α·gate)
    torch_extra = (act + 2 * routed * d) * ctx.bytes + (2 * routed + t * k) * 8 + (t * k + routed + t) * C.STAT_BYTES
    return Mem(
        saved_torch=torch_extra,
        saved=saved * ctx.bytes + probs,
        io=io_bytes(ins, out, ctx) + hidden_trip * ctx.bytes,
        weights_read=touched * _expert_params(a),
    )


RULES = {"moe": (moe_flops, moe_memory)}
