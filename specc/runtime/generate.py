"""Greedy decoding over exported graphs: the KV-cache graph (one new token per call), a cache-less graph
(recompute the whole context), the encoder-decoder pair (encoder once, then the decoder with self and cross
caches), or the RNN encoder + one-step decoder pair.

Decoder-only batches may be left-padded (``attention_mask`` 0 on the left): every call gets the mask of all
tokens so far and, when the graph takes them, the new tokens' ``position_ids`` (HF's count: a padded row
generates what it would alone). Seq2seq decoders start every row at the start token (never padded).
A decoder-only graph whose cache may be one buffer per layer (``specc.kv_buffer: shared``) decodes into
max-length buffers that it appends to in place (kv_buffer.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import SpecError
from .inputs import DEFAULT_START_ID
from .kv_buffer import SharedKV, shares_buffer
from .onnx_model import OrtModel

OnToken = Callable[[int], None]


def greedy(
    model: OrtModel,
    feeds: dict[str, np.ndarray],
    max_new: int,
    start_id: int = DEFAULT_START_ID,
    eos_id: int | None = None,
    on_token: OnToken | None = None,
) -> np.ndarray:
    """New token ids [B, ≤ max_new] chosen by argmax. ``feeds``: checked inputs (input_ids, masks, ...)."""
    if max_new < 1:
        raise SpecError("--generate needs a positive number of tokens")
    family = model.family
    if model.split_decoder:
        _fits(model, max_new)
        return _encdec(model, feeds, max_new, start_id, eos_id, on_token)
    if model.role == "encoder":
        return _rnn(model, feeds, max_new, start_id, eos_id, on_token)
    if family == "decoder":
        return _decoder(model, feeds, max_new, eos_id, on_token)
    if family == "encoder_decoder":
        _fits(model, max_new)
        return _seq2seq(model, feeds, max_new, start_id, eos_id, on_token)
    raise SpecError(f"--generate needs a decoder; {model.path.name} is a {family or 'non-specc'} model")


def _fits(model: OrtModel, length: int) -> None:
    limit = model.max_positions
    if limit and length > limit:
        raise SpecError(
            f"generating to {length} tokens passes the model's {limit} learned positions", hint="ask for fewer tokens"
        )


class _Stopper:
    def __init__(self, batch: int, eos_id: int | None, on_token: OnToken | None) -> None:
        self.done = np.zeros(batch, bool)
        self.eos_id, self.on_token, self.tokens = eos_id, on_token, []

    def add(self, logits: np.ndarray) -> np.ndarray:
        nxt = logits[:, -1].astype(np.float32).argmax(-1).astype(np.int64)
        if self.eos_id is not None:
            nxt = np.where(self.done, self.eos_id, nxt)
            self.done |= nxt == self.eos_id
        self.tokens.append(nxt)
        if self.on_token:
            self.on_token(len(self.tokens))
        return nxt

    @property
    def finished(self) -> bool:
        return self.eos_id is not None and bool(self.done.all())

    def result(self) -> np.ndarray:
        return np.stack(self.tokens, 1)


def _empty_past(model: OrtModel, batch: int, role: str | None = None) -> dict[str, np.ndarray]:
    return {
        s.name: np.zeros((batch, s.shape[1], 0, s.shape[3]), s.dtype)
        for s in model.inputs(role)
        if s.name.startswith("past_key_values.")
    }


def _presents(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"past_key_values.{k[len('present.') :]}": v for k, v in out.items() if k.startswith("present.")}


def mask_positions(mask: np.ndarray) -> np.ndarray:
    """Positions of a (left-)padded batch as HF's generate counts them: cumsum(mask) - 1, padded slots 1 (the
    rule the exported graph applies when no ``position_ids`` are fed)."""
    mask = np.asarray(mask).astype(np.int64, copy=False)
    return np.where(mask != 0, np.cumsum(mask, 1) - 1, 1)


def _decoder(model: OrtModel, feeds: dict[str, np.ndarray], max_new: int, eos_id: int | None, on_token: OnToken | None):
    ids = feeds["input_ids"]
    batch = ids.shape[0]
    mask = feeds.get("attention_mask")
    takes = {s.name for s in model.inputs()}
    has_mask, has_pos = "attention_mask" in takes, "position_ids" in takes
    if mask is None:
        mask = np.ones(ids.shape, np.int64)
    # positions of every token so far [B, total]: the fed ones, else from the mask; each new token is its
    # row's last position + 1 (so a left-padded row counts from its first real token, as it would alone)
    derived = mask_positions(mask)[:, -ids.shape[1] :]
    pos = feeds.get("position_ids")
    pos = derived if pos is None else np.where(pos < 0, derived, pos)  # negative: derive, as the graph does
    _fits(model, int(pos.max(initial=0)) + max_new)
    stop = _Stopper(batch, eos_id, on_token)
    cached = model.kv_cache
    step = {"input_ids": ids, **({"attention_mask": mask} if has_mask else {})}
    if has_pos:
        step["position_ids"] = pos
    if cached:
        step.update(_empty_past(model, batch))
    rebuild = model.ir_meta.get("rebuild_cache_after")  # RoPE frequencies switch: recompute the cache once
    # the prefill fills the cache; then the graph appends to max-length buffers in place (kv_buffer.py)
    # (IO binding cannot feed position_ids, an overridable initializer: only when the graph derives them)
    given_pos = feeds.get("position_ids") is not None
    share = cached and has_mask and not given_pos and rebuild is None and shares_buffer(model)
    shared: SharedKV | None = None
    for _ in range(max_new):
        if shared is not None:
            logits = shared.step(step)
        else:
            out = model.run(step)
            logits = out["logits"]
        nxt = stop.add(logits)
        if stop.finished or len(stop.tokens) == max_new:
            break
        mask = np.concatenate([mask, np.ones((batch, 1), mask.dtype)], 1)
        pos = np.concatenate([pos, pos[:, -1:] + 1], 1)
        past = ids.shape[1]
        ids = np.concatenate([ids, nxt[:, None]], 1)
        if share:
            if shared is None:
                shared = SharedKV(model.main, _presents(out), ids.shape[1] + max_new - len(stop.tokens))
            step = {"input_ids": nxt[:, None]}
        elif cached and not (rebuild is not None and past <= rebuild < ids.shape[1]):
            step = {"input_ids": nxt[:, None], **_presents(out)}
        else:
            step = {"input_ids": ids, **(_empty_past(model, batch) if cached else {})}
        if has_mask:
            step["attention_mask"] = mask
        if has_pos and not share:
            step["position_ids"] = pos[:, -step["input_ids"].shape[1] :]
    return stop.result()


def _seq2seq(
    model: OrtModel,
    feeds: dict[str, np.ndarray],
    max_new: int,
    start_id: int,
    eos_id: int | None,
    on_token: OnToken | None,
):
    src = {k: v for k, v in feeds.items() if k in ("input_ids", "attention_mask", "input_features")}  # (Whisper's)
    batch = next(iter(src.values())).shape[0]
    dec = np.full((batch, 1), start_id, np.int64)
    stop = _Stopper(batch, eos_id, on_token)
    cached = model.kv_cache
    step = {**src, "decoder_input_ids": dec, **(_empty_past(model, batch) if cached else {})}
    for _ in range(max_new):
        out = model.run(step)
        nxt = stop.add(out["logits"])
        if stop.finished or len(stop.tokens) == max_new:
            break
        if cached:
            step = {**src, "decoder_input_ids": nxt[:, None], **_presents(out)}
        else:
            dec = np.concatenate([dec, nxt[:, None]], 1)
            step = {**src, "decoder_input_ids": dec}
    return stop.result()


def encode(model: OrtModel, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the encoder graph once: the decoder graph's constant inputs (encoder states and mask)."""
    takes = {s.name for s in model.inputs("decoder")}
    if "last_hidden_state" not in model.outputs("encoder") or "encoder_hidden_states" not in takes:
        raise SpecError(
            f"{model.path.name} and its decoder graph are not an encoder-decoder pair "
            "(last_hidden_state → encoder_hidden_states)",
            hint="export again with specc compile --target onnx --kv-cache",
        )
    src = {k: v for k, v in feeds.items() if k in {s.name for s in model.inputs("encoder")}}
    hidden = model.run(src, "encoder")["last_hidden_state"]
    fixed = {"encoder_hidden_states": hidden}
    if "encoder_attention_mask" in takes:
        mask = feeds.get("attention_mask")
        fixed["encoder_attention_mask"] = np.ones(hidden.shape[:2], np.int64) if mask is None else mask
    return fixed


