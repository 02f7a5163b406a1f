"""import-hf: config.json → spec for every family; fields specc cannot express are located errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_hf_zoo import BY_ID, CASES, save

from specc import SpecError, load_spec, lower
from specc.interop import import_hf


def _config(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return p


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_zoo_config_imports_with_hf_parameter_count(case, tmp_path: Path) -> None:
    model, folder = save(case, tmp_path)
    spec = import_hf(folder).spec
    hf = model.num_parameters()
    d, vocab = case.config.get("d_model"), case.config.get("vocab_size")
    if case.family == "bart":
        # HF counts an unused `shared` table when untied (its 2 leading position rows are specc's offset rows) but
        # not the final_logits_bias buffer, which specc holds as lm_head.bias.
        hf += vocab - (0 if case.config.get("tie_word_embeddings", True) else vocab * d)
    if case.family == "marian":
        # HF counts its fixed sinusoid tables (frozen nn.Embedding) as parameters; specc computes them. The
        # final_logits_bias buffer is specc's lm_head.bias.
        hf += -2 * case.config["max_position_embeddings"] * d + case.config.get("decoder_vocab_size", vocab)
    assert lower(spec).num_params() == hf


def test_gpt2_fields(tmp_path: Path) -> None:
    _, folder = save(BY_ID["gpt2-untied-relu"], tmp_path)
    s = import_hf(folder).spec
    assert (s.kind, s.d_model, s.blocks, s.attention.heads, s.context) == ("decoder", 24, 3, 3, 48)
    assert (s.mlp.hidden, s.mlp.activation, s.tie_embeddings, s.norm.placement) == (40, "relu", False, "pre")
    _, folder = save(BY_ID["gpt2-unscaled"], tmp_path)
    assert import_hf(folder).spec.attention.scale == 1.0


def test_llama_gqa_rope_and_tied_head(tmp_path: Path) -> None:
    _, folder = save(BY_ID["llama-mqa-tied"], tmp_path)
    s = import_hf(folder).spec
    assert (s.attention.heads, s.attention.kv_heads, s.tie_embeddings) == (4, 1, True)
    assert (s.position.type, s.position.theta, s.norm.type, s.mlp.type) == ("rotary", 500000.0, "rmsnorm", "swiglu")
    _, folder = save(BY_ID["llama-bias-headdim"], tmp_path)
    s = import_hf(folder).spec
    assert s.attention.head_dim == 8 and s.bias.qkv and s.bias.out and s.bias.mlp


def test_mixtral_experts_and_window(tmp_path: Path) -> None:
    _, folder = save(BY_ID["mixtral-3x1-window"], tmp_path)
    s = import_hf(folder).spec
    assert (s.mlp.type, s.mlp.experts, s.mlp.active, s.mlp.router.normalize) == ("moe", 3, 1, True)
    assert (s.attention.mask, s.attention.window) == ("sliding_window", 4)


def test_bert_heads(tmp_path: Path) -> None:
    _, folder = save(BY_ID["bert-mlm"], tmp_path)
    s = import_hf(folder).spec
    assert (s.kind, s.head, s.norm.placement, s.norm.embedding, s.type_vocab_size) == (
        "encoder",
        "mlm",
        "post",
        True,
        2,
    )
    _, folder = save(BY_ID["bert-pooled"], tmp_path)
    s = import_hf(folder).spec
    assert (s.head, s.type_vocab_size, s.mlp.activation) == ("pooled", 3, "gelu_tanh")


def test_vit_and_bart(tmp_path: Path) -> None:
    _, folder = save(BY_ID["vit-mono"], tmp_path)
    s = import_hf(folder).spec
    assert (s.image.size, s.image.patch, s.image.channels, s.classes, s.bias.qkv) == (24, 6, 1, 3, False)
    _, folder = save(BY_ID["bart-tied"], tmp_path)
    s = import_hf(folder).spec
    assert (s.blocks.encoder, s.blocks.decoder, s.embedding_scale, s.shared_embeddings) == (2, 1, "sqrt_d_model", True)
    assert (s.position.type, s.norm.embedding, s.bias.head) == ("learned", True, True)


def test_cli_writes_yaml_that_loads_back(cli, tmp_path: Path) -> None:
    _, folder = save(BY_ID["llama-gqa"], tmp_path)
    out = tmp_path / "llama.yaml"
    code, stdout, stderr = cli("import-hf", folder, "-o", out)
    assert code == 0, stderr
    assert "LlamaForCausalLM → decoder" in stdout and "checked model.safetensors" in stdout
    text = out.read_text()
    assert text.startswith("# Imported by `specc import-hf` from ") and str(folder / "config.json") in text
    assert load_spec(out) == import_hf(folder).spec
    assert not list(tmp_path.glob(".llama.yaml.*"))  # no temporary left behind


def test_cli_accepts_the_config_file_itself(cli, tmp_path: Path) -> None:
    _, folder = save(BY_ID["bert-mlm"], tmp_path)
    code, _, _ = cli("import-hf", folder / "config.json", "-o", tmp_path / "b.yaml", "--name", "tiny-bert")
    assert code == 0
    assert yaml.safe_load((tmp_path / "b.yaml").read_text())["name"] == "tiny-bert"


def test_cli_refuses_a_checkpoint_that_does_not_fit(cli, tmp_path: Path) -> None:
    _, folder = save(BY_ID["gpt2-tied"], tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_layer"] = 1  # config and checkpoint disagree
    (folder / "config.json").write_text(json.dumps(cfg))
    code, _, stderr = cli("import-hf", folder, "-o", tmp_path / "g.yaml")
    assert code == 2
    assert "unexpected tensor: transformer.h.1." in stderr and "layers up to index 1" in stderr
    assert not (tmp_path / "g.yaml").exists()


# ---------------------------------------------------------------------------------------------- refusals

_GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_embd": 32,
    "n_layer": 1,
    "n_head": 4,
    "n_positions": 16,
    "vocab_size": 50,
}
_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 50,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({**_GPT2, "scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({**_GPT2, "add_cross_attention": True}, "add_cross_attention"),
        ({**_GPT2, "activation_function": "mish"}, "activation_function"),
        (
            {**_LLAMA, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
            "rope_parameters.low_freq_factor",
        ),
        ({**_LLAMA, "rope_scaling": {"type": "mrope", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({**_LLAMA, "architectures": ["LlamaForSequenceClassification"]}, "architectures"),
        (
            {
                "architectures": ["BertModel"],
                "model_type": "bert",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "intermediate_size": 64,
                "vocab_size": 50,
                "max_position_embeddings": 16,
                "position_embedding_type": "relative_key",
            },
            "position_embedding_type",
        ),
        (
            {
                "architectures": ["ViTModel"],
                "model_type": "vit",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "intermediate_size": 64,
                "image_size": 16,
                "patch_size": 4,
                "pooler_act": "relu",
            },
            "pooler_act",
        ),
        (
            {
                "architectures": ["BartForConditionalGeneration"],
                "model_type": "bart",
                "d_model": 32,
                "encoder_layers": 1,
                "decoder_layers": 1,
                "encoder_attention_heads": 4,
                "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "decoder_ffn_dim": 64,
                "vocab_size": 50,
                "max_position_embeddings": 16,
            },
            "decoder_attention_heads",
        ),
        ({"architectures": ["XLNetLMHeadModel"], "model_type": "xlnet"}, "architectures"),  # no feature row
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_unexpressible_fields_are_located_errors(tmp_path: Path, data: dict, field: str) -> None:
    path = _config(tmp_path, data)
    with pytest.raises(SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    assert field in d.message and d.file == str(path)
    key = field.split(".")[0]
    assert d.line == 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if f'"{key}"' in line)


def test_no_architectures_falls_back_to_model_type(tmp_path: Path) -> None:
    data = {k: v for k, v in _LLAMA.items() if k != "architectures"}
    assert import_hf(_config(tmp_path, data)).architecture == "LlamaForCausalLM"


def test_unknown_fields_are_noted_not_silent(tmp_path: Path) -> None:
    imported = import_hf(_config(tmp_path, {**_GPT2, "fancy_new_switch": True}))
    assert any("fancy_new_switch" in n for n in imported.notes)
    assert "# note: " in imported.yaml_text() and "fancy_new_switch" in imported.yaml_text()


def test_window_covering_the_context_is_plain_causal(tmp_path: Path) -> None:
    data = {**_LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096}
    assert import_hf(_config(tmp_path, data)).spec.attention.mask is None  # decoder default: causal


def test_cli_error_exit_code_and_message(cli, tmp_path: Path) -> None:
    path = _config(tmp_path, {**_GPT2, "scale_attn_by_inverse_layer_idx": True})
    code, _, stderr = cli("import-hf", path, "-o", tmp_path / "x.yaml")
    assert code == 2 and f"{path}:" in stderr and "error: scale_attn_by_inverse_layer_idx" in stderr
    code, _, stderr = cli("import-hf", tmp_path / "nowhere")
    assert code == 2 and "no config.json" in stderr
