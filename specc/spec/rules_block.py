"""Cross-field rules of the block features: QK-norm, softcapping, norm placements, parallel sublayers."""

from __future__ import annotations

from typing import Any

from .schema import EncoderDecoderSpec, _Transformer
from .violation import Violation


def block_violations(spec: _Transformer) -> Any:
    a, n = spec.attention, spec.norm
    if a.qk_norm != "none" and n.type != "rmsnorm":
        yield Violation(
            ("attention", "qk_norm"),
            f"qk_norm is an RMSNorm of q and k, but this model's norm.type is {n.type}",
            "use norm.type: rmsnorm (the QK-norm takes its eps and unit_offset), or qk_norm: none",
            also=(("norm", "type"),),
        )
    if n.unit_offset and n.type != "rmsnorm":
        yield Violation(
            ("norm", "unit_offset"),
            "norm.unit_offset (a (1 + weight) scale) is an RMSNorm form; this model's norm.type is layernorm",
            "use norm.type: rmsnorm, or remove unit_offset",
            also=(("norm", "type"),),
        )
    if spec.parallel != "none" and n.placement != "pre":
        yield Violation(
            ("parallel",),
            f"parallel {spec.parallel} runs attention and MLP on the block's normed input, which needs "
            f"norm.placement pre (placement is {n.placement})",
            "use norm.placement: pre, or parallel: none",
            also=(("norm", "placement"),),
        )
    if isinstance(spec, EncoderDecoderSpec):
        if spec.parallel != "none":
            yield Violation(
                ("parallel",),
                "parallel sublayers are refused on an encoder_decoder: its decoder blocks have a third, "
                "cross-attention sublayer that has no parallel form",
                "use parallel: none",
            )
        if a.softcap is not None:
            yield Violation(
                ("attention", "softcap"),
                "attention.softcap is refused on an encoder_decoder: it caps self-attention scores, and "
                "cross-attention would stay uncapped",
                "remove attention.softcap",
            )
