"""Training checkpoints: a specc torch checkpoint plus the training state, and an optimizer sidecar.

``out.safetensors`` is what ``specc compile --target torch`` writes (the weights under their scope names, the
spec as JSON in the metadata), so ``specc generate`` and ``load_checkpoint`` read it as is; its metadata adds
``specc.train`` (JSON: task, step, vocabulary symbols, training config, evaluation history). The Adam
moments live beside it in ``out.optim.safetensors`` (tensors ``<param>.<slot>``), which ``--resume`` reads.
Both are written atomically, the sidecar first, and each records the step it belongs to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .. import __version__
from ..errors import SpecError
from ..io import atomic_write
from ..spec.serialize import SPEC_KEY, spec_json
from .vocab import Vocab

TRAIN_KEY = "specc.train"
STEP_KEY = "specc.step"


@dataclass(frozen=True)
class Checkpoint:
    spec: Any
    weights: dict[str, torch.Tensor]
    train: dict[str, Any]  # task, step, vocab, config, history ({} for a checkpoint not written by specc train)
    optimizer: dict[str, torch.Tensor] | None  # "<param>.<slot>" → tensor; None: no sidecar

    @property
    def step(self) -> int:
        return int(self.train.get("step", 0))

    @property
    def vocab(self) -> Vocab | None:
        symbols = self.train.get("vocab")
        return Vocab(tuple(symbols)) if symbols else None


def optimizer_path(path: str | Path) -> Path:
    p = Path(path)
    stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.name
    return p.with_name(f"{stem}.optim.safetensors")


def save(
    path: str | Path, spec: Any, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, train: dict[str, Any]
) -> Path:
    step = str(train.get("step", 0))
    if optimizer is not None:
        moments = optimizer_tensors(model, optimizer)
        atomic_write(optimizer_path(path), lambda tmp: save_file(moments, str(tmp), metadata={STEP_KEY: step}))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    meta = {SPEC_KEY: spec_json(spec), TRAIN_KEY: json.dumps(train), "specc.version": __version__, "format": "pt"}
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        for slot, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"{name}.{slot}"] = value.detach().to("cpu").contiguous()
    return out


def restore_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, torch.Tensor]) -> None:
    """Put the saved Adam moments back on the parameters they belong to (matched by name, not position)."""
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in saved.items():
        name, slot = key.rsplit(".", 1)
        by_param.setdefault(name, {})[slot] = value
    for name, p in model.named_parameters():
        slots = by_param.get(name)
        if slots:
            optimizer.state[p] = {k: v.to(p.device) if v.dim() else v.clone() for k, v in slots.items()}


def _read(path: Path, what: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        return meta, load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise SpecError(f"not a safetensors {what} ({str(e).splitlines()[0][:120]})", file=str(path)) from None


def load(path: str | Path, with_optimizer: bool = False) -> Checkpoint:
    """Read a specc checkpoint (and its optimizer sidecar); anything else is a user error naming the file."""
    from ..spec.loader import load_spec

    p = Path(path)
    if not p.is_file():
        raise SpecError("no such file" if not p.exists() else "not a file", file=str(p))
    meta, weights = _read(p, "checkpoint")
    if SPEC_KEY not in meta:
        raise SpecError(
            "not a specc checkpoint (no spec in its metadata)",
            file=str(p),
            hint="checkpoints come from specc train or specc compile --target torch",
        )
    try:
        spec = load_spec(json.loads(meta[SPEC_KEY]))
        train = json.loads(meta.get(TRAIN_KEY, "{}"))
    except (ValueError, SpecError) as e:
        raise SpecError(f"the checkpoint's embedded spec is invalid ({str(e).splitlines()[0]})", file=str(p)) from None
    optimizer = None
    side = optimizer_path(p)
    if with_optimizer and side.is_file():
        side_meta, optimizer = _read(side, "optimizer state")
        if side_meta.get(STEP_KEY) != str(train.get("step", 0)):
            raise SpecError(
                f"optimizer state is from step {side_meta.get(STEP_KEY)}, the checkpoint from step {train.get('step')}",
                file=str(side),
                hint="the two files belong to different runs; delete the .optim file to resume with fresh moments",
            )
    return Checkpoint(spec, weights, train, optimizer)
