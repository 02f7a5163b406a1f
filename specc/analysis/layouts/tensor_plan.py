"""The tensor-parallel plan of a model, read off its layer graph (never written per model family).

Each op that owns (or ties) a weight gets one rule:

- ``heads``: a linear whose output an attention op reads as packed heads. Its rows are ``parts`` groups of
  heads (``[q | k | v]`` for self-attention, ``[q]`` and ``[k | v]`` for cross-attention), each ``head_dim``
  rows; rank r keeps the r-th slice of *every* part, so it holds the q, k and v of its own heads (GQA: its own
  KV groups with the query heads that read them).
- ``colwise`` / ``rowwise``: a linear pair with only per-unit ops between them (activation, glu, dropout: the
  classic MLP's fc1 → fc2, SwiGLU's gate and up → down) is split by hidden units; a linear that reads an
  attention op's merged heads is row-wise.
- ``vocab_embed`` / ``vocab_head`` / ``tied_head`` / ``tied_embed``: the token embedding and the output head are
  split by vocabulary rows; a head tied to the embedding, and an embedding that shares another's table (an
  encoder-decoder's one vocabulary: T5, BART), read the owner's shard.
- ``experts``: a mixture of experts is split by hidden units inside every expert.
- ``head_norm``: a QK-norm per head on a packed projection (kept whole; each rank normalises its heads).
- ``full_norm``: a QK-norm over a whole q or k projection (``qk_norm: full``): its weight split with the
  projection's rows, the mean square all-reduced over tp (``specc.parallel.qknorm``).
- ``bias_heads``: a relative position bias table [buckets, heads] (T5) split by heads, as the attention reading it.
- ``latent_heads``: multi-head latent attention (DeepSeek-V2/V3), split by heads as Megatron-Core splits it: the
  query projection (``q`` or ``q_b``) by heads, the core's per-head up-projection ``kv_b`` by heads (rows), the
  output row-wise; the KV latent (``kv_a``, ``kv_a_norm``, ``q_a``) is replicated, so every rank's cache holds
  the whole latent and the latent's gradient is summed over the ranks.
- ``replicate``: everything else (norms, positions, routers, pooled heads).

``local_params(graph, tp)`` counts what one rank holds under this plan; ``check_tensor_parallel`` refuses a
degree that does not divide what it splits. The plan is the one source of both the run (``specc.parallel``
applies it with DTensor styles) and the sizing (``shard.param_shards`` and the profiles read it), so what the
analyzer sizes is what runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpecError
from ...ir.graph import LayerGraph, Op
from .support import TENSOR_PARALLEL_KINDS

PER_UNIT = ("activation", "glu", "dropout")  # ops that act on each hidden unit alone
# Op kinds whose place in a split model this plan knows (a new kind must be taught here before tp runs it); the
# layout search reads the same table to leave tp out where it does not run.
KNOWN = TENSOR_PARALLEL_KINDS


@dataclass(frozen=True)
class Rule:
    # heads | head_norm | full_norm | colwise | rowwise | vocab_embed | vocab_head | tied_head | experts | bias_heads
    # | latent_heads | tied_embed | replicate
    style: str
    parts: tuple[int, ...] = ()  # heads: head counts of the packed parts, in row order
    head_dim: int = 0


def tensor_plan(graph: LayerGraph) -> dict[str, Rule]:
    """Op name → rule for every op with parameters or a tied weight, plus every attention op (``heads``)."""
    plan: dict[str, Rule] = {}
    g = graph.graph
    for op in graph.ops():
        if op.kind == "attention":
            h, k, d = op.attrs.heads, op.attrs.kv_heads, op.attrs.head_dim
            plan[op.name] = Rule("heads", (h, k), d)
            packed = [(op.inputs[0], (h,)), (op.inputs[1], (k, k))] if op.attrs.cross else [(op.inputs[0], (h, k, k))]
            for src, parts in packed:
                src, norms = packed_source(graph, src)
                if _is_linear(graph, src):
                    plan[src] = Rule("heads", parts, d)
                    for n in norms:  # a norm per head, or over the whole q (or k) projection
                        plan[n] = Rule("head_norm" if graph.op(n).attrs.dim == d else "full_norm", parts, d)
            for dst in g.successors(op.name):
                if _is_linear(graph, dst):
                    plan[dst] = Rule("rowwise")
        elif op.kind == "latent_attention":
            h, d = op.attrs.heads, op.attrs.nope_head_dim + op.attrs.rope_head_dim
            plan[op.name] = Rule("latent_heads", (h,), d)
            if _is_linear(graph, op.inputs[0]):  # q [B, N, heads · (nope + rope)]: heads in row order
                plan[op.inputs[0]] = Rule("heads", (h,), d)
            for dst in g.successors(op.name):
                if _is_linear(graph, dst):
                    plan[dst] = Rule("rowwise")
        elif op.kind == "moe":
            plan[op.name] = Rule("experts")
        elif op.kind == "relative_bias":  # each rank's heads' column of the table (the heads of every layer it feeds)
            plan[op.name] = Rule("bias_heads")
    for op in graph.ops():
        if op.kind == "linear" and op.name not in plan:
            feeders = _colwise_feeders(graph, op)
            if feeders:
                plan[op.name] = Rule("rowwise")
                plan.update({f: Rule("colwise") for f in feeders})
    for op in graph.ops():
        if op.name in plan:
            continue
        if op.kind == "embedding":
            plan[op.name] = Rule("tied_embed" if op.tied_to else "vocab_embed")
        elif op.kind == "linear" and op.category == "lm_head":
            plan[op.name] = Rule("vocab_head" if op.tied_to is None else "tied_head")
        elif op.params or op.tied_to:
            plan[op.name] = Rule("replicate")
    return plan


def packed_source(graph: LayerGraph, name: str) -> tuple[str, list[str]]:
    """The projection an attention input comes from, through the QK-norms (``slice_rmsnorm``) on its way."""
    norms = []
    while name not in graph.inputs and graph.op(name).kind == "slice_rmsnorm":
        norms.append(name)
        name = graph.op(name).inputs[0]
    return name, norms


def _is_linear(graph: LayerGraph, name: str) -> bool:
    return name not in graph.inputs and graph.op(name).kind == "linear"


def _colwise_feeders(graph: LayerGraph, op: Op) -> list[str]:
    """The linears whose hidden units reach ``op`` through per-unit ops only, each read by that path alone."""
    found: list[str] = []
    stack = [op.inputs[0]]
    while stack:
        name = stack.pop()
        if name in graph.inputs:
            return []
        src = graph.op(name)
        if len(list(graph.graph.successors(name))) != 1:
            return []  # also read elsewhere (a residual): its units are not private to this pair
        if src.kind == "linear" and not src.tied_to:
            found.append(name)
        elif src.kind in PER_UNIT:
            stack.extend(src.inputs)
        else:
            return []
    return found


def check_tensor_parallel(graph: LayerGraph, tp: int) -> None:
    """Every split must divide evenly (vocabulary rows excepted: DTensor shards them unevenly)."""
    if tp == 1:
        return
    problems = []
    name = graph.meta.get("name", "the model")
    for op in graph.ops():
        if op.kind in ("rnn", "rnn_decoder"):
            raise SpecError(f"{name}: recurrent layers have no tensor-parallel plan", hint="use dp=N alone")
        if op.kind not in KNOWN:
            raise SpecError(f"{name}: {op.name} ({op.kind}) has no tensor-parallel rule", hint="use dp=N alone")
    plan = tensor_plan(graph)
    for op_name, rule in plan.items():
        op = graph.op(op_name)
        if op.kind == "attention":
            packed = [packed_source(graph, src)[0] for src in op.inputs[: 2 if op.attrs.cross else 1]]
            if any(plan.get(src, Rule("")).style != "heads" for src in packed):
                raise SpecError(
                    f"{name}: {op_name} reads heads that no linear projection packs: no tensor-parallel plan"
                )
            h, k = rule.parts
            if h % tp or k % tp:
                what = f"heads {h}" if h % tp else f"kv_heads {k}"
                problems.append(f"{op_name}: {what} is not divisible by tp={tp}")
        elif rule.style == "latent_heads" and op.attrs.heads % tp:
            problems.append(f"{op_name}: heads {op.attrs.heads} is not divisible by tp={tp}")
        elif rule.style == "colwise" and op.attrs.out_features % tp:
            problems.append(f"{op_name}: {op.attrs.out_features} hidden units are not divisible by tp={tp}")
        elif rule.style == "experts" and op.attrs.hidden % tp:
            problems.append(f"{op_name}: expert hidden {op.attrs.hidden} is not divisible by tp={tp}")
    if problems:
        raise SpecError(
            f"{name} cannot be split over tp={tp}: {problems[0]}"
            + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
            hint="choose a tp that divides the heads, KV heads and hidden units",
        )


# Which axis of each parameter a rule splits (None: kept whole).
def split_axis(rule: Rule, local: str) -> int | None:
    style = rule.style
    if style in ("heads", "full_norm", "colwise", "vocab_embed", "vocab_head", "tied_head", "tied_embed"):
        return 0
    if style == "latent_heads":  # kv_b.weight [heads · (nope + v), kv_rank]
        return 0 if local == "kv_b.weight" else None
    if style in ("rowwise", "bias_heads"):
        return 1 if local == "weight" else None
    if style == "experts":
        if local in ("w_gate", "w_up", "w_in", "b_gate", "b_up", "b_in"):
            return 1
        return 2 if local in ("w_down", "w_out") else None
    return None


def local_params(graph: LayerGraph, tp: int, rank: int = 0) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter on tensor-parallel rank ``rank`` (uneven splits: torch.chunk's sizes)."""
    plan = tensor_plan(graph) if tp > 1 else {}
    out = {}
    for op in graph.ops():
        for local, spec in op.params.items():
            rule = plan.get(op.name)
            axis = split_axis(rule, local) if rule else None
            shape = list(spec.shape)
            if axis is not None:
                shape[axis] = chunk(shape[axis], tp, rank)
            out[f"{op.name}.{local}"] = tuple(shape)
    return out


def chunk(n: int, parts: int, rank: int) -> int:
    """Rows rank ``rank`` gets when ``n`` rows are split into ``parts`` as torch.chunk does."""
    size = -(-n // parts)
    return max(0, min(size, n - rank * size))
