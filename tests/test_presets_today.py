"""Presets of today's open models: parameter counts exact against the published figures (analyzer only, never
allocating), and each preset is what ``specc import-hf`` makes of its source's released config.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hf_hub_configs import HUB_CONFIGS

from specc import load_spec
from specc.analysis import analyze
from specc.interop import import_hf

PUBLISHED = {
    "llama3.1-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "phi3-mini-4k": 3_821_079_552,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "deepseek-v3": 671_026_404_352,  # transformers builds no multi-token-prediction layer: DeepSeek's "671B"
    "gemma-7b": 8_537_680_896,
    "gemma2-9b": 9_241_705_984,
    "gemma3-1b": 999_885_952,
    "pythia-1.4b": 1_414_647_808,
    "olmo2-7b": 7_298_617_344,
    "bloom-176b": 176_247_271_424,  # the model card's count
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    "t5-base": 222_903_552,
    "flan-t5-xl": 2_849_757_184,  # with its own head, as the released checkpoint loads
    "clip-vit-large-patch14": 303_179_776,  # the vision tower (CLIPVisionModel)
    "siglip-so400m": 428_225_600,  # the vision tower (SiglipVisionModel), patch 14 at 384
    "clip-vit-large-patch14-dual": 427_616_513,  # the whole CLIPModel: both towers, projections, logit scale
    "siglip-so400m-dual": 877_960_498,  # the whole SiglipModel: both towers, the text head, logit scale and bias
    "modernbert-base": 149_655_232,  # ModernBertForMaskedLM, its decoder tied to the embedding
    "llama4-scout": 107_769_861_120,  # the text model (Llama4ForCausalLM): transformers' count, below
    "whisper-large-v3": 1_543_490_560,  # WhisperForConditionalGeneration, the sinusoid table counted as HF does
}


def test_qwen3_moe_active_count() -> None:
    p = analyze("qwen3-30b-a3b", crossover=False).params
    assert p.active == 3_353_032_704  # "3.3B activated": 8 of 128 experts + everything shared
    assert p.total - p.active == p.by_category["mlp"] * 120 // 128


def test_deepseek_v3_active_count_and_latent_kv_cache() -> None:
    r = analyze("deepseek-v3", seq=1000, crossover=False)
    p = r.params
    assert p.active == 37_552_283_088  # "37B activated": 8 of 256 routed experts + the shared one + attention
    assert p.buffers == 58 * 256  # the selection-only score biases of the 58 MoE layers (buffers in transformers)
    assert r.memory["kv_cache"] == 61 * 1000 * (512 + 64) * 2  # the latent and the rotary key, bf16
    kinds = r.to_dict()["flops"]["forward"]["per_kind"]
    assert {k: v["layers"] for k, v in kinds.items()} == {"dense": 3, "moe": 58}
    assert all(v["mask"] == "causal" and v["kv_cache_per_layer"] == 1000 * 576 * 2 for v in kinds.values())


@pytest.mark.parametrize(("preset", "active"), [("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)])
def test_gpt_oss_active_counts(preset: str, active: float) -> None:
    """The model card's active counts (3.61B, 5.13B) leave out the input embedding table."""
    p = analyze(preset, crossover=False).params
    s = load_spec(preset)
    assert round((p.active - s.vocab_size * s.d_model) / 1e7) == round(active / 1e7)
    assert p.total - p.active == p.by_category["mlp"] * (s.mlp.experts - s.mlp.active) // s.mlp.experts


