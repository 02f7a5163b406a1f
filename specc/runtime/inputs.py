"""Inputs for ``specc run``: parse ids, load .npy, make random inputs, fill defaults, and check everything
against the model's declared inputs before onnxruntime sees it (so mistakes get one-line errors).

.npy/.npz files are read through ``specc.io.read`` (regular files of at most ``read.ARRAY_BYTES``, an .npz's
members counted by their uncompressed size) without pickles; arrays must be numeric with at least one axis.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import SpecError
from ..io import read
from .onnx_model import IOSpec, OrtModel

INT64 = np.iinfo(np.int64)

DEFAULT_START_ID = 1  # <bos> of specc's seq2seq vocabularies (specc train: <pad> 0, <bos> 1, <eos> 2)


def parse_ids(text: str) -> np.ndarray:
    """``"1 2 3"`` → [[1, 2, 3]]; rows of a batch are separated by ``;`` (``"1 2; 3 4"``)."""
    rows = []
    for row in text.split(";"):
        items = [t for t in re.split(r"[\s,]+", row.strip()) if t]
        bad = next((t for t in items if not re.fullmatch(r"[+-]?\d{1,19}", t)), None)
        if bad is not None:
            shown = bad if len(bad) <= 24 else bad[:21] + "..."
            what = "is too large for a token id" if re.fullmatch(r"[+-]?\d+", bad) else "is not an integer token id"
            raise SpecError(f"--input-ids: {shown!r} {what}", hint='e.g. --input-ids "1 2 3; 4 5 6"')
        ints = [int(t) for t in items]
        big = next((i for i in ints if not INT64.min <= i <= INT64.max), None)
        if big is not None:
            raise SpecError(f"--input-ids: {big} is too large for a token id", hint='e.g. --input-ids "1 2 3; 4 5 6"')
        rows.append(ints)
    if not rows or not rows[0]:
        raise SpecError("--input-ids is empty", hint='e.g. --input-ids "1 2 3"')
    if len({len(r) for r in rows}) != 1:
        raise SpecError(
            f"--input-ids rows have different lengths {[len(r) for r in rows]}",
            hint="pad them; pass an attention mask with --input",
        )
    return np.array(rows, dtype=np.int64)


def parse_random(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*,\s*(\d+)\s*", text)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise SpecError(f"--random {text!r}: expected B,N with positive integers", hint="e.g. --random 1,128")
    return int(m[1]), int(m[2])


def load_npy(model: OrtModel, items: list[str]) -> dict[str, np.ndarray]:
    """``--input x.npy`` feeds the first input; ``--input name=x.npy`` a named one; a .npz feeds by key."""
    feeds: dict[str, np.ndarray] = {}
    declared = model.inputs()
    first = declared[0].name if declared else ""
    for item in items:
        name, _, file = item.rpartition("=") if "=" in item else ("", "", item)
        for key, value in read_arrays(file).items():
            feeds[(name or first) if key is None else key] = value
    return feeds


def read_arrays(file: str) -> dict[str | None, np.ndarray]:
    """The arrays of a .npy file (key None) or a .npz file (by member name), checked to be numeric inputs."""
    path = Path(file)
    what = "a .npy/.npz file"
    arrays: dict[str | None, np.ndarray] = {}
    with read.open_regular(path, what, limit=read.ARRAY_BYTES, missing=f"--input: no such file {file}") as (f, _):
        head = f.read(4)
        f.seek(0)
        try:
            if head.startswith(b"PK"):
                with zipfile.ZipFile(f) as z:
                    total = sum(i.file_size for i in z.infolist())
                    if total > read.ARRAY_BYTES:
                        raise SpecError(
                            f"--input: {path.name} unpacks to {total:,} bytes (at most {read.ARRAY_BYTES:,})",
                            file=str(path),
                        )
                    names = [i.filename for i in z.infolist()]
                    if len(set(names)) != len(names):
                        raise SpecError(f"--input: {path.name} holds the same member twice", file=str(path))
                f.seek(0)
                with np.load(f, allow_pickle=False) as npz:
                    for key in npz.files:
                        arrays[key] = _numeric(_member(npz, key, path), f"{path.name}[{key!r}]", path)
            else:
                arrays[None] = _numeric(np.load(f, allow_pickle=False), path.name, path)
        except SpecError:
            raise
        except Exception as e:  # numpy and zipfile raise ValueError / OSError / BadZipFile / EOFError variants
            raise SpecError(f"--input: {path.name} is not a .npy/.npz file ({_reason(e)})", file=str(path)) from None
    return arrays


def _member(npz: Any, key: str, path: Path) -> np.ndarray:
    try:
        return npz[key]
    except Exception as e:
        raise SpecError(f"--input: {path.name}[{key!r}] cannot be read ({_reason(e)})", file=str(path)) from None


def _reason(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:80]}" if text else type(e).__name__


def _numeric(value: Any, label: str, path: Path) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise SpecError(f"--input: {label} is not an array", file=str(path))
    if value.dtype.kind not in "biuf":
        raise SpecError(
            f"--input: {label} holds {value.dtype} values; inputs are integer ids or floating-point numbers",
            file=str(path),
        )
    if value.ndim == 0:
        raise SpecError(
            f"--input: {label} is a 0-d array (a single number); inputs have a batch axis",
            file=str(path),
            hint="save it with shape [B, ...], e.g. np.save(path, np.array([[1, 2, 3]]))",
        )
    return value


def random_inputs(model: OrtModel, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids within the vocabulary (or normal pixels) for the model's data inputs."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in model.inputs():
        if spec.name in ("input_ids", "decoder_input_ids"):
            vocab = model.vocab(spec.name) or 2
            feeds[spec.name] = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        elif spec.name == "pixel_values":
            dims = [batch, *(d if isinstance(d, int) else seq for d in spec.shape[1:])]
            feeds[spec.name] = rng.standard_normal(dims).astype(spec.dtype or np.float32)
        elif spec.name == "input_features":  # Whisper: [B, mel_bins, 2·N] frames, N the encoder's length
            dims = [batch, *(d if isinstance(d, int) else 2 * seq for d in spec.shape[1:])]
            feeds[spec.name] = rng.standard_normal(dims).astype(spec.dtype or np.float32)
    return feeds


def complete(model: OrtModel, feeds: dict[str, np.ndarray], start_id: int = DEFAULT_START_ID) -> dict[str, np.ndarray]:
    """Fill inputs the user may leave out: all-ones attention mask, zero token types, a start token for the
    decoder, empty KV caches."""
    feeds = dict(feeds)
    specs = {s.name: s for s in model.inputs()}
    ref = feeds.get("input_ids")
    if ref is None:
        ref = next((v for v in feeds.values() if v.ndim >= 1), None)
    batch = int(ref.shape[0]) if ref is not None else 1
    for name, spec in specs.items():
        if name in feeds:
            continue
        if name.startswith("past_key_values."):
            feeds[name] = np.zeros((batch, spec.shape[1], 0, spec.shape[3]), spec.dtype or np.float32)
        elif name == "decoder_input_ids":
            feeds[name] = np.full((batch, 1), start_id, np.int64)
        elif name == "token_type_ids" and ref is not None:
            feeds[name] = np.zeros(ref.shape, np.int64)
    if "attention_mask" in specs and "attention_mask" not in feeds and ref is not None:
        feeds["attention_mask"] = np.ones(ref.shape[:2], np.int64)
    return feeds


def check(model: OrtModel, feeds: dict[str, np.ndarray], role: str | None = None) -> dict[str, np.ndarray]:
    """Names, dtypes, ranks, fixed dims, and ids inside the vocabulary; returns the feeds cast losslessly."""
    specs = {s.name: s for s in model.inputs(role)}
    unknown = sorted(set(feeds) - set(specs))
    if unknown:
        raise SpecError(f"the model has no input named {unknown[0]!r}; its inputs: {', '.join(specs)}")
    missing = [n for n, s in specs.items() if n not in feeds and not s.optional]
    if missing:
        raise SpecError(f"missing input {missing[0]!r}; the model takes: {', '.join(specs)}")
    out: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        out[name] = _check_one(model, specs[name], np.asarray(value))
    _check_agree(model, out)
    return out


def cached_tokens(feeds: dict[str, np.ndarray]) -> int:
    """Tokens a decoder's fed KV cache already holds (0 without one, and for encoder-decoders' decoder)."""
    past = feeds.get("past_key_values.0.key")
    return past.shape[2] if past is not None and past.ndim == 4 and "decoder_input_ids" not in feeds else 0


def _check_agree(model: OrtModel, feeds: dict[str, np.ndarray]) -> None:
    """Per-token inputs must match input_ids (the mask also covers the past when a cache is fed)."""
    limit = model.max_positions
    for name in ("input_ids", "decoder_input_ids"):
        if limit and name in feeds and feeds[name].ndim == 2 and feeds[name].shape[1] > limit:
            raise SpecError(f"{name} has {feeds[name].shape[1]} tokens; the model has {limit} learned positions")
    ids = feeds.get("input_ids")
    if ids is None or ids.ndim != 2:
        return
    cached = cached_tokens(feeds)  # decoder-only: the mask spans past + new tokens
    expect = {
        "token_type_ids": ids.shape,
        "position_ids": ids.shape,
        "attention_mask": (ids.shape[0], ids.shape[1] + cached),
    }
    for name, shape in expect.items():
        if name in feeds and feeds[name].shape != tuple(shape):
            raise SpecError(
                f"input {name} has shape {list(feeds[name].shape)}, expected {list(shape)} to match input_ids"
            )
    pos = feeds.get("position_ids")
    if limit and pos is not None and pos.size and int(pos.max()) >= limit:
        top = int(pos.max())
        raise SpecError(f"position_ids holds {top}; the model has {limit} learned positions (0..{limit - 1})")


def _check_one(model: OrtModel, spec: IOSpec, value: np.ndarray) -> np.ndarray:
    want = spec.dtype
    if want is None:
        raise SpecError(f"input {spec.name} is {spec.type_name}, which numpy cannot feed", hint="export fp32 or fp16")
    want = np.dtype(want)
    if value.dtype.kind not in "biuf":
        raise SpecError(f"input {spec.name} holds {value.dtype} values; inputs are numbers")
    if want.kind in "iu" and value.dtype.kind not in "iub":
        raise SpecError(f"input {spec.name} must hold integers ({want}), got {value.dtype}")
    if want.kind == "f" and value.dtype.kind != "f":
        raise SpecError(f"input {spec.name} must be floating point ({want}), got {value.dtype}")
    if want.kind in "iu" and value.dtype.kind in "iu" and value.size:
        lo, hi, limits = int(value.min()), int(value.max()), np.iinfo(want)
        if lo < limits.min or hi > limits.max:
            bad = lo if lo < limits.min else hi
            raise SpecError(f"input {spec.name} holds {bad}, which does not fit {want}")
    if want.kind == "f" and value.size and not np.isfinite(value).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
        raise SpecError(f"input {spec.name} holds {value[where]} at {list(where)}; inputs must be finite")
    if want.kind == "f" and value.dtype.itemsize > want.itemsize and value.size:
        top = float(np.abs(value).max())
        if top > np.finfo(want).max:
            raise SpecError(f"input {spec.name} holds {top:g}, which overflows {want}")
    if value.ndim != len(spec.shape):
        raise SpecError(
            f"input {spec.name} must have {len(spec.shape)} dims {_shape(spec.shape)}, got shape {list(value.shape)}"
        )
    for axis, (d, n) in enumerate(zip(spec.shape, value.shape, strict=True)):
        if isinstance(d, int) and d != n:
            raise SpecError(
                f"input {spec.name} needs size {d} on axis {axis} {_shape(spec.shape)}, got {list(value.shape)}"
            )
    value = value.astype(want, copy=False)
    vocab = model.vocab(spec.name)
    if vocab and value.size:
        lo, hi = int(value.min()), int(value.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            where = tuple(int(i) for i in np.argwhere(value == bad)[0])
            raise SpecError(f"{spec.name} holds id {bad} at {list(where)}, outside the vocabulary (0..{vocab - 1})")
    return value


def _shape(shape: tuple) -> str:
    return "[" + ", ".join(str(d) if d is not None else "?" for d in shape) + "]"
