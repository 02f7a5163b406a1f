"""Token-by-token generation over a model's ``start`` / ``step`` (KV cache) or full recomputation."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .state import KVCache


class GenerationError(ValueError):
    """A generation request the model cannot serve (e.g. longer than its learned positions)."""


def pick_tokens(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, generator: torch.Generator | None
) -> Tensor:
    """Next token per row of logits [B, V]: greedy at temperature 0, else sampled after top-k / top-p."""
    if not temperature:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


@torch.no_grad()  # not inference_mode: the returned ids may feed a model that trains
def generate(
    model: Any,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    attention_mask: Tensor | None = None,
    decoder_input_ids: Tensor | None = None,
    decoder_start_token_id: int = 1,  # specc's <bos> (specc train: <pad> 0, <bos> 1, <eos> 2)
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    eos_token_id: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Extend a sequence token by token; returns it with the new tokens appended.

    Decoders extend ``input_ids``; a left-padded batch passes ``attention_mask`` and each row is generated as
    if alone (positions follow the mask). Encoder-decoders read ``input_ids`` as the source and extend
    ``decoder_input_ids`` (default: one ``decoder_start_token_id`` per row). With ``use_cache`` the prompt runs
    once and each step feeds one token against preallocated K/V caches; without it every step recomputes the
    whole sequence (the reference the cache is tested against). Sampling is seeded by ``seed``; the model runs
    in eval mode (no dropout) throughout.
    """
    seq2seq = model.step_input == "decoder_input_ids"
    if seq2seq and decoder_input_ids is None:
        decoder_input_ids = torch.full((input_ids.shape[0], 1), decoder_start_token_id, device=input_ids.device)
    prompt = decoder_input_ids if seq2seq else input_ids
    assert prompt is not None
    b, n0 = prompt.shape
    total = n0 + max_new_tokens
    limit = model.max_positions()
    if limit is not None and total > limit:
        raise GenerationError(f"{n0} prompt + {max_new_tokens} new tokens exceed the {limit} learned positions")
    tokens = prompt.new_empty(b, total)  # preallocated: each step writes one column
    tokens[:, :n0] = prompt
    mask = None
    if attention_mask is not None and not seq2seq:  # a decoder's mask grows with the sequence
        mask = attention_mask.new_ones(b, total)
        mask[:, :n0] = attention_mask
    grows = model.growing_inputs()

    def logits_up_to(n: int, cache: KVCache | None) -> Tensor:
        """Logits of position n-1: one cached step (the whole prompt first), or a full recomputation."""
        grown = {name: mask[:, :n] if mask is not None else None for name in grows}
        if cache is not None:
            return model.step(cache, tokens[:, cache.length : n], **grown)
        if seq2seq:
            inputs = {"input_ids": input_ids, "decoder_input_ids": tokens[:, :n], "attention_mask": attention_mask}
        else:
            inputs = {"input_ids": tokens[:, :n], "attention_mask": mask[:, :n] if mask is not None else None}
        return model.run(inputs)["logits"]

    gen = torch.Generator(prompt.device).manual_seed(seed) if seed is not None else None
    done = torch.zeros(b, dtype=torch.bool, device=prompt.device) if eos_token_id is not None else None
    n = n0
    was_training = model.training
    model.eval()
    try:
        cache = model.start({"input_ids": input_ids, "attention_mask": attention_mask}, total) if use_cache else None
        while n < total:
            nxt = pick_tokens(logits_up_to(n, cache)[:, -1], temperature, top_k, top_p, gen)
            if done is not None:
                nxt = nxt.masked_fill(done, eos_token_id)
                done |= nxt == eos_token_id
            tokens[:, n] = nxt
            n += 1
            if done is not None and bool(done.all()):
                break
    finally:
        model.train(was_training)
    return tokens[:, :n]
