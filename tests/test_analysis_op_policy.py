"""Recompute ``op`` is torchtitan's op-level selective checkpointing: what the analyzer keeps per block equals the
bytes of the op outputs torchtitan's policy (tests/train_step_probe.py's ``op_policy``) saves when it is run over
the aten ops torch really calls in a block's forward, and the linears it reruns are the ones the policy
recomputes (bias-free linears are counted ``aten.mm`` calls: every second one is recomputed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils import checkpoint as ck
from torch.utils._python_dispatch import TorchDispatchMode
from train_step_probe import MM, op_policy

import specc
from specc.analysis.layouts import Layout, Training
from specc.analysis.layouts.device_memory import activations_per_microbatch
from specc.analysis.layouts.profile import profile

SETS = ["blocks=2", "d_model=64", "attention.heads=4", "mlp.hidden=96", "context=32", "vocab_size=50"]
BATCH, SEQ = 3, 32


class Calls(TorchDispatchMode):
    """Every aten op a forward runs, in order, with its tensor outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        self.calls.append((func, [t for t in outs if torch.is_tensor(t)]))
        return out


MLA = [
    "attention.latent={kv_rank: 32, q_rank: 48, rope_head_dim: 8, nope_head_dim: 16, v_head_dim: 24}",
    "layer_pattern=null",
    "layer_kinds=null",
    "mlp={type: swiglu, hidden: 96, activation: silu}",
    "position.scaling.original_max_positions=16",
    "dtype=fp32",
]  # v as wide as q/k: torch's CPU flash kernel


@pytest.mark.parametrize(
    ("preset", "extra"), [("gpt2", []), ("llama3.1-8b", ["attention.kv_heads=2"]), ("deepseek-v3", MLA)]
)
def test_op_policy_keeps_what_torch_saves(preset: str, extra: list[str]) -> None:
    g = specc.lower(specc.load_spec(preset, [*SETS, *extra]))
    prof = profile(g, SEQ, None, "fp32", training=True)
    block = [p for _, p in prof.ops if p.in_block]
    blocks = prof.blocks
    st = prof.stages(1)[0]
    kept = (st.op_sharded + st.op_replicated) // blocks
    assert kept * blocks == st.op_sharded + st.op_replicated  # every block alike
    model = specc.build_torch(g).float()
    rec = Calls()
    with rec:
        model.blocks[0](torch.randn(BATCH, SEQ, 64))
    policy, ctx = op_policy(), SimpleNamespace(is_recompute=False)
    saved, rerun_mm, storages = 0, 0, set()
    for func, outs in rec.calls:
        must = policy(ctx, func) == ck.CheckpointPolicy.MUST_SAVE
        rerun_mm += func in MM and not must
        for t in outs if must else ():
            if t.untyped_storage().data_ptr() not in storages:
                storages.add(t.untyped_storage().data_ptr())
                saved += t.untyped_storage().nbytes()
    assert saved == kept * BATCH, (preset, saved, kept * BATCH)
    linears = [p for p in block if p.gemm != (0, 0) and not p.attention]
    expanded = [p for p in block if p.attention and p.op_rerun]  # MLA's kv_b, an aten.mm inside the core
    assert rerun_mm == (sum(p.op_rerun for p in linears) + len(expanded)) / blocks
    if preset == "llama3.1-8b":  # qkv, out, gate, up, down: aten.mm 1…5, the 2nd and 4th recomputed
        assert rerun_mm == 2
    elif preset == "deepseek-v3":  # q_a, q_b, kv_a, kv_b (in the core), out, gate, up, down: 2nd, 4th, 6th, 8th
        assert rerun_mm == 4 and len(expanded) == blocks
    else:  # biased linears are aten.addmm: saved, never counted
        assert rerun_mm == 0 and all(p.op_rerun == 0 for p in linears)


def test_op_policy_with_math_attention_keeps_the_scores() -> None:
    """torch's math SDPA runs as bmm calls, in the save list: the N² scores are kept where the fused kernel keeps
    only its log-sum-exp; the linears' outputs are the same under both."""
    g = specc.lower(specc.load_spec("llama3.1-8b", [*SETS, "attention.kv_heads=2"]))
    prof = profile(g, SEQ, None, "fp32", training=True)
    t = Training(recompute="op", micro_batch=BATCH, global_batch=BATCH)
    flash = activations_per_microbatch(prof, 0, Layout(), t, "flash")
    math = activations_per_microbatch(prof, 0, Layout(), t, "math")
    heads = 4
    lse, scores = heads * SEQ * 4, heads * SEQ * SEQ * 4  # per sequence and block, fp32
    assert math - flash == prof.blocks * BATCH * (scores - lse)
