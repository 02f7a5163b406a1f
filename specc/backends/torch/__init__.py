"""PyTorch backend: layer graph → ``nn.Module`` (runtime.py), checkpoints, a standalone model.py, generation.

model = build_torch(spec)                    # state_dict keys = IR parameter names
logits = model(input_ids)                    # forward signature by task, see runtime.py
tokens = model.generate(input_ids, 20)       # KV cache; greedy / temperature / top-k / top-p, seeded
with model.attention_maps() as maps: ...     # attention probabilities by scope name (math path)
"""

from __future__ import annotations

from .build import build_torch, graph_data
from .checkpoint import compile_checkpoint, load_checkpoint, read_spec
from .runtime import Cache, GenerationError, Model, example_inputs, generate
from .standalone import write_model_py

__all__ = [
    "Cache",
    "GenerationError",
    "Model",
    "build_torch",
    "compile_checkpoint",
    "example_inputs",
    "generate",
    "graph_data",
    "load_checkpoint",
    "read_spec",
    "write_model_py",
]
