"""Torch backend: tiny versions of every family and option (shared with the other test_torch_* files), their
shapes, state-dict names, parameter counts, initialisation, and every preset at full size on the meta device."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specc
from specc.backends.torch import build_torch, example_inputs
from specc.spec.presets import preset_names

SMALL = ["blocks=2", "d_model=32", "attention.heads=4", "mlp.hidden=64", "vocab_size=64", "context=32"]
VIT = ["blocks=2", "d_model=32", "attention.heads=4", "mlp.hidden=64", "image.size=16", "image.patch=4", "classes=10"]
RNN = ["vocab_size=40", "rnn.hidden=16", "rnn.embed=8", "context=32"]

CASES: dict[str, tuple[str, list[str]]] = {
    "gpt2": ("gpt2", SMALL),
    "llama_gqa_rope": ("llama2-7b", [*SMALL, "attention.kv_heads=2", "dtype=fp32"]),
    "mixtral_moe": ("mixtral-8x7b", [*SMALL, "attention.kv_heads=1", "mlp.experts=4", "mlp.hidden=48", "dtype=fp32"]),
    "moe_classic_bias": ("gpt2", [*SMALL, "mlp.type=moe", "mlp.experts=3", "mlp.active=1", "mlp.expert=classic"]),
    "sliding_rope": ("gpt2", [*SMALL, "attention.mask=sliding_window", "attention.window=4", "position=rotary"]),
    "prefix_partial_rope": ("gpt2", [*SMALL, "attention.mask=prefix", "attention.prefix=4", "position=rotary",
                                     "position.fraction=0.5"]),
    "post_norm_sinusoidal": ("gpt2", [*SMALL, "norm.placement=post", "position=sinusoidal", "dropout=0.1"]),
    "bert_mlm": ("bert-base", SMALL),
    "bert_pooled": ("bert-base", [*SMALL, "head=pooled"]),
    "encoder_no_positions": ("bert-base", [*SMALL, "head=none", "position=none", "type_vocab_size=0"]),
    "transformer": ("transformer-base", SMALL),
    "transformer_rope_rms_untied": ("transformer-base", [*SMALL, "position=rotary", "norm.type=rmsnorm",
                                                         "norm.placement=pre", "shared_embeddings=false",
                                                         "target_vocab_size=48", "tie_embeddings=false"]),
    "whisper_audio": ("whisper-large-v3", [*SMALL, "mlp.hidden=64", "audio.mel_bins=8", "audio.positions=8",
                                           "decoder_start_token=1", "dtype=fp32"]),
    "vit_cls": ("vit-b16", VIT),
    "vit_mean_learned_2d": ("vit-b16", [*VIT, "pooling=mean", "position=learned_2d"]),
    "vit_cls_sinusoidal_2d": ("vit-b16", [*VIT, "position=sinusoidal_2d"]),
    "gru_bahdanau": ("gru-bahdanau", RNN),
    "lstm_luong_general_2_layers": ("gru-bahdanau", [*RNN, "rnn.cell=lstm", "rnn.attention=luong_general",
                                                     "rnn.layers=2"]),
    "gru_luong_dot": ("gru-bahdanau", [*RNN, "rnn.attention=luong_dot", "rnn.bidirectional=false"]),
    "elman_fixed_context": ("gru-bahdanau", [*RNN, "rnn.cell=rnn", "rnn.attention=none"]),
}  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """Tiny models gain nothing from threads, and OpenMP fork/join stalls badly on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(case: str, *extra: str) -> Any:
    preset, sets = CASES[case]
    return specc.load_spec(preset, [*sets, *extra])


