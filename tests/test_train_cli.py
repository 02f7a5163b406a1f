"""specc train / attention-map from the command line: every family trains, resume, outputs, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

RNN = """\
name: tiny-rnn
kind: rnn_seq2seq
vocab_size: 13
rnn: {cell: gru, hidden: 32, embed: 16, bidirectional: true, attention: bahdanau}
"""
ENC_DEC = """\
name: tiny-t5ish
kind: encoder_decoder
vocab_size: 13
context: 16
d_model: 32
blocks: 1
attention: {heads: 2}
mlp: {type: classic, hidden: 64}
"""
DECODER = """\
name: tiny-lm
kind: decoder
vocab_size: 50257
context: 32
d_model: 32
blocks: 1
attention: {heads: 2}
"""


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add contention (and xdist runs two workers)
    yield
    torch.set_num_threads(threads)


def _train(cli, *args):
    code, out, err = cli("train", *args, "--device", "cpu")
    assert code == 0, err
    return out


def test_rnn_train_writes_checkpoint(cli, write_spec, tmp_path: Path) -> None:
    ck = tmp_path / "rnn.safetensors"
    out = _train(
        cli, write_spec(RNN), "--task", "reverse", "--steps", "12", "--max-len", "6", "--eval-size", "16", "-o", ck
    )
    assert "tiny-rnn (rnn_seq2seq" in out and "eval     12  token acc" in out and f"wrote {ck} (step 12)" in out
    assert "exact-sequence accuracy" in out  # the by-length table
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left nothing behind
    with safe_open(str(ck), "pt") as f:
        meta = f.metadata()
        names = set(f.keys())
    train = json.loads(meta["specc.train"])
    assert train["task"] == "reverse" and train["step"] == 12 and train["config"]["max_len"] == 6
    assert train["vocab"][:4] == ["<pad>", "<bos>", "<eos>", "0"] and len(train["vocab"]) == 13
    assert json.loads(meta["specc.spec"])["name"] == "tiny-rnn"
    assert "decoder.rnn.attn_v.weight" in names and names == set(load_file(str(ck)))
    with safe_open(str(tmp_path / "rnn.optim.safetensors"), "pt") as f:  # the Adam moments, beside it
        assert f.metadata()["specc.step"] == "12" and "decoder.rnn.attn_v.weight.exp_avg_sq" in set(f.keys())
    # a train checkpoint is a torch-backend checkpoint: specc generate reads it as is
    code, out, err = cli("generate", ck, "--prompt-ids", "3 4 5", "-n", "4", "--decoder-start-id", "1")
    assert code == 0 and out.split()[0] == "1" and len(out.split()) == 5, err


def test_resume_continues_from_the_saved_step(cli, write_spec, tmp_path: Path) -> None:
    """N steps + resume to 2N gives exactly the weights of 2N steps in one go (data, lr and Adam state restored)."""
    spec = write_spec(RNN)
    common = ["--task", "copy", "--max-len", "5", "--eval-size", "8", "--eval-every", "4", "--schedule", "constant"]
    whole, half, resumed = (tmp_path / f"{n}.safetensors" for n in ("whole", "half", "resumed"))
    _train(cli, spec, *common, "--steps", "8", "-o", whole)
    _train(cli, spec, *common, "--steps", "4", "-o", half)
    out = _train(cli, "--resume", half, "--steps", "8", "-o", resumed)
    assert "steps 4→8" in out and "step      5" in out and "step      4" not in out
    a, b = load_file(str(whole)), load_file(str(resumed))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    with safe_open(str(resumed), "pt") as f:
        train = json.loads(f.metadata()["specc.train"])
    assert train["step"] == 8 and [h["step"] for h in train["history"]] == [4, 8]
    # the first part's weights really differ: resuming did not just copy the finished run
    assert not torch.equal(load_file(str(half))["decoder.out.weight"], a["decoder.out.weight"])


def test_resume_refuses_a_different_task_or_spec(cli, write_spec, tmp_path: Path) -> None:
    spec = write_spec(RNN)
    ck = tmp_path / "a.safetensors"
    _train(cli, spec, "--task", "copy", "--steps", "2", "--max-len", "4", "--eval-size", "4", "-o", ck)
    code, _, err = cli("train", "--resume", ck, "--task", "sort", "--steps", "4", "-o", tmp_path / "b.safetensors")
    assert code == 2 and "trained on task copy, not sort" in err
    code, _, err = cli("train", spec, "--set", "rnn.hidden=8", "--resume", ck, "--steps", "4", "-o", tmp_path / "b.st")
    assert code == 2 and "--set cannot change" in err
    code, _, err = cli("train", "--resume", ck, "--steps", "2", "-o", tmp_path / "b.safetensors")
    assert code == 2 and "already at step 2" in err
    # the optimizer sidecar must belong to the same step; without one the run resumes with fresh moments
    side = tmp_path / "a.optim.safetensors"
    other = tmp_path / "c.safetensors"
    _train(cli, spec, "--task", "copy", "--steps", "3", "--max-len", "4", "--eval-size", "4", "-o", other)
    side.write_bytes((tmp_path / "c.optim.safetensors").read_bytes())
    code, _, err = cli("train", "--resume", ck, "--steps", "4", "-o", tmp_path / "b.safetensors")
    assert code == 2 and "optimizer state is from step 3, the checkpoint from step 2" in err
    side.unlink()
    code, out, err = cli("train", "--resume", ck, "--steps", "4", "-o", tmp_path / "b.safetensors")
    assert code == 0 and "with fresh Adam moments" in err and "steps 2→4" in out


def test_encoder_decoder_trains_and_maps_cross_attention(cli, write_spec, tmp_path: Path) -> None:
    ck = tmp_path / "t.safetensors"
    out = _train(
        cli, write_spec(ENC_DEC), "--task", "sort", "--steps", "6", "--max-len", "6", "--eval-size", "8", "-o", ck
    )
    assert "tiny-t5ish (encoder_decoder" in out
    png = tmp_path / "map.png"
    code, out, err = cli("attention-map", ck, "--input", "3 1 4 1 5", "-o", png, "--layer", "0", "--head", "1")
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "decoder.blocks.0.cross_attn.core, head 1" in out and "input:  3 1 4 1 5" in out
    code, _, err = cli("attention-map", ck, "--input", "3 1", "-o", png, "--head", "2")
    assert code == 2 and "--head 2 is out of range" in err
    code, out, _ = cli("attention-map", ck, "--input", "3 1", "-o", tmp_path / "avg.svg", "--average")
    assert code == 0 and "mean of 1 layer(s) × 2 head(s)" in out
    assert (tmp_path / "avg.svg").read_text().startswith("<?xml")


def test_decoder_lm_trains_on_characters(cli, write_spec, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 30, encoding="utf-8")
    ck = tmp_path / "lm.safetensors"
    out = _train(cli, write_spec(DECODER), "--task", "lm", "--text", text, "--steps", "6", "--max-len", "24", "-o", ck)
    assert "vocabulary 28" in out and "bits/char" in out and "sample:" in out
    with safe_open(str(ck), "pt") as f:
        meta = f.metadata()
        assert f.get_slice("embed.weight").get_shape() == [28, 32]  # vocab_size became the character count
    assert json.loads(meta["specc.spec"])["vocab_size"] == 28
    assert "".join(json.loads(meta["specc.train"])["vocab"]) == "".join(sorted(set(text.read_text())))
    out = _train(cli, "--resume", ck, "--text", text, "--steps", "8", "-o", ck)
    assert "steps 6→8" in out
    code, _, err = cli("attention-map", ck, "--input", "a b", "-o", tmp_path / "m.png")
    assert code == 2 and "no cross-attention" in err


def _one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (out, err)
    first = err.splitlines()[0]
    assert "error:" in first and all(n in first for n in needles), err
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if not ln.startswith("  hint:")]) == 1


def test_bad_input_exits_2_with_one_line(cli, write_spec, tmp_path: Path) -> None:
    spec = write_spec(RNN)
    o = tmp_path / "o.safetensors"
    _one_line_error(*cli("train", spec, "--task", "shuffle", "--steps", "2", "-o", o), "unknown task 'shuffle'")
    _one_line_error(*cli("train", spec, "--task", "lm", "--steps", "2", "-o", o), "--task lm needs --text FILE")
    _one_line_error(*cli("train", spec, "--task", "reverse", "-o", o), "missing --steps")
    _one_line_error(*cli("train", spec, "--task", "reverse", "--steps", "2"), "missing --output")
    _one_line_error(
        *cli("train", spec, "--task", "add", "--steps", "2", "-o", o), "at least 14 tokens", "vocab_size is 13"
    )
    _one_line_error(
        *cli("train", write_spec(DECODER, "lm.yaml"), "--task", "copy", "--steps", "2", "-o", o), "needs a seq2seq"
    )
    _one_line_error(*cli("train", "vit-b16", "--task", "copy", "--steps", "2", "-o", o), "vit model")
    ed = write_spec(ENC_DEC, "ed.yaml")
    _one_line_error(
        *cli("train", ed, "--task", "copy", "--steps", "2", "--max-len", "30", "-o", o), "16 learned positions"
    )
    assert not o.exists()

    ck = tmp_path / "ok.safetensors"
    _train(cli, spec, "--task", "reverse", "--steps", "2", "--max-len", "4", "--eval-size", "4", "-o", ck)
    png = tmp_path / "m.png"
    _one_line_error(*cli("attention-map", ck, "--input", "3 10", "-o", png), "'10' is outside the vocabulary")
    _one_line_error(*cli("attention-map", ck, "--input", "<eos>", "-o", png), "outside the vocabulary")
    _one_line_error(*cli("attention-map", ck, "--input", "1 2", "-o", tmp_path / "m.jpg"), "unsupported image format")
    assert not png.exists()

    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    _one_line_error(*cli("attention-map", junk, "--input", "1", "-o", png), str(junk), "not a safetensors checkpoint")
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    _one_line_error(*cli("attention-map", foreign, "--input", "1", "-o", png), "not a specc checkpoint")
    _one_line_error(*cli("train", "--resume", foreign, "--steps", "3", "-o", o), "not a specc checkpoint")
    _one_line_error(*cli("attention-map", tmp_path / "nope.safetensors", "--input", "1", "-o", png), "no such file")


def test_fixed_context_model_has_no_map(cli, write_spec, tmp_path: Path) -> None:
    spec = write_spec(RNN.replace("bahdanau", "none"))
    ck = tmp_path / "fixed.safetensors"
    _train(cli, spec, "--task", "reverse", "--steps", "2", "--max-len", "4", "--eval-size", "4", "-o", ck)
    code, _, err = cli("attention-map", ck, "--input", "1 2", "-o", tmp_path / "m.png")
    assert code == 2 and "fixed-context RNN decoder" in err
