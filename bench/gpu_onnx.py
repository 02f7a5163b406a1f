"""GPU check: ORT's CUDA EP on the fp16 and bf16 graphs with the fused attention op vs torch SDPA.

    python bench/gpu_onnx.py                       # GPT-2-XL, B=8, N=1024, fp16 + bf16, standard + contrib
    python bench/gpu_onnx.py --cpu-dry-run         # the same logic on the CPU EP with a 2-block toy model

For each variant (dtype fp16 | bf16 × ``--attention standard`` (opset-23 ``Attention``, exported without a
padding mask: the case the CUDA EP hands to Flash) | ``contrib`` (``MultiHeadAttention`` with a mask)):
- the fused kernel ran: ORT's profiler (``enable_profiling``) lists one attention node per layer, each on the
  CUDA EP, and the kernel names it records (or, in builds without GPU kernel tracing, the kernel that ORT's
  ``ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO`` log names) are fused ones (Flash, memory-efficient / cutlass
  FMHA, cuDNN, TensorRT), not the unfused path;
- logits vs the torch backend in fp32 on the same weights: max |Δ| ≤ tol · max(1, max |logits|), tol 2e-2 for
  fp16, 8e-2 for bf16;
- forward latency vs the torch backend (SDPA) in the same dtype, inputs and outputs on the GPU (IOBinding);
- greedy decode tokens/s through the KV-cache graph (presents bound on the GPU and fed back as the next step's
  past, no host copies of the cache) vs the torch backend's ``generate`` (KV cache).
Exits 0 when every check passed, 1 when one failed, 2 when no CUDA GPU / CUDA EP is usable.
``--cpu-dry-run`` runs every step on the CPU EP (the kernel check then only asks for one attention node per
layer on the CPU EP); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("ORT_ENABLE_ATTENTION_KERNEL_DEBUG_INFO", "1")

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
FUSED = re.compile(r"flash|efficient|fmha|cutlass|cudnn|trt|fused_mha|xformers", re.I)
UNFUSED = re.compile(r"unfused|math", re.I)
TOL = {"fp16": 2e-2, "bf16": 8e-2}
VARIANTS = {  # name: export options
    "fp16_standard": dict(dtype="fp16", attention="standard", padding_mask=False),
    "fp16_contrib": dict(dtype="fp16", attention="contrib", padding_mask=True),
    "bf16_standard": dict(dtype="bf16", attention="standard", padding_mask=False),
    "bf16_contrib": dict(dtype="bf16", attention="contrib", padding_mask=True),
}


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


def ort_session(path: Path, device: str, profile: str | None = None, verbose: bool = False):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 0 if verbose else 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    want = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    sess = ort.InferenceSession(str(path), so, providers=[want, "CPUExecutionProvider"])
    if sess.get_providers()[0] != want:  # get_available_providers() lists CUDA whenever the wheel has it
        print(f"the CUDA EP did not load for {path.name}: {sess.get_providers()}", file=sys.stderr)
        raise SystemExit(2)
    return sess


def ort_value(x: np.ndarray, device: str):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(x, device, 0)


def bind(sess, feeds: dict, device: str):
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_ortvalue_input(k, v if hasattr(v, "data_ptr") else ort_value(v, device))
    for o in sess.get_outputs():
        binding.bind_output(o.name, device)  # outputs stay on the device: no copy in the timing
    return binding


def time_ort(sess, feeds: dict, iters: int, device: str) -> float:
    binding = bind(sess, feeds, device)
    for _ in range(2):
        sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    t0 = time.perf_counter()
    for _ in range(iters):
        sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    return (time.perf_counter() - t0) / iters


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_torch(fn, iters: int, device: str) -> float:
    import torch

    with torch.inference_mode():
        for _ in range(2):
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
    return (time.perf_counter() - t0) / iters


def kernel_check(trace: str, log: Path, layers: int, device: str) -> tuple[bool, str]:
    """(passed, what ran) from the profiler trace and the kernel debug log."""
    events = json.loads(Path(trace).read_text())
    nodes = {e["name"]: e["args"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")}
    attn = {n: a for n, a in nodes.items() if a.get("op_name") in ATTENTION_OPS}
    providers = {a.get("provider", "?") for a in attn.values()}
    kinds = sorted({a.get("op_name") for a in attn.values()})
    want_ep = "CUDAExecutionProvider" if device == "cuda" else "CPUExecutionProvider"
    ok = len(attn) == layers and providers == {want_ep}
    facts = f"{len(attn)} {'/'.join(kinds) or 'attention'} node(s) on {','.join(sorted(providers)) or '-'}"
    if device != "cuda":
        return ok, facts + " (CPU: no GPU kernel to check)"
    gpu = sorted({e["name"] for e in events if e.get("cat") == "Kernel" and FUSED.search(e["name"])})
    logged = [line for line in log.read_text(errors="replace").splitlines() if "ttention" in line and "ernel" in line]
    named = gpu or [line.split("]", 1)[-1].strip()[:120] for line in logged]
    fused = any(FUSED.search(n) for n in named) and not any(UNFUSED.search(n) for n in named)
    return ok and fused, f"{facts}; kernel: {'; '.join(dict.fromkeys(named)) or 'none named'}"


ELEM = {"tensor(float)": TensorProto.FLOAT, "tensor(float16)": TensorProto.FLOAT16,
        "tensor(bfloat16)": TensorProto.BFLOAT16}  # fmt: skip


def host(value) -> np.ndarray:
    """An ORT output (on any device, bf16 included: numpy has no bf16) as fp32 numpy, through DLPack."""
    import torch

    return torch.from_dlpack(value).float().cpu().numpy()


def ort_decode(sess, ids: np.ndarray, new: int, device: str) -> np.ndarray:
    """Greedy decode with the KV cache kept on the device: each step's presents are the next step's pasts."""
    import onnxruntime as ort

    batch, names = ids.shape[0], [i.name for i in sess.get_inputs()]
    pasts = {
        i.name: ort.OrtValue.ortvalue_from_shape_and_type([batch, i.shape[1], 0, i.shape[3]], ELEM[i.type], device, 0)
        for i in sess.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    outs = [o.name for o in sess.get_outputs()]
    step, total, tokens = ids, ids.shape[1], []
    for _ in range(new):
        feeds = {"input_ids": step, **pasts}
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((batch, total), np.int64)
        binding = bind(sess, feeds, device)
        sess.run_with_iobinding(binding)
        values = dict(zip(outs, binding.get_outputs(), strict=True))
        nxt = host(values["logits"])[:, -1].argmax(-1)
        tokens.append(nxt)
        pasts = {f"past_key_values.{k[len('present.') :]}": v for k, v in values.items() if k.startswith("present.")}
        step, total = nxt[:, None].astype(np.int64), total + 1
    return np.stack(tokens, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="gpt2-xl")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--new-tokens", type=int, default=64, help="decode steps (batch 1, prompt 32)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--out", default="gpu_onnx_logs", help="folder for the profiler traces and kernel logs")
    ap.add_argument("--set", action="append", default=[], help="spec override, e.g. --set blocks=2")
    ap.add_argument("--cpu-dry-run", action="store_true", help="run the script's logic on the CPU EP, toy model")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch

    import specc

    dry = args.cpu_dry_run
    device = "cpu" if dry else "cuda"
    if not dry and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch; this check needs one (or --cpu-dry-run)", file=sys.stderr)
        return 2
    sets = [*args.set, *(["blocks=2", "d_model=64", "attention.heads=4", "vocab_size=97", "context=64"] if dry else [])]
    batch, seq, new = (2, 16, 4) if dry else (args.batch, args.seq, args.new_tokens)
    spec = specc.load_spec(args.spec, sets or None)
    chosen = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        print(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.float() for k, v in specc.build_torch(spec, dtype=torch.float32).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), generator=gen)
    prompt = torch.randint(0, spec.vocab_size, (1, min(32, seq)), generator=gen)
    on_device = ids.to(device)
    with torch.inference_mode():
        ref = specc.build_torch(spec, weights=weights, device=device).eval()(on_device).float().cpu().numpy()
    layers = sum(1 for op in specc.lower(spec).ops() if op.kind == "attention")
    name = torch.cuda.get_device_name() if not dry else "none (CPU dry run)"
    print(f"GPU: {name}; onnxruntime {ort.__version__}; torch {torch.__version__}; spec {args.spec} {sets}; "
          f"forward B={batch} N={seq}; decode batch 1, prompt {prompt.shape[1]}, {new} new tokens\n")  # fmt: skip
    print("| variant | fused attention (ORT profiler) | max abs logits diff vs torch fp32 (tol) | ORT forward ms "
          "| torch SDPA ms | ORT / torch speed | ORT decode tok/s | torch decode tok/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for variant in chosen:
        opts = VARIANTS[variant]
        if dry and opts["dtype"] == "bf16":  # the CPU EP has no bf16 kernels for most ops
            print(f"| {variant} | skipped in the CPU dry run: bf16 needs the CUDA EP | | | | | | |")
            continue
        tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[opts["dtype"]]
        model = specc.build_torch(spec, weights=weights, device=device, dtype=tdtype).eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = specc.export_onnx(spec, Path(tmp) / f"{variant}.onnx", weights=weights, check=False, **opts)
            cached = specc.export_onnx(spec, Path(tmp) / f"{variant}_kv.onnx", weights=weights, check=False,
                                       kv_cache=True, **opts)  # fmt: skip
            log = out / f"{variant}.log"
            log.unlink(missing_ok=True)
            feed = {"input_ids": ids.numpy()}
            if opts["padding_mask"]:
                feed["attention_mask"] = np.ones((batch, seq), np.int64)
            with output_to(log):  # one profiled, VERBOSE run: which node ran where, which kernel
                prof = ort_session(path, device, profile=str(out / variant), verbose=True)
                prof.run_with_iobinding(bind(prof, feed, device))
                trace = prof.end_profiling()
                del prof
            fused, facts = kernel_check(trace, log, layers, device)
            sess = ort_session(path, device)
            binding = bind(sess, feed, device)
            sess.run_with_iobinding(binding)
            logits = host(binding.get_outputs()[0])
            diff = float(np.abs(logits - ref).max())
            tol = TOL[opts["dtype"]] * max(1.0, float(np.abs(ref).max()))
            t_ort = time_ort(sess, feed, args.iters, device)
            t_torch = time_torch(lambda m=model: m(on_device), args.iters, device)
            del sess
            dec = ort_session(cached, device)
            pids = prompt.numpy()
            ort_decode(dec, pids, 2, device)  # warm-up
            t0 = time.perf_counter()
            ort_decode(dec, pids, new, device)
            ort_tok = new / (time.perf_counter() - t0)
            with torch.inference_mode():
                model.generate(prompt.to(device), 2)
                sync(device)
                t0 = time.perf_counter()
                model.generate(prompt.to(device), new)
                sync(device)
                torch_tok = new / (time.perf_counter() - t0)
            del dec
        ok = fused and diff <= tol
        failed |= not ok
        verdict = "" if diff <= tol else " FAIL"
        print(f"| {variant} | {'yes' if fused else 'NO'}: {facts} | {diff:.2e} ({tol:.1e}){verdict} "
              f"| {t_ort * 1e3:.2f} | {t_torch * 1e3:.2f} | {t_torch / t_ort:.2f}× | {ort_tok:.1f} "
              f"| {torch_tok:.1f} |")  # fmt: skip
    print(f"\nprofiler traces and VERBOSE logs: {out}/")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
