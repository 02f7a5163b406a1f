"""Plan search (``specc analyze --plan``), the CLI of ``--parallel``, and Narayanan et al. 2021's GPT-3 layout."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import specc
from specc.analysis import analyze
from specc.analysis.layouts import Layout, Training
from specc.analysis.layouts.run import analyze_layout
from specc.analysis.layouts.search import plan

Cli = Callable[..., tuple[int, str, str]]
LLAMA2_70B = ["blocks=80", "d_model=8192", "attention.heads=64", "attention.kv_heads=8", "mlp.hidden=28672"]


def test_narayanan_gpt3_flops_formula() -> None:
    """Narayanan et al. 2021, eq. 3: one iteration with full recompute is
    F = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)) FLOPs: 4 passes of the layers' matmuls, 3 of the logit layer's."""
    B, s, L, h, V = 1536, 2048, 96, 12288, 50257
    mm = analyze("gpt3-175b", batch=1, seq=s, crossover=False).forward.matmul
    layers = sum(mm[c] for c in ("qkv_proj", "qk", "av", "out_proj", "mlp"))
    assert B * (4 * layers + 3 * mm["lm_head"]) == 96 * B * s * L * h * h + 16 * B * s * s * L * h + 6 * B * s * h * V


def test_narayanan_gpt3_layout_fits_and_predicts_the_step() -> None:
    """Narayanan et al. 2021: GPT-3 175B on 1536 A100s as tp=8, pp=16, dp=12, batch 1536, micro-batch 1, full
    recompute, 138 TFLOP/s per GPU achieved. The layout fits 80 GB; the estimate (the a100 profile's efficiency
    model, Megatron's unfused attention and dropout 0.1) lies within 12% of the measured iteration time. (It
    used to be asserted below the measurement: kernels at peak, the optimism this model replaced.)"""
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200  # their V is padded to 51,200
    measured = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) / (1536 * 138e12)  # ≈ 21 s
    g = specc.lower(specc.load_spec("gpt3-175b", ["dropout=0.1"]))
    t = Training(recompute="full", micro_batch=1, global_batch=B, attention="math", dp_overlap=False)
    c = analyze_layout(
        g, Layout(tp=8, pp=16, dp=12), training=t, is_training=True, device="a100", interconnect="nvlink-a100"
    )
    assert c.fits and c.memory["total"] < 80e9
    assert c.bubble == 15 / (128 + 15)
    assert c.step_time is not None and abs(c.step_time / measured - 1) < 0.12
    assert c.mfu is not None and 0.3 < c.mfu < 1


def test_plan_llama2_70b_over_1024_devices_is_fast_and_consistent() -> None:
    g = specc.lower(specc.load_spec("llama2-7b", LLAMA2_70B))
    assert g.num_params() == 68_976_648_192  # LLaMA-2-70B
    start = time.perf_counter()
    r = plan(g, 1024, training=True, device="h100")
    elapsed = time.perf_counter() - start
    assert elapsed < 6.0, elapsed  # the target is 2 s; the bound leaves room for a loaded machine
    assert r.plans and r.fitting >= len(r.plans) and r.considered > r.fitting
    times = [p.step_time for p in r.plans]
    assert times == sorted(times)
    for p in r.plans:
        lay = p.layout
        assert lay.tp * lay.pp * lay.dp * lay.cp == 1024 and p.memory["total"] <= 80 * 10**9
    best = r.plans[0]
    again = analyze_layout(
        g, best.layout, training=best.training, is_training=True, device="h100", interconnect="nvlink"
    )
    assert again.memory == best.memory and again.step_time == best.step_time


def test_plan_json_and_table(cli: Cli) -> None:
    code, out, err = cli("analyze", "gpt2", "--plan", "--devices", "8", "--training", "--top", "3", "-f", "json")
    assert code == 0, err
    d = json.loads(out)
    assert 1 <= len(d["plans"]) <= 3 and d["search"]["devices"] == 8
    for p in d["plans"]:
        assert {"tp", "pp", "dp", "ep", "cp", "zero", "micro_batch", "memory", "step_time", "mfu"} <= set(p)
        assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == 8
        assert {"weights", "gradients", "optimizer_states", "activations", "kv_cache", "total"} <= set(p["memory"])
    code, out, _ = cli("analyze", "gpt2", "--plan", "--devices", "4", "--global-batch", "8")
    assert code == 0 and "Plans for 4 × H100 SXM" in out and "step time" in out


def test_plan_when_nothing_fits(cli: Cli) -> None:
    code, out, _ = cli(
        "analyze", "llama2-7b", "--plan", "--devices", "1", "--training", "--device", "rtx4090", "-f", "json"
    )
    assert code == 0 and json.loads(out)["plans"] == []


def test_parallel_json_keys_and_table_rows(cli: Cli) -> None:
    args = ["analyze", "llama2-7b", "--set", "blocks=4", "--parallel", "tp=2,pp=2,dp=2", "--training"]
    code, out, err = cli(*args, "--zero", "1", "--global-batch", "8", "--device", "h100", "-f", "json")
    assert code == 0, err
    par = json.loads(out)["parallel"]
    assert par["layout"]["tp"] == 2 and par["layout"]["devices"] == 8
    mem = par["per_device"]["memory"]
    assert all(isinstance(mem[k], int) for k in ("weights", "gradients", "optimizer_states", "activations"))
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
    assert set(par["comm"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}
    assert par["bubble"] == (2 - 1) / (4 + 2 - 1) and par["step_time"] > 0 and 0 < par["mfu"] < 1
    code, out, _ = cli(*args, "--global-batch", "8")
    assert code == 0
    lines = out.splitlines()
    for row in ("weights", "gradients", "optimizer_states", "activations", "kv_cache", "total", "all_reduce",
                "all_gather", "reduce_scatter", "all_to_all", "p2p"):  # fmt: skip
        assert sum(line.split()[0] == row for line in lines if line.split()) == 1, row


def test_parallel_takes_any_subset_of_the_degrees_the_rest_1(cli: Cli) -> None:
    """As ``specc train --parallel`` does: ``tp=2`` is ``tp=2,pp=1,dp=1``, same report, same JSON keys."""
    args = ["analyze", "llama2-7b", "--training", "--format", "json", "--parallel"]
    reports = {}
    for layout in ("tp=2", "tp=2,pp=1,dp=1", "dp=1,tp=2", "pp=1,tp=2,dp=1,ep=1,cp=1"):
        code, out, err = cli(*args, layout)
        assert code == 0, (layout, err)
        reports[layout] = json.loads(out)
    assert all(r == reports["tp=2"] for r in reports.values())
    assert reports["tp=2"]["parallel"]["layout"] == {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "cp": 1, "devices": 2}
    code, out, _ = cli(*args, "dp=4")
    assert code == 0 and json.loads(out)["parallel"]["layout"]["devices"] == 4


def test_impossible_layouts_are_located_errors(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "m.yaml"
    spec.write_text(
        "name: m\nkind: decoder\nvocab_size: 256\ncontext: 64\nd_model: 64\nblocks: 3\n"
        "attention: {heads: 4, kv_heads: 2}\nmlp: {type: swiglu, hidden: 96}\n"
    )
    cases = {
        "tp=4,pp=1,dp=1": f"{spec}:7:23: error: KV heads 2 are not divisible by tp=4",
        "tp=1,pp=4,dp=1": f"{spec}:6:1: error: 3 blocks cannot fill pp=4 pipeline stages",
        "tp=1,pp=1,dp=2,ep=2": f"{spec}:8:7: error: ep=2: expert parallelism needs a MoE MLP",
        "tp=1,pp=1,dp=1,cp=3": "error: --parallel: sequence length 64 is not divisible by cp=3",
        "tp=2,pp=1,dp=2,tp=2": "error: --parallel: tp is given twice",
        "tp=2,pp=1,zp=2": "error: --parallel: cannot read 'zp=2'",
        "": "error: --parallel: cannot read ''",  # an empty layout is refused, not read as no --parallel
    }
    for layout, message in cases.items():
        code, _, err = cli("analyze", str(spec), "--parallel", layout)
        assert code == 2 and err.startswith(message) and "Traceback" not in err, (layout, err)
    code, _, err = cli("analyze", str(spec), "--parallel", "tp=2,pp=1,dp=2", "--devices", "8")
    assert code == 2 and "tp × pp × cp × dp = 4 devices, not --devices 8" in err
    code, _, err = cli("analyze", str(spec), "--parallel", "tp=1,pp=1,dp=2", "--global-batch", "3")
    assert code == 2 and "--global-batch 3 is not divisible by dp × micro-batch = 2 × 1" in err
    for extra in (["--zero", "2"], ["--recompute", "full"]):  # training settings without --training
        code, _, err = cli("analyze", str(spec), "--parallel", "tp=1,pp=1,dp=1", *extra)
        assert code == 2 and "add --training" in err
    for args in (["--zero", "1"], ["--plan"], ["--plan", "--parallel", "tp=1,pp=1,dp=1", "--devices", "2"],
                 ["--parallel", "tp=1,pp=1,dp=1", "--batch", "4"], ["--plan", "--devices", "0"]):  # fmt: skip
        code, _, err = cli("analyze", str(spec), *args)
        assert code == 2 and err.startswith("error: ") and "Traceback" not in err, (args, err)


def test_interconnect_profiles(cli: Cli, tmp_path: Path) -> None:
    from specc.analysis.layouts.links import BUILTIN_NAMES, load_interconnect

    for name in BUILTIN_NAMES:
        link = load_interconnect(name)
        assert link.source and link.intra_node >= link.inter_node > 0
    nvlink = load_interconnect("nvlink")
    assert nvlink.intra_node == 450e9 and nvlink.inter_node == 50e9 and nvlink.devices_per_node == 8
    assert nvlink.bandwidth(1, 4) == 450e9 and nvlink.bandwidth(8, 2) == 50e9  # tp 8 in a node; dp across
    args = ["analyze", "gpt2", "--set", "blocks=2", "--parallel", "tp=4,pp=1,dp=4", "--device", "h100", "-f", "json"]
    fast = json.loads(cli(*args, "--interconnect", "nvlink")[1])["parallel"]
    slow = json.loads(cli(*args, "--interconnect", "pcie")[1])["parallel"]
    assert fast["comm"] == slow["comm"] and fast["time"]["tp"] * 2 < slow["time"]["tp"]  # (nvlink: efficiency, latency)
    bad = tmp_path / "link.yaml"
    bad.write_text("devices_per_node: 8\nintra_node: fast\ninter_node: 50 GB/s\n")
    code, _, err = cli(*args, "--interconnect", str(bad))
    assert code == 2 and err.startswith(f"{bad}:2:") and "intra_node" in err
    code, _, err = cli("analyze", "gpt2", "--parallel", "tp=1,pp=1,dp=1", "--interconnect", "nvlink")
    assert code == 2 and "give --device too" in err
