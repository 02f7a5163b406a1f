"""Python source of one class per ClassPlan: ``__init__`` builds the children, ``forward`` runs the region."""

from __future__ import annotations

import keyword
from typing import Any

from ....ir.graph import LayerGraph, Op
from .classes import ClassPlan
from .emitters import EMITTERS, Call, embedding_scale_of_width, lit
from .scopes import Scope, Unit, flat_attrs, head_op
from .sizes import Sizes

MAX_INLINE_DEPTH = 2  # nested calls per expression: x = x + self.attn(self.norm1(x)) and no deeper
MAX_INLINE_CHARS = 64
# emitted as operators on their inputs
OPERATOR_KINDS = {"add", "scale", "softcap", "sigmoid_gate", "glu", "pool", "transpose"}


def attr_path(rel: str) -> str:
    """``blocks.0.attn`` → ``blocks[0].attn`` (attribute access from ``self``)."""
    return "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rel.split("."))


class Writer:
    def __init__(
        self,
        graph: LayerGraph,
        plans: dict[Any, ClassPlan],
        root: Scope,
        positions_follow: str | None,
        generates: bool = True,
        sizes: Sizes | None = None,
    ):
        self.graph, self.plans, self.root = graph, plans, root
        self.positions_follow = positions_follow
        self.sizes = sizes  # model.py: constructors read sizes from a Config ``c``
        self.generates = generates  # only generating models need the last-position cut before their head
        self.head = head_op(graph)
        self.by_scope = {id(m): p for p in plans.values() for m in p.members}
        for plan in plans.values():
            self._name_inputs(plan)

    def plan_of(self, scope: Scope) -> ClassPlan:
        return self.by_scope[id(scope)]

    # -- signatures ----------------------------------------------------------------------------------------

    def _name_inputs(self, plan: ClassPlan) -> None:
        rep, names = plan.rep, []
        for v in rep.inputs:
            if v in self.graph.inputs:
                name = v
            elif self._stack_of(v) is not None and self._stack_of(v) != rep.ops[0].stack:
                name = "memory"  # a value from another stack: the encoder's output
            elif "x" not in names:
                name = "x"
            else:
                name = "h"
            while name in names:
                name += "_"
            names.append(name)
        plan.input_names = names
        optional = [self.graph.inputs[v].optional if v in self.graph.inputs else False for v in rep.inputs]
        order = list(range(len(names)))
        if rep is self.root:  # the model's own signature lists the graph inputs as the graph declares them
            declared = list(self.graph.inputs)
            order.sort(key=lambda i: declared.index(rep.inputs[i]) if rep.inputs[i] in declared else -1)
        plan.order = [i for i in order if not optional[i]] + [i for i in order if optional[i]]

    def _stack_of(self, value: str) -> str | None:
        return self.graph.op(value).stack if value in {op.name for op in self.graph.ops()} else None

    def forward_params(self, plan: ClassPlan) -> list[str]:
        out = []
        for i in plan.order:
            v, name = plan.rep.inputs[i], plan.input_names[i]
            optional = v in self.graph.inputs and self.graph.inputs[v].optional
            out.append(f"{name}: Tensor | None = None" if optional else f"{name}: Tensor")
        if plan.rep.needs_state or plan.rep is self.root:
            out.append("state: State | None = None")
        if plan.rep is self.root and "logits" in self.graph.outputs and len(self.graph.outputs) > 1:
            out.append("return_all: bool = False")
        return out

    # -- __init__ ------------------------------------------------------------------------------------------

    def ctor_args(self, owner: ClassPlan, child: Scope) -> str:
        """Keyword arguments for a child class: the owner's parameter where it varies, else the literal."""
        plan = self.plan_of(child)
        values = flat_attrs(child)
        rel = owner.rep.rel(child.path) if child.path.startswith(owner.rep.path) else child.path
        args = ["c"] if self.sizes else []
        for (path, attr), pname in plan.params.items():
            key = (f"{rel}.{path}", attr)
            value = values[(path, attr)]
            sized = self.sizes.expr(attr, value, child.path) if self.sizes else None  # a Config size where one is
            args.append(f"{pname}={owner.params[key] if key in owner.params else sized or lit(value)}")
        return ", ".join(args)

    def sized_call(self, op: Op) -> dict[str, str]:
        """model.py: call attributes that follow the Config (set in ``__init__`` as ``self.<key>_<attr>``)."""
        dim = self.sizes.expr("dim", op.attrs.dim, op.name) if self.sizes and op.kind == "embedding" else None
        return {"scale": f"{dim}**0.5"} if dim and embedding_scale_of_width(op) else {}

    def init_lines(self, plan: ClassPlan) -> list[str]:
        rep, lines, done = plan.rep, [], set()
        for unit in rep.units:
            if unit.op is not None:
                e = EMITTERS[unit.op.kind]
                if e.ctor is None:
                    continue
                rel = unit.key

                def attr(key: str, rel: str = rel, op: Any = unit.op) -> str:
                    value = getattr(op.attrs, key)
                    sized = self.sizes and self.sizes.expr(key, value, op.name)
                    return plan.params.get((rel, key)) or sized or lit(value)

                ctor = e.ctor(unit.op, attr)
                if ctor is not None:
                    lines.append(f"self.{unit.key} = {ctor}")
                lines += [f"self.{unit.key}_{k} = {v}" for k, v in self.sized_call(unit.op).items()]
                continue
            head, _, index = unit.key.partition(".")
            if not index:
                assert unit.scope is not None
                lines.append(f"self.{head} = {self.plan_of(unit.scope).name}({self.ctor_args(plan, unit.scope)})")
            elif head not in done:
                done.add(head)
                members = list(rep.children[head].children.values())
                calls = [f"{self.plan_of(m).name}({self.ctor_args(plan, m)})" for m in members]
                container = rep.children[head].path
                count = (
                    f"c.{self.sizes.blocks[container]}" if self.sizes and container in self.sizes.blocks else len(calls)
                )
                if len(set(calls)) == 1:
                    lines.append(f"self.{head} = nn.ModuleList({calls[0]} for _ in range({count}))")
                else:
                    lines.append(f"self.{head} = nn.ModuleList({layer_pattern(calls)} for i in range({count}))")
        return lines

    # -- forward -------------------------------------------------------------------------------------------

    def forward_lines(self, plan: ClassPlan) -> list[str]:
        return Body(self, plan).lines()


