"""Benchmarks of specc's PyTorch backend against Hugging Face transformers, in one run on one machine.

    python bench/bench_torch.py            # the full run (a few minutes on 2 cores)
    python bench/bench_torch.py --quick    # a smoke run (< 1 minute): 2 blocks, short sequences, few repetitions

Every number is measured in this run, on the machine it names (CPU model, torch version, threads):

1. The fp32 GEMM peak: GFLOP/s of ``torch.mm`` and of oneDNN's linear (where this torch has it) on GPT-2's
   GEMM shapes at N = 512 rows (768→2304, 768→768, 768→3072, 3072→768 and the 768→50257 head); the peak is
   the best of them all, like with like: of each contender's median call (against the median forward, the
   target), and of the best call of any (against the best forward, printed beside it).
2. The memory read bandwidth of several readers, each timed ``reps`` times round-robin: ``sum()`` over one large
   fp32 tensor, GEMVs (1 row) streaming a > 256 MB fp32 weight (``F.linear``, oneDNN, the row-split batched
   GEMV and specc's native GEMV where it builds), and ``sum()`` over the model's own parameters once each, in
   forward order — the tensors decoding reads, as it reads them (bench/decode_costs.py); each far larger than the
   caches. The bandwidth floor of decoding is the time to read the weights once at the fastest reader's rate,
   like with like: the readers are timed again between the generation calls (this host's speed drifts between
   the phases of a run), and the median generation is held against the fastest reader's median call there (the
   target); the best generation against the best single call of any reader in either phase is printed too.
3. Forward, B=1, N=512, fp32: ``specc.build_torch`` of gpt2.yaml vs HF ``GPT2LMHeadModel
   (attn_implementation="sdpa")`` holding the same random weights (bench/twins.py), with the logits compared;
   specc's matmul throughput (the analyzer's forward matmul FLOPs, attention counted in full as
   FlopCounterMode does, / time) as a % of the GEMM peak.
4. Greedy generation, prompt 32 + 128 new tokens, end to end (prompt included): tokens/s of specc's KV-cached
   ``generate`` vs HF ``generate``, and specc's tokens/s as a % of the bandwidth floor (every parameter read
   once per token; the tied embedding / head matrix once; KV-cache reads not counted). Then one decoding step
   at a cache of prompt + new/2 tokens against the model's one-row linear calls alone (same kernels, same
   weights, same order): what a step spends beyond streaming its weights.
   Then the same generation with compiled decoding (bench/compiled_decode.py): specc's ``generate(compile=True)``
   vs HF eager and HF's static cache + torch.compile (same inductor options), compile times reported apart.
5. Peak memory of a one-block GPT-2-shaped model at N = 4096 and 16384 with fused SDPA vs the explicit math
   path (each measured in a fresh process as the growth of its peak RSS): O(N) vs O(N²).

Contenders run round-robin, each timed call after 0.1 s idle (so one's worker threads do not steal cores
from the next), after a warm-up; the tables report medians (and the best); the probes are in
bench/torch_probes.py. The bench measures the models as
``build_torch`` returns them: it applies no kernel choice of its own. GPU: bench/gpu_torch.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import decode_costs  # noqa: E402
from attention_memory import attention_memory  # noqa: E402
from compiled_decode import compiled_generation  # noqa: E402
from torch_probes import IDLE, bandwidth, gemm_peaks, machine, reader_rates, readers, round_robin  # noqa: E402
from twins import gpt2_twins  # noqa: E402

import specc  # noqa: E402

TARGETS = {"forward_hf": 1.1, "forward_peak": 85.0, "generate_hf": 1.5, "generate_floor": 80.0}


# ============================================================================================ the models


def linear_routing(model: torch.nn.Module) -> str:
    """How many nn.Linear layers build_torch routed through specc's measured kernels."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        return "none (this backend holds the weights in its own modules)"
    try:
        from specc.backends.torch.accel.kernels import FastForward
    except ImportError:
        return f"{len(linears)} nn.Linear"
    fast = sum(isinstance(m.__dict__.get("forward"), FastForward) for m in linears)
    return f"{fast} of {len(linears)} nn.Linear layers use specc's measured kernels"


