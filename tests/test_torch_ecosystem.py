"""The generated modules are ordinary PyTorch: hooks, submodules, PEFT, quantization, checkpointing, FSDP2,
compile, export and tracing all work on them."""

from __future__ import annotations

import pytest
import torch
from test_torch_cases import model_of, one_thread, tiny  # noqa: F401  (autouse fixture)
from torch import nn

from specc.backends.torch import build_torch


def test_print_shows_the_architecture() -> None:
    text = repr(model_of("llama_gqa_rope"))
    for part in ("ModuleList", "Block(", "(attn): Attention(", "(qkv): Linear(in_features=32, out_features=64",
                 "heads=4, kv_heads=2, head_dim=8", "Rotary(dims=8", "RMSNorm((32,)", "SiLU()"):  # fmt: skip
        assert part in text, part


@pytest.mark.parametrize("scope", ["blocks.0.attn", "blocks.1.mlp", "blocks.0.attn.qkv", "blocks.1", "norm_f"])
def test_forward_hooks_fire_on_any_scope(scope: str) -> None:
    model = model_of("gpt2")
    seen: list[tuple[int, ...]] = []
    model.get_submodule(scope).register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    model(torch.randint(0, 64, (2, 5)))
    assert len(seen) == 1 and seen[0][:2] == (2, 5)


def test_a_block_is_callable_on_hidden_states() -> None:
    model = model_of("gpt2")
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        block = model.get_submodule("blocks.0")
        y = block(x)
        ref = x + model.blocks[0].attn(model.blocks[0].norm1(x))
        ref = ref + model.blocks[0].mlp(model.blocks[0].norm2(ref))
    torch.testing.assert_close(y, ref)
    assert y.shape == x.shape


def test_peft_lora_wraps_qkv_and_fc1_and_training_lowers_the_loss() -> None:
    peft = pytest.importorskip("peft")
    from specc.train.tasks import make_task

    task = make_task("reverse", 64, 64)
    model = build_torch(tiny("transformer", "dropout=0.0", "init.std=0.2")).train()  # std 0.02 barely moves logits
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=["qkv", "fc1"]))
    lora_layers = [n for n, m in lora.named_modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    wrapped = {n.rsplit(".", 1)[-1] for n in lora_layers}
    assert wrapped == {"qkv", "fc1"}
    assert all("lora_" in n for n, p in lora.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=2e-2)
    batch = task.batch(16, 3, 8, torch.Generator().manual_seed(0))
    losses = []
    for _ in range(40):
        logits = lora(batch.src, batch.dec_in, batch.src_mask)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_dynamic_quantization_replaces_every_linear_and_still_generates() -> None:
    from torch.ao.quantization import quantize_dynamic

    model = model_of("gpt2")
    n_linear = sum(type(m) is nn.Linear for m in model.modules())
    q = quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    assert sum(type(m) is nn.Linear for m in q.modules()) == 0
    assert sum(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in q.modules()) == n_linear
    out = q.generate(torch.tensor([[1, 2, 3]]), 5)
    assert out.shape == (1, 8)
    with torch.no_grad():
        torch.testing.assert_close(q(torch.tensor([[1, 2, 3]])), model(torch.tensor([[1, 2, 3]])), atol=0.05, rtol=0.1)


def test_activation_checkpointing_per_block_gives_the_same_gradients() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    ids = torch.randint(0, 64, (2, 6))
    ref = model_of("gpt2").train()
    ref(ids).sum().backward()
    model = model_of("gpt2").train()
    apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ == "Block")
    assert sum(type(m).__name__ == "CheckpointWrapper" for m in model.modules()) == 2
    model(ids).sum().backward()
    grad = dict(ref.named_parameters())["blocks.0.attn.qkv.weight"].grad
    name = "blocks.0._checkpoint_wrapped_module.attn.qkv.weight"
    got = next(p.grad for n, p in model.named_parameters() if n.endswith(name))
    torch.testing.assert_close(got, grad)


def test_fsdp2_fully_shard_per_block_runs_in_a_single_process_group() -> None:
    import torch.distributed as dist
    from test_parallel_torch import _free_port
    from torch.distributed.fsdp import fully_shard

    # a free port, not a fixed one another run on this machine may hold
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = model_of("gpt2").train()
        ids = torch.randint(0, 64, (2, 6))
        want = model(ids).detach()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        out = model(ids)
        torch.testing.assert_close(out.detach(), want)
        out.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", ["gpt2", "llama_gqa_rope", "mixtral_moe"])
def test_torch_compile_fullgraph(case: str) -> None:
    model = model_of(case)
    ids = torch.randint(0, 64, (2, 6))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))


def test_torch_export_names_the_scopes_in_module_stacks() -> None:
    model = model_of("gpt2")
    ids = torch.randint(0, 64, (1, 6))
    ep = torch.export.export(model, (ids,))
    stacks = set()
    for node in ep.graph.nodes:
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            stacks.add(path)
    assert any("blocks.0.attn" in p or "blocks[0].attn" in p or "blocks.0.attn" in p.replace("[", ".").replace("]", "")
               for p in stacks)  # fmt: skip
    torch.testing.assert_close(ep.module()(ids), model(ids))


@pytest.mark.parametrize("case", ["llama_gqa_rope", "bert_mlm"])
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_jit_trace(mode: str, case: str) -> None:
    model = model_of(case)
    ids = torch.randint(0, 64, (1, 6))
    ctx = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with ctx:
        traced = torch.jit.trace(model, (ids,), check_trace=False)
        torch.testing.assert_close(traced(ids), model(ids))
