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

import dataclasses
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors.torch import save_file

from ..errors import SpecError
from ..interop import safetensors_read as st
from ..io import atomic_files, read
from ..spec.serialize import SPEC_KEY, spec_json
from ..version import __version__
from .vocab import Vocab

TRAIN_KEY = "specc.train"
STEP_KEY = "specc.step"
SIDECAR_KEY = "specc.optimizer.sha256"  # in the checkpoint's metadata: the hash of the sidecar written with it


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
        from ..parallel import checkpoint as distributed

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


# ---------------------------------------------------------------------------------------------- training state


def check_train_state(text: str, file: str) -> dict[str, Any]:
    """The ``specc.train`` metadata: a JSON object whose fields have the types ``specc train`` writes."""
    what = f"metadata {TRAIN_KEY!r}"
    # NaN / Infinity are data in the evaluation history (a diverged loss); the settings are checked finite below
    data = read.parse_json(text, file, what, located=False, nonfinite=True)
    train = read.json_object(data, file, f"the training state ({what})")

    def bad(field: str, expected: str, value: Any) -> SpecError:
        return read.ReadError(
            f"{what}: {field} must be {expected}, got {read.json_kind(value)}",
            file=file,
            hint="the checkpoint was edited or not written by specc train",
        )

    if "task" in train and not isinstance(train["task"], str):
        raise bad("task", "a task name", train["task"])
    step = train.get("step", 0)
    if not _whole(step) or step < 0:
        raise bad("step", "a whole number ≥ 0", step)
    vocab = train.get("vocab")
    if vocab is not None and (not isinstance(vocab, list) or not all(isinstance(v, str) for v in vocab)):
        raise bad("vocab", "a list of symbols (strings)", vocab)
    if isinstance(vocab, list) and len(set(vocab)) != len(vocab):
        raise read.ReadError(f"{what}: vocab repeats a symbol", file=file)
    history = train.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) and _whole(h.get("step")) for h in history):
        raise bad("history", "a list of evaluation records with a step", history)
    if "config" in train:
        _check_config(train["config"], bad)
    return train


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_config(config: Any, bad: Any) -> None:
    from .loop import TrainConfig

    if not isinstance(config, dict):
        raise bad("config", "an object of training settings", config)
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in config:
            if required:
                raise bad(f"config.{f.name}", "present", None)
            continue
        value, kind = config[f.name], hints[f.name]
        optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in typing.get_args(kind)
        base = next(a for a in typing.get_args(kind) if a is not type(None)) if optional else kind
        if value is None and optional:
            continue
        if base is int and not _whole(value):
            raise bad(f"config.{f.name}", "a whole number" + (" or null" if optional else ""), value)
        if base is float and (
            not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
        ):
            raise bad(f"config.{f.name}", "a number", value)
        if base is str and not isinstance(value, str):
            raise bad(f"config.{f.name}", "text" + (" or null" if optional else ""), value)