def decode_step_row(ours: torch.nn.Module, vocab: int, length: int, reps: int, nbytes: int) -> tuple[str, ...]:
    """One decoding step as generate takes it (the native step where it measured faster), the eager step, and
    the model's one-row linear calls alone."""
    try:
        from specc.backends.torch.accel import decode_native
    except ImportError:  # a checkout without it
        decode_native = None
    native = decode_native.stepper(ours) if decode_native is not None else None
    step = decode_costs.step_seconds(ours, vocab, length, reps, IDLE)
    chosen = native.choice if native is not None else "eager"
    if native is None and decode_native is not None:
        chosen += f" ({decode_native.why_not(ours)})"
    eager = step
    if native is not None and native.choice == "native":
        native.choice = "eager"  # the same steps eagerly, for the comparison
        try:
            eager = decode_costs.step_seconds(ours, vocab, length, reps, IDLE)
        finally:
            native.choice = "native"
    gemvs = decode_costs.weight_gemvs(ours, reps, IDLE)
    rest = step["median_s"] - gemvs["median_s"]
    measured = ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in (native.timings if native else {}).items())
    return (
        f"one decode step, KV cache at {length} tokens: median (best)",
        f"{step['median_s'] * 1e3:.1f} ms ({step['best_s'] * 1e3:.1f}), {chosen} step"
        + (f" (chosen at the first step: {measured})" if measured else ""),
        f"eager step {eager['median_s'] * 1e3:.1f} ms ({eager['best_s'] * 1e3:.1f}); its linear layers alone, "
        f"called one by one: {gemvs['median_s'] * 1e3:.1f} ms ({gemvs['best_s'] * 1e3:.1f}) = "
        f"{nbytes / gemvs['median_s'] / 1e9:.1f} GB/s",
        f"{step['median_s'] / eager['median_s'] * 100:.0f}% of the eager step; beyond the linears alone: "
        f"{rest * 1e3:+.1f} ms = {rest / step['median_s'] * 100:+.0f}% of the step",
        "",
    )


def forward(ours: torch.nn.Module, hf: torch.nn.Module, vocab: int, n: int, reps: int) -> dict[str, float]:
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()  # also the warm-up
        times = round_robin({"specc": lambda: ours(ids), "hf": lambda: hf(ids)}, reps, warm=False)
    return {
        **{f"{k}_s": statistics.median(v) for k, v in times.items()},
        **{f"{k}_best_s": min(v) for k, v in times.items()},
        "max_abs_diff": diff,
    }


def generation(
    ours: torch.nn.Module,
    hf: torch.nn.Module,
    vocab: int,
    prompt: int,
    new: int,
    reps: int,
    probe: dict[str, Callable[[], object]],
    gb: dict[str, float],
) -> dict[str, object]:
    """Tokens/s of both models, and the readers' GB/s timed in the same rounds (the floor's like-for-like
    bandwidth: this host's speed drifts between the phases of a run)."""
    ids = torch.randint(0, vocab, (1, prompt), generator=torch.Generator().manual_seed(2))

    def run_ours() -> torch.Tensor:
        return ours.generate(ids, new)

    def run_hf() -> torch.Tensor:
        return hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    contenders: dict[str, Callable[[], object]] = {"specc": run_ours, "hf": run_hf}
    contenders.update({name: decode_costs.repeated(fn) for name, fn in probe.items()})
    with torch.inference_mode():
        same = torch.equal(run_ours(), run_hf())  # also the warm-up
        for fn in probe.values():
            fn()
        times = round_robin(contenders, reps, warm=False)
    return {
        **{f"{k}_tok_s": new / statistics.median(times[k]) for k in ("specc", "hf")},
        **{f"{k}_best_tok_s": new / min(times[k]) for k in ("specc", "hf")},
        "same_tokens": same,
        "readers": reader_rates(times, {k: decode_costs.READS_PER_CALL * v for k, v in gb.items()}),
    }


