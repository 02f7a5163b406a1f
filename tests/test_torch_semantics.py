"""Torch backend semantics: masks, equivariance, fused vs math attention, reference layers, MoE, RNN attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_torch_cases import (
    CASES,
    model_of,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny,
)
from torch import nn

import specc
from specc.backends.torch import build_torch, example_inputs


@pytest.fixture(autouse=True)
def _no_grad() -> object:
    with torch.no_grad():
        yield


def _changed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Positions [N] whose logits differ between two runs (batch 1)."""
    return ((a - b).abs().amax(-1) > 1e-5)[0]


@pytest.mark.parametrize("case", ["gpt2", "llama_gqa_rope", "mixtral_moe", "post_norm_sinusoidal"])
def test_causal_mask_is_causal(case: str) -> None:
    model = model_of(case)
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(0))
    for t in (0, 4, 9):
        other = ids.clone()
        other[0, t] = (ids[0, t] + 1) % 64
        changed = _changed(model(ids), model(other))
        assert not changed[:t].any(), f"changing token {t} changed an earlier logit"
        assert changed[t:].all()


def test_sliding_window_sees_window_keys_back() -> None:
    model = model_of("sliding_rope", "blocks=1")  # one layer: the receptive field is exactly the window (4)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    other = ids.clone()
    other[0, 2] += 1
    changed = _changed(model(ids), model(other))
    assert changed.tolist() == [i in range(2, 6) for i in range(12)]


def test_prefix_mask_is_bidirectional_inside_the_prefix_only() -> None:
    model = model_of("prefix_partial_rope", "blocks=1")  # prefix 4
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(2))
    inside, after = ids.clone(), ids.clone()
    inside[0, 3] += 1
    after[0, 6] += 1
    assert _changed(model(ids), model(inside)).all()  # position 0 sees token 3 of the prefix
    assert _changed(model(ids), model(after)).tolist() == [i >= 6 for i in range(10)]


def test_encoder_without_positions_is_permutation_equivariant() -> None:
    model = model_of("encoder_no_positions")
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(4))
    out = model(ids)["last_hidden_state"]
    torch.testing.assert_close(model(ids[:, perm])["last_hidden_state"], out[:, perm], atol=1e-5, rtol=1e-5)
    positional = model_of("bert_mlm")
    assert not torch.allclose(positional(ids[:, perm]), positional(ids)[:, perm], atol=1e-3)


@pytest.mark.parametrize("case", ["bert_mlm", "transformer"])
def test_padding_hides_padded_keys(case: str) -> None:
    model = model_of(case)
    ids = torch.randint(1, 64, (1, 8), generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[1] * 5 + [0] * 3])
    noisy = ids.clone()
    noisy[0, 5:] = 7  # whatever sits under the padding must not matter
    args = (ids[:, :4],) if case == "transformer" else ()
    real = slice(0, 5) if case == "bert_mlm" else slice(None)  # encoder outputs at padded positions are junk
    full = model(ids, *args, attention_mask=mask)[:, real]
    torch.testing.assert_close(model(noisy, *args, attention_mask=mask)[:, real], full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model(ids[:, :5], *args, attention_mask=mask[:, :5]), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith(("gru", "lstm", "elman"))])
def test_sdpa_path_equals_math_path(case: str) -> None:
    model = model_of(case)
    inputs = example_inputs(model.graph, batch=2, length=7)
    if "attention_mask" in model.graph.inputs and "pixel_values" not in inputs:
        inputs["attention_mask"] = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    fused = model.run(inputs)
    model.attention_impl = "math"
    explicit = model.run(inputs)
    for name, value in fused.items():
        torch.testing.assert_close(explicit[name], value, atol=1e-5, rtol=1e-5)


def test_attention_maps_are_recorded_by_scope_name() -> None:
    model = model_of("gpt2")
    ids = torch.randint(0, 64, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    plain = model(ids, mask)
    with model.attention_maps() as maps:
        recorded = model(ids, mask)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    assert set(maps) == {"blocks.0.attn.core", "blocks.1.attn.core"}
    probs = maps["blocks.0.attn.core"]
    assert probs.shape == (2, 4, 6, 6)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 6))
    assert (probs.triu(1) == 0).all()  # causal
    assert (probs[1, :, :4, 4:] == 0).all()  # padded keys
    model(ids)
    assert len(maps) == 2  # recording stops with the block


def test_dropout_only_in_training() -> None:
    model = model_of("post_norm_sinusoidal")
    ids = torch.randint(0, 64, (1, 6))
    assert torch.equal(model(ids), model(ids))
    model.train()
    assert not torch.equal(model(ids), model(ids))


# ------------------------------------------------------------------------------ reference Transformer layers


