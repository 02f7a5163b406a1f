"""Positions of the spec language: ``position`` (learned, sinusoidal, rotary with its rotation and frequency
scaling, none, the ViT grids)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field

from .schema_base import MAX_CONTEXT, SBool, SInt, _Strict, _typed_shortcut


class RopeScaling(_Strict):
    """RoPE frequency scaling (context extension), with the parameters and defaults of transformers'
    ``ROPE_INIT_FUNCTIONS``. Which fields each type reads is checked by a rule."""

    type: Literal["linear", "dynamic", "llama3", "yarn", "longrope"]
    factor: float | None = Field(None, gt=0, description="context extension factor (longrope: default context / "
                                 "original_max_positions)")  # fmt: skip
    original_max_positions: SInt | None = Field(
        None,
        ge=1,
        le=MAX_CONTEXT,
        description="pre-training context (llama3, yarn, longrope; dynamic, default context)",
    )
    low_freq_factor: float | None = Field(None, gt=0, description="llama3")
    high_freq_factor: float | None = Field(None, gt=0, description="llama3")
    beta_fast: float | None = Field(None, gt=0, description="yarn: default 32")
    beta_slow: float | None = Field(None, gt=0, description="yarn: default 1")
    mscale: float | None = Field(None, ge=0, description="yarn: attention factor numerator scale")
    mscale_all_dim: float | None = Field(None, ge=0, description="yarn: attention factor denominator scale")
    attention_factor: float | None = Field(
        None, gt=0, description="yarn, longrope: scale of cos/sin; default from factor (and mscale)"
    )
    truncate: SBool | None = Field(None, description="yarn: round the correction range to whole dims (default true)")
    short_factor: list[float] | None = Field(None, description="longrope: per-frequency factors up to the original "
                                             "context, head_dim·fraction/2 of them")  # fmt: skip
    long_factor: list[float] | None = Field(None, description="longrope: per-frequency factors beyond it")
    rebuild_cache: SBool | None = Field(
        None,
        description="longrope: when a generated sequence first passes original_max_positions, recompute the KV "
        "cache so that every key is rotated with the long factors (Phi-3's generate); default false",
    )


class Position(_Strict):
    type: Literal["learned", "sinusoidal", "rotary", "alibi", "relative", "none", "learned_2d", "sinusoidal_2d"] = (
        Field(
            "learned",
            description="alibi: no position vectors; each head adds slope · (k - q) to its scores (Press 2022; "
            "BLOOM, MPT, Falcon-RW). relative: each head adds a learned bias of the bucketed distance k - q "
            "(T5, Raffel 2020): bidirectional in the encoder, causal in the decoder",
        )
    )
    theta: float = Field(10000.0, gt=0, description="rotary base")
    fraction: float = Field(1.0, gt=0, le=1.0, description="rotary: fraction of head_dim rotated")
    rotation: Literal["half", "interleaved"] = Field(
        "half", description="rotary: rotate the two halves (GPT-NeoX, Llama) or adjacent pairs (GPT-J)"
    )
    scaling: RopeScaling | None = Field(None, description="rotary: frequency scaling; absent = plain RoPE")
    max_bias: float = Field(
        8.0,
        gt=0,
        le=64,
        description="alibi: head h of H (h = 1..H) has slope 2^(-max_bias·h/H) when H is a power of 2; otherwise "
        "those of the next power of 2 P, h = 2, 4, .., P then 1, 3, .., the first H (MPT's alibi_bias_max; BLOOM's "
        "and Falcon's rule is max_bias 8)",
    )
    scaled: SBool = Field(
        False, description="alibi: the bias is multiplied by the score scale too, (q·k + bias)·scale (Falcon-RW)"
    )
    bias_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="alibi: bf16 rounds the slopes and slope · position (each key's own position) to bfloat16 "
        "before the scores add them, as Falcon-RW's code does; fp32: exact",
    )
    buckets: SInt = Field(
        32, ge=4, le=4096, description="relative: distance buckets (T5's relative_attention_num_buckets)"
    )
    max_distance: SInt = Field(
        128,
        ge=1,
        le=MAX_CONTEXT,
        description="relative: distances from max_distance on share the last bucket; below it half the buckets "
        "are exact, the rest logarithmic (T5's relative_attention_max_distance)",
    )
    per_layer: SBool = Field(
        False,
        description="relative: a bias table in every self-attention layer (UMT5); default one table per stack, "
        "held by its first layer and read by all (T5, mT5)",
    )
    offset: SInt = Field(
        0,
        ge=0,
        le=MAX_CONTEXT,
        description="learned: table rows before position 0 (stored, never read by a real token; a padded one reads "
        "the row just before): OPT and BART 2, RoBERTa pad_token_id + 1",
    )
    skip_padding: SBool | None = Field(
        None,
        description="number positions by real tokens, cumsum(attention_mask) - 1 (RoBERTa, OPT), not by index; "
        "default: true for decoders (left padding), false for encoders",
    )


PositionField = Annotated[Position, BeforeValidator(_typed_shortcut, json_schema_input_type=Union[str, Position])]