def compiled_row(c: dict[str, Any], prompt: int, new: int, floor: float, nbytes: int, read_bw: float) -> tuple:
    """The table row of compiled decoding (bench/compiled_decode.py's measurements)."""
    tok_s = c["specc compiled_tok_s"]
    pct = tok_s / floor * 100
    vs_hf = f"{tok_s / c['specc_tok_s']:.2f}× specc eager, {tok_s / c['hf_tok_s']:.2f}× HF eager"
    if "hf compiled_tok_s" in c:
        hf_c = c["hf compiled_tok_s"]
        vs_hf += f", {tok_s / hf_c:.2f}× HF static cache + compile ({hf_c:.1f} tok/s, compiled in "
        vs_hf += f"{c['hf compiled_compile_s']:.0f} s, same tokens: {c['hf compiled_same_tokens']})"
    else:
        vs_hf += f"; HF static cache + compile: {c.get('hf_compiled_error', 'not supported for this model')}"
    return (
        f"greedy generate, compiled decode, prompt {prompt} + {new} new: median (best)",
        f"{tok_s:.1f} tok/s ({c['specc compiled_best_tok_s']:.1f}); compiled in {c['specc compiled_compile_s']:.0f} s",
        f"HF eager {c['hf_tok_s']:.1f} tok/s",
        f"{vs_hf}; {pct:.0f}% of the bandwidth floor {floor:.1f} tok/s = {nbytes / 1e6:.0f} MB at {read_bw:.1f} GB/s "
        f"(opt-in, no target on the CPU: the GPU's CUDA-graph path); same tokens as eager specc: "
        f"{c['specc compiled_same_tokens']}",
        "",
    )


# ==================================================================================================== main


_START = time.perf_counter()


def progress(what: str) -> None:
    print(f"[{time.perf_counter() - _START:5.1f} s] {what}", file=sys.stderr, flush=True)


