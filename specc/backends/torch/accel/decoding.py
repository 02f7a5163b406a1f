"""The acceleration pass's decoding: ``step``, ``start`` and ``generate`` set on a model's instance.

``Step``: a one-token step after a prefill runs natively (decode_native) where that computes what the eager
step computes and was measured faster; a step over a static cache runs the compiled step. ``Generate`` adds
``compile=True``: each one-token step through ``torch.compile`` over a static cache (compiled.py), with
``CompiledStart`` set for the call. Every other call is the class's own method.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..layers.extras import Override
from ..layers.generation import GenerationError
from ..layers.state import KVCache
from . import decode_native
from .compiled import CompiledDecoder, StaticCache


class Step(Override):
    """``model.step(cache, tokens, **growing)``: compiled, native or the class's eager step."""

    __slots__ = ()

    def __call__(self, cache: KVCache, tokens: Tensor, **growing: Tensor | None) -> Tensor:
        model = self.module
        if isinstance(cache, StaticCache) and tokens.shape[1] == 1 and cache.length:  # prefill: eager
            return cache.decoder.step(cache, tokens, growing.get("attention_mask"))
        native = decode_native.stepper(model) if cache.length else None  # one-token steps after a prefill
        if native is not None and native.usable(model, cache, tokens, growing.get("attention_mask")):
            return native.step(cache, tokens, lambda: type(model).step(model, cache, tokens, **growing))
        return type(model).step(model, cache, tokens, **growing)


class CompiledStart(Override):
    """``model.start`` during a compiled ``generate``: the decoder's static cache in place of a KVCache."""

    __slots__ = ("decoder",)

    def __init__(self, module: Any, decoder: CompiledDecoder | None = None):
        super().__init__(module)
        self.decoder = decoder

    def __call__(self, inputs: dict[str, Tensor | None], max_len: int) -> KVCache:
        cache = type(self.module).start(self.module, inputs, max_len)
        return cache if self.decoder is None else self.decoder.start(cache)


class Generate(Override):
    """``model.generate(..., compile=False, **options)``; ``compile=True``: each one-token step through
    ``torch.compile`` over a static cache (CUDA graphs on CUDA), compiled at the first call of a shape; the
    prompt runs eagerly. The compiled decoder is kept here (made once per device: compiling takes seconds)."""

    __slots__ = ("decoder",)

    def __init__(self, module: Any):
        super().__init__(module)
        self.decoder: CompiledDecoder | None = None

    def __call__(self, input_ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None, *,
                 compile: bool = False, **options: Any) -> Tensor:  # fmt: skip
        model, plain = self.module, type(self.module).generate
        if not compile:
            return plain(model, input_ids, max_new_tokens, attention_mask, **options)
        if options.get("use_cache") is False:
            raise GenerationError("compiled decoding steps through the KV cache: use_cache=False recomputes")
        if self.decoder is None or self.decoder.device != input_ids.device:
            self.decoder = CompiledDecoder(model, input_ids.device)
        model.start = CompiledStart(model, self.decoder)
        try:
            return plain(model, input_ids, max_new_tokens, attention_mask, **options)
        finally:
            del model.start