def model_of(case: str, *extra: str, **kwargs: Any) -> Any:
    return build_torch(tiny(case, *extra), **kwargs)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_shapes_and_names(case: str) -> None:
    spec = tiny(case)
    graph = specc.lower(spec)
    model = build_torch(spec)
    assert set(model.state_dict()) == set(graph.params())
    assert sum(p.numel() for p in model.parameters()) == graph.num_params()
    inputs = example_inputs(model.graph, batch=2, length=6)
    with torch.inference_mode():
        out = model.run(inputs)
    assert set(out) == set(graph.outputs)
    env = {"B": 2, "N": 6, "N_dec": 6}
    for name, value in out.items():
        want = tuple(env.get(d, d) if isinstance(d, str) else d for d in graph.shape_of(graph.outputs[name]))
        if spec.kind == "vit":  # tokens = grid² (+1 with a class token)
            want = tuple(d if not isinstance(d, str) else value.shape[i] for i, d in enumerate(want))
        assert tuple(value.shape) == want, name
        assert torch.isfinite(value).all()


def test_forward_signatures_by_task() -> None:
    ids = torch.randint(0, 64, (2, 5))
    assert model_of("gpt2")(ids).shape == (2, 5, 64)
    assert model_of("bert_mlm")(ids, torch.ones_like(ids), torch.zeros_like(ids)).shape == (2, 5, 64)
    pooled = model_of("bert_pooled")(ids)
    assert set(pooled) == {"last_hidden_state", "pooler_output"} and pooled["pooler_output"].shape == (2, 32)
    assert model_of("transformer")(ids, ids[:, :3]).shape == (2, 3, 64)
    assert model_of("vit_cls")(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    assert model_of("gru_bahdanau")(ids % 40, ids[:, :3] % 40).shape == (2, 3, 40)


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_builds_on_meta_at_full_size(preset: str) -> None:
    graph = specc.lower(specc.load_spec(preset))
    model = build_torch(graph, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == {k: p.shape for k, p in graph.params().items()}


def test_initialisation_is_seeded_and_follows_the_rules() -> None:
    a, b = model_of("gpt2"), model_of("gpt2")
    c = model_of("gpt2", "init.seed=1")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.state_dict()["blocks.0.attn.qkv.weight"], c.state_dict()["blocks.0.attn.qkv.weight"])
    sd = a.state_dict()
    assert torch.equal(sd["blocks.0.norm1.weight"], torch.ones(32))
    assert torch.equal(sd["blocks.0.attn.qkv.bias"], torch.zeros(96))
    std, residual = sd["blocks.0.mlp.fc1.weight"].std().item(), sd["blocks.0.mlp.fc2.weight"].std().item()
    assert abs(std - 0.02) < 0.002 and abs(residual - 0.02 / 2) < 0.001  # 0.02 / sqrt(2 · 2 layers)
    gru = model_of("gru_bahdanau").state_dict()["encoder.rnn.weight_hh_l0"]
    assert gru.abs().max() <= 1 / 16**0.5 and gru.abs().max() > 0.2  # U(±1/√H), H = 16


def test_tied_head_reads_the_embedding() -> None:
    model = model_of("gpt2")
    assert "lm_head.weight" not in model.state_dict()
    ids = torch.tensor([[1, 2, 3, 4]])
    before = model(ids)
    with torch.no_grad():
        model.get_parameter("embed.weight")[7] += 1.0  # token 7 is not an input: only the head reads its row
    changed = (model(ids) - before).abs().amax((0, 1)) > 0
    assert changed[7] and changed.sum() == 1


def test_dtype_and_device_arguments() -> None:
    model = model_of("llama_gqa_rope", dtype="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(torch.randint(0, 64, (1, 5))).dtype == torch.bfloat16
    assert model_of("gpt2", device="meta").embed.weight.is_meta


def test_deepcopy_and_pickle_rebuild_the_walk_for_the_copy() -> None:
    import copy
    import pickle

    model = model_of("transformer")
    ids = torch.randint(0, 64, (1, 5))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(clone(ids, ids), model(ids, ids))
        with torch.no_grad():
            clone.get_parameter("encoder.embed.weight").mul_(2.0)
        assert not torch.allclose(clone(ids, ids), model(ids, ids))  # the copy runs its own weights
