"""Held-out evaluation: greedy decoding for seq2seq tasks, next-character loss and accuracy for LMs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .decode import greedy_seq2seq
from .metrics import Score, teacher_forced_acc
from .tasks import Pair, Task, collate
from .text import TextData
from .trainable import lm_logits

EVAL_SEED_OFFSET = 1_000_003  # eval sets never share a generator seed with training batches


def eval_pairs(task: Task, n: int, min_len: int, max_len: int, seed: int) -> list[Pair]:
    """A fixed held-out set: the same ``n`` pairs for every evaluation of a run (and of a resumed run)."""
    gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    return task.sample(n, min_len, max_len, gen)


@torch.no_grad()
def evaluate_seq2seq(model: torch.nn.Module, pairs: list[Pair], device: torch.device, batch_size: int = 256) -> Score:
    """Greedy decoding (no teacher forcing); batches hold similar source lengths to keep decoding short."""
    was_training = model.training
    model.eval()
    score = Score()
    ordered = sorted(pairs, key=lambda p: (len(p[0]), len(p[1])))
    for i in range(0, len(ordered), batch_size):
        b = collate(ordered[i : i + batch_size])
        pred = greedy_seq2seq(model, b.src.to(device), b.src_mask.to(device), b.labels.shape[1])
        score.add(pred.cpu(), b.labels, b.src_lengths)
    model.train(was_training)
    return score


@dataclass(frozen=True)
class LMScore:
    loss: float
    token_acc: float

    @property
    def bits_per_char(self) -> float:
        return self.loss / math.log(2)


@torch.no_grad()
def evaluate_lm(
    model: torch.nn.Module, data: TextData, window: int, device: torch.device, batches: int, batch: int, seed: int
) -> LMScore:
    """Mean next-character loss and accuracy over fixed random windows of the held-out 10%."""
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET)
    losses, accs = [], []
    for _ in range(batches):
        x, y = data.batch("val", batch, window, gen)
        logits = lm_logits(model, x.to(device))
        losses.append(float(F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten())))
        accs.append(teacher_forced_acc(logits, y.to(device), ignore=None))
    model.train(was_training)
    return LMScore(sum(losses) / len(losses), sum(accs) / len(accs))
