"""Training checkpoints: a specc torch checkpoint plus the training state, and an optimizer sidecar.

``out.safetensors`` is what ``specc compile --target torch`` writes (the weights under their scope names, the
spec as JSON in the metadata), so ``specc generate`` and ``load_checkpoint`` read it as is; its metadata adds
``specc.train`` (JSON: task, step, vocabulary symbols, training config, evaluation history). The Adam
moments live beside it in ``out.optim.safetensors`` (tensors ``<param>.<slot>``), which ``--resume`` reads.
The two are replaced as a pair (``specc.io.atomic_files``: both staged, then renamed back to back with signals
held back, the sidecar first); each records the step it belongs to, and the checkpoint records its sidecar's
SHA-256 (``specc.optimizer.sha256``), so a reader never takes a sidecar of another write for this one.

Reading goes through ``specc.interop.safetensors_read`` (strict safetensors): the embedded spec is data (never a
path, preset or ``extends:``), the training state is checked field by field against ``TrainConfig`` and the
optimizer moments against the model's parameters, so a damaged or edited checkpoint is one located error
before any training step.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import save_file

from ..checkpoint_format import TRAIN_KEY, Checkpoint, check_train_state
from ..errors import SpecError
from ..interop import safetensors_read as st
from ..io import atomic_files, read
from ..spec.serialize import SPEC_KEY, spec_json
from ..version import __version__
from .vocab import Vocab

STEP_KEY = "specc.step"
SIDECAR_KEY = "specc.optimizer.sha256"  # in the checkpoint's metadata: the hash of the sidecar written with it


def optimizer_path(path: str | Path) -> Path:
    p = Path(path)
    stem = p.name[: -len(".safetensors")] if p.name.endswith(".safetensors") else p.name
    return p.with_name(f"{stem}.optim.safetensors")


def save(
    path: str | Path,
    spec: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    train: dict[str, Any],
    last: bool = False,
) -> Path:
    moments = optimizer_tensors(model, optimizer) if optimizer is not None else None
    return save_tensors(path, spec, model.state_dict(), moments, train, last=last)


def save_tensors(
    path: str | Path,
    spec: Any,
    weights: dict[str, torch.Tensor],
    moments: dict[str, torch.Tensor] | None,
    train: dict[str, Any],
    last: bool = False,
) -> Path:
    """The checkpoint from tensors by name (a model's state_dict, or one gathered from every rank), with its
    sidecar when ``moments`` are given; ``last``: the command's final output (``specc.io.outputs_complete``)."""
    step = str(train.get("step", 0))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    meta = {SPEC_KEY: spec_json(spec), TRAIN_KEY: json.dumps(train), "specc.version": __version__, "format": "pt"}
    targets = [optimizer_path(path), Path(path)] if moments is not None else [Path(path)]
    with atomic_files(targets, staging=False, last=last) as tmps:
        if moments is not None:
            save_file(moments, str(tmps[0]), metadata={STEP_KEY: step})
            with open(tmps[0], "rb") as f:  # written here: not an input of the command
                meta[SIDECAR_KEY] = _sha256(f)
        save_file(tensors, str(tmps[-1]), metadata=meta)
    return Path(path)


def _sha256(f: BinaryIO) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        for slot, value in optimizer.state.get(p, {}).items():
            if torch.is_tensor(value):
                out[f"{name}.{slot}"] = value.detach().to("cpu").contiguous()
    return out


SLOTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step")  # what torch's Adam / AdamW keep per parameter


def restore_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, torch.Tensor]) -> None:
    """Put the saved Adam moments back on the parameters they belong to (matched by name, not position)."""
    by_param = check_optimizer(model, saved)
    for name, p in model.named_parameters():
        slots = by_param.get(name)
        if slots:
            optimizer.state[p] = {k: v.to(p.device) if v.dim() else v.clone() for k, v in slots.items()}


