"""``specc calibrate``: recovers known parameters from synthetic runs; bad runs files and hopeless fits are one
located line and exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from specc.analysis.devices import device_yaml, load_device
from specc.analysis.efficiency import Curve
from specc.analysis.layouts.calibrate import residuals
from specc.analysis.layouts.links import load_interconnect
from specc.analysis.layouts.runs import read_runs

Cli = Callable[..., tuple[int, str, str]]
MODEL = {"extends": "gpt2", "blocks": 4, "d_model": 512, "attention": {"heads": 8}, "mlp": {"hidden": 2048}}
LAYOUTS = [  # (tp, pp, dp, micro_batch, global_batch, seq, recompute): small and large ops, with and without comm
    (1, 1, 1, 1, 1, 128, "none"),
    (1, 1, 1, 8, 8, 1024, "none"),
    (2, 1, 1, 4, 4, 512, "full"),
    (2, 2, 2, 2, 16, 1024, "selective"),
    (1, 1, 4, 16, 64, 1024, "none"),
    (4, 1, 1, 1, 1, 256, "none"),
    (1, 2, 1, 1, 8, 2048, "full"),
]


def _runs(path: Path, dev: object, link: object) -> Path:
    rows = [
        {"name": f"r{i}", "model": MODEL, "dtype": "bf16", "seq": s, "tp": tp, "pp": pp, "dp": dp,
         "micro_batch": mb, "global_batch": gb, "recompute": rc, "attention": "flash", "step_time_s": 1.0}
        for i, (tp, pp, dp, mb, gb, s, rc) in enumerate(LAYOUTS)
    ]  # fmt: skip
    path.write_text(json.dumps({"rows": rows}))
    truth = residuals(read_runs(path), dev, link)  # type: ignore[arg-type]
    for row, r in zip(rows, truth, strict=True):
        row["step_time_s"] = r.predicted
    path.write_text(json.dumps({"rows": rows}, indent=1))
    return path


def test_calibrate_recovers_known_parameters(cli: Cli, tmp_path: Path) -> None:
    base, link = load_device("a100"), load_interconnect("nvlink-a100")
    eff = replace(base.efficiency, matmul=Curve(0.55, 4e9), memory=Curve(0.6, base.efficiency.memory.knee))
    truth = replace(base, efficiency=eff)
    runs = _runs(tmp_path / "runs.json", truth, link)
    out = tmp_path / "fitted.yaml"
    code, text, err = cli("calibrate", str(runs), "-o", str(out), "--device", "a100")
    assert code == 0, err
    fitted = load_device(str(out))
    assert fitted.efficiency.matmul.max == pytest.approx(0.55, rel=0.03)
    assert fitted.efficiency.matmul.knee == pytest.approx(4e9, rel=0.15)
    assert fitted.efficiency.memory.max == pytest.approx(0.6, rel=0.05)
    assert "mean |residual|" in text and "r6" in text
    for r in residuals(read_runs(runs), fitted, link):
        assert abs(r.error) < 0.01, r


def test_calibrate_refuses_bad_input(cli: Cli, tmp_path: Path) -> None:
    good = {"name": "a", "model": "gpt2", "micro_batch": 1, "global_batch": 1, "step_time_s": 0.1}
    cases = {
        "missing.json": (
            [{k: v for k, v in good.items() if k != "micro_batch"}],
            ":1:11: error: missing 'micro_batch'",
        ),
        "negative.json": ([good | {"step_time_s": -1}], "step_time_s must be a positive finite number"),
        "layout.json": ([good | {"tp": 5}], "not divisible by tp=5 (the layout does not match the model)"),
        "column.json": ([good | {"speed": 3}], "unknown column 'speed'"),
    }
    for name, (rows, message) in cases.items():
        p = tmp_path / name
        p.write_text(json.dumps(rows))
        code, _, err = cli("calibrate", str(p), "-o", str(tmp_path / "o.yaml"), "--device", "a100")
        assert code == 2 and message in err and err.startswith(str(p)) and "Traceback" not in err, (name, err)
        assert len([line for line in err.splitlines() if "error:" in line]) == 1
    csv = tmp_path / "runs.csv"
    csv.write_text("name,model,micro_batch,global_batch,step_time_s\na,gpt2,1,1,abc\n")
    code, _, err = cli("calibrate", str(csv), "-o", str(tmp_path / "o.yaml"), "--device", "a100")
    assert code == 2 and err.startswith(f"{csv}:2:1: error: step_time_s must be a number")
    # two runs cannot determine three parameters
    few = tmp_path / "few.json"
    few.write_text(json.dumps([good, good | {"name": "b"}]))
    code, _, err = cli("calibrate", str(few), "-o", str(tmp_path / "o.yaml"), "--device", "a100")
    assert code == 2 and "cannot determine 3 parameters" in err
    # inference-sized runs without a single inter-node collective cannot tell the inter-node link's efficiency
    runs = [good | {"name": f"r{i}", "micro_batch": i + 1, "global_batch": i + 1} for i in range(4)]
    p = tmp_path / "local.json"
    p.write_text(json.dumps(runs))
    code, _, err = cli("calibrate", str(p), "-o", str(tmp_path / "o.yaml"), "--device", "a100",
                       "--fit", "matmul.max,link.inter_node", "--link-output", str(tmp_path / "l.yaml"))  # fmt: skip
    assert code == 2 and "no run depends on 'link.inter_node'" in err
    assert not (tmp_path / "o.yaml").exists()


def test_profile_yaml_round_trips(tmp_path: Path) -> None:
    dev = load_device("a100")
    p = tmp_path / "a.yaml"
    p.write_text(device_yaml(dev, "a header"))
    again = load_device(str(p))
    assert again.efficiency == dev.efficiency and again.runtime == dev.runtime and again.peak_flops == dev.peak_flops


def test_fit_that_does_not_converge_is_refused(tmp_path: Path) -> None:
    from specc.analysis.layouts.calibrate import fit
    from specc.errors import SpecError

    base, link = load_device("a100"), load_interconnect("nvlink-a100")
    truth = replace(base, efficiency=replace(base.efficiency, matmul=Curve(0.5, 1e9)))
    runs = read_runs(_runs(tmp_path / "runs.json", truth, link))
    with pytest.raises(SpecError, match="did not converge in 3 iterations"):
        fit(runs, base, link, max_iter=3)


def test_interconnect_latency_and_efficiency_are_located(cli: Cli, tmp_path: Path) -> None:
    link = tmp_path / "link.yaml"
    link.write_text("devices_per_node: 8\nintra_node: 300 GB/s\ninter_node: 25 GB/s\nefficiency: {intra_node: 1.5}\n")
    code, _, err = cli("analyze", "gpt2", "--parallel", "tp=2", "--device", "a100", "--interconnect", str(link))
    assert code == 2 and err.startswith(f"{link}:4:") and "efficiency.intra_node = 1.5 is outside" in err
    link.write_text("devices_per_node: 8\nintra_node: 300 GB/s\ninter_node: 25 GB/s\nlatency: {intra_node: 5 us}\n")
    assert load_interconnect(str(link)).latency == pytest.approx((5e-6, 0.0))
