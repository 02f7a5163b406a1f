"""Where an ORT forward spends its time, and what ORT fused by itself: GPT-2 small, standard vs contrib graph.

    python bench/profile_onnx.py [--seq 512] [--runs 3] [--set blocks=2] [--decode 160]

For each graph (standard ``Attention``; ``--attention contrib``: GroupQueryAttention / MultiHeadAttention and
fuse.py's SkipLayerNormalization fusions): the node counts of ORT's optimized model
(``SessionOptions.optimized_model_filepath``: what its own fusions left) and each op type's share of kernel
time over ``--runs`` forwards (``SessionOptions.enable_profiling``), B=1, fp32, CPU EP, intra-op threads =
usable cores, spinning off so the profile is the forward's alone. ``--decode P`` profiles instead one-token
steps of the KV-cache graph after a P-token cache (the bench's generation ends at 32 + 128 = 160): what a
decode step spends besides streaming the weights, and how much of ``model_run`` is kernel time (a graph whose
cache may be one buffer per layer, ``specc.kv_buffer: shared``, runs as generation runs it: IO binding).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def decode_feed(sess: Any, past: int) -> dict[str, np.ndarray]:
    """One new token after a ``past``-token cache (random values: the cost does not depend on them)."""
    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(0, 50257, (1, 1)), "attention_mask": np.ones((1, past + 1), np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            feed[i.name] = rng.standard_normal((1, i.shape[1], past, i.shape[3])).astype(np.float32)
    return feed


def profile(
    path: Path, seq: int, runs: int, threads: int, tmp: Path, past: int | None = None
) -> tuple[collections.Counter, dict, list]:
    """(optimized-model op counts, op type → share of kernel time, model_run ms per run); a decode step after a
    ``past``-token cache when given, else a B=1 forward of ``seq`` tokens."""
    import onnx
    import onnxruntime as ort

    from specc.runtime.kv_buffer import SharedKV

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.optimized_model_filepath = str(tmp / f"{path.stem}.opt.onnx")
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / path.stem)
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)
    ids = np.random.default_rng(0).integers(0, 50257, (1, seq))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)} if past is None else decode_feed(sess, past)
    run = lambda: sess.run(None, feed)
    if past is not None and sess.get_modelmeta().custom_metadata_map.get("specc.kv_buffer") == "shared":
        # as generation runs it: the cache in max-length buffers that the graph appends to in place
        pasts = {k: v for k, v in feed.items() if k.startswith("past_key_values.")}
        shared = SharedKV(sess, pasts, past + 1)
        step = {k: v for k, v in feed.items() if k not in pasts}
        run = lambda: shared.step(step)
    for _ in range(runs):
        run()
    events = json.loads(Path(sess.end_profiling()).read_text())
    by: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by[e["args"]["op_name"]] += e["dur"]
    total = sum(by.values()) or 1
    shares = {k: v / total for k, v in by.most_common()}
    model_runs = [e["dur"] for e in events if e.get("name") == "model_run"]
    shares["(kernel time / model_run)"] = total / (sum(model_runs) or 1)
    return ops, shares, [d / 1e3 for d in model_runs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. --set blocks=2")
    ap.add_argument("--decode", type=int, default=None, metavar="P", help="profile decode steps after P tokens")
    args = ap.parse_args()

    import onnxruntime
    from cpu_info import cpu_model

    import specc
    from specc.runtime.ort_session import default_threads

    threads = default_threads()
    spec = specc.load_spec("gpt2", args.set or None)
    print(f"command: python bench/profile_onnx.py {' '.join(sys.argv[1:])}".rstrip())
    what = f"decode steps after {args.decode} tokens" if args.decode is not None else f"B=1 N={args.seq}"
    print(f"machine: {cpu_model()}, {threads} threads; onnxruntime {onnxruntime.__version__}; GPT-2 {spec.blocks} "
          f"blocks, {what}, fp32; other load on the machine adds noise")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for attention in ("standard", "contrib"):
            kv = args.decode is not None
            path = specc.export_onnx(spec, tmp / f"gpt2_{attention}.onnx", attention=attention, kv_cache=kv)
            ops, shares, runs = profile(path, args.seq, args.runs, threads, tmp, args.decode)
            print(f"\n{attention} graph: model_run {', '.join(f'{r:.0f}' for r in runs)} ms")
            print("after ORT's optimizations: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items())))
            print("kernel time: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in shares.items() if v >= 0.001))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
