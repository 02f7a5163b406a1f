"""The spec schema: shortcut forms, defaults, and every cross-field rule with its own message."""

from __future__ import annotations

from typing import Any

import pytest

from specc.errors import SpecError
from specc.spec import resolve
from specc.spec.loader import load_spec

TINY: dict[str, Any] = {
    "name": "tiny",
    "kind": "decoder",
    "vocab_size": 97,
    "context": 64,
    "d_model": 32,
    "blocks": 2,
    "attention": {"heads": 4},
}


def spec(**changes: Any) -> Any:
    d = {**TINY, **changes}
    return load_spec(d)


def error_of(**changes: Any) -> str:
    with pytest.raises(SpecError) as e:
        spec(**changes)
    return e.value.format()


def test_defaults_resolve() -> None:
    s = spec()
    assert resolve.mask(s) == "causal"  # decoders default to causal
    assert resolve.head_dim(s) == 8
    assert resolve.kv_heads(s) == 4
    assert resolve.mlp_hidden(s) == 128
    assert resolve.final_norm(s) is True
    assert s.bias.head is False


def test_shortcuts_normalise() -> None:
    s = spec(bias=False, position="rotary", mlp="swiglu", dropout=0.1)
    assert not any(s.bias.model_dump().values())
    assert s.position.type == "rotary" and s.position.theta == 10000.0
    assert s.mlp.type == "swiglu"
    assert s.dropout.attention == 0.1 and s.dropout.residual == 0.1


def test_swiglu_hidden_rounds_up_to_multiple() -> None:
    s = spec(d_model=4096, attention={"heads": 32}, mlp={"type": "swiglu", "multiple_of": 256})
    assert resolve.mlp_hidden(s) == 11008  # LLaMA-7B: 8·4096/3 = 10922.67 → 11008
    s = spec(mlp={"type": "swiglu", "multiple_of": 1})
    assert resolve.mlp_hidden(s) == 85


def test_encoder_decoder_blocks_shortcut() -> None:
    s = load_spec({**TINY, "kind": "encoder_decoder", "blocks": 3})
    assert (s.blocks.encoder, s.blocks.decoder) == (3, 3)
    s = load_spec({**TINY, "kind": "encoder_decoder", "blocks": {"encoder": 2, "decoder": 5}})
    assert (s.blocks.encoder, s.blocks.decoder) == (2, 5)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 30}, "d_model 30 is not divisible by heads 4"),
        ({"attention": {"heads": 4, "kv_heads": 3}}, "heads 4 is not divisible by kv_heads 3"),
        ({"mlp": {"type": "moe", "experts": 2, "active": 3}}, "active experts 3 > experts 2"),
        ({"attention": {"heads": 4, "head_dim": 5}, "position": "rotary"}, "rotary needs an even number"),
        ({"attention": {"heads": 4, "mask": "sliding_window"}}, "mask sliding_window needs attention.window"),
        ({"attention": {"heads": 4, "window": 8}}, "attention.window is only used with mask sliding_window"),
        ({"attention": {"heads": 4, "mask": "prefix"}}, "mask prefix needs attention.prefix"),
        ({"attention": {"heads": 4, "mask": "sliding_window", "window": 100}}, "window 100 is longer than context"),
        ({"position": "learned_2d"}, "position learned_2d is for ViT patch grids"),
        ({"position": {"type": "learned", "max_bias": 4.0}}, "position.max_bias is only used by alibi positions"),
        ({"position": {"type": "rotary", "scaled": True}}, "position.scaled is only used by alibi positions"),
        ({"kind": "encoder", "position": "alibi"}, "alibi positions are supported in decoders, not in kind encoder"),
        ({"position": "alibi", "attention": {"heads": 4, "softcap": 30.0}}, "softcap is not supported with alibi"),
        ({"position": "alibi", "attention": {"heads": 4, "sinks": True}}, "sinks are not supported with alibi"),
        (
            {"mlp": {"type": "moe", "experts": 2, "active": 1, "expert": "classic", "clamp": {}}},
            "mlp.clamp is a SwiGLU variant; the experts are classic",
        ),
        (
            {"mlp": {"type": "moe", "experts": 2, "active": 1, "activation": "gelu", "clamp": {"limit": 7.0}}},
            "mlp.clamp replaces the activation",
        ),
        ({"d_model": 1 << 17, "blocks": 1000, "attention": {"heads": 8}}, "parameters, more than"),
        (
            {"attention": {"heads": 4, "temperature": {"floor": 4}}, "position": "rotary"},
            "attention.temperature is for layers without rotary positions",
        ),
        (
            {"kind": "encoder", "attention": {"heads": 4, "temperature": {}}},
            "attention temperature tuning is supported in decoders, not in kind encoder",
        ),
        (
            {
                "attention": {"heads": 4, "qk_norm": "l2"},
                "position": {"type": "rotary", "scaling": {"type": "yarn", "factor": 4.0, "original_max_positions": 8}},
            },
            "qk_norm l2 with yarn RoPE is not supported",
        ),
    ],
)
def test_cross_field_rules(changes: dict[str, Any], message: str) -> None:
    assert message in error_of(**changes)


def test_vit_rules() -> None:
    vit = {**TINY, "kind": "vit", "image": {"size": 224, "patch": 14 + 1}, "classes": 10}
    del vit["vocab_size"], vit["context"]
    with pytest.raises(SpecError) as e:
        load_spec(vit)
    assert "image 224 is not divisible by patch 15" in e.value.format()
    assert "use patch: 14" in e.value.format() or "use patch: 16" in e.value.format()
    vit["image"] = {"size": 32, "patch": 8}
    vit["attention"] = {"heads": 4, "mask": "causal"}
    with pytest.raises(SpecError) as e:
        load_spec(vit)
    assert "causal mask on a ViT classifier is refused" in e.value.format()


