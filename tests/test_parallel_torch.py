"""specc.parallelize on CPU with gloo: tensor parallel (tp=2) and FSDP2 (dp=2) equal the single-process model.

Each test spawns its processes (torch.multiprocessing, start method spawn); every rank builds the same seeded
model twice, one copy parallelized and one kept whole, and compares them itself, so a rank returns only
numbers (differences, byte counts, tokens) that the test asserts on.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

TINY = ["blocks=2", "d_model=32", "attention.heads=4", "vocab_size=64", "context=16", "dtype=fp32"]
# classic MLP + tied head + learned positions; SwiGLU + GQA + rotary; MoE + GQA (+ aux loss); QK-norm per head;
# QK-norm over the whole q and k projections (OLMo-2: the mean square all-reduced over tp); sinks; ALiBi
FAMILIES = {
    "gpt": ("gpt2", [*TINY, "mlp.hidden=64"]),
    "llama": ("llama2-7b", [*TINY, "attention.kv_heads=2", "mlp.hidden=48"]),
    "moe": ("mixtral-8x7b", [*TINY, "attention.kv_heads=2", "mlp.hidden=48", "mlp.experts=4"]),
    "qknorm": ("llama2-7b", [*TINY, "attention.kv_heads=2", "attention.qk_norm=head", "mlp.hidden=48"]),
    "qkfull": ("llama2-7b", [*TINY, "attention.kv_heads=2", "attention.qk_norm=full", "mlp.hidden=48"]),
    # attention sinks split with the heads; ALiBi's slopes are each rank's heads' (not those of H / tp heads)
    "sinks": ("llama2-7b", [*TINY, "attention.kv_heads=2", "attention.sinks=true", "mlp.hidden=48"]),
    "alibi": ("gpt2", [*TINY, "mlp.hidden=64", "position=alibi"]),
}

SP = ("gpt", "qknorm", "qkfull")  # also run sequence parallel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Any, args: tuple[Any, ...], out: str) -> None:
    os.environ["SPECC_KERNELS"] = "torch"  # both copies on F.linear: differences are the layout's alone
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = fn(*args)
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{out}/{rank}.pt")
    from specc.parallel.launch import end_process

    end_process(0)  # not through interpreter finalization with gloo threads alive (test_parallel_exit.py)


def spawn(world: int, fn: Any, *args: Any) -> list[Any]:
    """``fn(*args)`` on ``world`` gloo ranks; each rank's return value."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, (world, _free_port(), fn, args, out), nprocs=world, start_method="spawn")
        return [torch.load(f"{out}/{r}.pt") for r in range(world)]


def _spec(family: str, *more: str) -> Any:
    from specc.spec.loader import load_spec

    name, sets = FAMILIES[family] if family in FAMILIES else ZOO[family]
    return load_spec(name, overrides=[*sets, *more])


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    aux = model.aux_loss()
    return loss if aux is None else loss + aux


def _full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients whole and in the single-process row order (packed projections are held rank-major)."""
    from torch.distributed.tensor import DTensor

    from specc.parallel.sharded_checkpoint import _packed

    packed = _packed(model)
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name] = g[torch.argsort(packed[name])] if name in packed and g is not None else g
    return out


def _whole(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A state dict's tensors gathered whole, as a user saving one would (``.full_tensor()``)."""
    from torch.distributed.tensor import DTensor

    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in state.items()}


