"""Models larger than one device: built on the meta device, parallelized, and materialized shard by shard.

Each rank profiles its own CPU allocations (torch.profiler, profile_memory) from the meta build to the
materialized model, so the test sees the peak bytes a rank ever held, next to the bytes of the whole model.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_parallel_torch import _free_port, _spec, spawn

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

CASES = {  # (family, more overrides, (dp, tp)): GQA packed q|k|v under tp; FSDP2 with a tied head under dp
    "llama tp=2": ("llama", ["blocks=4"], (1, 2)),
    "gpt dp=2": ("gpt", ["blocks=4"], (2, 1)),
}


def _peak_bytes(prof: Any) -> int:
    """The most CPU bytes held at once between the profiler's start and stop (allocations minus frees)."""
    events = prof.profiler.kineto_results.events()
    now = top = 0
    for _, n in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        now += n
        top = max(top, now)
    return top


def _expected_local(ref: torch.nn.Module, graph: Any, mesh: Any) -> dict[str, torch.Tensor]:
    """Each parameter's shard on this rank, sliced from the single-process model by hand: tp by the plan's
    axis (packed projections first put rank-major), dp by FSDP2's rows."""
    from specc.analysis.layouts.tensor_plan import split_axis, tensor_plan
    from specc.parallel.tensor import packed_params

    dp, tp = mesh["dp"], mesh["tp"]
    plan, packed = tensor_plan(graph), packed_params(graph, tp.size())
    out = {}
    for name, whole in ref.state_dict().items():
        if name in packed:
            whole = whole[packed[name]]
        rule = plan.get(name.rpartition(".")[0])
        axis = split_axis(rule, name.rpartition(".")[2]) if rule and tp.size() > 1 else None
        if axis is not None:
            whole = torch.chunk(whole, tp.size(), axis)[tp.get_local_rank()]
        if dp.size() > 1:
            whole = torch.chunk(whole, dp.size(), 0)[dp.get_local_rank()]
        out[name] = whole
    return out


def meta_cases() -> dict[str, dict[str, Any]]:
    return {case: meta_case(*args) for case, args in CASES.items()}


def meta_case(family: str, more: list[str], layout: tuple[int, int]) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile

    import specc

    spec = _spec(family, *more)
    mesh = init_device_mesh("cpu", layout, mesh_dim_names=("dp", "tp"))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        built = specc.build_torch(spec, device="meta")
        on_meta = all(p.is_meta for p in built.parameters())
        model = specc.parallelize(built, mesh)
    peak = _peak_bytes(prof)
    ref = specc.build_torch(spec)  # after the profile: the single-process model, seeded alike
    full = sum(p.numel() * p.element_size() for p in ref.parameters())
    largest = max(p.numel() * p.element_size() for p in ref.parameters())
    local = {n: p.detach().to_local() for n, p in model.named_parameters() if isinstance(p, DTensor)}
    want = _expected_local(ref, ref.graph, mesh)
    same = [float((local[n] - want[n]).abs().max()) if local[n].shape == want[n].shape else 1.0 for n in want]
    r, n = mesh["dp"].get_local_rank(), mesh["dp"].size()
    ids = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(5))[r * 4 // n : (r + 1) * 4 // n]
    with torch.no_grad():
        logits = float((ref(ids[:, :-1]) - model(ids[:, :-1])).abs().max())
    return {
        "on_meta": on_meta,
        "all_dtensors": len(local) == len(list(model.parameters())),
        "shards": max(same),
        "names": sorted(local) == sorted(want),
        "logits": logits,
        "peak": peak,
        "local": sum(t.numel() * t.element_size() for t in local.values()),
        "full": full,
        "largest": largest,
    }


def test_meta_built_model_materializes_only_its_shards_with_the_single_process_values() -> None:
    ranks = spawn(2, meta_cases)
    for case in CASES:
        for rank, res in enumerate(r[case] for r in ranks):
            where = (case, rank, res)
            assert res["on_meta"] and res["all_dtensors"] and res["names"], where
            assert res["shards"] == 0.0, where  # each local shard is the slice of the seeded single-process init
            assert res["logits"] < 1e-5, where
            # a rank holds its shards plus one whole parameter being drawn (and its split), never the model
            assert res["local"] <= res["full"] // 2 + res["largest"], where
            assert res["peak"] <= res["local"] + 4 * res["largest"], where
            assert res["peak"] < res["full"], where


def test_init_false_is_refused_for_a_model_with_real_weights() -> None:
    import specc
    from specc.errors import SpecError

    class Mesh:  # parallelize refuses before it touches a process group
        mesh_dim_names = ("tp",)

        def __getitem__(self, name: str) -> Any:
            return self

        def size(self) -> int:
            return 1

    with pytest.raises(SpecError, match="init=False leaves the parameters of a meta-device model"):
        specc.parallelize(specc.build_torch(_spec("gpt")), Mesh(), init=False)


def test_a_meta_model_whose_shards_do_not_fit_is_refused_before_anything_is_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One rank in this process: at tp=1 the materialized model is the seeded single-process one; with the
    memory limit below its bytes it is refused with the estimate, the parameters still on meta."""
    from torch.distributed.device_mesh import init_device_mesh

    import specc
    from specc.backends.torch import memory
    from specc.errors import SpecError

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        spec = _spec("gpt")
        model = specc.parallelize(specc.build_torch(spec, device="meta"), mesh)
        ref = specc.build_torch(spec).state_dict()
        assert all(torch.equal(t, ref[k]) for k, t in model.state_dict().items())
        monkeypatch.setattr(memory, "limits", lambda device: [memory.Limit(1000, "a test limit")])
        meta = specc.build_torch(spec, device="meta")
        with pytest.raises(SpecError, match=r"this rank's shards need .* but only .* \(limited by a test limit\)"):
            specc.parallelize(meta, mesh)
        assert all(p.is_meta for p in meta.parameters())
    finally:
        dist.destroy_process_group()
