"""Per-element FLOP constants, dtype sizes and the conventions every report states.

Non-matmul costs are conventions, not measurements: one FLOP per add / multiply / divide / compare, and one
per transcendental (exp, tanh, erf, rsqrt). They are small next to the matmuls; they are stated so that the
numbers can be reproduced.
"""

from __future__ import annotations

from ..spec.schema import DTYPE_BYTES  # noqa: F401  (re-exported: reports state sizes per dtype)

MASK_BYTES = 1  # a dropout mask element (torch stores bool)
STAT_BYTES = 4  # fused attention keeps one fp32 log-sum-exp per query row and head
OPTIMIZER = "Adam"

# Normalisation, per element: LayerNorm = mean (1) + centre (1) + square (1) + variance sum (1) + scale by
# rsqrt (1) + γ (1) [+ β (1)]; RMSNorm = square (1) + sum (1) + scale by rsqrt (1) + γ (1).
LAYERNORM = 6
LAYERNORM_BIAS = 1
RMSNORM = 4
UNIT_OFFSET = 1  # per weight element: the (1 + weight) of a unit-offset RMSNorm

# Softmax, per score: max (1) + subtract (1) + exp (1) + sum (1) + divide (1); plus the 1/√d_H scale (1).
SOFTMAX = 5
SCORE_SCALE = 1
SOFTCAP = 3  # per capped element: cap · tanh(x / cap) = divide, tanh, multiply
ALIBI = 1  # per score: the bias add (the bias itself is built once per call)
SINK = SOFTMAX  # per (query row, head): the sink's logit is one more softmax column
CLAMPED_SWIGLU = 8  # per hidden element: min, clamp (2), α·gate, σ, gate·σ, up + 1, product (GPT-OSS)

# Elementwise activations, per element.
ACTIVATION = {
    "relu": 1,
    "gelu": 5,  # 0.5·x·(1 + erf(x/√2)): divide, erf, add, two multiplies
    "gelu_tanh": 9,  # 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): x², x³, ×c, +x, ×c, tanh, +1, ×x, ×0.5
    "silu": 4,  # x / (1 + exp(−x)): negate, exp, add, divide
    "quick_gelu": 5,  # x / (1 + exp(−1.702·x)): scale, negate, exp, add, divide (CLIP)
    "sigmoid": 4,
    "tanh": 1,
}
GLU_PRODUCT = 1  # fn(gate) · up
GATE_PRODUCT = 1  # sigmoid(gate) · x of a gated shared expert, per element of x
SCALE = 1  # x · factor (logit scale)

RESIDUAL = 1  # x + branch
BIAS = 1  # per output element of a linear (FlopCounterMode ignores it: counted as non-matmul)
POSITION_ADD = 1  # learned or sinusoidal table added to x
POSITION_2D_ADD = 2  # row and column tables
ROPE = 3  # per rotated element: x·cos + rotate_half(x)·sin
TEMPERATURE = 1  # per q element: times its position's temperature factor (Llama 4's NoPE layers)
EMBED_SCALE = 1  # embedding × scale when the scale is not 1
MEAN_POOL = 1  # per element summed
L2_NORMALIZE = 3  # per element: square, sum, divide (and one square root per row)
LOGIT_SCALE = 1  # per image-text logit: × exp(logit_scale) (+ 1 for the logit bias)

# Mixture of experts.
MOE_COMBINE = 2  # per (token, active expert, channel): gate weight × expert output, summed
MOE_RENORMALISE = 1  # per (token, active expert) when the top-k gates are renormalised

# Recurrent cells, per hidden unit and step, both bias vectors included.
# GRU: ih+hh adds for r, z (2), r·hh_n + add (2), sigmoid r, z (8), tanh n (1), (1−z)·n + z·h (4), biases (6).
# LSTM: ih+hh adds (4), biases (8), three sigmoids (12), two tanh (2), f·c + i·g (3), o·tanh(c) (1).
# Elman: add (1), biases (2), tanh (1).
RNN_CELL = {"gru": 23, "lstm": 30, "rnn": 4}
ADDITIVE_SCORE = 2  # Bahdanau: per (step, source position, attention unit) add + tanh

TRAINING_MULTIPLIER = {"none": 3, "selective": 3, "full": 4}

CONVENTIONS = {
    "flop": "1 FLOP = one add or multiply; a multiply-accumulate = 2 FLOPs; matmul [M,K]×[K,N] = 2·M·K·N",
    "matmul": (
        "matmul FLOPs count what torch.utils.flop_counter.FlopCounterMode counts on the emitted model "
        "(linear, conv, QKᵀ and AV at 2·B·H·N_q·N_k·D_H each; bias adds excluded; causal masks not halved)"
    ),
    "non_matmul": (
        "non-matmul FLOPs per element: layernorm 6 (+1 with β), rmsnorm 4 (+1 per weight with a unit offset), "
        "softmax 5 + 1 for the 1/√D_H scale per score (+3 when the scores are soft-capped, +1 for an ALiBi bias; "
        "5 per query row and head for an attention sink), softcap 3 (÷c, "
        "tanh, ×c), logit scale 1, gated shared expert 4 per gate (sigmoid) + 1 per element, relu 1, gelu 5, "
        "gelu_tanh 9, silu 4, quick_gelu 5, tanh 1, GLU product 1, clamped SwiGLU 8 (GPT-OSS), residual add 1, "
        "bias 1, position add 1 (2-D: 2), rope 3 per rotated element, embedding scale 1; MoE combine 2 per "
        "(token, expert, channel), router softmax 5 per logit; RNN cells per unit and step: GRU 23, LSTM 30, "
        "Elman 4; transcendentals count 1; lookups, dropout (inference) and top-k selection count 0"
    ),
    "causal": (
        "masked attention is reported twice: full (every (query, key) pair, as FlopCounterMode counts it) "
        "and causal-useful (visible pairs only: N(N+1)/2 per head for a causal mask, ≈ half, Megatron "
        "convention)"
    ),
    "moe": "MoE FLOPs count the active experts only (each token's top-k); params are given total and active",
    "training": "training FLOPs = 3 × forward (backward = 2 × forward); + attention core with selective "
    "recomputation; 4 × forward with full recomputation",
    "memory": (
        "weights = params × dtype bytes; training adds gradients (dtype bytes) and Adam states (fp32 master, "
        "m, v: 12 B/param in mixed precision, 8 B/param in fp32): 16 B/param in all; activations = tensors "
        "kept for the backward pass without recomputation (Korthikanti et al. 2022 accounting, summed over "
        "the graph; dropout masks 1 B/element); activations_korthikanti = s·b·h·(34 + 5·a·s/h) bytes per "
        "layer (their 16-bit formula); attention scores = B·H·N_q·N_k elements per layer when materialised "
        "vs B·H·N_q fp32 statistics when fused; KV cache = 2·layers·kv_heads·D_H·N·B·bytes"
    ),
}
