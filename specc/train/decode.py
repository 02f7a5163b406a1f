"""Greedy decoding without teacher forcing: each step feeds the model its own previous argmax.

The torch backend's ``generate`` runs the encoder once and then one cached step per token (recurrent state
for RNN decoders, K/V caches for Transformers).
"""

from __future__ import annotations

import torch

from .vocab import BOS, EOS, PAD


def _after_eos_to_pad(tokens: torch.Tensor) -> torch.Tensor:
    ended = (tokens == EOS).long().cumsum(1) - (tokens == EOS).long()  # 1 strictly after the first <eos>
    return tokens.masked_fill(ended > 0, PAD)


@torch.no_grad()
def greedy_seq2seq(model: torch.nn.Module, src: torch.Tensor, mask: torch.Tensor, max_new: int) -> torch.Tensor:
    """[B, max_new] generated ids; ``<eos>`` ends a row and everything after it is ``<pad>``."""
    out = model.generate(
        src, max_new, attention_mask=mask, decoder_start_token_id=BOS, eos_token_id=EOS, temperature=0.0
    )[:, 1:]
    out = _after_eos_to_pad(out)
    if out.shape[1] < max_new:
        out = torch.nn.functional.pad(out, (0, max_new - out.shape[1]), value=PAD)
    return out


@torch.no_grad()
def greedy_lm(model: torch.nn.Module, prompt: torch.Tensor, max_new: int, window: int) -> torch.Tensor:
    """Continue ``prompt`` [1, T] by ``max_new`` tokens, reading at most the last ``window`` tokens."""
    ids = prompt[:, -window:]
    room = max(window - ids.shape[1], 0)
    if room >= max_new:
        return model.generate(ids, max_new, temperature=0.0)[:, ids.shape[1] :]
    out = []
    for _ in range(max_new):  # past the learned positions: slide the window, one full forward per token
        nxt = model(ids[:, -window:])[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        ids = torch.cat([ids, nxt], 1)
    return torch.cat(out, 1)