def layer_pattern(calls: list[str]) -> str:
    """One expression of ``i`` giving block i's constructor call: a run of one kind first (DeepSeek's dense
    layers), then a cycle (``layer_pattern`` repeated: GPT-OSS's sliding / full) — so a Config with other
    ``blocks`` gets as many, in the same pattern."""
    best: tuple[int, int, list[str]] = (0, len(calls), calls)
    for run in range(len(calls)):
        if run and calls[run - 1] != calls[0]:
            break
        rest = calls[run:]
        period = next(p for p in range(1, len(rest) + 1) if all(c == rest[k % p] for k, c in enumerate(rest)))
        if period < best[1] and 2 * period <= len(rest):  # a run counts only where a cycle repeats after it
            best = (run, period, rest[:period])
    run, period, cycle = best
    at = "i" if not run else f"(i - {run})"
    default = max(dict.fromkeys(cycle), key=cycle.count)  # the most common; the first of equals
    expr = default
    for call in reversed([c for c in dict.fromkeys(cycle) if c != default]):
        where = [k for k, c in enumerate(cycle) if c == call]
        test = f"{at} % {period} == {where[0]}" if len(where) == 1 else f"{at} % {period} in {tuple(where)}"
        expr = f"{call} if {test} else {expr}"
    return f"{calls[0]} if i < {run} else {expr}" if run else expr


