"""GPU check (≤ 8 minutes on one GPU): ORT CUDA EP fp16 with the fused attention op vs torch SDPA.

    python bench/gpu_onnx.py [--spec gpt2] [--seqs 512,2048] [--batch 1,8] [--out gpu_onnx_logs]

For each exported variant (standard ``Attention`` without a padding mask — the case ORT's CUDA EP can hand
to Flash —, standard with a padding mask, and contrib ``MultiHeadAttention``), it prints forward latency
and tokens/s next to the specc torch backend (fp16, SDPA) and the kernel ORT chose: the session runs with
``log_severity_level=0`` (VERBOSE) and ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO=1``; the log goes to
``<out>/<variant>.log`` and its attention-kernel lines are echoed. Exits 2 when no CUDA GPU is usable.
Outputs stay on the GPU (IOBinding), so device-to-host copies of the logits are not timed; a separate quiet
session is timed (VERBOSE logging slows runs). ``--cpu-dry-run --set blocks=2`` exercises the script on a
machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO", "1")

KERNEL = re.compile(r"flash|efficient|memory.efficient|cudnn|unfused|fused|trt|kernel|sdpa|AttentionKernel", re.I)


@contextlib.contextmanager
def output_to(path: Path):
    """ORT's C++ logs (fd 2) and its kernel debug info (fd 1) captured in a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def ort_session(path: Path, device: str, verbose: bool):
    import onnxruntime as ort

    if device == "cuda":
        with contextlib.suppress(Exception):
            ort.preload_dlls()
    so = ort.SessionOptions()
    so.log_severity_level = 0 if verbose else 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    want = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    sess = ort.InferenceSession(str(path), so, providers=[want, "CPUExecutionProvider"])
    if sess.get_providers()[0] != want:
        raise SystemExit(f"the CUDA EP did not load for {path.name}: {sess.get_providers()}")
    return sess


def bind(sess, feeds: dict[str, np.ndarray], device: str):
    import onnxruntime as ort

    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, device, 0))
    for o in sess.get_outputs():
        binding.bind_output(o.name, device)  # logits stay on the device: no copy in the timing
    return binding


def time_ort(sess, feeds: dict[str, np.ndarray], iters: int, device: str) -> float:
    binding = bind(sess, feeds, device)
    for _ in range(3):
        sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    t0 = time.perf_counter()
    for _ in range(iters):
        sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    return (time.perf_counter() - t0) / iters


def time_torch(model, ids, iters: int) -> float:
    import torch

    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(3):
            model(ids)
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            model(ids)
        sync()
    return (time.perf_counter() - t0) / iters


def kernel_lines(log: Path, limit: int = 6) -> list[str]:
    seen: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        if "ttention" in line and KERNEL.search(line):
            text = line.split("]", 1)[-1].strip()[:160]
            if text not in seen:
                seen.append(text)
    return seen[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="gpt2")
    ap.add_argument("--seqs", default="512,2048")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="gpu_onnx_logs")
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. --set blocks=2")
    ap.add_argument("--cpu-dry-run", action="store_true", help="exercise this script on the CPU (no timings of note)")
    args = ap.parse_args()

    import torch

    device = "cpu" if args.cpu_dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch; this check needs one", file=sys.stderr)
        raise SystemExit(2)
    import onnxruntime as ort

    import specc

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seqs = [int(s) for s in args.seqs.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    sets = [*args.set, *([f"context={max(seqs)}"] if max(seqs) > 1024 else [])]
    spec = specc.load_spec(args.spec, sets or None)
    weights = {k: v.float() for k, v in specc.build_torch(spec, dtype=torch.float32).state_dict().items()}
    model = specc.build_torch(spec, weights=weights, device=device, dtype=torch.float16).eval()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none (CPU dry run)"
    print(f"GPU: {gpu}; onnxruntime {ort.__version__}; torch {torch.__version__}; spec {args.spec} {sets} fp16\n")
    variants = {
        "standard_nomask": dict(attention="standard", padding_mask=False),
        "standard_mask": dict(attention="standard", padding_mask=True),
        "contrib_mha": dict(attention="contrib", padding_mask=True),
    }
    print("| variant | B | N | ORT ms | torch SDPA ms | ORT/torch speed | ORT tokens/s | kernel (ORT log) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, opts in variants.items():
            path = specc.export_onnx(
                spec, Path(tmp) / f"{name}.onnx", weights=weights, dtype="fp16", check=False, **opts
            )
            log = out / f"{name}.log"
            log.unlink(missing_ok=True)
            shapes = [(b, n) for b in batches for n in seqs]
            feeds = {}
            for b, n in shapes:
                ids = torch.randint(0, spec.vocab_size, (b, n), device=device)
                feeds[b, n] = (ids, {"input_ids": ids.cpu().numpy()})
                if opts["padding_mask"]:
                    feeds[b, n][1]["attention_mask"] = np.ones((b, n), np.int64)
            # a VERBOSE session runs each shape once for the log (kernel choices), a quiet one is timed
            with output_to(log):
                verbose = ort_session(path, device, verbose=True)
                for b, n in shapes:
                    with contextlib.suppress(Exception):
                        verbose.run_with_iobinding(bind(verbose, feeds[b, n][1], device))
                del verbose
            sess = ort_session(path, device, verbose=False)
            kernels = "; ".join(kernel_lines(log, 2)) or "(no attention kernel line in the log)"
            for b, n in shapes:
                ids, feed = feeds[b, n]
                try:
                    t_ort = time_ort(sess, feed, args.iters, device)
                except Exception as e:
                    print(f"| {name} | {b} | {n} | failed: {str(e).splitlines()[0][:80]} | | | | |")
                    continue
                t_torch = time_torch(model, ids, args.iters)
                print(
                    f"| {name} | {b} | {n} | {t_ort * 1e3:.2f} | {t_torch * 1e3:.2f} | {t_torch / t_ort:.2f}× "
                    f"| {b * n / t_ort:,.0f} | {kernels} |"
                )
            del sess
    print(f"\nfull VERBOSE logs: {out}/*.log")
    for name in variants:
        lines = kernel_lines(out / f"{name}.log")
        print(f"{name}:")
        for line in lines or ["(none found; grep the log for 'Attention')"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
