"""GPU check for the torch backend (one CUDA device, a few minutes).

    python bench/gpu_torch.py [--batch 8] [--seq 1024] [--reps 10] [--cpu-dry-run]

1. Correctness on the device: SDPA path == math path, KV-cache greedy == full recompute (fp32, tiny models of
   several families), bf16 forward finite.
2. GPT-2-XL bf16 forward throughput against HF transformers' GPT2LMHeadModel (sdpa) of the same shape in the
   same run, and MFU = analyzer matmul FLOPs (full causal count) / time / measured bf16 matmul peak (and /
   the H200's nominal 989 TFLOP/s dense bf16).
3. Greedy generation tokens/s of gpt2 (B=1) against HF ``generate``, eager and with compiled decoding: specc's
   ``generate(compile=True)`` (CUDA graphs over a static cache) against HF's static cache + torch.compile
   ("reduce-overhead"), compile times apart (bench/compiled_decode.py). Correctness: compiled == eager tokens.
Prints a markdown table. ``--cpu-dry-run`` runs the same code on the CPU with tiny sizes.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compiled_decode import compiled_generation
from twins import gpt2_twins

import specc

NOMINAL_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12}

TINY = {
    "decoder": ["blocks=2", "d_model=64", "attention.heads=4", "mlp.hidden=128", "vocab_size=97", "context=64"],
    "gqa_rope_moe": [
        "blocks=2",
        "d_model=64",
        "attention.heads=4",
        "attention.kv_heads=2",
        "vocab_size=97",
        "context=64",
        "mlp.experts=4",
        "mlp.active=2",
        "mlp.hidden=32",
    ],
    "encoder_decoder": ["blocks=2", "d_model=64", "attention.heads=4", "mlp.hidden=128", "vocab_size=97"],
}
BASE = {"decoder": "gpt2", "gqa_rope_moe": "mixtral-8x7b", "encoder_decoder": "transformer-base"}


def timed(fn: Callable[[], object], reps: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


def correctness(dev: torch.device) -> list[tuple[str, str]]:
    rows = []
    for name, sets in TINY.items():
        model = specc.build_torch(specc.load_spec(BASE[name], sets), device=dev, dtype="fp32")
        ids = torch.randint(3, 97, (2, 12), device=dev)
        seq2seq = name == "encoder_decoder"
        args = (ids, ids[:, :7]) if seq2seq else (ids,)
        with torch.inference_mode():
            fused = model(*args)
            model.attention_impl = "math"
            math = model(*args)
            model.attention_impl = "sdpa"
            kw = {"decoder_start_token_id": 1} if seq2seq else {}
            cached = model.generate(ids[:1], 10, use_cache=True, **kw)
            full = model.generate(ids[:1], 10, use_cache=False, **kw)
            compiled = None if seq2seq else model.generate(ids, 10, compile=True)  # both rows: batch 2
        diff = (fused - math).abs().max().item()
        same = torch.equal(cached, full)
        rows.append((f"{name}: SDPA vs math max abs diff (fp32); KV-cache greedy == recompute", f"{diff:.1e}; {same}"))
        if compiled is not None:
            with torch.inference_mode():
                eager = model.generate(ids, 10)
            rows.append((f"{name}: compiled decode (static cache) greedy == eager", f"{torch.equal(compiled, eager)}"))
    bf = specc.build_torch(specc.load_spec("gpt2", TINY["decoder"]), device=dev, dtype="bf16")
    with torch.inference_mode():
        out = bf(torch.randint(0, 97, (2, 32), device=dev))
    rows.append(("bf16 forward finite, dtype", f"{bool(torch.isfinite(out).all())}, {out.dtype}"))
    return rows


def throughput(dev: torch.device, batch: int, seq: int, reps: int, dry: bool) -> list[tuple[str, str]]:
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dtype = torch.bfloat16
    n = 8192 if dev.type == "cuda" else 256
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    peak = 2 * n**3 / timed(lambda: a @ b, reps, sync)

    preset, sets = (
        ("gpt2-xl", ["blocks=2", "d_model=128", "attention.heads=4", "mlp.hidden=512"]) if dry else ("gpt2-xl", [])
    )
    spec = specc.load_spec(preset, sets)
    flops = specc.analyze(spec, batch=batch, seq=seq).to_dict()["flops"]["forward"]["matmul"]
    ours, hf = gpt2_twins(spec, dev, dtype)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), device=dev)
    with torch.inference_mode():
        t_ours = timed(lambda: ours(ids), reps, sync)
        t_hf = timed(lambda: hf(ids).logits, reps, sync)
        first = ids[:1, :128]  # same weights: the two logits agree to bf16 rounding
        diff = (ours(first).float() - hf(first).logits.float()).abs().max().item()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    nominal = next((v for k, v in NOMINAL_BF16.items() if k in name), None)
    mfu = flops / t_ours / peak * 100
    rows = [
        ("bf16 matmul peak, 8192³ (measured)", f"{peak / 1e12:.0f} TFLOP/s"),
        (
            f"{preset} bf16 forward B={batch} N={seq}: specc",
            f"{t_ours * 1e3:.1f} ms, {batch * seq / t_ours:,.0f} tok/s, {flops / t_ours / 1e12:.0f} TFLOP/s",
        ),
        (
            f"{preset} bf16 forward B={batch} N={seq}: HF GPT2LMHeadModel (sdpa)",
            f"{t_hf * 1e3:.1f} ms, {batch * seq / t_hf:,.0f} tok/s ({t_hf / t_ours:.2f}× slower than specc); "
            f"same weights, logits differ by ≤ {diff:.2g}",
        ),
        (
            "MFU (matmul FLOPs / time / measured peak)",
            f"{mfu:.0f}%"
            + (f"; {flops / t_ours / nominal * 100:.0f}% of nominal {nominal / 1e12:.0f} TFLOP/s" if nominal else ""),
        ),
    ]
    del ours, hf

    small = specc.load_spec("gpt2", ["blocks=2"] if dry else [])
    ours, hf = gpt2_twins(small, dev)
    prompt = torch.randint(0, 50257, (1, 32), device=dev)
    new = 16 if dry else 128
    with torch.inference_mode():
        t_ours = timed(lambda: ours.generate(prompt, new), 1 if dry else 3, sync)
        t_hf = timed(
            lambda: hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0),
            1 if dry else 3,
            sync,
        )
    rows.append(
        (
            f"gpt2 fp32 greedy, prompt 32, {new} new: specc vs HF generate",
            f"{new / t_ours:.0f} vs {new / t_hf:.0f} tok/s ({t_hf / t_ours:.2f}×)",
        )
    )
    c = compiled_generation(ours, hf, prompt, new, 1 if dry else 3, 0.0)
    cell = (
        f"{c['specc compiled_tok_s']:.0f} tok/s (compiled in {c['specc compiled_compile_s']:.0f} s; same tokens as "
        f"eager: {c['specc compiled_same_tokens']}); {c['specc compiled_tok_s'] / c['specc_tok_s']:.2f}× specc eager, "
        f"{c['specc compiled_tok_s'] / c['hf_tok_s']:.2f}× HF eager"
    )
    if "hf compiled_tok_s" in c:
        cell += (
            f", {c['specc compiled_tok_s'] / c['hf compiled_tok_s']:.2f}× HF static cache + compile "
            f"({c['hf compiled_tok_s']:.0f} tok/s, compiled in {c['hf compiled_compile_s']:.0f} s)"
        )
    else:
        cell += f"; HF static cache + compile: {c.get('hf_compiled_error', 'not supported for this model')}"
    rows.append((f"gpt2 fp32 greedy, prompt 32, {new} new: compiled decode", cell))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cpu" if dry else "cuda")
    batch, seq, reps = (1, 64, 1) if dry else (args.batch, args.seq, args.reps)
    torch.manual_seed(0)
    rows = correctness(dev) + throughput(dev, batch, seq, reps, dry)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (dry run)"
    print(f"command: python bench/gpu_torch.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {name}, torch {torch.__version__}\n")
    print("| check | result |\n|---|---|")
    for row in rows:
        print(f"| {row[0]} | {row[1]} |")


if __name__ == "__main__":
    main()
