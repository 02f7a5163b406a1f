"""``specc analyze --plan`` returns only layouts ``torchrun -m specc train --parallel`` runs: every plan passes
the checks the runtime makes before any work, and what the search left out is counted, with its reason."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch.distributed as dist
from test_parallel_torch_cli import _plain_kernels, torchrun  # noqa: F401 (an autouse fixture)

import specc
from specc.analysis.layouts.search import layouts, plan
from specc.analysis.layouts.support import runtime_facts, runtime_gap
from specc.errors import SpecError
from specc.parallel import check_tensor_parallel, launch
from specc.parallel.expert_parallel import check_expert_parallel
from specc.parallel.pipeline import check_pipeline

Cli = Callable[..., tuple[int, str, str]]
SPECS = {
    "gpt2 (dense, tied head)": ("gpt2", []),
    "llama-like GQA": ("llama3.1-8b", ["blocks=8", "context=2048"]),
    "mixtral (MoE, load-balancing loss)": ("mixtral-8x7b", ["blocks=8", "d_model=1024", "mlp.hidden=1024"]),
    "mixtral without the loss": ("mixtral-8x7b", ["blocks=8", "d_model=1024", "mlp.hidden=1024",
                                                  "mlp.router.aux_loss_coef=0"]),
    "gpt-oss (experts with biases)": ("gpt-oss-20b", ["blocks=4", "context=2048"]),
    "deepseek-v3 (latent attention, shared expert)": ("deepseek-v3", ["blocks=4", "mlp.experts=16", "context=2048",
                                                                       "layer_pattern=[dense, moe, moe, moe]"]),
    "transformer-base (encoder-decoder)": ("transformer-base", []),
}  # fmt: skip


def _runtime_accepts(g: specc.LayerGraph, text: str, micro_batches: int) -> None:
    """What ``specc train --parallel`` checks before any work, in its order; raises SpecError."""
    layout = launch.parse_layout(text)
    launch.check_runnable(g, layout, micro_batches)
    dp, tp, pp, ep = layout["dp"], layout["tp"], layout["pp"], layout["ep"]
    if pp > 1:
        check_pipeline(g, pp, "1f1b", 1, micro_batches, dp, tp)
    if ep > 1:
        check_expert_parallel(g, ep, dp, tp)
    check_tensor_parallel(g, tp)


@pytest.mark.parametrize("what", list(SPECS))
def test_every_planned_layout_passes_the_runtime_checks(what: str) -> None:
    name, sets = SPECS[what]
    g = specc.lower(specc.load_spec(name, sets))
    seen, left_out = set(), 0
    for devices in (8, 16, 64):
        r = plan(g, devices, training=True, device="h200", top=10**6)
        for c in r.plans:
            lay = c.layout
            _runtime_accepts(g, lay.text(), c.micro_batches)
            if lay.pp > 1:  # torch's Schedule1F1B refuses fewer micro-batches than stages
                assert c.micro_batches >= lay.pp
            seen.add((lay.tp > 1, lay.pp > 1, lay.ep > 1))
        d = r.to_dict()["excluded"]
        assert d["layouts"] == sum(e["layouts"] for e in d["reasons"])
        left_out += d["layouts"]
        for e in d["reasons"]:  # each reason's example is refused by the runtime, and analyze sizes it
            with pytest.raises(SpecError):
                _runtime_accepts(g, e["example"], 10**3)
    assert seen, f"{what}: no layout fits; the check saw nothing"
    assert left_out > 0  # every one of these has layouts the analyzer sizes and train does not run (cp > 1 at least)


def test_the_rule_refuses_what_the_runtime_refuses() -> None:
    """Each layout the analyzer accepts and the shared rule passes is accepted by the runtime's own checks, and
    the layouts the rule refuses include every kind the issue names."""
    g = specc.lower(specc.load_spec("mixtral-8x7b", ["blocks=8", "mlp.router.aux_loss_coef=0"]))
    facts = runtime_facts(g)
    kinds = set()
    for lay in layouts(g, 64, 512):
        gap = runtime_gap(lay, facts)
        if gap is None:
            _runtime_accepts(g, lay.text(), 64)
        else:
            kinds.add(gap.kind)
    assert {"cp > 1", "ep > 1 with pp > 1", "1 < ep < dp with tp > 1"} <= kinds
    gap = runtime_gap(specc.analysis.layouts.Layout(pp=4, dp=2), facts, micro_batches=2)
    assert gap is not None and gap.kind == "micro-batches < pp"
    assert runtime_gap(specc.analysis.layouts.Layout(pp=4, dp=2), facts, 2, schedule="gpipe") is None


def test_an_embedding_shared_between_stacks_is_planned_over_tp() -> None:
    """One table for both stacks and the head (transformer-base, T5) splits by vocabulary like a lone one: the
    plan returns tp layouts with the tables shared or apart, and the runtime's checks accept them."""
    for shared in (True, False):
        g = specc.lower(specc.load_spec("transformer-base", [f"shared_embeddings={str(shared).lower()}"]))
        r = plan(g, 8, training=True, device="h200", top=10**6)
        assert any(p.layout.tp > 1 for p in r.plans)
        assert runtime_gap(specc.analysis.layouts.Layout(tp=2), runtime_facts(g)) is None
        check_tensor_parallel(g, 2)


