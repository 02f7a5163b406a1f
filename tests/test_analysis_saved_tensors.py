"""The analyzer's activations for a training step as specc's torch layers run it on the CPU (``kernels``
``torch-cpu``) against the bytes autograd really saves (``saved_tensors_hooks``, each storage once, as
``train --parallel ... --report`` measures them): within 0.5% for Llama-style models (RMSNorm, SwiGLU, GQA,
RoPE), QK-norm (Qwen3), the (1 + w) norm (Gemma), ALiBi (BLOOM), a top-2 MoE (Mixtral), latent attention
(DeepSeek), soft-capped scores (Gemma 2), attention sinks with clamped SwiGLU experts (GPT-OSS), parallel blocks
(Pythia), chunked attention (Llama 4), a local-window encoder (ModernBERT), encoder-decoders (T5, Flan-T5, the
2017 Transformer) and GPT-2, in fp32 and bf16. One process, tiny models: seconds."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import specc
from specc.analysis.layouts import Layout, Training
from specc.analysis.layouts.run import analyze_layout
from specc.parallel.rank_report import SavedTensors

TINY = ["blocks=2", "d_model=64", "attention.heads=4", "mlp.hidden=128", "context=32", "vocab_size=64", "dtype=fp32"]
CASES = {
    "llama3.1-8b": ["attention.kv_heads=2"],
    "qwen3-8b": ["attention.kv_heads=2"],
    "gemma-7b": ["attention.kv_heads=1", "attention.head_dim=16"],
    "gpt2": [],
    "mixtral-8x7b": ["attention.kv_heads=2"],  # top-2 of 8 SwiGLU experts, sorted dispatch
    # encoder-decoders: cross-attention, T5's relative bias and ReLU (which keeps its output, the next input)
    "t5-base": ["attention.head_dim=16", "position.buckets=8", "position.max_distance=6"],
    "flan-t5-xl": ["attention.head_dim=16", "position.buckets=8", "position.max_distance=6"],
    "transformer-base": [],
    "pythia-1.4b": [],  # parallel attention and MLP: two norms read one residual stream, kept once
    "bloom-176b": [],  # ALiBi: one [1, H, N, N] bias per call, in the compute dtype, shared by the layers
    "modernbert-base": ["layer_kinds.local.attention.window=16", "layer_pattern=[global, local]"],  # encoder
    # chunked attention, NoPE layers, shared + routed experts
    "llama4-scout": ["attention.kv_heads=2", "mlp.experts=4", "layer_kinds.rope.attention.chunk=16",
                     "layer_pattern=[rope, nope]"],
    # soft-capped scores and sliding windows: torch's explicit softmax
    "gemma2-9b": ["attention.kv_heads=2", "attention.head_dim=16", "layer_kinds.sliding.attention.window=16"],
    # attention sinks (the explicit softmax) and clamped SwiGLU experts
    "gpt-oss-20b": ["attention.kv_heads=2", "attention.head_dim=16", "mlp.experts=4", "mlp.active=2",
                    "layer_kinds.sliding.attention.window=16"],
    # latent attention, dense: v as wide as q/k, as torch's CPU SDPA has a fused kernel for that alone
    "deepseek-v3": ["attention.latent={kv_rank: 32, q_rank: 48, rope_head_dim: 8, nope_head_dim: 16, v_head_dim: 24}",
                    "layer_pattern=null", "layer_kinds=null", "mlp={type: swiglu, hidden: 128, activation: silu}",
                    "position.scaling.original_max_positions=16"],
}  # fmt: skip
B, N, N_DEC = 4, 32, 24


def _measured(g: object, device: str = "cpu") -> int:
    """Bytes autograd keeps in one training step on ``device`` (bench/saved_tensors.py --device cuda on a GPU)."""
    torch.manual_seed(0)
    model = specc.build_torch(g, device=device).train()  # a training step: dropout and routers as in training
    ids = target = torch.randint(0, 64, (B, N)).to(device)  # drawn on the CPU: the same ids on any device
    inputs = {"input_ids": ids}
    if "decoder_input_ids" in g.inputs:  # type: ignore[attr-defined]
        inputs["decoder_input_ids"] = target = torch.randint(0, 64, (B, N_DEC)).to(device)
    saved = SavedTensors({p.untyped_storage().data_ptr() for p in model.parameters()})
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        logits = model(**inputs)
        logits = logits if torch.is_tensor(logits) else logits[0]
        # the loss in fp32, as specc's training loop computes it
        torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten()).backward()
    return saved.peak


def _predicted(g: object, kernels: str, dtype: str = "fp32") -> int:
    t = Training(micro_batch=B, global_batch=B, attention="flash", kernels=kernels)
    cost = analyze_layout(g, Layout(), training=t, is_training=True, seq=N, dec_seq=N_DEC, dtype=dtype)
    return int(cost.stages[0]["activations"])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", sorted(CASES))
def test_torch_cpu_activations_are_what_autograd_saves(preset: str, dtype: str) -> None:
    """bf16 as well: specc's RMSNorm normalises in fp32 there on any device (the fp32 input and rstd kept)."""
    g = specc.lower(specc.load_spec(preset, [*TINY, *CASES[preset], f"dtype={dtype}"]))
    measured = _measured(g)
    assert _predicted(g, "torch-cpu", dtype) == pytest.approx(measured, rel=0.005), (preset, dtype)
    # fused kernels keep less than torch's eager ops (rotary copies, gated MLPs, composite norms): the setting is
    # what closes the gap; LayerNorm + GELU/ReLU models without rotary keep about the same either way
    if preset not in ("gpt2", "transformer-base", "bloom-176b"):
        assert _predicted(g, "fused", dtype) < 0.85 * measured, (preset, dtype)


