"""Torch backend generation: the KV-cached path yields exactly the tokens of full recomputation; sampling."""

from __future__ import annotations

import pytest
import torch
from test_torch_cases import model_of as tiny_model
from test_torch_cases import one_thread  # noqa: F401  (autouse fixture)

from specc.backends.torch import GenerationError


def model_of(case: str, *extra: str) -> torch.nn.Module:
    # Wide random weights give varied sequences; at std 0.02 tiny models repeat one token, a weak test.
    std = 2.0 if case.startswith(("gru", "lstm", "elman")) else 0.5  # small recurrent states reach a fixed point
    return tiny_model(case, f"init.std={std}", *extra)


GENERATIVE = [
    "gpt2",
    "llama_gqa_rope",
    "mixtral_moe",
    "sliding_rope",
    "prefix_partial_rope",
    "post_norm_sinusoidal",
    "transformer",
    "transformer_rope_rms_untied",
    "gru_bahdanau",
    "lstm_luong_general_2_layers",
    "elman_fixed_context",
]


def _prompt(model: torch.nn.Module, b: int = 2, n: int = 5, seed: int = 0) -> torch.Tensor:
    vocab = model.graph.meta["vocab_size"]
    return torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("case", GENERATIVE)
def test_cached_greedy_equals_full_recompute(case: str) -> None:
    model = model_of(case)
    ids = _prompt(model)
    cached = model.generate(ids, 12)
    full = model.generate(ids, 12, use_cache=False)
    assert torch.equal(cached, full)
    assert cached.shape[1] == (5 if model.step_input == "input_ids" else 1) + 12
    assert len(set(cached[:, -12:].flatten().tolist())) > 1  # not a degenerate constant sequence


@pytest.mark.parametrize("case", ["gpt2", "llama_gqa_rope", "transformer", "gru_bahdanau"])
def test_cached_step_logits_equal_full_forward_logits(case: str) -> None:
    model = model_of(case)
    ids = _prompt(model)
    seq = model.generate(ids, 6)
    seq2seq = model.step_input == "decoder_input_ids"
    full = model(ids, seq) if seq2seq else model(seq)
    cache = model.start({"input_ids": ids}, seq.shape[1])
    start = 1 if seq2seq else 5
    steps = [model.step(cache, seq[:, :start])]
    steps += [model.step(cache, seq[:, i : i + 1]) for i in range(start, seq.shape[1] - 1)]
    torch.testing.assert_close(torch.cat(steps, 1), full[:, start - 1 : -1], atol=1e-5, rtol=1e-5)


def test_padded_batch_generates_like_recompute() -> None:
    model = model_of("gpt2")
    ids = _prompt(model, n=6)
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])  # left padding of the shorter prompt
    cached = model.generate(ids, 8, attention_mask=mask)
    assert torch.equal(cached, model.generate(ids, 8, attention_mask=mask, use_cache=False))
    assert not torch.equal(cached[1], model.generate(ids, 8)[1])  # the mask is used


@pytest.mark.parametrize("case", ["gpt2", "transformer"])
def test_sampling_is_seeded_and_cache_independent(case: str) -> None:
    model = model_of(case)
    ids = _prompt(model)
    opts = {"temperature": 1.5, "top_k": 20, "top_p": 0.9}
    a = model.generate(ids, 10, seed=3, **opts)
    assert torch.equal(a, model.generate(ids, 10, seed=3, **opts))
    assert torch.equal(a, model.generate(ids, 10, seed=3, use_cache=False, **opts))
    assert not all(torch.equal(a, model.generate(ids, 10, seed=s, **opts)) for s in range(4, 8))


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    model = model_of("llama_gqa_rope")
    ids = _prompt(model)
    greedy = model.generate(ids, 8)
    assert torch.equal(model.generate(ids, 8, temperature=1.0, top_k=1, seed=0), greedy)
    assert torch.equal(model.generate(ids, 8, temperature=1.0, top_p=1e-6, seed=0), greedy)


def test_eos_stops_generation() -> None:
    model = model_of("gpt2")
    ids = _prompt(model, b=1)
    free = model.generate(ids, 10)
    eos = int(free[0, 7])  # the third generated token
    stopped = model.generate(ids, 10, eos_token_id=eos)
    first = (free[0, 5:] == eos).nonzero()[0].item() + 5
    assert torch.equal(stopped[0], free[0, : first + 1])


def test_learned_positions_bound_generation() -> None:
    model = model_of("gpt2")  # context 32
    with pytest.raises(GenerationError, match="32 learned positions"):
        model.generate(_prompt(model), 28)


def test_cli_generate(cli) -> None:
    args = ["generate", "gpt2", *[f"--set={s}" for s in ("blocks=1", "d_model=32", "attention.heads=4",
                                                           "vocab_size=64", "mlp.hidden=64")]]  # fmt: skip
    code, out, err = cli(*args, "--prompt-ids", "1 2 3", "--max-new-tokens", "4")
    assert code == 0, err
    tokens = [int(t) for t in out.split()]
    assert tokens[:3] == [1, 2, 3] and len(tokens) == 7
    assert cli(*args, "--prompt-ids", "1 2 3", "--max-new-tokens", "4")[1] == out
    code, _, err = cli(*args, "--prompt-ids", "1 2 99", "--max-new-tokens", "4")
    assert code == 2 and "outside the vocabulary" in err
    code, _, err = cli(*args, "--prompt-ids", "1 2", "--max-new-tokens", "2000")
    assert code == 2 and "learned positions" in err
    code, _, err = cli("generate", "bert-base", "--set=blocks=1", "--prompt-ids", "1 2")
    assert code == 2 and "nothing to generate" in err


@pytest.mark.parametrize("case", ["gpt2", "mixtral_moe"])
def test_cached_generation_with_threads_uses_the_split_gemv_path(case: str) -> None:
    model = model_of(case)
    ids = _prompt(model)
    torch.set_num_threads(2)  # decoding GEMVs split over 2 row blocks (restored by the autouse fixture)
    assert torch.equal(model.generate(ids, 10), model.generate(ids, 10, use_cache=False))


def test_a_prompt_shorter_than_the_prefix_generates_as_recomputation_does() -> None:
    model = model_of("prefix_partial_rope")  # prefix 4: tokens inside it attend both ways
    ids = torch.tensor([[5, 9]])
    assert model.generate(ids, 8).tolist() == model.generate(ids, 8, use_cache=False).tolist()


@pytest.mark.parametrize("case", ["sliding_rope", "prefix_partial_rope", "mixtral_moe"])
def test_forward_runs_on_the_meta_device(case: str) -> None:
    model = tiny_model(case, device="meta")
    out = model(torch.randint(0, 64, (2, 6), device="meta"))
    assert out.is_meta and out.shape == (2, 6, 64)
