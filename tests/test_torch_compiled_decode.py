"""Compiled KV-cache decoding, ``generate(compile=True)``: the tokens of eager decoding and of HF ``generate``,
for a GPT-2 (learned positions, left padding, sampling) and a Qwen2 with GQA, RoPE, one sliding-window layer
and one full layer; the step compiles once and serves later calls of other lengths in the same bucket.

Each compiling test compiles one tiny model (tens of seconds on 2 cores, most of it inductor's C++ build)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID
from test_hf_zoo import STD, save
from test_onnx_left_padding import _batch
from test_onnx_left_padding import hf_zoo as hf_zoo
from test_torch_cases import model_of

from specc.backends.torch import GenerationError, build_torch
from specc.interop import import_hf
from specc.spec.loader import load_spec

NEW = 12


@pytest.fixture
def compiles() -> Iterator[Any]:
    """Dynamo's counters for the test; afterwards a recompilation is an error again only where a test asks."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.config.error_on_recompile = False


def _hf_generate(hf: Any, ids: torch.Tensor, mask: torch.Tensor | None = None) -> list[list[int]]:
    hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW)
    return out[:, ids.shape[1] :].tolist()


@pytest.mark.compile
def test_compiled_gpt2_decodes_like_eager_and_hf(hf_zoo: Any, compiles: Any) -> None:
    hf, spec, weights = hf_zoo("gpt2-tied")
    model = build_torch(spec, weights=weights)
    ids, mask, _ = _batch(hf.config.vocab_size, seed=4, low=3)
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)  # the second row left-padded
    got = model.generate(ids, NEW, attention_mask=mask, compile=True)
    assert compiles["stats"]["unique_graphs"] >= 1  # the steps ran through torch.compile
    assert torch.equal(got, model.generate(ids, NEW, attention_mask=mask))
    assert got[:, -NEW:].tolist() == _hf_generate(hf, ids, mask)
    assert len(set(got[:, -NEW:].flatten().tolist())) > 2  # not a degenerate repetition

    # Compiled once: another prompt length (same cache bucket), no mask, and seeded sampling reuse the step.
    torch._dynamo.config.error_on_recompile = True
    ids = torch.randint(3, hf.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(model.generate(ids, NEW + 3, compile=True), model.generate(ids, NEW + 3))
    opts: dict[str, Any] = {"temperature": 1.0, "top_k": 40, "seed": 5}
    sampled = model.generate(ids, NEW, compile=True, **opts)
    assert torch.equal(sampled, model.generate(ids, NEW, **opts))
    assert not torch.equal(sampled, model.generate(ids, NEW))


@pytest.mark.compile
def test_compiled_rope_gqa_sliding_window_decodes_like_eager_and_hf(tmp_path: Any, compiles: Any) -> None:
    case = FAMILY_BY_ID["qwen2-mixed"]  # layer 0 full attention, layer 1 a window of 4; RoPE; 4 heads over 2
    hf, folder = save(case, tmp_path, std=STD)
    model = build_torch(import_hf(folder).spec, weights=str(folder / "model.safetensors"))
    windows = [m.window for m in model.modules() if getattr(m, "mask", None) == "sliding_window"]
    assert windows == [4]
    ids = torch.randint(3, hf.config.vocab_size - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    got = model.generate(ids, NEW, compile=True)  # 18 tokens: the window slides over the cache
    assert compiles["stats"]["unique_graphs"] >= 1
    assert torch.equal(got, model.generate(ids, NEW))
    assert got[:, -NEW:].tolist() == _hf_generate(hf, ids)


@pytest.mark.compile
def test_compiled_chunked_layer_starts_chunks_at_each_rows_first_token(compiles: Any) -> None:
    """A chunk of 3 and a row left-padded by 4: compiled steps read each row's own chunk, as eager ones do, and
    the padded row decodes what it does alone."""
    doc = {
        "kind": "decoder", "name": "c", "vocab_size": 60, "context": 64, "d_model": 32, "blocks": 2,
        "attention": {"heads": 4, "kv_heads": 2}, "mlp": {"type": "swiglu", "hidden": 40},
        "norm": {"type": "rmsnorm"}, "bias": False, "init": {"std": 0.3},
        "layer_kinds": {"chunk": {"attention": {"mask": "chunked", "chunk": 3}}, "full": {}},
        "layer_pattern": ["chunk", "full"],
    }  # fmt: skip
    torch.manual_seed(0)
    model = build_torch(load_spec(doc)).eval()
    ids = torch.randint(3, 59, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        got = model.generate(ids, 7, attention_mask=mask, compile=True)
        assert compiles["stats"]["unique_graphs"] >= 1
        assert torch.equal(got, model.generate(ids, 7, attention_mask=mask))
        assert got[1:, -7:].tolist() == model.generate(ids[1:, 4:], 7)[:, -7:].tolist()


@pytest.fixture
def uncompiled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """torch.compile as the identity: the static-cache step runs eagerly (its masks, slots and windows, fast)."""
    wrapped: list[Any] = []

    def identity(fn: Any, **options: Any) -> Any:
        wrapped.append(options)
        return fn

    monkeypatch.setattr(torch, "compile", identity)
    return wrapped


STATIC_CASES = ["gpt2", "llama_gqa_rope", "mixtral_moe", "sliding_rope", "prefix_partial_rope", "post_norm_sinusoidal"]


@pytest.mark.parametrize("case", STATIC_CASES)
def test_static_cache_step_decodes_like_the_growing_cache(case: str, uncompiled: list[Any]) -> None:
    model = model_of(case, "init.std=0.5", *(["attention.window=3"] if case == "sliding_rope" else []))
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    for kwargs in ({}, {"attention_mask": mask}, {"temperature": 1.0, "seed": 2}):
        assert torch.equal(model.generate(ids, 14, compile=True, **kwargs), model.generate(ids, 14, **kwargs))
    assert uncompiled == [{"options": {}, "dynamic": False}]  # one decoder per model, made once


def test_cuda_steps_compile_to_cuda_graphs(uncompiled: list[Any]) -> None:
    from specc.backends.torch.accel.compiled import CompiledDecoder

    CompiledDecoder(model_of("gpt2"), torch.device("cuda"))  # nothing runs: only torch.compile's options
    assert uncompiled == [{"mode": "reduce-overhead", "dynamic": False}]


def test_cli_compile_flag(cli: Any, uncompiled: list[Any]) -> None:
    tiny = ["--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2", "--set", "vocab_size=50"]
    args = ["generate", "gpt2", *tiny, "-p", "1 2 3", "-n", "6"]
    code, eager, _ = cli(*args)
    assert code == 0
    assert cli(*args, "--compile")[:2] == (0, eager)
    assert len(uncompiled) == 1
    code, _, err = cli(*args, "--compile", "--no-cache")
    assert code == 2 and "Traceback" not in err and "--compile decodes through the KV cache" in err


def test_compiled_decoding_refuses_what_it_cannot_serve() -> None:
    gpt2 = model_of("gpt2")
    with pytest.raises(GenerationError, match="use_cache=False"):
        gpt2.generate(torch.ones(1, 3, dtype=torch.long), 2, compile=True, use_cache=False)
    with pytest.raises(GenerationError, match="decoder-only attention models"):
        model_of("gru_bahdanau").generate(torch.ones(1, 3, dtype=torch.long), 2, compile=True)


def test_compiled_decoding_refuses_temperature_tuning() -> None:
    """Llama 4's NoPE layers scale q by the step's index, which the compiled step does not carry: refused."""
    sets = ["blocks=2", "d_model=32", "attention.heads=4", "attention.kv_heads=2", "vocab_size=64", "context=32"]
    sets += ["mlp.hidden=16", "mlp.shared.hidden=16", "mlp.experts=2", "layer_pattern=[rope, nope]", "dtype=fp32"]
    sets += ["layer_kinds.rope.attention.chunk=4", "position.scaling.original_max_positions=8"]
    model = build_torch(load_spec("llama4-scout", sets))
    with pytest.raises(GenerationError, match="attention temperature tuning"):
        model.generate(torch.ones(1, 3, dtype=torch.long), 2, compile=True)