def _state_dicts(model: torch.nn.Module, ref: torch.nn.Module, fresh: Any) -> dict[str, float]:
    """``model``'s state dicts against the single-process ``ref`` (same weights): ``state_dict()`` gathered,
    ``get_model_state_dict(full_state_dict=True)``, and two loads into ``fresh()`` parallel models of another
    seed (``set_model_state_dict`` of ``ref``'s tensors, ``load_state_dict`` of ``model``'s), by logits."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    want = ref.state_dict()
    full = StateDictOptions(full_state_dict=True)
    out = {"state_dict": _max_diff(_whole(model.state_dict()), want)}
    out["full_state_dict"] = _max_diff(get_model_state_dict(model, options=full), want)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(4))
    one, two = fresh(), fresh()
    set_model_state_dict(one, want, options=full)
    two.load_state_dict(model.state_dict())
    with torch.no_grad():
        logits = ref.eval()(ids)
        out["set_full"] = float((one.eval()(ids) - logits).abs().max())
        out["loaded"] = float((two.eval()(ids) - logits).abs().max())
    ref.train()
    return out


def _ties_held(model: torch.nn.Module) -> list[bool]:
    """Per tie of the model: whether the tied module's weight IS the owner's parameter (a DTensor once split)."""
    return [model.get_submodule(a.rpartition(".")[0]).weight is model.get_parameter(o) for a, o in model.TIED.items()]


def _max_diff(a: dict[str, torch.Tensor | None], b: dict[str, torch.Tensor | None]) -> float:
    """Largest difference; a tensor without a gradient (a router's bias, a layer nothing reached) has none in
    both models, or the difference is infinite."""
    assert set(a) == set(b)
    if any((a[k] is None) != (b[k] is None) for k in a):
        return float("inf")
    return max(float((a[k] - b[k]).abs().max()) for k in a if a[k] is not None)


# ------------------------------------------------------------------------------------------------ workers


def tp_cases(folder: str) -> dict[str, dict[str, Any]]:
    out = {family: tp_case(family, f"{folder}/{family}") for family in FAMILIES}
    out.update({f"{family}+sp": sp_case(family) for family in SP})
    return out


def sp_case(family: str) -> dict[str, Any]:
    """Sequence parallel on top of tp=2: the residual stream split by positions between blocks."""
    from torch.distributed.device_mesh import init_device_mesh

    import specc
    from specc.errors import SpecError

    spec = _spec(family)
    ref = specc.build_torch(spec)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = specc.parallelize(specc.build_torch(spec), mesh, sequence_parallel=True)
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(3))
    pad = torch.ones(3, 8, dtype=torch.long)
    pad[1, :2] = 0
    with torch.no_grad():
        logits = float((ref(ids[:, :-1], pad) - model(ids[:, :-1], pad)).abs().max())
    refused = []
    for call in (lambda: model.generate(ids[:, :4], 2), lambda: model(ids[:, :7])):
        try:
            call()
        except SpecError as e:
            refused.append(str(e))
    ref.train(), model.train()
    _loss(ref, ids).backward()
    _loss(model, ids).backward()
    return {"logits": logits, "grads": _max_diff(_full_grads(model), {n: p.grad for n, p in ref.named_parameters()}),
            "refused": refused}  # fmt: skip


# the zoo's attention kinds under tp=2: T5's relative position bias (bidirectional in the encoder, causal in the
# decoder; its table split by heads) with its stacks' embeddings apart or one table (both stacks and the tied
# head reading the vocabulary shards), Llama 4's chunked RoPE / NoPE layers with temperature tuning, weightless
# QK-norm and input-weighted top-1 experts, ModernBERT's two-sided local windows, DeepSeek's latent attention
# (q through a low-rank q_a / q_b, or one q projection; YaRN RoPE or plain; group-limited routed experts)
ZOO = {
    "t5": ("t5-base", [*TINY, "mlp.hidden=48", "shared_embeddings=false",
                       "dropout={embedding: 0, attention: 0, residual: 0}"]),
    "t5_shared": ("t5-base", [*TINY, "mlp.hidden=48", "dropout={embedding: 0, attention: 0, residual: 0}"]),
    "llama4": ("llama4-scout", [*TINY, "blocks=4", "attention.kv_heads=2", "mlp.hidden=16", "mlp.shared.hidden=16",
               "mlp.experts=4", "layer_kinds.rope.attention.chunk=4", "layer_kinds.nope.attention.temperature.floor=2",
               "position.scaling.original_max_positions=8", "layer_pattern=[rope, nope]"]),
    "modernbert": ("modernbert-base", [*TINY, "blocks=3", "mlp.hidden=48", "layer_kinds.local.attention.window=4"]),
    "deepseek": ("deepseek-v3", [*TINY, "mlp.hidden=16", "mlp.experts=8", "mlp.active=3", "mlp.router.groups=2",
                 "mlp.router.top_groups=1", "mlp.shared.hidden=16", "layer_kinds.dense.mlp.hidden=48",
                 "layer_pattern=[dense, moe]", "position.scaling.original_max_positions=8",
                 "attention.latent={kv_rank: 16, q_rank: 24, rope_head_dim: 8, nope_head_dim: 12, v_head_dim: 10}"]),
    "deepseek_q": ("deepseek-v3", [*TINY, "mlp.hidden=16", "mlp.experts=4", "mlp.active=2", "mlp.router.groups=1",
                   "mlp.router.top_groups=1", "mlp.shared.hidden=16", "layer_kinds.dense.mlp.hidden=48",
                   "layer_pattern=[dense, moe]", "position=rotary",
                   "attention.latent={kv_rank: 12, rope_head_dim: 4, nope_head_dim: 8, v_head_dim: 6}"]),
}  # fmt: skip


def zoo_case(family: str) -> dict[str, Any]:
    """Weights redrawn at std 0.2 (so every bias and norm matters), then split: logits with left padding,
    gradients, and greedy KV-cache tokens against the whole model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import specc
    from specc.analysis.layouts.shard import per_device_weight_bytes
    from specc.backends.torch import example_inputs

    preset, sets = ZOO[family]
    spec = specc.load_spec(preset, sets)
    ref, model = specc.build_torch(spec), specc.build_torch(spec)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(1.0 if p.ndim == 1 else 0.0, 0.2, generator=g)  # norm scales near 1
    model.load_state_dict(ref.state_dict())
    model = specc.parallelize(model, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    inputs = example_inputs(ref.graph, batch=3, length=9)
    if "attention_mask" in inputs:
        inputs["attention_mask"][0, :3] = 0  # left padding
    out = {}
    with torch.no_grad():
        out["scale"] = float(ref(**inputs).abs().max())
        out["logits"] = float((ref(**inputs) - model(**inputs)).abs().max())
        if family != "modernbert":
            ids = inputs["input_ids"][:2, :4]
            out["tokens_equal"] = torch.equal(ref.generate(ids, 5), model.generate(ids, 5))
    # gradients in float64: a shared table sums its uses' gradients with cancellation (T5's one vocabulary:
    # 5e-5 of its scale apart in fp32, 1e-19 in fp64); what still runs in fp32 (RMSNorm's and routers' upcasts
    # become fp32 islands) leaves ≤ 1e-7 of the scale (Llama 4, DeepSeek), so the bound is 1e-6 for every family
    ref64, split64 = specc.build_torch(spec).double(), specc.build_torch(spec).double()
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    split64.load_state_dict(ref64.state_dict())
    split64 = specc.parallelize(split64, init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)))
    for m in (ref64.train(), split64.train()):
        m(**inputs).square().mean().backward()
    out["grads"] = _max_diff(_full_grads(split64), {n: p.grad for n, p in ref64.named_parameters()})
    out["grad_scale"] = max(float(p.grad.abs().max()) for p in ref64.parameters() if p.grad is not None)
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    held = sum(t.numel() * t.element_size() for t in local)
    out["bytes_equal"] = held == per_device_weight_bytes(ref.graph, tp=2, tp_rank=dist.get_rank())
    out["ties_held"] = _ties_held(model) == [True] * len(model.TIED)  # T5's one table: decoder embed and head
    return out


