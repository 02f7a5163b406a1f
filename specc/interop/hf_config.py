"""Reading a Hugging Face ``config.json`` strictly: every field is either mapped, known to leave the function
unchanged, or refused with an error at its line in the file. Nothing is approximated silently.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, SpecError
from ..io import read

_MISSING = object()

# PretrainedConfig fields that never change the function of the network (ids, generation, bookkeeping).
_GENERIC = """
    architectures model_type transformers_version _name_or_path name_or_path _commit_hash _attn_implementation
    _attn_implementation_autoset attn_implementation bos_token_id eos_token_id pad_token_id sep_token_id
    decoder_start_token_id forced_bos_token_id forced_eos_token_id use_cache output_attentions output_hidden_states
    return_dict torchscript use_return_dict problem_type finetuning_task tokenizer_class prefix task_specific_params
    id2label label2id num_labels max_length min_length do_sample early_stopping num_beams num_beam_groups
    diversity_penalty temperature top_k top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size
    encoder_no_repeat_ngram_size bad_words_ids num_return_sequences output_scores return_dict_in_generate
    remove_invalid_values exponential_decay_length_penalty suppress_tokens begin_suppress_tokens
    chunk_size_feed_forward tf_legacy_loss use_bfloat16 is_encoder_decoder cross_attention_hidden_size
    tie_encoder_decoder classifier_dropout initializer_range init_std dtype torch_dtype gradient_checkpointing
