"""A standalone model.py loads specc or Hugging Face tensor names, by a table written from specc's weight plan:
GPT-2 (Conv1D transposes, tied head), Llama (q/k/v concatenated), BART (offset position rows, logits bias),
Marian (the residual stream reordered), GPT-NeoX and Falcon (fused q/k/v regrouped) and GPT-J twins saved with
save_pretrained give HF's logits and tokens; buffers and heads a checkpoint holds beyond the model are skipped by
name; for every family the table builds exactly the tensors specc's own interop builds, and every table op is
its tensor_ops twin."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID
from safetensors.torch import load_file, save_file
from test_hf_zoo import BY_ID, save
from test_torch_cases import CASES, tiny

import specc
from specc.backends.torch import write_model_py
from specc.backends.torch.standalone_names import hf_plan
from specc.interop import import_hf
from specc.interop import weight_map as plans
from specc.interop.names import to_specc_names

pytest.importorskip("transformers")


def _model_py(spec, path: Path) -> ModuleType:
    """model.py written for ``spec`` and imported as a module of its own (it needs no specc)."""
    write_model_py(spec, path)
    loaded = importlib.util.spec_from_file_location(f"_model_py_{path.parent.name}", path)
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module  # dataclass-free, but pickle and typing look modules up by name
    loaded.loader.exec_module(module)
    return module


def _table(model_py: ModuleType) -> tuple:
    return model_py.HF_NAMES, model_py.HOW, model_py.HF_TIED, model_py.HF_SKIP


@pytest.mark.parametrize("case_id", ["gpt2-tied", "llama-gqa"])
def test_model_py_loads_hf_checkpoints_saved_by_save_pretrained(tmp_path: Path, case_id: str) -> None:
    hf, folder = save(BY_ID[case_id], tmp_path)
    weights = folder / "model.safetensors"
    names = set(load_file(str(weights)))
    assert any(n.startswith(("transformer.h.0.attn.c_attn", "model.layers.0.self_attn.q_proj")) for n in names)
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    assert "HF_NAMES" in (tmp_path / "model.py").read_text()
    model = model_py.build(weights=str(weights))  # an absolute path: not beside model.py
    ids = torch.randint(3, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))  # no pad id 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
        hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
        one = ids[:1]
        assert torch.equal(model.generate(one, 6), hf.generate(one, max_new_tokens=6, min_new_tokens=6))

    # the base model's names (no ``transformer.`` / ``model.`` wrapper) load too; stray tensors are refused
    tensors = load_file(str(weights))
    bare = {k.split(".", 1)[1] if k.startswith(("transformer.", "model.")) else k: v for k, v in tensors.items()}
    save_file(bare, str(tmp_path / "bare.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(model_py.build(weights="bare.safetensors")(ids), model(ids))
    save_file({**tensors, "extra.weight": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(ValueError, match=r"extra\.weight"):
        model_py.build(weights="extra.safetensors")


def test_a_tied_copy_must_equal_the_tensor_it_copies(tmp_path: Path) -> None:
    _, folder = save(BY_ID["gpt2-tied"], tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    wte = tensors["transformer.wte.weight"]
    save_file({**tensors, "lm_head.weight": wte.clone()}, str(tmp_path / "same.safetensors"))
    model_py.build(weights="same.safetensors")
    save_file({**tensors, "lm_head.weight": wte + 1}, str(tmp_path / "differ.safetensors"))
    with pytest.raises(ValueError, match=r"lm_head\.weight"):
        model_py.build(weights="differ.safetensors")


def _checkpoints(plan: plans.Plan, graph) -> list[dict[str, torch.Tensor]]:
    """Random HF-named checkpoints for the plan: one with every target's first alternative, one with its last."""
    g = torch.Generator().manual_seed(0)
    out = []
    for pick in (0, -1):
        tensors: dict[str, torch.Tensor] = {}
        for rules in plan.rules.values():
            rule = rules[pick]
            for name, shape in zip(rule.sources, rule.expect, strict=True):
                tensors.setdefault(name, torch.randn(shape, generator=g))
        out.append(tensors)
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_table_builds_what_specc_interop_builds(tmp_path: Path, case: str) -> None:
    spec = tiny(case)
    graph = specc.lower(spec)
    plan = hf_plan(graph)
    if plan is None:
        assert "HF_NAMES" not in write_model_py(spec, tmp_path / "model.py").read_text()
        return
    model_py = _model_py(spec, tmp_path / "model.py")
    root = model_py.build.__annotations__["return"]
    with torch.device("meta"):
        model = (root if isinstance(root, type) else getattr(model_py, root))()
    for tensors in _checkpoints(plan, graph):
        want = to_specc_names(graph, tensors)
        got = model_py.from_hf(model, tensors, *_table(model_py))
        assert set(got) == set(want) == set(model.state_dict())
        for name in want:
            assert torch.equal(got[name], want[name]), name
    specc_named = {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}
    assert model_py.from_hf(model, specc_named, *_table(model_py)) is specc_named


