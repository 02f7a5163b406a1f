"""The sizes of a model as a small config (nanoGPT style), read off the layer graph's typed op attributes.

``model_sizes(graph)`` names the model's sizes (vocabulary, width, blocks, heads, MLP width, experts and their
routing groups, latent attention's ranks, a partial RoPE's share, a dense layer's or shared expert's width, a
second tower's widths) with their values; ``Sizes.expr`` turns a constructor's literal into an expression of
them where the attribute's role says which (``nn.Linear(768, 2304)`` → ``nn.Linear(c.d_model, 3 * c.d_model)``),
so the standalone model.py's ``build(config=Config(blocks=2, d_model=128, ...))`` makes a smaller variant of the
same model.
Sizes that follow from others (``head_dim = d_model // heads``) are properties, not fields.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ....ir.graph import LayerGraph

# constructor attribute → the sizes (or expressions of them) it may be, in order of preference
ROLES: dict[str, tuple[str, ...]] = {
    "vocab": ("vocab_size", "target_vocab_size"),
    "positions": ("context",),
    "dim": ("d_model", "head_dim", "q_rank", "kv_rank", "kv_rank + rope_head_dim"),
    "heads": ("heads",),
    "kv_heads": ("kv_heads", "heads"),
    "head_dim": ("head_dim",),
    "rope_dims": ("rope_dims", "head_dim", "rope_head_dim"),
    # latent attention (DeepSeek): the core's head parts and ranks, the norms of its latents
    "nope_head_dim": ("nope_head_dim",),
    "rope_head_dim": ("rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "kv_rank": ("kv_rank",),
    "width": ("kv_rank", "heads * head_dim", "kv_heads * head_dim", "d_model"),  # a norm's slice (QK-norm)
    "start": ("heads * head_dim", "d_model"),  # where the K slice starts in [q | k | v]
    "experts": ("experts",),
    "active": ("active",),
    "groups": ("groups",),  # group-limited routing (DeepSeek): groups must divide experts
    "top_groups": ("top_groups",),
    "hidden": ("hidden",),
    "in_channels": ("d_model",),  # an audio front-end's convolutions: frames in, d_model channels out
    "out_channels": ("d_model",),
}
LINEAR = (  # in_features / out_features
    "d_model",
    "hidden",
    "vocab_size",
    "target_vocab_size",
    "3 * d_model",
    "(heads + 2 * kv_heads) * head_dim",
    "3 * heads * head_dim",
    "heads * head_dim",
    "2 * kv_heads * head_dim",
    "2 * d_model",
    "2 * heads * head_dim",
    "kv_heads * head_dim",
    "2 * hidden",
    "experts",
    "dense_hidden",
    "shared_hidden",
    "q_rank",  # latent attention's projections
    "kv_rank + rope_head_dim",
    "heads * (nope_head_dim + rope_head_dim)",
    "heads * (nope_head_dim + v_head_dim)",
    "heads * v_head_dim",
)
ROLES["in_features"] = ROLES["out_features"] = LINEAR
ROLES["bias_spans"] = LINEAR  # (start, stop) feature spans of a partial bias: Whisper's q and v


@dataclass
class Sizes:
    fields: dict[str, int] = field(default_factory=dict)  # Config field → the model's value
    derived: dict[str, str] = field(default_factory=dict)  # property → its expression of the fields
    blocks: dict[str, str] = field(default_factory=dict)  # container scope ("blocks") → its field
    towers: dict[str, dict[str, str]] = field(default_factory=dict)  # a second tower ("text") → its names

    def value(self, name: str) -> int:
        if name in self.fields:
            return self.fields[name]
        return int(eval(self.derived[name], {}, {n: self.value(n) for n in self._names(self.derived[name])}))

    def _names(self, expr: str) -> list[str]:
        return [n for n in (*self.fields, *self.derived) if n in expr.replace("(", " ").replace(")", " ").split()]

    def expr(self, key: str, value: object, path: str = "") -> str | None:
        """``c.<size>`` (or an expression of sizes) equal to ``value`` in the attribute's role, else None; a
        tuple of sizes (spans) element by element, 0 as it is. Under a second tower's ``path`` (``text.``) the
        role's sizes are that tower's (``text_d_model``), never the first one's."""
        if isinstance(value, (tuple, list)) and value:
            parts = ["0" if v == 0 else self.expr(key, v, path) for v in value]
            if any(p is None for p in parts):
                return None
            return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"  # type: ignore[arg-type]
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        if key == "out_features" and path.endswith(".projection") and value == self.fields.get("projection_dim"):
            return "c.projection_dim"  # the towers' shared embedding width
        renamed = self.towers.get(path.split(".")[0], {})
        for candidate in ROLES.get(key, ()):
            if renamed:
                candidate = re.sub(r"\b\w+\b", lambda m: renamed.get(m.group(0), m.group(0)), candidate)
            names = self._names(candidate)
            if not names or len(names) != len(set(self._names(candidate))):
                continue
            try:
                got = eval(candidate, {}, {n: self.value(n) for n in names})
            except (NameError, KeyError, ZeroDivisionError):  # a size this model does not name
                continue
            if got == value:
                return _prefixed(candidate, names)
        return None

    def meta(self, meta: dict[str, Any]) -> dict[str, str]:
        """The root's META facts that follow from sizes, as expressions of ``c``: the longest sequence a learned
        position table covers, and the residual init std (init_std / sqrt(2 · layers)), so a variant generates
        up to its own table and starts like the model specc compiles at its sizes."""
        out: dict[str, str] = {}
        limit = meta.get("max_positions")
        tables = [k for k in ("text_context", "context") if self.fields.get(k) == limit]
        if limit is not None and tables:
            out["max_positions"] = f"c.{tables[0]}"
        std, residual, blocks = meta.get("init_std"), meta.get("residual_std"), list(self.blocks.values())
        layers = sum(self.fields[b] for b in blocks)
        if blocks and std and residual != std and residual == std / math.sqrt(2 * layers):
            n = f"c.{blocks[0]}" if len(blocks) == 1 else f"({' + '.join(f'c.{b}' for b in blocks)})"
            out["residual_std"] = f"{std!r} / (2 * {n}) ** 0.5"
        return out

    def source(self, name: str) -> list[str]:
        """The ``Config`` dataclass: one field a size, then the derived sizes as properties."""
        lines = [
            "@dataclass(frozen=True)",
            "class Config:",
            f'    """{name}\'s sizes: build(config=Config(...)) makes a variant."""',
            "",
        ]
        lines += [f"    {k}: int = {v}" for k, v in self.fields.items()]
        for k, e in self.derived.items():
            lines += [
                "",
                "    @property",
                f"    def {k}(self) -> int:",
                f"        return {_prefixed(e, self._names(e), 'self')}",
            ]
        return lines


