"""HF checkpoint names → specc names: every family fills exactly the IR's parameters; problems are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_hf_zoo import BY_ID, CASES, build, save

from specc import SpecError, load_spec, lower
from specc.interop import check_names, import_hf, to_specc_names


def _load(case_id: str, tmp_path: Path):
    model, folder = save(BY_ID[case_id], tmp_path)
    spec = import_hf(folder).spec
    return model, lower(spec), load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_saved_checkpoint_fills_every_ir_parameter(case, tmp_path: Path) -> None:
    _, g, tensors = _load(case.id, tmp_path)
    out = to_specc_names(g, tensors)
    params = g.params()
    assert set(out) == set(params)
    assert {k: tuple(v.shape) for k, v in out.items()} == {k: p.shape for k, p in params.items()}


def test_specc_names_pass_through_unchanged(tmp_path: Path) -> None:
    _, g, tensors = _load("gpt2-tied", tmp_path)
    mine = to_specc_names(g, tensors)
    assert to_specc_names(g, mine) is mine


def test_gpt2_conv1d_is_transposed_and_tied_head_dropped(tmp_path: Path) -> None:
    model, g, tensors = _load("gpt2-tied", tmp_path)
    out = to_specc_names(g, tensors)
    attn = model.transformer.h[1].attn
    assert torch.equal(out["blocks.1.attn.qkv.weight"], attn.c_attn.weight.T)
    assert torch.equal(out["blocks.1.mlp.fc2.weight"], model.transformer.h[1].mlp.c_proj.weight.T)
    assert "lm_head.weight" not in out  # tied to embed.weight in the IR
    # old checkpoints: no "transformer." prefix, causal-mask buffers, a stored copy of the tied head
    old = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    old |= {"h.0.attn.bias": torch.ones(1, 1, 64, 64), "h.0.attn.masked_bias": torch.tensor(-1e4)}
    old["lm_head.weight"] = old["wte.weight"].clone()
    assert torch.equal(to_specc_names(g, old)["blocks.1.attn.qkv.weight"], out["blocks.1.attn.qkv.weight"])


def test_gpt2_tied_copy_that_differs_is_refused(tmp_path: Path) -> None:
    _, g, tensors = _load("gpt2-tied", tmp_path)
    tensors["lm_head.weight"] = torch.randn_like(tensors["transformer.wte.weight"])
    with pytest.raises(SpecError, match=r"lm_head\.weight differs from transformer\.wte\.weight"):
        to_specc_names(g, tensors)


def test_llama_split_qkv_packs_q_k_v_in_order(tmp_path: Path) -> None:
    model, g, tensors = _load("llama-gqa", tmp_path)
    out = to_specc_names(g, tensors)
    a = model.model.layers[0].self_attn
    assert torch.equal(out["blocks.0.attn.qkv.weight"], torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
    assert out["blocks.0.attn.qkv.weight"].shape == (32 + 2 * 16, 32)


def test_llama_fused_qkv_and_gate_up_also_load(tmp_path: Path) -> None:
    _, g, tensors = _load("llama-gqa", tmp_path)
    ref = to_specc_names(g, tensors)
    fused = dict(tensors)
    for i in range(2):
        p = f"model.layers.{i}"
        fused[f"{p}.self_attn.qkv_proj.weight"] = torch.cat(
            [fused.pop(f"{p}.self_attn.{x}_proj.weight") for x in "qkv"]
        )
        fused[f"{p}.mlp.gate_up_proj.weight"] = torch.cat(
            [fused.pop(f"{p}.mlp.{x}_proj.weight") for x in ("gate", "up")]
        )
    out = to_specc_names(g, fused)
    assert all(torch.equal(out[k], ref[k]) for k in ref)


def test_mixtral_experts_stack_from_legacy_and_fused_names(tmp_path: Path) -> None:
    model, g, tensors = _load("mixtral-4x2", tmp_path)
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in tensors  # as save_pretrained writes them
    out = to_specc_names(g, tensors)
    moe = model.model.layers[1].mlp
    e, h = 4, 48
    assert out["blocks.1.mlp.experts.w_gate"].shape == (e, h, 32)
    assert torch.equal(out["blocks.1.mlp.experts.w_gate"], moe.experts.gate_up_proj[:, :h])
    assert torch.equal(out["blocks.1.mlp.experts.w_up"], moe.experts.gate_up_proj[:, h:])
    assert torch.equal(out["blocks.1.mlp.experts.w_down"], moe.experts.down_proj)
    assert torch.equal(out["blocks.1.mlp.router.weight"], moe.gate.weight)
    live = {k: v.detach() for k, v in model.state_dict().items()}  # transformers-5 fused in-memory names
    assert "model.layers.0.mlp.experts.gate_up_proj" in live
    fused = to_specc_names(g, live)
    assert all(torch.equal(fused[k], out[k]) for k in out)


def test_bert_names_old_gamma_beta_and_other_heads(tmp_path: Path) -> None:
    model, g, tensors = _load("bert-mlm", tmp_path)
    out = to_specc_names(g, tensors)
    assert torch.equal(out["lm_head.bias"], model.cls.predictions.bias)
    assert torch.equal(out["blocks.1.norm1.weight"], model.bert.encoder.layer[1].attention.output.LayerNorm.weight)
    old = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in tensors.items()
    }
    old["bert.embeddings.position_ids"] = torch.arange(40)[None]
    old["cls.seq_relationship.weight"] = torch.zeros(2, 32)  # BertForPreTraining's NSP head
    with pytest.warns(UserWarning, match="dropping 1 tensors of heads the spec does not build"):
        again = to_specc_names(g, old)
    assert all(torch.equal(again[k], out[k]) for k in out)


def test_bart_positions_keep_offset_rows_and_logits_bias_squeezed(tmp_path: Path) -> None:
    model, g, tensors = _load("bart-tied", tmp_path)
    out = to_specc_names(g, tensors)  # BART's 2 leading rows are the table's position.offset rows: kept as stored
    assert torch.equal(out["encoder.pos.weight"], model.model.encoder.embed_positions.weight)
    assert torch.equal(out["lm_head.bias"], model.final_logits_bias[0])
    assert torch.equal(
        out["decoder.blocks.0.cross_attn.kv.weight"][:32], model.model.decoder.layers[0].encoder_attn.k_proj.weight
    )


def test_vit_positions_and_numpy_arrays(tmp_path: Path) -> None:
    model, g, tensors = _load("vit-cls", tmp_path)
    out = to_specc_names(g, {k: v.numpy() for k, v in tensors.items()})
    assert out["pos.weight"].shape == (17, 32)
    assert (out["pos.weight"] == model.vit.embeddings.position_embeddings[0].detach().numpy()).all()


# ---------------------------------------------------------------------------------------------- problems


def test_missing_misshaped_and_unexpected_are_all_named(tmp_path: Path) -> None:
    _, g, tensors = _load("llama-gqa", tmp_path)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(47, 32)
    tensors["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    with pytest.raises(SpecError) as e:
        to_specc_names(g, tensors)
    text = str(e.value)
    assert "missing tensor: model.layers.1.self_attn.k_proj.weight → blocks.1.attn.qkv.weight" in text
    assert "model.layers.0.mlp.up_proj.weight: shape [47, 32], expected [48, 32] for blocks.0.mlp.up.weight" in text
    assert "unexpected tensor: model.layers.0.self_attn.extra.weight" in text


def test_check_names_reads_shapes_only(tmp_path: Path) -> None:
    _, g, tensors = _load("bart-untied", tmp_path)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    assert check_names(g, shapes) == []
    shapes["model.decoder.layers.1.fc1.weight"] = (47, 32)
    assert ["fc1.weight" in d.message for d in check_names(g, shapes)] == [True]


def test_weights_of_another_family_are_refused(tmp_path: Path) -> None:
    _, _, tensors = _load("gpt2-tied", tmp_path)
    g = lower(load_spec("bert-base", ["blocks=1"]))
    with pytest.raises(SpecError, match=r"GPT-2 weights .* but the spec is a encoder model"):
        to_specc_names(g, tensors)


def test_spec_with_parts_the_checkpoint_lacks_is_refused(tmp_path: Path) -> None:
    _, folder = save(BY_ID["gpt2-tied"], tmp_path)
    spec = load_spec(import_hf(folder).document | {"bias": True})  # head bias: GPT-2 has none
    tensors = load_file(str(folder / "model.safetensors"))
    with pytest.raises(SpecError, match=r"no tensor for lm_head\.bias"):
        to_specc_names(lower(spec), tensors)


def test_unknown_names_are_left_to_the_loader() -> None:
    g = lower(load_spec("gpt2", ["blocks=1"]))
    odd = {"something.else": torch.zeros(1)}
    assert to_specc_names(g, odd) is odd
    assert "unexpected tensor: something.else" in " ".join(d.message for d in check_names(g, {"something.else": (1,)}))


def test_build_is_deterministic() -> None:
    a, b = build(BY_ID["bert-pooled"]), build(BY_ID["bert-pooled"])
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_marian_sinusoids_are_specc_sinusoids_permuted() -> None:
    """The permutation the Marian plan applies along the residual stream (tensor_ops.interleave) maps HF's table
    onto specc's."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from specc.backends.torch.layers import sinusoids
    from specc.interop.tensor_ops import interleave_order

    d = 16
    marian = MarianSinusoidalPositionalEmbedding(20, d).create_weight()
    mine = sinusoids(torch.arange(20), d)
    torch.testing.assert_close(mine, marian[:, interleave_order(d)], atol=1e-6, rtol=0)
    assert not torch.allclose(mine, marian, atol=1e-2)  # the layouts really differ


