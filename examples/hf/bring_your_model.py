"""Bring your Hugging Face model: build a small random HF model locally, save it as save_pretrained does, import
its config.json with ``specc import-hf``, load the HF checkpoint into specc's torch and ONNX backends, and check
both compute the HF function (logits and greedy tokens).

    python examples/hf/bring_your_model.py --family llama --out /tmp/tiny-llama

No download: the HF model is random, built from a config. Families: gpt2 llama mixtral qwen3 gemma2 phi3 neox
olmo2 bert vit bart marian.
With your own checkpoint, skip step 1 and point step 2 at its folder.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np
import torch
import transformers

import specc
from specc.cli import run as specc_cli

_TEXT = dict(vocab_size=128, max_position_embeddings=64)
_LLAMA = dict(_TEXT, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
_S2S = dict(
    _TEXT,
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    scale_embedding=True,
)
TINY: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)),
    "llama": ("LlamaForCausalLM", dict(_LLAMA, num_key_value_heads=2)),
    "mixtral": ("MixtralForCausalLM", dict(_LLAMA, num_key_value_heads=2, num_local_experts=4)),
    "qwen3": ("Qwen3ForCausalLM", dict(_LLAMA, num_key_value_heads=2, head_dim=32)),
    "gemma2": (
        "Gemma2ForCausalLM",
        dict(_LLAMA, num_key_value_heads=2, head_dim=32, sliding_window=4, tie_word_embeddings=False),
    ),
    "phi3": ("Phi3ForCausalLM", dict(_LLAMA, sliding_window=6, pad_token_id=0)),
    "neox": ("GPTNeoXForCausalLM", dict(_LLAMA, rotary_pct=0.25)),
    "olmo2": ("Olmo2ForCausalLM", dict(_LLAMA, num_key_value_heads=2)),
    "bert": (
        "BertForMaskedLM",
        dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    ),
    "vit": (
        "ViTForImageClassification",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
            num_labels=10,
        ),
    ),
    "bart": ("BartForConditionalGeneration", dict(_S2S, pad_token_id=1, decoder_start_token_id=2)),
    "marian": ("MarianMTModel", dict(_S2S, decoder_vocab_size=128, pad_token_id=127, decoder_start_token_id=127)),
}


def make_hf_model(family: str, folder: Path) -> Any:
    """Step 1: a random HF model, written with save_pretrained (config.json + model.safetensors)."""
    arch, config = TINY[family]
    cls = getattr(transformers, arch)
    torch.manual_seed(0)
    std = {"init_std" if family in ("bart", "marian") else "initializer_range": 0.2}  # sharper than HF's 0.02
    model = cls(cls.config_class(**config, **std)).eval()
    model.save_pretrained(folder)
    return model


def example_inputs(family: str, model: Any) -> dict[str, torch.Tensor]:
    c = model.config
    if family == "vit":
        return {"pixel_values": torch.randn(2, c.num_channels, c.image_size, c.image_size)}
    ids = torch.randint(3, c.vocab_size - 1, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # the second row is right-padded
    x = {"input_ids": ids, "attention_mask": mask}
    if family in ("bart", "marian"):
        x["decoder_input_ids"] = torch.randint(3, c.vocab_size - 1, (2, 5))
    if family == "bert":
        x["token_type_ids"] = torch.zeros_like(ids)
    return x


def max_diff(family: str, x: dict[str, torch.Tensor], ref: torch.Tensor, got: Any) -> float:
    got = torch.as_tensor(np.asarray(got))
    if family not in ("bert", "vit", "bart", "marian"):  # a decoder's padded positions are never read
        keep = x["attention_mask"].bool()
        ref, got = ref[keep], got[keep]
    return float((ref - got).abs().max())


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=sorted(TINY), default="llama")
    ap.add_argument("--out", type=Path, default=Path("tiny-hf"))
    args = ap.parse_args(argv)
    hf_dir, spec_path, onnx_path = args.out / "hf", args.out / "spec.yaml", args.out / "model.onnx"
    args.out.mkdir(parents=True, exist_ok=True)

    hf = make_hf_model(args.family, hf_dir)
    # Step 2: config.json → spec (same as `specc import-hf tiny-hf/hf -o tiny-hf/spec.yaml` in a shell).
    assert specc_cli(["import-hf", str(hf_dir), "-o", str(spec_path)]) == 0
    spec = specc.load_spec(spec_path)
    weights = hf_dir / "model.safetensors"  # HF names: specc maps them onto its own

    # Step 3: the torch backend, with the HF checkpoint.
    x = example_inputs(args.family, hf)
    with torch.no_grad():
        ref = hf(**x).logits
        got = specc.build_torch(spec, weights=weights).run(dict(x))["logits"]
    result = {"torch": max_diff(args.family, x, ref, got)}

    # Step 4: ONNX (one fused attention node per layer), run with onnxruntime.
    import onnxruntime as ort

    specc.export_onnx(spec, onnx_path, weights=weights)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs()}
    result["onnx"] = max_diff(args.family, x, ref, sess.run(["logits"], feeds)[0])

    # Step 5: greedy generation with the KV cache against HF generate.
    if args.family not in ("bert", "vit"):
        prompt = x["input_ids"][:1, :6]
        hf.generation_config.update(eos_token_id=None, forced_eos_token_id=None, pad_token_id=0, do_sample=False)
        want = hf.generate(prompt, max_new_tokens=8, min_new_tokens=8)
        s2s = args.family in ("bart", "marian")  # a decoder refuses an encoder-decoder's option
        seq2seq = {"decoder_start_token_id": hf.config.decoder_start_token_id} if s2s else {}
        got_ids = specc.build_torch(spec, weights=weights).generate(prompt, 8, **seq2seq)
        result["generate_mismatches"] = float((want[:, -8:] != got_ids[:, -8:]).sum())

    for k, v in result.items():
        print(f"{k:>20}: {v:.2e}")
    ok = result["torch"] < 1e-4 and result["onnx"] < 1e-4 and result.get("generate_mismatches", 0) == 0
    print("same function as Hugging Face" if ok else "MISMATCH")
    return result


if __name__ == "__main__":
    main()
