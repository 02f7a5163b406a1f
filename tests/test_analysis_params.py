"""Parameter counts from the analyzer against published figures and the graph itself."""

from __future__ import annotations

import pytest

import specc
from specc.analysis import analyze


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ("gpt2", 124_439_808),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
        # Brown et al. 2020 print "175.0B" for 96 layers, d_model 12288, 96 heads, context 2048 with GPT-2's
        # layout and 50257-token vocabulary. That architecture has exactly 96·(12·12288² + 13·12288) =
        # 173,961,535,488 block parameters + 50257·12288 token and 2048·12288 position embeddings (tied head)
        # = 174,604,259,328. "175.0B" is a rounded nominal size: even an untied head (+617,558,016) gives
        # 175.22B, so no layout reproduces 175.0B exactly.
        ("gpt3-175b", 174_604_259_328),
        # Vaswani et al. 2017 report ≈213M for the big model; with the 37000-token shared BPE vocabulary of
        # WMT'14 En-De (one matrix for encoder, decoder and pre-softmax) the model has 214,245,376.
        ("transformer-big", 214_245_376),
        ("llama2-7b", 6_738_415_616),
        ("vit-b16", 86_567_656),
    ],
)
def test_published_counts(preset: str, expected: int) -> None:
    r = analyze(preset, crossover=False)
    assert r.params.total == expected
    assert r.to_dict()["params"]["total"] == expected


def test_moe_total_and_active() -> None:
    p = analyze("mixtral-8x7b", crossover=False).params
    assert p.total == 46_702_792_704  # "46.7B" (Jiang et al. 2024)
    assert p.active == 12_879_925_248  # "12.9B active": 2 of 8 experts + everything shared
    # active = total − (E − A)/E of the expert weights
    experts = p.by_category["mlp"]
    assert p.total - p.active == experts * 6 // 8


def test_split_adds_up_and_matches_the_graph() -> None:
    for preset in ("gpt2", "bert-base", "transformer-base", "vit-b16", "gru-bahdanau", "llama2-7b"):
        g = specc.lower(specc.load_spec(preset))
        p = analyze(g, crossover=False).params
        assert p.total == g.num_params()
        assert p.embedding + p.non_embedding == p.total
        assert sum(p.by_category.values()) == p.total


def test_tied_head_is_not_counted_twice() -> None:
    tied = analyze("gpt2", crossover=False).params
    untied = analyze(specc.load_spec("gpt2", ["tie_embeddings=false"]), crossover=False).params
    assert untied.total - tied.total == 50257 * 768
    assert (tied.head, untied.head) == (0, 50257 * 768)


@pytest.mark.parametrize("case_id", ["bart-tied", "bart-untied", "marian-shared", "marian-unshared"])
def test_imported_bart_and_marian_count_parameters_as_transformers(cli, tmp_path, case_id: str) -> None:
    """params.total of an imported model is HF num_parameters(); the differences are their own keys."""
    import json

    from test_hf_zoo import BY_ID, save

    model, folder = save(BY_ID[case_id], tmp_path / "hf")
    spec = tmp_path / "spec.yaml"
    assert cli("import-hf", folder, "-o", spec)[0] == 0
    code, out, err = cli("analyze", spec, "--format", "json")
    assert code == 0, err
    p = json.loads(out)["params"]
    g = specc.lower(specc.load_spec(spec))
    assert p["total"] == model.num_parameters()
    assert p["trainable"] == model.num_parameters(only_trainable=True)
    assert p["stored"] == g.num_params() == p["total"] - p["frozen"] - p["unused"] + p["buffers"]
    assert p["reference"] == f"transformers {BY_ID[case_id].arch}"
    assert p["buffers"] == model.final_logits_bias.numel()  # an HF buffer, specc's lm_head.bias
    if case_id.startswith("marian"):
        frozen = sum(t.numel() for n, t in model.named_parameters() if not t.requires_grad)
        assert p["frozen"] == frozen > 0 and p["unused"] == 0
    else:
        untied = not model.config.tie_word_embeddings  # the `shared` table neither stack reads
        assert p["frozen"] == 0 and p["unused"] == (model.model.shared.weight.numel() if untied else 0)


def test_native_specs_have_no_reference_adjustments() -> None:
    p = analyze("transformer-base", crossover=False).to_dict()["params"]
    assert p["total"] == p["stored"] == p["trainable"]
    assert (p["frozen"], p["unused"], p["buffers"], p["reference"]) == (0, 0, 0, None)