@pytest.mark.parametrize("case_id", ["bart-tied", "bart-untied", "marian-shared", "marian-unshared"])
def test_model_py_loads_encoder_decoder_checkpoints(tmp_path: Path, case_id: str) -> None:
    """BART keeps its 2 leading position rows (position.offset); Marian's [sin | cos] layout becomes specc's
    interleaved one by reordering every tensor along the residual stream (HOW's composed ``>interleave`` ops)."""
    hf, folder = save(BY_ID[case_id], tmp_path)
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    text = (tmp_path / "model.py").read_text()
    assert "HF_NAMES" in text and ((">interleave" in text) == case_id.startswith("marian"))
    model = model_py.build(weights=str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    target = getattr(hf.config, "decoder_vocab_size", None) or hf.config.vocab_size  # Marian may differ
    ids, dec = (torch.randint(3, v, (2, n), generator=g) for v, n in ((hf.config.vocab_size, 7), (target, 5)))
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, dec), hf(input_ids=ids, decoder_input_ids=dec).logits, atol=1e-5, rtol=1e-5
        )
        start = hf.config.decoder_start_token_id
        hf.generation_config.update(eos_token_id=None, forced_eos_token_id=None, do_sample=False, num_beams=1)
        mine = model.generate(ids[:1], 5, decoder_start_token_id=start)
        assert torch.equal(mine, hf.generate(ids[:1], max_new_tokens=5, min_new_tokens=5))


