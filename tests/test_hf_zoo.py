"""Tiny random-weight Hugging Face models, built locally from configs (never downloaded), shared by the
test_hf_* files; plus checks that the zoo itself is what the equivalence tests think it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@dataclass(frozen=True)
class Case:
    id: str
    arch: str  # transformers class name
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.id.split("-")[0]

    @property
    def text(self) -> bool:
        return self.family != "vit"

    @property
    def seq2seq(self) -> bool:
        return self.family in ("bart", "marian")


_LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, vocab_size=96, max_position_embeddings=64)
_BART = dict(d_model=32, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=90, max_position_embeddings=64)

CASES = [
    Case("gpt2-tied", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=96, n_positions=64)),
    Case(
        "gpt2-untied-relu",
        "GPT2LMHeadModel",
        dict(
            n_embd=24,
            n_layer=3,
            n_head=3,
            n_inner=40,
            vocab_size=80,
            n_positions=48,
            activation_function="relu",
            tie_word_embeddings=False,
        ),
    ),
    Case(
        "gpt2-unscaled",
        "GPT2LMHeadModel",
        dict(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32, scale_attn_weights=False),
    ),
    Case("llama-gqa", "LlamaForCausalLM", dict(_LLAMA, num_attention_heads=4, num_key_value_heads=2)),
    Case(
        "llama-mqa-tied",
        "LlamaForCausalLM",
        dict(_LLAMA, num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True, rope_theta=500000.0),
    ),
    Case(
        "llama-bias-headdim",
        "LlamaForCausalLM",
        dict(
            _LLAMA,
            hidden_size=24,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=8,
            attention_bias=True,
            mlp_bias=True,
            num_hidden_layers=1,
        ),
    ),
    Case(
        "mixtral-4x2",
        "MixtralForCausalLM",
        dict(_LLAMA, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    ),
    Case(
        "mixtral-3x1-window",
        "MixtralForCausalLM",
        dict(
            _LLAMA,
            num_attention_heads=2,
            num_key_value_heads=1,
            num_local_experts=3,
            num_experts_per_tok=1,
            sliding_window=4,
        ),
    ),
    Case(
        "mistral-window",
        "MistralForCausalLM",
        dict(_LLAMA, num_attention_heads=4, num_key_value_heads=2, sliding_window=5, num_hidden_layers=1),
    ),
    Case(
        "bert-mlm",
        "BertForMaskedLM",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=90,
            max_position_embeddings=40,
        ),
    ),
    Case(
        "bert-pooled",
        "BertModel",
        dict(
            hidden_size=24,
            intermediate_size=40,
            num_hidden_layers=1,
            num_attention_heads=2,
            vocab_size=70,
            max_position_embeddings=32,
            type_vocab_size=3,
            hidden_act="gelu_new",
        ),
    ),
    Case(
        "vit-cls",
        "ViTForImageClassification",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            num_labels=5,
        ),
    ),
    Case(
        "vit-model",
        "ViTModel",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=16,
            patch_size=4,
        ),
    ),
    Case(
        "vit-mono",
        "ViTForImageClassification",
        dict(
            hidden_size=24,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=3,
            image_size=24,
            patch_size=6,
            num_channels=1,
            qkv_bias=False,
            num_labels=3,
        ),
    ),
    Case(  # CLIP's vision tower: quick_gelu, pre_layrnorm, bias-free patch conv, post_layernorm of the class token
        "vit-clip",
        "CLIPVisionModel",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=24,
            patch_size=6,
            layer_norm_eps=1e-5,
        ),
    ),
    Case(  # SigLIP's vision tower: patch tokens only, post_layernorm, the attention-pooling head
        "vit-siglip",
        "SiglipVisionModel",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=16,
            patch_size=4,
        ),
    ),
    Case(
        "vit-siglip-nohead",
        "SiglipVisionModel",
        dict(
            hidden_size=24,
            intermediate_size=40,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=14,  # 3 × 3 patches of 4: the conv drops 2 rows and columns
            patch_size=4,
            vision_use_head=False,
        ),
    ),
    Case(  # ModernBERT: a global layer every 3rd, two-sided windows of 4 (2 each side) in the others
        "modernbert-mlm",
        "ModernBertForMaskedLM",
        dict(
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=4,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=64,
            local_attention=4,
            global_attn_every_n_layers=3,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            global_rope_theta=1000.0,
            local_rope_theta=50.0,
        ),
    ),
    Case(
        "modernbert-model",
        "ModernBertModel",
        dict(
            hidden_size=32,
            intermediate_size=40,
            num_hidden_layers=3,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=64,
            local_attention=4,
            global_attn_every_n_layers=2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            global_rope_theta=1000.0,
            local_rope_theta=50.0,
        ),
    ),
    Case(
        "cliptext-eos",
        "CLIPTextModel",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=16,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=94,
        ),
    ),  # pooled at the first id 94
    Case(
        "cliptext-legacy",
        "CLIPTextModel",
        dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=16,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        ),
    ),  # eos id 2: pooled at the largest id
    Case(
        "bart-tied",
        "BartForConditionalGeneration",
        dict(
            _BART,
            encoder_layers=2,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            scale_embedding=True,
        ),
    ),
    Case(
        "bart-untied",
        "BartForConditionalGeneration",
        dict(
            _BART,
            encoder_layers=1,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            tie_word_embeddings=False,
            activation_function="relu",
        ),
    ),
    Case(
        "marian-shared",
        "MarianMTModel",
        dict(
            _BART,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            scale_embedding=True,
            activation_function="swish",
        ),
    ),
    Case(
        "marian-unshared",
        "MarianMTModel",
        dict(
            _BART,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            share_encoder_decoder_embeddings=False,
            decoder_vocab_size=70,
        ),
    ),
]
BY_ID = {c.id: c for c in CASES}


# Init std of the zoo's random weights. At HF's usual 0.02 the activations are so small that the equivalence
# tests cannot tell gelu from gelu_tanh (BERT logits move by 1.5e-7), and attention is so uniform that a wrong
# attention scale or RoPE theta moves the logits by less than 1e-4: weights at 0.3 (and norms and biases
# randomised by 0.3) make such mistakes fail them (test_hf_equivalence.py::test_a_mutated_import_fails).
STD = 0.3
NORM_BIAS_NOISE = 0.3


def build(case: Case, seed: int = 0, std: float = STD) -> Any:
    """The HF model of ``case`` with random weights at ``std`` (norms and biases randomised too), in eval mode."""
    cls = getattr(transformers, case.arch)
    config_cls = getattr(transformers, cls.config_class.__name__)
    kwargs = dict(case.config)
    kwargs["init_std" if case.seq2seq else "initializer_range"] = std
    if case.family == "bart":
        kwargs.update(pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)
    if case.family == "marian":
        pad = min(kwargs["vocab_size"], kwargs.get("decoder_vocab_size", kwargs["vocab_size"])) - 1
        kwargs.update(pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0)
    torch.manual_seed(seed)
    model = cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # non-trivial norms, biases and final_logits_bias so that a dropped one shows
        for name, p in model.named_parameters():
            if (name.endswith(("bias", "weight")) and p.dim() == 1) or name.endswith("_proj_bias"):  # GPT-OSS [E, n]
                p.add_(torch.randn_like(p) * NORM_BIAS_NOISE)
        for name, b in model.named_buffers():
            if name.endswith("final_logits_bias"):
                b.add_(torch.randn_like(b) * NORM_BIAS_NOISE)
    return model


def save(case: Case, folder: Path, seed: int = 0, std: float = STD) -> tuple[Any, Path]:
    model = build(case, seed, std)
    out = folder / case.id
    model.save_pretrained(out)
    return model, out


def test_zoo_models_save_config_and_safetensors(tmp_path: Path) -> None:
    model, out = save(BY_ID["gpt2-tied"], tmp_path)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    assert model.config.architectures == ["GPT2LMHeadModel"]


def test_zoo_randomises_norms_so_missing_ones_would_show() -> None:
    model = build(BY_ID["llama-gqa"])
    assert not torch.allclose(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
