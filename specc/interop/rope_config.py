"""RoPE of a Hugging Face config → specc's ``position:`` mapping, for every family that rotates q/k.

Both dialects: ``rope_theta`` + ``rope_scaling`` (as the hub's config.json files carry them) and transformers 5's
``rope_parameters``, flat or per layer type (``{"full_attention": {...}, "sliding_attention": {...}}``). Each
scaling type takes the fields transformers' ``ROPE_INIT_FUNCTIONS`` read, with their defaults; any other field
is refused at its line in the file, never guessed.
"""

from __future__ import annotations

import math
from typing import Any

from .hf_config import HFConfig

# HF parameter → specc scaling field, per rope type (HF reads no other field of that type).
_FIELDS: dict[str, dict[str, str]] = {
    "default": {},
    "linear": {"factor": "factor"},
    "dynamic": {"factor": "factor"},
    "llama3": {
        "factor": "factor",
        "low_freq_factor": "low_freq_factor",
        "high_freq_factor": "high_freq_factor",
        "original_max_position_embeddings": "original_max_positions",
    },
    "yarn": {
        "factor": "factor",
        "original_max_position_embeddings": "original_max_positions",
        "beta_fast": "beta_fast",
        "beta_slow": "beta_slow",
        "mscale": "mscale",
        "mscale_all_dim": "mscale_all_dim",
        "attention_factor": "attention_factor",
        "truncate": "truncate",
    },
    "longrope": {
        "short_factor": "short_factor",
        "long_factor": "long_factor",
        "original_max_position_embeddings": "original_max_positions",
        "factor": "factor",
        "attention_factor": "attention_factor",
    },
}
_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
# Fields a type does not read in transformers (its validation warns and moves on): they leave the function alone.
_UNREAD = {"dynamic": {"original_max_position_embeddings"}}


def rope_position(cfg: HFConfig, layer_type: str | None = None, theta: float = 10000.0) -> dict[str, Any]:
    """The ``position:`` mapping of the layers of ``layer_type`` (None: a config with one RoPE for all layers);
    ``theta``: the family's base when the config states none (HF's ``default_theta``)."""
    cfg.ignore("original_max_position_embeddings")  # read below where a type uses it; otherwise unused by HF
    params, key, nested = _params(cfg, layer_type)
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise cfg.refuse(f"{key}.rope_type", f"expected a name, got {kind!r}")
    if kind not in _FIELDS:
        raise cfg.refuse(
            f"{key}.rope_type",
            f"RoPE type {kind!r} has no counterpart in specc",
            f"supported: {', '.join(_FIELDS)}",
        )
    fields = _FIELDS[kind]
    extra = set(params) - _COMMON - set(fields) - _UNREAD.get(kind, set())
    if extra:
        name = sorted(extra)[0]
        raise cfg.refuse(f"{key}.{name}", f"RoPE {kind} has no parameter {name!r} that specc can express")
    if "rope_theta" in params:
        theta = _positive(cfg, f"{key}.rope_theta", params["rope_theta"])
    else:
        theta = _positive(cfg, "rope_theta", cfg.number("rope_theta", theta))
    if "partial_rotary_factor" in params:
        fraction = _positive(cfg, f"{key}.partial_rotary_factor", params["partial_rotary_factor"])
    else:
        fraction = _positive(cfg, "partial_rotary_factor", cfg.number("partial_rotary_factor", 1.0))
    out: dict[str, Any] = {"type": "rotary", "theta": theta}
    if fraction != 1.0:
        out["fraction"] = fraction
    if kind != "default":
        out["scaling"] = _scaling(cfg, kind, params, key, nested)
    return out


def _params(cfg: HFConfig, layer_type: str | None) -> tuple[dict[str, Any], str, bool]:
    """The RoPE parameters that apply, the config key they come from, and whether they are per layer type."""
    params = cfg.mapping("rope_parameters")
    if params is not None:
        per_type = {k for k, v in params.items() if isinstance(v, dict)}
        if per_type:
            if layer_type is None or layer_type not in params:
                want = f"layer type {layer_type!r}" if layer_type else "one RoPE for every layer"
                raise cfg.refuse(
                    "rope_parameters",
                    f"RoPE parameters are given per layer type ({', '.join(sorted(per_type))}), not for {want}",
                )
            return dict(params[layer_type]), f"rope_parameters.{layer_type}", True
        return dict(params), "rope_parameters", False
    return dict(cfg.mapping("rope_scaling") or {}), "rope_scaling", False


def _scaling(cfg: HFConfig, kind: str, params: dict[str, Any], key: str, nested: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind}
    for hf, ours in _FIELDS[kind].items():
        if params.get(hf) is not None:
            out[ours] = _value(cfg, f"{key}.{hf}", params[hf], ours)
    n = cfg.positive_int("max_position_embeddings")
    if kind == "dynamic":
        out["original_max_positions"] = n  # transformers' dynamic NTK grows past max_position_embeddings
    if kind in ("llama3", "yarn", "longrope"):
        top = cfg.get("original_max_position_embeddings")
        if top is not None and not nested:  # transformers prefers the top-level field (Phi-3)
            out["original_max_positions"] = _value(cfg, "original_max_position_embeddings", top, "original")
        out.setdefault("original_max_positions", n)
    if kind == "yarn":
        out.setdefault("factor", n / out["original_max_positions"])
        for beta in ("beta_fast", "beta_slow"):
            if not out.get(beta):  # transformers: `get(beta) or default`
                out.pop(beta, None)
        if nested:  # transformers reads `truncate` from the outer rope_parameters, where it never is
            out["truncate"] = True
    if kind in ("linear", "dynamic", "llama3") and "factor" not in out:
        raise cfg.refuse(f"{key}.factor", f"RoPE {kind} needs a factor")
    if kind == "llama3":
        for hf in ("low_freq_factor", "high_freq_factor"):
            if hf not in out:
                raise cfg.refuse(f"{key}.{hf}", f"RoPE llama3 needs {hf}")
    if kind == "longrope":
        for hf in ("short_factor", "long_factor"):
            if hf not in out:
                raise cfg.refuse(f"{key}.{hf}", f"RoPE longrope needs {hf}")
    return out


def _value(cfg: HFConfig, key: str, v: Any, ours: str) -> Any:
    if ours == "truncate":
        if not isinstance(v, bool):
            raise cfg.refuse(key, f"expected true or false, got {v!r}")
        return v
    if ours in ("short_factor", "long_factor"):
        if not isinstance(v, list) or not all(_number(x) for x in v):
            raise cfg.refuse(key, "expected a list of numbers")
        return [float(x) for x in v]
    if ours in ("original_max_positions", "original"):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise cfg.refuse(key, f"expected a positive whole number, got {v!r}")
        return v
    if ours in ("mscale", "mscale_all_dim") and _number(v) and v == 0:
        return 0.0  # transformers treats 0 as absent
    return _positive(cfg, key, v)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _positive(cfg: HFConfig, key: str, v: Any) -> float:
    if not _number(v) or not v > 0:
        raise cfg.refuse(key, f"expected a positive number, got {v!r}")
    return float(v)
