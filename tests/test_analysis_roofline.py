"""Roofline: device profiles (built-in and YAML), bounds, times, fit, tokens/s."""

from __future__ import annotations

from pathlib import Path

import pytest

from specc.analysis import analyze
from specc.analysis.devices import BUILTIN, load_device, parse_quantity
from specc.errors import SpecError

DEVICES = Path(__file__).resolve().parents[1] / "specs" / "devices"


def test_quantities() -> None:
    assert parse_quantity("3.35 TB/s", "bandwidth") == 3.35e12
    assert parse_quantity("80 GiB", "memory") == 80 * 2**30
    assert parse_quantity("989.4 TFLOP/s", "flops") == pytest.approx(989.4e12)
    assert parse_quantity(2e12, "bandwidth") == 2e12
    with pytest.raises(ValueError):
        parse_quantity("3 TB/s", "memory")


def test_builtin_profiles() -> None:
    assert load_device("h100").bandwidth == 3.35e12
    assert load_device("H200").memory == 141 * 10**9
    assert load_device("a100").peak("bf16") == 312e12
    assert set(BUILTIN) == {"h100", "h200", "a100"}


def test_user_profile_and_located_errors(tmp_path: Path) -> None:
    dev = load_device(str(DEVICES / "rtx4090.yaml"))
    assert (dev.memory, dev.bandwidth) == (24 * 10**9, 1008e9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\npeak_flops: {fp16: 1e12}\nbandwidth: fast\nmemory: 1 GB\nspeed: 3\n")
    with pytest.raises(SpecError) as e:
        load_device(str(bad))
    text = e.value.format()
    assert "bad.yaml:3:" in text and "bandwidth" in text
    assert "bad.yaml:5:" in text and "unknown key 'speed'" in text


def test_prefill_compute_bound_decode_memory_bound() -> None:
    r = analyze("llama2-7b", seq=2048, device="h100").to_dict()["roofline"]
    pre, dec = r["prefill"], r["decode_step"]
    assert (pre["bound"], dec["bound"]) == ("compute", "memory")
    for p in (pre, dec):
        assert p["lower_bound_s"] == max(p["compute_s"], p["memory_s"])
        assert p["per_op_s"] >= p["lower_bound_s"] * 0.99
    # one decode step must at least read every weight once: 2 bytes × 6.74e9 params at 3.35 TB/s
    assert dec["memory_s"] >= 2 * 6_738_415_616 / 3.35e12
    assert dec["tokens_per_s"] == pytest.approx(1 / dec["lower_bound_s"])
    qkv = next(o for o in pre["ops"] if o["name"] == "blocks.0.attn.qkv")
    assert qkv["bound"] == "compute" and qkv["intensity"] > r["ridge_intensity"]


def test_fits() -> None:
    assert analyze("gpt3-175b", device="a100").to_dict()["roofline"]["fits"] is False  # 349 GB of fp16 weights
    assert analyze("llama2-7b", device="h200").to_dict()["roofline"]["fits"] is True
    assert analyze("llama2-7b", training=True, device="h100").to_dict()["roofline"]["fits"] is False


def test_moe_decode_reads_only_routed_experts() -> None:
    one = analyze("mixtral-8x7b", batch=1, device="h200").decode_phase
    many = analyze("mixtral-8x7b", batch=64, device="h200").decode_phase
    assert one is not None and many is not None
    assert one.min_bytes < 0.35 * many.min_bytes  # 2 of 8 experts per layer vs all of them
