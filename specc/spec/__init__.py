"""The spec language: schema, cross-field rules, loader, presets."""

from . import check as _check  # noqa: F401  (installs the cross-field rules into every family's validator)
