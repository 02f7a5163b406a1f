"""The base of generated models: tied parameters, seeded initialisation, prefill and one-step decoding, generation.

A tied head is a plain ``nn.Linear`` (a tied embedding a plain ``nn.Embedding``) whose ``weight`` IS the owner's
Parameter, as Hugging Face ties them. ``TIED`` (parameter → the parameter it is: the IR's ``tied_to``) is applied
by ``tie_weights`` after construction, ``to`` / ``to_empty`` and ``load_state_dict``; the state dict holds each
tensor once, under the owner's name (the IR's parameter names), and loading takes either name or both.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .generation import GenerationError, pick_tokens
from .state import KVCache, State


def init_rule(module: nn.Module, local: str) -> str:
    """How a parameter starts: normal (std) | zeros | ones | rnn (U(±1/√H), PyTorch's recurrent default) |
    constant (the value in the module's ``constants``) | sinusoids (the module's own table); zeros for biases,
    the parameters a module lists in ``zeros`` and a norm's weight where it scales by (1 + weight)."""
    if local in getattr(module, "constants", ()):
        return "constant"
    if isinstance(module, nn.RNNBase) or hasattr(module, "cell"):
        return "rnn"
    if hasattr(module, "sinusoids"):  # a fixed table (Whisper's positions): computed, not drawn
        return "sinusoids"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return "ones" if local == "weight" and not getattr(module, "unit_offset", False) else "zeros"
    if local in getattr(module, "zeros", ()):  # a module's own biases by other names (MoE's b_*, score_bias)
        return "zeros"
    return "zeros" if local == "bias" else "normal"


def param_owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """(the module holding parameter ``name``, its local name)."""
    path, _, local = name.rpartition(".")
    return model.get_submodule(path), local


class Model(nn.Module):
    """Subclasses set TIED, INPUTS, META, RESIDUAL, define ``forward`` and end ``__init__`` with ``tie_weights()``."""

    TIED: ClassVar[dict[str, str]] = {}  # parameter → the owner's parameter it IS (a head tied to the embedding)
    INPUTS: ClassVar[tuple[str, ...]] = ()  # forward's tensor arguments, as the graph names them (and OUTPUTS)
    OUTPUTS = INPUTS
    STEP_INPUT: str | None = None  # the input that grows by one token per generated token
    META: ClassVar[dict[str, Any]] = {}  # task, vocab_size, max_positions, init_std, residual_std, seed, ...
    RESIDUAL = r"$^"  # parameters initialised with std / sqrt(2 · layers)

    def __init__(self) -> None:
        super().__init__()
        if self.TIED:  # a tied tensor is saved once and loads under either name
            self.register_state_dict_post_hook(_tied_names)
            self.register_load_state_dict_pre_hook(_tied_names)
            self.register_load_state_dict_post_hook(Model.tie_weights)

    def tie_weights(self, *_: Any) -> None:
        """Make each TIED parameter its owner's Parameter object (also after load_state_dict, whose ``assign``
        gives each name a Parameter of its own, and after ``_apply``, which may replace them one by one)."""
        for alias, owner in self.TIED.items():
            if self.holds(alias):
                setattr(*param_owner(self, alias), self.get_parameter(owner))

    def holds(self, name: str) -> bool:
        """Whether parameter ``name`` is one (not where a head was quantized into packed weights, or wrapped)."""
        module, local = param_owner(self, name)
        return isinstance(module._parameters.get(local), nn.Parameter)

    def _apply(self, fn: Any, recurse: bool = True) -> nn.Module:
        super()._apply(fn, recurse)
        if self.TIED:
            self.tie_weights()
        return self

    def init_weights(self, place: Any = None) -> nn.Module:
        """fp32 CPU draws from one seeded generator in parameter order; ``place(name, param, t)``: a shard's copy."""
        gen = torch.Generator().manual_seed(int(self.META["seed"]))
        with torch.no_grad():
            for name, param in self.named_parameters():  # a tied parameter once, under its owner's name
                owner, local = param_owner(self, name)
                rule, t = init_rule(owner, local), torch.empty(param.shape)
                if rule in ("zeros", "ones"):
                    t.fill_(float(rule == "ones"))
                elif rule == "constant":
                    t.fill_(owner.constants[local])
                elif rule == "rnn":
                    bound = (owner.hidden_size if isinstance(owner, nn.RNNBase) else owner.hidden) ** -0.5
                    t.uniform_(-bound, bound, generator=gen)
                elif rule == "sinusoids":
                    t.copy_(owner.sinusoids())
                else:
                    residual = re.match(self.RESIDUAL, name)
                    t.normal_(0.0, self.META["residual_std" if residual else "init_std"], generator=gen)
                param.copy_(t) if place is None else place(name, param, t)
        return self

    def start(self, inputs: dict[str, Tensor | None], max_len: int) -> KVCache:
        """A cache for ``max_len`` tokens, keeping the inputs that do not grow (the source sequence)."""
        grows = (self.STEP_INPUT, self.META.get("positions_follow"))
        return KVCache(max_len, {k: v for k, v in inputs.items() if k not in grows})

    def step(self, cache: KVCache, tokens: Tensor, **growing: Tensor | None) -> Tensor:
        """Feed tokens [B, n] after the cached ones (and the mask so far); logits of the last position [B, 1, V]."""
        state = State(cache, growing.get(self.META.get("positions_follow")), last_only=True)
        args = {**cache.inputs, **growing, self.STEP_INPUT: tokens}
        logits = self(**{k: args.get(k) for k in self.INPUTS}, state=state)
        cache.length += tokens.shape[1]
        return logits

    @torch.no_grad()  # not inference_mode: the returned ids may feed a model that trains
    def generate(
        self, input_ids: Tensor, max_new_tokens: int, attention_mask: Tensor | None = None, **options: Any
    ) -> Tensor:
        """The sequence with up to ``max_new_tokens`` appended: decoders extend ``input_ids`` (left padding
        allowed), encoder-decoders ``decoder_input_ids`` after ``decoder_start_token_id`` (default: the spec's, else
        1) from the source ``input_ids`` (token ids, or Whisper's input_features). Options: ``seed``,
        ``eos_token_id``, ``use_cache`` (False: recompute every step) and pick_tokens' temperature / top_k / top_p."""
        seq2seq = self.STEP_INPUT == "decoder_input_ids"
        if attention_mask is not None and "attention_mask" not in self.INPUTS:  # Whisper: input_features alone
            raise GenerationError(f"{type(self).__name__} takes no attention_mask")
        if seq2seq:  # the source: token ids with their mask, or (Whisper) input_features alone
            source = {self.INPUTS[0]: input_ids, "attention_mask": attention_mask}
            fixed = {k: v for k, v in source.items() if k in self.INPUTS}
            first = options.pop("decoder_start_token_id", self.META.get("decoder_start_token_id", 1))
            start = input_ids.new_full((len(input_ids), 1), first, dtype=torch.long)
            prompt = options.pop("decoder_input_ids", None)
            prompt = start if prompt is None else prompt
        else:
            prompt = input_ids
            fixed = {}
        seed, eos_token_id = options.pop("seed", None), options.pop("eos_token_id", None)
        use_cache = options.pop("use_cache", True)  # the rest of the options: sampling
        b, n = prompt.shape
        if "max_positions" in self.META and n + max_new_tokens > (limit := self.META["max_positions"]):
            raise GenerationError(f"{n} prompt + {max_new_tokens} new tokens exceed the {limit} learned positions")
        tokens = torch.cat((prompt, prompt.new_zeros(b, max_new_tokens)), 1)
        mask = None if seq2seq or attention_mask is None else F.pad(attention_mask, (0, max_new_tokens), value=1)
        gen = None if seed is None else torch.Generator(prompt.device).manual_seed(seed)
        done, was_training = torch.zeros(b, dtype=torch.bool, device=prompt.device), self.training
        cache = self.start(fixed, tokens.shape[1]) if use_cache else None
        try:
            self.eval()
            while n < tokens.shape[1] and not (eos_token_id is not None and bool(done.all())):
                grown = {} if mask is None else {"attention_mask": mask[:, :n]}
                rebuild = "rebuild_cache_after" in self.META and cache is not None  # RoPE switches frequencies
                if rebuild and cache.length <= self.META["rebuild_cache_after"] < n:
                    cache = self.start(fixed, tokens.shape[1])  # every key again, under the new frequencies
                if cache is not None and ("prefix" not in self.META or n >= self.META["prefix"]):
                    logits = self.step(cache, tokens[:, cache.length : n], **grown)
                else:  # all tokens again: no cache, or attention that is not causal yet
                    logits = self(**{self.STEP_INPUT: tokens[:, :n], **fixed, **grown})
                nxt = pick_tokens(logits[:, -1], gen, **options)
                if eos_token_id is not None:  # finished rows repeat eos
                    done |= (nxt := nxt.masked_fill(done, eos_token_id)) == eos_token_id
                tokens[:, n], n = nxt, n + 1
        finally:
            self.train(was_training)
        return tokens[:, :n]


def _tied_names(model: Model, state: dict[str, Any], prefix: str, meta: Any, *loading: Any) -> None:
    """As a state_dict post-hook: a tied tensor is saved once, under its owner's name. As a load_state_dict
    pre-hook: either name of a tied pair fills both (the owner's tensor wins where both are given)."""
    for a, o in ((prefix + alias, prefix + owner) for alias, owner in model.TIED.items() if model.holds(alias)):
        if not loading:
            state.pop(a, None)
        elif o in state or a in state:
            state[a] = state[o] = state[o] if o in state else state[a]
