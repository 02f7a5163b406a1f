"""Greedy generation through the ONNX KV-cache graph (and the RNN step graph) == the torch backend's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx
from specc.runtime.generate import greedy
from specc.runtime.inputs import check, complete
from specc.runtime.onnx_model import OrtModel

TEXT = ["blocks=2", "d_model=32", "attention.heads=4", "context=32", "vocab_size=61", "init.std=0.2"]
DECODERS = {
    "gpt2": ("gpt2", [*TEXT, "mlp.hidden=64"]),
    "llama_gqa": ("llama2-7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32"]),
    "sliding_window": (
        "llama2-7b",
        [
            *TEXT,
            "attention.kv_heads=4",
            "attention.mask=sliding_window",
            "attention.window=4",
            "mlp.hidden=48",
            "dtype=fp32",
        ],
    ),
    "moe": ("mixtral-8x7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=32", "mlp.experts=4", "dtype=fp32"]),
}
NEW = 10


def _torch_generate(model, ids: np.ndarray, mask: np.ndarray | None, **kw) -> np.ndarray:
    t_ids = torch.from_numpy(ids)
    t_mask = torch.from_numpy(mask) if mask is not None else None
    out = model.generate(t_ids, NEW, attention_mask=t_mask, **kw)
    return out[:, -NEW:].numpy()


def _ort_generate(path: Path, feeds: dict[str, np.ndarray], **kw) -> np.ndarray:
    m = OrtModel.open(path, "cpu", threads=1)
    return greedy(m, check(m, complete(m, feeds)), NEW, **kw)


@pytest.mark.parametrize("attention", ["standard", "contrib"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_kv_cache_generation_matches_torch(tmp_path: Path, name: str, attention: str) -> None:
    spec = specc.load_spec(*DECODERS[name])
    model = specc.build_torch(spec)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, spec.vocab_size, (2, 5))
    mask = np.ones_like(ids)
    mask[1, :2] = 0  # a left-padded prompt in the batch: it must generate what its 3 tokens generate alone
    want = np.concatenate([_torch_generate(model, ids[:1], None), _torch_generate(model, ids[1:, 2:], None)])
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True, attention=attention)
    got = _ort_generate(path, {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_array_equal(got, want)
    assert len(set(got[0].tolist())) > 1  # not a degenerate constant sequence


def test_cache_less_graph_generates_the_same(tmp_path: Path) -> None:
    spec = specc.load_spec(*DECODERS["llama_gqa"])
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (1, 4))
    cached = _ort_generate(export_onnx(spec, tmp_path / "kv.onnx", kv_cache=True), {"input_ids": ids})
    plain = _ort_generate(export_onnx(spec, tmp_path / "plain.onnx"), {"input_ids": ids})
    np.testing.assert_array_equal(cached, plain)


@pytest.mark.parametrize("kv", [True, False], ids=["kv_cache", "recompute"])
def test_encoder_decoder_generation_matches_torch(tmp_path: Path, kv: bool) -> None:
    spec = specc.load_spec("transformer-base", [*TEXT, "mlp.hidden=64"])
    model = specc.build_torch(spec)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, spec.vocab_size, (2, 7))
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    want = _torch_generate(model, ids, mask, decoder_start_token_id=1)
    got = _ort_generate(
        export_onnx(spec, tmp_path / "m.onnx", kv_cache=kv), {"input_ids": ids, "attention_mask": mask}, start_id=1
    )
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "overrides,seed",
    [
        (["rnn.hidden=16", "rnn.embed=8", "vocab_size=23"], 1),
        (["rnn={cell: lstm, hidden: 12, embed: 6, layers: 2, attention: luong_general}", "vocab_size=23"], 0),
    ],
    ids=["gru_bahdanau", "lstm_luong"],
)
def test_rnn_step_graph_generation_matches_torch(tmp_path: Path, overrides: list[str], seed: int) -> None:
    spec = specc.load_spec("gru-bahdanau", overrides)
    model = specc.build_torch(spec)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # sharper weights (N(0, 9 / fan_in)) so that greedy decoding varies
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 3.0 / max(1, p.shape[-1]) ** 0.5)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(3)
    ids = rng.integers(0, spec.vocab_size, (2, 6))
    mask = np.ones_like(ids)
    mask[0, -2:] = 0
    want = _torch_generate(model, ids, mask, decoder_start_token_id=1)
    got = _ort_generate(
        export_onnx(spec, tmp_path / "s2s.onnx", weights=weights),
        {"input_ids": ids, "attention_mask": mask},
        start_id=1,
    )
    np.testing.assert_array_equal(got, want)
    assert len(set(got.ravel().tolist())) > 1


def test_eos_stops_rows(tmp_path: Path) -> None:
    spec = specc.load_spec(*DECODERS["gpt2"])
    ids = np.random.default_rng(4).integers(0, spec.vocab_size, (1, 3))
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True)
    free = _ort_generate(path, {"input_ids": ids})
    eos = int(free[0, 2])
    m = OrtModel.open(path, "cpu", threads=1)
    stopped = greedy(m, check(m, complete(m, {"input_ids": ids})), NEW, eos_id=eos)
    assert stopped.shape[1] <= 3 and stopped[0, -1] == eos


def test_shared_kv_buffer_is_appended_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrib fp32 graph (GroupQueryAttention) says its cache may be one buffer per layer; generation then
    decodes into max-length buffers that the graph fills in place: they hold what a prefill of the same tokens
    computes, and the tokens equal the standard graph's (which returns a new present every step)."""
    import specc.runtime.generate as generate

    spec = specc.load_spec(*DECODERS["gpt2"])
    ids = np.random.default_rng(3).integers(0, spec.vocab_size, (2, 5))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    standard = export_onnx(spec, tmp_path / "std.onnx", kv_cache=True)
    contrib = export_onnx(spec, tmp_path / "c.onnx", kv_cache=True, attention="contrib")
    assert OrtModel.open(standard, "cpu").meta.get("specc.kv_buffer") is None
    model = OrtModel.open(contrib, "cpu", threads=1)
    assert model.meta["specc.kv_buffer"] == "shared"
    made: list[generate.SharedKV] = []

    class Spy(generate.SharedKV):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(generate, "SharedKV", Spy)
    got = greedy(model, check(model, complete(model, feeds)), NEW)
    np.testing.assert_array_equal(got, _ort_generate(standard, feeds))
    (shared,) = made
    seen = np.concatenate([ids, got[:, :-1]], 1)  # every token whose K/V the cache holds
    past = {i.name: np.zeros((2, 4, 0, 8), np.float32) for i in model.main.get_inputs() if "past" in i.name}
    prefill = model.run({"input_ids": seen, "attention_mask": np.ones_like(seen), **past})
    total = seen.shape[1]
    assert shared.buffers[0].shape[2] >= total
    for buf, name in zip(shared.buffers, past, strict=True):
        want = prefill[name.replace("past_key_values.", "present.")]
        np.testing.assert_allclose(buf[:, :, :total], want, atol=1e-5)
        assert not buf[:, :, total:].any()  # nothing written past the tokens fed
