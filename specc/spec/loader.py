"""Load a spec: read YAML with locations, resolve ``extends:``, apply ``--set`` overrides, validate.

Every problem becomes a ``Diagnostic`` at the ``file:line:col`` of the key to blame; all problems of a
document are reported together in one ``SpecError``.

A spec stored inside an artifact (checkpoint or ONNX metadata) is read by ``load_embedded_spec``: as data only,
never as a path or preset name, and without following ``extends:``.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import Diagnostic, SpecError
from ..io import read
from .presets import find_preset, preset_names, resolve_source
from .schema import FAMILIES, SPEC_ADAPTER, SpecModel
from .violation import RuleViolations
from .yaml_source import Key, Loc, Located, parse, parse_scalar, read_text

MAX_EXTENDS_DEPTH = 16

Overrides = Iterable[str] | Mapping[str, Any] | None


def load_spec(source: str | os.PathLike[str] | Mapping[str, Any], overrides: Overrides = None) -> SpecModel:
    """Validated spec from a YAML path, a preset name or a plain dict, with ``key.path=value`` overrides."""
    doc = load_document(source)
    apply_overrides(doc, overrides)
    return validate(doc)


def load_document(source: str | os.PathLike[str] | Mapping[str, Any]) -> Located:
    if isinstance(source, Mapping):
        doc = Located(_plain_copy(source), {(): Loc("<dict>")})
        base = Path.cwd()
    else:
        path = resolve_source(source)
        doc = parse(read_text(path), str(source) if not Path(source).exists() else str(path))
        base = path.parent
    return _resolve_extends(doc, base, seen=())


def load_embedded_spec(text: str, origin: str, key: str) -> SpecModel:
    """The spec an artifact stores as JSON under metadata ``key``: a JSON object validated as it is.

    Nothing in it reaches the filesystem: a string is not a path or preset name, and ``extends:`` is refused.
    Problems are one line naming the file and the metadata key (the first problem, and how many more).
    """
    what = f"metadata {key!r}"
    data = read.json_object(read.parse_json(text, origin, what, located=False), origin, f"the spec in {what}")
    if data.get("extends") is not None:
        raise read.ReadError(
            f"the spec in {what} has extends: {_show(data['extends'])}; a stored spec is complete and is never "
            "extended from files or presets",
            file=origin,
            hint="the artifact was not written by specc, or was edited",
        )
    data = {k: v for k, v in data.items() if k != "extends"}
    try:
        return validate(Located(data, {(): Loc(origin)}))
    except SpecError as e:
        first = e.diagnostics[0]
        more = f" (and {len(e.diagnostics) - 1} more)" if len(e.diagnostics) > 1 else ""
        raise read.ReadError(f"the spec in {what} is invalid: {first.message}{more}", file=origin) from None


def _plain_copy(d: Any) -> Any:
    if isinstance(d, Mapping):
        return {str(k): _plain_copy(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_plain_copy(v) for v in d]
    return d


# ---------------------------------------------------------------------------------------------- extends


def _resolve_extends(doc: Located, base: Path, seen: tuple[str, ...]) -> Located:
    if not isinstance(doc.data, dict) or "extends" not in doc.data:
        return doc
    ref = doc.data.pop("extends")
    if ref is None:  # ``extends: null`` (as a dumped spec carries) inherits nothing
        return doc
    where = doc.locs[("extends",)] if ("extends",) in doc.locs else doc.loc(())
    if not isinstance(ref, str) or not ref:
        raise SpecError([where.diag("extends must be a preset name or a path", "e.g. extends: gpt2")])
    candidate = base / ref
    path = candidate if candidate.exists() else (find_preset(ref) if "/" not in ref else None)
    if path is None:
        close = difflib.get_close_matches(ref, preset_names(), n=1)
        hint = f"did you mean '{close[0]}'?" if close else "give a preset name (`specc presets`) or a file path"
        raise SpecError([where.diag(f"extends: no preset or file named '{ref}'", hint)])
    key = str(path.resolve())
    if key in seen or len(seen) >= MAX_EXTENDS_DEPTH:
        raise SpecError([where.diag(f"extends cycle through {path}", "a spec cannot extend itself")])
    parent = _resolve_extends(parse(read_text(path), str(path)), path.parent, (*seen, key))
    return _merge(parent, doc)


def _merge(parent: Located, child: Located) -> Located:
    """Child keys win; nested mappings merge, unless their ``type`` changes (then the child replaces)."""
    locs = dict(parent.locs)

    def go(p: Any, c: Any, path: Key) -> Any:
        if isinstance(p, dict) and isinstance(c, dict) and p.get("type", c.get("type")) == c.get("type", p.get("type")):
            out = dict(p)
            for k, v in c.items():
                out[k] = go(p.get(k), v, (*path, k))
            return out
        for k in [k for k in locs if k[: len(path)] == path and len(k) > len(path)]:
            del locs[k]  # the parent's sub-keys are gone
        for k, v in child.locs.items():
            if k[: len(path)] == path:
                locs[k] = v
        return c

    data = go(parent.data, child.data, ())
    locs[()] = child.locs[()]  # the document is the child's: errors name the file the user gave
    return Located(data, locs)


# ---------------------------------------------------------------------------------------------- overrides


def apply_overrides(doc: Located, overrides: Overrides) -> None:
    if not overrides:
        return
    items = overrides.items() if isinstance(overrides, Mapping) else (_split(o) for o in overrides)
    for dotted, value in items:
        where = Loc(f"--set {dotted}")
        if dotted.split(".")[0] == "extends":
            raise SpecError(
                [
                    where.diag(
                        "extends cannot be set with --set: it is resolved when the spec file is read",
                        "write `extends: NAME` in the spec file, or pass NAME as the spec and --set the rest",
                    )
                ]
            )
        if isinstance(value, str) and not isinstance(overrides, Mapping):
            value = parse_scalar(value, where)
        path: list[str | int] = []
        node = doc.data
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            seg: str | int = int(part) if isinstance(node, list) and part.isdigit() else part
            path.append(seg)
            last = i == len(parts) - 1
            if last:
                _set(node, seg, value, where)
            else:
                nxt = node[seg] if _has(node, seg) else None
                if not isinstance(nxt, (dict, list)):
                    # ``--set mlp.type=moe`` on a spec whose mlp is the string shortcut ``classic``
                    nxt = {"type": nxt} if isinstance(nxt, str) else {}
                    _set(node, seg, nxt, where)
                node = nxt
            doc.locs[tuple(path)] = where


def _split(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not p for p in key.strip().split(".")):
        raise SpecError(f"bad override '{text}'", file="--set", hint="write --set path.to.key=value, e.g. blocks=6")
    return key.strip(), value


def _has(node: Any, seg: str | int) -> bool:
    if isinstance(node, dict):
        return seg in node
    return isinstance(seg, int) and 0 <= seg < len(node)


def _set(node: Any, seg: str | int, value: Any, where: Loc) -> None:
    if isinstance(node, dict) or (isinstance(seg, int) and 0 <= seg < len(node)):
        node[seg] = value
    else:
        raise SpecError([where.diag(f"cannot set '{seg}' inside a list of {len(node)} items")])


# ---------------------------------------------------------------------------------------------- validation


def validate(doc: Located) -> SpecModel:
    try:
        return SPEC_ADAPTER.validate_python(doc.data)
    except ValidationError as e:
        raise SpecError(sorted(_diagnostics(e, doc), key=_order)) from None


def _order(d: Diagnostic) -> tuple[str, int, int]:
    return (d.file or "", d.line or 0, d.col or 0)


def _diagnostics(e: ValidationError, doc: Located) -> Iterable[Diagnostic]:
    kind = doc.data.get("kind") if isinstance(doc.data, dict) else None
    root = FAMILIES.get(kind) if isinstance(kind, str) else None
    for err in e.errors():
        ctx_error = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_error, RuleViolations):
            own = doc.loc(()).file
            at = _clean_path(root, err["loc"])  # a nested spec's rules (a dual encoder's tower) speak from it
            for v in ctx_error.violations:
                keys = [k for k in ((*at, *v.path), *((*at, *a) for a in v.also)) if k in doc.locs]
                mine = [k for k in keys if doc.locs[k].file == own or doc.locs[k].file.startswith("--set ")]
                blame = mine[0] if mine else (*at, *v.path)
                yield doc.loc(blame).diag(v.message, v.hint)
            continue
        yield _describe(err, _clean_path(root, err["loc"]), root, doc)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation may hold (through Optional, Union and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models_in(a)]
    return []


def _tag(model: type[BaseModel]) -> Any:
    f = model.model_fields.get("type")
    return f.default if f is not None else None


def _walk(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> tuple[Key, list[type[BaseModel]]]:
    """Drop union tags from a pydantic location; also return the models that hold the last key."""
    loc = tuple(loc)
    if loc and loc[0] in FAMILIES:
        root, loc = FAMILIES[loc[0]], loc[1:]
    candidates = [root] if root else []
    path: list[str | int] = []
    holders = candidates
    for seg in loc:
        holders = candidates
        owners = [m for m in candidates if seg in m.model_fields]
        if owners:
            path.append(seg)
            candidates = [m for o in owners for m in _models_in(o.model_fields[seg].annotation)]
            continue
        tagged = [m for m in candidates if _tag(m) == seg]
        if tagged:
            candidates = tagged
            continue
        if isinstance(seg, str) and seg.startswith("function-"):
            continue  # validator wrapper names
        path.append(seg)
        candidates = []
    return tuple(path), holders


def _clean_path(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> Key:
    return _walk(root, loc)[0]


def _dotted(path: Key) -> str:
    return ".".join(str(p) for p in path) or "spec"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(err: Any, path: Key, root: type[BaseModel] | None, doc: Located) -> Diagnostic:
    typ, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    where = doc.loc(path)
    name = _dotted(path)
    if typ == "extra_forbidden":
        key = str(path[-1])
        _, holders = _walk(root, err["loc"])
        allowed = sorted({f for m in holders for f in m.model_fields})
        close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
        owner = [k for k, m in FAMILIES.items() if key in m.model_fields and len(path) == 1]
        if close:
            hint = f"did you mean '{close[0]}'?"
        elif owner and root is not None:
            hint = f"'{key}' belongs to kind {' / '.join(owner)}; allowed here: {', '.join(allowed)}"
        else:
            hint = f"allowed keys: {', '.join(allowed)}"
        parent = _dotted(path[:-1])
        return where.diag(f"unknown key '{key}'" + (f" in {parent}" if len(path) > 1 else ""), hint)
    if typ == "missing":
        parent_where = doc.loc(path[:-1])
        return parent_where.diag(f"missing required key '{name}'", f"add `{path[-1]}:` here")
    if typ in ("union_tag_not_found",):
        tag = ctx.get("discriminator", "'type'").strip("'")
        field = f"{name}.{tag}" if path else tag
        return where.diag(f"missing required key '{field}'", f"set {tag}: one of {_tags_at(root, path)}")
    if typ == "union_tag_invalid":
        tag = ctx.get("discriminator", "'type'").strip("'")
        got = ctx.get("tag")
        options = _tags_at(root, path)
        close = difflib.get_close_matches(str(got), [o.strip() for o in options.split(",")], n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"use one of {options}"
        where = doc.loc((*path, tag))
        return where.diag(f"{_dotted((*path, tag))}: '{got}' is not one of {options}", hint)
    if typ == "literal_error":
        expected = ctx.get("expected", "")
        options = [o.strip(" '") for o in expected.replace(" or ", ",").split(",")]
        close = difflib.get_close_matches(str(value), options, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"use one of: {', '.join(options)}"
        return where.diag(f"{name}: {_show(value)} is not one of {', '.join(options)}", hint)
    if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}[typ]
        bound = next(iter(ctx.values()))
        return where.diag(f"{name} must be {op} {bound}, got {_show(value)}", f"use a value {op} {bound}")
    if typ in ("int_type", "int_parsing", "int_from_float"):
        return where.diag(f"{name}: expected a whole number, got {_show(value)}", f"e.g. {path[-1]}: 12")
    if typ in ("bool_type", "bool_parsing"):
        return where.diag(f"{name}: expected true or false, got {_show(value)}", f"write {path[-1]}: true")
    if typ in ("float_type", "float_parsing", "finite_number"):
        return where.diag(f"{name}: expected a finite number, got {_show(value)}", "e.g. 1.0e-5")
    if typ in ("string_type",):
        return where.diag(f"{name}: expected text, got {_show(value)}", 'quote it: "..."')
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        return where.diag(
            f"{name}: expected a mapping of keys, got {_show(value)}",
            f"write {path[-1] if path else 'it'} as `key: value` lines indented below it",
        )
    if typ in ("string_too_short", "string_too_long"):
        return where.diag(f"{name}: {err['msg'].lower()}")
    return where.diag(f"{name}: {err['msg']}")


def _tags_at(root: type[BaseModel] | None, path: Key) -> str:
    if not path:
        return ", ".join(FAMILIES)
    _, holders = _walk(root, path)
    models = [m for h in holders if path[-1] in h.model_fields for m in _models_in(h.model_fields[path[-1]].annotation)]
    return ", ".join(str(_tag(m)) for m in models if _tag(m) is not None)
