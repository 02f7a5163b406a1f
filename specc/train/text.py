"""Character-level language-model data: the text's characters are the vocabulary; batches are random windows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import SpecError
from ..io import read
from .vocab import Vocab, char_vocab

MAX_TEXT_BYTES = read.TEXT_BYTES


@dataclass(frozen=True)
class TextData:
    vocab: Vocab
    train: torch.Tensor  # [T] ids, the first 90%
    val: torch.Tensor  # [T'] ids, the last 10%

    def batch(self, split: str, n: int, window: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` random windows: inputs [n, window] and next-character labels [n, window]."""
        data = self.train if split == "train" else self.val
        starts = torch.randint(0, len(data) - window, (n,), generator=gen)
        idx = starts[:, None] + torch.arange(window + 1)
        chunk = data[idx]
        return chunk[:, :-1], chunk[:, 1:]


def read_text(path: str | Path, vocab: Vocab | None = None) -> TextData:
    """Read a UTF-8 text file; with ``vocab`` (from a checkpoint being resumed) its characters must fit it."""
    p = Path(path)
    text = read.read_text(p, "a training text", MAX_TEXT_BYTES, missing=f"no such file: {p}")
    if not text:
        raise SpecError("the text file is empty", file=str(p), hint="--task lm learns the characters of a text")
    vocab = vocab or char_vocab(text)
    index = {c: i for i, c in enumerate(vocab.symbols)}
    missing = sorted(set(text) - index.keys())
    if missing:
        raise SpecError(f"character {missing[0]!r} is not in the checkpoint's vocabulary", file=str(p))
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(ids) * 0.9)
    return TextData(vocab, ids[:split], ids[split:])


def check_window(data: TextData, window: int, path: str) -> None:
    shortest = min(len(data.train), len(data.val))
    if shortest <= window:
        raise SpecError(
            f"text is too short for windows of {window} characters ({len(data.train) + len(data.val)} characters, "
            "10% held out)",
            file=path,
            hint="use a longer text or a smaller --max-len",
        )
