"""MoE router options that only act in training: the load-balancing loss and the router jitter noise."""

from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn.functional as F
from test_torch_cases import model_of, one_thread  # noqa: F401  (autouse fixture)


def test_aux_loss_is_the_switch_load_balancing_loss_in_training_only() -> None:
    model = model_of("mixtral_moe", "mlp.router.aux_loss_coef=0.5")
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    model(ids)
    assert model.aux_loss() is None  # eval mode: no loss
    model.train()
    captured: dict[str, torch.Tensor] = {}
    moe = model.blocks[0].mlp.experts
    moe.register_forward_hook(lambda m, args, out: captured.update(logits=args[1].detach()))
    model(ids)
    probs = captured["logits"].reshape(-1, 4).softmax(-1)
    chosen = probs.topk(2, -1).indices
    f = F.one_hot(chosen, 4).float().sum(1).mean(0) / 2
    want = 0.5 * 4 * (f * probs.mean(0)).sum()
    torch.testing.assert_close(moe.aux_loss, want)
    total = model.aux_loss()
    assert total is not None and total.requires_grad
    torch.testing.assert_close(total, sum(b.mlp.experts.aux_loss for b in model.blocks))
    model_of("mixtral_moe", "mlp.router.aux_loss_coef=0.0").train()(ids)  # coef 0: nothing to add


def test_router_jitter_perturbs_routing_in_training_only() -> None:
    model = model_of("mixtral_moe", "mlp.router.jitter=0.5")
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    assert "self.router(self.experts.route(x))" in type(model).SOURCE
    with torch.no_grad():
        assert torch.equal(model(ids), model(ids))
        model.train()
        torch.manual_seed(0)
        a = model(ids)
        torch.manual_seed(1)
        b = model(ids)
    assert not torch.allclose(a, b)


def test_specc_train_adds_the_aux_loss_to_the_training_loss() -> None:
    import specc
    from specc.train.loop import TrainConfig, setup, train_step

    def router_after_one_step(coef: float) -> torch.Tensor:
        sets = ["blocks=1", "d_model=32", "attention.heads=4", "vocab_size=16", "context=32", "mlp.type=moe",
                "mlp.experts=4", "mlp.active=2", "mlp.hidden=32", f"mlp.router.aux_loss_coef={coef}"]  # fmt: skip
        cfg = TrainConfig(task="reverse", steps=2, batch=8, lr=1e-2, min_len=3, max_len=6, warmup=0, eval_size=8)
        run = setup(specc.load_spec("transformer-base", sets), cfg, torch.device("cpu"))
        loss, _ = train_step(run)
        return run.model.get_parameter("encoder.blocks.0.mlp.router.weight").detach().clone(), loss

    (without, loss0), (with_aux, loss1) = router_after_one_step(0.0), router_after_one_step(10.0)
    assert loss0 == loss1  # the reported loss is the task's; the update differs by the aux gradient
    assert not torch.allclose(without, with_aux)


def test_importing_the_backend_draws_no_random_numbers_and_registers_no_flop_formulas() -> None:
    code = (
        "import torch\n"
        "from torch.utils import flop_counter\n"
        "before = dict(flop_counter.flop_registry)\n"
        "torch.manual_seed(0); want = torch.rand(3)\n"
        "torch.manual_seed(0)\n"
        "import specc.backends.torch, specc.analysis\n"
        "import specc\n"
        "m = specc.build_torch(specc.load_spec('gpt2', ['blocks=1', 'd_model=32', 'attention.heads=4']))\n"
        "assert torch.equal(torch.rand(3), want), 'the global RNG moved'\n"
        "assert dict(flop_counter.flop_registry) == before, 'flop formulas were registered'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
