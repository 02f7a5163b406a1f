"""Tied weights are shared parameters, as Hugging Face ties them: a tied head is a plain ``nn.Linear`` (a tied
embedding a plain ``nn.Embedding``) whose ``weight`` IS the owner's Parameter, listed once, saved once, re-tied
after loading and moving; FlopCounterMode counts every tied preset under no_grad and inference_mode; PEFT,
dynamic quantization and the standalone model.py keep the tie."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_torch_cases import SMALL, one_thread  # noqa: F401  (autouse fixture)
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.analysis import analyze
from specc.backends.torch import build_torch, write_model_py
from specc.ir.graph import LayerGraph, dims
from specc.spec.presets import preset_names

TIED_PRESETS = [n for n in preset_names() if any(op.tied_to for op in specc.lower(specc.load_spec(n)).ops())]
B, N, N_DEC = 2, 12, 7


def _short(preset: str) -> Any:
    """The preset at full width with few blocks (a layer pattern's length: each of its kinds stays)."""
    pattern = specc.load_spec(preset).layer_pattern
    return specc.load_spec(preset, [f"blocks={len(pattern) if pattern else 2}"])


def _ties(graph: LayerGraph) -> dict[str, str]:
    return {f"{op.name}.weight": op.tied_to for op in graph.ops() if op.tied_to}


def _tiny(preset: str = "gpt2", *extra: str) -> Any:
    return specc.load_spec(preset, [*SMALL, *extra])


def _fresh(spec: Any) -> Any:
    """A model of ``spec`` with every parameter zero: whatever a load leaves in it came from the state dict."""
    model = build_torch(spec, accelerate=False)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))


def test_every_tied_preset_is_found() -> None:
    assert {"gpt2", "gpt2-xl", "gpt3-175b", "bert-base", "gemma-7b", "transformer-base"} <= set(TIED_PRESETS)
    assert len(TIED_PRESETS) >= 11


