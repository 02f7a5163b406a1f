"""The two ONNX forms of multi-head latent attention, timed on onnxruntime's CPU EP: ``expanded`` (kv_b expands
every cached latent to per-head K/V, then Attention with q/k heads of nope + rope, v heads of v_head_dim) and
``absorbed`` (kv_b folded into the query and the output, Attention over the cached latent as one shared K/V head).
Both are one fused ``Attention`` node per layer. A prefill of N tokens and one decode step after P cached tokens,
DeepSeek-V2-Lite's attention sizes (D 2048, 16 heads, kv_rank 512, nope 128, rope 64, v 128), 2 layers.

    python bench/mla_onnx.py [--threads 2] [--prefill 512] [--past 4096]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnxruntime as ort

import specc
from specc.backends.onnx import ops_latent

SPEC = {
    "name": "mla-bench", "kind": "decoder", "vocab_size": 1024, "context": 8192, "d_model": 2048, "blocks": 2,
    "attention": {"heads": 16,
                  "latent": {"kv_rank": 512, "rope_head_dim": 64, "nope_head_dim": 128, "v_head_dim": 128}},
    "norm": {"type": "rmsnorm"}, "position": {"type": "rotary", "rotation": "interleaved"},
    "mlp": {"type": "swiglu", "hidden": 512}, "bias": False, "tie_embeddings": True,
}  # fmt: skip


def _best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _runner(sess: ort.InferenceSession, layers: int, rng: np.random.Generator):
    """A call of ``sess`` on n new tokens after ``past`` cached (zero) ones."""
    lat = SPEC["attention"]["latent"]

    def run(n: int, past: int) -> None:
        feeds = {"input_ids": rng.integers(0, 1024, (1, n)), "attention_mask": np.ones((1, past + n), np.int64)}
        for i in range(layers):
            feeds[f"past_key_values.{i}.key"] = np.zeros((1, 1, past, lat["kv_rank"]), np.float32)
            feeds[f"past_key_values.{i}.value"] = np.zeros((1, 1, past, lat["rope_head_dim"]), np.float32)
        sess.run(["logits"], feeds)

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--past", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for form in ops_latent.FORMS:
            ops_latent.form = lambda b, f=form: f  # both graphs in one form
            path = specc.export_onnx(SPEC, Path(tmp) / f"{form}.onnx", kv_cache=True)
            sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            run = _runner(sess, SPEC["blocks"], rng)
            prefill = _best(lambda r=run: r(args.prefill, 0), args.reps)
            decode = _best(lambda r=run: r(1, args.past), args.reps * 4)
            print(f"{form:9s} prefill N={args.prefill}: {prefill * 1e3:8.2f} ms   decode step after {args.past}: "
                  f"{decode * 1e3:7.3f} ms   ({args.threads} threads)")  # fmt: skip


if __name__ == "__main__":
    main()
