"""How fast ORT streams GPT-2 small's weights through one-row MatMuls, in graph and session variants.

    python bench/ort_gemv.py                      # the default variants, 15 rounds (~5 minutes on 2 cores, ~10 GB)
    python bench/ort_gemv.py --rounds 40 --only mm,kvc,kvc_t2,kvc_thp,torch_sum_flat

One call = one decode step's linears: 12 × [768→2304, 768→768, 768→3072, 3072→768] (with biases) + 768→50257
(the tied lm_head, no bias), a chain (each output feeds the next: the QKV output through a Slice), fp32,
B=1, one token: 472 MiB of weights. A timed sample is ``--steps`` calls back to back (as generation runs
them) after an idle gap (so no contender's spinning workers take the next one's core); samples are
round-robin over the variants (the order rotated every round), so load from other processes falls on every
variant alike. A sample is *quiet* when the other processes used under 10% of a core while it ran
(/proc/stat less this process's own CPU time). Printed per variant: GB/s of the median sample (all, and
quiet ones), of the best sample, and the median over rounds of each round's speed ratio to the baseline
``mm`` (paired: the two ran seconds apart, so slow drifts cancel; rounds where both were quiet). A variant
named twice (``kvc`` and ``kvc_t2`` on 2 cores are the same session) shows the noise of that ratio.

Variants (the weights are the same random values in every chain):
- ``mm``: MatMul on a [1, 1, 768] input with B [in, out] and a separate Add for the bias: what the KV-cache
  graphs run after ORT's optimizations (their Transpose of the [out, in] initializer is constant-folded);
- ``mm_nobias``: the same without the bias Adds; ``fmm_tB``: com.microsoft FusedMatMul transB=1 on the
  [out, in] initializer (+ Add); ``gemm`` / ``gemm_tB``: Gemm on a [1, 768] input, B [in, out] / [out, in]
  (transB=1), the bias as C;
- ``kv`` / ``kvc``: a real decode step (one token after a 96-token cache) of GPT-2 small's exported KV-cache
  graph, standard / ``--attention contrib`` (the latter through its in-place cache buffer, as generation
  runs it); GB/s counted on the chain's 472 MiB, which is what such a step reads, less the norms;
- ``conv``: every linear a 1×1 Conv on a [1, in, 1, 1] input (weight [out, in, 1, 1], bias as B): ORT's NCHWc
  layout pass turns these into MLAS's blocked pointwise-conv kernel, which reads a one-column weight faster
  than its one-row MatMul kernel on some CPUs;
- ``big``: bench_onnx.py's ORT reader, one [1, 4096] × [4096, 16384] MatMul (256 MiB); ``big_conv``: the
  same weight as a 1×1 Conv;
- options after any of those, joined by ``_``: ``nospin`` (``session.intra_op.allow_spinning=0``), ``dbbK``
  (``session.dynamic_block_base=K``), ``noprepack`` (``session.disable_prepacking=1``: MLAS then runs its
  M=1 kernels on the initializer as stored), ``tN`` (N intra-op threads), ``aff``
  (``session.intra_op_thread_affinities``: workers pinned from the second logical processor on), ``thp``
  (the session's new memory collapsed into transparent huge pages, ort_hugepages.py);
- readers: ``torch_sum`` (torch ``sum()`` over each weight tensor in turn), ``torch_sum_flat`` (one ``sum()``
  over all the weights in one torch tensor: 4 KiB pages), ``torch_sum_thp`` (the same over numpy's memory,
  which numpy advises onto huge pages), ``torch_linear`` (torch ``F.linear`` chain, the same shapes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

D, HIDDEN, VOCAB, LAYERS = 768, 3072, 50257, 12
SETTLE_S = 0.1
QUIET = 0.1  # a sample is quiet when other processes used under 10% of one core meanwhile,
TICKS = 2  # give or take two clock ticks (/proc/stat counts in ticks, a process's own time more finely)
FORMS = ("mm", "mm_nobias", "fmm_tB", "gemm", "gemm_tB", "conv", "kv", "kvc", "big", "big_conv")
BIG = (4096, 16384)  # bench_onnx.py's ORT reader: one 256 MiB weight through a one-row MatMul
PAST = 96  # the exported graphs' decode step: one token after a 96-token cache (mid-way through the bench's)
OPTIONS = {"nospin": ("session.intra_op.allow_spinning", "0"), "noprepack": ("session.disable_prepacking", "1")}
DEFAULT = ["mm", "gemm_tB", "fmm_tB", "mm_noprepack", "big", "kvc", "kvc_t2", "kvc_nospin", "kvc_dbb8",
           "kvc_noprepack", "kvc_aff", "kvc_thp", "torch_sum", "torch_sum_flat", "torch_sum_thp"]  # fmt: skip


def parse_variant(name: str) -> tuple[str, dict[str, str], int | None, set[str]]:
    """``FORM[_OPTION...]`` → (graph form, session config entries, intra-op threads or None for all, the flags
    aff / thp); options as in the module docstring."""
    form = max((f for f in FORMS if name == f or name.startswith(f + "_")), key=len, default=None)
    if form is None:
        raise ValueError(name)
    config: dict[str, str] = {}
    threads = None
    flags: set[str] = set()
    for opt in [o for o in name[len(form) :].split("_") if o]:
        if opt in OPTIONS:
            config[OPTIONS[opt][0]] = OPTIONS[opt][1]
        elif opt in ("thp", "aff"):
            flags.add(opt)
        elif opt.startswith("dbb") and opt[3:].isdigit():
            config["session.dynamic_block_base"] = opt[3:]
        elif opt.startswith("t") and opt[1:].isdigit():
            threads = int(opt[1:])
        else:
            raise ValueError(name)
    return form, config, threads, flags


TORCH_VARIANTS = ("torch_sum", "torch_sum_flat", "torch_sum_thp", "torch_linear")


def shapes() -> list[tuple[int, int, bool]]:
    """(in, out, has bias) of every linear of a decode step, in order."""
    layer = [(D, 3 * D, True), (D, D, True), (D, HIDDEN, True), (HIDDEN, D, True)]
    return layer * LAYERS + [(D, VOCAB, False)]


def weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """[out, in] weights (PyTorch layout) scaled 1/√in so the chain's values stay O(1), and biases."""
    rng = np.random.default_rng(seed)
    out = []
    for k, n, bias in shapes():
        w = rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k))
        out.append((w, rng.standard_normal(n, dtype=np.float32) * np.float32(0.02) if bias else None))
    return out


