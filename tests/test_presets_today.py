"""Presets of today's open models: parameter counts exact against the published figures (analyzer only, never
allocating), and each preset is what ``specc import-hf`` makes of its source's released config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_hub_configs import HUB_CONFIGS

from specc import load_spec
from specc.analysis import analyze
from specc.interop import import_hf

PUBLISHED = {
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "phi3-mini-4k": 3_821_079_552,
}


@pytest.mark.parametrize(("preset", "count"), PUBLISHED.items())
def test_published_parameter_counts(preset: str, count: int) -> None:
    r = analyze(preset, crossover=False)
    assert r.params.total == count
    assert load_spec(preset).source  # every preset names where its numbers come from


# what a preset states beyond the architecture (and import-hf's training-only defaults)
_NOT_ARCHITECTURE = {"name", "source", "description", "init", "dropout"}


@pytest.mark.parametrize("preset", HUB_CONFIGS)
def test_preset_is_the_import_of_its_source_config(preset: str, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HUB_CONFIGS[preset], indent=2), encoding="utf-8")
    imported = import_hf(path).spec.model_dump(exclude=_NOT_ARCHITECTURE)
    assert imported == load_spec(preset).model_dump(exclude=_NOT_ARCHITECTURE)
