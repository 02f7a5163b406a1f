"""Route a model's exact ``nn.Linear`` layers (a tied head is one) through the measured ``linear``.

The module's type, parameters and state-dict keys are unchanged: only an instance-level ``forward`` (an
``Override``) is set, so subclasses and wrapped layers (quantized, LoRA, ...) are left alone; ``restore``
(or ``SpeccModel.plain``) undoes it.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..layers.extras import Override
from .kernels_dispatch import linear


class FastForward(Override):
    """The ``forward`` of an ``nn.Linear`` routed through ``linear(x, m.weight, m.bias)``."""

    __slots__ = ()

    def __call__(self, input: Tensor) -> Tensor:
        m = self.module
        return linear(input, m.weight, m.bias)


def accelerate(model: nn.Module) -> int:
    """Route every submodule of type exactly ``nn.Linear`` (the model itself included) through ``linear``; return
    how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            if not isinstance(module.__dict__.get("forward"), FastForward):
                module.forward = FastForward(module)
            count += 1
    return count


def restore(model: nn.Module) -> int:
    """Undo ``accelerate``: remove the instance-level forwards it set; return how many."""
    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), FastForward):
            del module.forward
            count += 1
    return count
