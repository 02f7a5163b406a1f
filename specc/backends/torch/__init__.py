"""PyTorch backend: layer graph → generated ``nn.Module`` source, checkpoints, a standalone model.py, generation.

model = build_torch(spec)                    # a real module tree: blocks.3.attn.qkv is an nn.Linear
model.plain()                                # undo the acceleration pass build_torch applied (accel/)
logits = model(input_ids)                    # forward signature by task; model.run(inputs) gives every output
tokens = model.generate(input_ids, 20)       # KV cache; greedy / temperature / top-k / top-p, seeded
with model.attention_maps() as maps: ...     # attention probabilities by scope name (math path)
print(type(model).SOURCE)                    # the generated Python source
"""

from __future__ import annotations

from .build import DTYPES, build_torch, example_inputs
from .checkpoint import compile_checkpoint, load_checkpoint, read_spec
from .layers import GenerationError, KVCache, Model, generate
from .standalone import write_model_py

Cache = KVCache  # the decoding cache: model.start(inputs, max_len) → cache; model.step(cache, tokens)

__all__ = [
    "DTYPES",
    "Cache",
    "GenerationError",
    "KVCache",
    "Model",
    "build_torch",
    "compile_checkpoint",
    "example_inputs",
    "generate",
    "load_checkpoint",
    "read_spec",
    "write_model_py",
]
