"""Attention maps: a trained Bahdanau model on reversal attends anti-diagonally (§1.4); selection rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from specc import load_spec
from specc.train import TrainConfig, new_run, save_run, train
from specc.train.attention_maps import attention_map, mirror_fraction

SMALL = {
    "name": "reverse-small",
    "kind": "rnn_seq2seq",
    "vocab_size": 13,
    "rnn": {"cell": "gru", "hidden": 64, "embed": 32, "bidirectional": True, "attention": "bahdanau"},
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention (and xdist runs two workers)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reverse_run():
    """≈ 10 s on one core: 250 steps of reversing 4–10 symbols, seeded (data, dropout and init)."""
    cfg = TrainConfig(task="reverse", steps=250, batch=64, lr=5e-3, min_len=4, max_len=10, seed=0, eval_size=200)
    run = new_run(load_spec(SMALL), cfg, torch.device("cpu"))
    train(run)
    return run


def test_learned_attention_is_anti_diagonal(reverse_run) -> None:
    run = reverse_run
    assert run.history[-1]["exact_acc"] >= 0.95  # it learned the task (greedy, held out)
    hits = rows = 0
    for src, _ in run.task.sample(40, 4, 10, torch.Generator().manual_seed(123)):
        m = attention_map(run.model, run.graph, run.vocab, run.vocab.decode(src), len(src) + 1)
        assert m.rows[-1] == "<eos>" and m.cols == run.vocab.decode(src).split()
        assert torch.allclose(m.weights.sum(1), torch.ones(len(m.rows)), atol=1e-5)  # a distribution per row
        n = min(len(src), len(m.rows))  # the output symbols; the <eos> row is not an alignment
        hits += mirror_fraction(m.weights, n, tolerance=1) * n
        rows += n
    assert hits / rows >= 0.9


def test_untrained_attention_is_not_anti_diagonal() -> None:
    """The check above can fail: an untrained model's map is not mirrored."""
    torch.manual_seed(0)
    run = new_run(load_spec(SMALL), TrainConfig(task="reverse", steps=1, eval_size=4), torch.device("cpu"))
    hits = rows = 0
    for src, _ in run.task.sample(20, 8, 10, torch.Generator().manual_seed(1)):
        m = attention_map(run.model, run.graph, run.vocab, run.vocab.decode(src), len(src) + 1)
        n = min(len(src), len(m.rows))
        hits += mirror_fraction(m.weights, n) * n
        rows += n
    assert rows == 0 or hits / rows < 0.9


def test_mirror_fraction() -> None:
    anti = torch.eye(5).flip(1)
    assert mirror_fraction(anti, 5) == 1.0
    assert mirror_fraction(torch.eye(5), 5, tolerance=0) == pytest.approx(0.2)  # only the centre matches
    assert mirror_fraction(torch.eye(5), 5, tolerance=2) == pytest.approx(0.6)
    assert mirror_fraction(anti.roll(-1, 1), 4, tolerance=1) == 1.0  # off by one: within the tolerance
    assert mirror_fraction(anti.roll(-2, 1), 3, tolerance=1) == 0.0


def test_cli_map_of_the_trained_model(reverse_run, cli, tmp_path: Path) -> None:
    ck = save_run(reverse_run, tmp_path / "rev.safetensors")
    png = tmp_path / "map.png"
    code, out, err = cli("attention-map", ck, "--input", "3 1 4 1 5 9 2 6", "-o", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "output: 6 2 9 5 1 4 1 3 <eos>" in out
    argmax = [int(t) for t in re.search(r"per output token: ([\d ]+)", out).group(1).split()]
    assert sum(abs(a - (7 - i)) <= 1 for i, a in enumerate(argmax[:8])) >= 8 * 0.9
    for bad in (["--layer", "1"], ["--head", "1"], ["--average", "--layer", "0"]):
        code, _, err = cli("attention-map", ck, "--input", "1 2", "-o", png, *bad)
        assert code == 2 and "error:" in err
    code, out, _ = cli("attention-map", ck, "--input", "1 2", "-o", png, "--layer", "0", "--head", "0")
    assert code == 0 and "decoder.rnn, head 0" in out


@pytest.mark.parametrize("kind", ["luong_dot", "luong_general"])
def test_luong_maps_are_recorded(kind: str) -> None:
    spec = load_spec({**SMALL, "rnn": {**SMALL["rnn"], "attention": kind, "bidirectional": False}})
    run = new_run(spec, TrainConfig(task="copy", steps=1, eval_size=4), torch.device("cpu"))
    m = attention_map(run.model, run.graph, run.vocab, "1 2 3", 6)
    assert m.weights.shape == (len(m.rows), 3) and m.title == "decoder.rnn"
