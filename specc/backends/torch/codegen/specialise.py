"""Specialise Python source to one model: branches the model's facts decide are cut, then what no longer runs.

``specialise(source, facts)`` edits the text (comments and layout survive): ``facts`` maps an expression, as
written in the source, to the values it can take in this model (``{"self.mask": ["causal"]}``); an ``if``,
conditional expression, comparison or ``and`` / ``or`` whose outcome follows from them keeps only the branch
that runs. Then it removes what the cuts left unused: locals bound to a known value, methods nobody calls,
attributes nobody reads (those set from a name or a literal only: modules and parameters stay), parameters
nobody passes or reads, and top-level definitions nobody names. The standalone model.py runs its layer library
through it, so a GPT-2 file carries no sliding-window or prefix mask, no seq2seq generation, no RNN init rule.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter, deque
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

from torch import nn

Facts = dict[str, list[Any]]  # expression (as ast.unparse writes it) → the values it may take
SOMETHING = type("Something", (), {"__repr__": lambda self: "SOMETHING"})()  # a value that is neither None nor falsy
_UNKNOWN = None  # values(): not known
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_LITERALS = (bool, int, float, str, type(None))
_BY_NAME = ("getattr", "hasattr", "setattr", "delattr")


def normalise(facts: Facts) -> Facts:
    """Keys as ``ast.unparse`` writes them, so ``"prefix" in self.META`` matches ``'prefix' in self.META``."""
    return {ast.unparse(ast.parse(k, mode="eval").body): v for k, v in facts.items()}


def specialise(source: str, facts: Facts, keep: set[str] = frozenset()) -> str:  # type: ignore[assignment]
    """``source`` with the branches ``facts`` decide cut and what that leaves unused removed; ``keep``: names
    that stay even when nothing in ``source`` uses them (the API: ``build``, ``generate``)."""
    facts = normalise(facts)
    folded: dict[str, str] = {}  # a definition's text → it folded (the facts are the same each round)
    while True:
        lines = source.split("\n")
        out, done = [], 0
        for stmt in ast.parse(source).body:  # folding needs no other definition: one at a time, small and fast
            first, last = first_line(stmt), stmt.end_lineno  # type: ignore[attr-defined]
            text = "\n".join(lines[first - 1 : last])
            if text not in folded:
                folded[text] = fixpoint(text, lambda s: _Folder(s, facts))
            out += [*lines[done : first - 1], folded[text]]
            done = last
        source = "\n".join([*out, *lines[done:]])
        pruned = fixpoint(source, lambda s: _Pruner(s, keep))
        if pruned == source:
            return pruned
        source = pruned  # a default read in: fold again


def fixpoint(source: str, editor: Any) -> str:
    """Edits until none applies. An editor with ``batch()`` offers every edit of one kind it finds (removals of
    what nothing uses, each valid alone): those whose lines lie apart go in one round, so a parse serves many."""
    for _ in range(2000):  # positions are read anew after each round
        ed = editor(source)
        edits = ed.batch() if hasattr(ed, "batch") else [e for e in [ed.first()] if e is not None]
        if not edits:
            return source
        source = merged(source, edits)
    raise AssertionError("specialise: no fixpoint")


def merged(source: str, edits: list[str]) -> str:
    """``source`` with the first edit and every later one whose changed lines keep a line clear of those taken
    (each edit is a whole new source: its change is the lines between the unchanged head and tail); the first
    alone where together they would not parse (two removals that empty one block)."""
    old = source.split("\n")
    taken: list[tuple[int, int, list[str]]] = []
    for edit in edits:
        new = edit.split("\n")
        head = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
        room = min(len(old), len(new)) - head
        tail = next((i for i in range(room) if old[-1 - i] != new[-1 - i]), room)
        a, b = head, len(old) - tail
        if all(b + 1 <= x or y + 1 <= a for x, y, _ in taken):
            taken.append((a, b, new[head : len(new) - tail]))
    if len(taken) == 1:
        return edits[0]
    for a, b, lines in sorted(taken, key=lambda t: -t[0]):
        old[a:b] = lines
    out = "\n".join(old)
    try:
        ast.parse(out)
    except SyntaxError:
        return edits[0]
    return out


# ---------------------------------------------------------------------------------------------- text edits


class SourceText:
    def __init__(self, source: str):
        self.source = source
        self.lines = source.split("\n")
        self.tree = ast.parse(source)
        self.parents: dict[ast.AST, ast.AST] = {}
        self._children: dict[ast.AST, list[ast.AST]] = {}
        self._walks: dict[ast.AST, list[ast.AST]] = {}
        for node in self.walk(self.tree):
            for child in self._children[node]:
                self.parents[child] = node

    def walk(self, node: ast.AST) -> list[ast.AST]:
        """``ast.walk(node)`` (breadth first, the same order), listed once per parse: an edit makes new source,
        never a changed tree, and the editors read the same subtrees many times per round."""
        nodes = self._walks.get(node)
        if nodes is None:
            nodes, todo = [], deque([node])
            while todo:
                nodes.append(n := todo.popleft())
                if n not in self._children:
                    self._children[n] = list(ast.iter_child_nodes(n))
                todo.extend(self._children[n])
            self._walks[node] = nodes
        return nodes

    def _siblings(self, stmt: ast.stmt) -> list[ast.stmt] | None:
        """The statement list ``stmt`` stands in (a body, an else, a finally), or None."""
        parent = self.parents.get(stmt)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and stmt in block:
                return block
        return None

    def segment(self, node: ast.AST) -> str:
        """``node``'s source text (``ast.get_source_segment`` without splitting the whole source again)."""
        a, b = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
        if a is None or b is None:
            return ast.unparse(node)
        if a == b:
            return self.lines[a - 1].encode()[node.col_offset : node.end_col_offset].decode()  # type: ignore[attr-defined]
        head = self.lines[a - 1].encode()[node.col_offset :].decode()  # type: ignore[attr-defined]
        tail = self.lines[b - 1].encode()[: node.end_col_offset].decode()  # type: ignore[attr-defined]
        return "\n".join([head, *self.lines[a : b - 1], tail])

    def replace(self, node: ast.AST, text: str) -> str:
        """The source with ``node``'s segment replaced (columns are utf-8 byte offsets); parentheses around the
        segment go too when the new text is one name, literal, call or comparison."""
        return self.replace_all([(node, text)])

    def replace_all(self, edits: list[tuple[ast.AST, str]]) -> str:
        """``replace`` of several nodes that do not overlap, in one new source (the last first, so the
        positions of those before it stay)."""
        lines = [ln.encode() for ln in self.lines]
        for node, text in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):  # type: ignore[attr-defined]
            a, b = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined, operator]
            head, tail = lines[a][: node.col_offset], lines[b][node.end_col_offset :]  # type: ignore[attr-defined]
            atomic = isinstance(ast.parse(text, mode="eval").body, (ast.Name, ast.Constant, ast.Call, ast.Compare))
            while atomic and head.endswith(b"(") and tail.startswith(b")"):
                before = head[:-1][-1:]
                if before.isalnum() or before in (b"_", b")", b"]"):  # a call's parentheses
                    break
                head, tail = head[:-1], tail[1:]
            lines[a : b + 1] = [head + text.encode() + tail]
        return "\n".join(x.decode() for x in lines)

    def replace_lines(self, first: int, last: int, new: list[str]) -> str:
        """Lines first..last (1-based, inclusive) replaced by ``new``."""
        return "\n".join([*self.lines[: first - 1], *new, *self.lines[last:]])

    def block(self, body: list[ast.stmt], indent: int) -> list[str]:
        """The lines of statements ``body`` re-indented to ``indent`` columns (comments inside come along)."""
        first, last = first_line(body[0]), body[-1].end_lineno  # type: ignore[attr-defined]
        lines = self.lines[first - 1 : last]
        shift = body[0].col_offset - indent
        return [ln[shift:] if ln[:shift].strip() == "" else ln for ln in lines]


