"""Fixed context vs Bahdanau attention on the reverse task: exact-sequence accuracy against length (§1.2–1.4).

    python bench/bench_rnn.py            # both models, ≈ 5–8 minutes on 2 CPU cores
    python bench/bench_rnn.py --steps 400 --map reverse-map.png

Trains examples/rnn/reverse-fixed.yaml and reverse-bahdanau.yaml with the same data, steps and optimizer on
reversal of 4–40 symbols, then decodes held-out sequences of each length greedily (no teacher forcing).
Prints a markdown table for BENCHMARKS.md and checks the claims: attention ≥ 95% exact at lengths 20–40;
the fixed-context model's accuracy falls with length; the attention map is anti-diagonal. Exit 1 if one fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu_info import cpu_model  # noqa: E402  (bench/ is the script's directory)

from specc import load_spec  # noqa: E402
from specc.train import TrainConfig, new_run, save_run, train  # noqa: E402
from specc.train.attention_maps import attention_map, mirror_fraction  # noqa: E402
from specc.train.evaluate import evaluate_seq2seq  # noqa: E402
from specc.train.loop import Run  # noqa: E402

MODELS = {"fixed context": "reverse-fixed.yaml", "Bahdanau": "reverse-bahdanau.yaml"}
LENGTHS = (5, 10, 15, 20, 25, 30, 35, 40)


def by_length(run: Run, per_length: int, seed: int) -> dict[int, tuple[float, float]]:
    """length → (exact-sequence accuracy, token accuracy) on fresh sequences of exactly that length."""
    assert run.task is not None
    out = {}
    for n in LENGTHS:
        gen = torch.Generator().manual_seed(seed * 1000 + n)
        score = evaluate_seq2seq(run.model, run.task.sample(per_length, n, n, gen), run.device)
        out[n] = (score.exact_acc, score.token_acc)
    return out


def anti_diagonal(run: Run, samples: int, seed: int) -> float:
    """Mean share of output tokens whose argmax input is the mirrored position ± 1, inputs of 20–40 symbols."""
    assert run.task is not None
    gen = torch.Generator().manual_seed(seed + 77)
    shares = []
    for src, _ in run.task.sample(samples, 20, 40, gen):
        m = attention_map(run.model, run.graph, run.vocab, run.vocab.decode(src), len(src) + 1)
        shares.append(mirror_fraction(m.weights, min(len(src), m.weights.shape[0])))
    return sum(shares) / len(shares)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=800, help="optimizer steps per model [800]")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-len", type=int, default=4)
    ap.add_argument("--max-len", type=int, default=40)
    ap.add_argument("--per-length", type=int, default=200, help="held-out sequences per length [200]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads [1: tiny matmuls, shared CPUs]")
    ap.add_argument("--save-dir", type=Path, help="write both checkpoints here")
    ap.add_argument("--map", type=Path, help="write the Bahdanau attention map of a 24-symbol input here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    results, times = {}, {}
    runs: dict[str, Run] = {}
    for label, file in MODELS.items():
        spec = load_spec(ROOT / "examples" / "rnn" / file)
        cfg = TrainConfig(
            task="reverse", steps=args.steps, batch=args.batch, lr=args.lr, min_len=args.min_len,
            max_len=args.max_len, seed=args.seed, eval_every=args.steps, eval_size=256,
        )  # fmt: skip
        t0 = time.perf_counter()
        run = new_run(spec, cfg, torch.device("cpu"))
        train(run)
        t_train = time.perf_counter() - t0
        results[label] = by_length(run, args.per_length, args.seed)
        times[label] = (t_train, time.perf_counter() - t0 - t_train)
        runs[label] = run
        t_eval = times[label][1]
        print(f"{label}: trained {args.steps} steps in {t_train:.0f} s, evaluated in {t_eval:.0f} s", flush=True)
        if args.save_dir:
            save_run(run, args.save_dir / file.replace(".yaml", ".safetensors"))
    diag = anti_diagonal(runs["Bahdanau"], 50, args.seed)
    if args.map:
        from specc.train.plot import save_heatmap

        run = runs["Bahdanau"]
        assert run.task is not None
        src, _ = run.task.sample(1, 24, 24, torch.Generator().manual_seed(args.seed))[0]
        save_heatmap(attention_map(run.model, run.graph, run.vocab, run.vocab.decode(src), 26), args.map, "Bahdanau")
    wall = time.perf_counter() - t_all
    load_after = os.getloadavg()

    fixed, attn = results["fixed context"], results["Bahdanau"]
    print()
    print(
        f"Reverse task, {args.steps} steps × batch {args.batch} on lengths {args.min_len}–{args.max_len}, "
        f"{args.per_length} held-out sequences per length, greedy decoding; exact-sequence (token) accuracy."
    )
    print()
    print("| length | fixed context (c = h_T) | Bahdanau attention |")
    print("|---:|---:|---:|")
    for n in LENGTHS:
        print(f"| {n} | {fixed[n][0]:.1%} ({fixed[n][1]:.1%}) | {attn[n][0]:.1%} ({attn[n][1]:.1%}) |")
    print()
    for label in MODELS:
        n_params = sum(p.numel() for p in runs[label].model.parameters())
        print(f"- {label}: {n_params:,} parameters, train {times[label][0]:.0f} s + eval {times[label][1]:.0f} s")
    print(f"- attention map: {diag:.1%} of output tokens attend (argmax) to the mirrored input ± 1 (50 inputs, 20–40)")
    print(
        f"- wall time {wall:.0f} s; {args.threads} torch thread(s); torch {torch.__version__}; {cpu_model()}, "
        f"{os.cpu_count()} cores; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )

    long = [attn[n][0] for n in LENGTHS if n >= 20]
    claims = {
        "Bahdanau ≥ 95% exact at every length 20–40": min(long) >= 0.95,
        "fixed-context accuracy falls with length (5 → 40)": fixed[LENGTHS[0]][0] > fixed[LENGTHS[-1]][0] + 0.2,
        "attention map anti-diagonal for ≥ 90% of output tokens": diag >= 0.9,
    }
    print()
    for claim, ok in claims.items():
        print(f"- {'PASS' if ok else 'FAIL'}: {claim}")
    return 0 if all(claims.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
