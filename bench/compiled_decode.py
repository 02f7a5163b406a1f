"""Greedy generation with compiled decoding: specc's ``generate(compile=True)`` (each one-token step through
``torch.compile`` over a static cache) against specc's eager decoding, HF ``generate`` eager and, where this
transformers supports it for the model, HF's static cache + ``torch.compile`` with the same inductor options
(mode "reduce-overhead", i.e. CUDA graphs, on CUDA).

The first call of each compiled contender compiles; its excess over a later call is reported as the compile
time. Tokens/s are end to end (prompt included) after that warm-up, timed round-robin in one run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from specc.backends.torch.accel.compiled import CPU_OPTIONS


def hf_compiled_options(hf: Any) -> dict[str, Any] | None:
    """generate() options for HF's static cache + torch.compile (None: not supported for this model here)."""
    try:
        from transformers import CompileConfig
    except ImportError:
        return None
    if not getattr(hf, "_can_compile_fullgraph", False):
        return None
    cuda = next(hf.parameters()).device.type == "cuda"
    config = CompileConfig(mode="reduce-overhead") if cuda else CompileConfig(mode=None, options=dict(CPU_OPTIONS))
    config._compile_all_devices = True  # HF compiles on CUDA by itself; elsewhere only when asked this way
    return {"cache_implementation": "static", "compile_config": config}


def _timed(fn: Callable[[], Any], idle: float, sync: Callable[[], None]) -> tuple[float, Any]:
    time.sleep(idle)
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def compiled_generation(
    ours: torch.nn.Module, hf: Any, ids: torch.Tensor, new: int, reps: int, idle: float
) -> dict[str, Any]:
    """Medians (and best) of tokens/s, compile seconds, and whether the tokens equal eager specc's."""
    sync = torch.cuda.synchronize if ids.device.type == "cuda" else (lambda: None)
    greedy = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False, "pad_token_id": 0}
    contenders: dict[str, Callable[[], Any]] = {
        "specc compiled": lambda: ours.generate(ids, new, compile=True),
        "specc": lambda: ours.generate(ids, new),
        "hf": lambda: hf.generate(ids, **greedy),
    }
    hf_options = hf_compiled_options(hf)
    if hf_options is not None:
        contenders["hf compiled"] = lambda: hf.generate(ids, **greedy, **hf_options)
    out: dict[str, Any] = {}
    with torch.inference_mode():
        reference = ours.generate(ids, new)
        first = {}
        for name, fn in contenders.items():
            try:
                first[name], tokens = _timed(fn, idle, sync)
            except Exception as e:  # HF's compiled path is not ours to fix: report why it is missing
                if name != "hf compiled":
                    raise
                out["hf_compiled_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                continue
            out[f"{name}_same_tokens"] = torch.equal(tokens.cpu(), reference.cpu())
        contenders = {k: v for k, v in contenders.items() if k in first}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(reps):
            for name, fn in contenders.items():
                times[name].append(_timed(fn, idle, sync)[0])
    for name, ts in times.items():
        out[f"{name}_tok_s"], out[f"{name}_best_tok_s"] = new / statistics.median(ts), new / min(ts)
        if name.endswith("compiled"):
            out[f"{name}_compile_s"] = first[name] - statistics.median(ts)
    return out
