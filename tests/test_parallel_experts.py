"""Expert parallelism on CPU with gloo, 2 processes: dp=2 × ep=2 (the experts of every MoE layer split over the
data-parallel ranks, tokens dispatched and combined by all-to-all) equals the single-process MoE for each
routing kind: the seeded weights, the logits, the gradients and two clipped AdamW steps; the state dicts
hold the single-process [E, ...] tensors, and each rank holds the parameter bytes the analyzer predicts.
Refused layouts are one located error before any work."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_parallel_torch import _full_grads, _max_diff, _whole, spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

TINY = ["blocks=2", "d_model=32", "attention.heads=4", "attention.kv_heads=2", "vocab_size=64", "context=16"]
TINY += ["dtype=fp32", "mlp.experts=4", "mlp.hidden=24", "mlp.router.jitter=0"]
ROUTING = {  # routing kinds: top-2 softmax renormalised (+ aux loss); a Qwen2-MoE shared expert with a sigmoid
    # gate, top-1 softmax not renormalised; DeepSeek-style sigmoid scores, groups, a selection bias and a scale
    "top2": [*TINY, "mlp.router.aux_loss_coef=0.02"],
    "shared": [*TINY, "mlp.active=1", "mlp.router.normalize=false", "mlp.shared.hidden=16", "mlp.shared.gate=sigmoid"],
    "sigmoid": [*TINY, "mlp.router.score=sigmoid", "mlp.router.score_bias=true", "mlp.router.groups=2",
                "mlp.router.top_groups=1", "mlp.router.scale=2.5", "mlp.router.aux_loss_coef=0"],
    # Llama 4: top-1 sigmoid gates on the experts' inputs, an ungated shared expert
    "llama4": [*TINY, "mlp.active=1", "mlp.router.score=sigmoid", "mlp.router.normalize=false",
               "mlp.router.weighs=input", "mlp.shared.hidden=16", "mlp.router.aux_loss_coef=0"],
}  # fmt: skip


def _spec(kind: str, *more: str) -> Any:
    from specc.spec.loader import load_spec

    return load_spec("mixtral-8x7b", overrides=[*ROUTING[kind], *more])


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    aux = model.aux_loss()
    return loss if aux is None else loss + aux


def ep_cases() -> dict[str, dict[str, Any]]:
    return {**{kind: ep_case(kind) for kind in ROUTING}, "skewed": skewed_case()}


def skewed_case() -> dict[str, Any]:
    """``dispatch_combine`` when every token picks rank 0's experts (rank 1 receives and sends nothing back of
    its own) or, on rank 1, when the batch is empty: values and token gradients against the dense sum."""
    from specc.parallel.expert_parallel import dispatch_combine

    r, per = dist.get_rank(), 2  # 4 experts, 2 per rank

    def run(rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:  # expert e scales its rows by 1 + e
        scale = torch.cat([torch.full((n, 1), 1.0 + r * per + j) for j, n in enumerate(sizes)] or [rows[:0, :1]])
        return rows * scale

    out = {}
    for name, count in (("rank0_experts", 5), ("empty_rank1", 0 if r == 1 else 3)):
        tokens = torch.randn(count, 8, generator=torch.Generator().manual_seed(r)).requires_grad_()
        chosen = torch.randint(0, 2, (count, 2), generator=torch.Generator().manual_seed(10 + r))  # experts 0, 1
        weights = torch.rand(count, 2, generator=torch.Generator().manual_seed(20 + r))
        got = dispatch_combine(tokens, chosen, weights, 4, dist.group.WORLD, run)
        want = sum(weights[:, a, None] * tokens * (1.0 + chosen[:, a, None]) for a in range(2))
        (g,) = torch.autograd.grad(got.sum(), tokens, allow_unused=True) if count else (None,)
        (w,) = torch.autograd.grad(want.sum(), tokens) if count else (None,)
        if not count:  # nothing to differentiate here: the other rank's backward still needs this one's
            got.sum().backward() if got.requires_grad else None
        out[name] = max(float((got - want).abs().max()) if count else 0.0, float((g - w).abs().max()) if count else 0.0)
    return out


def ep_case(kind: str, layout: tuple[int, int] = (2, 1), ep: int = 2) -> dict[str, Any]:
    """One rank of dp × tp (``layout``) with experts over ``ep`` of the dp ranks; the global batch of 4 rows
    split over dp."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import specc
    from specc.parallel.expert_parallel import clip_grad_norm

    spec = _spec(kind)
    ref = specc.build_torch(spec).train()
    mesh = init_device_mesh("cpu", layout, mesh_dim_names=("dp", "tp"))
    model = specc.parallelize(specc.build_torch(spec, device="meta"), mesh, ep=ep).train()  # each rank its shards
    r, rows = mesh["dp"].get_local_rank(), 4 // layout[0]
    out: dict[str, Any] = {"init": _max_diff(_whole(model.state_dict()), ref.state_dict())}
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    out["full_state_dict"] = _max_diff(full, ref.state_dict())
    experts = {n: p for n, p in model.named_parameters() if ".experts.w_" in n}
    out["expert_rows"] = sorted({p.to_local().shape[0] for p in experts.values()})
    out["expert_placements"] = sorted({str(p.placements) for p in experts.values()})
    out["bytes"] = sum(p.to_local().numel() * p.element_size() for p in model.parameters() if isinstance(p, DTensor))
    out["all_dtensors"] = all(isinstance(p, DTensor) for p in model.parameters())
    ids = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(3))
    mine = ids[r * rows : (r + 1) * rows]  # this rank's rows of the global batch
    with torch.no_grad():
        want = ref.eval()(ids[:, :-1])[r * rows : (r + 1) * rows]
        out["logits"] = float((model.eval()(mine[:, :-1]) - want).abs().max())
    ref.train(), model.train()
    steps = []
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    for step in range(2):
        for m, opt in zip((ref, model), opts, strict=True):
            opt.zero_grad()
            _loss(m, ids if m is ref else mine).backward()
        if step == 0:
            want = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}  # score_bias: none
            got = _full_grads(model)
            out["no_grad"] = sorted(n for n, g in got.items() if g is None) == sorted(set(got) - set(want))
            out["grads"] = _max_diff({n: got[n] for n in want}, want)
            out["aux"] = None if ref.aux_loss() is None else float((ref.aux_loss() - model.aux_loss()).abs())
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        clip = clip_grad_norm if ep < layout[0] else torch.nn.utils.clip_grad_norm_  # experts on another mesh
        clip(model.parameters(), 0.5)
        for opt in opts:
            opt.step()
        steps.append(_max_diff(_whole(model.state_dict()), ref.state_dict()))
    out["steps"] = steps
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return spawn(2, ep_cases)


