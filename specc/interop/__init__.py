"""Interop with Hugging Face: config.json → spec (``import_hf``), checkpoint names → specc names, and back
(``export_hf``: spec and weights → a folder transformers loads)."""

from __future__ import annotations

from .hf_export import Exported, export_hf
from .hf_import import Imported, import_hf
from .names import check_names, to_specc_names

__all__ = ["Exported", "Imported", "check_names", "export_hf", "import_hf", "to_specc_names"]