def test_marian_weights_are_permuted_along_the_residual_stream(tmp_path: Path) -> None:
    model, g, tensors = _load("marian-shared", tmp_path)
    out = to_specc_names(g, tensors)
    from specc.interop.tensor_ops import interleave_order

    order = interleave_order(32)
    enc = model.model.encoder.layers[0]
    assert torch.equal(out["encoder.embed.weight"], model.model.shared.weight[:, order])
    assert torch.equal(out["encoder.blocks.0.attn.out.bias"], enc.self_attn.out_proj.bias[order])
    assert torch.equal(out["encoder.blocks.0.mlp.fc1.weight"], enc.fc1.weight[:, order])
    assert torch.equal(out["encoder.blocks.0.mlp.fc1.bias"], enc.fc1.bias)  # hidden side: unchanged


def test_sharded_checkpoints_read_through_their_index(cli, tmp_path: Path) -> None:
    from specc.interop import safetensors_read as checkpoint

    model = build(BY_ID["llama-gqa"])
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    folder = tmp_path / "sharded"
    assert (folder / "model.safetensors.index.json").is_file() and len(checkpoint.files(folder)) > 1
    g = lower(import_hf(folder).spec)
    assert check_names(g, checkpoint.shapes(folder)) == []
    out = to_specc_names(g, checkpoint.load(folder))
    assert set(out) == set(g.params())
    code, stdout, _ = cli("import-hf", folder, "-o", tmp_path / "s.yaml")
    assert code == 0 and "checked model.safetensors.index.json" in stdout


def test_bart_tables_the_spec_shares_must_be_equal(tmp_path: Path) -> None:
    _, g, tensors = _load("bart-tied", tmp_path)
    shared = tensors.pop("model.shared.weight")
    tensors["model.encoder.embed_tokens.weight"] = shared
    tensors["model.decoder.embed_tokens.weight"] = shared + 1  # stored apart and different: not one table
    with pytest.raises(SpecError, match=r"model\.decoder\.embed_tokens\.weight differs"):
        to_specc_names(g, tensors)
    tensors["model.decoder.embed_tokens.weight"] = shared.clone()
    assert torch.equal(to_specc_names(g, tensors)["encoder.embed.weight"], shared)


def test_sharded_checkpoint_folder_loads(tmp_path) -> None:
    """build_torch reads a save_pretrained folder with shards and an index, not only one file."""
    import json

    from safetensors.torch import save_file

    import specc

    spec = specc.load_spec(
        "gpt2", ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=40", "context=8", "mlp.hidden=32"]
    )
    state = specc.build_torch(spec).state_dict()
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: state[k].contiguous() for k in keys}, str(tmp_path / file))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = specc.build_torch(spec, weights=tmp_path).state_dict()
    assert all(torch.equal(loaded[k], state[k]) for k in names)
