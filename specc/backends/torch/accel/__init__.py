"""The acceleration pass of the torch backend: every CPU/GPU speed measure, applied to a built model from outside.

    from specc.backends.torch.accel import accelerate, restore
    accelerate(model)   # build_torch does this (build_torch(..., accelerate=False) or SPECC_ACCEL=0: it does not)
    restore(model)      # the plain module tree again (as model.plain(), which needs no import of this package)

What it sets, each an instance-level ``Override`` (the module's type, parameters and state-dict keys unchanged):
- the ``forward`` of every exact ``nn.Linear`` (a tied head is one) on the CPU: the kernel measured fastest for its
  shape class on this machine (``kernels``: F.linear, oneDNN, a row-split GEMV or specc's native GEMV);
- the model's ``step``: a one-token step after a prefill as one native call (``decode_native``), where measured
  faster and exactly equal; ``generate(compile=True)``: compiled decoding over a static cache (``compiled``).

Layers, codegen, the standalone model.py, training and parallel code import nothing from here. Switches:
``SPECC_ACCEL=0`` — build_torch applies no pass (the plain module tree, the same logits); ``SPECC_KERNELS=torch``
— plain F.linear everywhere and no native code loaded (read when a shape class is first seen);
``SPECC_NATIVE=0`` — never build or load the native library (GEMV and decoding step).
"""

from __future__ import annotations

import os

from torch import nn

from . import modules
from .decoding import Generate, Step

ENV = "SPECC_ACCEL"  # "0": build_torch returns the plain module tree (build.py reads it without importing this)


def enabled() -> bool:
    """Whether build_torch applies the pass by default (``SPECC_ACCEL`` is not "0")."""
    return os.environ.get(ENV, "1") != "0"


def accelerate(model: nn.Module) -> nn.Module:
    """Apply the pass to a built model in place and return it: measured linear kernels where its parameters are
    on the CPU, and the native / compiled decoding step where it generates (a model with ``STEP_INPUT``)."""
    params = list(model.parameters())
    if params and all(p.device.type == "cpu" for p in params):
        modules.accelerate(model)
    if getattr(model, "STEP_INPUT", None) is not None:
        if not isinstance(model.__dict__.get("step"), Step):
            model.step = Step(model)
        if not isinstance(model.__dict__.get("generate"), Generate):
            model.generate = Generate(model)
    return model


def restore(model: nn.Module) -> nn.Module:
    """Undo ``accelerate``: remove every instance-level override it set; return the model."""
    modules.restore(model)
    for name, kind in (("step", Step), ("generate", Generate)):
        if isinstance(model.__dict__.get(name), kind):
            delattr(model, name)
    return model


__all__ = ["ENV", "accelerate", "enabled", "restore"]
