"""The Hugging Face families specc imports, and how to find the one for a config or a checkpoint."""

from __future__ import annotations

from collections.abc import Iterable

from . import (
    hf_bart,
    hf_bert,
    hf_bloom,
    hf_clip,
    hf_cohere,
    hf_deepseek,
    hf_dual,
    hf_exaone4,
    hf_falcon,
    hf_gemma,
    hf_gpt2,
    hf_gpt_oss,
    hf_gptj,
    hf_granite,
    hf_llama,
    hf_llama4,
    hf_modernbert,
    hf_mpt,
    hf_neox,
    hf_olmo2,
    hf_olmoe,
    hf_opt,
    hf_phi,
    hf_phi3,
    hf_qwen,
    hf_roberta,
    hf_siglip,
    hf_smollm3,
    hf_starcoder2,
    hf_t5,
    hf_vit,
    hf_whisper,
)
from .family import Family

# Checkpoint detection takes the first family whose naming matches: the Llama-named families share one plan.
FAMILIES: tuple[Family, ...] = (
    hf_gpt2.FAMILY,
    hf_gpt_oss.FAMILY,  # before the Llama-named families: its q/k/v names are theirs
    hf_phi.FAMILY,  # before Llama: Phi-2 shares its q/k/v names
    hf_deepseek.FAMILY,  # before Llama: DeepSeek-V2-Lite has a q_proj
    hf_llama4.FAMILY,  # before Llama: its q/k/v names are Llama's
    hf_llama.FAMILY,
    hf_qwen.FAMILY,
    hf_phi3.FAMILY,
    hf_gemma.FAMILY,
    hf_olmo2.FAMILY,
    hf_olmoe.FAMILY,
    hf_smollm3.FAMILY,
    hf_exaone4.FAMILY,
    hf_cohere.FAMILY,
    hf_starcoder2.FAMILY,
    hf_granite.FAMILY,
    hf_neox.FAMILY,
    hf_gptj.FAMILY,
    hf_bloom.FAMILY,  # before Falcon: it shares Falcon's names and adds an embedding norm
    hf_falcon.FAMILY,
    hf_mpt.FAMILY,
    hf_bert.FAMILY,
    hf_modernbert.FAMILY,
    hf_roberta.ROBERTA_FAMILY,
    hf_roberta.DISTILBERT_FAMILY,
    hf_opt.FAMILY,
    hf_vit.FAMILY,
    hf_dual.CLIP_FAMILY,  # before the towers: a dual encoder's checkpoint holds their names under its prefixes
    hf_dual.SIGLIP_FAMILY,
    hf_clip.VISION_FAMILY,
    hf_clip.TEXT_FAMILY,
    hf_siglip.FAMILY,
    hf_whisper.FAMILY,  # before BART: it shares BART's layer names and adds the conv front-end
    hf_bart.FAMILY,
    hf_t5.FAMILY,
    hf_t5.ENCODER_FAMILY,
)

# The class to assume when a config.json names no ``architectures``.
DEFAULT_ARCHITECTURE = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "llama4": "Llama4ForConditionalGeneration",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi": "PhiForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gptj": "GPTJForCausalLM",
    "falcon": "FalconForCausalLM",
    "bloom": "BloomForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "mpt": "MptForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "bert": "BertModel",
    "modernbert": "ModernBertForMaskedLM",
    "roberta": "RobertaModel",
    "distilbert": "DistilBertModel",
    "opt": "OPTForCausalLM",
    "vit": "ViTForImageClassification",
    "clip_vision_model": "CLIPVisionModel",
    "clip_text_model": "CLIPTextModel",
    "siglip_vision_model": "SiglipVisionModel",
    "clip": "CLIPModel",
    "siglip": "SiglipModel",
    "bart": "BartForConditionalGeneration",
    "marian": "MarianMTModel",
    "t5": "T5ForConditionalGeneration",
    "mt5": "MT5ForConditionalGeneration",
    "umt5": "UMT5ForConditionalGeneration",
    "whisper": "WhisperForConditionalGeneration",
}


def supported_architectures() -> list[str]:
    return [a for f in FAMILIES for a in f.architectures]


def by_architecture(arch: str) -> Family | None:
    return next((f for f in FAMILIES if arch in f.architectures), None)


def by_names(names: Iterable[str]) -> Family | None:
    """The family whose checkpoint naming these tensor names follow."""
    found = set(names)
    return next((f for f in FAMILIES if f.detect(found)), None)
