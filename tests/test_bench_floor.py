"""The benches' bookkeeping: the bandwidth floor of both benches (decode_costs) is like for like (median reader
call against the median generation, best against best; readers timed between the generation calls count each
read); bench/ort_gemv.py's variant names and huge-page spans; the CPU line every bench prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import cpu_info
from decode_costs import READS_PER_CALL, reader_bandwidths, repeated
from ort_gemv import parse_variant
from ort_hugepages import HUGE, new_spans
from torch_probes import reader_rates


def test_floor_uses_each_readers_median_and_best_separately() -> None:
    # reader a: one lucky call (best 1 s) but typically slow (median 4 s); reader b: steady 2 s
    raw = {"a": [4.0, 1.0, 4.0, 5.0, 4.0], "b": [2.0, 2.0, 2.5, 2.0, 3.0]}
    medians, bests = reader_bandwidths(raw, {"a": ("A", 8), "b": ("B", 8)})
    assert medians == {"A": 2.0, "B": 4.0}  # the floor takes B's median: 4 bytes/s, not A's best 8
    assert bests == {"A": 8.0, "B": 4.0}
    assert max(medians.values()) == 4.0 and max(bests.values()) == 8.0


def test_reader_rates_count_every_read_of_a_call() -> None:
    # between the generation calls each timed reader call reads several times: 3 reads of 2 GB in 0.6 s is
    # 10 GB/s (the amount passed is per call); readers without times are left out
    rates = reader_rates({"sum()": [0.6, 0.3, 0.9]}, {"sum()": 6.0, "gone": 1.0})
    assert rates == {"sum()": (10.0, 20.0)}


def test_repeated_reader_reads_reads_per_call_times() -> None:
    reads: list[int] = []
    repeated(lambda: reads.append(1))()
    assert len(reads) == READS_PER_CALL > 1


def test_ort_gemv_variant_names() -> None:
    assert parse_variant("mm") == ("mm", {}, None, set())
    form, config, threads, flags = parse_variant("kvc_nospin_dbb8_t1_thp")
    assert form == "kvc" and threads == 1 and flags == {"thp"}
    assert config == {"session.intra_op.allow_spinning": "0", "session.dynamic_block_base": "8"}
    assert parse_variant("gemm_tB_noprepack")[:2] == ("gemm_tB", {"session.disable_prepacking": "1"})
    assert parse_variant("big_conv_t1")[::2] == ("big_conv", 1)  # the longer form, not big + an option "conv"
    with pytest.raises(ValueError):
        parse_variant("mm_fast")
    with pytest.raises(ValueError):
        parse_variant("matmul")


def test_new_spans_are_the_uncovered_whole_huge_pages() -> None:
    before = [(0, 3 * HUGE)]
    after = [(0, 8 * HUGE + 5), (20 * HUGE + 1, 22 * HUGE)]
    # the grown mapping's new part [3H, 8H] and the new one cut to whole pages [21H, 22H]
    assert new_spans(before, after) == [(3 * HUGE, 8 * HUGE), (21 * HUGE, 22 * HUGE)]
    assert new_spans(after, after) == []


def test_cpu_line_tells_apart_cpus_that_share_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # two VMs both named "AMD EPYC": Zen 3 (AVX2) and Zen 5 (AVX-512) differ 2-3x in GEMM peak
    zen3 = {"model name": "AMD EPYC", "cpu family": "25", "model": "1", "flags": "fpu sse2 avx avx2 fma"}
    zen5 = {**zen3, "cpu family": "26", "model": "2", "flags": "fpu sse2 avx avx2 avx512f avx512bw"}
    lines = []
    for info in (zen3, zen5):
        monkeypatch.setattr(cpu_info, "_cpuinfo", lambda info=info: info)
        lines.append(cpu_info.cpu_model())
    assert lines == ["AMD EPYC (family 25 model 1, AVX2)", "AMD EPYC (family 26 model 2, AVX-512)"]
    monkeypatch.setattr(cpu_info, "_cpuinfo", dict)  # no /proc/cpuinfo: the name from elsewhere, no details
    monkeypatch.setattr(cpu_info, "_lscpu_name", lambda: "Some CPU")
    assert cpu_info.cpu_model() == "Some CPU"