def check_optimizer(
    model: torch.nn.Module, saved: dict[str, torch.Tensor], file: str = "optimizer state"
) -> dict[str, dict[str, torch.Tensor]]:
    """The sidecar's tensors by parameter and slot; every tensor must fit the parameter it names."""
    params = dict(model.named_parameters())
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    for key in sorted(saved):
        value = saved[key]
        name, _, slot = key.rpartition(".")
        if name not in params or slot not in SLOTS:
            raise SpecError(
                f"optimizer state has tensor {key!r}, which is not <parameter>.<{'|'.join(SLOTS)}> of this model",
                file=file,
                hint="the .optim file belongs to another model; delete it to resume with fresh moments",
            )
        want = () if slot == "step" else tuple(params[name].shape)
        shape = tuple(value.shape)
        if shape != want and not (slot == "step" and value.numel() == 1):
            raise SpecError(
                f"optimizer state {key!r} has shape {list(shape)}; the parameter needs {list(want)}",
                file=file,
                hint="the .optim file belongs to another model; delete it to resume with fresh moments",
            )
        if not value.is_floating_point():
            raise SpecError(
                f"optimizer state {key!r} is {str(value.dtype).removeprefix('torch.')}, not float", file=file
            )
        if not bool(torch.isfinite(value).all()):
            raise SpecError(
                f"optimizer state {key!r} holds NaN or infinite values",
                file=file,
                hint="delete the .optim file to resume with fresh moments",
            )
        by_param.setdefault(name, {})[slot] = value.reshape(()) if slot == "step" else value
    return by_param


def _read(path: Path, what: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    header = st.read_header(path, f"a safetensors {what}")
    return header.metadata, st.load_file(path, header)


def load(path: str | Path, with_optimizer: bool = False, trust_pickle: bool = False) -> Checkpoint:
    """Read a specc checkpoint (and its optimizer sidecar), or a distributed checkpoint folder (``specc train
    --parallel -o DIR``) whole; anything else is a user error naming the file. ``trust_pickle``: read a
    folder of an older specc (pickled)."""
    from ..spec.loader import load_embedded_spec

    p = Path(path)
    if p.is_dir():
        from ..parallel import sharded_checkpoint as distributed

        return distributed.load(p, with_optimizer=with_optimizer, trust_pickle=trust_pickle)
    meta, weights = _read(p, "checkpoint")
    if SPEC_KEY not in meta:
        raise SpecError(
            "not a specc checkpoint (no spec in its metadata)",
            file=str(p),
            hint="checkpoints come from specc train or specc compile --target torch",
        )
    spec = load_embedded_spec(meta[SPEC_KEY], str(p), SPEC_KEY)
    train = check_train_state(meta.get(TRAIN_KEY, "{}"), str(p))
    optimizer = None
    side = optimizer_path(p)
    if with_optimizer and os.path.lexists(side):
        side_meta, optimizer = _read(side, "optimizer state")
        if side_meta.get(STEP_KEY) != str(train.get("step", 0)):
            raise SpecError(
                f"optimizer state is from step {side_meta.get(STEP_KEY)}, the checkpoint from step {train.get('step')}",
                file=str(side),
                hint="the two files belong to different runs; delete the .optim file to resume with fresh moments",
            )
        want = meta.get(SIDECAR_KEY)  # absent in checkpoints of older specc versions
        if want is not None:
            with read.open_regular(side, "optimizer state") as (f, _):
                if _sha256(f) != want:
                    raise SpecError(
                        "optimizer state was not written with this checkpoint (its SHA-256 is not the one recorded)",
                        file=str(side),
                        hint="the two files belong to different writes; delete the .optim file to resume with "
                        "fresh moments",
                    )
    return Checkpoint(spec, weights, train, optimizer)


def vocab_of(ck: Checkpoint) -> Vocab | None:
    """The checkpoint's vocabulary (None: not written by specc train)."""
    return Vocab(ck.symbols) if ck.symbols else None
