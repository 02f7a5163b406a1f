"""``specc profile-device`` measures this CPU; the profile predicts a `specc train` step of a small character LM
(tests/train_step_probe.py, one fresh process for every recompute policy): peak tensor memory within 10% for
each policy (and for ``op`` again with bias-free QKV and MLP linears, whose aten.mm calls torchtitan's policy
counts and saves every other one of), and step time within 25% at the host's speed of the moment: a 1024³
GEMM timed right before and right after the steps, against the rate the profile predicts for it, scales the
profile's rates (on a shared host other jobs slow a profile and the steps unequally). The time
check is skipped, and says so, where the two GEMMs differ by more than 15% or the steps' own quartiles do (the
load changed during the steps), or the host ran more than 35% off its profile."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import specc
from specc.analysis.devices import Device, load_device
from specc.analysis.layouts import Layout, Training
from specc.analysis.layouts.run import analyze_layout

SETS = ["blocks=2", "d_model=256", "attention.heads=4", "mlp.hidden=1024", "context=256"]
BATCH, WINDOW = 16, 256
PROBE = Path(__file__).parent / "train_step_probe.py"


POLICIES = ("none", "selective", "op", "full")
pytestmark = pytest.mark.serial  # timed against the profile: alone on the machine (scripts/test's second phase)


NO_BIAS = ["bias.qkv=false", "bias.mlp=false"]  # qkv, fc1, fc2 become aten.mm 1, 2, 3: the 2nd recomputed


def _measure(tmp: pytest.TempPathFactory, policies: tuple[str, ...], sets: list[str]) -> dict[str, dict[str, float]]:
    random.seed(0)
    chars = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ.,;:0123456789"
    text = tmp.mktemp("text") / "text.txt"
    text.write_text("".join(random.choice(chars) for _ in range(100_000)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [sys.executable, str(PROBE), str(text), ",".join(policies), "1", str(BATCH), str(WINDOW), "5", *sets]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    """Every policy's step, measured in one fresh process (one model: the steps differ by the policy alone)."""
    return _measure(tmp_path_factory, POLICIES, SETS)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "local.yaml"
    args = [sys.executable, "-m", "specc", "profile-device", "-o", str(out), "--threads", "1", "--quick"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return out


def test_profile_device_writes_a_loadable_profile(profile: Path) -> None:
    dev = load_device(str(profile))
    assert dev.peak_flops["fp32"] > 1e9 and dev.bandwidth > 1e9 and dev.vector_flops > 1e8
    assert 0 < dev.efficiency.matmul.max <= 1 and 0 < dev.efficiency.backward <= 1
    assert dev.runtime.context > 50 << 20  # torch alone is more than that
    assert all("measured by `specc profile-device`" in dev.sources[k] for k in ("peak_flops", "bandwidth"))


@pytest.mark.parametrize("recompute", POLICIES)
def test_cpu_profile_predicts_a_train_step(profile: Path, measured: dict, recompute: str) -> None:
    _check(profile, measured, recompute, SETS)


def test_cpu_profile_predicts_op_recompute_of_bias_free_linears(
    profile: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(profile, _measure(tmp_path_factory, ("op",), [*SETS, *NO_BIAS]), "op", [*SETS, *NO_BIAS])


def _check(profile: Path, measured: dict, recompute: str, sets: list[str]) -> None:
    got = measured[recompute]
    g = specc.lower(specc.load_spec("gpt2", [*sets, f"vocab_size={int(got['vocab'])}"]))
    t = Training(recompute=recompute, micro_batch=BATCH, global_batch=BATCH)
    dev = load_device(str(profile))

    def cost(device: Device) -> object:
        return analyze_layout(g, Layout(), training=t, is_training=True, device=device, interconnect="nvlink",
                              seq=WINDOW, dtype="fp32")  # fmt: skip

    m = cost(dev).memory
    tensors = m["total"] - m["runtime_context"] - m["allocator_reserve"] - m["comm_buffers"]
    assert tensors == pytest.approx(got["peak_bytes"], rel=0.10), (recompute, tensors, got)
    # the host's speed while the steps ran: a 1024³ GEMM right before and right after them, against the rate the
    # profile predicts for it (not its peak, its fastest shape, which a 1024³ GEMM need not reach)
    before, after = measured["gemm_1024_flops_before"], measured["gemm_1024_flops"]
    if abs(change := after / before - 1) > 0.15:
        pytest.skip(f"memory checked; time not: the host's load changed during the steps (GEMM {change:+.0%})")
    low, high = got["step_quartiles_s"]
    if (spread := high / low - 1) > 0.15:  # steps that should take the same time did not: the load moved
        pytest.skip(f"memory checked; time not: the steps' own times spread {spread:+.0%} (load changed)")
    speed = (before * after) ** 0.5 / dev.efficiency.matmul_rate(dev.peak_flops["fp32"], 2 * 1024**3, 1024)
    if abs(speed - 1) > 0.35:
        pytest.skip(f"memory checked; time not: the host ran {speed - 1:+.0%} off its profile's speed")
    # a shared host's load (CPU steal) slows every kind of work alike: the profile at the speed of the moment
    now = replace(dev, peak_flops={k: v * speed for k, v in dev.peak_flops.items()},
                  vector_flops=dev.vector_flops * speed, bandwidth=dev.bandwidth * speed)  # fmt: skip
    step = cost(now).step_time
    assert step == pytest.approx(got["step_s"], rel=0.25), (recompute, step, got, f"host speed {speed:.2f}")
