"""Hugging Face checkpoints in a standalone model.py: tensors renamed (and transposed, concatenated, ...) to
specc's names by a table that ``specc compile --target python`` writes from specc's weight-mapping plan."""

from __future__ import annotations

import re

from torch import Tensor, nn


def from_hf(model: nn.Module, tensors: dict, names: dict, how: dict, tied: dict, skip: str) -> dict[str, Tensor]:
    """specc-named tensors for ``model``; specc names pass through. ``names``: specc name (``*`` the block index)
    or module prefix (ending in ".": its parameters' local names appended to the HF names too; ``#`` in an HF
    name: each expert 0 .. E-1 of the parameter's first axis)
    → (op | (op, *args), *HF names), or a list of such alternatives (the first whose tensors are all present wins);
    HF names may carry a wrapper's prefix (``transformer.``, ``model.``). ``tied``: HF name → the tensor it equals;
    ``skip``: a pattern of HF names that are not weights of this model (buffers, heads it does not have)."""
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    if set(tensors) <= set(shapes):
        return tensors
    bare = {k: k.split(".", 1)[-1] for k in tensors}  # without a wrapper's prefix
    given = {bare[k]: v for k, v in tensors.items()} | tensors
    out, used = {}, set(tied)
    for key in shapes:
        block, local = (re.findall(r"\.(\d+)\.", key) or [""])[0], key.rpartition(".")[2]
        star = key.replace(f".{block}.", ".*.", 1)
        rules = next((names[k] for k in (key, star, star[: -len(local)]) if k in names), [])
        for op, *sources in [rules] if isinstance(rules, tuple) else rules:
            sources = [s.replace("*", block) + (local if s.endswith(".") else "") for s in sources]
            if any("#" in s for s in sources):  # one tensor per expert: as many as the parameter stacks
                sources = [s.replace("#", str(e)) for s in sources for e in range(shapes[key][0])]
            if all(s in given for s in sources):
                name, *args = (op,) if isinstance(op, str) else op
                out[key] = how[name]([given[s] for s in sources], *args)
                used.update(sources)
                break
    bad = [k for k in tensors if not {k, bare[k]} & used and not (re.search(skip, k) or re.search(skip, bare[k]))]
    bad += [k for k, same in tied.items() if k in given and same in given and not given[k].equal(given[same])]
    if bad:
        raise ValueError(f"checkpoint tensors without a specc name, or not tied as the model is: {bad[:6]}")
    return out
