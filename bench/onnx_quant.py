"""Weight-only quantized ONNX (``--quantize int8|int4``) against the fp32 graph: size, decode speed, quality.

    python bench/onnx_quant.py            # the recorded benchmark (75 minutes here under heavy shared load)
    python bench/onnx_quant.py --quick    # smoke test (2 blocks, a few training steps)
    (also run by bench/bench_onnx.py --quant)

Measured in one run, the same weights for every variant:
- file size and greedy decode tokens/s through the KV-cache graph (prompt 32, B=1) on GPT-2 small with random
  weights: fp32, int8 (MatMulNBits bits=8 and quantize_dynamic, to pick the faster), int4 (block 32), each
  MatMulNBits variant with the token embedding quantized (GatherBlockQuantized on the tied head's weight: the
  table stored once, the default) and with ``--no-quantize-embedding`` (the fp32 table beside the quantized
  head), and int4 with ``--no-quantize-head`` (head and table fp32, stored once); timed round-robin with idle
  gaps (bench_onnx.interleaved). Targets: int4 ≤ 40% of the fp32 file, int4 ≥ 2× and int8 ≥ 1.5× the fp32
  graph's tokens/s.
- quality on a character LM trained here by ``specc train --task lm`` (the spec below, the text: this
  repository's ``specc/**/*.py`` sources, first 400 KB, 90/10 split): perplexity on held-out windows and the
  mean KL(fp32 ‖ quantized) of the next-character distributions. Targets: int8 within 1%, int4 within 5%.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

LM_SPEC = """\
name: char-lm
kind: decoder
vocab_size: 128
context: 128
d_model: 128
blocks: 2
attention: {heads: 4}
norm: {type: layernorm, placement: pre}
mlp: {type: classic, hidden: 512, activation: gelu_tanh}
position: learned
tie_embeddings: true
"""
TEXT_BYTES = 400_000


def variants() -> dict[str, object]:
    from specc.backends.onnx.quantize import Quantization

    return {
        "fp32": None,
        "int8 MatMulNBits": Quantization("int8", 32, embedding=True),
        "int8 MatMulNBits, --no-quantize-embedding": Quantization("int8", 32, embedding=False),
        "int8 quantize_dynamic (embedding fp32)": Quantization("int8", 32, method="dynamic"),
        "int4 block 32": Quantization("int4", 32, embedding=True),
        "int4 block 32, --no-quantize-embedding": Quantization("int4", 32, embedding=False),
        "int4 block 32, --no-quantize-head (embedding fp32)": Quantization("int4", 32, head=False),
    }


def corpus(path: Path) -> Path:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "specc").rglob("*.py")))
    path.write_text(text[:TEXT_BYTES], encoding="utf-8")
    return path


def train_lm(tmp: Path, steps: int, threads: int) -> tuple[Path, Path, Path, float]:
    """Train the character LM with ``specc train --task lm``; returns (spec, text, checkpoint, seconds)."""
    spec, text, ckpt = tmp / "char-lm.yaml", corpus(tmp / "text.txt"), tmp / "char-lm.safetensors"
    spec.write_text(LM_SPEC, encoding="utf-8")
    cmd = [sys.executable, "-m", "specc", "train", str(spec), "--task", "lm", "--text", str(text), "--steps",
           str(steps), "--batch", "32", "--max-len", "64", "--lr", "3e-3", "--eval-every", str(steps),
           "--threads", str(threads), "--device", "cpu", "-o", str(ckpt)]  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode:
        raise SystemExit(f"training failed:\n{res.stdout}\n{res.stderr}")
    losses = [line for line in res.stdout.splitlines() if "loss" in line]
    print("\n".join(losses[-6:]), file=sys.stderr)  # progress only: whole lines, kept out of the table on stdout
    return spec, text, ckpt, time.perf_counter() - t0


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def quality(tmp: Path, steps: int, threads: int, windows: int) -> tuple[list[tuple[str, str, str]], str]:
    from bench_onnx import ort_session

    import specc
    from specc.train.text import read_text
    from specc.train.training_checkpoint import load

    _, text, ckpt, train_s = train_lm(tmp, steps, threads)
    saved = load(ckpt)
    data = read_text(text, saved.vocab)
    val_loss = saved.train.get("history", [{}])[-1].get("val_loss") if saved.train.get("history") else None
    spec = saved.spec
    ctx = 128
    val = data.val.numpy()
    starts = np.linspace(0, len(val) - ctx - 1, windows).astype(int)
    ids = np.stack([val[s : s + ctx] for s in starts]).astype(np.int64)
    labels = np.stack([val[s + 1 : s + ctx + 1] for s in starts]).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    logp = {}
    for name, q in variants().items():
        path = specc.export_onnx(spec, tmp / f"lm-{len(logp)}.onnx", weights=str(ckpt), quantize=q)
        logits = ort_session(path, threads).run(["logits"], feed)[0]
        logp[name] = log_softmax(logits)
    rows = []
    ref = logp["fp32"]
    nll_ref = -np.take_along_axis(ref, labels[..., None], -1).mean()
    for name, lp in logp.items():
        nll = -np.take_along_axis(lp, labels[..., None], -1).mean()
        kl = (np.exp(ref) * (ref - lp)).sum(-1).mean()
        rows.append((f"char LM perplexity: {name}", f"{np.exp(nll):.4f}",
                     f"{100 * (np.exp(nll) / np.exp(nll_ref) - 1):+.2f}% vs fp32; mean KL {kl:.2e} nats"))  # fmt: skip
    note = (f"char LM: {spec.d_model}-wide, {spec.blocks} blocks, vocabulary {spec.vocab_size}, trained {steps} "
            f"steps by specc train --task lm in {train_s:.0f} s (val loss {val_loss}); perplexity over {windows} "
            f"held-out windows of {ctx} characters")  # fmt: skip
    return rows, note


def speed(tmp: Path, quick: bool, threads: int, new_tokens: int) -> list[tuple[str, str, str]]:
    import torch
    from bench_onnx import interleaved

    import specc
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    spec = specc.load_spec("gpt2", ["blocks=2"] if quick else [])
    prompt = 32
    ids = torch.randint(0, spec.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0)).numpy()
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    models, sizes, export_s = {}, {}, {}
    for i, (name, q) in enumerate(variants().items()):
        t0 = time.perf_counter()
        path = specc.export_onnx(spec, tmp / f"gpt2-{i}.onnx", kv_cache=True, quantize=q)
        export_s[name] = time.perf_counter() - t0
        sizes[name] = path.stat().st_size
        models[name] = OrtModel.open(path, "cpu", threads)
    t = interleaved({k: (lambda m=m: greedy(m, feed, new_tokens)) for k, m in models.items()}, 2 if quick else 3, 1)
    rows = []
    for name in models:
        rows.append((f"GPT-2 {'(2 blocks)' if quick else 'small'} file: {name}", f"{sizes[name] / 2**20:.1f} MiB",
                     f"{100 * sizes[name] / sizes['fp32']:.0f}% of fp32 (export {export_s[name]:.1f} s)"))  # fmt: skip
        rows.append((f"greedy decode, prompt {prompt}, {new_tokens} new: {name}", f"{new_tokens / t[name]:.1f} tok/s",
                     f"{t['fp32'] / t[name]:.2f}× fp32"))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2-block GPT-2, 40 training steps (smoke test)")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: usable cores)")
    ap.add_argument("--steps", type=int, default=None, help="training steps of the char LM (default 300)")
    ap.add_argument("--new-tokens", type=int, default=None, help="generated tokens (default 64; quick 8)")
    ap.add_argument("--skip-speed", action="store_true", help="quality only")
    args = ap.parse_args(argv)

    import torch
    from cpu_info import cpu_model

    from specc.runtime.ort_session import default_threads

    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    steps = args.steps or (40 if args.quick else 300)
    new_tokens = args.new_tokens or (8 if args.quick else 64)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows, note = quality(tmp, steps, threads, 16 if args.quick else 64)
        if not args.skip_speed:
            rows = speed(tmp, args.quick, threads, new_tokens) + rows
    print(f"command: python bench/onnx_quant.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"machine: {cpu_model()}, {threads} threads; onnxruntime {__import__('onnxruntime').__version__}; "
          f"{note}; other load on the machine adds noise\n")  # fmt: skip
    print("| measurement | value | ratio |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
