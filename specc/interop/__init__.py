"""Interop with Hugging Face: config.json → spec (``import_hf``), checkpoint names → specc names."""

from __future__ import annotations

from .hf_import import Imported, import_hf
from .names import check_names, to_specc_names

__all__ = ["Imported", "check_names", "import_hf", "to_specc_names"]
