"""Cross-attention maps of a trained seq2seq model: which input token each output token reads.

The model decodes the input greedily, then reruns teacher-forced on its own output while the backend records
attention probabilities: ``rnn_decoder`` ops give the alignment a_{t,i} [B, N_dec, N]; Transformer
cross-attention ops give [B, H, N_dec, N] per layer. Rows are output tokens (ending with ``<eos>``), columns
input tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecError
from ..ir.graph import LayerGraph, Op
from .decode import greedy_seq2seq
from .vocab import BOS, EOS, PAD, Vocab


@dataclass(frozen=True)
class AttentionMap:
    weights: torch.Tensor  # [N_out, N_in], rows sum to 1
    rows: list[str]  # output token labels
    cols: list[str]  # input token labels
    title: str


def cross_attention_ops(graph: LayerGraph) -> list[Op]:
    """The ops whose recorded probabilities are decoder-to-encoder attention, in layer order."""
    ops = [
        op
        for op in graph.ops()
        if (op.kind == "attention" and op.attrs.cross) or (op.kind == "rnn_decoder" and op.attrs.attention != "none")
    ]
    if not ops:
        fixed = any(op.kind == "rnn_decoder" for op in graph.ops())
        why = "a fixed-context RNN decoder (attention: none)" if fixed else f"a {graph.meta.get('family')} model"
        raise SpecError(f"{graph.meta.get('name')} has no cross-attention to map: it is {why}")
    return ops


def parse_input(text: str, vocab: Vocab | None, vocab_size: int) -> list[int]:
    """Task symbols when the checkpoint carries its vocabulary, else raw token ids."""
    if vocab is not None:
        return vocab.encode_words(text)
    ids = []
    for word in text.split():
        if not word.lstrip("-").isdigit() or not 0 <= int(word) < vocab_size:
            raise SpecError(f"input id {word!r} is outside the vocabulary (0 … {vocab_size - 1})")
        ids.append(int(word))
    if not ids:
        raise SpecError("--input is empty", hint='give whitespace-separated tokens, e.g. --input "3 1 4 1 5"')
    return ids


@torch.no_grad()
def record(
    model: torch.nn.Module, graph: LayerGraph, src: list[int], max_new: int
) -> tuple[list[int], dict[str, torch.Tensor]]:
    """(output ids ending with <eos> if produced, recorded maps by scope name, batch dim dropped)."""
    device = next(model.parameters()).device
    ids = torch.tensor([src], device=device)
    mask = torch.ones_like(ids)
    out = greedy_seq2seq(model, ids, mask, max_new)[0].tolist()
    out = out[: out.index(EOS) + 1] if EOS in out else [t for t in out if t != PAD]
    dec_in = torch.tensor([[BOS, *out[:-1]]], device=device)
    with model.attention_maps() as maps:
        model(ids, dec_in, attention_mask=mask)
    names = {op.name for op in cross_attention_ops(graph)}
    return out, {k: v[0].float().cpu() for k, v in maps.items() if k in names}


def select(
    graph: LayerGraph, maps: dict[str, torch.Tensor], layer: int | None, head: int | None, average: bool
) -> tuple[torch.Tensor, str]:
    """One [N_out, N_in] map: a layer and head, a layer's head average, or the average over everything."""
    ops = cross_attention_ops(graph)
    stacked = [maps[op.name] if maps[op.name].dim() == 3 else maps[op.name][None] for op in ops]  # [H, out, in]
    if average:
        if layer is not None or head is not None:
            raise SpecError("--average cannot be combined with --layer / --head")
        return torch.cat(stacked).mean(0), f"mean of {len(ops)} layer(s) × {stacked[0].shape[0]} head(s)"
    li = len(ops) - 1 if layer is None else layer
    if not -len(ops) <= li < len(ops):
        raise SpecError(f"--layer {layer} is out of range: the model has {len(ops)} cross-attention layer(s)")
    m, op = stacked[li], ops[li]
    if head is None:
        return m.mean(0), f"{op.name}" + (f", mean of {m.shape[0]} heads" if m.shape[0] > 1 else "")
    if not -m.shape[0] <= head < m.shape[0]:
        raise SpecError(f"--head {head} is out of range: {op.name} has {m.shape[0]} head(s)")
    return m[head], f"{op.name}, head {head % m.shape[0]}"


def attention_map(
    model: torch.nn.Module,
    graph: LayerGraph,
    vocab: Vocab | None,
    text: str,
    max_new: int,
    layer: int | None = None,
    head: int | None = None,
    average: bool = False,
) -> AttentionMap:
    src = parse_input(text, vocab, graph.meta["vocab_size"])
    out, maps = record(model, graph, src, max_new)
    if not out:
        raise SpecError("the model produced no output tokens for this input")
    weights, title = select(graph, maps, layer, head, average)

    def label(t: int) -> str:
        return vocab.label(t) if vocab is not None else str(t)

    return AttentionMap(weights, [label(t) for t in out], [label(t) for t in src], title)


def mirror_fraction(weights: torch.Tensor, n_rows: int, tolerance: int = 1) -> float:
    """Share of the first ``n_rows`` output rows whose argmax input is the mirrored position (± tolerance)."""
    n_in = weights.shape[1]
    rows = torch.arange(n_rows)
    hit = (weights[:n_rows].argmax(1) - (n_in - 1 - rows)).abs() <= tolerance
    return float(hit.float().mean())
