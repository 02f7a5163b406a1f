"""Typed op attributes: the base of the frozen dataclass each op kind declares in the catalogue.

An op's attributes are one instance of its kind's class (``specc.ir.ops``), checked when it is made: an
unknown field, a missing required field or a value of the wrong type raises ``OpAttrsError`` naming the op and
the field. The spec was validated before lowering, so such an error is a compiler bug, not a user error.

``to_dict()`` gives the attributes as the graph's JSON writes them: every field, except fields declared with
``optional()`` while they hold None (``tied_to`` of an untied op), which are left out as if never given.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from functools import cache
from typing import Any, ClassVar, Literal, Self, Union, get_args, get_origin, get_type_hints

_OMIT = "omit_none"


class OpAttrsError(TypeError):
    """An op's attributes do not match its kind's declaration (a compiler-internal error)."""


def optional(default: Any = None) -> Any:
    """A field left out of ``to_dict()`` while it is None (given only when it applies)."""
    return dataclasses.field(default=default, metadata={_OMIT: True})


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpAttrs:
    """Base of the per-kind attribute classes (frozen keyword-only dataclasses); the catalogue sets ``kind``."""

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, hint in _hints(type(self)).items():
            value = getattr(self, name)
            if not _conforms(value, hint):
                raise OpAttrsError(
                    f"{self.kind} attribute {name!r}: {value!r} ({type(value).__name__}) is not {_show(hint)}"
                )

    @classmethod
    def build(cls, op: str, values: dict[str, Any]) -> Self:
        """The attributes of op ``op`` from keyword values, every problem reported with the op and field."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            fields = ", ".join(sorted(names))
            raise OpAttrsError(f"op {op} ({cls.kind}): unknown attribute {unknown[0]!r}; fields: {fields}")
        required = [f.name for f in dataclasses.fields(cls) if _required(f)]
        missing = [n for n in required if n not in values]
        if missing:
            raise OpAttrsError(f"op {op} ({cls.kind}): missing attribute {missing[0]!r}")
        try:
            return cls(**values)
        except OpAttrsError as e:
            raise OpAttrsError(f"op {op} ({e})") from None

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and f.metadata.get(_OMIT):
                continue
            out[f.name] = value
        return out

    @classmethod
    def default(cls, name: str) -> Any:
        """The declared default of field ``name`` (what a layer constructor takes when the argument is left out)."""
        f = next(f for f in dataclasses.fields(cls) if f.name == name)
        if _required(f):
            raise KeyError(f"{cls.kind} attribute {name!r} has no default")
        return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]

    # transitional: removed once every reader uses fields -------------------------------------------------
    # Read-only dict access (``attrs["heads"]``, ``.get``, ``in``, ``items()``) for code not yet converted.

    def __getitem__(self, key: str) -> Any:
        if key not in _names(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def keys(self) -> typing.KeysView[str]:
        return self.to_dict().keys()

    def items(self) -> typing.ItemsView[str, Any]:
        return self.to_dict().items()

    def values(self) -> typing.ValuesView[Any]:
        return self.to_dict().values()


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@cache
def _names(cls: type[OpAttrs]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@cache
def _hints(cls: type[OpAttrs]) -> dict[str, Any]:
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _conforms(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return any(_conforms(value, h) for h in get_args(hint))
    if origin is Literal:
        return value in get_args(hint)
    if origin is not None:  # dict[str, Any], tuple[int, ...]: the container type only
        return isinstance(value, origin)
    if hint is type(None):
        return value is None
    if hint is float:  # an int is a float here (PEP 484's numeric tower), a bool is not
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _show(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
