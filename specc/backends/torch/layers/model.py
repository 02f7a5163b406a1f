"""The model base class: named inputs and outputs, seeded initialisation, attention maps, decoding steps."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from .generation import generate
from .state import KVCache, State


def init_rule(module: nn.Module, local: str) -> str:
    """How a parameter starts: normal (std) | zeros | ones | rnn (U(±1/√H), PyTorch's recurrent default)."""
    if isinstance(module, nn.RNNBase) or hasattr(module, "cell"):
        return "rnn"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return "ones" if local == "weight" else "zeros"
    return "zeros" if local == "bias" or local.startswith("b_") else "normal"


class Model(nn.Module):
    """Base of every generated model. Subclasses set the class facts below and define ``forward``."""

    INPUTS: tuple[str, ...] = ()  # forward's tensor arguments, as the graph names them
    OUTPUTS: tuple[str, ...] = ()  # what ``run`` returns
    STEP_INPUT: str | None = None  # the input that grows by one token per generated token
    META: dict[str, Any] = {}  # task, vocab_size, max_positions, init_std, residual_std, seed, ...
    RESIDUAL = r"$^"  # parameters initialised with std / sqrt(2 · layers)

    # -- running -----------------------------------------------------------------------------------------

    def run(self, inputs: dict[str, Tensor | None], state: State | None = None) -> dict[str, Tensor]:
        """Every graph output by name, from inputs by name (missing optional inputs are None)."""
        args = {name: inputs.get(name) for name in self.INPUTS}
        if "logits" in self.OUTPUTS and len(self.OUTPUTS) > 1:
            return self(**args, state=state, return_all=True)
        out = self(**args, state=state)
        return out if isinstance(out, dict) else {self.OUTPUTS[0]: out}

    @property
    def attention_impl(self) -> str:
        """sdpa (fused kernels) | math (explicit softmax), for every attention layer."""
        return next((m.impl for m in self.modules() if hasattr(m, "impl")), "sdpa")

    @attention_impl.setter
    def attention_impl(self, impl: str) -> None:
        if impl not in ("sdpa", "math"):
            raise ValueError(f"attention impl {impl!r}: use 'sdpa' or 'math'")
        for m in self.modules():
            if hasattr(m, "impl"):
                m.impl = impl

    @contextlib.contextmanager
    def attention_maps(self) -> Iterator[dict[str, Tensor]]:
        """Record attention probabilities by scope name on the explicit softmax path, inside the block:
        attention cores give [B, H, N_q, N_k], recurrent decoders [B, N_dec, N] (the alignment a_{t,i})."""
        maps: dict[str, Tensor] = {}
        layers = [(n, m) for n, m in self.named_modules() if hasattr(m, "recorder")]
        for name, m in layers:
            m.recorder = (maps, name)
        try:
            yield maps
        finally:
            for _, m in layers:
                m.recorder = None

    # -- weights -----------------------------------------------------------------------------------------

    def init_weights(self) -> None:
        """Deterministic initialisation from META (seed, init_std, residual_std): values drawn on the CPU in
        fp32 from one seeded generator in parameter order, so a seed gives the same weights everywhere."""
        gen = torch.Generator().manual_seed(int(self.META.get("seed", 0)))
        residual = re.compile(self.RESIDUAL)
        with torch.no_grad():
            for owner_name, owner in self.named_modules():
                for local, param in owner.named_parameters(recurse=False):
                    name = f"{owner_name}.{local}" if owner_name else local
                    rule = init_rule(owner, local)
                    if rule in ("zeros", "ones"):
                        param.fill_(1.0 if rule == "ones" else 0.0)
                        continue
                    t = torch.empty(param.shape)
                    if rule == "rnn":
                        bound = 1.0 / math.sqrt(getattr(owner, "hidden_size", getattr(owner, "hidden", 1)))
                        t.uniform_(-bound, bound, generator=gen)
                    else:
                        std = self.META["residual_std"] if residual.match(name) else self.META["init_std"]
                        t.normal_(0.0, std, generator=gen)
                    param.copy_(t)

    # -- decoding ----------------------------------------------------------------------------------------

    def max_positions(self) -> int | None:
        """Longest sequence the learned position tables cover (None: unbounded)."""
        return self.META.get("max_positions")

    @property
    def step_input(self) -> str:
        assert self.STEP_INPUT is not None, f"{type(self).__name__} does not generate"
        return self.STEP_INPUT

    def growing_inputs(self) -> list[str]:
        """Inputs laid out along the generated sequence (a decoder's attention_mask)."""
        return ["attention_mask"] if self.META.get("positions_follow") == "attention_mask" else []

    def start(self, inputs: dict[str, Tensor | None], max_len: int) -> KVCache:
        """A cache for up to ``max_len`` tokens; inputs that do not grow (the source sequence) are kept."""
        cache = KVCache(max_len)
        cache.inputs = {k: v for k, v in inputs.items() if k != self.step_input and k not in self.growing_inputs()}
        return cache

    def step(self, cache: KVCache, tokens: Tensor, **growing: Tensor | None) -> Tensor:
        """Feed new tokens [B, n] after the cached ones; returns the logits of the last position [B, 1, V]."""
        mask = growing.get("attention_mask") if self.growing_inputs() else None
        state = State(cache, positions_from=mask, last_only=True)
        args = {name: cache.inputs.get(name) for name in self.INPUTS}
        args.update(growing)
        args[self.step_input] = tokens
        logits = self.run(args, state)["logits"]
        cache.length += tokens.shape[1]
        return logits

    def generate(self, input_ids: Tensor, max_new_tokens: int, **options: Any) -> Tensor:
        """Greedy or sampled continuation with the KV cache; see ``generate`` for the options."""
        return generate(self, input_ids, max_new_tokens, **options)

    def aux_loss(self) -> Tensor | None:
        """Sum of the MoE load-balancing losses of the last training forward (None without MoE or coef)."""
        losses = [m.aux_loss for m in self.modules() if isinstance(getattr(m, "aux_loss", None), Tensor)]
        return torch.stack(losses).sum() if losses else None