def test_llama4_scout_is_transformers_default_text_config(tmp_path: Path) -> None:
    """Llama4TextConfig's defaults are Scout's text model: transformers builds it (on the meta device) with the
    preset's count, 17B of it active (1 of 16 experts + the shared one + attention), and import-hf of that config
    (saved by transformers, with Scout's llama3 RoPE scaling) is the preset."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0}
    rope.update(high_freq_factor=4.0, original_max_position_embeddings=8192)
    config = transformers.Llama4TextConfig(rope_parameters=rope)
    config.architectures = ["Llama4ForCausalLM"]
    with torch.device("meta"):
        model = transformers.Llama4ForCausalLM(config)
    p = analyze("llama4-scout", crossover=False).params
    assert p.total == model.num_parameters() == PUBLISHED["llama4-scout"]
    assert round(p.active / 1e9) == 17
    assert p.total - p.active == 48 * 15 * 3 * 5120 * 8192  # the 15 idle experts of every layer
    config.save_pretrained(tmp_path)
    imported = import_hf(tmp_path).spec.model_dump(exclude=_NOT_ARCHITECTURE)
    assert imported == load_spec("llama4-scout").model_dump(exclude=_NOT_ARCHITECTURE)


def test_kimi_k2_style_config_imports_with_transformers_count(tmp_path: Path) -> None:
    """Kimi K2 is DeepSeek-V3's architecture (its config.json: model_type kimi_k2, DeepseekV3ForCausalLM) with
    other sizes: 64 heads, 384 experts in one group, one dense layer. specc counts what transformers builds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = dict(copy.deepcopy(HUB_CONFIGS["deepseek-v3"]), model_type="kimi_k2")  # transformers edits rope_scaling
    data.update(num_attention_heads=64, num_key_value_heads=64)
    data.update(n_routed_experts=384, n_group=1, topk_group=1, first_k_dense_replace=1, vocab_size=163840)
    data.update(routed_scaling_factor=2.827, rope_theta=50000.0)
    del data["architectures"]  # found from model_type
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    spec = import_hf(path).spec
    skip = {"model_type", "transformers_version", "torch_dtype"}
    with torch.device("meta"):
        cls = transformers.DeepseekV3ForCausalLM
        model = cls(cls.config_class(**{k: v for k, v in data.items() if k not in skip}))
    assert analyze(spec, crossover=False).params.total == model.num_parameters() > 10**12


@pytest.mark.parametrize(("preset", "count"), PUBLISHED.items())
def test_published_parameter_counts(preset: str, count: int) -> None:
    r = analyze(preset, crossover=False)
    assert r.params.total == count
    assert load_spec(preset).source  # every preset names where its numbers come from


# what a preset states beyond the architecture (and import-hf's training-only defaults)
# (dtype: the presets state what the models are run in, the configs what the files were saved in)
_NOT_ARCHITECTURE = {"name", "source", "description", "init", "dropout", "dtype"}


@pytest.mark.parametrize("preset", HUB_CONFIGS)
def test_preset_is_the_import_of_its_source_config(preset: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HUB_CONFIGS[preset], indent=2), encoding="utf-8")
    imported = import_hf(path).spec.model_dump(exclude=_NOT_ARCHITECTURE)
    assert imported == load_spec(preset).model_dump(exclude=_NOT_ARCHITECTURE)


@pytest.mark.parametrize("preset", HUB_CONFIGS)
def test_hf_counts_the_published_number_from_the_same_config(preset: str) -> None:
    """The configs above are the released ones: transformers builds (on the meta device, allocating nothing)
    a model of exactly the published size from each."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = HUB_CONFIGS[preset]
    cls = getattr(transformers, data["architectures"][0])
    skip = {"architectures", "model_type", "transformers_version", "torch_dtype"}
    with torch.device("meta"):
        model = cls(cls.config_class(**{k: v for k, v in data.items() if k not in skip}))
        untied = data.get("tie_word_embeddings") is False  # CLIPModel has no get_input_embeddings: not asked
        head, table = (model.get_output_embeddings(), model.get_input_embeddings()) if untied else (None, None)
        if untied and head is not None and head.weight is table.weight:
            # transformers 5 builds T5 tied whatever the config says; from_pretrained unties it again when the
            # checkpoint holds both tensors, different (flan-t5's), so the released model has its own head
            head.weight = torch.nn.Parameter(torch.empty_like(table.weight))
    assert model.num_parameters() == PUBLISHED[preset]


def test_deepseek_v3_splits_latent_attention_over_tp_and_cp() -> None:
    """Latent attention splits by heads over tp (q_b, kv_b by head rows, out row-wise; the latent whole on every
    rank, its cache too) and by tokens over cp (the expanded K/V pass round the ring, as Megatron-Core's MLA
    hands them to its core attention)."""
    from specc import lower
    from specc.analysis.layouts.layout import Layout, LayoutError, check_layout
    from specc.analysis.layouts.shard import param_shards

    g = lower(load_spec("deepseek-v3"))
    check_layout(g, Layout(cp=2, dp=1), 4096)
    check_layout(g, Layout(tp=8, pp=4, dp=8, ep=8), 4096)
    split = {p.name.split(".", 3)[-1]: p.tp_dim for p in param_shards(g) if p.name.startswith("blocks.0.attn.")}
    assert split == {"q_a.weight": None, "q_a_norm.weight": None, "q_b.weight": 0, "kv_a.weight": None,
                     "kv_a_norm.weight": None, "core.kv_b.weight": 0, "out.weight": 1}  # fmt: skip
    with pytest.raises(LayoutError, match="attention heads 128 are not divisible by tp=3"):
        check_layout(g, Layout(tp=3, dp=1), 4096)
    check_layout(g, Layout(pp=4, dp=8, ep=8), 4096)
