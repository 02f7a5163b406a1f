"""README.md's list of Hugging Face classes is the one the importer's registry gives (not hand-kept)."""

from __future__ import annotations

from pathlib import Path

from specc.interop import catalog
from specc.interop.registry import supported_architectures

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_lists_the_registry_s_classes() -> None:
    text = README.read_text(encoding="utf-8")
    assert catalog.replace_block(text) == text, "stale: run python scripts/readme_classes.py"
    block = catalog.markdown()
    assert all(f"`{a}`" in block for a in supported_architectures())
