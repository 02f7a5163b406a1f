"""``accelerate``: route a model's exact ``nn.Linear`` layers (and tied heads) through the measured ``linear``.

The module's type, parameters and state-dict keys are unchanged: only an instance-level ``forward`` is set,
so subclasses and wrapped layers (quantized, LoRA, ...) are left alone; ``restore`` undoes it.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .kernels_dispatch import linear


class FastForward:
    """The instance-level ``forward`` that ``accelerate`` gives an ``nn.Linear``: ``linear(x, m.weight,
    m.bias)``. A small class rather than a bound method, because pickle stores a bound method as
    ``getattr(module, name)``, which cannot be resolved while the module itself is being unpickled; this one
    pickles (torch.save of a whole model), deep-copies, and reads the module's current parameters at each
    call (so weights swapped or reloaded later are used)."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Linear):
        self.module = module

    def __call__(self, input: Tensor) -> Tensor:
        m = self.module
        return linear(input, m.weight, m.bias)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FastForward, (self.module,))

    def __repr__(self) -> str:
        return f"<specc fast forward of {self.module!r}>"


def accelerate(model: nn.Module) -> int:
    """Route every submodule of type exactly ``nn.Linear`` (the model itself included) and every tied head
    through ``linear``; return how many."""
    from .layers import TiedLinear

    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            if not isinstance(module.__dict__.get("forward"), FastForward):
                module.forward = FastForward(module)
            count += 1
        elif isinstance(module, TiedLinear):  # a head tied to the embedding: its kernel slot
            module.kernel = linear
            count += 1
    return count


def restore(model: nn.Module) -> int:
    """Undo ``accelerate``: remove the instance-level forwards it set; return how many."""
    count = 0
    for module in model.modules():
        if isinstance(module.__dict__.get("forward"), FastForward):
            del module.forward
            count += 1
        elif getattr(module, "kernel", None) is linear:
            module.kernel = None
            count += 1
    return count
