"""Training on synthetic seq2seq tasks (reverse, copy, sort, add) and character-level text, plus attention maps.

Python API::

    from specc.train import TrainConfig, new_run, train, save_run
    run = new_run(spec, TrainConfig(task="reverse", steps=2000), torch.device("cpu"))
    train(run)
    save_run(run, "reverse.safetensors")
"""

from __future__ import annotations

from .loop import Run, TrainConfig, evaluate, train
from .session import default_device, new_run, resume_run, save_run

__all__ = ["Run", "TrainConfig", "default_device", "evaluate", "new_run", "resume_run", "save_run", "train"]
