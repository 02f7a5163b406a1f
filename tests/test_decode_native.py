"""The native decoding step (decode_native): the same logits and KV cache as the eager step for every block family
it plans, the eager step wherever it could not be exact, and the measured choice between the two."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hf_block_cases import CASES, spec_of
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.backends.torch.accel import decode_native, kernels_native
from specc.backends.torch.layers.model import Model

pytestmark = pytest.mark.skipif(not kernels_native.available(), reason="no native library on this machine")

LAYER_KINDS = {  # sliding window with its own theta, chunked without positions, full: one model
    "layer_kinds": {
        "local": {"attention": {"mask": "sliding_window", "window": 3}, "position": {"theta": 100.0}},
        "chunk": {"attention": {"mask": "chunked", "chunk": 4}, "position": "none"},
        "full": {},
    },
    "layer_pattern": ["local", "chunk", "full"],
    "blocks": 3,
    "attention": {"heads": 4, "kv_heads": 2},
    "mlp": {"type": "swiglu", "hidden": 40},
    "position": {
        "type": "rotary",
        "scaling": {
            "type": "llama3",
            "factor": 8.0,
            "original_max_positions": 16,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    },
    "norm": {"type": "rmsnorm"},
    "bias": False,
}
SPECS = {**{name: case[2] for name, case in CASES.items()}, "layer_kinds": LAYER_KINDS}
PLANNED_BY_NONE = ("moe", "sigmoid_gate")  # op kinds the native program has no op for


def _model(fields: dict[str, Any]) -> Any:
    doc = {"init": {"std": 0.3}, **fields}
    return specc.build_torch(spec_of(**doc), dtype=torch.float32).eval()


def _gpt2() -> Any:
    return specc.build_torch(specc.load_spec("gpt2", ["blocks=2", "d_model=64", "attention.heads=4"])).eval()


def _ids(model: Any, n: int, seed: int = 1) -> torch.Tensor:
    vocab = model.graph.op("embed").attrs.vocab
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def _native_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    runs: list[int] = []
    run = decode_native.Program.run

    def counted(self: Any, cache: Any, token: int) -> torch.Tensor:
        runs.append(token)
        return run(self, cache, token)

    monkeypatch.setattr(decode_native.Program, "run", counted)
    return runs


@pytest.mark.parametrize("name", sorted(SPECS))
def test_native_step_equals_the_eager_step(name: str) -> None:
    model = _model(SPECS[name])
    native = decode_native.stepper(model)
    if native is None:  # only graphs with an op the program has none for step eagerly
        assert any(kind in decode_native.why_not(model) for kind in PLANNED_BY_NONE), decode_native.why_not(model)
        return
    ids, prompt = _ids(model, 12), 5
    eager, ours = model.start({}, 16), model.start({}, 16)
    with torch.no_grad():
        Model.step(model, eager, ids[:, :prompt])
        Model.step(model, ours, ids[:, :prompt])
        for t in range(prompt, ids.shape[1]):
            token = ids[:, t : t + 1]
            want = Model.step(model, eager, token)
            assert native.usable(model, ours, token, None)
            got = native.program.run(ours, int(token[0, 0]))
            ours.length += 1
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    for core, (k, v) in eager.kv.items():
        torch.testing.assert_close(ours.kv[core][0][:, :, : eager.length], k[:, :, : eager.length])
        torch.testing.assert_close(ours.kv[core][1][:, :, : eager.length], v[:, :, : eager.length])


def test_generate_steps_natively_and_equals_recomputing(monkeypatch: pytest.MonkeyPatch) -> None:
    model, runs = _gpt2(), _native_runs(monkeypatch)
    ids = _ids(model, 6)
    out = model.generate(ids, 10)
    native = decode_native.stepper(model)
    assert native.choice in ("native", "eager") and set(native.timings) == {"native_s", "eager_s"}
    assert len(runs) >= 9 if native.choice == "native" else len(runs) == decode_native._REPS
    assert torch.equal(out, model.generate(ids, 10, use_cache=False))


def test_the_measured_choice_can_be_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    model, runs = _gpt2(), _native_runs(monkeypatch)
    # a clock that only the native step advances: the choice is decided by the timings, not by the machine's load
    clock = [0.0]
    run = decode_native.Program.run

    def slow_run(*a: Any) -> Any:
        clock[0] += 1.0
        return run(*a)

    monkeypatch.setattr(decode_native.Program, "run", slow_run)
    monkeypatch.setattr(decode_native, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    ids = _ids(model, 6)
    out = model.generate(ids, 8)
    assert decode_native.stepper(model).choice == "eager"
    assert len(runs) == decode_native._REPS  # the measurement only
    assert torch.equal(out, model.generate(ids, 8, use_cache=False))


def _eager_only(model: Any, monkeypatch: pytest.MonkeyPatch, **generate: Any) -> torch.Tensor:
    runs = _native_runs(monkeypatch)
    out = model.generate(generate.pop("ids"), 6, **generate)
    assert runs == []
    return out


def test_hooks_step_eagerly_and_fire(monkeypatch: pytest.MonkeyPatch) -> None:
    model, calls = _gpt2(), []
    model.blocks[1].mlp.register_forward_hook(lambda *a: calls.append(1))
    _eager_only(model, monkeypatch, ids=_ids(model, 4))
    assert len(calls) == 6  # the prompt, then every step


def test_attention_maps_flop_counting_and_padding_step_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _gpt2()
    ids = _ids(model, 4)
    with model.attention_maps():
        _eager_only(model, monkeypatch, ids=ids)
    with FlopCounterMode(display=False) as counter:
        _eager_only(model, monkeypatch, ids=ids)
    assert counter.get_total_flops() > 0
    padded = torch.tensor([[0, 1, 1, 1]])
    _eager_only(model, monkeypatch, ids=ids, attention_mask=padded)
    _eager_only(model, monkeypatch, ids=torch.cat((ids, ids)))  # batch 2


def test_training_and_autograd_are_not_native() -> None:
    model = _gpt2()
    ids = _ids(model, 4)
    native = decode_native.stepper(model)
    cache = model.start({}, 8)
    with torch.no_grad():
        Model.step(model, cache, ids)
        assert native.usable(model, cache, ids[:, :1], None)
        assert not native.usable(model, cache, ids[:, :1], torch.tensor([[0, 1, 1, 1, 1]]))  # left padding
    assert torch.is_grad_enabled() and not native.usable(model, cache, ids[:, :1], None)  # parameters need grad
    model.train()
    with torch.no_grad():
        assert not native.usable(model, cache, ids[:, :1], None)


def test_without_private_torch_calls_every_step_is_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not decode_native._modes_active()
    with monkeypatch.context() as patched:
        patched.delattr(torch._C, "_len_torch_dispatch_stack")
        assert decode_native._modes_active()  # counted as inside a mode
    model = _gpt2()
    ids = _ids(model, 4)
    want = model.generate(ids, 6)
    monkeypatch.setattr(decode_native, "_modes_active", lambda: True)
    assert torch.equal(_eager_only(model, monkeypatch, ids=ids), want)


def test_modules_the_graph_does_not_describe_step_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.ao.quantization import quantize_dynamic

    model = _gpt2()
    ids = _ids(model, 4)
    quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    assert decode_native.stepper(quantized) is None and "quantized" in decode_native.why_not(quantized)
    swapped = _gpt2()
    swapped.blocks[1].mlp.act = torch.nn.ReLU()  # before planning: a torch module, but not the graph's GELU
    assert decode_native.stepper(swapped) is None and "blocks.1.mlp.act" in decode_native.why_not(swapped)
    model = _gpt2()
    model.generate(ids, 2)  # planned
    model.blocks[0].mlp.act = torch.nn.Sigmoid()  # swapped after planning: not the graph's activation
    out = _eager_only(model, monkeypatch, ids=ids)
    assert torch.equal(out, model.generate(ids, 6, use_cache=False))


def test_unplannable_models_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    moe = _model({"attention": {"heads": 4}, "mlp": {"type": "moe", "experts": 4, "active": 2, "hidden": 24}})
    assert decode_native.stepper(moe) is None and "moe" in decode_native.why_not(moe)
    bf16 = specc.build_torch(spec_of(attention={"heads": 4}), dtype=torch.bfloat16)
    assert decode_native.stepper(bf16) is None and "bfloat16" in decode_native.why_not(bf16)
    monkeypatch.setattr(kernels_native, "library", lambda: None)
    model = _gpt2()
    assert decode_native.stepper(model) is None
    assert model.generate(_ids(model, 4), 4).shape == (1, 8)


def test_moved_weights_are_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    model, runs = _gpt2(), _native_runs(monkeypatch)
    ids = _ids(model, 5)
    model.generate(ids, 4)
    first = decode_native.stepper(model).program
    fresh = {k: v.clone() * 1.5 for k, v in model.state_dict().items()}
    model.load_state_dict(fresh, assign=True)  # new storage: the planned pointers are stale
    out = model.generate(ids, 6)
    assert torch.equal(out, model.generate(ids, 6, use_cache=False))
    native = decode_native.stepper(model)
    assert native.choice == "eager" or (native.program is not first and runs)


def test_positions_past_the_table_are_not_native() -> None:
    model = _gpt2()
    native, ids = decode_native.stepper(model), _ids(model, 4)
    positions = model.graph.op("pos").attrs.positions
    cache = model.start({}, positions + 4)
    with torch.no_grad():
        Model.step(model, cache, ids)
        cache.length = positions
        assert not native.usable(model, cache, ids[:, :1], None)
        cache.length = positions - 1
        assert native.usable(model, cache, ids[:, :1], None)


def test_planned_models_still_copy_and_pickle() -> None:
    import copy
    import io

    model = _gpt2()
    ids = _ids(model, 4)
    out = model.generate(ids, 5)
    assert decode_native.stepper(model) is not None
    twin = copy.deepcopy(model)
    assert torch.equal(twin.generate(ids, 5), out)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded.generate(ids, 5), out)


def test_a_hook_on_the_model_itself_steps_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    model, calls = _gpt2(), []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    _eager_only(model, monkeypatch, ids=_ids(model, 4))
    assert len(calls) == 6


def test_new_storage_under_the_same_parameter_is_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    model, runs = _gpt2(), _native_runs(monkeypatch)
    ids = _ids(model, 5)
    model.generate(ids, 3)
    native = decode_native.stepper(model)
    native.choice, first = "native", native.program  # whatever was measured: the native step is checked
    weight = model.blocks[0].mlp.fc1.weight
    with torch.no_grad():
        weight.data = weight.data * 3.0  # same Parameter object, new storage
    runs.clear()
    out = model.generate(ids, 6)
    assert torch.equal(out, model.generate(ids, 6, use_cache=False))
    assert native.program is not first and len(runs) == 5