def first_step(model: OrtModel, fixed: dict[str, np.ndarray], start_id: int) -> dict[str, np.ndarray]:
    """Decoder inputs of the first step: the start token and empty caches (the cross K/V get projected)."""
    batch = fixed["encoder_hidden_states"].shape[0]
    token = np.full((batch, 1), start_id, np.int64)
    return {**fixed, "input_ids": token, **_empty_past(model, batch, "decoder")}


def _encdec(
    model: OrtModel,
    feeds: dict[str, np.ndarray],
    max_new: int,
    start_id: int,
    eos_id: int | None,
    on_token: OnToken | None,
):
    fixed = encode(model, feeds)
    step = first_step(model, fixed, start_id)
    stop = _Stopper(step["input_ids"].shape[0], eos_id, on_token)
    for _ in range(max_new):
        out = model.run(step, "decoder")
        nxt = stop.add(out["logits"])
        if stop.finished or len(stop.tokens) == max_new:
            break
        step = {**fixed, "input_ids": nxt[:, None], **_presents(out)}
    return stop.result()


def rnn_states(model: OrtModel, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the RNN encoder graph: encoder states, the mask and the decoder's initial state(s)."""
    src = {k: v for k, v in feeds.items() if k in {s.name for s in model.inputs("encoder")}}
    enc = model.run(src, "encoder")
    step_inputs = {s.name for s in model.inputs("decoder_step")}
    carried = {k: v for k, v in {**src, **enc}.items() if k in step_inputs}
    return carried


def rnn_step(model: OrtModel, carried: dict[str, np.ndarray], token: np.ndarray) -> tuple[dict[str, np.ndarray], dict]:
    """One decoder step: returns the outputs and the carried inputs for the next step (``next_X`` → ``X``)."""
    out = model.run({**carried, "decoder_input_ids": token}, "decoder_step")
    nxt = dict(carried)
    for k, v in out.items():
        if k.startswith("next_"):
            nxt[k[len("next_") :]] = v
    return out, nxt


def _rnn(
    model: OrtModel,
    feeds: dict[str, np.ndarray],
    max_new: int,
    start_id: int,
    eos_id: int | None,
    on_token: OnToken | None,
):
    carried = rnn_states(model, feeds)
    batch = feeds["input_ids"].shape[0]
    token = np.full((batch, 1), start_id, np.int64)
    stop = _Stopper(batch, eos_id, on_token)
    for _ in range(max_new):
        out, carried = rnn_step(model, carried, token)
        token = stop.add(out["logits"])[:, None]
        if stop.finished:
            break
    return stop.result()
