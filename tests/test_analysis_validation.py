"""The analyzer against published measured runs (tests/data/public_runs.json): Korthikanti et al. 2022 Table 5
(iteration time) and Narayanan et al. 2021 Table 1 (TFLOP/s per GPU, converted to seconds with their eq. 3),
predicted with the shipped a100 + nvlink-a100 profiles (fitted by bench/fit_public_runs.py --fit all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specc.analysis.devices import load_device
from specc.analysis.layouts.calibrate import Residual, residuals
from specc.analysis.layouts.links import load_interconnect
from specc.analysis.layouts.runs import read_runs

RUNS = Path(__file__).parent / "data" / "public_runs.json"


@pytest.fixture(scope="module")
def errors() -> dict[str, list[Residual]]:
    runs = read_runs(RUNS)
    res = residuals(runs, load_device("a100"), load_interconnect("nvlink-a100"))
    out: dict[str, list[Residual]] = {"korthikanti": [], "narayanan": []}
    for r in res:
        out[r.name.split("-")[0]].append(r)
    return out


@pytest.mark.parametrize("table", ["korthikanti", "narayanan"])
def test_step_time_within_the_targets(errors: dict[str, list[Residual]], table: str) -> None:
    rows = errors[table]
    assert len(rows) == {"korthikanti": 8, "narayanan": 10}[table]
    errs = [abs(r.error) for r in rows]
    report = ", ".join(f"{r.name} {100 * r.error:+.1f}%" for r in rows)
    assert sum(errs) / len(errs) <= 0.05, report
    assert max(errs) <= 0.12, report


def test_validation_rows_fit_the_a100() -> None:
    """Every published run ran on 80 GB A100s: the analyzer must say they fit."""
    from specc.analysis.layouts.runs import predict

    dev, link = load_device("a100"), load_interconnect("nvlink-a100")
    cache: dict = {}
    for run in read_runs(RUNS):
        c = predict(run, dev, link, cache)
        assert c.fits, (run.name, c.memory)
