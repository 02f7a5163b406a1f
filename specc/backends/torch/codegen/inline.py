"""Inline what a specialised source defines for one use: a base class with one subclass, a one-expression
function with one call.

After ``specialise`` has cut a model.py's library to what the model runs, the layer library's seams often
serve one user: the ``Model`` base under the one root class, ``AttentionCore`` under the one attention core,
``allows`` returning ``k <= q``. ``inline(source, keep)`` merges such a base into its subclass (its ``__init__``
in place of the ``super().__init__(...)`` call) and writes such a function's expression at its call site, one
edit at a time, then lets ``specialise`` remove what became unused. Behaviour is unchanged: the subclass is
the class that was constructed, the expression the value that was returned.
"""

from __future__ import annotations

import ast
import copy
from typing import Any

from torch import nn

from .specialise import SourceText, first_line, fixpoint, specialise

MAX_WIDTH = 110  # an inlined expression must leave its line this short (no wrapped one-liners)
_ATOMIC = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript)


def inline(source: str, keep: set[str]) -> str:
    """``source`` with single-subclass bases merged and single-use one-expression functions inlined."""
    while True:
        merged = fixpoint(source, lambda s: _Inliner(s, keep))
        if merged == source:
            return source
        source = specialise(merged, {}, keep)  # the inlined definitions go once nothing names them