def _copy_attention(sd: dict, p: str, mha: nn.MultiheadAttention, cross: bool) -> None:
    if cross:
        mha.in_proj_weight.copy_(torch.cat((sd[f"{p}.q.weight"], sd[f"{p}.kv.weight"])))
        mha.in_proj_bias.copy_(torch.cat((sd[f"{p}.q.bias"], sd[f"{p}.kv.bias"])))
    else:  # packed [q heads | k heads | v heads] is exactly in_proj's [W_q; W_k; W_v]
        mha.in_proj_weight.copy_(sd[f"{p}.qkv.weight"])
        mha.in_proj_bias.copy_(sd[f"{p}.qkv.bias"])
    mha.out_proj.weight.copy_(sd[f"{p}.out.weight"])
    mha.out_proj.bias.copy_(sd[f"{p}.out.bias"])


def _copy_common(sd: dict, p: str, layer: nn.Module, norms: dict[str, str]) -> None:
    layer.linear1.weight.copy_(sd[f"{p}.mlp.fc1.weight"])
    layer.linear1.bias.copy_(sd[f"{p}.mlp.fc1.bias"])
    layer.linear2.weight.copy_(sd[f"{p}.mlp.fc2.weight"])
    layer.linear2.bias.copy_(sd[f"{p}.mlp.fc2.bias"])
    for theirs, ours in norms.items():
        getattr(layer, theirs).weight.copy_(sd[f"{p}.{ours}.weight"])
        getattr(layer, theirs).bias.copy_(sd[f"{p}.{ours}.bias"])


LAYER = ["blocks=1", "d_model=32", "attention.heads=4", "mlp.hidden=64", "vocab_size=50", "context=16",
         "position=none", "norm.final=false", "dropout=0.0", "mlp.activation=relu", "norm.eps=1.0e-5"]  # fmt: skip


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_encoder_block_matches_torch_transformer_encoder_layer(placement: str) -> None:
    spec = specc.load_spec(
        "bert-base", [*LAYER, f"norm.placement={placement}", "head=none", "type_vocab_size=0", "norm.embedding=false"]
    )
    model = build_torch(spec)
    sd = model.state_dict()
    ref = nn.TransformerEncoderLayer(32, 4, 64, 0.0, "relu", 1e-5, batch_first=True, norm_first=placement == "pre")
    _copy_attention(sd, "blocks.0.attn", ref.self_attn, cross=False)
    _copy_common(sd, "blocks.0", ref, {"norm1": "norm1", "norm2": "norm2"})
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    want = ref.eval()(F.embedding(ids, sd["embed.weight"]), src_key_padding_mask=mask == 0)
    got = model(ids, mask)["last_hidden_state"]
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_encoder_decoder_matches_torch_transformer_layers(placement: str) -> None:
    spec = specc.load_spec("transformer-base", [*LAYER, f"norm.placement={placement}", "embedding_scale=1.0"])
    model = build_torch(spec)
    sd = model.state_dict()
    pre = placement == "pre"
    enc = nn.TransformerEncoderLayer(32, 4, 64, 0.0, "relu", 1e-5, batch_first=True, norm_first=pre).eval()
    dec = nn.TransformerDecoderLayer(32, 4, 64, 0.0, "relu", 1e-5, batch_first=True, norm_first=pre).eval()
    _copy_attention(sd, "encoder.blocks.0.attn", enc.self_attn, cross=False)
    _copy_common(sd, "encoder.blocks.0", enc, {"norm1": "norm1", "norm2": "norm2"})
    _copy_attention(sd, "decoder.blocks.0.attn", dec.self_attn, cross=False)
    _copy_attention(sd, "decoder.blocks.0.cross_attn", dec.multihead_attn, cross=True)
    _copy_common(sd, "decoder.blocks.0", dec, {"norm1": "norm1", "norm2": "norm_cross", "norm3": "norm2"})
    src, tgt = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
    table = sd["encoder.embed.weight"]  # shared by encoder, decoder and the tied head
    memory = enc(F.embedding(src, table))
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    want = dec(F.embedding(tgt, table), memory, tgt_mask=causal, tgt_is_causal=True) @ table.T
    torch.testing.assert_close(model(src, tgt), want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ mixture of experts


def _moe_step(case: str, *extra: str) -> tuple[object, object, object]:
    model = model_of(case, *extra)
    op = next(op for op in model.graph.ops() if op.kind == "moe")
    module = model.get_submodule(op.name)
    return module, module, op


def _expert(m: nn.Module, e: int, x: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ m.w_gate[e].T) * (x @ m.w_up[e].T)) @ m.w_down[e].T


