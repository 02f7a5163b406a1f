"""``analyze``: every cost of one spec at one size, as a ``Report`` with ``to_dict()``.

Pure functions of the lowered graph: no weights are allocated, and the spec is read only through the IR.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph, dims
from ..ir.lower import lower
from ..ir.ops import ATTENTION_KINDS
from . import constants as C
from .costs import Ctx, numel
from .crossover import QUADRATIC, solve
from .devices import Device, load_device
from .kind_costs import KindCosts, per_kind
from .model_memory import memory_items
from .op_costs import GENERATION, OpCost, Totals, category, decode_ops, evaluate
from .params import ParamCounts, count_params
from .report_json import report_dict
from .roofline import Phase, phase
from .shapes import MatmulShape, attention_shapes

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Settings:
    batch: int
    seq: int
    dec_seq: int | None
    dtype: str
    training: bool
    recompute: str
    kv_len: int | None  # keys seen by the decode step analysed (None: the model does not generate)

    @property
    def bytes(self) -> int:
        return C.DTYPE_BYTES[self.dtype]

    def env(self) -> dict[str, int]:
        return {"B": self.batch, "N": self.seq, "N_dec": self.dec_seq or self.seq}


@dataclass
class Report:
    name: str
    family: str
    task: str
    settings: Settings
    params: ParamCounts
    forward: Totals
    useful: Totals
    per_layer: dict[str, tuple[int, Totals]]  # stack → (layers, totals of one layer)
    shapes: list[MatmulShape]
    memory: dict[str, int]
    decode: Totals | None
    crossover: tuple[float | None, float | None]
    recurrent: dict[str, int] | None = None
    device: Device | None = None
    prefill: Phase | None = None
    decode_phase: Phase | None = None
    notes: list[str] = field(default_factory=list)
    per_kind: dict[str, KindCosts] | None = None  # layer kind → its layers' costs (specs with layer_kinds)

    @property
    def training_flops(self) -> int:
        f = C.TRAINING_MULTIPLIER[self.settings.recompute] * self.forward.total
        if self.settings.recompute == "selective":
            f += self.forward.sum_of(QUADRATIC)  # the attention core runs again in the backward pass
        return f

    def to_dict(self) -> dict[str, Any]:
        return report_dict(self)


def analyze(
    spec: Any,
    batch: int = 1,
    seq: int | None = None,
    dtype: str | None = None,
    *,
    dec_seq: int | None = None,
    training: bool = False,
    recompute: str = "none",
    kv_len: int | None = None,
    device: str | Device | None = None,
    crossover: bool = True,
) -> Report:
    """Parameters, FLOPs and memory of a spec (SpecModel, preset name, YAML path, dict or LayerGraph)."""
    g = spec if isinstance(spec, LayerGraph) else lower(_load(spec))
    s = _settings(g, batch, seq, dtype, dec_seq, training, recompute, kv_len)
    env, ctx = s.env(), Ctx(bytes=s.bytes)
    costs = evaluate(g, env, ctx)
    dec = decode_ops(g)
    params = count_params(g)
    forward, useful = Totals.of(costs), Totals.of(costs, useful=True)
    dcosts = _decode_costs(g, s, dec)
    rep = Report(
        name=g.meta.get("name", "?"),
        family=g.meta.get("family", "?"),
        task=g.meta.get("task", "?"),
        settings=s,
        params=params,
        forward=forward,
        useful=useful,
        per_layer=_per_layer(costs),
        shapes=attention_shapes(g, costs, env),
        memory=memory_items(g, costs, env, params.stored, s.bytes, dec, training, recompute),
        decode=Totals.of(dcosts) if dcosts is not None else None,
        crossover=_crossover(g, s) if crossover else (None, None),
        notes=_notes(g, s),
        per_kind=per_kind(g, costs, dec),
    )
    rep.recurrent = _recurrent(costs, rep.decode, env)
    if device is not None:
        _roofline(rep, g, costs, dcosts, device if isinstance(device, Device) else load_device(device))
    return rep


def _load(spec: Any) -> Any:
    if isinstance(spec, (str, os.PathLike, Mapping)):
        from ..spec.loader import load_spec

        return load_spec(spec)
    return spec


def _settings(
    g: LayerGraph,
    batch: int,
    seq: int | None,
    dtype: str | None,
    dec_seq: int | None,
    training: bool,
    recompute: str,
    kv_len: int | None,
) -> Settings:
    dtype = dtype or g.meta.get("dtype") or "fp32"
    if dtype not in C.DTYPE_BYTES:
        raise SpecError(f"unknown dtype '{dtype}'", hint=f"use one of {', '.join(C.DTYPE_BYTES)}")
    if recompute not in RECOMPUTE:
        raise SpecError(f"unknown recompute '{recompute}'", hint=f"use one of {', '.join(RECOMPUTE)}")
    seq = seq if seq is not None else int(g.meta.get("tokens") or g.meta.get("context") or 1)
    symbols = {str(d) for i in g.inputs.values() for d in i.shape}
    if "N_dec" not in symbols:
        dec_seq = None
    elif dec_seq is None:  # Whisper: its decoder's own length (the 1500 audio frames are the encoder's)
        dec_seq = int(g.meta.get("dec_tokens") or seq)
    for name, v in (("batch", batch), ("seq", seq), ("dec_seq", dec_seq), ("kv_len", kv_len)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise SpecError(f"{name} must be a positive integer, got {v!r}")
    gen = GENERATION.get(g.meta.get("task", ""))
    if gen is None:
        kv_len = None
    elif kv_len is None:
        kv_len = dec_seq if gen[1] == "N_dec" else seq
    return Settings(batch, seq, dec_seq, dtype, training, recompute, kv_len)


def _decode_costs(g: LayerGraph, s: Settings, dec: set[str] | None) -> list[OpCost] | None:
    """One generated token: the decode ops with a one-token query and ``kv_len`` keys."""
    gen = GENERATION.get(g.meta.get("task", ""))
    if dec is None or gen is None or s.kv_len is None:
        return None
    env = {**s.env(), gen[1]: 1}
    return evaluate(g, env, Ctx(bytes=s.bytes, kv_len=s.kv_len), only=dec)


def _per_layer(costs: list[OpCost]) -> dict[str, tuple[int, Totals]]:
    """Each stack's layer count and the totals of its first layer (all layers of a stack are alike, but for
    layer kinds: see ``per_kind``)."""
    layers: dict[str, set[int]] = {}
    for c in costs:
        if c.op.layer is not None:
            layers.setdefault(c.op.stack or "blocks", set()).add(c.op.layer)
    out = {}
    for stack, ids in layers.items():
        first = min(ids)
        one = [c for c in costs if c.op.layer == first and (c.op.stack or "blocks") == stack]
        out[stack] = (len(ids), Totals.of(one))
    return out


def _crossover(g: LayerGraph, s: Settings) -> tuple[float | None, float | None]:
    symbols = {str(d) for i in g.inputs.values() for d in i.shape}
    if "N" not in symbols or not any(op.kind in ATTENTION_KINDS for op in g.ops()):
        return None, None

    def at(n: int) -> tuple[Totals, Totals]:
        env = {"B": s.batch, "N": n, "N_dec": n}
        costs = evaluate(g, env, Ctx(bytes=s.bytes))
        return Totals.of(costs), Totals.of(costs, useful=True)

    return solve(at)


def _recurrent(costs: list[OpCost], decode: Totals | None, env: dict[str, int]) -> dict[str, int] | None:
    rnn = [c for c in costs if c.op.kind in ("rnn", "rnn_decoder")]
    if not rnn:
        return None
    out = {
        "encoder_flops": sum(c.total for c in rnn if c.op.kind == "rnn"),
        "decoder_flops": sum(c.total for c in rnn if c.op.kind == "rnn_decoder"),
    }
    if decode is not None:
        out["decoder_step_flops"] = decode.sum_of(("rnn",))
        out["attention_per_step_flops"] = decode.sum_of(("rnn_attention", "softmax"))
    return out


def _notes(g: LayerGraph, s: Settings) -> list[str]:
    notes = []
    env = s.env()
    for op in g.ops():
        if op.kind == "learned_pos" and dims(op.shape, env)[1] > op.attrs.positions:
            notes.append(
                f"{op.name}: {dims(op.shape, env)[1]} tokens exceed the learned position table "
                f"({op.attrs.positions}); costs are computed as if it were extended"
            )
    return notes


def _roofline(rep: Report, g: LayerGraph, costs: list[OpCost], dcosts: list[OpCost] | None, dev: Device) -> None:
    s = rep.settings
    env = s.env()
    outputs = sum(numel(dims(g.shape_of(o), env)) for o in g.outputs.values()) * s.bytes
    inputs = sum(
        numel(dims(i.shape, env)) * (8 if i.dtype == "int64" else s.bytes) for i in g.inputs.values() if not i.optional
    )
    tokens = s.batch * (s.seq + (s.dec_seq or 0))
    rep.device = dev
    rep.prefill = phase(costs, dev, s.dtype, s.bytes, inputs + outputs + rep.memory["kv_cache"], tokens, category)
    if dcosts is not None:
        gen = GENERATION[g.meta["task"]]
        denv = {**env, gen[1]: 1}
        cache = sum(c.mem.kv_cache for c in dcosts)
        logits = sum(numel(dims(g.shape_of(o), denv)) for o in g.outputs.values()) * s.bytes
        rep.decode_phase = phase(dcosts, dev, s.dtype, s.bytes, cache + logits, s.batch, category)
