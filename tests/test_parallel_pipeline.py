"""Pipeline parallelism (``specc.parallel.pipeline``) on CPU with gloo, 2 processes: under every schedule the
loss, the gradients, the logits and three AdamW steps (with gradient clipping) equal the single process.

One launch runs every case (each rank compares its own parameters with a whole seeded model it builds too), so
the processes start once; the test asserts on the numbers the ranks return."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from test_parallel_torch import spawn

from specc.errors import SpecError

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

TINY = ["d_model=32", "attention.heads=4", "vocab_size=64", "context=16", "dtype=fp32"]
# gpt: tied head (a copy on the last stage), learned positions; llama: untied head, rotary, GQA, SwiGLU
FAMILIES = {
    "gpt": ("gpt2", [*TINY, "mlp.hidden=64"]),
    "llama": ("llama2-7b", [*TINY, "attention.kv_heads=2", "mlp.hidden=48"]),
}
# (family, blocks, schedule, virtual stages): uneven splits (3 blocks on 2 stages, 5 on 4 chunks) included
CASES = [
    ("gpt", 3, "gpipe", 1),
    ("llama", 3, "1f1b", 1),
    ("gpt", 5, "interleaved-1f1b", 2),
    ("llama", 4, "zero-bubble", 1),
    ("gpt", 4, "zero-bubble", 2),
]


def _spec(family: str, blocks: int) -> Any:
    from specc.spec.loader import load_spec

    name, sets = FAMILIES[family]
    return load_spec(name, overrides=[*sets, f"blocks={blocks}"])


def pipeline_cases() -> dict[str, dict[str, Any]]:
    return {f"{f}/{b}/{s}/{v}": pipeline_case(f, b, s, v) for f, b, s, v in CASES}


def pipeline_case(family: str, blocks: int, schedule: str, virtual: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    import specc
    from specc.parallel.pipeline import build_pipeline

    spec = _spec(family, blocks)
    graph = specc.lower(spec)
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("pp", "dp"))
    pipe = build_pipeline(spec, graph, mesh, schedule=schedule, virtual=virtual, micro_batches=4)
    ref = specc.build_torch(spec)
    held = dict(pipe.root.named_parameters())
    out: dict[str, Any] = {"names": sorted(held)}
    out["init"] = _diff(held, ref)
    opt = torch.optim.AdamW(pipe.root.parameters(), lr=1e-2, weight_decay=0.0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    losses, grads = [], []
    for step in range(3):
        ids = torch.randint(0, 64, (8, 9), generator=torch.Generator().manual_seed(step))
        x, y = ids[:, :-1], ids[:, 1:]
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        loss, _ = pipe.train_step(x, y, -100, float(y.numel()), 1)
        ref_loss = torch.nn.functional.cross_entropy(ref(x).flatten(0, 1), y.flatten())
        ref_loss.backward()
        norm = pipe.clip_grad_norm(0.05)  # small enough to clip: the norm is over every stage
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05))
        grads.append(max(float((p.grad - ref.get_parameter(n).grad).abs().max()) for n, p in held.items()))
        losses.append((loss, float(ref_loss), norm, ref_norm))
        opt.step()
        ref_opt.step()
    out["losses"], out["grads"] = losses, grads
    out["weights"] = _diff(held, ref)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        out["logits"] = float((pipe(ids) - ref(ids)).abs().max())
    out["bubble"] = pipe.timeline.bubble()
    return out


@torch.no_grad()
def _diff(held: dict[str, torch.Tensor], ref: torch.nn.Module) -> float:
    return max(float((p - ref.get_parameter(n)).abs().max()) for n, p in held.items())


def test_pipeline_schedules_equal_the_single_process() -> None:
    ranks = spawn(2, pipeline_cases)
    for case in ranks[0]:
        a, b = ranks[0][case], ranks[1][case]
        family, blocks = case.split("/")[0], int(case.split("/")[1])
        names = set(_spec_params(family, blocks))
        # every parameter on some stage; only a tied table (gpt's embed.weight) on both
        assert set(a["names"]) | set(b["names"]) == names, case
        both = set(a["names"]) & set(b["names"])
        assert both == ({"embed.weight"} if family == "gpt" else set()), case
        for r in (a, b):
            assert r["init"] == 0.0, case
            for loss, ref_loss, norm, ref_norm in r["losses"]:
                assert loss == pytest.approx(ref_loss, rel=1e-5), case
                assert norm == pytest.approx(ref_norm, rel=1e-5) and ref_norm > 0.05, case
            assert max(r["grads"]) < 1e-6, case
            assert r["weights"] < 1e-4, case  # Adam's 1/sqrt(v) magnifies float-order differences
            assert r["logits"] < 1e-4, case
            assert 0.0 <= r["bubble"] < 1.0


def dp_pp_cases() -> dict[str, dict[str, Any]]:
    """dp=2 × pp=2 and tp=2 × pp=2 (4 ranks): FSDP2 shards each stage over its data-parallel pair (each rank
    trains on its rows of the global batch), or the IR's tensor-parallel plan splits each stage's modules;
    the whole tensors equal the single process's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    import specc
    from specc.parallel import data
    from specc.parallel.pipeline import build_pipeline
    from specc.parallel.tensor import packed_params

    out = {}
    meshes = {
        "dp": init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("pp", "dp", "tp")),
        "tp": init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("pp", "dp", "tp")),
    }
    cases = [("gpt", 3, "1f1b", 1, "dp"), ("llama", 4, "interleaved-1f1b", 2, "dp")]
    cases += [("gpt", 3, "gpipe", 1, "tp"), ("llama", 3, "1f1b", 1, "tp")]  # tied head vocab-split; GQA heads
    for family, blocks, schedule, virtual, split in cases:
        mesh = meshes[split]
        dp = mesh["dp"].size()
        spec = _spec(family, blocks)
        pipe = build_pipeline(spec, specc.lower(spec), mesh, schedule=schedule, virtual=virtual, micro_batches=2)
        ref = specc.build_torch(spec)
        opt = torch.optim.AdamW(pipe.root.parameters(), lr=1e-2, weight_decay=0.0)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
        losses = []
        for step in range(2):
            ids = torch.randint(0, 64, (8, 9), generator=torch.Generator().manual_seed(step))
            x, y = ids[:, :-1], ids[:, 1:]
            opt.zero_grad(set_to_none=True)
            ref_opt.zero_grad(set_to_none=True)
            mine = data.shard_rows(mesh, x, y)
            loss, _ = pipe.train_step(*mine, -100, float(y.numel()), dp)
            ref_loss = torch.nn.functional.cross_entropy(ref(x).flatten(0, 1), y.flatten())
            ref_loss.backward()
            losses.append((loss, float(ref_loss), pipe.clip_grad_norm(0.05)))
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
            opt.step()
            ref_opt.step()
        with torch.no_grad():
            full = {n: p.full_tensor() for n, p in pipe.root.named_parameters() if isinstance(p, DTensor)}
            sharded = len(full) == len(list(pipe.root.parameters()))
            for n, order in packed_params(pipe.graph, mesh["tp"].size()).items():  # held rank-major under tp
                if n in full:
                    full[n] = full[n][torch.argsort(order)]
            weights = max(float((p - ref.get_parameter(n)).abs().max()) for n, p in full.items())
        out[f"{family}/{schedule}/{split}"] = {"losses": losses, "weights": weights, "sharded": sharded}
    return out


