"""Start or resume a run, and save it: the glue between checkpoints and the loop."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch

from ..errors import SpecError
from . import training_checkpoint as C
from .loop import Run, TrainConfig, setup


def default_device(name: str | None = None) -> torch.device:
    """``--device NAME`` checked against this machine; without one, CUDA where present, else the CPU."""
    from ..backends.torch.build import torch_device

    if name:
        return torch_device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def new_run(
    spec: Any, cfg: TrainConfig, device: torch.device, mesh: Any = None, pipeline: Any = None, ep: int = 1
) -> Run:
    return setup(spec, cfg, device, mesh=mesh, pipeline=pipeline, ep=ep)


def resume_run(
    path: str | Path,
    overrides: dict[str, Any],
    device: torch.device,
    spec: Any = None,
    mesh: Any = None,
    trust_pickle: bool = False,
    pipeline: Any = None,
    ep: int = 1,
) -> Run:
    """Continue a checkpoint: its spec, task and settings, with ``overrides`` (flags given) on top; with a
    ``mesh``, parallelized over it (any layout: checkpoints hold the single-process layout; a distributed
    checkpoint folder is read shard by shard, never whole). ``trust_pickle``: a folder of an older specc."""
    from ..parallel import sharded_checkpoint as distributed

    sharded = mesh is not None and Path(path).is_dir()
    folder = distributed.open_folder(path, trust_pickle) if sharded else None  # checked once, read by every rank
    if folder is not None:
        ck = distributed.load(folder, weights=False)
    else:
        ck = C.load(path, with_optimizer=True, trust_pickle=trust_pickle)
    if not ck.train or "config" not in ck.train:
        raise SpecError(
            "this checkpoint holds no training state to resume",
            file=str(path),
            hint="checkpoints written by specc train can be resumed",
        )
    if spec is not None and C.spec_json(spec) != C.spec_json(ck.spec):
        raise SpecError(
            "the spec differs from the one the checkpoint was trained with",
            file=str(path),
            hint="leave out SPEC (and --set) to resume the checkpoint's own spec",
        )
    saved = {f.name: ck.train["config"][f.name] for f in fields(TrainConfig) if f.name in ck.train["config"]}
    task = overrides.get("task")
    if task is not None and task != saved["task"]:
        raise SpecError(f"the checkpoint was trained on task {saved['task']}, not {task}", file=str(path))
    cfg = replace(TrainConfig(**saved), **{k: v for k, v in overrides.items() if v is not None})
    weights, shards = (None, folder) if folder is not None else (ck.weights, None)
    vocab = C.vocab_of(ck)
    run = setup(ck.spec, cfg, device, weights=weights, vocab=vocab, mesh=mesh, shards=shards, pipeline=pipeline, ep=ep)
    if run.vocab != vocab:
        raise SpecError("the checkpoint's vocabulary does not match its task", file=str(path))
    if ck.step >= cfg.steps:
        raise SpecError(
            f"the checkpoint is already at step {ck.step}; --steps {cfg.steps} leaves nothing to do",
            file=str(path),
            hint=f"--steps {ck.step * 2}",
        )
    if ck.optimizer is not None and mesh is not None:
        moments = ck.optimizer
        if run.pipeline is not None:  # this rank's stage: the moments of the parameters it holds
            held = dict(run.model.named_parameters())
            moments = {k: v for k, v in moments.items() if k.rsplit(".", 1)[0] in held}
        restore = C.check_optimizer(run.model, moments, str(C.optimizer_path(path)))
        distributed.restore_full_optimizer(run.model, run.optimizer, restore)
        run.resumed_optimizer = True
    elif ck.optimizer is not None:
        C.restore_optimizer(run.model, run.optimizer, ck.optimizer)
        run.resumed_optimizer = True
    run.step = ck.step
    run.history = list(ck.train.get("history", []))
    return run


def save_run(run: Run, path: str | Path, last: bool = False) -> Path:
    """``last``: the run's final checkpoint (a signal after it is in place no longer fails the command)."""
    state = {
        "task": run.cfg.task,
        "step": run.step,
        "vocab": list(run.vocab.symbols),
        "config": run.cfg.to_json(),
        "history": run.history,
    }
    if run.mesh is None:
        return C.save(path, run.spec, run.model, run.optimizer, state, last=last)
    return save_parallel(run, path, state, last=last)


def save_parallel(run: Run, path: str | Path, state: dict[str, Any], last: bool = False) -> Path:
    """From every rank: ``*.safetensors`` gathers the weights and Adam moments, which rank 0 writes as the
    single-process checkpoint and sidecar; any other path is a distributed checkpoint folder (each rank
    writes its shards of the weights and the optimizer state)."""
    import torch.distributed as dist

    from ..io import outputs_complete
    from ..io.signals import signals_blocked
    from ..parallel import sharded_checkpoint as distributed

    if not str(path).endswith(".safetensors"):
        return distributed.save(run.model, path, run.spec, state, run.optimizer, last=last)
    if run.pipeline is not None:  # each stage holds its own tensors: gathered through a folder, read whole
        return _save_pipelined_file(run, Path(path), state, last)
    weights = distributed.full_state_dict(run.model)
    moments = distributed.full_optimizer_tensors(run.model, run.optimizer)
    if dist.get_rank() == 0:
        C.save_tensors(path, run.spec, weights, moments, state, last=last)
        dist.barrier()
    elif last:  # held back until rank 0 has the pair in place, then ignored
        with signals_blocked():
            dist.barrier()
            outputs_complete()
    else:
        dist.barrier()
    return Path(path)


def _save_pipelined_file(run: Run, path: Path, state: dict[str, Any], last: bool) -> Path:
    """A pipelined run's ``*.safetensors``: every stage writes its shards into a distributed checkpoint folder
    inside a temporary folder beside ``path`` (a collective), rank 0 reads it whole and writes the
    single-process checkpoint and sidecar, and the temporary folder goes."""
    import torch.distributed as dist

    from ..io import discard_stage, folder_stage, outputs_complete
    from ..io.signals import signals_blocked
    from ..parallel import sharded_checkpoint as distributed

    lead = dist.get_rank() == 0
    box: list[str | None] = [str(folder_stage(path.with_name(path.name + ".stages"))) if lead else None]
    dist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    stage = Path(box[0])
    try:
        distributed.save(run.model, stage / "stages", run.spec, state, run.optimizer)
        if lead:
            ck = distributed.load(stage / "stages", with_optimizer=True)
            C.save_tensors(path, run.spec, ck.weights, ck.optimizer, state, last=last)
        if last and not lead:  # held back until rank 0 has the pair in place, then ignored
            with signals_blocked():
                dist.barrier()
                outputs_complete()
        else:
            dist.barrier()
    finally:
        if lead:
            discard_stage(stage)
    return path
