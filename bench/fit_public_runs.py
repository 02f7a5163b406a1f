"""Fit the A100 profile's efficiency parameters to one paper's table, check them on the other's.

    python bench/fit_public_runs.py            # fit on Korthikanti et al. 2022 Table 5, hold out Narayanan 2021 Table 1
    python bench/fit_public_runs.py --swap     # the other way round
    python bench/fit_public_runs.py --all      # both tables (the values shipped in specs/devices/)

Prints the fitted values (copy them into specs/devices/a100.yaml and nvlink-a100.yaml) and each row's
error before and after. The runs are tests/data/public_runs.json; tests/test_analysis_validation.py checks the
shipped profile against all of them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specc.analysis.devices import load_device
from specc.analysis.parallel.calibrate import fit, residuals
from specc.analysis.parallel.links import load_interconnect
from specc.analysis.parallel.runs import read_runs

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "public_runs.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--swap", action="store_true", help="fit on Narayanan, hold out Korthikanti")
    ap.add_argument("--all", action="store_true", help="fit on both tables")
    args = ap.parse_args()
    runs = read_runs(RUNS)
    k = [r for r in runs if r.name.startswith("korthikanti")]
    n = [r for r in runs if r.name.startswith("narayanan")]
    train, held = (n, k) if args.swap else (k, n)
    if args.all:
        train, held = runs, []
    dev, link = load_device("a100"), load_interconnect("nvlink-a100")
    start = time.perf_counter()
    f = fit(train, dev, link)
    print(f"fitted in {time.perf_counter() - start:.0f} s, {f.iterations} iterations:")
    for name, v in f.values.items():
        print(f"  {name} = {v:.4g}")
    for label, res in (("fit", f.after), ("held out", residuals(held, f.device, f.link))):
        errs = [abs(r.error) for r in res]
        if not errs:
            continue
        print(f"{label}: mean |error| {100 * sum(errs) / len(errs):.1f}%, max {100 * max(errs):.1f}%")
        for r in res:
            print(f"  {r.name:26s} measured {r.measured:8.2f} s  predicted {r.predicted:8.2f} s  {100 * r.error:+.1f}%")


if __name__ == "__main__":
    main()
