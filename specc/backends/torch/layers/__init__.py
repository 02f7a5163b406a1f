"""The layer library of generated models: standard torch modules do the rest.

Each file but ``extras`` imports only torch and the standard library (and its siblings), because ``specc
compile --target python`` copies the definitions a model uses into its standalone model.py.
"""

from __future__ import annotations

from .activations import QuickGELU
from .attention import (
    AlibiAttention,
    AttentionCore,
    CrossAttention,
    LatentAttention,
    SelfAttention,
    SinkAttention,
    SoftcapAttention,
    WindowedAttention,
)
from .audio import FrameConv1d, SinusoidTable, whisper_sinusoids
from .contrastive import Contrastive
from .embed import (
    ClsToken,
    LearnedPositions,
    LearnedPositions2d,
    OffsetPositions,
    PatchEmbed,
    Probe,
    RMSNorm,
    SinusoidalPositions,
    SinusoidalPositions2d,
    TypeEmbedding,
    scaled,
    sinusoids,
)
from .extras import Override, SpeccModel, generate, math_attention, overrides
from .generation import GenerationError, pick_tokens
from .linear import SpanBiasLinear
from .model import Model
from .moe import MoE
from .norms import OffsetRMSNorm, SliceRMSNorm
from .relative import BiasedAttention, RelativeBias, relative_buckets
from .rnn import RNNDecoder, rnn_states
from .rope import Rotary, ScaledRotary, Temperature
from .state import KVCache, State, last_positions, reuse

# Files in dependency order: model.py inlines the definitions it uses in this order (never ``extras``).
FILES = (
    "state",
    "rope",
    "attention",
    "relative",
    "linear",
    "embed",
    "audio",
    "norms",
    "contrastive",
    "activations",
    "moe",
    "rnn",
    "generation",
    "model",
    "hf",
)

__all__ = [
    "AlibiAttention",
    "AttentionCore",
    "BiasedAttention",
    "ClsToken",
    "Contrastive",
    "CrossAttention",
    "FrameConv1d",
    "GenerationError",
    "KVCache",
    "LatentAttention",
    "LearnedPositions",
    "LearnedPositions2d",
    "OffsetPositions",
    "MoE",
    "Model",
    "OffsetRMSNorm",
    "Override",
    "PatchEmbed",
    "Probe",
    "QuickGELU",
    "RMSNorm",
    "RNNDecoder",
    "RelativeBias",
    "Rotary",
    "ScaledRotary",
    "SelfAttention",
    "SinkAttention",
    "SinusoidalPositions",
    "SinusoidalPositions2d",
    "SinusoidTable",
    "SpanBiasLinear",
    "SliceRMSNorm",
    "SoftcapAttention",
    "Temperature",
    "WindowedAttention",
    "SpeccModel",
    "State",
    "TypeEmbedding",
    "generate",
    "last_positions",
    "math_attention",
    "overrides",
    "pick_tokens",
    "relative_buckets",
    "reuse",
    "rnn_states",
    "scaled",
    "sinusoids",
    "whisper_sinusoids",
]
