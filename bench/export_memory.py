"""Peak RSS of `specc.export_onnx` (seeded weights) per precision, each export in a fresh process.

    python bench/export_memory.py                         # gpt2 (124M), fp32 / int8 / int4
    python bench/export_memory.py --set vocab_size=200000 # overrides of the spec
    python bench/export_memory.py --root OTHER_CHECKOUT   # the same with another specc (e.g. before streaming)

Prints, per precision, the interpreter's RSS after importing torch, onnx, onnxruntime and specc (the baseline),
the export's peak RSS (VmHWM) and the issue-28 target 0.5 GB + 0.25 × the fp32 model's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

CHILD = """
import json, sys, time
import torch, onnx, onnxruntime, specc
import specc.backends.onnx.export, specc.backends.onnx.quantize, onnxruntime.capi._pybind_state
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
spec = specc.load_spec(sys.argv[1], json.loads(sys.argv[4]))
base = status("VmRSS:")
t = time.perf_counter()
specc.export_onnx(spec, sys.argv[2], quantize=None if sys.argv[3] == "fp32" else sys.argv[3])
print(json.dumps({"base": base, "peak": status("VmHWM:"), "seconds": time.perf_counter() - t,
                  "params": specc.lower(spec).num_params()}))
"""


def main(argv: list[str] | None = None) -> None:
    from cpu_info import cpu_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="?", default="gpt2")
    p.add_argument("--set", dest="sets", action="append", default=[])
    p.add_argument("--root", type=Path, default=ROOT, help="the specc checkout to measure")
    args = p.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": str(args.root), "PYTHONDONTWRITEBYTECODE": "1"}
    print(f"CPU: {cpu_model()}; specc from {args.root}")
    print("| spec | precision | interpreter | export peak RSS | above the interpreter | target | time |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for q in ("fp32", "int8", "int4"):
            cmd = [sys.executable, "-c", CHILD, args.spec, str(Path(tmp) / "m.onnx"), q, json.dumps(args.sets)]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=args.root, check=False)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            m = json.loads(out.stdout.splitlines()[-1])
            target = 0.5e9 + 0.25 * 4 * m["params"]
            name = f"{args.spec} {' '.join(args.sets)} ({m['params'] / 1e6:.0f}M)".replace("  ", " ")
            above = (m["peak"] - m["base"]) / 1e9
            print(f"| {name} | {q} | {m['base'] / 1e9:.2f} GB | {m['peak'] / 1e9:.2f} GB | {above:.2f} GB | "
                  f"{target / 1e9:.2f} GB | {m['seconds']:.1f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