def _prefixed(expr: str, names: list[str], owner: str = "c") -> str:
    return re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", rf"{owner}.\1", expr)


def model_sizes(graph: LayerGraph) -> Sizes | None:
    """The sizes of a model with attention blocks; None for the others (recurrent models keep their literals)."""
    ops = list(graph.ops())
    attention = [
        op for op in ops if op.kind in ("attention", "latent_attention") and not getattr(op.attrs, "cross", False)
    ]
    if not attention:
        return None
    s = Sizes()
    meta = graph.meta
    for key in ("vocab_size", "target_vocab_size"):
        if isinstance(meta.get(key), int) and (key == "vocab_size" or meta[key] != meta.get("vocab_size")):
            s.fields[key] = meta[key]
    learned = [op for op in ops if op.kind == "learned_pos"]
    if learned:
        s.fields["context"] = learned[0].attrs.positions
    embed = [op for op in ops if op.kind in ("embedding", "patch_embed")]
    if not embed:
        return None
    s.fields["d_model"] = embed[0].attrs.dim
    containers: dict[str, int] = {}
    for op in ops:
        parts = op.name.split(".")
        for i, p in enumerate(parts[:-1]):
            if p == "blocks" and parts[i + 1].isdigit():
                scope = ".".join(parts[: i + 1])
                containers[scope] = max(containers.get(scope, 0), int(parts[i + 1]) + 1)
    for scope, n in containers.items():
        name = "blocks" if scope == "blocks" else f"{scope.split('.')[0]}_blocks"
        s.fields[name], s.blocks[scope] = n, name
    a = attention[0].attrs
    s.fields["heads"] = a.heads
    if a.kind == "attention":
        if a.kv_heads != a.heads:  # else kv_heads reads c.heads
            s.fields["kv_heads"] = a.kv_heads
        if a.head_dim * a.heads == s.fields["d_model"]:
            s.derived["head_dim"] = "d_model // heads"
        else:
            s.fields["head_dim"] = a.head_dim
        rope = a.rope_dims
        if rope and rope != a.head_dim and a.head_dim % rope == 0:  # partial RoPE (Pythia's quarter)
            s.derived["rope_dims"] = f"head_dim // {a.head_dim // rope}"
    else:  # latent attention: its ranks and head parts
        q_a = [op for op in ops if op.kind == "linear" and op.name.endswith(".attn.q_a")]
        if q_a:
            s.fields["q_rank"] = q_a[0].attrs.out_features
        for key in ("kv_rank", "nope_head_dim", "rope_head_dim", "v_head_dim"):
            s.fields[key] = getattr(a, key)
    d = s.fields["d_model"]
    mlp = [op for op in ops if op.kind == "linear" and ".mlp." in op.name and not op.name.endswith("router")]
    moe = [op for op in ops if op.kind == "moe"]
    widths = [op.attrs.out_features for op in mlp if op.attrs.in_features == d and op.attrs.out_features != d]
    if moe:  # the experts' width, even where it equals d_model (GPT-OSS): their constructor reads it
        s.fields["hidden"] = min(op.attrs.hidden for op in moe)
    elif widths:
        s.fields["hidden"] = min(widths)
    for role, mine in (("dense_hidden", lambda n: ".shared." not in n), ("shared_hidden", lambda n: ".shared." in n)):
        other = {op.attrs.out_features for op in mlp if op.attrs.in_features == d and mine(op.name)}
        other -= {s.fields.get("hidden"), d}
        if len(other) == 1:  # an MoE model's dense layers (DeepSeek's first three), its shared experts
            s.fields[role] = other.pop()
    if meta.get("task") == "image_text":
        _second_tower(s, ops, attention)
    if moe:
        s.fields["experts"], s.fields["active"] = moe[0].attrs.experts, moe[0].attrs.active
        if moe[0].attrs.groups > 1:
            s.fields["groups"], s.fields["top_groups"] = moe[0].attrs.groups, moe[0].attrs.top_groups
    return s


