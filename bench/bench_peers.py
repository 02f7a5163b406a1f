"""specc's ONNX export side by side with onnxruntime-genai's model builder, on the same Hugging Face twin.

    python bench/bench_peers.py            # a TinyLlama-1.1B-shaped twin (1.1B parameters, random weights)
    python bench/bench_peers.py --quick    # smoke test: a 30M-parameter twin, few training steps
    python bench/bench_peers.py --keep DIR # keep the twins and graphs in DIR

One run measures, for specc (`specc compile --target onnx --kv-cache --genai [--quantize int8|int4]`) and the
builder (`python -m onnxruntime_genai.models.builder -p fp32|int8|int4 -e cpu`), from the same save_pretrained folder
(fp32 safetensors, made here from a config with random weights; nothing is downloaded):
- export wall time and peak RSS (the exporting process's, from wait4; RSS is the number that does not depend on
  how loaded the host is);
- the files' size (graph + external data);
- greedy decode tokens/s, prompt 32 + 64 new tokens, through the same loop for both (onnxruntime-genai's
  Generator, loading specc's graph by its genai_config.json), and whether the ids equal HF transformers' greedy
  ids (the longest common prefix, of 64); the session's load time; two rounds with the variants interleaved,
  best of each (the host may be shared);
- one forward over 512 tokens (genai: the prompt appended in one call), best of the two rounds;
- on a character-level Llama trained here (the repository's Python sources; HF transformers, a few hundred
  steps), the mean KL(HF fp32 ‖ graph) of the next-token distributions on held-out windows, fp32, int8, int4.
The builder runs in its own environment (bench/requirements-peers.txt via scripts/genai_env.sh): it and
onnxruntime-genai need the plain onnxruntime, which clashes with specc's onnxruntime-gpu. Every stage is its own
process, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
WORKER = ROOT / "bench" / "peers_worker.py"
# (name, tool, precision, specc options): int4 with the token table kept float is the builder's int4 layout
VARIANTS = [
    ("specc fp32", "specc", None, []),
    ("specc int8", "specc", "int8", []),
    ("specc int4", "specc", "int4", []),
    ("specc int4 (table fp32)", "specc", "int4", ["--no-quantize-embedding"]),
    ("builder fp32", "builder", None, []),
    ("builder int8", "builder", "int8", []),
    ("builder int4", "builder", "int4", []),
]

# TinyLlama-1.1B's shape (Llama, GQA 32/4): 1.10B parameters, 4.4 GB in fp32
SHARED = dict(vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False)
FULL = dict(SHARED, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
            num_key_value_heads=4)  # fmt: skip
QUICK = dict(SHARED, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2)  # fmt: skip


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes, stdout) of one process, which must succeed; the child is reaped by wait4
    (for its own rusage: Popen's wait would reap it first)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or dict(os.environ))
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        pumps = [(proc.stdout, so), (proc.stderr, se)]  # drained while wait4 waits
        threads = [threading.Thread(target=shutil.copyfileobj, args=pair) for pair in pumps]
        for t in threads:
            t.start()
        _, status, usage = os.wait4(proc.pid, 0)
        for t in threads:
            t.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0)
        se.seek(0)
        out, err = so.read().decode(), se.read().decode()
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{err[-4000:]}")
    return seconds, usage.ru_maxrss * 1024, out


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".data"))


class Bench:
    def __init__(self, work: Path, peer: str, threads: int) -> None:
        self.work, self.peer, self.threads = work, peer, threads
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                    "OMP_NUM_THREADS": str(threads)}  # fmt: skip

    def worker(self, *args: str) -> dict:
        return last_json(run_measured([self.peer, str(WORKER), *args], self.env)[2])

    def export(self, tool: str, hf: Path, out: Path, quantize: str | None, extra: list[str]) -> tuple[float, int]:
        if out.exists():
            shutil.rmtree(out)
        if tool == "specc":
            return self.export_specc(hf, out, quantize, extra)
        return self.export_builder(hf, out, quantize)

    def export_specc(self, hf: Path, out: Path, quantize: str | None, extra: list[str]) -> tuple[float, int]:
        spec = self.work / f"{hf.name}.yaml"
        run_measured([sys.executable, "-m", "specc", "import-hf", str(hf), "-o", str(spec)], self.env)
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "specc", "compile", str(spec), "--target", "onnx", "--kv-cache", "--genai",
               "--weights", str(hf), "-o", str(out / "model.onnx")]  # fmt: skip
        cmd += [*(["--quantize", quantize] if quantize else []), *extra]
        seconds, rss, _ = run_measured(cmd, self.env)
        return seconds, rss

    def export_builder(self, hf: Path, out: Path, quantize: str | None) -> tuple[float, int]:
        cmd = [self.peer, "-m", "onnxruntime_genai.models.builder", "-m", hf.name, "-i", str(hf), "-o", str(out),
               "-p", quantize or "fp32", "-e", "cpu", "-c", str(self.work / "builder-cache")]  # fmt: skip
        seconds, rss, _ = run_measured(cmd, self.env)
        return seconds, rss


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    from cpu_info import cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--keep", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="training steps of the char LM (default 400; quick 30)")
    args = p.parse_args(argv)
    env_script, requirements = ROOT / "scripts" / "genai_env.sh", ROOT / "bench" / "requirements-peers.txt"
    made = subprocess.run(["bash", str(env_script), str(requirements)], capture_output=True, text=True, check=False)
    if made.returncode:
        raise SystemExit(f"the peer environment could not be made:\n{made.stderr[-3000:]}")
    peer = made.stdout.strip().splitlines()[-1]
    work = args.keep or Path(tempfile.mkdtemp(prefix="specc-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, peer, args.threads)
    import onnxruntime

    import specc

    versions = subprocess.run([peer, "-c", "import onnxruntime_genai as g, onnxruntime as o, torch, transformers; "
                               "print(g.__version__, o.__version__, torch.__version__, transformers.__version__)"],
                              capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores visible; threads {args.threads}")
    print(f"specc {specc.__version__} (onnxruntime-gpu {onnxruntime.__version__}, CPU provider); onnxruntime-genai "
          f"{versions[0]} builder + runtime (onnxruntime {versions[1]}, torch {versions[2]}, "
          f"transformers {versions[3]})")  # fmt: skip

    # 1. the twin: random weights from a config, saved by save_pretrained in fp32
    hf = work / "twin"
    if not (hf / "config.json").exists():
        cfg = QUICK if args.quick else FULL
        facts = bench.worker("twin", str(hf), "--arch", "llama", "--config", json.dumps(cfg))
    else:  # kept from an earlier run (--keep): fp32 bytes / 4
        facts = {"params": sum(f.stat().st_size for f in hf.glob("*.safetensors")) // 4}
    params = facts["params"]
    print(f"twin: Llama {json.loads((hf / 'config.json').read_text())['hidden_size']} wide, "
          f"{params / 1e9:.2f}B parameters, fp32 safetensors "
          f"{sum(f.stat().st_size for f in hf.glob('*.safetensors')) / 1e9:.2f} GB")  # fmt: skip

    rows: dict[str, dict] = {}
    for i, (name, tool, q, extra) in enumerate(VARIANTS):
        out = work / f"graph-{i}"
        seconds, rss = bench.export(tool, hf, out, q, extra)
        rows[name] = {"export_s": seconds, "rss": rss, "bytes": folder_bytes(out), "out": out}
        print(f"  exported {name}: {seconds:.1f} s, peak RSS {rss / 1e9:.2f} GB", file=sys.stderr, flush=True)
    ref = bench.worker("hf-ids", str(hf), "--threads", str(args.threads))["ids"]
    for r in range(2):  # two rounds, variants interleaved, best of each: the host may be shared
        for name, row in rows.items():
            d = bench.worker("decode", str(row["out"]), "--threads", str(args.threads), "--reps", "2")
            if d["tok_s"] > row.get("tok_s", 0):
                row["tok_s"], row["ids"] = d["tok_s"], common_prefix(d["ids"], ref)
            row["load_s"] = min(row.get("load_s", float("inf")), d["load_s"])
            f = bench.worker("prefill", str(row["out"]), "--threads", str(args.threads), "--reps", "1")
            row["prefill_s"] = min(row.get("prefill_s", float("inf")), f["seconds"])
            print(f"  ran {name} (round {r + 1})", file=sys.stderr, flush=True)

    # 2. quality on a trained char LM: KL(HF fp32 ‖ graph)
    text = work / "text.txt"
    text.write_bytes(b"".join(p.read_bytes() for p in sorted((ROOT / "specc").rglob("*.py")))[:400_000])
    lm = work / "char-lm"
    steps = args.steps or (30 if args.quick else 400)
    trained = bench.worker("train", str(lm), "--text", str(text), "--steps", str(steps), "--threads", str(args.threads))
    graphs = {}
    for i, (name, tool, q, extra) in enumerate(VARIANTS):
        graphs[name] = work / f"lm-{i}"
        bench.export(tool, lm, graphs[name], q, extra)
    folders = [str(g) for g in graphs.values()]
    quality = bench.worker("kl", str(lm), *folders, "--text", str(text), "--threads", str(args.threads))

    print()
    print("| | export time | export peak RSS | files | session load | decode tok/s (32 + 64) | ids = HF | "
          "forward 512 tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['export_s']:.1f} s | {r['rss'] / 1e9:.2f} GB | {r['bytes'] / 1e6:.0f} MB | "
              f"{r['load_s']:.1f} s | {r['tok_s']:.1f} | {r['ids']}/64 | {r['prefill_s']:.2f} s |")  # fmt: skip
    print()
    print(f"char LM (Llama 128 wide, 2 layers, trained {trained['steps']} steps in {trained['seconds']:.0f} s, "
          f"final loss {trained['loss']:.3f}; HF fp32 perplexity {quality['hf_ppl']:.3f} on 16 held-out windows of "
          f"128 characters):")  # fmt: skip
    print("| graph | mean KL(HF fp32 ‖ graph) | perplexity |")
    print("|---|---|---|")
    for name, g in graphs.items():
        q = quality[g.name]
        print(f"| {name} | {q['kl']:.2e} | {q['ppl']:.3f} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