def test_model_py_skips_buffers_and_heads_the_model_does_not_have(tmp_path: Path) -> None:
    """Checkpoints on the Hub carry GPT-2's causal-mask buffers (h.N.attn.bias / masked_bias); a BERT checkpoint
    carries the next-sentence head an MLM spec does not build. Both load; a stray tensor is still refused."""
    hf, folder = save(BY_ID["gpt2-tied"], tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    buffers = {f"transformer.h.{i}.attn.{b}": torch.ones(1, 1, 4, 4) for i in range(2) for b in ("bias", "masked_bias")}
    save_file({**tensors, **buffers}, str(tmp_path / "buffers.safetensors"))
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    ids = torch.randint(3, hf.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            model_py.build(weights="buffers.safetensors")(ids), hf(ids).logits, atol=1e-5, rtol=1e-5
        )
    save_file({**tensors, "transformer.h.0.attn.weird": torch.ones(2)}, str(tmp_path / "stray.safetensors"))
    with pytest.raises(ValueError, match=r"attn\.weird"):
        model_py.build(weights="stray.safetensors")

    bert, bert_folder = save(BY_ID["bert-mlm"], tmp_path / "bert")
    bert_tensors = load_file(str(bert_folder / "model.safetensors"))
    nsp = {
        "cls.seq_relationship.weight": torch.zeros(2, bert.config.hidden_size),
        "cls.seq_relationship.bias": torch.zeros(2),
    }
    save_file({**bert_tensors, **nsp}, str(tmp_path / "bert.safetensors"))
    bert_py = _model_py(import_hf(bert_folder).spec, tmp_path / "bert" / "model.py")
    ids = ids % bert.config.vocab_size
    with torch.no_grad():  # the next-sentence head skipped, the masked-LM logits are HF's
        got = bert_py.build(weights=str(tmp_path / "bert.safetensors"))(ids)
        torch.testing.assert_close(got, bert(ids).logits, atol=1e-5, rtol=1e-5)


def test_an_imported_spec_gets_only_its_own_familys_table(tmp_path: Path) -> None:
    """A GPT-NeoX config's model.py must not carry GPT-2's names (which fit its parameters by renaming but
    would refuse the real checkpoint): it carries NeoX's, its per-head q/k/v as the ``regroup`` table op."""
    _, folder = save(FAMILY_BY_ID["neox-sequential"], tmp_path)
    graph = specc.lower(import_hf(folder).spec)
    assert "GPTNeoXForCausalLM" in graph.meta["source"]
    assert hf_plan(graph).family == "GPT-NeoX"
    text = write_model_py(import_hf(folder).spec, tmp_path / "model.py").read_text()
    assert '"regroup"' in text and "query_key_value" in text and "c_attn" not in text


@pytest.mark.parametrize(
    "case_id",
    ["neox-parallel", "neox-sequential", "gptj-interleaved", "falcon-7b-style", "falcon-40b-style", "falcon-mha-seq"],
)
def test_model_py_loads_fused_qkv_checkpoints(tmp_path: Path, case_id: str) -> None:
    """GPT-NeoX stores q/k/v per head [heads, 3, head_dim], Falcon per KV group [kv, heads/kv + 2, head_dim]
    (one group: multi-query), GPT-J separately with interleaved rotary pairs: their save_pretrained checkpoints
    give HF's logits and greedy tokens through the table (``regroup`` for the fused ones)."""
    hf, folder = save(FAMILY_BY_ID[case_id], tmp_path)
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    assert ('"regroup"' in (tmp_path / "model.py").read_text()) == (not case_id.startswith("gptj"))
    model = model_py.build(weights=str(folder / "model.safetensors"))
    ids = torch.randint(3, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
        hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
        one = ids[:1]
        assert torch.equal(model.generate(one, 6), hf.generate(one, max_new_tokens=6, min_new_tokens=6))


def test_a_fused_checkpoint_of_other_sizes_loads_through_build_config(tmp_path: Path) -> None:
    """The table reads a fused tensor's slices as parts of it (gate | up of Phi-3's gate_up_proj), not as the sizes
    model.py was written for: a file written for one width loads a narrower checkpoint of its family through
    build(config=...), with HF's logits."""
    base = FAMILY_BY_ID["phi3-fused"]
    wide = type(base)(
        base.id + "-wide", base.arch, {**base.config, "intermediate_size": 2 * base.config["intermediate_size"]}
    )
    hf, folder = save(base, tmp_path)
    model_py = _model_py(import_hf(save(wide, tmp_path)[1]).spec, tmp_path / "model.py")
    assert model_py.Config().hidden == 2 * base.config["intermediate_size"]  # the file's own width differs
    assert '"parts"' in (tmp_path / "model.py").read_text()
    config = model_py.Config(hidden=base.config["intermediate_size"])
    model = model_py.build(weights=str(folder / "model.safetensors"), config=config)
    ids = torch.randint(3, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_an_moe_checkpoint_with_fewer_experts_loads_through_build_config(tmp_path: Path) -> None:
    """Experts stored one tensor each are one table name with ``#`` for the expert, stacked as many as the
    parameter has: a file written for 8 experts loads a 4-expert Mixtral checkpoint through build(config=...)."""
    base = BY_ID["mixtral-4x2"]
    wide = type(base)(base.id + "-wide", base.arch, {**base.config, "num_local_experts": 8})
    hf, folder = save(base, tmp_path)
    model_py = _model_py(import_hf(save(wide, tmp_path)[1]).spec, tmp_path / "model.py")
    text = (tmp_path / "model.py").read_text()
    assert model_py.Config().experts == 8 and ".experts.#." in text and ".experts.7." not in text
    model = model_py.build(weights=str(folder / "model.safetensors"), config=model_py.Config(experts=4))
    ids = torch.randint(3, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


def _how(name: str):
    from specc.backends.torch.standalone_names import HOW

    return eval(HOW[name], {"torch": torch})  # the lambda exactly as model.py writes it


def test_every_table_op_is_its_tensor_ops_twin() -> None:
    """model.py's HOW lambdas compute what specc.interop.tensor_ops (the plan's own builders) compute, for torch
    and numpy inputs; every HOW op is checked, so a new one needs its twin here."""
    from specc.backends.torch.standalone_names import HOW
    from specc.interop import tensor_ops as ops

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 6, generator=g), torch.randn(8, 6, generator=g)
    twins = {  # op → (tensors, args, the tensor_ops result on numpy copies)
        "copy": ([x], (), lambda a: a[0]),
        "t": ([x], (), lambda a: ops.transpose(a[0])),
        "cat": ([x, y], (0,), lambda a: ops.cat(a, 0)),
        "stack": ([x, x + 1], (), lambda a: ops.stack(a)),
        "reshape": ([x], ((4, 36),), lambda a: ops.reshape(a[0], (4, 36))),
        "rows": ([x], (2,), lambda a: a[0][2:]),  # plan.rows_from slices
        "parts": ([x], (0, 1, 3, 4), lambda a: ops.narrow(a[0], 0, 6, 18)),  # parts 1:3 of 4 = rows 6:18 of 24
        "interleave": ([x], (1,), lambda a: ops.interleave(a[0], 1)),
        "regroup": ([x], (2, (2, 1, 1)), lambda a: ops.regroup(a[0], 2, (2, 1, 1))),
        "swap": ([x], (), lambda a: ops.swap(a[0])),
        "every": ([x], (1, 1, 2, True), lambda a: ops.swap(ops.every(a[0], 1, 1, 2))),
        "parts_swap": ([x], (1, 1, 2, 3), lambda a: ops.swap(ops.narrow(a[0], 1, 2, 4))),
    }
    assert set(twins) == set(HOW)
    for name, (xs, args, twin) in twins.items():
        got = _how(name)(xs, *args)
        assert torch.equal(got, torch.as_tensor(twin([t.numpy() for t in xs]))), name
        assert torch.equal(got, twin(xs)), name
    experts = torch.randn(3, 4, 6, generator=g)  # GPT-OSS's [E, in, 2·out], the last axis interleaved
    assert torch.equal(_how("every")([experts], 2, 0, 2, False), experts[:, :, 0::2])
    bias = torch.arange(24.0)  # 1-D (a bias) as well
    assert torch.equal(_how("regroup")([bias], 4, (1, 1, 1)), ops.regroup(bias, 4, (1, 1, 1)))


@pytest.mark.parametrize(("heads", "kv"), [(4, 4), (4, 2), (6, 1)])
def test_regroup_is_the_per_group_qkv_order(heads: int, kv: int) -> None:
    """regroup(groups=kv, sizes=(heads/kv, 1, 1)) turns Falcon's [kv, q.. k v, head_dim] rows (GPT-NeoX's
    [heads, 3, head_dim] when kv = heads) into specc's [q heads | k heads | v heads], by head name."""
    from specc.interop.hf_fused_qkv import per_group
    from specc.interop.tensor_ops import regroup

    d, r = 3, heads // kv
    stored = [(w, h) for g in range(kv) for w, h in [*(("q", g * r + j) for j in range(r)), ("k", g), ("v", g)]]
    want = [("q", h) for h in range(heads)] + [(w, g) for w in "kv" for g in range(kv)]
    rows = torch.tensor([[stored.index(b) * 10 + i] for b in want for i in range(d)], dtype=torch.float32)
    hf_rows = torch.tensor([[b * 10 + i] for b in range(len(stored)) for i in range(d)], dtype=torch.float32)
    assert torch.equal(regroup(hf_rows, *per_group(heads, kv)), rows)


@pytest.mark.parametrize("case_id", ["gptoss-sinks", "bloom-alibi", "mpt-alibi", "llama4-chunked"])
def test_model_py_loads_alibi_and_gpt_oss_checkpoints(tmp_path: Path, case_id: str) -> None:
    """BLOOM / MPT (ALiBi) and GPT-OSS (sinks; experts fused [E, in, out] with gate and up interleaved: the
    ``every`` and ``swap`` table ops) and Llama 4 (its experts' gate and up in halves: ``narrow_swap``) load their
    save_pretrained checkpoints and give HF's logits; the layers model.py carries are those the model uses."""
    hf, folder = save(FAMILY_BY_ID[case_id], tmp_path)
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    text = (tmp_path / "model.py").read_text()
    gpt_oss, llama4 = case_id.startswith("gptoss"), case_id.startswith("llama4")
    assert ('"every"' in text, "class SinkAttention" in text, "class AlibiAttention" in text) == (
        gpt_oss,
        gpt_oss,
        not gpt_oss and not llama4,
    )
    assert ('"parts_swap"' in text, "class Temperature" in text) == (llama4, llama4)
    model = model_py.build(weights=str(folder / "model.safetensors"))
    ids = torch.randint(3, hf.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_a_llama_written_from_scratch_keeps_llama_names_and_llama4_gets_its_own() -> None:
    """Llama 4's table names every parameter a plain Llama has (feed_forward for mlp): it is chosen only for a
    spec with a Llama 4 feature, so a Llama preset's model.py still loads Llama checkpoints."""
    assert hf_plan(specc.lower(specc.load_spec("llama2-7b"))).family == "Llama-style"
    assert hf_plan(specc.lower(specc.load_spec("llama4-scout"))).family == "Llama 4"