def test_moe_with_all_experts_active_is_the_dense_gate_weighted_mixture() -> None:
    step, m, _ = _moe_step("mixtral_moe", "mlp.active=4")
    x, logits = torch.randn(2, 5, 32), torch.randn(2, 5, 4)
    gates = logits.softmax(-1)
    want = sum(gates[..., e, None] * _expert(m, e, x) for e in range(4))
    torch.testing.assert_close(step(x, logits), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize", [True, False])
def test_moe_top_a_routing_matches_a_per_token_reference(normalize: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    step, m, _ = _moe_step("mixtral_moe", "mlp.active=2", f"mlp.router.normalize={str(normalize).lower()}")
    x, logits = torch.randn(3, 4, 32), torch.randn(3, 4, 4)
    want = torch.empty_like(x)
    for b in range(3):
        for t in range(4):
            g = logits[b, t].softmax(-1)
            w, idx = g.topk(2)
            w = w / w.sum() if normalize else w
            want[b, t] = sum(w[i] * _expert(m, int(idx[i]), x[b, t]) for i in range(2))
    sparse = step(x, logits)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # the traced (dense) path
    dense = step(x, logits)
    torch.testing.assert_close(sparse, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dense, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ recurrent seq2seq


def _reference_rnn_seq2seq(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, attention: str) -> torch.Tensor:
    """The seed's formulas with nn.GRUCell: s_0 = tanh(bridge(h_T)); Bahdanau e = vᵀtanh(W s_{t-1} + U h_i)
    with c_t fed into the cell; Luong-dot e = s_t · h_i after the cell; output [s_t | c_t] → linear."""
    sd = model.state_dict()
    enc = model.get_submodule("encoder.rnn")(F.embedding(src, sd["encoder.embed.weight"]))[0]
    hidden = sd["decoder.rnn.weight_hh_l0"].shape[1]
    h_final = enc[:, -1] if enc.shape[-1] == hidden else torch.cat((enc[:, -1, :hidden], enc[:, 0, hidden:]), -1)
    s = torch.tanh(h_final @ sd["decoder.rnn.bridge.weight"].T + sd["decoder.rnn.bridge.bias"])
    cell = nn.GRUCell(sd["decoder.rnn.weight_ih_l0"].shape[1], hidden)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(cell, name).copy_(sd[f"decoder.rnn.{name}_l0"])
    y = F.embedding(tgt, sd["decoder.embed.weight"])
    outs = []
    for t in range(tgt.shape[1]):
        if attention == "bahdanau":
            u = enc @ sd["decoder.rnn.attn_key.weight"].T + sd["decoder.rnn.attn_key.bias"]
            w = (s @ sd["decoder.rnn.attn_query.weight"].T)[:, None]
            e = torch.tanh(u + w) @ sd["decoder.rnn.attn_v.weight"].T
            c = (e.softmax(1) * enc).sum(1)
            s = cell(torch.cat((y[:, t], c), -1), s)
        else:
            s = cell(y[:, t], s)
            c = ((enc @ s[:, :, None]).softmax(1) * enc).sum(1)
        outs.append(torch.cat((s, c), -1))
    return torch.stack(outs, 1) @ sd["decoder.out.weight"].T + sd["decoder.out.bias"]


@pytest.mark.parametrize("case", ["gru_bahdanau", "gru_luong_dot"])
def test_rnn_attention_follows_the_formulas(case: str) -> None:
    model = model_of(case)
    src, tgt = torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 4))
    attention = "bahdanau" if "bahdanau" in case else "luong_dot"
    want = _reference_rnn_seq2seq(model, src, tgt, attention)
    torch.testing.assert_close(model(src, tgt), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["gru_bahdanau", "lstm_luong_general_2_layers", "elman_fixed_context"])
def test_rnn_padding_equals_the_unpadded_source(case: str) -> None:
    model = model_of(case)
    src, tgt = torch.randint(1, 40, (1, 8)), torch.randint(0, 40, (1, 5))
    mask = torch.tensor([[1] * 5 + [0] * 3])
    torch.testing.assert_close(model(src, tgt, mask), model(src[:, :5], tgt), atol=1e-5, rtol=1e-5)
    with model.attention_maps() as maps:
        model(src, tgt, mask)
    if "fixed" not in case:
        (alignment,) = maps.values()
        assert alignment.shape == (1, 5, 8)
        torch.testing.assert_close(alignment.sum(-1), torch.ones(1, 5))
        assert (alignment[..., 5:] == 0).all()


def test_rnn_fixed_context_is_the_final_encoder_state() -> None:
    model = model_of("elman_fixed_context")
    src, tgt = torch.randint(0, 40, (2, 6)), torch.randint(0, 40, (2, 3))
    out = model.run({"input_ids": src, "decoder_input_ids": tgt})
    assert out["logits"].shape == (2, 3, 40)
    spec = tiny("elman_fixed_context")
    assert specc.lower(spec).op("decoder.rnn").attrs.attention == "none"
