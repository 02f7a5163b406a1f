"""A KV cache that the graph appends to in place: one max-length buffer per past/present pair, bound (IO
binding) as both the ``past_key_values.{i}.*`` input and the ``present.{i}.*`` output of a graph whose metadata
says ``specc.kv_buffer: shared`` (GroupQueryAttention writes the new tokens' K/V at the past length, which the
graph reads off ``attention_mask``; see backends/onnx/kv_cache.py). A decode step then neither copies the
cache into a new present tensor nor hands it back through Python.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SpecError
from .onnx_model import OrtModel

PAST, PRESENT = "past_key_values.", "present."


def shares_buffer(model: OrtModel) -> bool:
    """The graph lets past and present be one buffer and runs on the CPU EP (whose memory numpy buffers are)."""
    return model.meta.get("specc.kv_buffer") == "shared" and model.provider.startswith("CPU")


class SharedKV:
    """Buffers [batch, kv_heads, capacity, head_dim] holding ``pasts`` (the prefill's presents, renamed as the
    past inputs) and room for the tokens up to ``capacity``, bound to the session ``sess``; ``step`` runs one
    call and returns the logits."""

    def __init__(self, sess: Any, pasts: dict[str, np.ndarray], capacity: int) -> None:
        import onnxruntime as ort

        self.sess = sess
        self.io: Any = self.sess.io_binding()
        self.io.bind_output("logits", "cpu")  # first bound output: get_outputs()[0]
        self.buffers: list[np.ndarray] = []  # the OrtValues wrap this memory: keep it alive
        for name, past in pasts.items():
            b, h, t, d = past.shape
            buf = np.zeros((b, h, capacity, d), past.dtype)
            buf[:, :, :t] = past
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            self.io.bind_ortvalue_input(name, value)
            self.io.bind_ortvalue_output(PRESENT + name[len(PAST) :], value)
            self.buffers.append(buf)

    def step(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        for name, value in feeds.items():
            self.io.bind_cpu_input(name, np.ascontiguousarray(value))
        try:
            self.sess.run_with_iobinding(self.io)
        except Exception as e:  # onnxruntime's own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecError(f"onnxruntime failed: {first}") from None
        return self.io.get_outputs()[0].numpy()
