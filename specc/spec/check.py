"""The cross-field rules of a spec, run together: every family's after-validator (``schema._Base``) calls
``check``, so the Python API and the YAML loader enforce the same rules.

``schema`` cannot import this module (the rules read the schema's classes): importing ``specc.spec`` imports it,
and it installs ``check`` into the schema, before any spec can be validated.
"""

from __future__ import annotations

from typing import Any

from .rules_block import block_violations
from .rules_contrastive import dual_encoder_rules, projection_rules
from .rules_fields import (
    attention_rules,
    encoder_decoder_rules,
    encoder_rules,
    mlp_rules,
    position_rules,
    rnn_rules,
    size_rules,
    vit_rules,
)
from .rules_kinds import layer_kinds
from .schema import (
    DualEncoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    RNNSeq2SeqSpec,
    ViTSpec,
    _Base,
    _Transformer,
    install_check,
)
from .violation import RuleViolations


def check(spec: _Base) -> None:
    found = list(violations(spec))
    if found:
        raise RuleViolations(found)


def violations(spec: _Base) -> Any:
    if isinstance(spec, _Transformer):
        yield from attention_rules(spec)
        yield from mlp_rules(spec)
        yield from position_rules(spec)
        yield from size_rules(spec)
        yield from block_violations(spec)
        yield from layer_kinds(spec)
    if isinstance(spec, ViTSpec):
        yield from vit_rules(spec)
    if isinstance(spec, EncoderSpec):
        yield from encoder_rules(spec)
    if isinstance(spec, EncoderSpec | ViTSpec):
        yield from projection_rules(spec)
    if isinstance(spec, DualEncoderSpec):
        yield from dual_encoder_rules(spec)
    if isinstance(spec, EncoderDecoderSpec):
        yield from encoder_decoder_rules(spec)
    if isinstance(spec, RNNSeq2SeqSpec):
        yield from rnn_rules(spec)


install_check(check)