def test_plan_json_and_text_name_what_they_left_out(cli: Cli) -> None:
    code, out, err = cli("analyze", "gpt2", "--plan", "--devices", "16", "--training", "-f", "json")
    assert code == 0, err
    d = json.loads(out)
    assert {"devices", "considered", "fitting"} <= set(d["search"]) and d["plans"]
    excluded = d["search"]["excluded"]
    reasons = {e["reason"]: e for e in excluded["reasons"]}
    assert "cp > 1" in reasons and excluded["layouts"] >= reasons["cp > 1"]["layouts"] > 0
    assert all(p["cp"] == 1 for p in d["plans"])
    code, out, err = cli("analyze", "gpt2", "--parallel", reasons["cp > 1"]["example"], "--training")
    assert code == 0, err  # sized, not refused
    code, out, _ = cli("analyze", "gpt2", "--plan", "--devices", "16", "--training")
    assert code == 0 and "not run by specc train --parallel: cp > 1 (" in out


def test_train_refuses_a_graph_gap_before_any_work(cli: Cli, tmp_path, monkeypatch) -> None:
    """tp over experts with biases (GPT-OSS) is one line and exit 2 before a process group starts."""
    monkeypatch.setattr(launch, "STARTED", False)  # an earlier in-process run in this worker may have set it
    sets = ["blocks=2", "d_model=64", "attention.heads=4", "attention.kv_heads=2", "attention.head_dim=16",
            "mlp.hidden=32", "mlp.experts=4", "vocab_size=64", "context=256"]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    text = tmp_path / "t.txt"
    text.write_text("abc " * 40, encoding="utf-8")
    code, _, err = cli("train", "gpt-oss-20b", *args, "--task", "lm", "--text", text, "--steps", "1",
                       "--parallel", "tp=2", "-o", tmp_path / "ck")  # fmt: skip
    assert code == 2 and "tensor parallelism of experts with biases is not run" in err and "Traceback" not in err, err
    assert not launch.STARTED


MLA = ["blocks=2", "d_model=32", "attention.heads=4", "vocab_size=50", "context=64", "dtype=fp32",
       "attention.latent={kv_rank: 16, q_rank: 24, rope_head_dim: 8, nope_head_dim: 12, v_head_dim: 10}",
       "mlp.hidden=16", "mlp.experts=8", "mlp.active=3", "mlp.router.groups=2", "mlp.router.top_groups=1",
       "mlp.shared.hidden=16", "layer_kinds.dense.mlp.hidden=48", "layer_pattern=[dense, moe]",
       "position.scaling.original_max_positions=16"]  # fmt: skip


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_planned_pp2_of_a_deepseek_like_model_trains_as_one_process(cli: Cli, tmp_path) -> None:
    """The plan returns pp layouts for DeepSeek-V3 (latent attention, a dense block before the MoE ones, whose
    generated forward indexes its blocks); pp=2 under torchrun ends with the one-process weights."""
    from specc.train import training_checkpoint as C

    g = specc.lower(specc.load_spec("deepseek-v3", MLA))
    assert any(p.layout.pp == 2 and p.layout.tp == 1 for p in plan(g, 2, training=True, top=100).plans)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 12), encoding="utf-8")
    args = [a for s in MLA for a in ("--set", s)]
    args += ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "12", "--eval-size", "8", "--steps", "2"]
    args += ["--schedule", "constant", "--warmup", "0", "--device", "cpu"]
    code, _, err = cli("train", "deepseek-v3", *args, "-o", tmp_path / "one.safetensors")
    assert code == 0, err
    run = torchrun(2, "train", "deepseek-v3", *args, "--parallel", "pp=2", "-o", tmp_path / "pp")
    assert run.returncode == 0, run.stderr[-3000:]
    one, got = C.load(tmp_path / "one.safetensors").weights, C.load(tmp_path / "pp").weights
    assert set(one) == set(got) and max(float((one[k] - got[k]).abs().max()) for k in one) < 1e-5


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma2-9b", "gemma3-1b", "llama2-7b"])
def test_a_character_lm_keeps_the_spec_but_its_vocabulary(name: str) -> None:
    """``specc train --task lm`` re-validates the spec with the text's vocabulary; layer kinds that inherit
    fields (None in a dump) used to fail there with a traceback, so GPT-OSS and Gemma could not train at all."""
    from specc.train.loop import resolve_lm_spec
    from specc.train.vocab import Vocab

    spec = specc.load_spec(name)
    got = resolve_lm_spec(spec, Vocab(tuple("abcdefg")))
    assert got.model_dump() == {**spec.model_dump(), "vocab_size": 7}
