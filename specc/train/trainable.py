"""The model side of training: which families train how, building through the torch backend, length limits.

Everything here reads the lowered graph (``graph.meta['task']``, ``learned_pos`` ops), not spec fields.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import SpecError
from ..ir.graph import LayerGraph

SEQ2SEQ, LM = "seq2seq", "causal_lm"


def objective(graph: LayerGraph) -> str:
    """``seq2seq`` (RNN and Transformer encoder-decoder) or ``causal_lm`` (decoder); anything else is refused."""
    task = graph.meta.get("task")
    if task in (SEQ2SEQ, LM):
        return task
    raise SpecError(
        f"specc train handles seq2seq models (rnn_seq2seq, encoder_decoder) and decoder LMs; "
        f"{graph.meta.get('name')} is a {graph.meta.get('family')} model"
    )


def check_task(graph: LayerGraph, task: str) -> None:
    kind = objective(graph)
    if task == "lm" and kind != LM:
        raise SpecError(
            f"--task lm trains decoder LMs; {graph.meta.get('name')} is a {graph.meta.get('family')} model",
            hint="use a seq2seq task: reverse | copy | sort | add",
        )
    if task != "lm" and kind == LM:
        raise SpecError(
            f"task {task} needs a seq2seq model (rnn_seq2seq or encoder_decoder); "
            f"{graph.meta.get('name')} is a decoder LM",
            hint="train it with --task lm --text FILE",
        )


def position_limits(graph: LayerGraph) -> dict[str | None, int]:
    """Longest sequence each stack can read: the size of its learned position table, if it has one."""
    return {op.stack: op.attrs.positions for op in graph.ops() if op.kind == "learned_pos"}


def check_lengths(graph: LayerGraph, longest: dict[str | None, int]) -> None:
    """``longest``: stack → longest sequence training will feed it (None = the single stack of a decoder)."""
    limits = position_limits(graph)
    for stack, n in longest.items():
        limit = limits.get(stack)
        if limit is not None and n > limit:
            where = f"the {stack}" if stack else "the model"
            raise SpecError(
                f"sequences of {n} tokens do not fit {where}'s {limit} learned positions",
                hint=f"use a smaller --max-len or --set context={n}",
            )


def build(spec: Any, device: torch.device, weights: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    from ..backends.torch.build import build_torch

    return build_torch(spec, weights=weights, device=device, dtype=torch.float32, accelerate=False)  # plain modules


def seq2seq_logits(model: torch.nn.Module, src: torch.Tensor, mask: torch.Tensor, dec_in: torch.Tensor) -> torch.Tensor:
    return model(src, dec_in, attention_mask=mask)


def lm_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids)
