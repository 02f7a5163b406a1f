"""Llama 4's multimodal dialect: a ``Llama4ForConditionalGeneration`` config.json (``Llama4Config``, the text model
under ``text_config``) imports its text model, the spec ``Llama4ForCausalLM``'s config gives; its checkpoint
(``language_model.*``, the vision tower and projector dropped) loads and computes the conditional model's text
logits; and what its text_config cannot express is refused at that field's own line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID
from test_hf_zoo import STD, build

import specc
from specc import SpecError
from specc.interop import import_hf

transformers = pytest.importorskip("transformers")

TEXT = FAMILY_BY_ID["llama4-chunked"].config
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48, image_size=28)
VISION.update(patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)


def _multimodal(folder: Path) -> tuple[Any, Any]:
    """The conditional model with the text twin's weights (the zoo's std, norms redrawn), saved; and the twin."""
    text = build(FAMILY_BY_ID["llama4-chunked"], std=STD)
    config = transformers.Llama4Config(text_config=text.config.to_dict(), vision_config=VISION)
    config.architectures = ["Llama4ForConditionalGeneration"]
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    missing = model.language_model.load_state_dict(text.state_dict(), strict=True)
    assert not missing.missing_keys
    model.save_pretrained(folder)
    return model, text


def _doc(path: Path) -> dict[str, Any]:
    doc = import_hf(path).document
    return {k: v for k, v in doc.items() if k not in ("name", "source")}


def test_the_multimodal_config_imports_the_text_model(tmp_path: Path) -> None:
    hf, text = _multimodal(tmp_path / "mm")
    text.config.save_pretrained(tmp_path / "text")
    imported = import_hf(tmp_path / "mm")
    assert imported.architecture == "Llama4ForConditionalGeneration"
    assert _doc(tmp_path / "mm") == _doc(tmp_path / "text")
    assert any("vision tower" in n for n in imported.notes)
    assert not any("do not know" in n for n in imported.notes)  # every top-level and text_config field was read

    ids = torch.randint(3, 95, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        # its language model (transformers 5.24's conditional forward fails on a text-only batch: image_outputs)
        want = hf.language_model(input_ids=ids).logits
        got = specc.build_torch(imported.spec, weights=str(tmp_path / "mm" / "model.safetensors"))(ids)
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_a_text_config_field_is_refused_at_its_own_line(tmp_path: Path) -> None:
    config = transformers.Llama4Config(text_config=TEXT, vision_config=VISION)
    config.architectures = ["Llama4ForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data["text_config"]["layer_types"] = ["sliding_attention"] * TEXT["num_hidden_layers"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    with pytest.raises(SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    lines = path.read_text().splitlines()
    inner = next(i for i, line in enumerate(lines) if '"text_config"' in line)
    assert "chunked or full" in d.message
    assert d.line == 1 + next(i for i in range(inner, len(lines)) if '"layer_types"' in lines[i])


def test_import_hf_writes_the_text_spec(cli, tmp_path: Path) -> None:
    config = transformers.Llama4Config(text_config=TEXT, vision_config=VISION)
    config.architectures = ["Llama4ForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    code, _, err = cli("import-hf", tmp_path, "-o", tmp_path / "spec.yaml")
    assert code == 0, err
    spec = specc.load_spec(str(tmp_path / "spec.yaml"))
    assert spec.blocks == TEXT["num_hidden_layers"] and spec.mlp.router.weighs == "input"


ROUND_TRIPPED = {"Llama4ForConditionalGeneration"}  # export-hf writes its text model (test_export_hf's check)


def test_export_hf_writes_the_text_model_of_the_multimodal_checkpoint(tmp_path: Path) -> None:
    """The imported text model exports as Llama4ForCausalLM, which transformers loads with the conditional
    model's text logits."""
    from specc.interop.hf_export import export_hf

    hf, _ = _multimodal(tmp_path / "mm")
    spec = import_hf(tmp_path / "mm").spec
    model = specc.build_torch(spec, weights=str(tmp_path / "mm" / "model.safetensors"))
    state = model.state_dict()
    done = export_hf(spec, {k: state[k] for k in model.graph.params()}, tmp_path / "out")
    assert done.architecture == "Llama4ForCausalLM"
    back = transformers.Llama4ForCausalLM.from_pretrained(done.folder).eval()
    ids = torch.randint(3, 95, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want, got = hf.language_model(input_ids=ids).logits, back(input_ids=ids).logits
    assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())


def test_hub_fields_as_released_configs_write_them(tmp_path: Path) -> None:
    """The hub's dialect as Scout's file writes it: rope_theta + rope_scaling, an explicit moe_layers list and
    attn_temperature_tuning as a number (transformers reads it as truthy); 0 switches the tuning off."""
    fields = {k: v for k, v in TEXT.items() if k not in ("rope_parameters", "interleave_moe_layer_step")}
    fields.update(model_type="llama4_text", architectures=["Llama4ForCausalLM"], rope_theta=500000.0)
    fields.update(rope_scaling=dict(TEXT["rope_parameters"], rope_type="llama3"), moe_layers=[1, 3])
    for tuning, on in ((4, True), (0, False)):
        (tmp_path / "config.json").write_text(json.dumps(dict(fields, attn_temperature_tuning=tuning)), "utf-8")
        s = import_hf(tmp_path).spec
        nope = s.layer_kinds["nope"].attention  # no override at all when the tuning is off
        assert (nope is not None and nope.temperature is not None) == on and s.position.scaling.type == "llama3"
        assert [s.layer_kinds[k].mlp is None for k in s.layer_pattern] == [False, True, False, True]
