"""ONNX (onnxruntime CPU EP) logits == torch backend logits for every family, with and without padding
(a left-padded decoder row == that row run alone: its positions follow the mask).

fp32: max |Δ| ≤ 1e-4 over the positions that are not padding (a fully padded query row has no defined
output: torch lets it attend everything, onnxruntime returns zeros; no real position reads it). fp16 exports
run and stay within half-precision tolerance of the fp32 torch logits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx, step_path

TINY = ["blocks=2", "d_model=32", "attention.heads=4"]
TEXT = [*TINY, "context=24", "vocab_size=61"]
CASES: dict[str, tuple[str, list[str]]] = {
    "gpt2_learned": ("gpt2", [*TEXT, "mlp.hidden=64"]),
    "llama_rotary_gqa": ("llama2-7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32"]),
    "partial_rotary_mqa": (
        "llama2-7b",
        [*TEXT, "attention.kv_heads=1", "position.fraction=0.5", "position.theta=500.0", "mlp.hidden=48", "dtype=fp32"],
    ),
    "sliding_window": (
        "llama2-7b",
        [
            *TEXT,
            "attention.kv_heads=4",
            "attention.mask=sliding_window",
            "attention.window=3",
            "mlp.hidden=48",
            "dtype=fp32",
        ],
    ),
    "prefix_lm": ("gpt2", [*TEXT, "attention.mask=prefix", "attention.prefix=4", "mlp.hidden=64"]),
    "mixtral_moe": ("mixtral-8x7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=48", "mlp.experts=4", "dtype=fp32"]),
    "moe_classic_unnormalised": (
        "gpt2",
        [*TEXT, "mlp={type: moe, experts: 3, active: 2, expert: classic, hidden: 40, router: {normalize: false}}"],
    ),
    "bert_mlm_types": ("bert-base", [*TEXT, "mlp.hidden=64"]),
    "bert_pooled": ("bert-base", [*TEXT, "mlp.hidden=64", "head=pooled"]),
    "transformer_enc_dec": ("transformer-base", [*TEXT, "mlp.hidden=64"]),
    "enc_dec_rotary_untied": (
        "transformer-base",
        [
            *TEXT,
            "mlp.hidden=64",
            "position=rotary",
            "norm.placement=pre",
            "tie_embeddings=false",
            "shared_embeddings=false",
            "target_vocab_size=37",
        ],
    ),
    "vit_cls_learned": ("vit-b16", [*TINY, "image.size=16", "image.patch=4", "classes=7", "mlp.hidden=64"]),
    "vit_mean_2d": (
        "vit-b16",
        [*TINY, "image.size=16", "image.patch=4", "classes=7", "mlp.hidden=64", "pooling=mean", "position=learned_2d"],
    ),
    "vit_sincos_cls": (
        "vit-b16",
        [*TINY, "image.size=16", "image.patch=8", "classes=7", "mlp.hidden=64", "position=sinusoidal_2d"],
    ),
}
RNN_CASES: dict[str, list[str]] = {
    "gru_bahdanau_bi": ["rnn.hidden=16", "rnn.embed=8", "vocab_size=23"],
    "lstm_luong_general_2l": [
        "rnn={cell: lstm, hidden: 12, embed: 6, layers: 2, attention: luong_general}",
        "vocab_size=23",
    ],
    "rnn_luong_dot": ["rnn={cell: rnn, hidden: 12, embed: 6, attention: luong_dot}", "vocab_size=23"],
    "gru_fixed_context": [
        "rnn={cell: gru, hidden: 12, embed: 6, layers: 2, bidirectional: true, attention: none}",
        "vocab_size=23",
        "target_vocab_size=19",
    ],
}
B, N, N_DEC = 3, 9, 6


def session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def inputs(spec: Any, padded: bool, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Feeds for the ONNX graph and the bool mask of output positions that are real tokens."""
    kind = spec.kind
    if kind == "vit":
        px = rng.standard_normal((B, spec.image.channels, spec.image.size, spec.image.size)).astype(np.float32)
        return {"pixel_values": px}, np.ones((B,), bool)
    ids = rng.integers(0, spec.vocab_size, (B, N))
    mask = np.ones((B, N), np.int64)
    if padded:  # decoders pad on the left (prompts), the others on the right
        if kind == "decoder":
            mask[1, :3], mask[2, :1] = 0, 0
        else:
            mask[1, -3:], mask[2, -1:] = 0, 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    valid = mask.astype(bool)
    if kind == "encoder" and spec.type_vocab_size:
        feeds["token_type_ids"] = (np.arange(N)[None, :] >= N // 2).astype(np.int64).repeat(B, 0)
    if kind == "encoder_decoder":
        feeds["decoder_input_ids"] = rng.integers(0, spec.target_vocab_size or spec.vocab_size, (B, N_DEC))
        valid = np.ones((B, N_DEC), bool)
    return feeds, valid


def torch_outputs(model: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        out = model.run({k: torch.from_numpy(v) for k, v in feeds.items()})
    return {k: v.float().numpy() for k, v in out.items()}


def torch_reference(model: Any, spec: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """torch outputs, except that a left-padded decoder row is run alone on its real tokens: its positions
    count from its first token (as HF's generate counts them), whatever the torch backend does with the mask."""
    out = torch_outputs(model, feeds)
    mask = feeds.get("attention_mask")
    if spec.kind != "decoder" or mask is None:
        return out
    for r in range(mask.shape[0]):
        keep = mask[r] == 1
        if not keep.all():
            alone = torch_outputs(model, {"input_ids": feeds["input_ids"][r : r + 1, keep]})
            for k, v in alone.items():
                out[k][r, keep] = v[0]
    return out


def _spec(preset: str, overrides: list[str]) -> Any:
    return specc.load_spec(preset, overrides)


PARITY = [(name, padded) for name in CASES for padded in (False, True) if not (padded and name.startswith("vit"))]


@pytest.mark.parametrize("name,padded", PARITY, ids=[f"{n}-{'padded' if p else 'no_pad'}" for n, p in PARITY])
def test_logits_match_torch(tmp_path: Path, name: str, padded: bool) -> None:
    spec = _spec(*CASES[name])
    model = specc.build_torch(spec)
    path = export_onnx(spec, tmp_path / "m.onnx")
    feeds, valid = inputs(spec, padded, np.random.default_rng(0))
    ref = torch_reference(model, spec, feeds)
    got = run(session(path), feeds)
    assert set(got) == set(ref)
    for key, want in ref.items():
        have = got[key]
        assert have.shape == want.shape
        rows = valid[:, 0] if key == "pooler_output" else valid  # pooled: the first token, real in every row
        diff = np.abs(have - want)[rows].max()
        assert diff <= 1e-4, f"{key}: max |onnx - torch| = {diff:.3g}"
        assert np.abs(want[rows]).max() > 1e-3  # the comparison is not between two near-zero tensors


def _rnn_torch_logits(model: Any, feeds: dict[str, np.ndarray], dec: np.ndarray) -> np.ndarray:
    with torch.inference_mode(), model.attention_maps() as maps:
        logits = model(
            torch.from_numpy(feeds["input_ids"]),
            torch.from_numpy(dec),
            attention_mask=torch.from_numpy(feeds["attention_mask"]),
        )
    return logits.numpy(), {k: v.numpy() for k, v in maps.items()}


@pytest.mark.parametrize("padded", [False, True], ids=["no_pad", "padded"])
@pytest.mark.parametrize("name", list(RNN_CASES))
def test_rnn_encoder_and_step_graphs_match_torch(tmp_path: Path, name: str, padded: bool) -> None:
    spec = _spec("gru-bahdanau", RNN_CASES[name])
    model = specc.build_torch(spec)
    path = export_onnx(spec, tmp_path / "s2s.onnx")
    enc, step = session(path), session(step_path(path))
    rng = np.random.default_rng(1)
    ids = rng.integers(0, spec.vocab_size, (B, N))
    mask = np.ones((B, N), np.int64)
    if padded:
        mask[1, -4:], mask[2, -1:] = 0, 0
    dec = rng.integers(0, spec.target_vocab_size or spec.vocab_size, (B, N_DEC))
    want, maps = _rnn_torch_logits(model, {"input_ids": ids, "attention_mask": mask}, dec)

    carried = run(enc, {"input_ids": ids, "attention_mask": mask})
    step_inputs = {i.name for i in step.get_inputs()}
    carried = {k: v for k, v in {**carried, "attention_mask": mask}.items() if k in step_inputs}
    logits, weights = [], []
    for t in range(N_DEC):  # teacher forcing through the one-step graph
        out = run(step, {**carried, "decoder_input_ids": dec[:, t : t + 1]})
        logits.append(out["logits"])
        if "attention_weights" in out:
            weights.append(out["attention_weights"])
        carried.update({k[len("next_") :]: v for k, v in out.items() if k.startswith("next_")})
    got = np.concatenate(logits, 1)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
    if weights:  # the step's attention weights are torch's alignment a_{t,i}
        (alignment,) = maps.values()
        np.testing.assert_allclose(np.concatenate(weights, 1), alignment, atol=1e-5)
        assert np.all(np.concatenate(weights, 1)[mask[:, None, :].repeat(N_DEC, 1) == 0] == 0)


@pytest.mark.parametrize("name", ["llama_rotary_gqa", "bert_mlm_types", "transformer_enc_dec"])
def test_contrib_attention_ops_match_torch(tmp_path: Path, name: str) -> None:
    spec = _spec(*CASES[name])
    feeds, valid = inputs(spec, True, np.random.default_rng(2))
    want = torch_reference(specc.build_torch(spec), spec, feeds)["logits"]
    path = export_onnx(spec, tmp_path / "m.onnx", attention="contrib")
    got = session(path).run(["logits"], feeds)[0]
    assert np.abs(got - want)[valid].max() <= 1e-4


@pytest.mark.parametrize("name", ["gpt2_learned", "llama_rotary_gqa", "transformer_enc_dec", "vit_cls_learned"])
def test_fp16_export_runs_within_half_precision_tolerance(tmp_path: Path, name: str) -> None:
    spec = _spec(*CASES[name])
    feeds, valid = inputs(spec, True, np.random.default_rng(3))
    want = torch_reference(specc.build_torch(spec), spec, feeds)["logits"]
    path = export_onnx(spec, tmp_path / "m.onnx", dtype="fp16")
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = session(path).run(["logits"], half)[0]
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float32) - want)[valid].max()
    assert err <= 2e-2 * max(1.0, np.abs(want).max()), err
    assert err > 0  # it did run in half precision


def test_weights_from_a_torch_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    spec = _spec(*CASES["gpt2_learned"])
    trained = {k: v + 0.05 * torch.randn_like(v) for k, v in specc.build_torch(spec).state_dict().items()}
    save_file({k: v.contiguous() for k, v in trained.items()}, str(tmp_path / "w.safetensors"))
    path = export_onnx(spec, tmp_path / "m.onnx", weights=tmp_path / "w.safetensors")
    feeds, _ = inputs(spec, False, np.random.default_rng(4))
    want = torch_outputs(specc.build_torch(spec, weights=trained), feeds)["logits"]
    default = torch_outputs(specc.build_torch(spec), feeds)["logits"]
    got = session(path).run(["logits"], feeds)[0]
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(got - default).max() > 1e-2  # the weights were used, not the seeded init
