"""Mixture of experts: each token goes to its top-`active` experts; expert weights are [E, out, in]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .activations import quick_gelu

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "quick_gelu": quick_gelu,
    "tanh": torch.tanh,
}


def _traced() -> bool:
    """Graph capture (compile, export, jit.trace) cannot follow data-dependent shapes."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()


class MoE(nn.Module):
    """Gates = softmax(router logits), top-`active` per token (renormalised when `normalize`); DeepSeek's
    routing (sigmoid scores, a selection-only ``score_bias``, group-limited top-k, ``routed_scale``) in ``select``.

    Training only: `jitter` multiplies the router input by U(1 - jitter, 1 + jitter) (Switch Transformer;
    the router is the caller's linear, so the noise is applied by ``route``), and ``aux_loss`` holds the
    load-balancing loss coef · E · Σ_e f_e · P_e of the last call (f_e: fraction of the top-k assignments
    that went to e, P_e: mean gate probability of e), which ``specc train`` adds to the loss.
    """

    zeros = ("b_gate", "b_up", "b_in", "b_down", "b_out", "score_bias")  # init_weights: these start at 0

    def __init__(
        self,
        experts: int,
        active: int,
        dim: int,
        hidden: int,
        expert: str = "swiglu",
        activation: str = "silu",
        normalize: bool = True,
        bias: bool = False,
        aux_loss_coef: float = 0.0,
        jitter: float = 0.0,
        score: str = "softmax",
        score_bias: bool = False,
        groups: int = 1,
        top_groups: int = 1,
        group_score: str = "max",
        routed_scale: float = 1.0,
        clamp_limit: float | None = None,
        clamp_alpha: float = 1.702,
        weigh_input: bool = False,
    ):
        super().__init__()
        self.experts, self.active, self.dim, self.hidden = experts, active, dim, hidden
        self.swiglu, self.activation, self.normalize = expert == "swiglu", activation, normalize
        self.aux_loss_coef, self.jitter = aux_loss_coef, jitter
        self.aux_loss: Tensor | None = None
        e = experts
        names = (
            [("w_gate", (e, hidden, dim)), ("w_up", (e, hidden, dim))] if self.swiglu else [("w_in", (e, hidden, dim))]
        )
        names.append(("w_down" if self.swiglu else "w_out", (e, dim, hidden)))
        if bias:
            names += [("b_gate", (e, hidden)), ("b_up", (e, hidden))] if self.swiglu else [("b_in", (e, hidden))]
            names.append(("b_down" if self.swiglu else "b_out", (e, dim)))
        for name, shape in names:
            self.register_parameter(name, nn.Parameter(torch.empty(shape)))
        self.bias = bias
        self.score, self.groups, self.top_groups = score, groups, top_groups
        self.group_score, self.routed_scale = group_score, routed_scale
        self.clamp_limit, self.clamp_alpha = clamp_limit, clamp_alpha
        self.weigh_input = weigh_input  # Llama 4: expert(gate · x) instead of gate · expert(x)
        if score_bias:  # chooses experts only (no gradient reaches it through top-k indices)
            self.score_bias = nn.Parameter(torch.empty(e))
        else:
            self.score_bias = None

    def _b(self, name: str, e: int) -> Tensor | None:
        return getattr(self, name)[e] if self.bias else None

    def expert(self, e: int, x: Tensor) -> Tensor:
        act = ACTIVATIONS[self.activation]
        if self.swiglu:
            gate, up = F.linear(x, self.w_gate[e], self._b("b_gate", e)), F.linear(x, self.w_up[e], self._b("b_up", e))
            if self.clamp_limit is not None:  # GPT-OSS: clamped, σ(α·gate), up + 1
                gate, up = gate.clamp(max=self.clamp_limit), up.clamp(-self.clamp_limit, self.clamp_limit)
                h = (up + 1) * gate * torch.sigmoid(gate * self.clamp_alpha)
            else:
                h = act(gate) * up
            return F.linear(h, self.w_down[e], self._b("b_down", e))
        return F.linear(act(F.linear(x, self.w_in[e], self._b("b_in", e))), self.w_out[e], self._b("b_out", e))

    def route(self, x: Tensor) -> Tensor:
        """The router's input: x, multiplied by the jitter noise in training."""
        if self.training and self.jitter:
            return x * torch.empty_like(x).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        return x

    def select(self, router_logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The routing: (gate weights [T, A] fp32, chosen experts [T, A], scores [T, E] fp32)."""
        logits = router_logits.reshape(-1, self.experts).float()
        probs = logits.softmax(-1) if self.score == "softmax" else logits.sigmoid()
        if self.score_bias is None and self.groups == 1:
            weights, chosen = probs.topk(self.active, -1)
        else:
            choice = probs if self.score_bias is None else probs + self.score_bias.float()
            if self.groups > 1:  # keep the experts of the top_groups best groups (DeepSeek)
                grouped = choice.view(-1, self.groups, self.experts // self.groups)
                best = grouped.max(-1).values if self.group_score == "max" else grouped.topk(2, -1).values.sum(-1)
                keep = torch.zeros_like(best).scatter(1, best.topk(self.top_groups, -1).indices, 1.0)  # traceable
                choice = choice.masked_fill(keep.repeat_interleave(self.experts // self.groups, 1) == 0, float("-inf"))
            chosen = choice.topk(self.active, -1).indices
            weights = probs.gather(1, chosen)
        if self.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        if self.routed_scale != 1.0:
            weights = weights * self.routed_scale
        return weights, chosen, probs

    def forward(self, x: Tensor, router_logits: Tensor) -> Tensor:
        tokens = x.reshape(-1, self.dim)
        weights, chosen, probs = self.select(router_logits)  # [T, A]
        weights = weights.to(x.dtype)
        if self.training and self.aux_loss_coef:
            routed = F.one_hot(chosen, self.experts).float().sum(1).mean(0) / self.active  # f_e
            self.aux_loss = self.aux_loss_coef * self.experts * (routed * probs.mean(0)).sum()
        elif self.aux_loss is not None:
            self.aux_loss = None
        if _traced() or x.is_meta:  # every expert on every token, keep the chosen: static shapes
            combine = torch.zeros(tokens.shape[0], self.experts, dtype=x.dtype, device=x.device)
            combine = combine.scatter(1, chosen, weights)
            if self.weigh_input:  # an expert not chosen adds nothing, even with biases
                hit = torch.zeros_like(combine).scatter(1, chosen, 1.0)
                out = sum(hit[:, e, None] * self.expert(e, combine[:, e, None] * tokens) for e in range(self.experts))
            else:
                out = sum(combine[:, e, None] * self.expert(e, tokens) for e in range(self.experts))
            return out.reshape(x.shape)
        # Dispatch: sort the T·A (token, expert) assignments by expert, run each expert once on its tokens.
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        token_of = order // self.active
        counts = torch.bincount(flat, minlength=self.experts).tolist()  # the one host sync per layer
        routed_tokens = tokens[token_of]
        gate = weights.reshape(-1)[order, None]
        if self.weigh_input:
            routed_tokens = routed_tokens * gate
        out_sorted = torch.empty_like(routed_tokens)
        start = 0
        for e, count in enumerate(counts):
            if count:
                out_sorted[start : start + count] = self.expert(e, routed_tokens[start : start + count])
                start += count
        if not self.weigh_input:
            out_sorted = out_sorted * gate
        return torch.zeros_like(tokens).index_add_(0, token_of, out_sorted).reshape(x.shape)

    def extra_repr(self) -> str:
        kind = "swiglu" if self.swiglu else self.activation
        extra = f", score={self.score}" if self.score != "softmax" else ""
        extra += f", groups={self.top_groups}/{self.groups}" if self.groups > 1 else ""
        return (
            f"experts={self.experts}, active={self.active}, dim={self.dim}, hidden={self.hidden}, expert={kind}{extra}"
        )
