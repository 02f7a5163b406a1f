"""Task data: targets, padding masks, decoder inputs and labels, determinism, vocabulary checks; LM windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specc.errors import SpecError
from specc.train.tasks import TASKS, make_task
from specc.train.text import read_text
from specc.train.vocab import BOS, EOS, PAD, SPECIALS


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _values(task, ids: list[int]) -> list[str]:
    return [task.vocab.symbols[i] for i in ids]


@pytest.mark.parametrize("name", TASKS)
def test_batch_layout(name: str) -> None:
    task = make_task(name, 30, 30)
    lo, hi = (2, 4) if name == "add" else (3, 11)
    pairs = task.sample(200, lo, hi, _gen())
    b = task.batch(200, lo, hi, _gen())  # same seed → the same pairs, collated
    for i, (src, tgt) in enumerate(pairs):
        n, t = len(src), len(tgt)
        assert b.src[i, :n].tolist() == src and (b.src[i, n:] == PAD).all()
        assert b.src_mask[i].tolist() == [1] * n + [0] * (b.src.shape[1] - n)
        assert b.dec_in[i, : t + 1].tolist() == [BOS, *tgt] and (b.dec_in[i, t + 1 :] == PAD).all()
        assert b.labels[i, : t + 1].tolist() == [*tgt, EOS] and (b.labels[i, t + 1 :] == PAD).all()
        assert min(src + tgt) >= len(SPECIALS)  # data never uses the reserved ids
    lengths = b.src_lengths
    if name != "add":
        assert lengths.min() == lo and lengths.max() == hi  # 200 draws cover the whole range
    assert b.src.shape[1] == int(lengths.max())


@pytest.mark.parametrize(
    ("name", "check"),
    [
        ("reverse", lambda s, t: t == s[::-1]),
        ("copy", lambda s, t: t == s),
        ("sort", lambda s, t: t == sorted(s, key=int)),
    ],
)
def test_symbol_task_targets(name: str, check) -> None:
    task = make_task(name, 23, 23)
    assert len(task.vocab) == 23 and task.vocab.symbols[:3] == SPECIALS
    for src, tgt in task.sample(100, 1, 12, _gen(1)):
        assert check(_values(task, src), _values(task, tgt))


def test_add_targets_are_sums() -> None:
    task = make_task("add", 14, 13)
    for src, tgt in task.sample(300, 1, 5, _gen(2)):
        a, b = "".join(_values(task, src)).split("+")
        assert len(a) == len(b) and 1 <= len(a) <= 5
        assert (len(a) == 1 or a[0] != "0") and (len(b) == 1 or b[0] != "0")
        assert int("".join(_values(task, tgt))) == int(a) + int(b)


def test_sampling_is_a_function_of_the_seed() -> None:
    task = make_task("reverse", 13, 13)
    assert task.sample(50, 2, 9, _gen(7)) == task.sample(50, 2, 9, _gen(7))
    assert task.sample(50, 2, 9, _gen(7)) != task.sample(50, 2, 9, _gen(8))


def test_symbols_fit_the_smaller_vocabulary() -> None:
    task = make_task("copy", 40, 8)  # target vocabulary 8: only 5 data symbols
    assert len(task.vocab) == 8
    assert max(max(s) for s, _ in task.sample(100, 5, 5, _gen())) == 7


@pytest.mark.parametrize(
    ("name", "vocab", "target", "message"),
    [
        ("shuffle", 20, 20, "unknown task 'shuffle'"),
        ("add", 13, 13, "needs a vocabulary of at least 14 tokens, the spec's vocab_size is 13"),
        ("add", 20, 12, "target_vocab_size is 12"),
        ("reverse", 4, 4, "at least 5 tokens"),
    ],
)
def test_task_errors(name: str, vocab: int, target: int, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        make_task(name, vocab, target)


def test_char_lm_windows(tmp_path: Path) -> None:
    text = "hello world, " * 40
    p = tmp_path / "t.txt"
    p.write_text(text, encoding="utf-8")
    data = read_text(p)
    assert "".join(data.vocab.symbols) == "".join(sorted(set(text)))
    assert len(data.train) + len(data.val) == len(text) and len(data.val) == len(text) - int(len(text) * 0.9)
    x, y = data.batch("train", 8, 16, _gen())
    assert x.shape == y.shape == (8, 16)
    assert (x[:, 1:] == y[:, :-1]).all()  # labels are the inputs shifted by one
    decoded = data.vocab.decode(x[0].tolist(), sep="") + data.vocab.label(int(y[0, -1]))
    assert decoded in text


def test_text_with_unknown_characters_for_a_resumed_vocab(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("abcabc", encoding="utf-8")
    vocab = read_text(p).vocab
    p.write_text("abcd", encoding="utf-8")
    with pytest.raises(SpecError, match="'d' is not in the checkpoint's vocabulary"):
        read_text(p, vocab)


def test_length_buckets_merge_neighbours_weighted_by_count() -> None:
    from specc.train.loop import length_buckets

    record = {
        "exact_by_length": {str(n): (1.0 if n <= 10 else 0.0) for n in range(1, 21)},
        "sequences_by_length": {str(n): (30 if n == 11 else 10) for n in range(1, 21)},
    }
    rows = length_buckets(record, most=8)
    assert len(rows) == 7 and rows[0] == ("1–3", 30, 1.0) and rows[-1] == ("19–20", 20, 0.0)
    assert sum(n for _, n, _ in rows) == 220
    label, n, acc = rows[3]  # lengths 10–12: 10 right of 10 + 0 of 30 + 0 of 10
    assert (label, n) == ("10–12", 50) and acc == pytest.approx(0.2)
    assert length_buckets({"exact_by_length": {"5": 0.5}}) == [("5", 1, 0.5)]
    assert length_buckets({"val_loss": 1.0}) == []