class Body:
    """The statements of one forward: units in order, single-use values inlined, blocks chained in a loop."""

    def __init__(self, w: Writer, plan: ClassPlan):
        self.w, self.plan, self.scope = w, plan, plan.rep
        self.env: dict[str, tuple[str, int]] = {}  # value → (expression, nesting depth; 0 for a variable)
        self.live: dict[str, str] = {}  # variable → the value it holds
        for i, v in enumerate(self.scope.inputs):
            self.env[v] = (plan.input_names[i], 0)
            self.live[plan.input_names[i]] = v
        self.out: list[str] = []
        self.wrapped: set[str] = set()  # values whose expression is a sum in parentheses
        self.fed_by: dict[str, str] = {}  # an inlined value → the first input of the unit that made it
        self.held = dict(zip(plan.input_names, self.scope.inputs, strict=False))  # variable → the value it got last
        self.twins: list[dict[str, str]] = []  # per other scope the class serves: its value of each of rep's
        for member in plan.members[1:]:
            twin = dict(zip(self.scope.inputs, member.inputs, strict=False))
            for mine, theirs in zip(self.scope.units, member.units, strict=False):
                twin.update(zip(mine.outputs, theirs.outputs, strict=False))
            self.twins.append(twin)
        uses: dict[str, list[int]] = {}
        for j, unit in enumerate(self.scope.units):
            for v in unit.inputs:
                uses.setdefault(v, []).append(j)
        for v in self.scope.outputs:
            uses.setdefault(v, []).append(len(self.scope.units))
        self.uses = uses

    def value(self, v: str) -> tuple[str, int]:
        return self.env[v]

    def lines(self) -> list[str]:
        s, units = self.scope, self.scope.units
        own = [u.scope for u in units if u.scope is not None and u.scope.needs_state]
        if s is self.w.root and s.needs_state and not (own and all(map(self._side_by_side, own))):
            follow = self.w.positions_follow
            self.out.append(
                f"state = state or State(positions_from={follow})" if follow else "state = state or State()"
            )
        j = 0
        while j < len(units):
            loop = self._loop(j)
            if loop:
                self._emit_loop(units[j : j + loop])
                j += loop
                continue
            self._emit_unit(j)
            j += 1
        self._emit_return()
        return self.out

    def _loop(self, j: int) -> int:
        """How many units from j form a chain of container members (block i reads block i-1's output)."""
        units = self.scope.units
        head = units[j].key.partition(".")[0]
        if "." not in units[j].key:
            return 0
        n = 1
        while j + n < len(units):
            a, b = units[j + n - 1], units[j + n]
            if b.key.partition(".")[0] != head or len(b.outputs) != 1 or len(a.outputs) != 1:
                break
            if b.inputs[0] != a.outputs[0] or b.inputs[1:] != units[j].inputs[1:]:
                break
            first, other = self.w.plan_of(units[j].scope), self.w.plan_of(b.scope)  # type: ignore[arg-type]
            if other.order != first.order or b.scope.needs_state != units[j].scope.needs_state:  # type: ignore[union-attr]
                break  # blocks of other kinds loop together where each is called the same way
            n += 1
        container = self.scope.children[head]
        whole = n == len(container.children) and units[j].key == f"{head}.{next(iter(container.children))}"
        return n if whole and self.uses.get(units[j].inputs[0], []) == [j] else 0

    def _call_args(self, unit: Unit) -> list[str]:
        assert unit.scope is not None
        child = self.w.plan_of(unit.scope)
        return [self.value(unit.inputs[i])[0] for i in child.order]

    def _emit_loop(self, members: list[Unit]) -> None:
        head = members[0].key.partition(".")[0]
        var = self._materialise(members[0].inputs[0])
        args = self._call_args(members[0])
        args[0] = var
        if members[0].scope.needs_state:  # type: ignore[union-attr]
            args.append("state")
        item = head[:-1] if head.endswith("s") else "layer"
        self.out += [f"for {item} in self.{head}:", f"    {var} = {item}({', '.join(args)})"]
        self.env[members[-1].outputs[0]] = (var, 0)
        self.live[var] = self.held[var] = members[-1].outputs[0]

    def _materialise(self, v: str) -> str:
        expr, depth = self.value(v)
        if depth == 0 and expr.isidentifier():
            return expr
        name = self._fresh("x")
        self.out.append(f"{name} = {expr}")
        self.env[v] = (name, 0)
        self.live[name] = self.held[name] = v
        return name

    def _expression(self, j: int) -> tuple[str, int]:
        unit = self.scope.units[j]
        static = unit.key in self.scope.static
        if unit.op is not None:
            op, e = unit.op, EMITTERS[unit.op.kind]
            vals = [self.value(v) for v in op.inputs]
            if op.kind not in OPERATOR_KINDS:  # call arguments: a sum needs no parentheses of its own
                vals = [(self._bare(v, text), d) for v, (text, d) in zip(op.inputs, vals, strict=True)]
            if op.name == self.w.head and self.w.generates:  # named first: model.py writes x[:, -1:] in place
                vals[0] = (f"last_positions({self._materialise(op.inputs[0])}, state)", 1)
            if op.kind == "linear" and self._feeds_jittered_router(op.name):
                vals[0] = (f"self.{self._router_owner(op.name)}.route({vals[0][0]})", vals[0][1] + 1)
            sized = {k: f"self.{unit.key}_{k}" for k in self.w.sized_call(op)}
            expr = e.call(op, Call(f"self.{unit.key}", [v for v, _ in vals], sized=sized))
            if static:
                return f"reuse(state, self.{unit.key}, lambda: {expr})", 2
            return expr, e.depth + max((d for _, d in vals), default=0)
        assert unit.scope is not None
        order = self.w.plan_of(unit.scope).order
        args = [
            (self._bare(unit.inputs[i], self.value(unit.inputs[i])[0]), self.value(unit.inputs[i])[1]) for i in order
        ]
        module = f"self{attr_path(unit.key)}"
        if static:  # the encoder runs once per generated sequence, on a State of its own (offset 0, no cache)
            texts = [a for a, _ in args] + (["State()"] if unit.scope.needs_state else [])
            return f"reuse(state, {module}, lambda: {module}({', '.join(texts)}))", 2
        state = "State()" if self._side_by_side(unit.scope) else "state"
        texts = [a for a, _ in args] + ([state] if unit.scope.needs_state else [])
        return f"{module}({', '.join(texts)})", 1 + max((d for _, d in args), default=0)

    def _side_by_side(self, scope: Scope) -> bool:
        """A stack of a model that runs stacks side by side (a dual encoder's towers, which generates nothing):
        its positions and masks are its own, so it runs on a State of its own."""
        stacks = {op.stack for op in scope.ops}
        return (
            not self.w.generates
            and len(stacks) == 1
            and None not in stacks
            and len({op.stack for op in self.w.root.ops} - {None}) > 1
        )

    def _bare(self, v: str, text: str) -> str:
        """An inlined sum without the parentheses it carries for use as an operand."""
        return text[1:-1] if v in self.wrapped and text.startswith("(") and text.endswith(")") else text

    def _feeds_jittered_router(self, name: str) -> bool:
        return any(
            u.op is not None and u.op.kind == "moe" and u.op.inputs[1] == name and u.op.attrs.jitter
            for u in self.scope.units
        )

    def _router_owner(self, name: str) -> str:
        return next(
            u.key for u in self.scope.units if u.op is not None and u.op.kind == "moe" and u.op.inputs[1] == name
        )

    def _emit_unit(self, j: int) -> None:
        unit, units = self.scope.units[j], self.scope.units
        expr, depth = self._expression(j)
        for v in unit.inputs:
            self._release(v, j)
        if len(unit.outputs) == 1:
            v = unit.outputs[0]
            uses = self.uses.get(v, [])
            nxt = j + 1
            next_depth = self._own_depth(nxt) if nxt < len(units) else 0
            into_return = nxt == len(units)
            inline = (
                len(uses) == 1
                and uses[0] == nxt
                and unit.key not in self.scope.static
                and (into_return or depth + next_depth <= MAX_INLINE_DEPTH)
                and (into_return or len(expr) <= MAX_INLINE_CHARS)
                and not (
                    self.scope is self.w.root and list(self.w.graph.outputs) != ["logits"] and v in self.scope.outputs
                )
                and (nxt == len(units) or not self._loop(nxt))
            )
            if inline:
                if unit.inputs:
                    self.fed_by[v] = unit.inputs[0]
                wrap = unit.op is not None and unit.op.kind == "add"
                self.env[v] = (f"({expr})" if wrap else expr, depth)
                if wrap:
                    self.wrapped.add(v)
                return
            name = self._name_for(unit, j)
            self.out.append(self._shaped(f"{name} = {expr}", unit, self.held.get(name)))
            self.env[v] = (name, 0)
            self.live[name] = self.held[name] = v
            return
        names = [self._fresh(self.scope.rel(v).split(".")[-1]) for v in unit.outputs]
        self.out.append(f"{', '.join(names)} = {expr}")
        for v, n in zip(unit.outputs, names, strict=True):
            self.env[v] = (n, 0)
            self.live[n] = self.held[n] = v

    def _shaped(self, line: str, unit: Unit, before: str | None = None) -> str:
        """The statement with its output's symbolic shape as a comment where it is not that of what the
        statement reads: its unit's first input, the variable a chain of units inlined into it starts from, or
        what the name it assigns held ``before``: ``x = self.act(self.fc1(x))`` says x is now (B, N, hidden)."""
        sizes, graph = self.w.sizes, self.w.graph
        if sizes is None or not unit.inputs or unit.inputs[0].startswith("param:"):
            return line
        first, root = unit.inputs[0], unit.inputs[0]
        while root in self.fed_by and not self.fed_by[root].startswith("param:"):
            root = self.fed_by[root]
        try:
            after = tuple(graph.shape_of(unit.outputs[0]))
            read = {tuple(graph.shape_of(v)) for v in (first, root, before) if v is not None}
            every = [tuple(graph.shape_of(t.get(unit.outputs[0], unit.outputs[0]))) for t in self.twins]
        except KeyError:
            return line
        if read == {after} or any(len(e) != len(after) for e in every):
            return line
        written = []  # a dim the scopes the class serves differ in: each of theirs (N | N_dec: encoder, decoder),
        for i in range(len(after)):  # sizes as numbers then (a Config expression would name one scope's sizes)
            options = list(dict.fromkeys(x[i] for x in [after, *every]))
            written.append(self._dim(options[0]) if len(options) == 1 else " | ".join(map(str, options)))
        comment = "  # (" + ", ".join(written) + ")"
        return line + comment if len(line) + len(comment) <= 100 else line

    def _dim(self, d: Any) -> str:
        """A shape entry as the comment writes it: a symbol, the Config expression of a size, or the number."""
        sized = None if isinstance(d, str) else self.w.sizes.expr("in_features", d, self.scope.path)  # type: ignore[union-attr]
        text = d if isinstance(d, str) else (sized or str(d))
        return text.replace("c.", "").replace(" * ", "·")

    def _own_depth(self, j: int) -> int:
        unit = self.scope.units[j]
        if unit.key in self.scope.static:
            return 99
        return EMITTERS[unit.op.kind].depth if unit.op is not None else 1

    def _release(self, v: str, j: int) -> None:
        """Forget the variable holding v once its last use is statement j."""
        if self.uses.get(v, [])[-1:] == [j]:
            for name, held in list(self.live.items()):
                if held == v:
                    del self.live[name]

    def _name_for(self, unit: Unit, j: int) -> str:
        v = unit.outputs[0]
        outputs = {op: name for name, op in self.w.graph.outputs.items()}
        if self.scope is self.w.root and v in outputs:
            return outputs[v]
        if unit.key in self.scope.static:
            return self._fresh("memory" if unit.key == "encoder" else unit.key.split(".")[-1])
        first = self.env.get(unit.inputs[0], ("", 1)) if unit.inputs else ("", 1)
        if first[1] == 0 and first[0] in ("x", "h") and first[0] not in self.live:
            return first[0]  # x = self.f(x): the input dies here
        if "x" not in self.live:
            return "x"
        return self._fresh(unit.key.split(".")[-1])

    def _fresh(self, base: str) -> str:
        base = base if base.isidentifier() and not keyword.iskeyword(base) else f"v_{base}"
        name, k = base, 2
        while name in self.live or name in self.plan.input_names or name in ("self", "state"):
            name, k = f"{base}{k}", k + 1
        return name

    def _emit_return(self) -> None:
        s = self.scope
        exprs = [self.value(v)[0] for v in s.outputs]
        made = s.outputs[0] if s.outputs else None  # returned as it is made (inlined): what its unit read
        read = self.fed_by.get(made) if made is not None and self.value(made)[1] else None
        first = Unit("", inputs=[read] if read else [], outputs=s.outputs[:1])
        if s is not self.w.root:
            line = f"return {', '.join(exprs)}"
            self.out.append(self._shaped(line, first) if len(s.outputs) == 1 else line)
            return
        by_value = dict(zip(s.outputs, exprs, strict=True))
        items = ", ".join(f'"{name}": {by_value[op]}' for name, op in self.w.graph.outputs.items())
        if list(self.w.graph.outputs) == ["logits"]:
            self.out.append(self._shaped(f"return {exprs[0]}", first))
        elif "logits" in self.w.graph.outputs:
            self.out += [
                "if return_all:",
                f"    return {{{items}}}",
                f"return {by_value[self.w.graph.outputs['logits']]}",
            ]
        else:
            self.out.append(f"return {{{items}}}")
