"""What specc adds to built models beyond model.py: outputs by name, the explicit softmax path, attention maps,
the MoE auxiliary loss. Generated sources import ``SpeccModel as Model``; a standalone model.py has the plain
``Model`` (the same generated classes, without these conveniences)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .. import decode_native
from .attention import AttentionCore, math_attention
from .compiled import StaticCache, decoder_of
from .generation import GenerationError
from .model import Model
from .state import KVCache


def math_kernel(core: AttentionCore, *args: Any) -> Tensor:
    return math_attention(core, *args)[0]


def recording_kernel(maps: dict[str, Tensor], name: str, core: AttentionCore, *args: Any) -> Tensor:
    y, probs = math_attention(core, *args)
    maps[name] = probs.detach()
    return y


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
        math = [m.kernel is math_kernel or getattr(m, "softcap", None) for m in cores]
        return "math" if cores and all(math) else "mixed" if any(math) else "sdpa"

    @attention_impl.setter
    def attention_impl(self, impl: str) -> None:
        if impl not in ("sdpa", "math"):
            raise ValueError(f"attention impl {impl!r}: use 'sdpa' or 'math'")
        for m in self.modules():
            if isinstance(m, AttentionCore):
                m.kernel = math_kernel if impl == "math" else None

    @contextlib.contextmanager
    def attention_maps(self) -> Iterator[dict[str, Tensor]]:
        """Record attention probabilities by scope name inside the block, on the explicit softmax path:
        attention cores give [B, H, N_q, N_k], recurrent decoders [B, N_dec, N] (the alignment a_{t,i})."""
        maps: dict[str, Tensor] = {}
        saved = []
        for name, m in self.named_modules():
            if isinstance(m, AttentionCore):
                saved.append((m, "kernel", m.kernel))
                m.kernel = functools.partial(recording_kernel, maps, name)
            elif hasattr(m, "recorder"):
                saved.append((m, "recorder", m.recorder))
                m.recorder = (maps, name)
        try:
            yield maps
        finally:
            for m, attr, value in saved:
                setattr(m, attr, value)

    def generate(self, input_ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None, *,
                 compile: bool = False, **options: Any) -> Tensor:  # fmt: skip
        """``Model.generate``; ``compile``: each one-token step through ``torch.compile`` over a static cache
        (compiled.py: CUDA graphs on CUDA), compiled at the first call of a shape; the prompt runs eagerly."""
        if not compile:
            return super().generate(input_ids, max_new_tokens, attention_mask, **options)
        if options.get("use_cache") is False:
            raise GenerationError("compiled decoding steps through the KV cache: use_cache=False recomputes")
        self.__dict__["_decoding"] = decoder_of(self, input_ids.device)
        try:
            return super().generate(input_ids, max_new_tokens, attention_mask, **options)
        finally:
            del self.__dict__["_decoding"]

    def start(self, inputs: dict[str, Tensor | None], max_len: int) -> KVCache:
        decoder = self.__dict__.get("_decoding")
        return super().start(inputs, max_len) if decoder is None else decoder.start(super().start(inputs, max_len))

    def step(self, cache: KVCache, tokens: Tensor, **growing: Tensor | None) -> Tensor:
        if isinstance(cache, StaticCache) and tokens.shape[1] == 1 and cache.length:  # prefill: eager
            return self.__dict__["_compiled_decoder"].step(cache, tokens, growing.get("attention_mask"))
        native = decode_native.stepper(self) if cache.length else None  # one-token steps after a prefill
        if native is not None and native.usable(self, cache, tokens, growing.get("attention_mask")):
            return native.step(cache, tokens, lambda: super(SpeccModel, self).step(cache, tokens, **growing))
        return super().step(cache, tokens, **growing)

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
