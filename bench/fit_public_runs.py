"""The analyzer against the published runs in tests/data/public_runs.json (A100, Megatron-LM).

    python bench/fit_public_runs.py                       # the shipped a100 + nvlink-a100 profiles, every row
    python bench/fit_public_runs.py --fit korthikanti     # fit on Korthikanti 2022 Table 5, hold out Narayanan 2021
    python bench/fit_public_runs.py --fit narayanan       # the other way round
    python bench/fit_public_runs.py --fit all             # both tables: the values shipped in specs/devices/

A fit moves four physical parameters (calibrate.DEFAULT_FIT: matmul.max, matmul.knee, memory.max,
link.intra_node) from the shipped values and prints them with each row's error; tests/test_analysis_validation.py
checks the shipped profiles against every row.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specc.analysis.devices import load_device
from specc.analysis.layouts.calibrate import Residual, fit, residuals
from specc.analysis.layouts.links import load_interconnect
from specc.analysis.layouts.runs import read_runs

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "public_runs.json"


def table(label: str, res: list[Residual]) -> None:
    for source in ("korthikanti", "narayanan"):
        rows = [r for r in res if r.name.startswith(source)]
        if not rows:
            continue
        errs = [abs(r.error) for r in rows]
        print(f"\n{label} · {source}: mean |error| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}%")
        print("| run | measured s | predicted s | error |\n|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r.name} | {r.measured:.2f} | {r.predicted:.2f} | {100 * r.error:+.1f}% |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", choices=("korthikanti", "narayanan", "all"), help="fit on these rows first")
    args = ap.parse_args()
    runs = read_runs(RUNS)
    dev, link = load_device("a100"), load_interconnect("nvlink-a100")
    if args.fit is None:
        table("shipped profiles", residuals(runs, dev, link))
        return
    train = [r for r in runs if args.fit == "all" or r.name.startswith(args.fit)]
    held = [r for r in runs if r not in train]
    start = time.perf_counter()
    f = fit(train, dev, link)
    print(f"fitted on {len(train)} rows in {time.perf_counter() - start:.0f} s, {f.iterations} iterations:")
    for name, v in f.values.items():
        print(f"  {name} = {v:.4g}")
    table("fitted rows", f.after)
    if held:
        table("held-out rows", residuals(held, f.device, f.link))


if __name__ == "__main__":
    main()
