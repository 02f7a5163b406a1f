"""Token and exact-sequence accuracy of predictions against ``target + <eos>`` labels."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .vocab import PAD


@dataclass
class Score:
    tokens: int = 0  # target tokens scored (including <eos>)
    tokens_right: int = 0
    sequences: int = 0
    sequences_right: int = 0
    by_length: dict[int, list[int]] = field(default_factory=dict)  # source length → [sequences, right]

    @property
    def token_acc(self) -> float:
        return self.tokens_right / max(self.tokens, 1)

    @property
    def exact_acc(self) -> float:
        return self.sequences_right / max(self.sequences, 1)

    def add(self, pred: torch.Tensor, labels: torch.Tensor, src_lengths: torch.Tensor) -> None:
        """``pred`` [B, T'] and ``labels`` [B, T], both ``<pad>``-filled after ``<eos>``."""
        t = labels.shape[1]
        if pred.shape[1] < t:
            pred = torch.nn.functional.pad(pred, (0, t - pred.shape[1]), value=PAD)
        pred = pred[:, :t]
        real = labels != PAD
        right = (pred == labels) & real
        exact = (right == real).all(1)
        self.tokens += int(real.sum())
        self.tokens_right += int(right.sum())
        self.sequences += len(labels)
        self.sequences_right += int(exact.sum())
        for n, ok in zip(src_lengths.tolist(), exact.tolist(), strict=True):
            row = self.by_length.setdefault(int(n), [0, 0])
            row[0] += 1
            row[1] += int(ok)


def teacher_forced_acc(logits: torch.Tensor, labels: torch.Tensor, ignore: int | None = PAD) -> float:
    pred = logits.argmax(-1)
    real = labels != ignore if ignore is not None else torch.ones_like(labels, dtype=torch.bool)
    return float(((pred == labels) & real).sum()) / max(int(real.sum()), 1)