def zoo_cases() -> dict[str, dict[str, Any]]:
    return {family: zoo_case(family) for family in ZOO}


def tp_case(family: str, ckpt: str) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import specc
    from specc.parallel import sharded_checkpoint

    spec = _spec(family)
    ref = specc.build_torch(spec)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = specc.parallelize(specc.build_torch(spec), mesh)
    states = _state_dicts(model, ref, lambda: specc.parallelize(specc.build_torch(_spec(family, "init.seed=7")), mesh))
    ids = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    pad = torch.ones(3, 8, dtype=torch.long)
    pad[0, :3] = 0  # left padding: masks and positions follow it
    with torch.no_grad():
        logits = float((ref(ids[:, :-1], pad) - model(ids[:, :-1], pad)).abs().max())
        new = model.generate(ids[:, :4], 6), ref.generate(ids[:, :4], 6)  # greedy, KV cache of local heads
    ref.train(), model.train()
    _loss(ref, ids).backward()
    _loss(model, ids).backward()
    grads = _max_diff(_full_grads(model), {n: p.grad for n, p in ref.named_parameters()})
    local = {n: p.to_local() if isinstance(p, DTensor) else p for n, p in model.named_parameters()}
    sharded_checkpoint.save(model, ckpt, spec)
    again = specc.parallelize(specc.build_torch(_spec(family, "init.seed=7")), mesh)
    sharded_checkpoint.load_into(again, ckpt)  # a fresh parallel model (other seed) takes the saved weights
    with torch.no_grad():
        reloaded = float((model.eval()(ids[:, :-1], pad) - again(ids[:, :-1], pad)).abs().max())
    return {
        "states": states,
        "reloaded": reloaded,
        "logits": logits,
        "grads": grads,
        "tokens_equal": bool(torch.equal(*new)),
        "bytes": sum(t.numel() * t.element_size() for t in local.values()),
        "shapes": {n: tuple(t.shape) for n, t in local.items()},
        "all_dtensors": all(isinstance(p, DTensor) for p in model.parameters()),
        "ties": _ties_held(model) + _ties_held(again),
    }


