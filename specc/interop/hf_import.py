"""``import-hf``: a Hugging Face config.json → a validated specc spec document and its YAML text."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import Diagnostic, SpecError
from ..io import atomic_write, read
from ..spec.loader import load_spec
from ..spec.schema import SpecModel
from . import missing
from .family import Family
from .hf_config import HFConfig
from .registry import DEFAULT_ARCHITECTURE, FAMILIES, by_architecture, supported_architectures


@dataclass
class Imported:
    spec: SpecModel
    document: dict[str, Any]  # the spec as written (before defaults)
    architecture: str
    config_path: str
    transformers_version: str = "?"
    notes: list[str] = field(default_factory=list)

    def yaml_text(self) -> str:
        header = [
            f"# Imported by `specc import-hf` from {self.config_path}",
            f"# ({self.architecture}, transformers {self.transformers_version}). Weights load as saved:",
            f"#   specc compile <this spec> --weights {Path(self.config_path).parent / 'model.safetensors'}",
            *(f"# note: {n}" for n in self.notes),
        ]
        body = yaml.safe_dump(self.document, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
        return "\n".join(header) + "\n" + body


def import_hf(path: str | os.PathLike[str], name: str | None = None) -> Imported:
    """Map the config.json at ``path`` (a file or a save_pretrained folder) to a spec; refuse what specc lacks."""
    cfg = HFConfig.read(path)
    family, arch = _family(cfg)
    body = family.spec(cfg, arch)
    doc: dict[str, Any] = {
        "name": name or _name(cfg, Path(path)),
        "kind": body.pop("kind"),
        "source": f"Hugging Face {arch}, {cfg.path}",
    }
    if cfg.dtype() != "fp32":
        doc["dtype"] = cfg.dtype()
    doc.update(body)
    notes = list(cfg.notes)
    unused = cfg.unused()
    if unused:
        notes.append(f"config fields specc does not know (check they leave the model unchanged): {', '.join(unused)}")
    try:
        spec = load_spec(doc)
    except SpecError as e:  # one line: the config's fields have no line-level counterpart in the spec
        first = e.diagnostics[0]
        more = f" (and {len(e.diagnostics) - 1} more problems)" if len(e.diagnostics) > 1 else ""
        raise SpecError(
            [Diagnostic(f"the imported spec is invalid: {first.message}{more}", cfg.path, hint=first.hint)]
        ) from None
    return Imported(spec, doc, arch, cfg.path, str(cfg.data.get("transformers_version", "?")), notes)


def write(imported: Imported, output: str | os.PathLike[str]) -> Path:
    """Write the spec YAML atomically."""
    return atomic_write(output, imported.yaml_text())


def _family(cfg: HFConfig) -> tuple[Family, str]:
    archs = cfg.data.get("architectures") or []
    model_type = cfg.data.get("model_type")
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise cfg.refuse(
            "architectures",
            f"expected a list of class names, got {read.json_kind(archs)}",
            'e.g. "architectures": ["LlamaForCausalLM"]',
        )
    if model_type is not None and not isinstance(model_type, str):
        raise cfg.refuse(
            "model_type", f"expected a name, got {read.json_kind(model_type)}", 'e.g. "model_type": "llama"'
        )
    arch = archs[0] if archs else DEFAULT_ARCHITECTURE.get(str(model_type))
    if arch is None:
        raise cfg.refuse("model_type", f"model type {model_type!r} is not supported", _supported())
    family = by_architecture(arch)
    if family is None:
        same = [a for f in FAMILIES if model_type in f.model_types for a in f.architectures]
        hint = f"for model_type {model_type!r} specc imports {', '.join(same)}" if same else _supported()
        raise missing.refusal(cfg, arch) or cfg.refuse("architectures", f"{arch} is not supported", hint)
    return family, arch


def _supported() -> str:
    return "supported: " + ", ".join(supported_architectures())


def _name(cfg: HFConfig, path: Path) -> str:
    raw = cfg.data.get("_name_or_path") or (path if path.is_dir() else path.parent).resolve().name or "imported"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(raw)).name).strip("-.") or "imported"