def test_all_rule_violations_reported_together() -> None:
    text = error_of(d_model=30, attention={"heads": 4, "kv_heads": 3}, mlp={"type": "moe", "experts": 2, "active": 3})
    assert text.count("error:") == 3


def test_padding_mask_is_refused_on_a_decoder_only() -> None:
    text = error_of(attention={"heads": 4, "mask": "padding"})
    assert "attention.mask padding is refused on a decoder: it would make the decoder bidirectional" in text
    assert "padding is applied whenever attention_mask is passed at run time: use mask: causal" in text
    assert resolve.mask(spec(attention={"heads": 4, "mask": "causal"})) == "causal"
    none = error_of(attention={"heads": 4, "mask": "none"})  # cached decoding could never match a bidirectional one
    assert "attention.mask none is refused on a decoder: it would make the decoder bidirectional" in none
    # encoders and encoder-decoders take it (an encoder-decoder's mask is its encoder's; its decoder is causal)
    padding, causal = {"heads": 4, "mask": "padding"}, {"heads": 4, "mask": "causal"}
    assert resolve.mask(spec(kind="encoder", attention=padding)) == "padding"
    assert resolve.mask(spec(kind="encoder_decoder", blocks=1, attention=padding)) == "padding"
    assert "the decoder is always causal" in error_of(kind="encoder_decoder", blocks=1, attention=causal)


def test_encoder_decoder_vocab_rule() -> None:
    with pytest.raises(SpecError, match="shared_embeddings needs one vocabulary"):
        load_spec({**TINY, "kind": "encoder_decoder", "blocks": 1, "target_vocab_size": 50})


def test_rnn_rules() -> None:
    rnn = {
        "name": "r",
        "kind": "rnn_seq2seq",
        "vocab_size": 20,
        "rnn": {"hidden": 8, "bidirectional": True, "attention": "luong_dot"},
    }
    with pytest.raises(SpecError, match="luong_dot scores"):
        load_spec(rnn)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"blocks": 0}, "blocks must be ≥ 1, got 0"),
        ({"blocks": -3}, "blocks must be ≥ 1, got -3"),
        ({"blocks": True}, "blocks: expected a whole number, got True"),
        ({"blocks": 2.5}, "blocks: expected a whole number"),
        ({"d_model": 10**12}, "d_model must be ≤"),
        ({"vocab_size": "many"}, "vocab_size: expected a whole number"),
        ({"norm": {"eps": float("nan")}}, "norm.eps: expected a finite number"),
        ({"norm": {"eps": -1.0}}, "norm.eps must be > 0"),
        ({"tie_embeddings": "yes please"}, "tie_embeddings: expected true or false"),
        ({"attention": {"heads": 4, "mask": "casual"}}, "did you mean 'causal'?"),
        ({"mlp": {"type": "swiglue"}}, "did you mean 'swiglu'?"),
        ({"kind": "decoderr"}, "did you mean 'decoder'?"),
        ({"bais": True}, "did you mean 'bias'?"),
        ({"image": {"size": 8, "patch": 4}}, "'image' belongs to kind vit"),
        ({"attention": {"heads": 4, "temperature": {"floor": 0}}}, "attention.temperature.floor must be ≥ 1"),
        ({"mlp": {"type": "moe", "experts": 2, "active": 1, "router": {"weighs": "inputs"}}}, "did you mean 'input'?"),
    ],
)
def test_field_errors(changes: dict[str, Any], fragment: str) -> None:
    assert fragment in error_of(**changes)


def test_missing_keys() -> None:
    d = dict(TINY)
    del d["d_model"]
    with pytest.raises(SpecError, match="missing required key 'd_model'"):
        load_spec(d)
    d = dict(TINY)
    del d["kind"]
    with pytest.raises(SpecError, match="missing required key 'kind'"):
        load_spec(d)


def test_float_strings_from_yaml_are_accepted() -> None:
    # YAML 1.1 reads `1e-5` (no dot) as a string; specs written that way must still work.
    assert spec(norm={"eps": "1e-5"}).norm.eps == 1e-5


def test_rotary_fraction_must_give_whole_even_dims() -> None:
    # 8 × 0.3 = 2.4 would be silently truncated to 2; it is refused instead
    assert "rotary needs an even number of rotated dims" in error_of(position={"type": "rotary", "fraction": 0.3})
    assert spec(position={"type": "rotary", "fraction": 0.25}).position.fraction == 0.25  # 8 × 0.25 = 2


def test_llama4_fields_are_blamed_on_the_layer_kind_line(tmp_path: Any) -> None:
    """Temperature tuning in a rotary layer kind: the error points at that kind's temperature key."""
    text = """name: l4
kind: decoder
vocab_size: 97
context: 64
d_model: 32
blocks: 2
attention: {heads: 4, qk_norm: l2}
norm: {type: rmsnorm}
position: rotary
layer_kinds:
  rope: {}
  nope:
    attention:
      temperature: {floor: 4}
layer_pattern: [rope, nope]
"""
    path = tmp_path / "l4.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as e:
        load_spec(str(path))
    d = e.value.diagnostics[0]
    assert "temperature is for layers without rotary positions" in d.message and d.line == 14
    fixed = text.replace("      temperature: {floor: 4}", "      qk_norm: none\n      temperature: {floor: 4}")
    path.write_text(fixed.replace("  nope:\n", "  nope:\n    position: none\n"), encoding="utf-8")
    s = load_spec(str(path))
    assert s.layer_kinds["nope"].attention.temperature.floor == 4
