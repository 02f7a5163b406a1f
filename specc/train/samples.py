"""A few decoded examples for the end-of-training summary."""

from __future__ import annotations

from .decode import greedy_lm, greedy_seq2seq
from .loop import Run
from .tasks import collate
from .vocab import EOS, PAD


def seq2seq_samples(run: Run, n: int) -> list[tuple[str, str, str]]:
    """(source, expected, greedy output) for the first ``n`` held-out pairs, as symbol strings."""
    assert run.task is not None
    pairs = run.eval_set[:n]
    b = collate(pairs)
    pred = greedy_seq2seq(run.model, b.src.to(run.device), b.src_mask.to(run.device), b.labels.shape[1]).cpu()
    rows = []
    for (src, tgt), p in zip(pairs, pred.tolist(), strict=True):
        got = p[: p.index(EOS)] if EOS in p else [t for t in p if t != PAD]
        rows.append((run.vocab.decode(src), run.vocab.decode(tgt), run.vocab.decode(got)))
    return rows


def lm_sample(run: Run, n: int) -> str:
    """Greedy continuation of the first characters of the held-out text."""
    assert run.text is not None
    prompt = run.text.val[: min(16, len(run.text.val))][None].to(run.device)
    ids = greedy_lm(run.forward, prompt, n, run.lengths[1])
    return run.vocab.decode(prompt[0].tolist(), sep="") + run.vocab.decode(ids[0].tolist(), sep="")
