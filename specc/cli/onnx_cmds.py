"""run: an exported ONNX model on onnxruntime (CUDA EP when it really loads, else CPU)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from ..errors import SpecError, check_ids
from . import limits
from .app import app, err, out


class Provider(str, Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


@app.command("run")
def run_(
    model: Annotated[Path, typer.Argument(help="model.onnx written by `specc compile --target onnx`")],
    input_ids: Annotated[
        str | None, typer.Option("--input-ids", help='token ids, rows split by ";": "1 2 3; 4 5 6"')
    ] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", help="x.npy (first input), name=x.npy, or a .npz by input name")
    ] = None,
    random: Annotated[str | None, typer.Option("--random", help="random inputs of batch B, length N: B,N")] = None,
    provider: Annotated[Provider, typer.Option("--provider", help="auto | cuda | cpu")] = Provider.auto,
    threads: Annotated[
        int | None, typer.Option("--threads", help="intra-op threads (default: usable cores; at most 4 × cores)")
    ] = None,
    generate: Annotated[int | None, typer.Option("--generate", help="greedy-decode N new tokens")] = None,
    start_id: Annotated[
        int | None,
        typer.Option(
            "--start-id",
            "--decoder-start-id",
            help="seq2seq models' first decoder token (default: the spec's decoder_start_token, else specc's <bos> 1)",
        ),
    ] = None,
    eos_id: Annotated[int | None, typer.Option("--eos-id", help="stop a row at this token")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="top-k ids shown per row")] = 5,
    bench: Annotated[bool, typer.Option("--bench", help="latency percentiles and tokens/s")] = False,
    iters: Annotated[int, typer.Option("--iters", help="timed repetitions for --bench (at most 10000)")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed repetitions for --bench (at most 1000)")] = 3,
    seed: Annotated[int, typer.Option("--seed", help="seed of --random")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", help="onnxruntime VERBOSE log (kernel choices)")] = False,
) -> None:
    """Run an exported model: logits summary and top-k, greedy generation, or a latency benchmark."""
    limits.threads(threads)
    limits.bounded(generate, "--generate", 1, limits.MAX_NEW_TOKENS)
    limits.bounded(top_k, "--top-k", 1, limits.MAX_TOP_K)
    limits.bounded(iters, "--iters", 1, limits.MAX_ITERS)
    limits.bounded(warmup, "--warmup", 0, limits.MAX_WARMUP)
    limits.seed(seed)
    limits.argument_length(random, "--random")
    limits.argument_length(input_ids, "--input-ids", 1 << 22)
    with native_log_filtered(not verbose):
        _run(model, input_ids, inputs, random, provider, threads, generate, start_id, eos_id, top_k, bench, iters,
             warmup, seed, verbose)  # fmt: skip


_ORT_LOG = re.compile(r"\[[VIWEF]:onnxruntime:|^\s*(\x1b\[[0-9;]*m\s*)+$")


@contextlib.contextmanager
def native_log_filtered(enabled: bool) -> Iterator[None]:
    """onnxruntime's C++ logger writes coloured lines straight to file descriptor 2, whatever the session's
    severity, before its exception reaches specc; outside ``--verbose`` those lines are dropped (specc reports
    the error in its own one line) and anything else written to fd 2 meanwhile is passed on afterwards."""
    if not enabled:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no file descriptor 2
        yield
        return
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines(keepends=True) if not _ORT_LOG.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def _note_past_context(m, feeds: dict[str, np.ndarray], new: int) -> None:
    """A model without a learned position table runs past its spec's context (rotary or sinusoidal positions
    extrapolate), but not where it was trained: say so once, on stderr."""
    from ..runtime.inputs import cached_tokens

    context, ids = m.ir_meta.get("context"), feeds.get("decoder_input_ids", feeds.get("input_ids"))
    if not context or m.max_positions or ids is None or ids.ndim != 2:
        return
    if (length := cached_tokens(feeds) + ids.shape[1] + new) > context:
        err.print(f"note: {length} tokens pass the spec's context of {context}: positions beyond it extrapolate")


def _run(model, input_ids, inputs, random, provider, threads, generate, start_id, eos_id, top_k, bench, iters, warmup,
         seed, verbose) -> None:  # fmt: skip
    from ..runtime import inputs as rin
    from ..runtime.generate import greedy
    from ..runtime.onnx_model import OrtModel

    m = OrtModel.open(model, provider.value, threads, verbose)
    if start_id is None:
        start_id = m.ir_meta.get("decoder_start_token_id", 1)
    if m.ir_meta.get("task") == "seq2seq":
        check_ids([start_id], m.vocab("decoder_input_ids"), "--start-id")
    check_ids([] if eos_id is None else [eos_id], m.vocab("decoder_input_ids") or m.vocab("input_ids"), "--eos-id")
    note = "" if m.provider.startswith("CUDA") or provider is Provider.cpu else " (CUDA EP not available)"
    out.print(f"provider: {m.provider}{note}; threads: {threads or _threads()}")

    if random is not None and (input_ids is not None or inputs):
        raise SpecError("--random cannot be combined with --input-ids or --input")
    feeds: dict[str, np.ndarray] = {}
    if inputs:
        feeds.update(rin.load_npy(m, inputs))
    if input_ids is not None:
        feeds["input_ids"] = rin.parse_ids(input_ids)
    if not feeds:
        b, n = rin.parse_random(random or "1,8")
        feeds = rin.random_inputs(m, b, n, seed)
    feeds = rin.check(m, rin.complete(m, feeds, start_id))
    _show_inputs(feeds)
    _note_past_context(m, feeds, generate or 0)

    if generate is not None:
        new = greedy(m, feeds, generate, start_id=start_id, eos_id=eos_id)
        out.print(f"generated {new.shape[1]} tokens per row:")
        for row in new:
            out.print("  " + " ".join(str(int(t)) for t in row))
        if bench:
            from ..runtime.bench import benchmark

            res = benchmark(
                lambda: greedy(m, feeds, generate, start_id=start_id, eos_id=None),
                iters=max(1, min(iters, 5)),
                warmup=min(warmup, 1),
                tokens_per_call=new.shape[0] * generate,
                label="generate",
            )
            _show_bench(res, "new tokens")
        return

    result = _forward(m, feeds, start_id)
    _show_outputs(result, top_k)
    if bench:
        from ..runtime.bench import benchmark

        if "input_ids" in feeds:
            count, unit = int(feeds["input_ids"].size), "tokens"
        else:
            count, unit = int(next(iter(feeds.values())).shape[0]), "samples"
        res = benchmark(lambda: _forward(m, feeds, start_id), iters=iters, warmup=warmup, tokens_per_call=count)
        _show_bench(res, unit)


def _threads() -> int:
    from ..runtime.ort_session import default_threads

    return default_threads()


def _forward(m, feeds: dict[str, np.ndarray], start_id: int) -> dict[str, np.ndarray]:
    """One forward; for split seq2seq exports: the encoder, then one decoder step from the start token."""
    if m.role != "encoder":
        return m.run(feeds)
    if m.split_decoder:
        from ..runtime.generate import encode, first_step

        fixed = encode(m, feeds)
        return {"last_hidden_state": fixed["encoder_hidden_states"], **m.run(first_step(m, fixed, start_id), "decoder")}
    from ..runtime.generate import rnn_states, rnn_step

    carried = rnn_states(m, feeds)
    token = np.full((next(iter(feeds.values())).shape[0], 1), start_id, np.int64)
    step, _ = rnn_step(m, carried, token)
    return {**{k: v for k, v in carried.items() if k not in feeds}, **step}


def _show_inputs(feeds: dict[str, np.ndarray]) -> None:
    shown = [f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items() if not k.startswith("past_key_values.")]
    out.print("inputs: " + ", ".join(shown))


def _show_outputs(result: dict[str, np.ndarray], top_k: int) -> None:
    t = Table("output", "shape", "dtype", "mean", "std", "min", "max", "NaN", box=None, pad_edge=False)
    for name, v in result.items():
        if name.startswith("present."):
            continue
        v = np.asarray(v)
        if v.size and v.dtype.kind in "biuf":
            f = v.astype(np.float64)
            stats = [f"{f.mean():.4g}", f"{f.std():.4g}", f"{f.min():.4g}", f"{f.max():.4g}"]
        else:  # empty, or not numbers (strings, objects)
            stats = ["-"] * 4
        nan = str(int(np.isnan(v).sum())) if v.dtype.kind == "f" else "-"
        t.add_row(name, str(list(v.shape)), str(v.dtype), *stats, nan)
    out.print(t)
    logits = result.get("logits")
    if logits is None or np.asarray(logits).ndim not in (2, 3) or not np.asarray(logits).size:
        return
    if np.asarray(logits).dtype.kind not in "biuf":
        return
    last = logits[:, -1] if logits.ndim == 3 else logits
    where = "at the last position" if logits.ndim == 3 else "per sample"
    out.print(f"top-{top_k} {where}:")
    for b, row in enumerate(last[:8].astype(np.float32)):
        k = min(top_k, row.shape[-1])
        idx = np.argsort(-row, kind="stable")[:k]
        out.print(f"  [{b}] " + "  ".join(f"{int(i)} ({row[i]:.3f})" for i in idx))


def _show_bench(res, unit: str) -> None:
    s = res.summary()
    out.print(
        f"latency p50 {s['p50_ms']:.2f} ms  p90 {s['p90_ms']:.2f} ms  p99 {s['p99_ms']:.2f} ms  "
        f"(mean {s['mean_ms']:.2f}, min {s['min_ms']:.2f}, n={len(res.times_s)}); {s['tokens_per_s']:.1f} {unit}/s"
    )
