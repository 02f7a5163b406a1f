"""What ``torchrun -m specc train --parallel`` runs: the one rule its refusals and ``--plan`` share.

The analyzer sizes every layout ``check_layout`` accepts (``specc analyze --parallel`` refuses none of them for
lack of a runtime); the torch runtime (``specc.parallel``) runs fewer. ``runtime_gap`` names what it does not
run; ``specc.parallel.launch`` refuses with that message before any work, and the plan search leaves those
layouts out and says so, so that every layout ``--plan`` returns is one ``specc train`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.graph import LayerGraph
from .layout import Layout

# Op kinds whose place in a tensor-parallel model tensor_plan knows (a new kind is taught there first).
TENSOR_PARALLEL_KINDS = frozenset({
    "embedding", "type_embedding", "learned_pos", "sinusoidal_pos", "learned_pos_2d", "sinusoidal_pos_2d",
    "patch_embed", "cls_token", "layernorm", "rmsnorm", "slice_rmsnorm", "linear", "activation", "glu", "add",
    "scale", "softcap", "sigmoid_gate", "dropout", "pool", "attention", "latent_attention", "moe", "relative_bias",
})  # fmt: skip
PIPELINE_SCHEDULE = "1f1b"  # train's default --pipeline-schedule, the schedule the plan search prices


@dataclass(frozen=True)
class Gap:
    """A layout the runtime does not run: ``kind`` groups the plan's exclusions, ``message`` is the refusal."""

    kind: str
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class RuntimeFacts:
    """What the runtime's support depends on, read off a graph once."""

    name: str
    family: str
    one_decoder_stack: bool  # a causal LM of one stack of blocks: what the pipeline splits
    untaught: tuple[str, ...]  # op kinds without a tensor-parallel rule
    expert_bias: bool  # experts with biases (GPT-OSS)
    aux_loss: bool  # a MoE load-balancing loss summed over every block's router
    tied_across_blocks: bool  # a weight shared between blocks (or a block and the outside)


def runtime_facts(g: LayerGraph) -> RuntimeFacts:
    ops = list(g.ops())
    moes = [op for op in ops if op.kind == "moe"]
    tied = False
    for op in ops:
        owner = g.op(op.tied_to.rsplit(".", 1)[0]) if op.tied_to else None
        tied |= owner is not None and (owner.layer is not None or op.layer is not None) and owner.layer != op.layer
    return RuntimeFacts(
        str(g.meta.get("name", "the model")),
        str(g.meta.get("family", "")),
        g.meta.get("task") == "causal_lm" and all(op.stack in (None, "decoder") for op in ops),
        tuple(sorted({op.kind for op in ops if op.kind not in TENSOR_PARALLEL_KINDS})),
        any(bool(op.attrs.bias) for op in moes),
        any(float(op.attrs.aux_loss_coef or 0) for op in moes),
        tied,
    )


def runtime_gap(
    lay: Layout, facts: RuntimeFacts | None = None, micro_batches: int | None = None, schedule: str = PIPELINE_SCHEDULE
) -> Gap | None:
    """Why ``specc train --parallel`` does not run ``lay`` (None: it runs it). Without ``facts`` only what the
    degrees alone decide; ``micro_batches``: per replica and step, under pipeline schedule ``schedule``."""
    text = _text(lay)
    if lay.cp > 1:  # torch 2.13's context_parallel has no CPU path to test it by (no sharding strategy for
        # aten._scaled_dot_product_flash_attention_for_cpu), so it is not run until it can be checked
        return Gap(
            "cp > 1",
            f"--parallel cp={lay.cp}: context parallelism is sized by specc analyze but not run by specc train",
            hint="--parallel dp=N,tp=N,pp=N (cp=1)",
        )
    if lay.ep > 1 and lay.pp > 1:
        return Gap(
            "ep > 1 with pp > 1",
            f"--parallel ep={lay.ep} with pp={lay.pp}: expert parallelism is not composed with pipeline parallelism",
            hint=f"--parallel dp={lay.dp},tp={lay.tp},ep={lay.ep} (pp=1)",
        )
    if 1 < lay.ep < lay.dp and lay.tp > 1:
        return Gap(
            "1 < ep < dp with tp > 1",
            f"--parallel ep={lay.ep} < dp={lay.dp} with tp={lay.tp}: experts split over tp and sharded over dp/ep "
            "replica groups are not run (FSDP2 composes one split dimension)",
            hint=f"--parallel dp={lay.dp},tp={lay.tp},ep={lay.dp}, or tp=1",
        )
    if facts is not None:
        gap = _graph_gap(lay, facts, text)
        if gap is not None:
            return gap
    if lay.pp > 1 and schedule == "1f1b" and micro_batches is not None and micro_batches < lay.pp:
        return Gap(
            "micro-batches < pp",
            f"--parallel {text}: {micro_batches} micro-batch(es) per step; the 1f1b schedule "
            f"needs at least pp={lay.pp}",
            hint="a smaller --micro-batch, a larger --global-batch, or --pipeline-schedule gpipe",
        )
    return None


def _graph_gap(lay: Layout, f: RuntimeFacts, text: str) -> Gap | None:
    if lay.tp > 1 and f.untaught:
        return Gap(
            "tp > 1 on ops without a tensor-parallel rule",
            f"--parallel {text}: {f.name} has {', '.join(f.untaught)} ops, which have no tensor-parallel rule",
            hint="use tp=1",
        )
    if lay.tp > 1 and f.expert_bias:
        return Gap(
            "tp > 1 with expert biases",
            f"--parallel {text}: {f.name}: tensor parallelism of experts with biases is not run",
            hint="use tp=1",
        )
    if lay.pp > 1 and not f.one_decoder_stack:
        return Gap(
            "pp > 1 beyond decoder LMs",
            f"--parallel {text}: {f.name} is a {f.family} model; pipeline parallelism runs decoder LMs (one stack "
            "of blocks) so far",
            hint="use --parallel dp=N,tp=N (pp=1)",
        )
    if lay.pp > 1 and f.aux_loss:
        return Gap(
            "pp > 1 with a MoE load-balancing loss",
            f"--parallel {text}: {f.name}: the MoE load-balancing loss is summed over every block's router, which "
            "pipeline stages do not share yet",
            hint="--set mlp.router.aux_loss_coef=0 under pp, or pp=1",
        )
    if lay.pp > 1 and f.tied_across_blocks:
        return Gap(
            "pp > 1 with weights shared across blocks",
            f"--parallel {text}: {f.name} shares weights across blocks: no pipeline split for them",
            hint="pp=1",
        )
    return None


def _text(lay: Layout) -> str:
    """``dp=D,tp=T`` and the other degrees above 1, as ``specc train --parallel`` takes them."""
    keys = ("dp", "tp", *(k for k in ("pp", "ep", "cp") if getattr(lay, k) > 1))
    return ",".join(f"{k}={getattr(lay, k)}" for k in keys)
