"""``export-hf``: a spec and its weights → a folder ``transformers`` loads (``config.json`` + ``model.safetensors``).

The class is the one the spec was imported from, else the first of its kind whose config can state the spec
(``hf_config_write``). The written config is imported again and must lower to the same graph, so a config that
would change the function is never written. Weights are the family's weight plan run backwards
(``weight_map.reverse``) onto the tensor names the class has; tied copies are left out (HF ties them on load).
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..io import discard_stage, folder_stage, replace_folder
from ..ir.graph import LayerGraph
from ..ir.lower import lower
from ..spec.yaml_source import Located
from . import weight_map
from .hf_config_write import CANDIDATES, WRITERS, Inexpressible, config
from .hf_import import import_hf
from .registry import by_architecture

# op attributes that change training only (dropout, init) or say where a value came from (a stated scale equal to
# 1/√head_dim is the function HF computes), and graph facts that name or describe the model
_NOT_COMPARED = {"dropout", "init", "scale_stated"}
_META_KEPT = ("family", "task", "context", "vocab_size", "max_positions", "positions_follow", "target_vocab_size")
# op kind → the spec key to blame when HF's config gives it other attributes
_BLAME = {"attention": ("attention",), "layernorm": ("norm",), "rmsnorm": ("norm",), "embedding": ("vocab_size",)}


@dataclass
class Exported:
    folder: Path
    architecture: str
    tensors: int


def choose(spec: Any, doc: Located | None = None) -> tuple[str, dict[str, Any]]:
    """The HF class and config.json for ``spec``; a located error naming what HF lacks when no class fits."""
    kind = spec.kind
    if kind not in CANDIDATES:
        kinds = ", ".join(CANDIDATES)
        raise _refusal(doc, ("kind",), f"Hugging Face has no class for a {kind} model (export-hf writes {kinds})")
    order = _order(spec)
    reasons: list[tuple[str, tuple[str | int, ...], str]] = []
    for arch in order:
        try:
            body = config(spec, arch)
        except Inexpressible as e:
            reasons.append((arch, e.path, e.message))
            continue
        differs = _round_trip(spec, body)
        if differs is None:
            return arch, body
        reasons.append((arch, *differs))
    arch, path, message = reasons[0]
    others = f" (nor do {', '.join(a for a, _, _ in reasons[1:4])}{' ...' if len(reasons) > 4 else ''})"
    raise _refusal(doc, path, f"{arch} cannot express {message}{others if len(reasons) > 1 else ''}")


def _order(spec: Any) -> list[str]:
    """The classes to try: the one the spec was imported from, then those whose model type its name or source
    mentions (longest first: phi3 before phi), then the rest of its kind in their usual order."""
    order = list(CANDIDATES[spec.kind])
    text = f"{spec.name} {spec.source or ''}".lower().replace("-", "")
    mentioned = sorted((a for a in order if WRITERS[a][0].replace("_", "") in text), key=lambda a: -len(WRITERS[a][0]))
    named = re.search(r"Hugging Face (\w+)", spec.source or "")
    first = [named.group(1)] if named and named.group(1) in order else []
    return list(dict.fromkeys([*first, *mentioned, *order]))


def _refusal(doc: Located | None, path: tuple[str | int, ...], message: str) -> SpecError:
    hint = "export-hf writes only what a transformers class computes exactly; change the spec or keep it in specc"
    if doc is None:
        return SpecError(message, hint=hint)
    return SpecError([doc.loc(path).diag(message, hint)])


def _round_trip(spec: Any, body: dict[str, Any]) -> tuple[tuple[str | int, ...], str] | None:
    """None when ``body`` imports back to ``spec``'s graph, else (spec key to blame, what differs)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="specc-export-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(body, indent=2), encoding="utf-8")
        try:
            back = import_hf(tmp, name=spec.name).spec
        except SpecError as e:
            return ("kind",), f"this spec: its config does not import ({e.diagnostics[0].message})"
    return _difference(lower(_untrained(spec)), lower(_untrained(back)))


def _untrained(spec: Any) -> Any:
    """``spec`` without dropout and with default init: what training alone sees is not compared."""
    fields = type(spec).model_fields
    return spec.model_copy(update={k: fields[k].default_factory() for k in ("dropout", "init")})