@pytest.mark.parametrize("kind", list(ROUTING))
def test_dp2_ep2_equals_the_single_process_moe(ranks: list[dict[str, Any]], kind: str) -> None:
    check_ep([r[kind] for r in ranks], kind, "(Shard(dim=0),)")


def check_ep(results: list[dict[str, Any]], kind: str, *placements: str, rows: int = 2) -> None:
    """Each rank's ``ep_case`` numbers: the experts split as ``placements`` say (``rows`` of the 4 experts on
    each rank), equal to one process."""
    for rank, res in enumerate(results):
        where = (kind, rank, res)
        assert res["init"] == 0.0 and res["full_state_dict"] == 0.0, where  # state dicts: single-process tensors
        assert res["expert_rows"] == [rows] and res["expert_placements"] == sorted(placements), where
        assert res["all_dtensors"], where
        assert res["logits"] < 1e-5, where
        assert res["grads"] < 1e-5 and res["no_grad"], where
        if res["aux"] is not None:  # the load-balancing loss of the whole batch, on every rank
            assert res["aux"] < 1e-6, where
        assert max(res["steps"]) < 1e-5, where


def test_dispatch_serves_a_rank_that_receives_nothing_or_holds_no_tokens(ranks: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(r["skewed"] for r in ranks):
        assert res["rank0_experts"] < 1e-6 and res["empty_rank1"] < 1e-6, (rank, res)


def test_each_rank_holds_the_parameter_bytes_the_analyzer_predicts(ranks: list[dict[str, Any]]) -> None:
    """FSDP2 over dp (ZeRO-3) for the dense parameters, the experts split over ep: the analyzer's weights per
    device. The analyzer divides the dense bytes evenly; FSDP2 splits each tensor by rows (torch.chunk), so a
    tensor of one row (the shared expert's sigmoid gate, [1, D]) stays whole on rank 0: that alone differs."""
    import specc
    from specc.analysis.layouts.device_memory import model_states
    from specc.analysis.layouts.shard import weights_per_stage

    for kind in ROUTING:
        graph = specc.lower(_spec(kind))
        ((dense, expert),) = weights_per_stage(graph, ep=2)
        predicted = model_states(dense, expert, 4, zero=3, n_dense=2, n_expert=1)["weights"]
        assert expert and dense  # both kinds of parameters are there to count
        odd = [p for p in graph.params().values() if p.shape[0] % 2]  # rows FSDP2 cannot halve
        assert (kind == "shared") == bool(odd) and all(p.shape[0] == 1 for p in odd), kind
        lean = sum(4 * p.shape[1] // 2 for p in odd)  # half a row each, held by rank 0 instead of rank 1
        for rank, res in enumerate(r[kind] for r in ranks):
            assert res["bytes"] == predicted + (lean if rank == 0 else -lean), (kind, rank, res["bytes"], predicted)


def test_layouts_expert_parallelism_cannot_run_are_refused_before_any_work() -> None:
    import specc
    from specc.errors import SpecError
    from specc.parallel.expert_parallel import check_expert_parallel

    moe = specc.lower(_spec("top2"))
    check_expert_parallel(moe, 2, 2)
    check_expert_parallel(moe, 2, 4)  # two groups of two ranks
    for args, message in (
        ((moe, 3, 4), r"ep=3 with dp=4: experts are sharded over groups of ep data-parallel ranks, so ep must"),
        ((moe, 2, 4, 2), r"ep=2 < dp=4 with tp=2: experts split over tp and sharded over dp/ep replica groups"),
        ((specc.lower(_spec("top2", "mlp.experts=6")), 4, 4), r"has 6 experts, not divisible by ep=4"),
        ((specc.lower(specc.load_spec("gpt2", ["blocks=1"])), 2, 2), r"has no MoE layer: ep=2 has no experts"),
    ):
        with pytest.raises(SpecError, match=message):
            check_expert_parallel(*args)
    with pytest.raises(SpecError, match="ep must be a positive integer, not 0"):
        specc.parallelize(specc.build_torch(_spec("top2")), _Mesh(), ep=0)


class _Mesh:  # parallelize checks its arguments before it touches a process group
    mesh_dim_names = ("dp",)

    def __getitem__(self, name: str) -> Any:
        return self

    def size(self) -> int:
        return 2


# ------------------------------------------------------------------------------------------------ the CLI

MOE_SETS = [x for s in ROUTING["top2"] for x in ("--set", s)]


def test_torchrun_dp2_ep2_checkpoint_resumes_in_one_process_as_one_straight_run(cli, tmp_path) -> None:
    """2 steps at dp=2 × ep=2 (a top-2 MoE with its load-balancing loss) into a distributed checkpoint folder
    (experts sharded by rows, Adam moments too), resumed to step 4 in one process: it ends where 4 straight
    single-process steps end, weights and moments."""
    from safetensors.torch import load_file
    from test_parallel_pipeline_cli import _report
    from test_parallel_torch_cli import _weights_diff, torchrun

    from specc.parallel import sharded_checkpoint as distributed
    from specc.train import training_checkpoint as C

    text = tmp_path / "text.txt"
    # 28 symbols: the embedding and head rows halve over dp, so FSDP2's row split is the analyzer's even one
    text.write_text(" ".join(["pack my box with five dozen liquor jugs."] * 10), encoding="utf-8")
    common = ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "12", "--eval-size", "4"]
    common += ["--schedule", "constant", "--warmup", "0"]
    straight = tmp_path / "one.safetensors"
    code, _, err = cli("train", "mixtral-8x7b", *MOE_SETS, *common, "--steps", "4", "--device", "cpu", "-o", straight)
    assert code == 0, err
    first = torchrun(
        2, "train", "mixtral-8x7b", *MOE_SETS, *common, "--steps", "2", "--parallel", "dp=2,ep=2", "--report",
        "-o", tmp_path / "k",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "dp=2, tp=1, ep=2: the experts split over the dp ranks" in first.stdout
    report = _report(first.stdout)  # the analyzer's per-rank model states for dp=2, ep=2 (ZeRO-3) to the byte
    assert sorted(report) == [0, 1], first.stdout[-3000:]
    for rank, items in report.items():
        for item in ("weights", "gradients", "optimizer_states"):
            predicted, measured = items[item]
            assert predicted == measured > 0, (rank, item, predicted, measured)
    assert distributed.has_optimizer(tmp_path / "k")
    code, out, err = cli(
        "train", "--resume", tmp_path / "k", "--steps", "4", "--device", "cpu", "-o", tmp_path / "1.safetensors"
    )
    assert code == 0 and "optimizer state from" in out, err
    got = C.load(tmp_path / "1.safetensors", True)
    assert got.step == 4
    assert _weights_diff(load_file(straight), got.weights) < 1e-5
    assert _weights_diff(load_file(tmp_path / "one.optim.safetensors"), got.optimizer) < 1e-5


def test_expert_layouts_train_cannot_run_exit_2_before_any_work(cli, tmp_path) -> None:
    args = ["train", "mixtral-8x7b", *MOE_SETS, "--task", "copy", "--steps", "2", "-o", tmp_path / "k"]
    for layout, sets, message in [
        ("dp=4,tp=2,ep=2", [], "--parallel ep=2 < dp=4 with tp=2: experts split over tp and sharded over dp/ep"),
        ("dp=4,ep=3", [], "ep must divide dp"),
        ("dp=2,pp=2,ep=2", [], "--parallel ep=2 with pp=2: expert parallelism is not composed with pipeline"),
        ("dp=2,ep=2", ["--set", "mlp.experts=3", "--set", "mlp.active=1"], "has 3 experts, not divisible by ep=2"),
    ]:
        code, _, err = cli(*args, *sets, "--parallel", layout)
        assert code == 2 and message in err and "Traceback" not in err, (layout, err)
        assert err.count("error:") == 1, err
    for layout, message in [("dp=2,ep=2", "llama2-7b has no MoE layer: ep=2 has no experts to shard")]:
        dense = ["train", "llama2-7b", "--set", "blocks=1", "--task", "copy", "--steps", "2", "-o", tmp_path / "k"]
        code, _, err = cli(*dense, "--parallel", layout)
        assert code == 2 and message in err and "Traceback" not in err, (layout, err)
        assert err.count("error:") == 1, err
