"""Recurrent seq2seq layers: padded sequences through nn.GRU / nn.LSTM / nn.RNN, and the attention decoder."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .state import State


def rnn_states(rnn: nn.RNNBase, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """Every hidden state [B, N, directions · hidden] of an nn.GRU / nn.LSTM / nn.RNN; right padding is packed."""
    if attention_mask is None:
        return rnn(x)[0]
    lengths = attention_mask.sum(1).cpu()  # right padding: the first `length` tokens of each row are real
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    return nn.utils.rnn.pad_packed_sequence(rnn(packed)[0], batch_first=True, total_length=x.shape[1])[0]


CELLS = {"gru": (3, torch.gru_cell), "lstm": (4, torch.lstm_cell), "rnn": (1, torch.rnn_tanh_cell)}


class RNNDecoder(nn.Module):
    """Recurrent decoder with fixed context (attention none), Bahdanau or Luong (dot | general) attention.

    The initial state of every layer is tanh(bridge(h_final)), h_final the encoder's last state ([forward
    h_T | backward h_1] for a bidirectional encoder), which is also the fixed context. Output per step:
    [s_t | c_t]. Bahdanau attends with s_{t-1} and feeds c_t into the cell; Luong attends with s_t after it.
    """

    def __init__(
        self,
        cell: str,
        input_size: int,
        hidden: int,
        layers: int,
        enc_dim: int,
        enc_directions: int = 1,
        attention: str = "bahdanau",
        attention_dim: int | None = None,
    ):
        super().__init__()
        self.cell, self.hidden, self.layers, self.attention = cell, hidden, layers, attention  # `cell`: init U(±1/√H)
        self.two_way = enc_directions == 2
        gates = CELLS[cell][0] * hidden
        cell_in = input_size + (0 if attention.startswith("luong") else enc_dim)
        for k in range(layers):
            n_in = cell_in if k == 0 else hidden
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(gates, n_in)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(gates, hidden)))
            self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(gates)))
            self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(gates)))
        self.bridge = nn.Linear(enc_dim, hidden)
        if attention == "bahdanau":
            ad = attention_dim or hidden
            self.attn_query = nn.Linear(hidden, ad, bias=False)
            self.attn_key = nn.Linear(enc_dim, ad)
            self.attn_v = nn.Linear(ad, 1, bias=False)
        elif attention == "luong_general":
            self.attn_general = nn.Linear(enc_dim, hidden, bias=False)
        self.recorder: tuple[dict[str, Tensor], str] | None = None  # set by Model.attention_maps()

    def _weights(self, k: int) -> tuple[Tensor, ...]:
        return tuple(getattr(self, f"{w}_l{k}") for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def begin(self, memory: Tensor, pad: Tensor | None) -> dict[str, Any]:
        """Initial state s_0 = tanh(bridge(h_final)) in every layer; the attention keys, once."""
        b, n = memory.shape[0], memory.shape[1]
        last = pad.sum(1) - 1 if pad is not None else torch.full((b,), n - 1, device=memory.device)
        h_final = memory[torch.arange(b, device=memory.device), last]
        if self.two_way:  # forward direction ends at the last real token, backward at the first
            h_final = torch.cat((h_final[:, : self.hidden], memory[:, 0, self.hidden :]), -1)
        s0 = torch.tanh(self.bridge(h_final))
        state: dict[str, Any] = {"h": [s0] * self.layers, "c": [torch.zeros_like(s0)] * self.layers}
        state["context"] = h_final
        if self.attention == "bahdanau":
            state["keys"] = self.attn_key(memory)  # U h_i + b
        elif self.attention == "luong_general":
            state["keys"] = self.attn_general(memory)  # W h_i, so score = s · (W h_i)
        elif self.attention == "luong_dot":
            state["keys"] = memory
        return state

    def attend(self, keys: Tensor, s: Tensor, memory: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.attention == "bahdanau":  # e_i = vᵀ tanh(W s + U h_i)
            e = self.attn_v(torch.tanh(keys + self.attn_query(s)[:, None]))[..., 0]
        else:  # Luong: e_i = s · h_i (dot) or s · W h_i (general)
            e = torch.bmm(keys, s[:, :, None])[..., 0]
        if pad is not None:
            e = e.masked_fill(pad == 0, float("-inf"))
        probs = e.float().softmax(-1).to(memory.dtype)
        return torch.bmm(probs[:, None], memory)[:, 0], probs

    def forward(
        self, y: Tensor, memory: Tensor, attention_mask: Tensor | None = None, state: State | None = None
    ) -> Tensor:
        cache = state.cache if state is not None else None
        rec = cache.recurrent.get(self) if cache is not None else None
        if rec is None:
            rec = self.begin(memory, attention_mask)
            if cache is not None:
                cache.recurrent[self] = rec
        step = CELLS[self.cell][1]
        h, c = list(rec["h"]), list(rec["c"])
        outputs, maps = [], []
        luong = self.attention.startswith("luong")
        for t in range(y.shape[1]):  # one step per target token
            context = rec["context"]
            if self.attention == "bahdanau":
                context, probs = self.attend(rec["keys"], h[-1], memory, attention_mask)
                maps.append(probs)
            inp = y[:, t] if luong else torch.cat((y[:, t], context), -1)
            for k in range(self.layers):
                if self.cell == "lstm":
                    h[k], c[k] = step(inp, (h[k], c[k]), *self._weights(k))
                else:
                    h[k] = step(inp, h[k], *self._weights(k))
                inp = h[k]
            if luong:
                context, probs = self.attend(rec["keys"], h[-1], memory, attention_mask)
                maps.append(probs)
            outputs.append(torch.cat((h[-1], context), -1))
        rec["h"], rec["c"] = h, c
        if self.recorder is not None and maps:
            store, name = self.recorder
            store[name] = torch.stack(maps, 1).detach()  # [B, N_dec, N]
        return torch.stack(outputs, 1)

    def extra_repr(self) -> str:
        return f"cell={self.cell!r}, hidden={self.hidden}, layers={self.layers}, attention={self.attention!r}"
