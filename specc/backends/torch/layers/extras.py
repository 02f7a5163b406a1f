"""What specc adds to built models beyond model.py: outputs by name, the explicit softmax path, attention maps,
the MoE auxiliary loss, and the seam of passes applied from outside (``Override``, ``SpeccModel.plain``).
Generated sources import ``SpeccModel as Model``; a standalone model.py has the plain ``Model`` (the same
generated classes, without these conveniences)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .attention import AttentionCore, math_attention
from .generation import GenerationError
from .model import Model


def math_product(core: AttentionCore, *args: Any) -> Tensor:
    """An attention core's ``product`` by the explicit softmax (set on the instance: ``attention_impl``)."""
    return math_attention(core, *args)[0]


def recording_product(maps: dict[str, Tensor], name: str, core: AttentionCore, *args: Any) -> Tensor:
    """The explicit softmax, its probabilities kept in ``maps[name]`` (``attention_maps``)."""
    y, probs = math_attention(core, *args)
    maps[name] = probs.detach()
    return y


def _product(core: AttentionCore) -> Any:
    """The function behind an instance-level ``product`` (None: the class's own)."""
    return getattr(core.__dict__.get("product"), "func", None)


class Override:
    """An instance-level method (``forward``, ``step``, ...) that a pass applied from outside sets on one module
    of a built model (specc.backends.torch.accel); ``SpeccModel.plain()`` removes every one. A small class
    rather than a bound method or closure: pickle stores a bound method as ``getattr(module, name)``, which
    cannot be resolved while the module itself is being unpickled; this one pickles (torch.save of a whole
    model), deep-copies (state it caches is dropped) and reads the module's current parameters at each call."""

    __slots__ = ("module",)

    def __init__(self, module: nn.Module):
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.module,))

    def __repr__(self) -> str:
        return f"<specc {type(self).__name__} of {type(self.module).__name__}>"


def overrides(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Every (module, attribute) of the tree where a pass set an ``Override``."""
    return [(m, k) for m in model.modules() for k, v in m.__dict__.items() if isinstance(v, Override)]


class SpeccModel(Model):
    """``Model`` plus what specc's tools use: ``run``, ``attention_impl``, ``attention_maps``, ``aux_loss``."""

    def run(self, inputs: dict[str, Tensor | None], state: Any = None) -> dict[str, Tensor]:
        """Every graph output by name, from inputs by name (missing optional inputs are None)."""
        args = {name: inputs.get(name) for name in self.INPUTS}
        if "logits" in self.OUTPUTS and len(self.OUTPUTS) > 1:
            return self(**args, state=state, return_all=True)
        out = self(**args, state=state)
        return out if isinstance(out, dict) else {self.OUTPUTS[0]: out}

    @property
    def attention_impl(self) -> str:
        """sdpa (fused kernels) | math (explicit softmax, set or forced: soft-capped layers have no SDPA path) |
        mixed, over every attention layer."""
        cores = [m for m in self.modules() if isinstance(m, AttentionCore)]
        math = [_product(m) is math_product or getattr(m, "softcap", None) for m in cores]
        return "math" if cores and all(math) else "mixed" if any(math) else "sdpa"

    @attention_impl.setter
    def attention_impl(self, impl: str) -> None:
        if impl not in ("sdpa", "math"):
            raise ValueError(f"attention impl {impl!r}: use 'sdpa' or 'math'")
        for m in self.modules():
            if isinstance(m, AttentionCore):
                if impl == "math":
                    m.product = functools.partial(math_product, m)
                else:
                    m.__dict__.pop("product", None)

    @contextlib.contextmanager
    def attention_maps(self) -> Iterator[dict[str, Tensor]]:
        """Record attention probabilities by scope name inside the block, on the explicit softmax path:
        attention cores give [B, H, N_q, N_k], recurrent decoders [B, N_dec, N] (the alignment a_{t,i})."""
        maps: dict[str, Tensor] = {}
        saved = []
        for name, m in self.named_modules():
            if isinstance(m, AttentionCore):
                saved.append((m, "product", m.__dict__.get("product")))
                m.product = functools.partial(recording_product, maps, name, m)
            elif hasattr(m, "recorder"):
                saved.append((m, "recorder", m.recorder))
                m.recorder = (maps, name)
        try:
            yield maps
        finally:
            for m, attr, value in saved:
                if attr == "product" and value is None:  # the class's own again
                    del m.__dict__["product"]
                else:
                    setattr(m, attr, value)

    def generate(self, input_ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None, *,
                 compile: bool = False, **options: Any) -> Tensor:  # fmt: skip
        """``Model.generate``. ``compile=True`` (each one-token step through ``torch.compile``) is served by the
        acceleration pass, which overrides this method on the instance; a plain model refuses it."""
        if compile:
            raise GenerationError(
                "compiled decoding comes with the acceleration pass: build_torch(..., accelerate=True) "
                "without SPECC_ACCEL=0"
            )
        return super().generate(input_ids, max_new_tokens, attention_mask, **options)

    def plain(self) -> SpeccModel:
        """Undo every pass applied from outside (the acceleration pass): the plain generated module tree, the
        same logits; returns the model itself."""
        for module, name in overrides(self):
            del module.__dict__[name]
        return self

    def aux_loss(self) -> Tensor | None:
        """Sum of the MoE load-balancing losses of the last training forward (None without MoE or coef)."""
        losses = [m.aux_loss for m in self.modules() if isinstance(getattr(m, "aux_loss", None), Tensor)]
        return torch.stack(losses).sum() if losses else None

    def max_positions(self) -> int | None:
        """Longest sequence the learned position tables cover (None: unbounded)."""
        return self.META.get("max_positions")

    @property
    def step_input(self) -> str:
        if self.STEP_INPUT is None:  # AttributeError: hasattr() (and jit.trace's attribute scan) stay quiet
            raise AttributeError(f"{type(self).__name__} does not generate")
        return self.STEP_INPUT

    def growing_inputs(self) -> list[str]:
        """Inputs laid out along the generated sequence (a decoder's attention_mask)."""
        follow = self.META.get("positions_follow")
        return [follow] if follow else []


def generate(model: Model, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
    """``model.generate(input_ids, max_new_tokens, **options)``."""
    return model.generate(input_ids, max_new_tokens, **options)
