"""The training checkpoint's format, below both the trainer (``specc.train``) and the distributed checkpoints
(``specc.parallel.sharded_checkpoint``), which both read and write it: the settings a run records (``TrainConfig``),
what a checkpoint holds once read (``Checkpoint``), and the check of its training state (``specc.train`` in
the metadata: task, step, vocabulary symbols, settings, evaluation history), field by field as data.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .errors import SpecError
from .io import read

TRAIN_KEY = "specc.train"


@dataclass(frozen=True)
class TrainConfig:
    task: str
    steps: int
    batch: int = 64
    lr: float = 1e-3
    min_len: int | None = None  # None: the task's default (seq2seq) / 1 (lm)
    max_len: int | None = None  # lm: the window length (default min(context, 128))
    seed: int = 0
    schedule: str = "cosine"
    warmup: int | None = None  # None: min(100, steps // 10)
    clip: float = 1.0
    eval_every: int | None = None  # None: steps // 5
    eval_size: int = 512
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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
    def symbols(self) -> tuple[str, ...] | None:
        """The vocabulary's symbols (``specc.train.vocab.Vocab``), for a checkpoint written by specc train."""
        symbols = self.train.get("vocab")
        return tuple(symbols) if symbols else None


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
