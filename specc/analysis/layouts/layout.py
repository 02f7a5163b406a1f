"""A parallel layout (``tp=8,pp=16,dp=12``) and the checks that make it possible for one graph.

Degrees: ``tp`` tensor, ``pp`` pipeline, ``dp`` data, ``cp`` context (sequence split across devices, ring
attention) and ``ep`` expert parallel. Devices = tp × pp × cp × dp; experts are distributed over ``ep`` ranks
carved out of the data-parallel ones (Megatron-LM, DeepSpeed-MoE), so ``ep`` divides ``dp``. Ranks are
ordered tp (innermost, fastest link), cp, dp, pp (outermost), as Megatron-LM orders them.

A layout the graph cannot take is a ``LayoutError``: a ``SpecError`` that also names the spec key it conflicts
with (``("attention", "heads")``), so the command line can point at that key in the spec file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...errors import SpecError
from ...ir.graph import LayerGraph
from .stages import block_count

DEGREES = ("tp", "pp", "dp", "ep", "cp")
MAX_DEGREE = 1 << 20
ZERO_STAGES = (0, 1, 2, 3)
RECOMPUTE = ("none", "selective", "full", "op")
# fused: norm, GLU and rotary kernels that keep what Korthikanti et al. count (Megatron-Core, the published runs);
# torch: torch's eager ops as specc's torch layers call them (GLU keeps act(gate), rotary attention the packed
# q|k|v); torch-cpu: the same on the CPU, where rms_norm has no fused kernel (keeps fp32 x and x·rstd)
KERNELS = ("fused", "torch", "torch-cpu")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")  # torch.distributed.pipelining's names
_DIGITS = re.compile(r"[0-9]+")


class LayoutError(SpecError):
    """An impossible layout; ``key`` is the spec key it conflicts with (None: a flag alone is wrong)."""

    def __init__(self, message: str, *, key: tuple[str, ...] | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.key = key
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def text(self) -> str:
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}"]
        parts += [f"{k}={getattr(self, k)}" for k in ("ep", "cp") if getattr(self, k) != 1]
        return ",".join(parts)

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in DEGREES} | {"devices": self.devices}


@dataclass(frozen=True)
class Training:
    """How a training step runs: ZeRO stage, sequence parallelism, recomputation, batch split."""

    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    micro_batch: int = 1  # sequences per micro-batch
    global_batch: int = 1  # sequences per step, all replicas (micro-batches per replica: G / (dp × micro-batch))
    schedule: str = "1f1b"  # pipeline schedule (SCHEDULES)
    virtual_stages: int = 1  # model chunks per device (interleaved-1f1b)
    attention: str | None = None  # flash | math; None: the device profile's default
    async_tp: bool = False  # tensor-parallel collectives overlapped with the GEMMs next to them
    dp_overlap: bool = True  # gradient sync overlapped with backward (torch DDP, FSDP); False: after it
    kernels: str = "fused"  # what keeps activations (KERNELS): fused (Megatron-Core) | torch | torch-cpu (eager)
    loss_parallel: bool = True  # cross-entropy on vocabulary shards; False: logits gathered whole on each tp rank


def parse_layout(text: str) -> Layout:
    """``tp=2,pp=4,dp=8[,ep=E][,cp=C]`` → Layout: any subset of the degrees, each a positive integer; a missing
    degree is 1 (``tp=2`` is ``tp=2,pp=1,dp=1``), as ``specc train --parallel`` reads them."""
    seen: dict[str, int] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        key = key.strip().lower()
        if not eq or key not in DEGREES:
            raise LayoutError(
                f"--parallel: cannot read '{item.strip()}'", hint="write e.g. --parallel tp=2,pp=4,dp=8 (also ep=, cp=)"
            )
        if key in seen:
            raise LayoutError(f"--parallel: {key} is given twice")
        if not _DIGITS.fullmatch(value.strip()):  # ASCII only: int() would also take '２' or '٢'
            raise LayoutError(f"--parallel: {key}={value.strip()} is not a whole number", hint="use ASCII digits 0-9")
        n = int(value.strip()) if len(value.strip()) <= 9 else MAX_DEGREE + 1
        if not 1 <= n <= MAX_DEGREE:
            raise LayoutError(f"--parallel: {key}={n} is out of range (allowed 1..{MAX_DEGREE})")
        seen[key] = n
    return Layout(**seen)


@dataclass(frozen=True)
class GraphFacts:
    """What the layout checks read off a graph, gathered once."""

    name: str
    family: str
    heads: tuple[int, int] | None  # (heads, kv_heads) of its attention, every layer alike
    recurrent: bool
    hidden_units: tuple[int, ...]  # MLP / expert hidden widths
    blocks: int
    experts: int | None


def graph_facts(g: LayerGraph) -> GraphFacts:
    heads = next(((int(o.attrs.heads), int(o.attrs.kv_heads)) for o in g.ops() if o.kind == "attention"), None)
    latent = next((int(o.attrs.heads) for o in g.ops() if o.kind == "latent_attention"), None)
    heads = heads or (None if latent is None else (latent, latent))  # MLA: every head its own K/V
    return GraphFacts(
        str(g.meta.get("name", "this spec")),
        str(g.meta.get("family", "")),
        heads,
        any(op.kind in ("rnn", "rnn_decoder") for op in g.ops()),
        tuple(sorted({w for op in g.ops() if (w := _hidden_units(op)) is not None})),
        block_count(g),
        next((int(op.attrs.experts) for op in g.ops() if op.kind == "moe"), None),
    )


def check_layout(g: LayerGraph | GraphFacts, lay: Layout, seq: int) -> None:
    """Refuse a layout the graph cannot be split into, naming the spec key in the way."""
    f = g if isinstance(g, GraphFacts) else graph_facts(g)
    heads = f.heads
    if lay.tp > 1:
        if heads is None or f.recurrent:
            raise LayoutError(
                f"tp={lay.tp}: tensor parallelism shards attention heads and MLP units; "
                f"{f.name} has no attention heads to shard",
                key=("kind",),
                hint="use tp=1",
            )
        h, kv = heads
        if h % lay.tp:
            raise LayoutError(f"attention heads {h} are not divisible by tp={lay.tp}", key=("attention", "heads"))
        if kv % lay.tp:
            raise LayoutError(
                f"KV heads {kv} are not divisible by tp={lay.tp} (GQA shards whole KV groups)",
                key=("attention", "kv_heads"),
                hint=f"tp must divide {kv}",
            )
        for width in f.hidden_units:
            if width % lay.tp:
                raise LayoutError(f"MLP hidden units {width} are not divisible by tp={lay.tp}", key=("mlp", "hidden"))
    layers = f.blocks
    if lay.pp > 1 and layers < lay.pp:  # uneven splits are fine (stages.split); an empty stage is not
        key = ("blocks", "encoder") if f.family == "encoder_decoder" else ("blocks",)
        raise LayoutError(f"{layers} blocks cannot fill pp={lay.pp} pipeline stages (one block each at least)", key=key)
    experts = f.experts
    if lay.ep > 1:
        if experts is None:
            raise LayoutError(f"ep={lay.ep}: expert parallelism needs a MoE MLP", key=("mlp", "type"), hint="use ep=1")
        if experts % lay.ep:
            raise LayoutError(f"{experts} experts are not divisible by ep={lay.ep}", key=("mlp", "experts"))
        if lay.dp % lay.ep:
            raise LayoutError(
                f"--parallel: ep={lay.ep} does not divide dp={lay.dp}",
                hint="expert-parallel ranks are carved out of the data-parallel ones: ep must divide dp",
            )
    if lay.cp > 1:
        if heads is None:
            raise LayoutError(f"cp={lay.cp}: context parallelism splits attention; this spec has none", key=("kind",))
        if seq % lay.cp:
            raise LayoutError(f"--parallel: sequence length {seq} is not divisible by cp={lay.cp}")


def check_training(lay: Layout, t: Training, training: bool) -> int:
    """Checks of the step settings; returns the number of micro-batches per step (per replica)."""
    if t.zero not in ZERO_STAGES:
        raise LayoutError(f"--zero {t.zero} is not a ZeRO stage (allowed 0, 1, 2, 3)")
    if t.recompute not in RECOMPUTE:
        raise LayoutError(f"--recompute {t.recompute} is unknown", hint=f"use one of {', '.join(RECOMPUTE)}")
    if not training and t.zero:
        raise LayoutError(f"--zero {t.zero} shards training states: add --training")
    if t.kernels not in KERNELS:
        raise LayoutError(f"kernels {t.kernels} is unknown", hint=f"use one of {', '.join(KERNELS)}")
    if not training and t.recompute != "none":
        raise LayoutError(f"--recompute {t.recompute} applies to training: add --training")
    if t.schedule not in SCHEDULES:
        raise LayoutError(f"--pipeline-schedule {t.schedule} is unknown", hint=f"use one of {', '.join(SCHEDULES)}")
    if t.virtual_stages < 1:
        raise LayoutError("--virtual-stages must be positive")
    if t.virtual_stages > 1 and t.schedule != "interleaved-1f1b":
        raise LayoutError(f"--virtual-stages {t.virtual_stages} needs --pipeline-schedule interleaved-1f1b")
    if t.attention is not None and t.attention not in ("flash", "math"):
        raise LayoutError(f"--attention-impl {t.attention} is unknown", hint="use flash or math")
    if t.sequence_parallel and lay.tp == 1:
        raise LayoutError("--sequence-parallel splits along the tensor-parallel group: it needs tp > 1")
    if t.micro_batch < 1 or t.global_batch < 1:
        raise LayoutError("--micro-batch and --global-batch must be positive")
    per_step = lay.dp * t.micro_batch
    if t.global_batch % per_step:
        raise LayoutError(
            f"--global-batch {t.global_batch} is not divisible by dp × micro-batch = {lay.dp} × {t.micro_batch}",
            hint=f"use a multiple of {per_step}",
        )
    return t.global_batch // per_step


def _hidden_units(op: Any) -> int | None:
    if op.kind == "moe":
        return int(op.attrs.hidden)
    if op.kind in ("glu", "activation") and op.layer is not None:
        return int(op.shape[-1])
    return None