def _second_tower(s: Sizes, ops: list, attention: list) -> None:
    """A dual encoder's second tower (CLIP's text): a field of its own for each size it does not share with the
    first (``text_d_model``, ``text_heads``, ``text_hidden``, ``text_context``), so neither tower's literals
    read as the other's sizes by coincidence."""
    towers = list(dict.fromkeys(op.name.split(".")[0] for op in attention if "." in op.name))
    if len(towers) < 2:
        return
    p = towers[1]
    mine = [op for op in ops if op.name.startswith(p + ".")]
    embed = [op for op in mine if op.kind in ("embedding", "patch_embed")]
    a = next(op for op in attention if op.name.startswith(p + ".")).attrs
    if not embed or a.kind != "attention":
        return
    d = embed[0].attrs.dim
    hidden = [op.attrs.out_features for op in mine if op.kind == "linear" and ".mlp." in op.name]
    hidden = [h for h in hidden if h != d]
    own = {"d_model": d, "heads": a.heads, "hidden": min(hidden) if hidden else None}
    learned = [op for op in mine if op.kind == "learned_pos"]
    own["context"] = learned[0].attrs.positions if learned else None
    if a.head_dim * a.heads != d or a.kv_heads != a.heads:
        return  # a tower of another attention shape: its literals stay
    names: dict[str, str] = {}  # a size the towers share keeps one name (classes both use stay one class)
    for k, v in own.items():
        if v is not None and v != s.fields.get(k):
            s.fields[f"{p}_{k}"], names[k] = v, f"{p}_{k}"
    if not names:
        return
    if "heads" in names:
        names["kv_heads"] = names["heads"]
    if "d_model" in names or "heads" in names:
        names["head_dim"] = f"{p}_head_dim"
        s.derived[f"{p}_head_dim"] = f"{names.get('d_model', 'd_model')} // {names.get('heads', 'heads')}"
    s.towers[p] = names
    projections = [op.attrs.out_features for op in ops if op.kind == "linear" and op.name.endswith(".projection")]
    if len(projections) > 1 and len(set(projections)) == 1:  # both towers project into one embedding width
        s.fields["projection_dim"] = projections[0]
