"""Synthetic seq2seq tasks generated in-process: reverse, copy, sort, add.

Each sequence pair is (source ids, target ids) over a task vocabulary (``vocab.py``). Batches are padded on
the right with ``<pad>``; the decoder reads ``<bos> + target`` and is trained to emit ``target + <eos>``.
Sampling is driven by a ``torch.Generator`` so a batch is a pure function of its seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import SpecError
from .vocab import BOS, EOS, PAD, SPECIALS, Vocab, symbol_vocab

Pair = tuple[list[int], list[int]]
DIGITS = [str(d) for d in range(10)]


@dataclass(frozen=True)
class Batch:
    src: torch.Tensor  # [B, N] source ids, <pad>-padded
    src_mask: torch.Tensor  # [B, N] 1 = token, 0 = padding
    dec_in: torch.Tensor  # [B, T] <bos> + target, <pad>-padded
    labels: torch.Tensor  # [B, T] target + <eos>, <pad>-padded (ignored by the loss)

    def __len__(self) -> int:
        return self.src.shape[0]

    @property
    def src_lengths(self) -> torch.Tensor:
        return self.src_mask.sum(1)


@dataclass(frozen=True)
class Task:
    """One synthetic task: how to draw a pair, which symbols it uses, and its default lengths."""

    name: str
    doc: str
    vocab: Vocab
    draw: Callable[[torch.Generator, int], Pair]  # (generator, length) → (source, target)
    default_lengths: tuple[int, int]
    length_meaning: str = "source tokens"

    def sample(self, n: int, min_len: int, max_len: int, gen: torch.Generator) -> list[Pair]:
        lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
        return [self.draw(gen, k) for k in lengths]

    def batch(self, n: int, min_len: int, max_len: int, gen: torch.Generator) -> Batch:
        return collate(self.sample(n, min_len, max_len, gen))

    def max_target_len(self, max_len: int) -> int:
        """Longest target (without <eos>) a source of ``max_len`` can have."""
        return max_len + 1 if self.name == "add" else max_len


def collate(pairs: list[Pair]) -> Batch:
    n = max(len(s) for s, _ in pairs)
    t = max(len(y) for _, y in pairs) + 1
    src = torch.full((len(pairs), n), PAD, dtype=torch.long)
    dec_in = torch.full((len(pairs), t), PAD, dtype=torch.long)
    labels = torch.full((len(pairs), t), PAD, dtype=torch.long)
    for b, (s, y) in enumerate(pairs):
        src[b, : len(s)] = torch.tensor(s)
        dec_in[b, : len(y) + 1] = torch.tensor([BOS, *y])
        labels[b, : len(y) + 1] = torch.tensor([*y, EOS])
    return Batch(src, (src != PAD).long(), dec_in, labels)


# ---------------------------------------------------------------------------------------------- the tasks


def _symbols_task(name: str, doc: str, n_symbols: int, target: Callable[[list[int]], list[int]]) -> Task:
    vocab = symbol_vocab([str(i) for i in range(n_symbols)])
    first = len(SPECIALS)

    def draw(gen: torch.Generator, k: int) -> Pair:
        src = torch.randint(first, first + n_symbols, (k,), generator=gen).tolist()
        return src, target(src)

    return Task(name, doc, vocab, draw, (5, 20))


def _add_task() -> Task:
    vocab = symbol_vocab([*DIGITS, "+"])
    digit = {d: len(SPECIALS) + i for i, d in enumerate(DIGITS)}
    plus = len(SPECIALS) + 10

    def number(gen: torch.Generator, k: int) -> int:
        lo = 0 if k == 1 else 10 ** (k - 1)
        return int(torch.randint(lo, 10**k, (1,), generator=gen))

    def draw(gen: torch.Generator, k: int) -> Pair:
        a, b = number(gen, k), number(gen, k)
        return [digit[c] for c in str(a)] + [plus] + [digit[c] for c in str(b)], [digit[c] for c in str(a + b)]

    return Task("add", "a + b in decimal digits → their sum", vocab, draw, (1, 6), "digits per operand")


def _needs(name: str, have: int, need: int, key: str) -> None:
    if have < need:
        raise SpecError(
            f"task {name} needs a vocabulary of at least {need} tokens, the spec's {key} is {have}",
            hint=f"--set {key}={need}",
        )


TASKS = ("reverse", "copy", "sort", "add")


def make_task(name: str, vocab_size: int, target_vocab_size: int) -> Task:
    """The task over the largest symbol set both the source and the target vocabulary hold."""
    if name == "add":
        _needs(name, vocab_size, len(SPECIALS) + 11, "vocab_size")
        _needs(name, target_vocab_size, len(SPECIALS) + 10, "target_vocab_size")
        return _add_task()
    if name not in TASKS:
        raise SpecError(f"unknown task {name!r}", hint=f"choose one of: {', '.join((*TASKS, 'lm'))}")
    _needs(name, vocab_size, len(SPECIALS) + 2, "vocab_size")
    _needs(name, target_vocab_size, len(SPECIALS) + 2, "target_vocab_size")
    k = min(vocab_size, target_vocab_size) - len(SPECIALS)
    if name == "reverse":
        return _symbols_task(name, "x₁…x_N → x_N…x₁", k, lambda s: s[::-1])
    if name == "copy":
        return _symbols_task(name, "x₁…x_N → x₁…x_N", k, list)
    return _symbols_task(name, "x₁…x_N → the same symbols in ascending order", k, sorted)