def first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno - 1 for d in decorators)])  # decorators sit above ``def``


def _is_elif(t: SourceText, node: ast.If) -> bool:
    return t.lines[node.lineno - 1].lstrip().startswith("elif")


def _else_line(t: SourceText, node: ast.If) -> int:
    """The line of ``else:`` before node's orelse."""
    line = first_line(node.orelse[0]) - 1
    while not t.lines[line - 1].lstrip().startswith("else"):
        line -= 1
    return line


# ---------------------------------------------------------------------------------------------- folding


class _Folder(SourceText):
    """Finds the first construct whose outcome the facts decide and returns the source with it folded."""

    def __init__(self, source: str, facts: Facts):
        super().__init__(source)
        self.facts = facts
        self.local: dict[str, list[Any]] = {}

    def first(self) -> str | None:
        return self._body(self.tree.body)

    # values ------------------------------------------------------------------------------------------

    def values(self, node: ast.AST) -> list[Any] | None:
        """The values ``node`` may take, where the facts tell; None where they do not."""
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
            return [tuple(e.value for e in node.elts)]  # type: ignore[attr-defined]
        if isinstance(node, ast.Name) and node.id in self.local:
            return self.local[node.id]
        key = ast.unparse(node)
        if key in self.facts:
            return self.facts[key]
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.values(node.left), self.values(node.comparators[0])
            if left is None or right is None:
                return None
            out = {_compare(node.ops[0], a, b) for a in left for b in right}
            return None if None in out else list(out)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            truth = self.truth(node.operand)
            return None if truth is None else [not truth]
        return None

    def truth(self, node: ast.AST) -> bool | None:
        """Whether ``node`` is truthy in every case the facts allow (None: not decided)."""
        if isinstance(node, ast.BoolOp):
            truths = [self.truth(v) for v in node.values]
            if isinstance(node.op, ast.And):
                return False if False in truths else True if all(t is True for t in truths) else None
            return True if True in truths else False if all(t is False for t in truths) else None
        values = self.values(node)
        if not values:
            return None
        truths = {bool(v) for v in values}
        return truths.pop() if len(truths) == 1 else None

    # statements --------------------------------------------------------------------------------------

    def _body(self, body: list[ast.stmt]) -> str | None:
        for i, stmt in enumerate(body):
            out = self._stmt(stmt)
            if out is not None:
                return out
            if isinstance(stmt, (ast.Return, ast.Raise)) and i + 1 < len(body):  # a fold left code that never runs
                return self.replace_lines(first_line(body[i + 1]), body[-1].end_lineno, [])  # type: ignore[arg-type]
        return None

    def _stmt(self, stmt: ast.stmt) -> str | None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            saved, self.local = self.local, self._locals(stmt)
            try:
                return self._exprs(stmt.args) or self._body(stmt.body)
            finally:
                self.local = saved
        if isinstance(stmt, ast.ClassDef):
            return self._body(stmt.body)
        if isinstance(stmt, ast.If):
            truth = self.truth(stmt.test)
            if truth is not None:
                return self._fold_if(stmt, truth)
            return self._test(stmt.test) or self._body(stmt.body) or self._body(stmt.orelse)
        if isinstance(stmt, ast.While):
            return self._test(stmt.test) or self._body(stmt.body)
        if isinstance(stmt, ast.Assert):
            return self._test(stmt.test) or self._exprs(stmt)
        if isinstance(stmt, (ast.For, ast.With)):
            head = self._expr(stmt.iter) if isinstance(stmt, ast.For) else None
            for item in getattr(stmt, "items", []):
                head = head or self._expr(item.context_expr)
            return head or self._body(stmt.body) or self._body(getattr(stmt, "orelse", []))
        if isinstance(stmt, ast.Try):
            handlers = [h.body for h in stmt.handlers]
            return next(filter(None, map(self._body, [stmt.body, *handlers, stmt.orelse, stmt.finalbody])), None)
        return self._exprs(stmt)

    def _locals(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[Any]]:
        """Names bound once in ``fn`` (a plain assignment, not a parameter) whose value the facts decide."""
        stores: dict[str, list[ast.AST]] = {}
        for node in self.walk(fn):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                stores.setdefault(node.id, []).append(self.parents.get(node))  # type: ignore[arg-type]
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        out: dict[str, list[Any]] = {}
        for name, owners in stores.items():
            owner = owners[0]
            if name in params or len(owners) != 1 or not isinstance(owner, (ast.Assign, ast.Tuple)):
                continue
            if isinstance(owner, ast.Tuple):  # a, b = x, y
                assign = self.parents.get(owner)
                if not (isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Tuple)):
                    continue
                if assign.targets != [owner] or len(assign.value.elts) != len(owner.elts):
                    continue
                value = next(v for t, v in zip(owner.elts, assign.value.elts, strict=True) if _named(t, name))
            elif len(owner.targets) == 1 and isinstance(owner.targets[0], ast.Name):
                value = owner.value
            else:
                continue
            values = self.values(value)
            if values is not None and all(isinstance(v, _LITERALS) for v in values):
                out[name] = values
        return out

    def _fold_if(self, stmt: ast.If, truth: bool) -> str:
        first, last = stmt.lineno, stmt.end_lineno  # type: ignore[attr-defined]
        indent = stmt.col_offset
        if _is_elif(self, stmt):  # an elif: the parent's else branch
            if truth:  # `elif t:` → `else:` (its own else dropped)
                return self.replace_lines(first, last, [" " * indent + "else:", *self.block(stmt.body, indent + 4)])
            if not stmt.orelse:
                return self.replace_lines(first, last, [])
            if isinstance(stmt.orelse[0], ast.If) and len(stmt.orelse) == 1 and _is_elif(self, stmt.orelse[0]):
                return self.replace_lines(first, stmt.orelse[0].lineno - 1, [])
            return self.replace_lines(first, _else_line(self, stmt) - 1, [])
        if truth:
            new = self.block(stmt.body, indent)
        elif not stmt.orelse:
            new = []
        elif len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], ast.If) and _is_elif(self, stmt.orelse[0]):
            elif_line = stmt.orelse[0].lineno
            text = self.lines[elif_line - 1]
            head = text.replace("elif", "if", 1)
            return self.replace_lines(first, elif_line, [head])
        else:
            new = self.block(stmt.orelse, indent)
        parent_body = self._siblings(stmt)
        if not new and parent_body is not None and len(parent_body) == 1:
            new = [" " * indent + "pass"]
        return self.replace_lines(first, last, new)

    # expressions -------------------------------------------------------------------------------------

    def _test(self, test: ast.expr) -> str | None:
        """A condition only read for its truth: ``and`` / ``or`` operands the facts decide are dropped."""
        if isinstance(test, ast.BoolOp):
            keep = [v for v in test.values if self.truth(v) is not isinstance(test.op, ast.And)]
            if len(keep) < len(test.values) and keep:
                join = " and " if isinstance(test.op, ast.And) else " or "
                return self.replace(test, join.join(self._operand(v, test) for v in keep))
            for v in test.values:
                out = self._test(v)
                if out is not None:
                    return out
            return None
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self._test(test.operand)
        return self._expr(test)

    def _operand(self, node: ast.expr, parent: ast.BoolOp) -> str:
        text = self.segment(node)
        needs = isinstance(node, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) and not text.startswith("(")
        return f"({text})" if needs else text

    def _exprs(self, node: ast.AST) -> str | None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out = self._expr(child)
            elif isinstance(child, (ast.arguments, ast.keyword, ast.comprehension, ast.arg)):
                out = self._exprs(child)
            else:
                continue
            if out is not None:
                return out
        return None

    def _expr(self, node: ast.expr) -> str | None:
        if isinstance(node, (ast.Lambda, ast.Constant)) or isinstance(getattr(node, "ctx", None), ast.Store):
            return None
        if isinstance(node, ast.Attribute):  # self.mask → "causal" where the model has one value
            values = self.facts.get(ast.unparse(node))
            if values is not None and len(values) == 1 and isinstance(values[0], _LITERALS):
                return self.replace(node, repr(values[0]))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):  # a local bound once to what facts decide
            values = self.local.get(node.id)
            if values is not None and len(values) == 1:
                return self.replace(node, repr(values[0]))
        if isinstance(node, ast.Compare):
            values = self.values(node)
            if values is not None and len(values) == 1:
                return self.replace(node, repr(values[0]))
        if isinstance(node, ast.IfExp):
            truth = self.truth(node.test)
            if truth is None and ast.dump(node.body) == ast.dump(node.orelse) and _plain(node.test):
                truth = True  # `0.0 if self.training else 0.0`: either way the same
            if truth is not None:
                chosen = node.body if truth else node.orelse
                text = self.segment(chosen)
                wrap = isinstance(chosen, (ast.IfExp, ast.BoolOp, ast.Lambda, ast.Tuple)) and not text.startswith("(")
                return self.replace(node, f"({text})" if wrap else text)
            return self._test(node.test) or self._expr(node.body) or self._expr(node.orelse)
        if isinstance(node, ast.BoolOp):  # a value: leading operands the facts decide
            first = self.truth(node.values[0])
            if first is not None and len(node.values) > 1:
                decides = first is not isinstance(node.op, ast.And)  # True or ...: the first; False and ...: too
                rest = node.values[1:]
                if decides:
                    return self.replace(node, self._operand(node.values[0], node))
                join = " and " if isinstance(node.op, ast.And) else " or "
                return self.replace(node, join.join(self._operand(v, node) for v in rest))
        return self._exprs(node)