CPU_MATH = {
    "bert-base": [],  # dropout 0.1: the CPU's masks in fp32, attention dropout on SDPA's math path
    "gpt2": ["dropout=0.1"],
    # latent attention with V narrower than Q/K: no fused CPU kernel
    "deepseek-v3": [c.replace("v_head_dim: 24", "v_head_dim: 16") for c in CASES["deepseek-v3"]],
}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("preset", sorted(CPU_MATH))
def test_cores_without_a_fused_cpu_kernel_keep_what_the_math_path_keeps(preset: str, dtype: str) -> None:
    """torch's CPU SDPA has no fused kernel for dropout or for V of another width than Q/K: those cores run the
    math path (scores kept, in fp32 whatever the dtype) although flash is asked for; CPU dropout elsewhere keeps
    its mask in the input's dtype."""
    g = specc.lower(specc.load_spec(preset, [*TINY, *CPU_MATH[preset], f"dtype={dtype}"]))
    assert _predicted(g, "torch-cpu", dtype) == pytest.approx(_measured(g), rel=0.005), (preset, dtype)


def test_torch_kernels_differ_from_torch_cpu_by_the_composite_rms_norm_alone() -> None:
    """On a GPU torch's rms_norm is one fused kernel (input and rstd): ``torch`` drops exactly the composite's
    extra of each nn.RMSNorm (x·rstd in fp32; rstd both keep); the (1 + w) norm is specc's own composite on any
    device and is kept. LayerNorm's mean and rstd per row: fp32 on a GPU, the weights' dtype on the CPU."""
    g = specc.lower(specc.load_spec("llama3.1-8b", [*TINY, "attention.kv_heads=2"]))
    gap = _predicted(g, "torch-cpu") - _predicted(g, "torch")
    norms = 2 * 2 + 1  # two per block, the final one
    x = B * N * 64 * 4
    assert gap == norms * (2 * x - x)  # fp32 x and x·rstd, less the input counted
    gpt2 = specc.lower(specc.load_spec("gpt2", [*TINY, "dtype=bf16"]))
    stats = 5 * 2 * B * N  # five LayerNorms, mean and rstd per row
    assert _predicted(gpt2, "torch", "bf16") - _predicted(gpt2, "torch-cpu", "bf16") == stats * (4 - 2)
    gemma = specc.lower(specc.load_spec("gemma-7b", [*TINY, "attention.kv_heads=1", "attention.head_dim=16"]))
    assert _predicted(gemma, "torch-cpu") == _predicted(gemma, "torch")


def test_unknown_kernels_are_refused() -> None:
    from specc.analysis.layouts.layout import LayoutError, check_training

    with pytest.raises(LayoutError, match="kernels eager is unknown"):
        check_training(Layout(), replace(Training(), kernels="eager"), True)