@pytest.mark.parametrize("preset", TIED_PRESETS)
def test_tied_module_weight_is_the_owner_parameter_listed_once(preset: str) -> None:
    spec = _short(preset)
    graph = specc.lower(spec)
    model = build_torch(spec, device="meta")
    ties = _ties(graph)
    assert ties and ties == type(model).TIED
    for alias, owner in ties.items():
        module = model.get_submodule(alias.rpartition(".")[0])
        assert type(module) in (nn.Linear, nn.Embedding)
        assert module.weight is model.get_parameter(owner)
    names = [n for n, _ in model.named_parameters()]
    assert not set(ties) & set(names) and set(ties.values()) <= set(names)
    assert set(names) == set(graph.params()) == set(model.state_dict())
    assert sum(p.numel() for p in model.parameters()) == analyze(graph, crossover=False).params.total
    assert "TiedLinear" not in type(model).SOURCE and "F.embedding" not in type(model).SOURCE


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("preset", TIED_PRESETS)
def test_flop_counter_counts_every_tied_preset(preset: str, mode: str) -> None:
    """Full widths, two blocks, on the meta device; the matmul FLOPs equal the analyzer's."""
    spec = _short(preset)
    graph = specc.lower(spec)
    model = build_torch(spec, device="meta")
    env = {"B": B, "N": N, "N_dec": N_DEC}
    inputs = {
        k: torch.zeros(dims(i.shape, env), dtype=torch.long if i.dtype == "int64" else torch.float, device="meta")
        for k, i in graph.inputs.items()
        if not i.optional
    }
    expected = analyze(graph, batch=B, seq=N, dec_seq=N_DEC, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with getattr(torch, mode)(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**inputs)
    assert counter.get_total_flops() == expected


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_flop_counter_counts_a_tied_model_on_the_cpu_with_the_acceleration_pass(mode: str) -> None:
    spec = _tiny()
    graph = specc.lower(spec)
    model = build_torch(spec, accelerate=True)
    expected = analyze(graph, batch=2, seq=6, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with getattr(torch, mode)(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(_ids())
    assert counter.get_total_flops() == expected


def test_encoder_decoder_shares_one_table_three_ways() -> None:
    model = build_torch(_tiny("transformer-base"))
    table = model.get_parameter("encoder.embed.weight")
    assert model.decoder.embed.weight is table and model.lm_head.weight is table
    assert [n for n, p in model.named_parameters() if p is table] == ["encoder.embed.weight"]


def test_state_dict_holds_each_tensor_once_and_safetensors_round_trips(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    spec = _tiny()
    model = build_torch(spec, accelerate=False)
    state = model.state_dict()
    assert "lm_head.weight" not in state and "embed.weight" in state
    save_file(state, str(tmp_path / "w.safetensors"))  # refuses tensors that share memory: there are none
    back = _fresh(spec)
    back.load_state_dict(load_file(str(tmp_path / "w.safetensors")))
    assert back.lm_head.weight is back.embed.weight
    with torch.no_grad():
        torch.testing.assert_close(back(_ids()), model(_ids()), rtol=0, atol=0)
    from_file = build_torch(spec, weights=str(tmp_path / "w.safetensors"))
    assert from_file.lm_head.weight is from_file.embed.weight
    with torch.no_grad():
        torch.testing.assert_close(from_file(_ids()), model(_ids()), rtol=0, atol=0)


@pytest.mark.parametrize("names", ["owner", "alias", "both"])
@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_takes_either_name_or_both(names: str, assign: bool) -> None:
    spec = _tiny()
    model = build_torch(spec, accelerate=False)
    state = dict(model.state_dict())
    table = state["embed.weight"]
    if names == "alias":
        state["lm_head.weight"] = state.pop("embed.weight")
    elif names == "both":
        state["lm_head.weight"] = torch.zeros_like(table)  # where both are given, the owner's tensor wins
    back = _fresh(spec)
    back.load_state_dict(state, assign=assign)
    assert back.lm_head.weight is back.embed.weight
    torch.testing.assert_close(back.embed.weight.detach(), table, rtol=0, atol=0)
    assert len(list(back.parameters())) == len(list(model.parameters()))


def test_moving_and_materialising_keep_the_tie() -> None:
    spec = _tiny()
    with torch.device("meta"):
        model = type(build_torch(spec, device="meta"))()
    model.to_empty(device="cpu")
    assert model.lm_head.weight is model.embed.weight
    model.init_weights().to(torch.float64)
    assert model.lm_head.weight is model.embed.weight and model.embed.weight.dtype == torch.float64
    torch.__future__.set_overwrite_module_params_on_conversion(True)  # _apply makes a new Parameter per module
    try:
        model.half()
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert model.lm_head.weight is model.embed.weight and model.embed.weight.dtype == torch.float16


def test_seeded_init_draws_a_tied_parameter_once() -> None:
    """The generator advances once per parameter: a tied table drawn twice would shift every later draw."""
    spec = _tiny()
    tied, untied = build_torch(spec), build_torch(_tiny("gpt2", "tie_embeddings=false"))
    for name, p in tied.named_parameters():
        torch.testing.assert_close(p, untied.get_parameter(name), rtol=0, atol=0)


def test_standalone_model_py_ties_as_build_torch_does(tmp_path: Path) -> None:
    spec = _tiny()
    ref = build_torch(spec, accelerate=False)
    path = write_model_py(spec, tmp_path / "model.py", weights=ref.state_dict())
    text = path.read_text()
    assert "TiedLinear" not in text
    assert re.search(r'TIED(: ClassVar\[[^\]]*\]\])? = \{"lm_head.weight": "embed.weight"\}', text)
    module_spec = importlib.util.spec_from_file_location("tied_model_py", path)
    assert module_spec is not None and module_spec.loader is not None
    mod = importlib.util.module_from_spec(module_spec)
    sys.modules["tied_model_py"] = mod
    try:
        module_spec.loader.exec_module(mod)
        for model in (mod.build(), mod.build(weights=None)):
            assert model.lm_head.weight is model.embed.weight
            assert "lm_head.weight" not in model.state_dict()
        model = mod.build()
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            out = model(_ids())
        assert counter.get_total_flops() > 0
        torch.testing.assert_close(out, ref(_ids()).detach(), rtol=0, atol=0)
    finally:
        del sys.modules["tied_model_py"]


def test_peft_lora_on_the_tied_head_keeps_the_embedding_shared() -> None:
    peft = pytest.importorskip("peft")
    model = build_torch(_tiny(), accelerate=False).train()
    with torch.no_grad():
        want = model(_ids())
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head", "qkv"]))
    head = lora.base_model.model.lm_head
    assert hasattr(head, "lora_A") and head.base_layer.weight is lora.base_model.model.embed.weight
    with torch.no_grad():
        torch.testing.assert_close(lora(_ids()), want)  # LoRA's B starts at zero
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        lora(_ids())
    assert counter.get_total_flops() > 0
    trainable = [p for p in lora.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.5)
    table = model.embed.weight.detach().clone()
    for _ in range(2):
        loss = lora(_ids()).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert head.lora_B["default"].weight.abs().sum() > 0  # the head's adapter trained
    torch.testing.assert_close(model.embed.weight.detach(), table, rtol=0, atol=0)  # the frozen table did not


def test_dynamic_quantization_of_the_tied_head() -> None:
    from torch.ao.quantization import quantize_dynamic

    model = build_torch(_tiny(), accelerate=False)
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    assert "quantized" in type(q.lm_head).__module__ and type(q.embed) is nn.Embedding
    assert model.lm_head.weight is model.embed.weight  # the float model is left tied
    assert "lm_head.weight" not in q.state_dict() and "embed.weight" in q.state_dict()
    with torch.no_grad():
        torch.testing.assert_close(q(_ids()), model(_ids()), atol=0.05, rtol=0.1)
    assert q.generate(_ids()[:1, :3], 4).shape == (1, 7)
