"""``genai_config.json`` beside a decoder-only KV-cache export, so onnxruntime-genai's runtime (its generator
loop, search and sampling, chat templates, the providers it wraps) loads specc's graph as it loads the graphs
of its own model builder (``onnxruntime_genai/models/builders/base.py``, ``make_genai_config``).

What the runtime reads, and what specc's graph has:
- ``model.decoder.inputs``: ``input_ids``, ``attention_mask`` (int64, past + new tokens: specc's positions
  follow it, so ``position_ids`` is not listed and the graph's default applies), ``past_key_values.%d.key|value``;
  ``outputs``: ``logits``, ``present.%d.key|value``; the cache ``[batch, kv_heads, past_sequence, head_dim]``
  (kv_cache.py), the same for every layer (``num_key_value_heads``, ``head_size``).
- ``search.past_present_share_buffer``: false. specc's standard graph returns past + new as the present; the
  runtime then feeds it back as the next past.
- Token ids (``bos`` / ``eos`` / ``pad``) from the source folder's ``generation_config.json`` or
  ``config.json`` (Hugging Face); without them ``eos_token_id`` is an empty list (the runtime checks ids against
  the vocabulary): generation runs to ``max_length``, as ``specc run --generate`` does without ``--eos-id``.
- ``model.type``: the Hugging Face ``model_type`` when the folder names one the runtime knows, else ``llama``
  (the generic decoder-only model of the runtime: inputs and outputs come from the names above).
The tokenizer files of the source folder (``tokenizer.json`` ...) are copied beside the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ...io import atomic_write, output_target, read
from ...ir.graph import LayerGraph
from .builder import ExportOptions
from .kv_cache import KVCache

CONFIG = "genai_config.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)
# model_type values onnxruntime-genai 0.18 runs as a plain decoder-only LLM
KNOWN_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "olmo", "granite", "smollm3")


def config_path(model: Path) -> Path:
    return model.with_name(CONFIG)


def validate(g: LayerGraph, opts: ExportOptions, quantized: bool) -> None:
    """What the runtime cannot drive, refused before any work."""
    if g.meta.get("family") != "decoder" or "input_ids" not in g.inputs:
        raise SpecError(f"--genai needs a decoder-only model; {g.meta.get('name')} is a {g.meta.get('family')}")
    if not opts.kv_cache:
        raise SpecError("--genai needs --kv-cache", hint="onnxruntime-genai feeds the cache back every step")
    if not opts.padding_mask:
        raise SpecError("--genai needs the attention_mask input", hint="the runtime feeds attention_mask")
    ops = KVCache.plan(g).ops
    if any(op.kind == "latent_attention" for op in ops):
        raise SpecError(
            "--genai: onnxruntime-genai allocates per-head K/V caches; latent attention caches a latent and a "
            "rotary key of other widths",
            hint="export without --genai (specc run drives the graph)",
        )
    layouts = {(op.attrs.kv_heads, op.attrs.head_dim) for op in ops}
    if len(layouts) != 1:
        raise SpecError(
            f"--genai: the cached layers differ in kv_heads / head_dim ({sorted(layouts)})",
            hint="onnxruntime-genai allocates one cache shape for every layer",
        )


def source_folder(weights: Any) -> Path | None:
    """The folder of a checkpoint given by path (where config.json and tokenizer files live)."""
    if not isinstance(weights, (str, os.PathLike)):
        return None
    p = Path(weights)
    return p if p.is_dir() else p.parent


def targets(model: Path, weights: Any) -> list[Path]:
    """Every file ``write`` will write (checked before any work)."""
    folder = source_folder(weights)
    files = [f for f in TOKENIZER_FILES if folder is not None and (folder / f).is_file()]
    return [config_path(model), *(model.with_name(f) for f in files)]


def write(g: LayerGraph, opts: ExportOptions, model: Path, weights: Any, last: bool = False) -> list[Path]:
    """Write ``genai_config.json`` for ``model`` (and copy the tokenizer files); returns what was written.
    ``last``: these are the command's final outputs."""
    folder = source_folder(weights)
    hf = _hf_config(folder)
    ops = KVCache.plan(g).ops
    kv_heads, head_dim = ops[0].attrs.kv_heads, ops[0].attrs.head_dim
    vocab = int(g.meta["vocab_size"])
    context = int(g.meta.get("context") or 2048)
    eos = hf.get("eos_token_id", [])  # none: the runtime generates to max_length
    config = {
        "model": {
            "bos_token_id": hf.get("bos_token_id", 0),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": model.name,
                "head_size": head_dim,
                "hidden_size": _width(g),
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": int(ops[0].attrs.heads),
                "num_hidden_layers": len(ops),
                "num_key_value_heads": kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": hf["pad_token_id"] if hf.get("pad_token_id") is not None else _first(eos, 0),
            "type": hf["model_type"] if hf.get("model_type") in KNOWN_TYPES else "llama",
            "vocab_size": vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }
    tokenizer = targets(model, weights)[1:]
    written = [atomic_write(config_path(model), json.dumps(config, indent=4) + "\n", last=last and not tokenizer)]
    for i, target in enumerate(tokenizer):
        assert folder is not None
        data = read.read_bytes(folder / target.name, "a tokenizer file", limit=read.TEXT_BYTES)
        final = last and i == len(tokenizer) - 1
        written.append(atomic_write(target, data, inputs=[folder / target.name], last=final))
    return written


def check_targets(model: Path, weights: Any) -> None:
    for target in targets(model, weights):
        output_target(target)


def _width(g: LayerGraph) -> int:
    """The residual stream's width (the token embedding's)."""
    return int(next(op.attrs.dim for op in g.ops() if op.kind == "embedding"))


def _first(ids: Any, default: int) -> Any:
    if isinstance(ids, list):
        return ids[0] if ids else default
    return ids


def _hf_config(folder: Path | None) -> dict[str, Any]:
    """bos / eos / pad ids and model_type from config.json, generation_config.json overriding the ids."""
    out: dict[str, Any] = {}
    if folder is None:
        return out
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = read.json_object(read.read_json(path, "a Hugging Face config")[0], str(path), "a config")
        for key in ("bos_token_id", "eos_token_id", "pad_token_id", "model_type"):
            if data.get(key) is not None:
                out[key] = data[key]
    return out