def test_gathered_logits_are_kept_whole_on_each_tp_rank() -> None:
    """``loss_parallel`` off (the head's output gathered on every tp rank, as specc's runtime computes the loss):
    the last stage keeps all the fp32 logits, not 1/tp of them; the other stage is unchanged."""
    g = specc.lower(specc.load_spec("gpt2", TINY))

    def stages(loss_parallel: bool) -> list[int]:
        t = Training(micro_batch=B, global_batch=B, attention="flash", loss_parallel=loss_parallel)
        cost = analyze_layout(g, Layout(tp=2, pp=2), training=t, is_training=True, seq=N, dtype="fp32")
        return [int(s["activations"]) for s in cost.stages]

    whole, split = stages(False), stages(True)
    assert whole[0] == split[0]
    logits = B * N * 64 * 4  # micro-batches in flight on the last stage: one
    assert whole[1] - split[1] == logits - logits // 2


def test_the_encoder_output_every_cross_attention_keeps_counts_once_per_stage() -> None:
    """Each decoder layer's cross-attention K/V projection keeps the encoder's output for its backward: one tensor
    (autograd keeps its storage once), so a pipeline stage holding decoder layers counts it once, however many."""
    from specc.analysis.costs import Ctx
    from specc.analysis.layouts.profile import profile
    from specc.analysis.op_costs import evaluate

    g = specc.lower(specc.load_spec("transformer-base", [*TINY, "blocks=4"]))  # encoder: blocks 0-3, decoder 4-7
    costs = evaluate(g, {"B": 1, "N": N, "N_dec": N_DEC}, Ctx(bytes=4))
    kv = [c.mem.saved for c in costs if c.op.name.endswith("cross_attn.kv")]
    assert kv == [N * 64 * 4, 0, 0, 0]  # one device (the per-op table, `specc analyze`): the first reader keeps it
    prof = profile(g, N, N_DEC, "fp32", True)
    one = N * 64 * 4  # batch 1: the encoder output, fp32
    for pp, with_decoder in ((1, [True]), (2, [False, True]), (4, [False, False, True, True])):
        for stage, has in zip(prof.stages(pp), with_decoder, strict=True):
            shared = {p.shared_input for p, _ in stage.ops if p.shared_input[1]}
            assert shared == ({("encoder.blocks.3.norm2", one)} if has else set()), (pp, shared)
    # four stages: the two holding decoder layers keep a copy each (it is sent to both), one stage: one copy
    assert sum(s.saved_replicated for s in prof.stages(4)) - prof.stages(1)[0].saved_replicated == one
    assert sum(s.full_kept for s in prof.stages(4)) - prof.stages(1)[0].full_kept == one  # a checkpoint input


def test_rope_tables_once_per_configuration_window_masks_per_layer_token_ids_per_lookup() -> None:
    """specc's torch layers build a rotary configuration's cos and sin [1, 1, N, dims / 2] once per call for every
    layer of it (ModernBERT: a global and a local theta, two pairs); a windowed core's boolean mask is kept by SDPA
    as an additive one in the dtype, per layer; each embedding lookup keeps its int64 ids (the 2017 Transformer:
    the source's and the target's), T5's relative bias its buckets once per stack and call."""
    from specc.analysis.layouts.profile import profile

    bert = specc.lower(specc.load_spec("modernbert-base", [*TINY, *CASES["modernbert-base"]]))
    stage = profile(bert, N, None, "bf16", True).stages(1)[0]
    assert stage.rope_tables == 2 * N * 16 * 2  # two configurations, head_dim 16, bf16
    assert stage.masks == N * N * 2  # the one local layer's window, as SDPA's additive bf16 mask
    llama = specc.lower(specc.load_spec("llama3.1-8b", [*TINY, *CASES["llama3.1-8b"]]))
    assert profile(llama, N, None, "fp32", True).stages(1)[0].rope_tables == N * 16 * 4  # one for all layers
    t = specc.lower(specc.load_spec("transformer-base", TINY))
    assert profile(t, N, N_DEC, "fp32", True).stages(1)[0].token_ids == (N + N_DEC) * 8
    assert profile(t, N, N_DEC, "fp32", True).stages(1)[0].rope_tables == 0  # sinusoidal positions
    t5 = specc.lower(specc.load_spec("t5-base", [*TINY, *CASES["t5-base"]]))
    stage = profile(t5, N, N_DEC, "fp32", True).stages(1)[0]
    assert stage.call_ids == (N * N + N_DEC * N_DEC) * 8  # each stack's bucket per query–key pair, not × batch
    from specc.analysis.costs import Ctx
    from specc.analysis.op_costs import evaluate

    scales = [c for c in evaluate(t5, {"B": 1, "N": N, "N_dec": N_DEC}, Ctx(bytes=4)) if c.op.kind == "scale"]
    assert scales and all(c.mem.saved == 0 for c in scales)  # the head's x · d^-½: its backward needs no tensor
