"""RoPE: inverse frequencies (plain and scaled), the cos/sin scale, and the rotation of q/k heads.

The frequency math is written once here, as transformers' ``ROPE_INIT_FUNCTIONS`` compute it (same formulas,
same fp32 operations), and the ONNX backend builds its tables with these same functions, so the two backends
cannot drift. ``scaling`` is the IR's ``rope_scaling`` attribute: ``None`` (plain RoPE) or a dict with a
``type`` (linear | dynamic | llama3 | yarn | longrope) and that type's parameters, defaults resolved by lowering.
Two types depend on the sequence length L = largest position + 1 of a call: dynamic (NTK: the base grows once L
exceeds ``original_max_positions``) and longrope (``long_factor`` beyond ``original_max_positions``, else
``short_factor``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .state import State


def plain_inv_freq(dims: int, theta: float | Tensor) -> Tensor:
    """1 / theta^(2i / dims) for i < dims / 2, fp32."""
    return 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))


def _yarn_inv_freq(dims: int, theta: float, s: dict[str, Any]) -> Tensor:
    factor, original = s["factor"], s["original_max_positions"]

    def correction(rotations: float) -> float:  # the dim at which a frequency turns `rotations` times
        return (dims * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction(s["beta_fast"]), correction(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    high = high + 0.001 if low == high else high  # no singular ramp
    ramp = torch.clamp((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dims, 2).float() / dims)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _llama3_inv_freq(dims: int, theta: float, s: dict[str, Any]) -> Tensor:
    inv = plain_inv_freq(dims, theta)
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_positions"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def static_inv_freq(dims: int, theta: float, scaling: dict[str, Any] | None, long: bool = False) -> Tensor:
    """Inverse frequencies that do not depend on the length (dynamic: those up to the original context;
    longrope: the short factors, or the long ones with ``long``)."""
    kind = scaling["type"] if scaling else None
    if kind == "linear":
        return plain_inv_freq(dims, theta) / scaling["factor"]  # type: ignore[index]
    if kind == "llama3":
        return _llama3_inv_freq(dims, theta, scaling)  # type: ignore[arg-type]
    if kind == "yarn":
        return _yarn_inv_freq(dims, theta, scaling)  # type: ignore[arg-type]
    if kind == "longrope":
        ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)  # type: ignore[index]
        return 1.0 / (ext * theta ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
    if kind == "dynamic":  # the base as NTK scaling computes it at the original context (a no-op growth)
        f, n = scaling["factor"], scaling["original_max_positions"]  # type: ignore[index]
        return plain_inv_freq(dims, theta * ((f * n / n) - (f - 1)) ** (dims / (dims - 2)))
    return plain_inv_freq(dims, theta)


def dynamic_base(dims: int, theta: float, scaling: dict[str, Any], length: Tensor) -> Tensor:
    """NTK base for a call of ``length`` (int64 scalar) keys: theta · (f·L/n - (f-1))^(d/(d-2)), L ≥ n, fp32."""
    f, n = scaling["factor"], scaling["original_max_positions"]
    length = torch.maximum(length, torch.tensor(n, dtype=length.dtype, device=length.device))
    return theta * ((f * length / n) - (f - 1)) ** (dims / (dims - 2))


def inv_freq_at(dims: int, theta: float, scaling: dict[str, Any] | None, length: Tensor) -> Tensor:
    """Inverse frequencies of a call whose largest position is ``length`` - 1 (traceable: no branching)."""
    kind = scaling["type"] if scaling else None
    if kind == "dynamic":
        n = scaling["original_max_positions"]  # type: ignore[index]
        grown = 1.0 / (dynamic_base(dims, theta, scaling, length) ** (torch.arange(0, dims, 2).float() / dims))  # type: ignore[arg-type]
        return torch.where(length > n, grown.to(length.device), static_inv_freq(dims, theta, scaling).to(length.device))
    inv = static_inv_freq(dims, theta, scaling).to(length.device)
    if kind == "longrope":
        long = static_inv_freq(dims, theta, scaling, long=True).to(length.device)
        return torch.where(length > scaling["original_max_positions"], long, inv)  # type: ignore[index]
    return inv


def attention_factor(scaling: dict[str, Any] | None) -> float:
    """The scale of cos and sin (yarn's mscale, longrope's √(1 + ln f / ln n)); 1 for the other types."""
    kind = scaling["type"] if scaling else None
    if kind not in ("yarn", "longrope"):
        return 1.0
    assert scaling is not None
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]
    if kind == "longrope":
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(scaling["original_max_positions"]))

    def mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return float(mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"]))
    return mscale(factor)


def by_length(scaling: dict[str, Any] | None) -> bool:
    """Whether the frequencies depend on the call's length."""
    return bool(scaling) and scaling["type"] in ("dynamic", "longrope")  # type: ignore[index]


