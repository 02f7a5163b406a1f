"""The main job end to end on a preset: validate → lower → analyze → compile to ONNX → run it (generate).

python -m specc.demo [SPEC] [--out DIR]      (default: the gpt2 preset, outputs in ./out)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import run


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("spec", nargs="?", default="gpt2", help="spec file or preset name (default: gpt2)")
    ap.add_argument("--out", default="out", help="folder for the compiled outputs (default: ./out)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from . import load_spec, lower
    from .ir.render import summary_lines

    spec = load_spec(args.spec)
    onnx_path = out / f"{spec.name}.onnx"
    kv = ["--kv-cache"] if lower(spec).meta["task"] == "causal_lm" else []
    steps: list[list[str]] = [
        ["validate", args.spec],
        ["analyze", args.spec, "--seq", "1024" if getattr(spec, "context", 0) >= 1024 else "128", "--device", "h200"],
        ["compile", args.spec, "--target", "onnx", "-o", str(onnx_path), *kv],
    ]
    graph = lower(spec)
    run_step = ["run", str(onnx_path), "--random", "1,8"]
    if graph.meta["task"] in ("causal_lm", "seq2seq"):
        run_step += ["--generate", "8"]  # greedy decoding through the KV-cache graph (RNNs: the step graph)
    steps.append(run_step)
    for i, step in enumerate(steps):
        print(f"\n$ specc {' '.join(step)}", flush=True)
        code = run(step)
        if code:
            return code
        if i == 0:
            print("\n".join(summary_lines(graph)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
