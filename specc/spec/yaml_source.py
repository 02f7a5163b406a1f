"""Safe YAML reading that keeps the position of every key.

Only plain data is accepted: mappings, sequences and the standard scalars. Anchors and aliases are refused
(they are how "billion laughs" bombs are built, and specs have ``extends:`` for reuse), so are explicit tags
such as ``!!python/object``, duplicate keys (PyYAML would silently keep the last), non-UTF-8 and binary bytes,
and collections nested deeper than ``MAX_DEPTH`` (refused while the events stream in, before any recursion).
Files are read through ``specc.io.read``: regular files only, at most ``MAX_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import Diagnostic, SpecError
from ..io import read

Key = tuple[str | int, ...]
MAX_BYTES = read.SPEC_BYTES  # a spec is a few hundred bytes; a megabyte is already absurd
MAX_DEPTH = read.MAX_DEPTH  # nested mappings and lists; a spec uses 3

_STANDARD_TAGS = {
    None,
    "!",
    *(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq")),
}


@dataclass(frozen=True)
class Loc:
    file: str
    line: int | None = None
    col: int | None = None

    def diag(self, message: str, hint: str | None = None) -> Diagnostic:
        return Diagnostic(message, self.file, self.line, self.col, hint)


@dataclass
class Located:
    """A plain-data document plus the location of each key path (the key itself, or the item)."""

    data: Any
    locs: dict[Key, Loc]

    def loc(self, path: Key) -> Loc:
        """Location of the deepest existing prefix of ``path``."""
        for n in range(len(path), -1, -1):
            hit = self.locs.get(tuple(path[:n]))
            if hit is not None:
                return hit
        return Loc("<spec>")


def _mark(file: str, mark: Any) -> Loc:
    return Loc(file, mark.line + 1, mark.column + 1)


def read_text(path: Path, what: str = "a spec file") -> str:
    """The text of a spec (or profile) file: a regular UTF-8 file of at most ``MAX_BYTES``."""
    name = str(path)
    raw = read.read_bytes(
        path,
        what,
        MAX_BYTES,
        hint="check the path, or run `specc presets` for names",
        dir_hint="pass a .yaml file inside it",
    )
    return decode(raw, name, what)


def decode(raw: bytes, name: str, what: str = "a spec file") -> str:
    return read.decode_text(raw, name, what, "save it as UTF-8")


def parse(text: str, file: str) -> Located:
    """Parse one YAML document into plain data and key locations."""
    if not text.strip() or all(ln.lstrip().startswith("#") or not ln.strip() for ln in text.splitlines()):
        raise SpecError([Diagnostic("empty spec", file, 1, 1, "a spec needs at least `kind:` and `name:`")])
    try:
        _check_events(text, file)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = _mark(file, mark) if mark else Loc(file)
        problem = e.problem or e.context or "malformed YAML"
        if e.context and e.problem:
            problem = f"{problem} ({e.context})"
        raise SpecError([loc.diag(f"malformed YAML: {problem}")]) from None
    except yaml.YAMLError as e:  # e.g. a reader error on control characters
        raise SpecError([Loc(file).diag(f"malformed YAML: {e}")]) from None
    if node is None:
        raise SpecError([Diagnostic("empty spec", file, 1, 1, "a spec needs at least `kind:` and `name:`")])
    if not isinstance(node, yaml.MappingNode):
        kind = "list" if isinstance(node, yaml.SequenceNode) else "single value"
        raise SpecError([_mark(file, node.start_mark).diag(f"a spec is a mapping of keys, but this is a {kind}")])
    locs: dict[Key, Loc] = {(): Loc(file, 1, 1)}
    errors: list[Diagnostic] = []
    data = _build(node, (), file, locs, errors)
    if errors:
        raise SpecError(errors)
    return Located(data, locs)


def parse_scalar(text: str, where: Loc) -> Any:
    """A value given on the command line (``--set key=value``), read as a YAML scalar or flow collection."""
    try:
        _check_events(text, where.file)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return text  # not YAML: take it as a plain string; validation will judge it
    if node is None:
        return None
    errors: list[Diagnostic] = []
    value = _build(node, (), where.file, {}, errors)
    if errors:
        raise SpecError(errors)
    return value


def _check_events(text: str, file: str) -> None:
    depth = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(
                    [
                        _mark(file, ev.start_mark).diag(
                            f"nested deeper than {MAX_DEPTH} levels", "specs nest a few levels; this is not one"
                        )
                    ]
                )
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(ev, yaml.AliasEvent) or getattr(ev, "anchor", None):
            raise SpecError(
                [
                    _mark(file, ev.start_mark).diag(
                        "YAML anchors and aliases are not allowed in specs",
                        "write the values out, or share them with `extends: <preset or file>`",
                    )
                ]
            )
        tag = getattr(ev, "tag", None)
        if tag not in _STANDARD_TAGS:
            raise SpecError(
                [
                    _mark(file, ev.start_mark).diag(
                        f"YAML tag {str(tag).replace('tag:yaml.org,2002:', '!!')} is not allowed: "
                        "specs hold plain data only",
                        "remove the tag; nothing in a spec is ever constructed or executed",
                    )
                ]
            )


def _build(node: Any, path: Key, file: str, locs: dict[Key, Loc], errors: list[Diagnostic]) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k_node, v_node in node.value:
            here = _mark(file, k_node.start_mark)
            if isinstance(k_node, yaml.ScalarNode) and k_node.value == "<<":
                errors.append(here.diag("YAML merge keys (<<) are not allowed", "use `extends:`"))
                continue
            if not isinstance(k_node, yaml.ScalarNode) or k_node.tag != "tag:yaml.org,2002:str":
                errors.append(here.diag("keys must be plain names", "write `name: value`"))
                continue
            key = k_node.value
            if key in out:
                first = locs[(*path, key)]
                errors.append(
                    here.diag(
                        f"duplicate key '{key}' (first given at line {first.line})",
                        "YAML would silently keep only the last one: delete one of them",
                    )
                )
                continue
            locs[(*path, key)] = here
            out[key] = _build(v_node, (*path, key), file, locs, errors)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            locs[(*path, i)] = _mark(file, item.start_mark)
            items.append(_build(item, (*path, i), file, locs, errors))
        return items
    try:
        return yaml.constructor.SafeConstructor().construct_object(node)
    except yaml.YAMLError as e:
        errors.append(_mark(file, node.start_mark).diag(f"bad value: {e}"))
        return None