class Rotary(nn.Module):
    """RoPE on the first ``dims`` dims of each q/k head: the two halves rotated together (GPT-NeoX, Llama) or,
    ``interleaved``, adjacent pairs (GPT-J); cos/sin built once per call."""

    def __init__(self, dims: int, theta: float = 10000.0, interleaved: bool = False):
        super().__init__()
        self.dims, self.theta, self.interleaved = dims, theta, interleaved
        self.key = ("rope", dims, theta, interleaved)

    def inv_freq(self, pos: Tensor) -> Tensor:
        """Inverse frequencies [dims / 2] of a call at positions ``pos``."""
        return plain_inv_freq(self.dims, self.theta).to(pos.device)

    def tables(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin [B | 1, 1, N, dims / 2] at int positions [B | 1, N], in ``dtype``."""
        angles = pos.float()[:, None, :, None] * self.inv_freq(pos)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, q: Tensor, k: Tensor, state: State | None) -> tuple[Tensor, Tensor]:
        key = (*self.key, q.dtype)
        if state is None or key not in state.memo:
            tables = self.tables((State() if state is None else state).positions(q.shape[2], q.device), q.dtype)
            if state is None:
                return self.rotate(q, *tables), self.rotate(k, *tables)
            state.memo[key] = tables
        return self.rotate(q, *state.memo[key]), self.rotate(k, *state.memo[key])

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        d = self.dims
        if self.interleaved:  # pairs (x[2i], x[2i+1]) turn by frequency i
            x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
            turned = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
            return torch.cat((turned, x[..., d:]), -1)
        x1, x2, rest = x[..., : d // 2], x[..., d // 2 : d], x[..., d:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), -1)

    def extra_repr(self) -> str:
        extra = f", scaling={self.scaling['type']}" if getattr(self, "scaling", None) else ""
        return f"dims={self.dims}, theta={self.theta:g}{extra}{', interleaved=True' if self.interleaved else ''}"


class Temperature(nn.Module):
    """Llama 4's attention temperature tuning, in RoPE's place in a layer without it: q × (1 + scale ·
    log(1 + floor((p + 1) / floor))) at index p (the cache counted, as transformers numbers it), k unchanged."""

    def __init__(self, floor: int, scale: float = 0.1):
        super().__init__()
        self.floor, self.scale = floor, scale

    def forward(self, q: Tensor, k: Tensor, state: State | None) -> tuple[Tensor, Tensor]:
        offset = state.offset if state is not None else 0
        p = torch.arange(offset, offset + q.shape[2], device=q.device).float()
        factor = torch.log1p(torch.floor((p + 1.0) / self.floor)) * self.scale + 1.0  # [N], fp32
        return (q * factor[:, None]).to(q.dtype), k

    def extra_repr(self) -> str:
        return f"floor={self.floor}, scale={self.scale:g}"


class ScaledRotary(Rotary):
    """Rotary with frequency ``scaling`` (linear | dynamic | llama3 | yarn | longrope) and the cos/sin scale
    yarn and longrope apply."""

    def __init__(self, dims: int, theta: float = 10000.0, scaling: dict[str, Any] | None = None, interleaved=False):
        super().__init__(dims, theta, interleaved)
        self.scaling, self.scale = scaling, attention_factor(scaling)
        self.key = (*self.key, repr(scaling))

    def inv_freq(self, pos: Tensor) -> Tensor:
        if by_length(self.scaling):
            return inv_freq_at(self.dims, self.theta, self.scaling, pos.max() + 1)
        return static_inv_freq(self.dims, self.theta, self.scaling).to(pos.device)

    def tables(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        cos, sin = super().tables(pos, torch.float32)
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return cos.to(dtype), sin.to(dtype)