def _difference(want: LayerGraph, got: LayerGraph) -> tuple[tuple[str | int, ...], str] | None:
    """The first difference between two graphs' functions (names, dropout and init aside)."""
    a, b = _function(want), _function(got)
    for key in ("meta", "inputs", "outputs"):
        if a[key] != b[key]:
            return ("kind",), f"the model's {key}: {_first_diff(a[key], b[key])}"
    ops_a, ops_b = a["ops"], b["ops"]
    if [o["name"] for o in ops_a] != [o["name"] for o in ops_b]:
        extra = sorted({o["name"] for o in ops_a} ^ {o["name"] for o in ops_b})
        return ("kind",), f"this layout: the graphs differ in {', '.join(extra[:3]) or 'op order'}"
    for x, y in zip(ops_a, ops_b, strict=True):
        if x != y:
            path = _BLAME.get(x["kind"], ("mlp",) if ".mlp." in x["name"] else ("kind",))
            if x["attrs"].get("bias") != y["attrs"].get("bias"):
                path = ("bias",)
            return path, f"{x['name']} as the spec has it ({_first_diff(x, y)})"
    return None


def _function(g: LayerGraph) -> dict[str, Any]:
    d = g.to_dict()
    d["meta"] = {k: d["meta"].get(k) for k in _META_KEPT}
    for op in d["ops"]:
        op["attrs"] = {k: v for k, v in op["attrs"].items() if k not in _NOT_COMPARED}
    return d


def _first_diff(x: Any, y: Any) -> str:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in [*x, *(k for k in y if k not in x)]:
            if x.get(k) != y.get(k):
                inner = _first_diff(x.get(k), y.get(k))
                return f"{k}: {inner}" if isinstance(x.get(k), dict) else f"{k} {x.get(k)!r}, HF gives {y.get(k)!r}"
    return f"{x!r}, HF gives {y!r}"


def hf_tensors(graph: LayerGraph, arch: str, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint tensors of class ``arch`` (with config ``body``) from specc parameters ``params``."""
    expected = expected_shapes(arch, body)
    family = by_architecture(arch)
    assert family is not None  # every writer's class is a family's
    plan = family.plan(graph, set(expected))
    out = weight_map.reverse(plan, params, set(expected))
    tied = {n for group in plan.tied for n in group}
    problems = [f"{n}: not written" for n in expected if n not in out and n not in tied and not plan.ignores(n)]
    problems += [f"{n}: not in the class" for n in out if n not in expected]
    problems += [
        f"{n}: shape {list(v.shape)}, the class has {list(expected[n])}"
        for n, v in out.items()
        if n in expected and tuple(v.shape) != expected[n]
    ]
    if problems:
        raise SpecError(weight_map.listed(f"{arch} export", problems, "the spec and the class's weights differ"))
    return out


def expected_shapes(arch: str, body: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The state_dict names and shapes of class ``arch`` built from ``body`` (on the meta device: no memory)."""
    try:
        import torch
        import transformers
    except ImportError:
        hint = "pip install transformers"
        raise SpecError("export-hf needs transformers, to name the tensors its class expects", hint=hint) from None
    cls = getattr(transformers, arch)
    conf = cls.config_class(**{k: v for k, v in body.items() if k not in ("model_type", "dtype")})
    with torch.device("meta"):
        model = cls(conf)
    state = model.state_dict()
    try:  # the names save_pretrained writes: transformers 5 renames some modules and reverts that on saving
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, state)
    except ImportError:  # transformers 4: the module names are the checkpoint's
        pass
    return {k: tuple(v.shape) for k, v in state.items()}


def export_hf(
    spec: Any, params: dict[str, Any], output: str | os.PathLike[str], doc: Located | None = None
) -> Exported:
    """Write ``output`` (a folder, replaced whole) for ``spec`` with parameters ``params`` (specc names)."""
    from safetensors.torch import save_file

    arch, body = choose(spec, doc)
    graph = lower(spec)
    tensors = hf_tensors(graph, arch, body, params)
    stage = folder_stage(output)
    try:
        (stage / "config.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        plain = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
        save_file(plain, str(stage / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(stage / "model.safetensors", stat.S_IMODE(os.stat(stage / "config.json").st_mode))  # as a new file
    except BaseException:
        discard_stage(stage)
        raise
    return Exported(replace_folder(stage, output, last=True), arch, len(tensors))