"""
GENERIC_IGNORED = frozenset(_GENERIC.split())

# Hugging Face activation names whose function specc has exactly.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",  # same tanh formula as gelu_new, written differently
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
}
DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class HFConfig:
    """A config.json with access tracking: ``unused()`` lists the fields no family rule looked at."""

    def __init__(self, data: dict[str, Any], path: str, text: str | None = None):
        self.data = data
        self.path = path
        self._text = text or ""
        self._used: set[str] = set(GENERIC_IGNORED)
        self.notes: list[str] = []
        self._start, self._prefix = 0, ""  # a nested config's place in the file and its key path (``sub``)
        self._subs: list[HFConfig] = []

    @classmethod
    def read(cls, path: str | Path) -> HFConfig:
        """A config.json (or a folder holding one), read strictly: a regular UTF-8 file of strict JSON."""
        p = Path(path)
        file = p / "config.json" if p.is_dir() else p
        hint = "give a folder written by save_pretrained, or its config.json"
        data, text = read.read_json(file, "config.json", read.JSON_BYTES, missing=f"no config.json at {p}", hint=hint)
        data = read.json_object(data, str(file), "config.json")
        return cls(data, str(file), text)

    # -- reading ----------------------------------------------------------------------------------------

    def get(self, key: str, default: Any = None) -> Any:
        self._used.add(key)
        return self.data.get(key, default)

    def require(self, key: str) -> Any:
        self._used.add(key)
        if key not in self.data:
            hint = "it is required for this model type"
            raise SpecError(f"config.json has no '{self._prefix}{key}'", file=self.path, hint=hint)
        return self.data[key]

    def ignore(self, *keys: str) -> None:
        """Mark fields that do not change the inference function (dropout-like, training-only, ids)."""
        self._used.update(keys)

    def unused(self) -> list[str]:
        mine = [f"{self._prefix}{k}" for k in self.data if k not in self._used]
        return sorted(mine + [k for sub in self._subs for k in sub.unused()])

    def sub(self, key: str, defaults: dict[str, Any] | None = None) -> HFConfig:
        """The object at ``key`` (a dual encoder's ``text_config``) read as a config of its own: its refusals name
        and point at its fields (``text_config.hidden_act``), and its unread fields count as this config's.
        ``defaults``: values for the fields it leaves out (the class's defaults, where transformers fills them)."""
        data = self.require(key)
        if not isinstance(data, dict):
            raise self.refuse(key, f"expected an object, got {_show(data)}")
        child = HFConfig({**(defaults or {}), **data}, self.path, self._text)
        child._start, child._prefix = self.offset(key) or 0, f"{self._prefix}{key}."
        child.notes = self.notes  # one list: a tower's notes are the model's
        self._subs.append(child)
        return child

    def nested(self, key: str) -> HFConfig | None:
        """The object at ``key`` (a multimodal config's ``text_config``) as a config of its own, its fields found
        at their lines in this file (the text before it blanked, lines kept); None when it is not an object."""
        inner = self.mapping(key)
        if inner is None:
            return None
        at = self.offset(key) or 0
        return HFConfig(inner, self.path, "".join(c if c == "\n" else " " for c in self._text[:at]) + self._text[at:])

    # -- judging ----------------------------------------------------------------------------------------

    def where(self, key: str) -> Diagnostic:
        """A diagnostic at the line of ``"key":`` in the file (first occurrence)."""
        m = re.compile(rf'"{re.escape(key)}"\s*:').search(self._text, self._start)
        if not m:
            return Diagnostic("", self.path)
        line = self._text.count("\n", 0, m.start()) + 1
        col = m.start() - (self._text.rfind("\n", 0, m.start()) + 1) + 1
        return Diagnostic("", self.path, line, col)

    def offset(self, path: str) -> int | None:
        """Where in the file the field at a dotted ``path`` (``attn_config.alibi``) is written; None if absent."""
        at, data = self._start, self.data
        for key in path.split("."):
            if not isinstance(data, dict) or key not in data:
                return None
            m = re.compile(rf'"{re.escape(key)}"\s*:').search(self._text, at)
            if not m:
                return None
            at, data = m.start(), data[key]
        return at

    def where_path(self, path: str) -> Diagnostic:
        """A diagnostic at the line of the field at a dotted ``path`` (the nested key's own line)."""
        at = self.offset(path)
        if at is None:
            return self.where(path.split(".")[0])
        line = self._text.count("\n", 0, at) + 1
        return Diagnostic("", self.path, line, at - (self._text.rfind("\n", 0, at) + 1) + 1)

    def refuse(self, key: str, message: str, hint: str | None = None) -> SpecError:
        w = self.where(key.split(".")[0])
        return SpecError([Diagnostic(f"{self._prefix}{key}: {message}", w.file, w.line, w.col, hint)])

    def expect(self, key: str, allowed: Any, default: Any = _MISSING, why: str = "specc cannot express it") -> Any:
        """The field's value, which must equal ``allowed`` (or be one of a tuple of values)."""
        value = self.get(key, None if default is _MISSING else default)
        ok = value in allowed if isinstance(allowed, tuple) else value == allowed
        if not ok:
            want = " or ".join(map(repr, allowed)) if isinstance(allowed, tuple) else repr(allowed)
            raise self.refuse(key, f"{value!r} is not supported ({why}); only {want} is", None)
        return value

    def activation(self, key: str, default: str) -> str:
        name = self.get(key, default)
        if not isinstance(name, str):
            raise self.refuse(key, f"expected an activation name, got {read.json_kind(name)}", 'e.g. "gelu"')
        if name not in ACTIVATIONS:
            raise self.refuse(
                key,
                f"activation {name!r} has no exact counterpart in specc",
                f"supported: {', '.join(sorted(ACTIVATIONS))}",
            )
        return ACTIVATIONS[name]

    def dtype(self) -> str:
        """The weights' dtype (``dtype``, or transformers 4's ``torch_dtype``); absent means float32."""
        self._used.update(("dtype", "torch_dtype"))
        key = "dtype" if self.data.get("dtype") is not None else "torch_dtype"
        raw = self.data.get(key)
        if raw is None:
            return "fp32"
        name = raw.removeprefix("torch.") if isinstance(raw, str) else None
        if name not in DTYPES:
            shown = repr(raw) if isinstance(raw, str) else read.json_kind(raw)
            raise self.refuse(key, f"{shown} is not a dtype specc builds models in", "float32, float16 or bfloat16")
        return DTYPES[name]

    def num_labels(self) -> int:
        labels = self.get("id2label")
        if labels is not None and not isinstance(labels, dict):
            raise self.refuse("id2label", f"expected an object of labels, got {read.json_kind(labels)}")
        if labels:
            return len(labels)
        return self.positive_int("num_labels", 2)

    def positive_int(self, key: str, default: Any = _MISSING) -> int:
        value = self.require(key) if default is _MISSING else self.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise self.refuse(key, f"expected a positive whole number, got {_show(value)}")
        return value

    def optional_int(self, key: str) -> int | None:
        """A positive whole number, or None when the field is absent or null."""
        if self.get(key) is None:
            return None
        return self.positive_int(key)

    def number(self, key: str, default: float) -> float:
        """A finite real number (JSON ints and floats; not booleans, strings or null)."""
        value = self.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise self.refuse(key, f"expected a number, got {_show(value)}", f'e.g. "{key}": {default!r}')
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean: true or false, never a truthy string or number."""
        value = self.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(key, f"expected true or false, got {_show(value)}", f'write "{key}": true or false')
        return value

    def mapping(self, key: str) -> dict[str, Any] | None:
        """An object, or None when the field is absent or null."""
        value = self.get(key)
        if value is not None and not isinstance(value, dict):
            raise self.refuse(key, f"expected an object, got {_show(value)}")
        return value

    def training(
        self, scaled_residual: bool = False, std: str = "initializer_range", std_default: float = 0.02, **dropout: str
    ) -> dict[str, Any]:
        """The spec's ``dropout`` (spec part → config key) and ``init``: what only training reads."""
        return {
            "dropout": {part: self.dropout(key) for part, key in dropout.items()},
            "init": {"std": self.number(std, std_default), "scaled_residual": scaled_residual},
        }

    def dropout(self, *keys: str) -> float:
        """The first of ``keys`` present (dropout probabilities only matter in training)."""
        for k in keys:
            self._used.add(k)
        for k in keys:
            v = self.data.get(k)
            if v is None:
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                raise self.refuse(k, f"expected a probability between 0 and 1, got {_show(v)}")
            return float(v)
        return 0.0


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) and len(value) <= 40 else read.json_kind(value)
