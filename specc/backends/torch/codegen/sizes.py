"""The sizes of a model as a small config (nanoGPT style), read off the layer graph's typed op attributes.

``model_sizes(graph)`` names the model's main sizes (vocabulary, width, blocks, heads, MLP width, experts) with
their values; ``Sizes.expr`` turns a constructor's literal into an expression of them where the attribute's
role says which (``nn.Linear(768, 2304)`` → ``nn.Linear(c.d_model, 3 * c.d_model)``), so the standalone
model.py's ``build(config=Config(blocks=2, d_model=128, ...))`` makes a smaller variant of the same model.
Sizes that follow from others (``head_dim = d_model // heads``) are properties, not fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ....ir.graph import LayerGraph

# constructor attribute → the sizes (or expressions of them) it may be, in order of preference
ROLES: dict[str, tuple[str, ...]] = {
    "vocab": ("vocab_size", "target_vocab_size"),
    "positions": ("context",),
    "dim": ("d_model", "head_dim"),
    "heads": ("heads",),
    "kv_heads": ("kv_heads", "heads"),
    "head_dim": ("head_dim",),
    "rope_dims": ("head_dim",),
    "experts": ("experts",),
    "active": ("active",),
    "hidden": ("hidden",),
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
)
ROLES["in_features"] = ROLES["out_features"] = LINEAR


@dataclass
class Sizes:
    fields: dict[str, int] = field(default_factory=dict)  # Config field → the model's value
    derived: dict[str, str] = field(default_factory=dict)  # property → its expression of the fields
    blocks: dict[str, str] = field(default_factory=dict)  # container scope ("blocks") → its field

    def value(self, name: str) -> int:
        if name in self.fields:
            return self.fields[name]
        return int(eval(self.derived[name], {}, {n: self.value(n) for n in self._names(self.derived[name])}))

    def _names(self, expr: str) -> list[str]:
        return [n for n in (*self.fields, *self.derived) if n in expr.replace("(", " ").replace(")", " ").split()]

    def expr(self, key: str, value: object) -> str | None:
        """``c.<size>`` (or an expression of sizes) equal to ``value`` in the attribute's role, else None."""
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        for candidate in ROLES.get(key, ()):
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
    import re

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
    d = s.fields["d_model"]
    mlp = [op for op in ops if op.kind == "linear" and ".mlp." in op.name and not op.name.endswith("router")]
    hidden = [op.attrs.out_features for op in mlp if op.attrs.in_features == d]
    hidden += [op.attrs.hidden for op in ops if op.kind == "moe"]
    widths = [h for h in hidden if h != s.fields["d_model"]]
    if widths:
        s.fields["hidden"] = min(widths)
    moe = [op for op in ops if op.kind == "moe"]
    if moe:
        s.fields["experts"], s.fields["active"] = moe[0].attrs.experts, moe[0].attrs.active
    return s