def test_pipeline_composed_with_fsdp_or_tensor_parallel_equals_the_single_process() -> None:
    for r in spawn(4, dp_pp_cases):
        for case, got in r.items():
            assert got["sharded"], case  # every parameter is a DTensor: an FSDP2 shard over dp, or split over tp
            for loss, ref_loss, norm in got["losses"]:
                assert loss == pytest.approx(ref_loss, rel=1e-5) and norm > 0.05, case
            assert got["weights"] < 1e-4, case


def _spec_params(family: str, blocks: int) -> list[str]:
    import specc

    return list(specc.lower(_spec(family, blocks)).params())


def test_impossible_pipelines_are_refused_before_any_work() -> None:
    import specc
    from specc.parallel.pipeline import check_pipeline

    g = specc.lower(_spec("gpt", 3))
    with pytest.raises(SpecError, match="3 blocks cannot fill pp=4"):
        check_pipeline(g, 4, "1f1b", 1, 4)
    with pytest.raises(SpecError, match="3 blocks cannot fill pp=2 × 2 virtual stages"):
        check_pipeline(g, 2, "interleaved-1f1b", 2, 4)
    with pytest.raises(SpecError, match="1f1b runs one chunk per rank"):
        check_pipeline(g, 2, "1f1b", 2, 4)
    with pytest.raises(SpecError, match="needs a multiple of pp=2"):
        check_pipeline(g, 2, "interleaved-1f1b", 1, 3)
    with pytest.raises(SpecError, match="unknown"):
        check_pipeline(g, 2, "dualpipe", 1, 4)
    with pytest.raises(SpecError, match="zero-bubble with dp=2"):
        check_pipeline(g, 2, "zero-bubble", 1, 4, dp=2)
    from specc.spec.loader import load_spec

    encdec = specc.lower(load_spec("transformer-base", overrides=["blocks=2"]))
    with pytest.raises(SpecError, match="pipeline parallelism runs decoder LMs"):
        check_pipeline(encdec, 2, "1f1b", 1, 4)


def test_chunks_follow_the_analyzers_stage_split() -> None:
    """The runtime's chunks are the analyzer's stages: the same blocks, the embedding first, the head last."""
    import specc
    from specc.analysis.layouts.stages import split
    from specc.parallel.pipeline import chunk_plan

    g = specc.lower(_spec("gpt", 7))
    plan = chunk_plan(g, 3)
    assert [len(c.blocks) for c in plan] == split(7, 3) == [2, 3, 2]
    assert [b for c in plan for b in c.blocks] == list(range(7))
    assert "embed" in plan[0].outer and "pos" in plan[0].outer
    assert "norm_f" in plan[-1].outer and "lm_head" in plan[-1].outer
    assert not plan[1].outer
    # virtual stages: each rank still holds its stage's blocks (what the analyzer prices), in V chunks
    from specc.parallel.pipeline import chunk_sizes

    for blocks, pp, v in ((5, 2, 2), (7, 3, 2), (9, 2, 3), (4, 2, 2)):
        sizes = chunk_sizes(blocks, pp, v)
        assert sum(sizes) == blocks and min(sizes) >= 1
        assert [sum(sizes[r::pp]) for r in range(pp)] == split(blocks, pp)
