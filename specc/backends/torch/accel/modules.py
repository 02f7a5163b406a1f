"""Route a model's exact ``nn.Linear`` layers (and tied heads) through the measured ``linear``.

The module's type, parameters and state-dict keys are unchanged: only an instance-level ``forward`` (an
``Override``) is set, so subclasses and wrapped layers (quantized, LoRA, ...) are left alone; ``restore``
(or ``SpeccModel.plain``) undoes it.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..layers.embed import TiedLinear
from ..layers.extras import Override
from .kernels_dispatch import linear


class FastForward(Override):
    """The ``forward`` of an ``nn.Linear`` routed through ``linear(x, m.weight, m.bias)``."""

    __slots__ = ()

    def __call__(self, input: Tensor) -> Tensor:
        m = self.module
        return linear(input, m.weight, m.bias)


class TiedForward(Override):
    """The ``forward`` of a head tied to the embedding: ``linear(x, weight, m.bias)``."""

    __slots__ = ()

    def __call__(self, x: Tensor, weight: Tensor) -> Tensor:
        return linear(x, weight, self.module.bias)


def accelerate(model: nn.Module) -> int:
    """Route every submodule of type exactly ``nn.Linear`` (the model itself included) and every tied head
    through ``linear``; return how many."""
    count = 0
    for module in model.modules():
        kind = FastForward if type(module) is nn.Linear else TiedForward if type(module) is TiedLinear else None
        if kind is not None:
            if not isinstance(module.__dict__.get("forward"), kind):
                module.forward = kind(module)
            count += 1
    return count


def restore(model: nn.Module) -> int:
    """Undo ``accelerate``: remove the instance-level forwards it set; return how many."""
    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), (FastForward, TiedForward)):
            del module.forward
            count += 1
    return count
