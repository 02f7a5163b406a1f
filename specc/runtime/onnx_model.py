"""An exported specc model opened for inference: its session(s), the spec from the metadata, its I/O.

The files go through ``specc.io.read`` (regular files only; the RNN decoder-step graph a model names must be a bare
file name beside it), and specc's metadata is checked before it is used: JSON objects with the types the
exporter writes. A model without specc metadata (exported by other tools) runs with what its graph declares.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecError
from ..io import read
from ..spec.serialize import SPEC_KEY
from .ort_session import open_session

ROLES = ("model", "encoder", "decoder_step", "decoder")
# facts of the lowered graph the runtime reads from ``specc.ir_meta``: each a positive whole number or null
IR_COUNTS = ("vocab_size", "target_vocab_size", "type_vocab_size", "max_positions", "context", "rebuild_cache_after")

ORT_TYPES = {
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(bool)": np.bool_,
}


@dataclass(frozen=True)
class IOSpec:
    name: str
    dtype: Any  # numpy dtype (None for types numpy lacks, e.g. bfloat16)
    type_name: str
    shape: tuple[int | str | None, ...]
    optional: bool = False  # an input with a default value (onnxruntime's overridable initializer)


@dataclass
class OrtModel:
    """``sessions['model']`` for Transformer exports; ``'encoder'`` and ``'decoder_step'`` for RNN seq2seq;
    ``'encoder'`` and ``'decoder'`` for encoder-decoder KV-cache exports (graph_encdec.py)."""

    path: Path
    sessions: dict[str, Any]
    provider: str
    meta: dict[str, str]
    spec: dict[str, Any] = field(default_factory=dict)
    ir_meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], provider: str = "auto", threads: int | None = None, verbose: bool = False
    ) -> OrtModel:
        path = Path(path)
        read.regular_file(path, "an ONNX model", read.ONNX_BYTES)
        sess, active = open_session(path, provider, threads, verbose)
        meta = dict(sess.get_modelmeta().custom_metadata_map)
        role = meta.get("specc.role", "model")
        if role not in ROLES:
            raise SpecError(f"metadata 'specc.role' is {role[:40]!r}, not one of {', '.join(ROLES)}", file=str(path))
        sessions = {role: sess}
        if role == "decoder_step":
            raise SpecError(
                f"{path.name} is the one-step decoder of an RNN seq2seq export",
                hint=f"run the encoder file {meta.get('specc.encoder', '')[:80]} instead",
            )
        if role == "decoder":
            raise SpecError(
                f"{path.name} is the decoder of an encoder-decoder export",
                hint=f"run the encoder file {meta.get('specc.encoder', '')[:80]} instead (it drives both)",
            )
        if role == "encoder":
            other = "decoder" if "specc.decoder" in meta else "decoder_step"
            step = read.sibling(path.parent, meta.get(f"specc.{other}", ""), str(path), f"metadata 'specc.{other}'")
            if not step.exists():
                raise SpecError(f"the {other.replace('_', ' ')} graph {step.name} is missing beside {path.name}",
                                file=str(path))  # fmt: skip
            read.regular_file(step, "an ONNX model", read.ONNX_BYTES)
            sessions[other], _ = open_session(step, active_name(active), threads, verbose)
        model = cls(path, sessions, active, meta)
        model.spec = _metadata_object(meta, SPEC_KEY, str(path))
        model.ir_meta = check_ir_meta(_metadata_object(meta, "specc.ir_meta", str(path)), str(path))
        return model

    # -- facts ----------------------------------------------------------------------------------------

    @property
    def role(self) -> str:
        return self.meta.get("specc.role", "model")

    @property
    def family(self) -> str:
        return self.meta.get("specc.family", "")

    @property
    def split_decoder(self) -> bool:
        """An encoder-decoder export whose decoder graph carries the self and cross caches."""
        return "decoder" in self.sessions

    @property
    def main(self) -> Any:
        return self.sessions["encoder" if self.role == "encoder" else "model"]

    @property
    def kv_cache(self) -> bool:
        return any(i.name.startswith("past_key_values.") for i in self.main.get_inputs())

    def vocab(self, name: str) -> int | None:
        """Vocabulary an id input indexes (from the lowered graph's facts in the metadata); None when unknown."""
        m = self.ir_meta
        if name == "decoder_input_ids":
            return m.get("target_vocab_size") or m.get("vocab_size")
        if name == "token_type_ids":
            return m.get("type_vocab_size")
        if name == "input_ids":
            return m.get("vocab_size")
        return None

    @property
    def max_positions(self) -> int | None:
        """Longest sequence a stack can read: the learned position table's size (None: unbounded)."""
        return self.ir_meta.get("max_positions")

    def inputs(self, role: str | None = None) -> list[IOSpec]:
        """Required inputs, then the optional ones (``position_ids``: onnxruntime lists an input with a default
        value among the overridable initializers, not the inputs)."""
        sess = self.sessions[role] if role else self.main
        required = [IOSpec(i.name, ORT_TYPES.get(i.type), i.type, tuple(i.shape)) for i in sess.get_inputs()]
        optional = [
            IOSpec(i.name, ORT_TYPES.get(i.type), i.type, tuple(i.shape), optional=True)
            for i in sess.get_overridable_initializers()
        ]
        return required + optional

    def outputs(self, role: str | None = None) -> list[str]:
        sess = self.sessions[role] if role else self.main
        return [o.name for o in sess.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray], role: str | None = None) -> dict[str, np.ndarray]:
        sess = self.sessions[role] if role else self.main
        try:
            values = sess.run(None, feeds)
        except Exception as e:  # onnxruntime's own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecError(f"onnxruntime failed: {first}") from None
        return dict(zip(self.outputs(role), values, strict=True))


def _metadata_object(meta: dict[str, str], key: str, file: str) -> dict[str, Any]:
    text = meta.get(key)
    if text is None:
        return {}
    if len(text) > read.METADATA_BYTES:
        raise SpecError(f"metadata {key!r} is {len(text):,} characters; at most {read.METADATA_BYTES:,}", file=file)
    value = read.parse_json(text, file, f"metadata {key!r}", located=False)
    return read.json_object(value, file, f"metadata {key!r}")


def check_ir_meta(ir: dict[str, Any], file: str) -> dict[str, Any]:
    """The graph facts in ``specc.ir_meta`` have the types the exporter writes."""
    for key in IR_COUNTS:
        v = ir.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise SpecError(
                f"metadata 'specc.ir_meta': {key} must be a positive whole number, got {read.json_kind(v)}",
                file=file,
                hint="the model was edited or not exported by specc",
            )
    start = ir.get("decoder_start_token_id")  # a token id: 0 allowed
    if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 0):
        raise SpecError(
            f"metadata 'specc.ir_meta': decoder_start_token_id must be a token id, got {read.json_kind(start)}",
            file=file,
            hint="the model was edited or not exported by specc",
        )
    for key in ("task", "family", "name"):
        v = ir.get(key)
        if v is not None and not isinstance(v, str):
            raise SpecError(f"metadata 'specc.ir_meta': {key} must be text, got {read.json_kind(v)}", file=file)
    return ir


def active_name(provider: str) -> str:
    return "cuda" if provider.startswith("CUDA") else "cpu"
