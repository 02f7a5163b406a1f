"""RoPE: each scaling type's inverse frequencies and cos/sin scale equal transformers' ROPE_INIT_FUNCTIONS, the
rotations equal HF's (Llama's rotate_half, GPT-J's interleaved pairs, partial rotary), the torch and ONNX
backends agree for every type, and the spec refuses fields a type does not read, at their line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

import specc  # noqa: E402
from specc.backends.torch.layers import rope  # noqa: E402
from specc.backends.torch.layers.rope import Rotary, ScaledRotary  # noqa: E402
from specc.errors import SpecError  # noqa: E402

MAX = 32  # max_position_embeddings of the HF configs below
HEAD = 16
SHORT, LONG = [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0], [2.0, 3.0, 5.0, 9.0, 12.0, 16.0, 20.0, 32.0]
# (HF rope_parameters, specc scaling with lowering's defaults resolved)
SCALINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, {"type": "linear", "factor": 4.0}),
    "dynamic": (
        {"rope_type": "dynamic", "factor": 3.0},
        {"type": "dynamic", "factor": 3.0, "original_max_positions": MAX},
    ),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8},
        {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_positions": 8},
    ),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 16.0},
        {"type": "yarn", "factor": 4.0, "original_max_positions": 8, "beta_fast": 16.0, "beta_slow": 1.0,
         "truncate": True},
    ),
    "yarn_mscale": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 0.8,
         "mscale_all_dim": 0.5, "truncate": False},
        {"type": "yarn", "factor": 4.0, "original_max_positions": 8, "mscale": 0.8, "mscale_all_dim": 0.5,
         "truncate": False, "beta_fast": 32.0, "beta_slow": 1.0},
    ),
    "longrope": (
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 8},
        {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_positions": 8,
         "factor": MAX / 8},
    ),
}  # fmt: skip


def _hf_config(params: dict[str, Any], fraction: float = 1.0) -> Any:
    return transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=MAX,
        rope_parameters={**params, "rope_theta": 5000.0, "partial_rotary_factor": fraction},
    )  # fmt: skip


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_inverse_frequencies_and_scale_equal_transformers(name: str, fraction: float) -> None:
    hf, ours = SCALINGS[name]
    dims = int(HEAD * fraction)
    if name == "longrope" and fraction != 1.0:
        hf = {**hf, "short_factor": SHORT[:4], "long_factor": LONG[:4]}
        ours = {**ours, "short_factor": SHORT[:4], "long_factor": LONG[:4]}
    cfg = _hf_config(hf, fraction)
    fn = ROPE_INIT_FUNCTIONS[hf["rope_type"]]
    want, scale = fn(cfg, "cpu")
    assert torch.equal(rope.static_inv_freq(dims, 5000.0, ours), want)
    assert rope.attention_factor(ours) == pytest.approx(scale, rel=1e-15)
    if rope.by_length(ours):  # the frequencies of a call longer than the original context
        for n in (5, MAX, MAX + 9):
            want_n, _ = fn(cfg, "cpu", seq_len=torch.tensor(n) if name == "dynamic" else n)
            got_n = rope.inv_freq_at(dims, 5000.0, ours, torch.tensor(n))
            if name == "dynamic" and n <= MAX:
                want_n = fn(cfg, "cpu")[0]  # transformers keeps the original frequencies up to its context
            torch.testing.assert_close(got_n, want_n, rtol=1e-6, atol=0)
        assert not torch.equal(rope.inv_freq_at(dims, 5000.0, ours, torch.tensor(MAX + 9)), want)


@pytest.mark.parametrize("name", ["llama3", "dynamic", "yarn", "longrope"])
def test_cos_sin_equal_the_hf_rotary_embedding(name: str) -> None:
    """cos/sin of a call (attention factor applied, the length-dependent types updated) as HF's module gives."""
    hf, ours = SCALINGS[name]
    emb = modeling_llama.LlamaRotaryEmbedding(_hf_config(hf))
    x = torch.zeros(1, 1, MAX + 9, HEAD)
    for n in (MAX + 9, 6):  # beyond the original context, then a short call again (a fresh module for each)
        pos = torch.arange(n)[None]
        if n == 6:
            emb = modeling_llama.LlamaRotaryEmbedding(_hf_config(hf))
        cos, sin = emb(x, pos)
        got_cos, got_sin = ScaledRotary(HEAD, 5000.0, ours).tables(pos, torch.float32)
        torch.testing.assert_close(got_cos[0, 0], cos[0, :, : HEAD // 2], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got_sin[0, 0], sin[0, :, HEAD // 2 :], rtol=1e-6, atol=1e-7)


def test_rotation_equals_llama_rotate_half_and_partial_rotary() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 7, HEAD, generator=g), torch.randn(2, 1, 7, HEAD, generator=g)
    pos = torch.arange(7)[None]
    for dims in (HEAD, HEAD // 2):
        r = Rotary(dims, 500.0)
        inv = rope.plain_inv_freq(dims, 500.0)
        freqs = pos[..., None].float() * inv
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        q_rot, k_rot = modeling_llama.apply_rotary_pos_emb(q[..., :dims], k[..., :dims], cos, sin)
        got_q, got_k = r(q, k, None)
        torch.testing.assert_close(got_q, torch.cat((q_rot, q[..., dims:]), -1), rtol=0, atol=1e-6)
        torch.testing.assert_close(got_k, torch.cat((k_rot, k[..., dims:]), -1), rtol=0, atol=1e-6)


def test_interleaved_rotation_equals_gptj() -> None:
    g = torch.Generator().manual_seed(1)
    dims = 8
    x = torch.randn(2, 7, 3, HEAD, generator=g)  # GPT-J's layout: [B, N, H, D]
    table = modeling_gptj.create_sinusoidal_positions(16, dims)
    sin, cos = torch.split(table[torch.arange(7)[None].expand(2, -1)], dims // 2, dim=-1)
    rot = modeling_gptj.apply_rotary_pos_emb(x[..., :dims], sin, cos)
    want = torch.cat((rot, x[..., dims:]), -1).transpose(1, 2)
    got, _ = Rotary(dims, 10000.0, interleaved=True)(x.transpose(1, 2), x.transpose(1, 2), None)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    half, _ = Rotary(dims, 10000.0)(x.transpose(1, 2), x.transpose(1, 2), None)
    assert (half - want).abs().max() > 0.1  # the two conventions differ


def _spec(position: dict[str, Any]) -> Any:
    return specc.load_spec(
        {"kind": "decoder", "name": "r", "vocab_size": 40, "context": 48, "d_model": 32, "blocks": 2,
         "attention": {"heads": 2, "kv_heads": 1}, "mlp": {"type": "swiglu", "hidden": 40},
         "position": position, "init": {"std": 0.3}}
    )  # fmt: skip


ONNX_CASES = [
    ("dynamic", "half", 1.0),
    ("longrope", "interleaved", 1.0),
    ("yarn_mscale", "half", 0.5),
    ("llama3", "interleaved", 0.5),
]


@pytest.mark.parametrize(("name", "rotation", "fraction"), ONNX_CASES)
def test_onnx_equals_torch_for_each_scaling(name: str, rotation: str, fraction: float, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from safetensors.torch import save_file

    _, ours = SCALINGS[name]
    sc = {k: v for k, v in ours.items() if k not in ("beta_fast", "beta_slow", "truncate") or name == "yarn_mscale"}
    if fraction != 1.0 and name == "longrope":
        sc = {**sc, "short_factor": SHORT[:4], "long_factor": LONG[:4]}
    if name == "dynamic":
        sc["original_max_positions"] = 8  # the test's 12 tokens are beyond it
    s = _spec({"type": "rotary", "theta": 300.0, "rotation": rotation, "fraction": fraction, "scaling": sc})
    model = specc.build_torch(s).eval()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "w.safetensors")
    path = specc.export_onnx(s, tmp_path / "m.onnx", weights=str(tmp_path / "w.safetensors"))
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: positions (and the length) follow the mask
    with torch.no_grad():
        want = model.run({"input_ids": ids, "attention_mask": mask})["logits"].numpy()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    keep = mask.bool().numpy()
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-4, rtol=0)
    plain = _spec({"type": "rotary", "theta": 300.0, "rotation": rotation, "fraction": fraction})
    with torch.no_grad():  # the scaling matters at these lengths
        other = specc.build_torch(plain, weights=str(tmp_path / "w.safetensors")).run({"input_ids": ids})["logits"]
    assert np.abs(other.numpy()[0] - want[0]).max() > 1e-3


def test_lowering_resolves_the_defaults_transformers_uses() -> None:
    sc = {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_positions": 12}
    g = specc.lower(_spec({"type": "rotary", "scaling": sc}))
    a = g.op("blocks.0.attn.core").attrs
    assert a.rope_scaling is not None and a.rope_scaling["factor"] == 48 / 12 and a.rope_interleaved is False
    g = specc.lower(_spec({"type": "rotary", "scaling": {"type": "dynamic", "factor": 2.0}}))
    assert g.op("blocks.1.attn.core").attrs.rope_scaling["original_max_positions"] == 48  # the context


HEAD_YAML = "kind: decoder\nname: r\nvocab_size: 40\ncontext: 48\nd_model: 32\nblocks: 1\nattention: {heads: 2}\n"


@pytest.mark.parametrize(
    ("tail", "needle"),
    [
        ("scaling: {type: linear, factor: 2.0, beta_fast: 4.0}", "scaling.beta_fast is not used by"),
        ("scaling: {type: llama3, factor: 8.0}", "llama3 needs scaling.original_max_positions"),
        ("scaling: {type: longrope, short_factor: [1.0], long_factor: [1.0], original_max_positions: 8}",
         "short_factor has 1 factors, but RoPE rotates 8"),
        ("rotation: sideways", "rotation"),
        ("scaling: {type: ntk, factor: 2.0}", "type"),
    ],
)  # fmt: skip
def test_scaling_fields_are_checked_at_their_line(tmp_path: Path, tail: str, needle: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(HEAD_YAML + f"position:\n  type: rotary\n  {tail}\n")
    with pytest.raises(SpecError) as e:
        specc.load_spec(str(f))
    d = next(d for d in e.value.diagnostics if needle in d.message)
    assert (d.file, d.line) == (str(f), 10), d


def test_rotation_and_scaling_need_rotary_positions() -> None:
    with pytest.raises(SpecError, match=r"position\.scaling is only used by rotary"):
        _spec({"type": "learned", "scaling": {"type": "linear", "factor": 2.0}})


def test_longrope_rebuild_cache_makes_cached_generation_equal_recomputation(tmp_path: Path) -> None:
    """Past ``original_max_positions`` longrope switches to the long factors; keys cached before then were
    rotated with the short ones, unless the cache is rebuilt at the switch (Phi-3's generate)."""
    pytest.importorskip("onnxruntime")
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    sc = {"type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_positions": 8}
    stale = _spec({"type": "rotary", "scaling": sc})
    spec = _spec({"type": "rotary", "scaling": {**sc, "rebuild_cache": True}})
    assert specc.lower(spec).meta["rebuild_cache_after"] == 8 and "rebuild_cache_after" not in specc.lower(stale).meta
    model = specc.build_torch(spec).eval()
    w = _weights(model, tmp_path)
    ids = torch.randint(0, 40, (1, 5), generator=torch.Generator().manual_seed(4))
    cached = model.generate(ids, 8, use_cache=True)
    assert cached.tolist() == model.generate(ids, 8, use_cache=False).tolist()
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=w, kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    assert greedy(OrtModel.open(path, provider="cpu", threads=1), feeds, 8).tolist() == cached[:, -8:].tolist()
    # without the rebuild, the step past the switch attends to stale keys
    old = specc.build_torch(stale, weights=w).eval()
    seq = torch.randint(0, 40, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        cache = old.start({}, 9)
        old.step(cache, seq[:, :8])
        step = old.step(cache, seq[:, 8:])[:, -1]
        full = old(seq)[:, -1]
    assert (step - full).abs().max() > 1e-3


def _weights(model: Any, folder: Path) -> str:
    from safetensors.torch import save_file

    path = folder / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return str(path)