class _Inliner(SourceText):
    def __init__(self, source: str, keep: set[str]):
        super().__init__(source)
        self.keep = keep
        self.classes = {c.name: c for c in self.tree.body if isinstance(c, ast.ClassDef)}

    def first(self) -> str | None:
        return self._base() or self._expression()

    # a base with one subclass ---------------------------------------------------------------------------

    def _base(self) -> str | None:
        for base in self.classes.values():
            subs = [c for c in self.classes.values() if base.name in map(ast.unparse, c.bases)]
            if base.name in self.keep or len(subs) != 1 or len(subs[0].bases) != 1 or subs[0].keywords:
                continue
            sub = subs[0]
            refs = [n for n in self.walk(self.tree) if isinstance(n, ast.Name) and n.id == base.name]
            refs = [n for n in refs if n is not sub.bases[0]]
            if any(self._constructs(n) for n in refs):
                continue  # the base is built or tested for itself
            if refs:  # Model.tie_weights, model: Model → the subclass (an annotation above it: the base's base)
                above = refs[0].lineno < sub.lineno and not isinstance(self.parents.get(refs[0]), ast.Attribute)
                return self.replace(refs[0], ast.unparse(base.bases[0]) if above and base.bases else sub.name)
            out = self._merge(base, sub)
            if out is not None:
                return out
        return None

    def _constructs(self, name: ast.Name) -> bool:
        """A use of a class name other than an annotation or a method read (``Model.tie_weights``)."""
        parent = self.parents.get(name)
        if isinstance(parent, ast.Attribute):
            return False
        node: ast.AST = name
        while node in self.parents and not isinstance(node, ast.stmt):
            up = self.parents[node]
            if isinstance(up, ast.arg) or (isinstance(up, ast.FunctionDef) and up.returns is node):
                return False
            node = up
        return True

    def _merge(self, base: ast.ClassDef, sub: ast.ClassDef) -> str | None:
        methods = {f.name: f for f in sub.body if isinstance(f, ast.FunctionDef)}
        for f in methods.values():  # super().x() in the subclass reaches the base's x: only __init__ is merged
            calls = [c for c in ast.walk(f) if isinstance(c, ast.Call) and ast.unparse(c.func).startswith("super().")]
            if any(f.name != "__init__" or ast.unparse(c.func) != "super().__init__" for c in calls):
                return None
        mine = {t for s in sub.body if not isinstance(s, ast.FunctionDef) for t in _assigned(s)}
        init = self._init(base, sub)
        if init is None:
            return None
        doc, body = _split_doc(sub.body)
        base_doc, base_body = _split_doc(base.body)
        attrs = [s for s in base_body if not isinstance(s, ast.FunctionDef) and not (_assigned(s) & mine)]
        attrs += [s for s in body if not isinstance(s, ast.FunctionDef)]
        rest = [s for s in body if isinstance(s, ast.FunctionDef) and s.name != "__init__"]
        rest += [s for s in base_body if isinstance(s, ast.FunctionDef) and s.name not in methods]
        rest = [s for s in rest if s.name != "__init__"]
        kept = (doc if body else None) or base_doc or doc  # a subclass that adds nothing: the base's words
        chunks = [self.lines[kept.lineno - 1 : kept.end_lineno]] if kept else []
        if attrs:
            chunks.append([line for s in attrs for line in self._lines(s)])
        chunks += [*([init] if init else []), *(self._lines(s) for s in rest)]
        text = [f"class {sub.name}({', '.join(map(ast.unparse, base.bases))}):"]
        for chunk in chunks:
            text += [*([""] if len(text) > 1 else []), *chunk]
        new = [*self.lines[: first_line(sub) - 1], *text, *self.lines[sub.end_lineno :]]  # type: ignore[misc]
        head, tail = first_line(base) - 1, base.end_lineno
        return "\n".join([*new[:head], *new[tail:]])  # the base, above its subclass, goes

    def _init(self, base: ast.ClassDef, sub: ast.ClassDef) -> list[str] | None:
        """The merged ``__init__``'s lines: the subclass's with the base's body in place of its super call."""
        mine = next((f for f in sub.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        theirs = next((f for f in base.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        if mine is None or theirs is None:
            return self._lines(mine or theirs) if mine or theirs else []
        supers = [s for s in mine.body if isinstance(s, ast.Expr) and ast.unparse(s.value).startswith("super().")]
        if len(supers) != 1 or not isinstance(call := supers[0].value, ast.Call) or call.keywords:
            return None
        params, given = [a.arg for a in theirs.args.args[1:]], [ast.unparse(a) for a in call.args]
        if given != params[: len(given)] or len(params) - len(given) > len(theirs.args.defaults):
            return None  # the base's parameters passed by the same names, the rest left to their defaults
        if theirs.args.vararg or theirs.args.kwarg or theirs.args.kwonlyargs or not theirs.body:
            return None
        if ast.unparse(theirs.body[0]) != "super().__init__()":
            return None
        extra = theirs.args.args[1 + len(given) :]
        if {a.arg for a in extra} & {n.id for n in ast.walk(mine) if isinstance(n, ast.Name)}:
            return None
        args = copy.deepcopy(mine.args)
        args.args += extra
        args.defaults += theirs.args.defaults[len(theirs.args.defaults) - len(extra) :] if extra else []
        returns = f" -> {ast.unparse(mine.returns)}" if mine.returns else ""
        head = [f"{' ' * mine.col_offset}def __init__({ast.unparse(args)}){returns}:"]
        at = supers[0]
        before = self.lines[mine.body[0].lineno - 1 : at.lineno - 1] if mine.body[0] is not at else []
        after = self.lines[at.end_lineno : mine.end_lineno]  # type: ignore[misc]
        return [*head, *before, *self.lines[first_line(theirs.body[0]) - 1 : theirs.end_lineno], *after]

    def _lines(self, stmt: ast.stmt) -> list[str]:
        return self.lines[first_line(stmt) - 1 : stmt.end_lineno]

    # a one-expression function with one call -----------------------------------------------------------

    def _expression(self) -> str | None:
        for fn, owner in self._functions():
            body = fn.body
            if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None or fn.decorator_list:
                continue
            if fn.name in self.keep or fn.name.startswith("__") or (owner and hasattr(nn.Module, fn.name)):
                continue
            a = fn.args
            if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
                continue
            call = self._only_call(fn, owner)
            if call is not None:
                out = self._inline(fn, owner, call, body[0].value)
                if out is not None:
                    return out
        return None

    def _functions(self) -> list[tuple[ast.FunctionDef, ast.ClassDef | None]]:
        out: list[tuple[ast.FunctionDef, ast.ClassDef | None]] = []
        for stmt in self.tree.body:
            if isinstance(stmt, ast.FunctionDef):
                out.append((stmt, None))
            elif isinstance(stmt, ast.ClassDef):
                out += [(f, stmt) for f in stmt.body if isinstance(f, ast.FunctionDef)]
        return out

    def _only_call(self, fn: ast.FunctionDef, owner: ast.ClassDef | None) -> ast.Call | None:
        """The one call of ``fn`` (``self.f(..)`` inside its class for a method), where nothing else names it."""
        nodes = self.walk(self.tree)  # listed once per parse
        named = [n for n in nodes if isinstance(n, ast.Constant) and n.value == fn.name]
        defs = [f for f, _ in self._functions() if f.name == fn.name]
        if owner is None:
            refs = [n for n in nodes if isinstance(n, ast.Name) and n.id == fn.name]
        else:
            refs = [n for n in nodes if isinstance(n, ast.Attribute) and n.attr == fn.name]
        if named or len(defs) != 1 or len(refs) != 1 or not isinstance(call := self.parents.get(refs[0]), ast.Call):
            return None
        if call.func is not refs[0] or any(isinstance(x, ast.Starred) for x in call.args):
            return None
        if any(k.arg is None for k in call.keywords):
            return None
        if owner is not None and (ast.unparse(refs[0]) != f"self.{fn.name}" or self._class(call) is not owner):
            return None
        return call

    def _class(self, node: ast.AST) -> ast.ClassDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.ClassDef):
                return node
        return None

    def _caller(self, node: ast.AST) -> ast.FunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None

    def _inline(self, fn: ast.FunctionDef, owner: Any, call: ast.Call, expr: ast.expr) -> str | None:
        params = [p.arg for p in fn.args.args]
        given: dict[str, ast.expr] = {}
        receiver = [call.func.value] if owner is not None else []  # type: ignore[attr-defined]
        for name, arg in zip(params, [*receiver, *call.args], strict=False):
            given[name] = arg
        given |= {k.arg: k.value for k in call.keywords if k.arg is not None}
        defaults = dict(zip(params[len(params) - len(fn.args.defaults) :], fn.args.defaults, strict=True))
        if set(given) - set(params) or len(call.args) + len(receiver) > len(params):
            return None
        for name in params:
            if name not in given and name not in defaults:
                return None
            given.setdefault(name, defaults.get(name))  # type: ignore[arg-type]
        if any(isinstance(n, (ast.Lambda, ast.comprehension, ast.NamedExpr)) for n in ast.walk(expr)):
            return None
        uses = {p: sum(isinstance(n, ast.Name) and n.id == p for n in ast.walk(expr)) for p in params}
        for p, arg in given.items():
            simple = isinstance(arg, (ast.Name, ast.Constant)) or (
                isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name)
            )
            if (uses[p] > 1 or uses[p] == 0) and not simple:
                return None  # evaluated twice, or not at all: only where that is a plain read
        caller = self._caller(call)
        bound = {n.id for n in ast.walk(caller) if isinstance(n, ast.Name)} if caller else set()
        bound |= {a.arg for a in caller.args.args} if caller else set()
        free = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and n.id not in params}
        if free & bound:
            return None  # a global the caller's locals would shadow

        class Substitute(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> Any:
                return copy.deepcopy(given[node.id]) if node.id in given else node

        text = ast.unparse(Substitute().visit(copy.deepcopy(expr)))
        parent = self.parents.get(call)
        bare = isinstance(parent, (ast.Return, ast.Assign, ast.Expr, ast.keyword)) or (
            isinstance(parent, ast.Call) and call in parent.args
        )
        plain, parsed = text, ast.parse(text, mode="eval").body
        if isinstance(parent, ast.Starred) and isinstance(parsed, ast.Tuple):  # f(*g(k, v)), g → (k, v): f(k, v)
            call, text = parent, ", ".join(ast.unparse(e) for e in parsed.elts)  # type: ignore[assignment]
        elif not isinstance(parsed, (*_ATOMIC, ast.Tuple)) and not bare:  # unparse writes a tuple in parentheses
            text = f"({text})"
        out = self.replace(call, text)
        line = out.split("\n")[call.lineno - 1]
        if call.lineno == call.end_lineno and len(line) <= MAX_WIDTH:
            return out
        return self._named_first(call, plain, bound)

    def _named_first(self, call: ast.Call, text: str, bound: set[str]) -> str | None:
        """``return f(..).a(..)`` where f's expression makes the line too long: ``y = <expression>`` first, then
        ``return y.a(..)`` (the call is the chain's receiver, so nothing runs in another order)."""
        node: ast.AST = call
        while isinstance(up := self.parents.get(node), (ast.Attribute, ast.Call)) and node is getattr(
            up, "value", getattr(up, "func", None)
        ):
            node = up
        ret = self.parents.get(node)
        if node is call or not isinstance(ret, ast.Return) or ret.lineno != ret.end_lineno or "y" in bound:
            return None
        indent = " " * ret.col_offset
        first = f"{indent}y = {text}"
        rest = self.segment(node).replace(self.segment(call), "y", 1)
        second = f"{indent}return {rest}"
        if len(first) > MAX_WIDTH or len(second) > MAX_WIDTH or "#" in self.lines[ret.lineno - 1]:
            return None
        return self.replace_lines(ret.lineno, ret.end_lineno, [first, second])  # type: ignore[arg-type]


def _split_doc(body: list[ast.stmt]) -> tuple[ast.stmt | None, list[ast.stmt]]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first, body[1:]
    return None, body


def _assigned(stmt: ast.stmt) -> set[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