def dp_step_case(family: str, layout: tuple[int, int]) -> dict[str, Any]:
    """One AdamW step with clipping on a global batch of 4 rows, split over dp (and tp)."""
    from torch.distributed.device_mesh import init_device_mesh

    import specc
    from specc.parallel.sharded_checkpoint import full_state_dict

    spec = _spec(family)
    ref = specc.build_torch(spec).train()
    mesh = init_device_mesh("cpu", layout, mesh_dim_names=("dp", "tp"))
    model = specc.parallelize(specc.build_torch(spec), mesh).train()
    states = _state_dicts(model, ref, lambda: specc.parallelize(specc.build_torch(_spec(family, "init.seed=7")), mesh))
    ids = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(2))
    r, n = mesh["dp"].get_local_rank(), mesh["dp"].size()
    _loss(ref, ids).backward()
    _loss(model, ids[r * 4 // n : (r + 1) * 4 // n]).backward()
    grads = _max_diff(_full_grads(model), {k: p.grad for k, p in ref.named_parameters()})
    for m in (ref, model):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)  # clipping reads the global gradient norm
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        opt.step()
    weights = _max_diff(full_state_dict(model), ref.state_dict())
    return {"grads": grads, "weights": weights, "states": states, "ties": _ties_held(model)}


# ------------------------------------------------------------------------------------------------ tests


def test_tp2_logits_gradients_generation_and_bytes_equal_single_process(cli, tmp_path: Path) -> None:
    """One launch (process start-up dominates on small CPUs) for the three families."""
    ranks = spawn(2, tp_cases, str(tmp_path))
    for family in FAMILIES:
        _check_tp(cli, family, [r[family] for r in ranks], tmp_path / family)
    for family in SP:
        for res in (r[f"{family}+sp"] for r in ranks):
            assert res["logits"] < 1e-5 and res["grads"] < 1e-5, (family, res)
            assert "no cached decoding" in res["refused"][0] and "multiple of tp=2" in res["refused"][1], res


def test_tp2_runs_relative_bias_chunked_local_and_latent_attention_as_the_single_process() -> None:
    for ranks in zip(*(r.values() for r in spawn(2, zoo_cases)), strict=True):
        for res in ranks:
            assert res["scale"] > 0.1, res  # redrawn weights: logits far from zero
            assert res["logits"] < 1e-5 * res["scale"] and res["grads"] < 1e-6 * res["grad_scale"], res
            assert res.get("tokens_equal", True), res
            assert res["bytes_equal"], res  # the analyzer's per-device weights: the table split by heads too
            assert res["ties_held"], res


def _check_tp(cli: Any, family: str, results: list[dict[str, Any]], folder: Path) -> None:
    import specc
    from specc.analysis.layouts.shard import per_device_weight_bytes
    from specc.parallel import local_params, sharded_checkpoint

    graph = specc.lower(_spec(family))
    name, sets = FAMILIES[family]
    code, out, err = cli(
        "analyze", name, *(f"--set={s}" for s in sets), "--parallel", "tp=2,pp=1,dp=1", "--format", "json"
    )
    assert code == 0, err
    analyzed = json.loads(out)["parallel"]["per_device"]["memory"]["weights"]
    ties = sum(op.tied_to is not None for op in graph.ops())
    assert ties == (family in ("gpt", "alibi"))  # the head tied to the vocabulary-parallel embedding
    for rank, res in enumerate(results):
        assert res["bytes"] == per_device_weight_bytes(graph, tp=2, tp_rank=rank), (family, rank)
        assert res["bytes"] == analyzed, (family, rank)  # the analyzer's `parallel.per_device.memory.weights`
        assert res["reloaded"] == 0.0, (family, rank)
        # state dicts hold the single-process tensors (packed q|k|v rows unpermuted) and load in that layout
        assert res["states"]["state_dict"] == res["states"]["full_state_dict"] == 0.0, (family, rank, res["states"])
        assert res["states"]["set_full"] < 1e-5 and res["states"]["loaded"] < 1e-5, (family, rank, res["states"])
        assert res["logits"] < 1e-5, (family, rank, res["logits"])
        assert res["grads"] < 1e-5, (family, rank, res["grads"])
        assert res["tokens_equal"], (family, rank)
        assert res["all_dtensors"], "every parameter is a DTensor on the tp mesh"
        assert res["ties"] == [True] * 2 * ties, (family, rank)  # the split and the reloaded model keep them
        want = local_params(graph, 2, rank)
        assert res["shapes"] == want, (family, rank)
        assert res["bytes"] == 4 * sum(torch.Size(s).numel() for s in want.values())
    if family == "llama":  # no biases, no position table: tp=2 halves all but the replicated norms
        norms = sum(p.shape[0] for op in graph.ops() if op.kind == "rmsnorm" for p in op.params.values())
        assert results[0]["bytes"] == 4 * ((graph.num_params() - norms) // 2 + norms)
    # the distributed checkpoint holds the single-process weights
    ck = sharded_checkpoint.load(folder)
    ref = specc.build_torch(graph)
    assert _max_diff(ck.weights, ref.state_dict()) == 0.0


def test_dp2_fsdp_gradients_and_one_step_equal_single_process() -> None:
    for res in spawn(2, dp_step_case, "gpt", (2, 1)):
        assert res["grads"] < 1e-6, res
        assert res["weights"] < 1e-6, res
        assert res["states"]["state_dict"] == res["states"]["full_state_dict"] == 0.0, res
        assert res["states"]["set_full"] < 1e-5 and res["states"]["loaded"] < 1e-5, res
        assert res["ties"] == [True], "FSDP2 keeps the head's weight the embedding's parameter"


def four_cases() -> dict[str, Any]:
    """One 4-process launch (start-up dominates): FSDP2 × tp for a dense model and for DeepSeek's latent attention
    (its replicated KV latent's gradient summed over tp, then FSDP2 over dp), and dp × tp × ep (the experts split
    over dp and by hidden units over tp) for a top-2 MoE and a gated shared-expert MoE."""
    from test_parallel_experts import ep_case

    out = {"dense": dp_step_case("llama", (2, 2)), **{kind: ep_case(kind, (2, 2)) for kind in ("top2", "shared")}}
    out["latent"] = dp_step_case("deepseek", (2, 2))
    out["top2 dp=4,ep=2"] = ep_case("top2", (4, 1), ep=2)  # two expert groups of 2 ranks, FSDP2 over the pairs
    return out


@pytest.mark.slow
def test_dp2_by_tp2_on_four_processes_equals_single_process() -> None:
    from test_parallel_experts import check_ep

    ranks = spawn(4, four_cases)
    for res in (r[case] for r in ranks for case in ("dense", "latent")):
        assert res["grads"] < 1e-5, res
        assert res["weights"] < 1e-5, res
        assert res["states"]["state_dict"] == res["states"]["full_state_dict"] == 0.0, res
        assert res["states"]["set_full"] < 1e-5 and res["states"]["loaded"] < 1e-5, res
    for kind in ("top2", "shared"):
        check_ep([r[kind] for r in ranks], kind, "(Shard(dim=0), Shard(dim=1))", "(Shard(dim=0), Shard(dim=2))")
    groups = [r["top2 dp=4,ep=2"] for r in ranks]
    # on the ("edp", "ep") mesh: 2 experts per rank of an expert group, FSDP2-halved over the group pairs
    check_ep(groups, "top2 dp=4,ep=2", "(_StridedShard(dim=0, sf=2), Shard(dim=0))", rows=1)
    from test_parallel_experts import _spec as moe_spec

    import specc
    from specc.analysis.layouts.device_memory import model_states
    from specc.analysis.layouts.shard import weights_per_stage

    ((dense, expert),) = weights_per_stage(specc.lower(moe_spec("top2")), ep=2)
    predicted = model_states(dense, expert, 4, zero=3, n_dense=4, n_expert=2)["weights"]  # ZeRO-3 over the pairs
    assert [g["bytes"] for g in groups] == [predicted] * 4


def test_plan_refuses_splits_that_do_not_divide_and_layouts_it_cannot_run() -> None:
    import specc
    from specc.errors import SpecError
    from specc.parallel import check_tensor_parallel

    graph = specc.lower(_spec("llama"))  # 4 heads, 2 KV heads, 48 hidden units
    check_tensor_parallel(graph, 2)
    with pytest.raises(SpecError, match="kv_heads 2 is not divisible by tp=4"):
        check_tensor_parallel(graph, 4)
    with pytest.raises(SpecError, match="heads 4 is not divisible by tp=3"):
        check_tensor_parallel(graph, 3)
    rnn = specc.lower(specc.load_spec("gru-bahdanau"))
    with pytest.raises(SpecError, match="recurrent layers have no tensor-parallel plan"):
        check_tensor_parallel(rnn, 2)

    class Mesh:  # parallelize reads the names and sizes first: no process group needed to refuse them
        mesh_dim_names = ("data", "tp")

        def __getitem__(self, name: str) -> Any:
            return self

        def size(self) -> int:
            return 1

    model = specc.build_torch(graph)
    with pytest.raises(SpecError, match="name them from"):
        specc.parallelize(model, Mesh())
    Mesh.mesh_dim_names = ("dp",)
    with pytest.raises(SpecError, match="sequence_parallel=True splits positions over tp"):
        specc.parallelize(model, Mesh(), sequence_parallel=True)
