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
from collections.abc import Callable
from functools import cache
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

_OMIT = "omit_none"
_T = TypeVar("_T", bound=type)
_A = TypeVar("_A", bound="OpAttrs")


class OpAttrsError(TypeError):
    """An op's attributes do not match its kind's declaration (a compiler-internal error)."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail or message  # the problem without the op's name


def attrs_dataclass(cls: _T) -> _T:
    """Declare an op kind's attributes: a frozen keyword-only dataclass (fields in any order, defaults or not),
    hashable even where a field holds a dict (``rope_scaling``)."""
    out = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    out.__hash__ = _hash  # type: ignore[assignment]
    return out


def _hash(self: OpAttrs) -> int:
    return hash((type(self), _freeze(tuple(self.to_dict().items()))))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in sorted(value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def optional(default: Any = None) -> Any:
    """A field left out of ``to_dict()`` while it is None (given only when it applies)."""
    return dataclasses.field(default=default, metadata={_OMIT: True})


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpAttrs:
    """Base of the per-kind attribute classes (frozen keyword-only dataclasses); the catalogue sets ``kind``."""

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, hint, check in _checks(type(self)):
            value = getattr(self, name)
            if not check(value):
                detail = f"attribute {name!r}: {value!r} ({type(value).__name__}) is not {_show(hint)}"
                raise OpAttrsError(f"{self.kind} {detail}", detail)

    @classmethod
    def build(cls: type[_A], op: str, values: dict[str, Any]) -> _A:
        """The attributes of op ``op`` from keyword values, every problem reported with the op and field."""
        names = _names(cls)
        if not names.issuperset(values):
            unknown = sorted(set(values) - names)[0]
            fields = ", ".join(sorted(names))
            raise OpAttrsError(f"op {op} ({cls.kind}): unknown attribute {unknown!r}; fields: {fields}")
        missing = [n for n in _required_names(cls) if n not in values]
        if missing:
            raise OpAttrsError(f"op {op} ({cls.kind}): missing attribute {missing[0]!r}")
        try:
            return cls(**values)
        except OpAttrsError as e:
            raise OpAttrsError(f"op {op} ({cls.kind}): {e.detail}", e.detail) from None

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


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@cache
def _names(cls: type[OpAttrs]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@cache
def _required_names(cls: type[OpAttrs]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if _required(f))


@cache
def _checks(cls: type[OpAttrs]) -> tuple[tuple[str, Any, Callable[[Any], bool]], ...]:
    """(field, type, predicate) per field, the predicates built once per class (lowering makes many ops)."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name], _predicate(hints[f.name])) for f in dataclasses.fields(cls))


def _predicate(hint: Any) -> Callable[[Any], bool]:
    exact = _exact_types(hint)
    slow = _slow_predicate(hint)
    return lambda v: type(v) in exact or slow(v)  # the exact-type test answers nearly every value at once


def _exact_types(hint: Any) -> frozenset[type]:
    """Types whose every value conforms to ``hint`` (bool is no int or float here)."""
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        return frozenset().union(*(_exact_types(h) for h in get_args(hint)))
    if hint is float:
        return frozenset({int, float})
    if hint in (int, bool, str, type(None)):
        return frozenset({hint})
    if origin in (dict, tuple, list):
        return frozenset({origin})
    return frozenset()


def _slow_predicate(hint: Any) -> Callable[[Any], bool]:
    if hint is Any:
        return lambda v: True
    origin = get_origin(hint)
    if origin is Union or origin is types.UnionType:
        arms = tuple(_slow_predicate(h) for h in get_args(hint))
        return lambda v: any(arm(v) for arm in arms)
    if origin is Literal:
        allowed = get_args(hint)
        return lambda v: v in allowed
    if origin is not None:  # dict[str, Any], tuple[int, ...]: the container type only
        return lambda v: isinstance(v, origin)
    if hint is type(None):
        return lambda v: v is None
    if hint is float:  # an int is a float here (PEP 484's numeric tower), a bool is not
        return lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if hint is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    return lambda v: isinstance(v, hint)


def _show(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
