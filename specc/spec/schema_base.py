"""Building blocks of the spec language: size limits, strict scalar types, the strict base model and the
shortcut normalisers (``bias: true``, ``position: rotary``, ``dropout: 0.1``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Strict

# Generous but finite: a typo like d_model: 7680000 is an error, not an allocation attempt.
MAX_WIDTH = 1 << 17  # 131072
MAX_BLOCKS = 1024
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 24
MAX_HEADS = 4096
MAX_EXPERTS = 4096

# Integers and booleans are strict (``blocks: true`` or ``bias: 1`` is a mistake, not a value); floats stay
# lax because YAML 1.1 reads ``1e-5`` as a string.
SInt = Annotated[int, Strict()]
SBool = Annotated[bool, Strict()]
Dtype = Literal["fp32", "fp16", "bf16"]
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "quick_gelu"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


def _all_flags(fields: tuple[str, ...]):
    def expand(v: Any) -> Any:
        return dict.fromkeys(fields, v) if isinstance(v, bool) else v

    return expand


def _typed_shortcut(v: Any) -> Any:
    """``position: rotary`` → ``{type: rotary}``."""
    return {"type": v} if isinstance(v, str) else v


def _dropout_shortcut(v: Any) -> Any:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return {"embedding": v, "attention": v, "residual": v}
    return v
