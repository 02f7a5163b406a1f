"""The analyzer's activations against what autograd saves in a training step of specc's torch layers.

    python bench/saved_tensors.py                      # every family of the saved-tensors test, fp32 and bf16
    python bench/saved_tensors.py --preset bloom-176b --dtype bf16
    python bench/saved_tensors.py --device cuda        # on a GPU: against ``kernels: torch`` (torch's CUDA kernels)

For each case it measures the bytes autograd keeps for backward (``saved_tensors_hooks``, each storage once, the
loss in fp32) and prints them beside the analyzer's prediction under ``kernels: torch-cpu`` (what these layers
keep on the CPU) and under ``fused`` (Megatron-Core's fused kernels), with the error of each. The cases, the
tiny sizes and the measurement are tests/test_analysis_saved_tensors.py's own, so the table and the test (which
holds torch-cpu within 0.5%) cannot drift apart. ``--device cuda`` measures the same step on a GPU and compares it
with ``kernels: torch``, whose fused-kernel statistics (LayerNorm's fp32 mean and rstd, rms_norm's rstd, SDPA's
log-sum-exp) come from torch's CUDA kernels and are measured nowhere else.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cpu_info import cpu_model  # noqa: E402
from test_analysis_saved_tensors import CASES, CPU_MATH, TINY, _measured, _predicted  # noqa: E402

import specc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", action="append", help="only these presets (repeatable)")
    ap.add_argument("--dtype", action="append", choices=["fp32", "bf16"], help="only these dtypes (repeatable)")
    ap.add_argument("--device", default="cpu", help="cpu (default; kernels torch-cpu) | cuda (kernels torch)")
    args = ap.parse_args()
    kernels = "torch-cpu" if args.device == "cpu" else "torch"
    where = cpu_model() if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device))
    cases = [(p, sets, "") for p, sets in CASES.items()]
    cases += [(p, sets, "no fused CPU kernel") for p, sets in CPU_MATH.items()]
    if args.preset:
        cases = [c for c in cases if c[0] in args.preset]
    print(f"torch {torch.__version__}, {where}")
    print(f"| preset | note | dtype | autograd saves | {kernels} | error | fused | error |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    errors = []
    for preset, sets, note in cases:
        for dtype in args.dtype or ["fp32", "bf16"]:
            g = specc.lower(specc.load_spec(preset, [*TINY, *sets, f"dtype={dtype}"]))
            measured = _measured(g, args.device)
            cpu, fused = _predicted(g, kernels, dtype), _predicted(g, "fused", dtype)
            errors.append(abs(cpu / measured - 1))
            err_cpu, err_fused = f"{100 * (cpu / measured - 1):+.2f}%", f"{100 * (fused / measured - 1):+.1f}%"
            cells = [preset, note, dtype, f"{measured:,}", f"{cpu:,}", err_cpu, f"{fused:,}", err_fused]
            print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\n{kernels}: mean |error| {100 * sum(errors) / len(errors):.2f}%, max {100 * max(errors):.2f}%")


if __name__ == "__main__":
    main()