def graph_proto(form: str, ws: list[tuple[np.ndarray, np.ndarray | None]]):
    """The chain of one-row linears as an ONNX model in one of the graph forms (see the module docstring)."""
    from onnx import TensorProto, helper, numpy_helper

    if form.startswith("big"):
        rng = np.random.default_rng(1)
        ws = [(rng.standard_normal(BIG[::-1], dtype=np.float32) * np.float32(0.02), None)]
    two_d = form.startswith("gemm")
    conv = form.endswith("conv")  # 1x1 Conv on [1, in, 1, 1]: ORT's NCHWc pass runs MLAS's pointwise-conv kernel
    nodes, inits = [], []
    x = "x"
    slice_args = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("s0", [0]), ("s1", [D]), ("sax", [-1]), ("sax1", [1]))]  # fmt: skip
    inits += slice_args
    for i, (w, b) in enumerate(ws):
        n = w.shape[0]
        transposed = form.endswith("_tB")
        if conv:
            inits.append(numpy_helper.from_array(w.reshape(*w.shape, 1, 1), f"w{i}"))
        else:
            inits.append(numpy_helper.from_array(w if transposed else np.ascontiguousarray(w.T), f"w{i}"))
        use_bias = b is not None and form != "mm_nobias"
        if use_bias:
            inits.append(numpy_helper.from_array(b, f"b{i}"))
        y = f"y{i}"
        if conv:
            nodes.append(helper.make_node("Conv", [x, f"w{i}"] + ([f"b{i}"] if use_bias else []), [y]))
        elif form.startswith("gemm"):
            ins = [x, f"w{i}"] + ([f"b{i}"] if use_bias else [])
            nodes.append(helper.make_node("Gemm", ins, [y], transB=1 if transposed else 0))
        else:
            mm = f"m{i}" if use_bias else y
            if form == "fmm_tB":
                nodes.append(helper.make_node("FusedMatMul", [x, f"w{i}"], [mm], domain="com.microsoft", transB=1))
            else:
                nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [mm]))
            if use_bias:
                nodes.append(helper.make_node("Add", [mm, f"b{i}"], [y]))
        x = y
        if n == 3 * D:  # the QKV output: feed its first D columns on
            nodes.append(helper.make_node("Slice", [x, "s0", "s1", "sax1" if conv else "sax"], [f"q{i}"]))
            x = f"q{i}"
    n_out = ws[-1][0].shape[0]
    shape_in = [1, ws[0][0].shape[1]] if two_d else [1, 1, ws[0][0].shape[1]]
    shape_out = [1, n_out] if two_d else [1, 1, n_out]
    if conv:
        shape_in, shape_out = [1, ws[0][0].shape[1], 1, 1], [1, n_out, 1, 1]
    graph = helper.make_graph(
        nodes,
        f"gemv_{form}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape_out)],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 11
    return model


def ort_variant(
    form: str, config: dict[str, str], threads: int, flags: set[str], ws, tmp: Path
) -> Callable[[], object]:
    import onnxruntime as ort
    from ort_hugepages import collapsed

    path = tmp / f"{form}.onnx"
    if not path.exists() and form in ("kv", "kvc"):
        import specc

        kind = "contrib" if form == "kvc" else "standard"
        specc.export_onnx(specc.load_spec("gpt2"), path, attention=kind, kv_cache=True, check=False)
    elif not path.exists():
        path.write_bytes(graph_proto(form, ws).SerializeToString())
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    if "aff" in flags:
        pinned = ";".join(str(i + 2) for i in range(threads - 1))
        so.add_session_config_entry("session.intra_op_thread_affinities", pinned)
    with collapsed("thp" in flags) as done:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    if done:
        print(f"{form}: {sum(done) / 2**20:.0f} MiB collapsed into huge pages", file=sys.stderr)
    if form in ("kv", "kvc"):
        return decode_step(sess)
    k = BIG[0] if form.startswith("big") else D
    shape = (1, k) if form.startswith("gemm") else (1, k, 1, 1) if form.endswith("conv") else (1, 1, k)
    feed = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    return lambda: sess.run(None, feed)


def decode_step(sess) -> Callable[[], object]:
    """One token through an exported KV-cache graph after PAST tokens, as generation runs it (a graph whose
    cache may be one buffer per layer through IO binding, kv_buffer.py)."""
    from profile_onnx import decode_feed

    from specc.runtime.kv_buffer import SharedKV

    feed = decode_feed(sess, PAST)
    if sess.get_modelmeta().custom_metadata_map.get("specc.kv_buffer") != "shared":
        return lambda: sess.run(None, feed)
    pasts = {k: v for k, v in feed.items() if k.startswith("past_key_values.")}
    shared = SharedKV(sess, pasts, PAST + 1)
    step = {k: v for k, v in feed.items() if k not in pasts}
    return lambda: [shared.step(step)]


def torch_variant(name: str, ws) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    if name == "torch_sum_flat":
        flat = torch.cat([torch.from_numpy(w).reshape(-1) for w, _ in ws])
        return lambda: flat.sum()
    if name == "torch_sum_thp":  # numpy's memory: advised MADV_HUGEPAGE by numpy itself
        flat = torch.from_numpy(np.concatenate([w.reshape(-1) for w, _ in ws]))
        return lambda: flat.sum()
    tw = [(torch.from_numpy(w), None if b is None else torch.from_numpy(b)) for w, b in ws]
    if name == "torch_sum":
        return lambda: [w.sum() for w, _ in tw]

    def chain() -> object:
        with torch.inference_mode():
            x = torch.ones(1, 1, D)
            for w, b in tw:
                x = F.linear(x, w, b)
                if x.shape[-1] == 3 * D:
                    x = x[..., :D]
            return x

    return chain


def check_same(fns: dict[str, Callable[[], object]]) -> float:
    """Largest relative difference of any ORT variant's logits from ``mm``'s (they compute the same thing)."""
    other = ("mm_nobias", "kv", "kvc", "big", "big_conv")  # other weights or other outputs
    outs = {k: np.asarray(f()[0]).reshape(-1) for k, f in fns.items()
            if k not in TORCH_VARIANTS and parse_variant(k)[0] not in other}  # fmt: skip
    ref = outs.get("mm", next(iter(outs.values())))
    scale = float(np.abs(ref).max()) or 1.0
    return max(float(np.abs(v - ref).max()) / scale for v in outs.values())


def _busy() -> tuple[float, float]:
    """(CPU seconds of the whole machine, of this process) so far; (0, 0) where /proc is missing."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(v) for v in fields]
        mine = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, (int(mine[11]) + int(mine[12])) / hz


def timed(fns: dict[str, Callable[[], object]], rounds: int, steps: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds per call of every sample (``steps`` calls back to back after SETTLE_S idle, round-robin), and
    whether each sample was quiet: other processes used under QUIET of a core's time while it ran."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    quiet: dict[str, list[bool]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            time.sleep(SETTLE_S)
            busy0, mine0 = _busy()
            t0 = time.perf_counter()
            for _ in range(steps):
                fns[name]()
            wall = time.perf_counter() - t0
            busy1, mine1 = _busy()
            times[name].append(wall / steps)
            slack = TICKS / os.sysconf("SC_CLK_TCK")
            quiet[name].append((busy1 - busy0) - (mine1 - mine0) < QUIET * wall + slack)
    return times, quiet


def main() -> None:
    import onnxruntime
    import torch
    from cpu_info import cpu_model

    from specc.runtime.ort_session import default_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=8, help="calls per timed sample, back to back")
    ap.add_argument("--only", default=",".join(DEFAULT + list(TORCH_VARIANTS)),
                    help="comma-separated variants (default: all of the docstring's)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    chosen = [v for v in args.only.split(",") if v]
    ws = weights()
    nbytes = sum(w.nbytes + (0 if b is None else b.nbytes) for w, b in ws)
    fns: dict[str, Callable[[], object]] = {}
    with tempfile.TemporaryDirectory() as d:
        for name in chosen:
            if name in TORCH_VARIANTS:
                fns[name] = torch_variant(name, ws)
                continue
            try:
                form, config, t, flags = parse_variant(name)
            except ValueError:
                ap.error(f"unknown variant {name!r}: FORM[_nospin][_noprepack][_dbbK][_tN][_aff][_thp], FORM "
                         f"{', '.join(FORMS)}; or one of {', '.join(TORCH_VARIANTS)}")  # fmt: skip
            fns[name] = ort_variant(form, config, t or threads, flags, ws, Path(d))
    diff = check_same(fns)
    times, quiet = timed(fns, args.rounds, args.steps)
    print(f"command: python bench/ort_gemv.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {cpu_model()}, {threads} threads; onnxruntime {onnxruntime.__version__}, "
          f"torch {torch.__version__}; "
          f"{nbytes / 2**20:.0f} MiB of weights per call, {args.rounds} rounds × {args.steps} calls; "
          f"largest relative logit difference between ORT variants {diff:.1e}")  # fmt: skip
    print(
        "quiet: samples during which other processes used < 10% of a core; paired: per round, the speed ratio "
        "to mm (rounds where both were quiet)"
    )
    print("\n| variant | GB/s median (all) | quiet samples | GB/s median (quiet) | GB/s best | paired vs mm: "
          "median (min–max) |\n|---|---|---|---|---|---|")  # fmt: skip
    rate = {k: [(BIG[0] * BIG[1] * 4 if k.startswith("big") else nbytes) / t for t in v] for k, v in times.items()}
    for name, v in rate.items():
        q = [r for r, ok in zip(v, quiet[name], strict=True) if ok]
        qmed = f"{statistics.median(q) / 1e9:.1f}" if q else "–"
        ratio = ""
        if "mm" in times:
            both = zip(rate["mm"], v, quiet["mm"], quiet[name], strict=True)
            paired = [r / m for m, r, qa, qb in both if qa and qb]
            if paired:
                ratio = f"{statistics.median(paired):.3f}× ({min(paired):.2f}–{max(paired):.2f}, n={len(paired)})"
        print(
            f"| {name} | {statistics.median(v) / 1e9:.1f} | {len(q)}/{len(v)} | {qmed} | {max(v) / 1e9:.1f} | {ratio} |"
        )


if __name__ == "__main__":
    main()