def _verdict(value: float, target: float) -> str:
    return "met" if value >= target else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 1 minute)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    quick = args.quick
    reps = 2 if quick else 7
    print(f"command: python bench/bench_torch.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {machine()}", flush=True)
    rows: list[tuple[str, ...]] = []  # benchmark, specc, HF / reference, result, target

    n = 128 if quick else 512
    progress("GEMM peaks")
    peaks = gemm_peaks(n, reps)
    peak = float(peaks["peak"])
    for shape, result in peaks["shapes"].items():
        cells = ", ".join(f"{k} {v:.0f}" for k, v in result.items())
        rows.append((f"fp32 GEMM {n}×{shape}", "", f"{cells} GFLOP/s", "", ""))
    best = ", ".join(f"{k} {v:.0f}" for k, v in peaks["best"].items() if v)
    best_call = float(peaks["peak_best"])
    peak_cells = (f"{best} GFLOP/s (median calls)", f"peak {peak:.0f} GFLOP/s (best call: {best_call:.0f})")
    rows.append(("fp32 GEMM peak (best of the shapes above)", "", *peak_cells, ""))

    progress("memory bandwidth")
    probe, probe_gb = readers(256 if quick else 512)
    bw = bandwidth(probe, probe_gb, reps)

    progress("GPT-2 twins")
    spec = specc.load_spec("gpt2", ["blocks=2"] if quick else None)
    ours, hf = gpt2_twins(spec)
    nbytes = decode_costs.weight_bytes(ours)
    read = decode_costs.weight_read(ours, reps, IDLE)
    bw[f"model weights sum() ({nbytes / 1e6:.0f} MB)"] = (read["median_gb_s"], read["best_gb_s"])
    # like with like: median tokens/s against the best reader's median call, best against its best call
    read_bw, read_best = max(m for m, _ in bw.values()), max(b for _, b in bw.values())
    cells = ", ".join(f"{k} {m:.1f} ({b:.1f})" for k, (m, b) in bw.items())
    rows.append(
        (
            f"memory read bandwidth, {256 if quick else 512} MiB fp32: median (best)",
            "",
            f"{cells} GB/s",
            f"{read_bw:.1f} GB/s ({read_best:.1f})",
            "",
        )
    )
    routing = linear_routing(ours)
    flops = specc.analyze(spec, batch=1, seq=n).to_dict()["flops"]["forward"]["matmul"]
    progress("forward")
    f = forward(ours, hf, spec.vocab_size, n, reps)
    speedup = f["hf_s"] / f["specc_s"]
    pct = flops / f["specc_s"] / 1e9 / peak * 100
    pct_best = flops / f["specc_best_s"] / 1e9 / float(peaks["peak_best"]) * 100
    rows.append(
        (
            f"forward gpt2{' (2 blocks)' if quick else ''}, B=1, N={n}, fp32: median (best)",
            f"{f['specc_s'] * 1e3:.1f} ms ({f['specc_best_s'] * 1e3:.1f})",
            f"{f['hf_s'] * 1e3:.1f} ms ({f['hf_best_s'] * 1e3:.1f})",
            f"{speedup:.2f}× HF ({_verdict(speedup, TARGETS['forward_hf'])}); "
            f"{flops / f['specc_s'] / 1e9:.0f} GFLOP/s = {pct:.0f}% of the GEMM peak "
            f"({_verdict(pct, TARGETS['forward_peak'])}); best: {pct_best:.0f}% of the best GEMM call's "
            f"{float(peaks['peak_best']):.0f} GFLOP/s; logits differ by ≤ {f['max_abs_diff']:.1e}",
            f"≥ {TARGETS['forward_hf']}× HF, ≥ {TARGETS['forward_peak']:.0f}% of peak",
        )
    )

    prompt, new = (8, 16) if quick else (32, 128)
    progress("generation")
    g = generation(ours, hf, spec.vocab_size, prompt, new, 1 if quick else 5, probe, probe_gb)  # calls spread widely
    # like with like: the median generation against the fastest reader's median call in the same rounds
    during: dict[str, tuple[float, float]] = g["readers"]  # type: ignore[assignment]
    gen_bw = max(m for m, _ in during.values())
    gen_best = max(read_best, max(b for _, b in during.values()))  # the best call of any reader, either phase
    floor = gen_bw * 1e9 / nbytes  # tokens/s if each token only read every weight once at gen_bw
    best_floor = gen_best * 1e9 / nbytes
    speedup = g["specc_tok_s"] / g["hf_tok_s"]
    pct = g["specc_tok_s"] / floor * 100
    fastest = max(during, key=lambda k: during[k][0])
    rows.append(
        (
            f"greedy generate, prompt {prompt} + {new} new tokens: median (best)",
            f"{g['specc_tok_s']:.1f} tok/s ({g['specc_best_tok_s']:.1f})",
            f"{g['hf_tok_s']:.1f} tok/s ({g['hf_best_tok_s']:.1f})",
            f"{speedup:.2f}× HF ({_verdict(speedup, TARGETS['generate_hf'])}); {pct:.0f}% of the bandwidth floor "
            f"{floor:.1f} tok/s = {nbytes / 1e6:.0f} MB of weights at {gen_bw:.1f} GB/s ({fastest}'s median call "
            f"between the generation calls; {read_bw:.1f} in the bandwidth rounds) "
            f"({_verdict(pct, TARGETS['generate_floor'])}); best: {g['specc_best_tok_s'] / best_floor * 100:.0f}% of "
            f"the best reader call's {best_floor:.1f} tok/s ({gen_best:.1f} GB/s); same tokens: {g['same_tokens']}",
            f"≥ {TARGETS['generate_hf']}× HF, ≥ {TARGETS['generate_floor']:.0f}% of floor",
        )
    )
    progress("compiled decode (compiling first)")
    ids = torch.randint(0, spec.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(2))
    c = compiled_generation(ours, hf, ids, new, 1 if quick else 3, IDLE)
    rows.append(compiled_row(c, prompt, new, floor, nbytes, gen_bw))
    progress("decode step")
    rows.append(decode_step_row(ours, spec.vocab_size, prompt + new // 2, reps * 3, nbytes))
    del ours, hf

    progress("attention memory")
    for length in (1024,) if quick else (4096, 16384):
        result = {impl: attention_memory(length, impl) for impl in ("sdpa", "math")}
        cells = [
            f"{r['peak_bytes'] / 2**20:,.0f} MiB ({r['seconds']:.1f} s)" if isinstance(r, dict) else r
            for r in result.values()
        ]
        note = ""
        if all(isinstance(r, dict) for r in result.values()):
            note = f"{result['math']['peak_bytes'] / max(result['sdpa']['peak_bytes'], 1):.1f}× more on the math path"
        rows.append((f"peak memory, 1 block, N={length}: fused SDPA vs math path", cells[0], cells[1], note, "O(N)"))

    print(f"linear layers: {routing}\n")
    print("| benchmark | specc | HF / reference | result | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    try:
        from specc.backends.torch.accel.kernels import choices
    except ImportError:
        return
    decided = choices()
    if decided:
        print("\nspecc kernel choices (dtype, rows ≤, out, in, threads, no bias, x contiguous, w contiguous):")
        for key, choice in sorted(decided.items(), key=str):
            times = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in choice.seconds.items())
            print(f"- {tuple(key[1:])}: {choice.kernel} ({times} on {choice.measured})")


if __name__ == "__main__":
    main()
