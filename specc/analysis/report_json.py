"""The JSON form of a report. Keys are stable and documented; FLOPs and bytes are integers."""

from __future__ import annotations

from typing import Any

from . import constants as C
from .op_costs import Totals

SCHEMA_VERSION = 1


def totals_dict(t: Totals, split: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {
        "total": t.total,
        "matmul": t.total_matmul,
        "nonmatmul": t.total_other,
        "by_category": t.by_category(),
    }
    if split:
        d["matmul_by_category"] = {c: t.matmul[c] for c in t.categories()}
        d["nonmatmul_by_category"] = {c: t.other[c] for c in t.categories()}
    return d


def report_dict(r: Any) -> dict[str, Any]:
    s = r.settings
    forward = totals_dict(r.forward)
    forward["per_layer"] = {
        stack: {"layers": n, **totals_dict(t, split=False)} for stack, (n, t) in r.per_layer.items()
    }
    flops: dict[str, Any] = {
        "forward": forward,
        "causal_useful": totals_dict(r.useful, split=False),
        "training": {
            "total": r.training_flops,
            "multiplier": C.TRAINING_MULTIPLIER[s.recompute],
            "recompute": s.recompute,
        },
        "attention_crossover": {"seq": r.crossover[0], "seq_causal_useful": r.crossover[1]},
    }
    if r.per_kind is not None:
        forward["per_kind"] = {name: k.to_dict() for name, k in r.per_kind.items()}
    if r.decode is not None:
        flops["decode_step"] = {"kv_len": s.kv_len, **totals_dict(r.decode, split=False)}
    d: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "spec": {"name": r.name, "family": r.family, "task": r.task},
        "settings": {
            "batch": s.batch,
            "seq": s.seq,
            "dec_seq": s.dec_seq,
            "dtype": s.dtype,
            "bytes_per_element": s.bytes,
            "training": s.training,
            "recompute": s.recompute,
            "kv_len": s.kv_len,
        },
        "params": r.params.to_dict(),
        "flops": flops,
        "attention": {"shapes": [m.to_dict() for m in r.shapes]},
        "memory": dict(r.memory),
        "conventions": dict(C.CONVENTIONS),
        "notes": list(r.notes),
    }
    if r.recurrent is not None:
        d["recurrent"] = dict(r.recurrent)
    if r.device is not None and r.prefill is not None:
        need = r.memory["training_total"] if s.training else r.memory["inference_total"]
        d["roofline"] = {
            "device": r.device.to_dict(),
            "ridge_intensity": r.device.peak(s.dtype) / r.device.bandwidth,
            "required_bytes": need,
            "fits": need <= r.device.memory,
            "prefill": r.prefill.to_dict(),
            **({"decode_step": r.decode_phase.to_dict()} if r.decode_phase is not None else {}),
        }
    return d


def flatten(d: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted keys (``flops.forward.by_category.qk``) and leaf values; list items are indexed."""
    out: list[tuple[str, Any]] = []
    if isinstance(d, dict):
        for k, v in d.items():
            out += flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += flatten(v, f"{prefix}.{i}")
    else:
        out.append((prefix, d))
    return out