def _named(target: ast.expr, name: str) -> bool:
    return isinstance(target, ast.Name) and target.id == name


def _compare(op: ast.cmpop, a: Any, b: Any) -> Any:
    """The comparison, or None where SOMETHING makes it undecidable."""
    if SOMETHING in (a, b) or (isinstance(b, tuple) and SOMETHING in b):
        if isinstance(op, (ast.Is, ast.IsNot)) and None in (a, b):
            return isinstance(op, ast.IsNot)
        return None
    try:
        return bool(_COMPARE[type(op)](a, b))
    except TypeError:
        return None


# ---------------------------------------------------------------------------------------------- pruning


class _Pruner(SourceText):
    """Finds the definitions, attributes, parameters and locals left unused, and the source without each."""

    def __init__(self, source: str, keep: set[str]):
        super().__init__(source)
        self.keep = keep
        self._uncalled: set[str] | None = None  # names read other than as a callee (_referenced)
        self._by_name: dict[str, bool] = {}  # class → named other than as a base (_shadowed)
        self._classes_of: dict[ast.AST, str | None] = {}  # node → the class it is inside (_class_of)
        self.loaded: set[str] = set()  # attributes read anywhere, by name or by getattr / hasattr
        for node in self.walk(self.tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.loaded.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BY_NAME:
                self.loaded |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}

    def batch(self) -> list[str]:
        """Every edit of the first kind that has one: unused top-level definitions, class members, then
        function-level edits (one per function), then constant attributes read as their literal."""
        for kind in (self._toplevel, self._classes, self._functions, self._constant_attribute, self._constant_call):
            edits = list(kind())
            if edits:
                return edits
        return []

    def _constant_attribute(self) -> Iterator[str]:
        """An attribute set once in the whole source, ``self.x = <literal>``, and never elsewhere (nor by name,
        nor by nn.Module): its reads become the literal (folding then cuts what it decides)."""
        stores: dict[str, list[tuple[ast.Attribute, ast.expr | None]]] = {}
        for node in self.walk(self.tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else []:
                pairs = _pairs(t, getattr(node, "value", None), isinstance(node, ast.AugAssign))
                for target, value in pairs:
                    if isinstance(target, ast.Attribute):
                        stores.setdefault(target.attr, []).append((target, value))
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Del):
                stores.setdefault(node.attr, []).append((node, None))
        named = {n.value for n in self.walk(self.tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for cls in (n for n in self.walk(self.tree) if isinstance(n, ast.ClassDef)):  # class attributes, methods
            named |= {t.id for s in cls.body for t in _targets(s)} | {f.name for f in cls.body if hasattr(f, "name")}
        for attr, [(target, value)] in ((a, v) for a, v in stores.items() if len(v) == 1):
            literal = isinstance(value, ast.Constant) and isinstance(value.value, _LITERALS)
            if not literal or attr in named or hasattr(_MODULE, attr) or ast.unparse(target.value) != "self":
                continue
            reads = [n for n in self.walk(self.tree) if isinstance(n, ast.Attribute) and n.attr == attr]
            reads = [n for n in reads if isinstance(n.ctx, ast.Load) and ast.unparse(n.value) == "self"]
            for read in reads:
                yield self.replace(read, repr(value.value))  # type: ignore[union-attr]

    def _constant_call(self) -> Iterator[str]:
        """A call, with plain arguments, of a top-level function whose body folding left as ``return <literal>``
        (``attention_factor`` of a llama3 scaling): the literal (the function goes when nothing else names it)."""
        constant = {}
        for fn in (f for f in self.tree.body if isinstance(f, ast.FunctionDef)):
            body = [b for b in fn.body if not _docstring(b)]
            value = body[0].value if len(body) == 1 and isinstance(body[0], ast.Return) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, _LITERALS):
                constant[fn.name] = repr(value.value)
        for call in (n for n in self.walk(self.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            name = call.func.id  # type: ignore[attr-defined]
            if name in constant and all(_plain(a) for a in [*call.args, *(k.value for k in call.keywords)]):
                yield self.replace(call, constant[name])

    def _toplevel(self) -> Iterator[str]:
        reads = [Counter(_reads(self.walk(stmt))) for stmt in self.tree.body]  # names and strings each reads
        total = sum(reads, Counter())
        for stmt, inside in zip(self.tree.body, reads, strict=True):
            names = _defined(stmt)
            if not names or names & self.keep:
                continue
            if not any(total[n] > inside[n] for n in names):
                yield self.replace_lines(first_line(stmt), stmt.end_lineno, [])  # type: ignore[arg-type]

    def _classes(self) -> Iterator[str]:
        for cls in (n for n in self.tree.body if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                out = self._member(cls, stmt)
                if out is not None:
                    yield out
            for fn in (s for s in cls.body if isinstance(s, ast.FunctionDef)):
                for stmt in self.walk(fn):
                    if isinstance(stmt, ast.Assign):
                        out = self._assign(stmt, self._siblings(stmt) or [], self._unread_attribute)
                        if out is not None:
                            yield out

    def _member(self, cls: ast.ClassDef, stmt: ast.stmt) -> str | None:
        """The class without member ``stmt`` where nothing uses it (or a base's copy serves)."""
        if self._shadowed(cls, stmt):
            return self._drop(stmt, cls.body)
        if isinstance(stmt, ast.FunctionDef) and _only_super_init(stmt) and self._same_init(cls, stmt):
            return self._drop(stmt, cls.body)
        if isinstance(stmt, ast.FunctionDef):
            unused = stmt.name not in self.loaded | self.keep and not hasattr(nn.Module, stmt.name)
            if stmt.name == "extra_repr" or (unused and not stmt.name.startswith("__")):
                return self._drop(stmt, cls.body)
        elif isinstance(stmt, ast.Assign):
            return self._assign(stmt, cls.body, lambda t: isinstance(t, ast.Name) and t.id not in self.loaded)
        elif (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.target.id not in self.loaded
            and (stmt.value is None or _plain(stmt.value))
        ):
            return self._drop(stmt, cls.body)
        return None

    def _shadowed(self, cls: ast.ClassDef, stmt: ast.stmt) -> bool:
        """A plain class attribute of a class never constructed nor read by its own name, that each of its
        subclasses here sets again (the Model base's TIED / INPUTS / META defaults under the one root class)."""
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
        target = stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else target
        value = getattr(stmt, "value", None)
        plain = value is not None and (_plain(value) or (isinstance(value, ast.Tuple) and not value.elts))
        if not isinstance(target, ast.Name) or not plain or cls.name in self.keep:
            return False
        subs = [c for c in self.tree.body if isinstance(c, ast.ClassDef) and cls.name in map(ast.unparse, c.bases)]
        if cls.name not in self._by_name:  # Model(...) or Model.META; Model.tie_weights is a method
            attrs, bases = _class_attrs(cls), [b for c in subs for b in c.bases]
            self._by_name[cls.name] = any(
                not any(n is b for b in bases)
                and not isinstance(p := self.parents.get(n), ast.arg)  # an annotation constructs nothing
                and not (isinstance(p, ast.Attribute) and p.attr not in attrs)
                for n in self.walk(self.tree)
                if isinstance(n, ast.Name) and n.id == cls.name
            )
        by_name = self._by_name[cls.name]
        read_here = target.id in {n.id for s in cls.body if not isinstance(s, ast.FunctionDef) for n in _loads(s)}
        sets = [target.id in {t.id for s in c.body for t in _targets(s)} for c in subs]
        return bool(subs) and all(sets) and not by_name and not read_here

    def _same_init(self, cls: ast.ClassDef, init: ast.FunctionDef) -> bool:
        """Whether ``cls``'s one base has the method ``init`` overrides with the same signature (defaults too):
        a base in this source, or nn.Module itself."""
        defs = {c.name: c for c in self.tree.body if isinstance(c, ast.ClassDef)}
        base = defs.get(ast.unparse(cls.bases[0])) if len(cls.bases) == 1 else None
        if base is None and len(cls.bases) == 1 and ast.unparse(cls.bases[0]) == "nn.Module":
            if init.name == "__init__":  # nn.Module() takes no arguments
                return len(init.args.args) == 1 and not init.args.vararg and not init.args.kwarg
            return _module_signature(init.name) == [(a.arg, ast.unparse(d)) for a, d in _defaults(init.args)]
        theirs = [f for f in (base.body if base else []) if isinstance(f, ast.FunctionDef) and f.name == init.name]
        if not theirs and base is not None and init.name != "__init__":  # the nearest class up that has it
            return self._same_init(base, init)
        if not theirs:
            return False
        base_args, n = theirs[0].args, len(init.args.args)  # the base's first n parameters, the rest defaulted
        first_default = len(base_args.args) - len(base_args.defaults)
        if n < first_default or init.args.vararg or init.args.kwonlyargs or init.args.kwarg:
            return ast.unparse(base_args) == ast.unparse(init.args)
        kept = base_args.defaults[: max(0, n - first_default)]
        head = ast.arguments(posonlyargs=[], args=base_args.args[:n], kwonlyargs=[], kw_defaults=[], defaults=kept)
        return ast.unparse(head) == ast.unparse(init.args)

    def _unread_attribute(self, t: ast.expr) -> bool:
        return (
            isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
            and t.attr not in self.loaded
        )

    def _assign(self, stmt: ast.Assign, siblings: list[ast.stmt], unused: Any) -> str | None:
        """``stmt`` without the targets ``unused`` picks whose values are plain (a name, a literal, ``{}``)."""
        if len(stmt.targets) != 1:
            return None
        target, value = stmt.targets[0], stmt.value
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts, strict=True))
            keep = [(t, v) for t, v in pairs if not (unused(t) and _plain(v))]
            if len(keep) == len(pairs):
                return None
            if not keep:
                return self._drop(stmt, siblings)
            indent = " " * stmt.col_offset
            tail = self.lines[stmt.end_lineno - 1].encode()[stmt.end_col_offset :].decode()  # type: ignore[attr-defined]
            left = ", ".join(self.segment(t) for t, _ in keep)
            right = ", ".join(self.segment(v) for _, v in keep)
            line = f"{indent}{left} = {right}{tail}"
            return self.replace_lines(stmt.lineno, stmt.end_lineno, [line])  # type: ignore[arg-type]
        if unused(target) and _plain(value):
            return self._drop(stmt, siblings)
        return None

    def _drop(self, stmt: ast.stmt, siblings: list[ast.stmt]) -> str:
        new = [" " * stmt.col_offset + "pass"] if len(siblings) == 1 else []
        return self.replace_lines(first_line(stmt), stmt.end_lineno, new)  # type: ignore[arg-type]

    def _functions(self) -> Iterator[str]:
        calls = [n for n in self.walk(self.tree) if isinstance(n, ast.Call)]
        by_callee: dict[str | None, list[ast.Call]] = {}  # another function than __init__ is reached by its name
        for c in calls:
            by_callee.setdefault(_callee(c), []).append(c)
        bases: dict[str, set[str]] = {}  # class → the names that construct it (itself and its subclasses)
        classes = [n for n in self.walk(self.tree) if isinstance(n, ast.ClassDef)]
        for c in classes:
            bases[c.name] = {c.name}
        for _ in classes:  # transitive
            for c in classes:
                for b in c.bases:
                    name = b.id if isinstance(b, ast.Name) else None
                    if name in bases:
                        bases[name] |= bases[c.name]
        for fn in (n for n in self.walk(self.tree) if isinstance(n, ast.FunctionDef)):
            local = list(self._dead_locals(fn))
            yield from local
            out = None
            if not local and (fn.name == "__init__" or not hasattr(nn.Module, fn.name)):
                owner = self.parents.get(fn)
                names = bases.get(owner.name, set()) if isinstance(owner, ast.ClassDef) else set()
                mine = owner.name if isinstance(owner, ast.ClassDef) else None
                candidates = calls if fn.name == "__init__" else by_callee.get(fn.name, [])
                reaching = [c for c in candidates if _may_call(c, fn, names, mine, self._class_of(c))]
                out = self._unused_params(fn, reaching, method=isinstance(owner, ast.ClassDef))
                if out is None and fn.name not in self.keep and not self._referenced(fn, names):
                    out = self._default_read(fn, reaching)
            if out is not None:
                yield out

    def _class_of(self, node: ast.AST) -> str | None:
        if node not in self._classes_of:
            parent = self.parents.get(node)
            named = (
                None if parent is None else parent.name if isinstance(parent, ast.ClassDef) else self._class_of(parent)
            )
            self._classes_of[node] = named
        return self._classes_of[node]

    def _dead_locals(self, fn: ast.FunctionDef) -> Iterator[str]:
        """``name = <literal>`` whose name nothing in ``fn`` reads (left behind by folding); ``name = e`` then
        ``return name`` as ``return e`` where nothing else in ``fn`` names it."""
        read = {n.id for n in self.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        names = Counter(n.id for n in self.walk(fn) if isinstance(n, ast.Name))
        out = self._copies(fn)
        if out is not None:
            yield out
        for stmt in self.walk(fn):  # a, b, probs = f(): a name the cuts left unread is unpacked into _
            unpacked = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            if isinstance(unpacked, ast.Tuple) and not isinstance(stmt.value, ast.Tuple):  # type: ignore[union-attr]
                for t in unpacked.elts:
                    if isinstance(t, ast.Name) and t.id != "_" and t.id not in read and names[t.id] == 1:
                        yield self.replace(t, "_")
        for body in (b for n in self.walk(fn) if isinstance(b := getattr(n, "body", None), list)):
            for stmt, ret in pairwise(body):
                out = self._stored_once(stmt, ret, names)
                if out is not None:
                    yield out
                    continue
                if not (isinstance(stmt, ast.Assign) and isinstance(ret, ast.Return) and len(stmt.targets) == 1):
                    continue
                target, value = stmt.targets[0], ret.value
                one = isinstance(target, ast.Name) and names[target.id] == 2 and stmt.lineno == stmt.end_lineno
                if one and isinstance(value, ast.Name) and value.id == target.id:  # type: ignore[union-attr]
                    line = f"{' ' * stmt.col_offset}return {self.segment(stmt.value)}"
                    yield self.replace_lines(stmt.lineno, ret.end_lineno, [line])  # type: ignore[arg-type]
                    continue
                if one and value is not None and "#" not in self.lines[stmt.lineno - 1] + self.lines[ret.lineno - 1]:
                    out = self._returned_once(stmt, ret, target.id)  # type: ignore[union-attr]
                    if out is not None:
                        yield out
        for stmt in self.walk(fn):
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id not in read
                and isinstance(stmt.value, ast.Constant)
            ):
                yield self._drop(stmt, self._siblings(stmt) or [])
            elif isinstance(stmt, ast.Assign):  # a, b = x, y: the pairs whose name is never read, their value pure
                out = self._assign(
                    stmt, self._siblings(stmt) or [], lambda t: isinstance(t, ast.Name) and t.id not in read
                )
                if out is not None:
                    yield out

    def _copies(self, fn: ast.FunctionDef) -> str | None:
        """A local bound once to a parameter ``fn`` never rebinds (``prompt = input_ids``) read as the parameter;
        one bound once to ``{}`` and only spread or passed (``fixed = {}``, ``**fixed``) read as nothing / ``{}``."""
        stores = Counter(n.id for n in self.walk(fn) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        pairs = [
            (t, v)
            for stmt in self.walk(fn)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
            for t, v in _pairs(stmt.targets[0], stmt.value, False)  # prompt, fixed = input_ids, {} too
            if isinstance(t, ast.Name) and v is not None
        ]
        for target, value in pairs:
            name = target.id  # type: ignore[attr-defined]
            if stores[name] != 1 or name in params:
                continue
            loads = [n for n in self.walk(fn) if isinstance(n, ast.Name) and n.id == name and n is not target]
            if isinstance(value, ast.Name) and value.id in params and not stores[value.id] and loads:
                return self.replace(loads[0], value.id)
            if not (isinstance(value, ast.Dict) and not value.keys) or not loads:
                continue
            for load in loads:
                parent = self.parents.get(load)
                if isinstance(parent, ast.Dict) and any(
                    k is None and v is load for k, v in zip(parent.keys, parent.values, strict=True)
                ):
                    return self._unspread(parent, load)
                if not (isinstance(parent, ast.Call) and load in parent.args):
                    break  # read otherwise: it stays a name
            else:
                return self.replace(loads[0], "{}")
        return None

    def _unspread(self, display: ast.Dict, load: ast.Name) -> str:
        """The dict display without its ``**name`` entry."""
        items = [
            f"**{self.segment(v)}" if k is None else f"{self.segment(k)}: {self.segment(v)}"
            for k, v in zip(display.keys, display.values, strict=True)
            if v is not load
        ]
        return self.replace(display, "{" + ", ".join(items) + "}")

    def _stored_once(self, stmt: ast.stmt, nxt: ast.stmt, names: Counter[str]) -> str | None:
        """``y = e`` then ``t = y`` (``y`` named nowhere else) as ``t = e``: the value is computed before the
        target's expression either way; one line each, no comment lost, the line stays short."""
        if not (isinstance(stmt, ast.Assign) and isinstance(nxt, ast.Assign)):
            return None
        if len(stmt.targets) != 1 or len(nxt.targets) != 1 or not isinstance(name := stmt.targets[0], ast.Name):
            return None
        if not (isinstance(nxt.value, ast.Name) and nxt.value.id == name.id and names[name.id] == 2):
            return None
        if stmt.lineno != stmt.end_lineno or nxt.lineno != nxt.end_lineno:
            return None
        if "#" in self.lines[stmt.lineno - 1] + self.lines[nxt.lineno - 1]:
            return None
        line = f"{' ' * stmt.col_offset}{self.segment(nxt.targets[0])} = {self.segment(stmt.value)}"
        return None if len(line) > 110 else self.replace_lines(stmt.lineno, nxt.lineno, [line])

    def _returned_once(self, stmt: ast.Assign, ret: ast.Return, name: str) -> str | None:
        """``y = e`` then ``return y.f(..)`` as ``return e.f(..)``: ``y`` read once, first (the receiver of the
        returned chain) or beside plain reads only, so nothing runs in another order; the line stays short."""
        value = ret.value
        if sum(_named(n, name) for n in self.walk(value)) != 1:  # type: ignore[arg-type, arg-type]
            return None
        node: Any = value
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):  # down the receiver chain
            node = node.func if isinstance(node, ast.Call) else node.value
        args = [*value.args, *(k.value for k in value.keywords)] if isinstance(value, ast.Call) else []
        beside = isinstance(value, ast.Call) and _plain(value.func) and all(_plain(a) for a in args)
        if not (_named(node, name) or beside):
            return None

        class Put(ast.NodeTransformer):
            def visit_Name(self, n: ast.Name) -> Any:
                return stmt.value if n.id == name else n

        line = (
            f"{' ' * ret.col_offset}return {ast.unparse(Put().visit(ast.parse(ast.unparse(value), mode='eval')).body)}"
        )
        if len(line) > 110 or ret.lineno != ret.end_lineno:
            return None
        return self.replace_lines(stmt.lineno, ret.end_lineno, [line])

    def _unused_params(self, fn: ast.FunctionDef, calls: list[ast.Call], method: bool = True) -> str | None:
        """A parameter with a default that the body does not read and no call that may reach ``fn`` passes
        (``method``: calls pass ``self`` besides their arguments)."""
        keywords = {k.arg for c in calls for k in c.keywords}
        if None in keywords or any(isinstance(a, ast.Starred) for c in calls for a in c.args):
            return None  # f(**kw), f(*args): anything may be passed
        read = {n.id for n in self.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        args = fn.args
        positional = [*args.posonlyargs, *args.args]
        most = max((len(c.args) + method for c in calls), default=0)  # + 1: a method's self
        out = self._forwarded_default(fn, positional, most, keywords)
        if out is not None:
            return out
        first_default = len(positional) - len(args.defaults)
        gone = {  # every one at once: each stands past what calls pass, so the others' positions stay
            i for i, a in enumerate(positional) if i >= first_default and i >= most and a.arg not in read | keywords
        }
        kw_gone = {
            i
            for i, a in enumerate(args.kwonlyargs)
            if args.kw_defaults[i] is not None and a.arg not in read and a.arg not in keywords
        }
        if not gone and not kw_gone:
            return None
        new = ast.arguments(
            posonlyargs=[p for i, p in enumerate(args.posonlyargs) if i not in gone],
            args=[p for i, p in enumerate(args.args, len(args.posonlyargs)) if i not in gone],
            vararg=args.vararg,
            kwonlyargs=[k for i, k in enumerate(args.kwonlyargs) if i not in kw_gone],
            kw_defaults=[d for i, d in enumerate(args.kw_defaults) if i not in kw_gone],
            kwarg=args.kwarg,
            defaults=[d for j, d in enumerate(args.defaults) if j + first_default not in gone],
        )
        return self._signature(fn, new)

    def _referenced(self, fn: ast.FunctionDef, constructors: set[str]) -> bool:
        """Whether ``fn`` is named other than as the callee of a call: passed as a value (``partial(f, ..)``,
        ``Model.tie_weights`` as a hook), read by name, or (an ``__init__``) its class used as a value."""
        if self._uncalled is None:
            self._uncalled = set()
            for node in self.walk(self.tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    self._uncalled.add(node.value)  # getattr(x, "name")
                name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
                if name is None or not isinstance(getattr(node, "ctx", None), ast.Load):
                    continue
                parent = self.parents.get(node)
                called = isinstance(parent, ast.Call) and parent.func is node
                if not (called or isinstance(parent, ast.ClassDef) or _in_annotation(self, node)):
                    self._uncalled.add(name)
        return bool((constructors if fn.name == "__init__" else {fn.name}) & self._uncalled)

    def _default_read(self, fn: ast.FunctionDef, calls: list[ast.Call]) -> str | None:
        """The parameters with a literal default that no call reaching ``fn`` passes and ``fn`` never rebinds:
        their reads become the literal (folding then decides what it decides; unread, the parameter goes)."""
        keywords = {k.arg for c in calls for k in c.keywords}
        if not calls or None in keywords or any(isinstance(a, ast.Starred) for c in calls for a in c.args):
            return None
        positional = [*fn.args.posonlyargs, *fn.args.args]
        most = max(len(c.args) + 1 for c in calls)  # + 1: a method's self
        first_default = len(positional) - len(fn.args.defaults)
        nested = [n for n in self.walk(fn) if n is not fn and isinstance(n, (ast.Lambda, ast.FunctionDef))]
        scoped = {a.arg for n in nested for a in n.args.args}  # names a nested scope binds again
        reads: list[tuple[ast.AST, str]] = []
        for i, a in enumerate(positional):
            default = fn.args.defaults[i - first_default] if i >= first_default else None
            if not isinstance(default, ast.Constant) or i < most or a.arg in keywords or a.arg in scoped:
                continue
            uses = [n for n in self.walk(fn) if isinstance(n, ast.Name) and n.id == a.arg]
            if uses and all(isinstance(n.ctx, ast.Load) for n in uses):
                reads += [(n, repr(default.value)) for n in uses]
        return self.replace_all(reads) if reads else None

    def _forwarded_default(
        self, fn: ast.FunctionDef, positional: list[ast.arg], most: int, keywords: set[str | None]
    ) -> str | None:
        """``super().f(a, p)`` without its last argument ``p``: a parameter of ``fn`` no call passes, read there
        only, whose default is the base's for that position (the base then takes its own default)."""
        owner = self.parents.get(fn)
        defs = {c.name: c for c in self.tree.body if isinstance(c, ast.ClassDef)}
        base = defs.get(ast.unparse(owner.bases[0])) if isinstance(owner, ast.ClassDef) and owner.bases else None
        theirs = [f for f in (base.body if base else []) if isinstance(f, ast.FunctionDef) and f.name == fn.name]
        calls = [
            n.value
            for n in fn.body
            if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and ast.unparse(n.value.func) == f"super().{fn.name}"
            and n.value.args
            and not n.value.keywords
        ]
        if not theirs or len(calls) != 1 or not isinstance(last := calls[0].args[-1], ast.Name):
            return None
        mine, base_defaults = dict(_defaults(fn.args)), _defaults(theirs[0].args)
        at = len(calls[0].args) - 1
        param = next((a for a in mine if a.arg == last.id), None)
        loads = [n for n in self.walk(fn) if isinstance(n, ast.Name) and n.id == last.id]
        if param is None or len(loads) != 1 or param.arg in keywords or positional.index(param) < most:
            return None  # read elsewhere too, or passed by a call
        if at >= len(base_defaults) or ast.unparse(base_defaults[at][1]) != ast.unparse(mine[param]):
            return None
        if ast.unparse(mine[param]) == "'<none>'":
            return None  # no default: every call passes it
        return self.replace(calls[0], f"super().{fn.name}({', '.join(self.segment(a) for a in calls[0].args[:-1])})")

    def _signature(self, fn: ast.FunctionDef, args: ast.arguments) -> str:
        returns = f" -> {self.segment(fn.returns)}" if fn.returns else ""
        line = f"{' ' * fn.col_offset}def {fn.name}({ast.unparse(args)}){returns}:"
        return self.replace_lines(fn.lineno, fn.body[0].lineno - 1, [line])


_MODULE = nn.Module()  # the attributes torch sets on every module (training, ...) are not the source's


def _pairs(target: Any, value: Any, augmented: bool) -> list[tuple[ast.expr, ast.expr | None]]:
    """(target, the value it gets) of an assignment; None where it is not one expression per target."""
    if isinstance(target, ast.Tuple):
        values = value.elts if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts) else None
        return [(t, None if values is None else values[i]) for i, t in enumerate(target.elts)]
    return [(target, None if augmented else value)] if target is not None else []


def _in_annotation(t: SourceText, node: ast.AST) -> bool:
    """Whether ``node`` sits inside a parameter's or return annotation (``State | None``)."""
    while node in t.parents:
        parent = t.parents[node]
        if isinstance(parent, ast.arg) and parent.annotation is node:
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AnnAssign)) and node in (
            getattr(parent, "returns", None),
            getattr(parent, "annotation", None),
        ):
            return True
        if isinstance(parent, ast.stmt):
            return False
        node = parent
    return False


def _may_call(
    call: ast.Call, fn: ast.FunctionDef, constructors: set[str], owner: str | None, caller: str | None
) -> bool:
    """Whether ``call`` may reach ``fn``: by its name; a class's ``__init__`` by the name of the class or of a
    subclass (``constructors``), or by super().__init__ in a subclass (``caller``: the class the call is in).
    Calls of computed callables (``table[k](...)``) are taken to reach none: the library names what it calls."""
    name = _callee(call)
    if fn.name != "__init__":
        return name == fn.name
    if name == "__init__":
        return caller in constructors and caller != owner
    return name in constructors


def _callee(call: ast.Call) -> str | None:
    """The name a call calls by (``f`` of ``f(..)`` and ``x.f(..)``), None for a computed callable."""
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _only_super_init(fn: ast.FunctionDef) -> bool:
    """``def f(self, a, b=1): super().f(a, b)`` (then ``return self`` or nothing), or ``return super().f(a, b)``:
    the base's method as it is."""
    body = fn.body
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None and fn.name != "__init__":
        body = [ast.Expr(body[0].value)]  # returns what the base's returns
    elif body and isinstance(body[-1], ast.Return) and ast.unparse(body[-1]) == "return self":
        body = body[:-1]
    if len(body) != 1 or not isinstance(body[0], ast.Expr):
        return False
    call = body[0].value
    params = [a.arg for a in fn.args.args[1:]]
    return (
        isinstance(call, ast.Call)
        and ast.unparse(call.func) == f"super().{fn.name}"
        and not fn.args.kwonlyargs
        and not call.keywords
        and [ast.unparse(a) for a in call.args] == params
        and (len(body) == len(fn.body)) == (fn.name == "__init__" or isinstance(fn.body[0], ast.Return))
    )  # __init__ returns None, the others self or the base's value


def _defaults(args: ast.arguments) -> list[tuple[ast.arg, Any]]:
    """(parameter, default or None) after ``self``."""
    given = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    return [(a, d if d is not None else ast.Constant("<none>")) for a, d in zip(args.args, given, strict=True)][1:]


def _module_signature(name: str) -> list[tuple[str, str]] | None:
    import inspect

    fn = getattr(nn.Module, name, None)
    if fn is None:
        return None
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return None
        out.append((p.name, "'<none>'" if p.default is p.empty else repr(p.default)))
    return out


def _class_attrs(cls: ast.ClassDef) -> set[str]:
    return {t.id for s in cls.body for t in _targets(s)}


def _targets(stmt: ast.stmt) -> list[ast.Name]:
    """The names a class-level assignment sets (``a = b``, ``a, b = …``, ``a: T = …``)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    elts = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return [e for e in elts if isinstance(e, ast.Name)]


def _loads(node: ast.AST) -> Iterator[ast.Name]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load))


def _plain(value: ast.expr) -> bool:
    """A value whose computation does nothing besides (names, literals, attribute and item reads)."""
    if isinstance(value, (ast.Constant, ast.Name)):
        return True
    if isinstance(value, (ast.Attribute, ast.Subscript, ast.BinOp, ast.IfExp, ast.Compare, ast.BoolOp, ast.UnaryOp)):
        return all(_plain(c) for c in ast.iter_child_nodes(value) if isinstance(c, ast.expr))
    return isinstance(value, (ast.Dict, ast.List, ast.Tuple)) and not any(ast.iter_child_nodes(value))


def _reads(nodes: list[ast.AST]) -> Iterator[str]:
    """The names and strings that ``nodes`` (a statement's walk) read."""
    for sub in nodes:
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            yield sub.id
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def _defined(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef)):
        return {stmt.name}
    if isinstance(stmt, ast.Assign):
        return {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return {stmt.target.id}
    return set()


def _docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
