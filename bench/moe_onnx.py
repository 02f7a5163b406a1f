"""Sparse vs dense MoE in ONNX (ORT CPU EP) on a Mixtral-like decoder: 8 SwiGLU experts, 2 active per token.

Used by bench/bench_onnx.py (its ``--moe-only`` runs just this part). Both graphs come from the same spec and
weights (``export_onnx(moe="sparse" | "dense")``), are checked against the torch backend's logits and timed
round-robin with idle gaps in the same run (bench_onnx.interleaved), so their ratio is measured under the
same load.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Mixtral-8x7B's shape (8 SwiGLU experts, top-2, GQA 4:1, RMSNorm, rotary, vocab 32000), scaled down so that
# a run takes minutes on 2 busy cores: D 384, expert hidden 1344 (Mixtral's 3.5·D), 8 blocks.
SPEC = ["d_model=384", "blocks=8", "attention.heads=8", "attention.kv_heads=2", "mlp.hidden=1344",
        "context=1024", "dtype=fp32"]  # fmt: skip
QUICK = ["d_model=128", "blocks=2", "attention.heads=4", "attention.kv_heads=1", "mlp.hidden=448",
         "context=256", "dtype=fp32"]  # fmt: skip


def moe_rows(
    threads: int, quick: bool, seq: int, session: Callable[[Path, int], Any], interleaved: Callable[..., dict]
) -> tuple[list[tuple[str, str, str]], str]:
    """Table rows (measurement, value, ratio) and a one-line description of the spec."""
    import torch

    import specc

    spec = specc.load_spec("mixtral-8x7b", QUICK if quick else SPEC)
    model = specc.build_torch(spec)
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    ids = torch.randint(0, spec.vocab_size, (1, seq), generator=torch.Generator().manual_seed(0))
    feed = {"input_ids": ids.numpy(), "attention_mask": np.ones((1, seq), np.int64)}
    with torch.inference_mode():
        want = model(ids).float().numpy()
    del model
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {
            form: session(specc.export_onnx(spec, Path(tmp) / f"{form}.onnx", weights=weights, moe=form), threads)
            for form in ("sparse", "dense")
        }
    del weights
    diffs = {form: float(np.abs(s.run(["logits"], feed)[0] - want).max()) for form, s in sessions.items()}
    rounds, warmup = (2, 1) if quick else (6, 1)
    t = interleaved({form: (lambda s=s: s.run(None, feed)) for form, s in sessions.items()}, rounds, warmup)
    m = spec.mlp
    rows = [
        (f"MoE forward B=1 N={seq} fp32: ORT sparse (routed experts only)", f"{t['sparse'] * 1e3:.1f} ms",
         f"{t['dense'] / t['sparse']:.2f}× dense"),
        ("MoE forward: ORT dense (every expert on every token)", f"{t['dense'] * 1e3:.1f} ms", "1.00× dense"),
        ("max |ORT − torch| logits: sparse / dense", f"{diffs['sparse']:.1e} / {diffs['dense']:.1e}", ""),
    ]  # fmt: skip
    desc = (
        f"Mixtral-like: {spec.blocks} blocks, D {spec.d_model}, {m.experts} SwiGLU experts of hidden {m.hidden}, "
        f"{m.active} active, GQA {spec.attention.heads}:{spec.attention.kv_heads}, vocab {spec.vocab_size}"
    )
    return rows, desc
