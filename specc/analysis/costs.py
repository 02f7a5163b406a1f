"""The records the op rules return, and the context they are evaluated in."""

from __future__ import annotations

from dataclasses import dataclass

Dims = tuple[int, ...]


@dataclass(frozen=True)
class Ctx:
    """How a graph is being evaluated.

    ``bytes`` is the size of one activation element (the analysis dtype). ``kv_len`` is set for a decode
    step: the keys a self-attention query sees (cache plus the new token); ``None`` means a full forward
    (prefill), where keys = queries.
    """

    bytes: int = 4
    kv_len: int | None = None

    @property
    def decode(self) -> bool:
        return self.kv_len is not None


@dataclass(frozen=True)
class Flop:
    """FLOPs of one op in one category.

    ``part`` names the category; ``None`` means the op's own category, and an attention part (``qk``, ``av``,
    ``softmax``) becomes ``cross_qk`` … when the op is cross-attention. ``matmul`` is the full count as
    ``FlopCounterMode`` counts it (2·M·K·N, masks ignored); ``*_useful`` count only visible (query, key)
    pairs of a masked attention (``None``: same as the full count).
    """

    part: str | None = None
    matmul: int = 0
    other: int = 0
    matmul_useful: int | None = None
    other_useful: int | None = None

    @property
    def useful_matmul(self) -> int:
        return self.matmul if self.matmul_useful is None else self.matmul_useful

    @property
    def useful_other(self) -> int:
        return self.other if self.other_useful is None else self.other_useful


@dataclass(frozen=True)
class Mem:
    """Bytes of one op.

    ``saved``: activations kept for the backward pass without recomputation, attention scores materialised
    (Korthikanti et al. 2022 accounting: inputs of matmuls / norms / activations, softmax output, dropout
    masks at 1 byte). ``saved_fused``: the same with fused (flash) attention (``None``: same as ``saved``).
    ``io``: activation bytes read + written by a forward of this op alone (weights excluded; attention
    fused). ``weights_read``: parameter *elements* the forward reads (a lookup reads only the rows it
    needs; a tied head reads the shared matrix; MoE reads only experts that get tokens). ``scores`` /
    ``scores_fused``: one attention score matrix if materialised / the fused kernel's per-row statistics.
    ``kv_cache``: bytes cached for generation. ``saved_torch``: what torch's eager ops, as specc's torch layers
    call them, keep beyond ``saved`` (which counts fused kernels' saves, as Megatron-Core's): a GLU's act(gate),
    the packed q|k|v a rotary attention's V still views. ``saved_torch_cpu``: what they keep beyond that on the
    CPU, where ``rms_norm`` is composite (no fused kernel): its fp32 input and normalised tensor.
    """

    saved: int = 0
    saved_fused: int | None = None
    io: int = 0
    weights_read: int = 0
    scores: int = 0
    scores_fused: int = 0
    kv_cache: int = 0
    saved_torch: int = 0
    saved_torch_cpu: int = 0
    saved_cpu_math: int = 0  # an attention core torch's CPU SDPA has no fused kernel for: its math path's, fp32

    @property
    def fused(self) -> int:
        return self.saved if self.saved_fused is None else self.saved_fused


def numel(shape: Dims) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
