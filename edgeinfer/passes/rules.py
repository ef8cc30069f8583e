"""Rewrite rules: a pattern (``match``), a ``check`` that gives the reason not to fire, and a
``rewrite`` that builds replacement nodes.

``match(view, root) -> Match | None`` walks producers back from a candidate root node and
captures what the rewrite needs; ``check(view, match) -> str | None`` returns why the match
must not be rewritten (None: fire); ``rewrite(view, match) -> Rewrite`` returns new nodes
(plus new initializers and the types of new intermediate values) that produce the root's
outputs under the same names. Rewrites never mutate nodes or attributes.

The driver (``apply_rules``) adds one check every rule needs: a node the rewrite removes
(other than the root) must have no consumer outside the pattern and must not produce a
graph output, otherwise fusing would compute it twice or lose it. It applies every
non-overlapping match per sweep and sweeps until nothing fires, with a bound.
``explain`` lists the matches that were refused and why (tests of "must not fire").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeinfer.errors import PassError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.names import fresh_name
from edgeinfer.ir.weights import stored_weight_dtype, with_stored_weights
from edgeinfer.passes.manager import PassResult, graph_pass

MAX_SWEEPS = 64


class GraphView:
    """What rules read: producers, consumers, constants, types; fresh names for new values."""

    def __init__(self, graph: Graph, level: int = 2):
        self.graph = graph
        self.level = level
        self._outputs = set(graph.output_names)
        self._taken = set(graph.values) | {n.name for n in graph.nodes if n.name}

    # -- structure ---------------------------------------------------------------------------
    def producer(self, name: str, op_type: str | tuple[str, ...] | None = None,
                 domain: str = "") -> Node | None:
        """The node producing ``name`` (if it is of ``op_type`` in ``domain`` when given)."""
        if not name:
            return None
        node = self.graph.producer(name)
        if node is None or op_type is None:
            return node
        types = (op_type,) if isinstance(op_type, str) else op_type
        return node if node.op_type in types and node.domain == domain else None

    def consumers(self, name: str) -> list[Node]:
        return self.graph.consumers(name)

    def is_output(self, name: str) -> bool:
        return name in self._outputs

    def single_use(self, name: str) -> bool:
        """Read by exactly one node input and not a graph output."""
        value = self.graph.values.get(name)
        return value is not None and len(value.uses) == 1 and name not in self._outputs

    def opset(self, domain: str = "") -> int:
        return self.graph.opset.get(domain, 1)

    # -- values ------------------------------------------------------------------------------
    def value(self, name: str) -> Value | None:
        return self.graph.values.get(name) if name else None

    def shape(self, name: str) -> tuple | None:
        value = self.value(name)
        return None if value is None else value.shape

    def dtype(self, name: str) -> str | None:
        value = self.value(name)
        return None if value is None else value.dtype

    def const(self, name: str) -> np.ndarray | None:
        """The data of an initializer or ``Constant`` node output (None for anything computed
        at run time)."""
        value = self.value(name)
        if value is None or name in self.graph.input_names:
            return None
        if value.const is None and value.producer is not None and value.producer.op_type == "Constant" \
                and not value.producer.domain and isinstance(value.producer.attrs.get("value"), np.ndarray):
            return value.producer.attrs["value"]
        return value.const

    def scalar(self, name: str) -> float | None:
        """The value of a one-element float/int constant, else None."""
        data = self.const(name)
        if data is None or data.size != 1 or data.dtype.kind not in "fiu":
            return None
        return float(data.reshape(-1)[0])

    def fresh(self, base: str) -> str:
        """A value or node name not used anywhere in the graph (nor handed out before)."""
        return fresh_name(base, self._taken)


def input_at(node: Node, index: int) -> str:
    """The name of input ``index`` ("" when omitted)."""
    return node.inputs[index] if index < len(node.inputs) else ""


def other_input(node: Node, name: str) -> str:
    """For a binary node, the input that is not ``name``."""
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


@dataclass
class Match:
    nodes: tuple[Node, ...]  # replaced by the rewrite; the last one is the root
    captures: dict[str, Any] = field(default_factory=dict)
    anchors: tuple[Node, ...] = ()  # inspected but kept; no other rewrite may touch them in a sweep

    @property
    def root(self) -> Node:
        return self.nodes[-1]

    def __getitem__(self, key: str) -> Any:
        return self.captures[key]


@dataclass
class Rewrite:
    nodes: list[Node]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: list[Value] = field(default_factory=list)  # types of new intermediate values
    # new initializer -> the initializer it re-lays out (a transpose or reshape of its values): it is
    # stored as that one is (a float16-stored weight stays float16 in the .eim and a TFLite export)
    stored_like: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rule:
    name: str
    root: tuple[str, ...]
    match: Callable[[GraphView, Node], Match | None]
    rewrite: Callable[[GraphView, Match], Rewrite]
    check: Callable[[GraphView, Match], str | None] | None = None
    domain: str = ""


def _outside_use(view: GraphView, match: Match) -> str | None:
    members = {id(n) for n in match.nodes}
    for node in match.nodes[:-1]:
        for out in node.outputs:
            if not out:
                continue
            if view.is_output(out):
                return f"{node.label} output {out!r} is a graph output, so it cannot be fused away"
            outside = [c for c in view.consumers(out) if id(c) not in members]
            if outside:
                return (f"{node.label} output {out!r} has another consumer outside the pattern "
                        f"({outside[0].label}); fusing would compute it twice")
    return None


def _candidates(view: GraphView, rules: Sequence[Rule]):
    by_root: dict[tuple[str, str], list[Rule]] = {}
    for rule in rules:
        for op in rule.root:
            by_root.setdefault((rule.domain, op), []).append(rule)
    for node in view.graph.nodes:
        for rule in by_root.get((node.domain, node.op_type), ()):
            match = rule.match(view, node)
            if match is None:
                continue
            if match.root is not node:
                raise PassError(f"rule {rule.name!r}: match must end with its root {node.label}")
            reason = _outside_use(view, match) or (rule.check(view, match) if rule.check else None)
            yield rule, match, reason


def explain(graph: Graph, rules: Sequence[Rule], level: int = 2) -> list[tuple[str, str, str]]:
    """(rule name, root node label, reason) for every match that its checks refused."""
    view = GraphView(graph, level)
    return [(rule.name, match.root.label, reason)
            for rule, match, reason in _candidates(view, rules) if reason is not None]


def _sweep(graph: Graph, rules: Sequence[Rule], level: int, fired: dict[str, int]) -> Graph | None:
    view = GraphView(graph, level)
    claimed: set[int] = set()
    replaced: dict[int, Rewrite] = {}
    removed: set[int] = set()
    for rule, match, reason in _candidates(view, rules):
        if reason is not None:
            continue
        touched = {id(n) for n in match.nodes + match.anchors}
        if touched & claimed:
            continue  # overlaps a rewrite of this sweep; the next sweep sees the new graph
        rewrite = rule.rewrite(view, match)
        produced = {o for n in rewrite.nodes for o in n.outputs if o}
        lost = [o for o in match.root.outputs if o and o not in produced
                and (view.consumers(o) or view.is_output(o))]
        if lost:
            raise PassError(f"rule {rule.name!r} at {match.root.label}: the rewrite does not produce "
                            f"{lost}; expected every used output of the root")
        claimed |= touched
        removed |= {id(n) for n in match.nodes}
        replaced[id(match.root)] = rewrite
        fired[rule.name] = fired.get(rule.name, 0) + 1
    if not replaced:
        return None
    nodes: list[Node] = []
    inits = graph.initializers
    infos = graph.value_info()
    narrow: dict[str, list[str]] = {}
    for node in graph.nodes:
        rewrite = replaced.get(id(node))
        if rewrite is not None:
            nodes.extend(rewrite.nodes)
            inits.update(rewrite.initializers)
            infos.extend(rewrite.values)
            for new, old in rewrite.stored_like.items():
                kind = stored_weight_dtype(graph, old)
                if kind is not None:
                    narrow.setdefault(kind, []).append(new)
        elif id(node) not in removed:
            nodes.append(node)
    result = rebuild(graph, nodes, inits, infos)
    for kind, names in narrow.items():
        result.metadata = with_stored_weights(result.metadata, names, kind)
    return result


def rebuild(graph: Graph, nodes: Iterable[Node], initializers: Mapping[str, np.ndarray],
            value_info: Iterable[Value] | None = None) -> Graph:
    """A graph like ``graph`` with new nodes/initializers, topologically sorted, types kept."""
    nodes = list(nodes)
    produced = {o for node in nodes for o in node.outputs if o}
    infos = [v for v in (graph.value_info() if value_info is None else value_info) if v.name in produced]
    new = Graph(nodes, list(graph.inputs), list(graph.outputs), initializers,
                value_info=infos, opset=graph.opset, name=graph.name, metadata=graph.metadata)
    return new.sorted()


def apply_rules(graph: Graph, rules: Sequence[Rule], level: int = 2) -> PassResult:
    """Rewrite with ``rules`` until none fires (at most ``MAX_SWEEPS`` sweeps)."""
    fired: dict[str, int] = {}
    modified = False
    for _ in range(MAX_SWEEPS):
        new = _sweep(graph, rules, level, fired)
        if new is None:
            break
        graph, modified = new, True
    return PassResult(graph, modified, fired)


def rule_pass(name: str, level: int, rules: Sequence[Rule]) -> Callable[..., PassResult]:
    """Register a pipeline pass that applies ``rules``."""

    def run(graph: Graph, level: int = level) -> PassResult:
        return apply_rules(graph, rules, level)

    run.__name__ = name
    run.rules = tuple(rules)  # type: ignore[attr-defined]
    return graph_pass(name, level)(run)


# -- shared helpers -------------------------------------------------------------------------
def substitute(nodes: Iterable[Node], mapping: Mapping[str, str]) -> list[Node]:
    """``nodes`` with every read of a name in ``mapping`` redirected (subgraphs included)."""
    out = []
    for node in nodes:
        inputs = tuple(mapping.get(i, i) if i else i for i in node.inputs)
        attrs = node.attrs
        if node.subgraphs():
            attrs = {k: _substitute_attr(v, mapping) for k, v in node.attrs.items()}
        if inputs != node.inputs or attrs is not node.attrs:
            node = node.with_(inputs=inputs, attrs=attrs)
        out.append(node)
    return out


def _substitute_attr(value: Any, mapping: Mapping[str, str]) -> Any:
    if isinstance(value, Graph):
        return _substitute_outer(value, mapping)
    if isinstance(value, tuple) and value and isinstance(value[0], Graph):
        return tuple(_substitute_outer(g, mapping) for g in value)
    return value


def _substitute_outer(sub: Graph, mapping: Mapping[str, str]) -> Graph:
    outer = {k: v for k, v in mapping.items() if k in sub.outer_names()}
    if not outer:
        return sub
    outputs = [Value(outer.get(v.name, v.name), v.dtype, v.shape) for v in sub.outputs]
    return Graph(substitute(sub.nodes, outer), list(sub.inputs), outputs, sub.initializers,
                 value_info=sub.value_info(), opset=sub.opset, name=sub.name, metadata=sub.metadata)


def broadcast_shape(*shapes: Sequence) -> tuple | None:
    """Numpy broadcast of static shapes (None if any is unknown or they do not broadcast)."""
    if any(s is None or not all(isinstance(d, (int, np.integer)) for d in s) for s in shapes):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        return None


def same_dims(a: tuple | None, b: tuple | None) -> bool:
    """Two shapes known to be equal (same ints or same symbols at every axis)."""
    return (a is not None and b is not None and len(a) == len(b)
            and all(x is not None and x == y for x, y in zip(a, b, strict=True)))


def attr_or_input(view: GraphView, node: Node, attr: str, index: int) -> np.ndarray | None:
    """An operand that older opsets give as an attribute and newer ones as a constant input
    (ReduceMean axes, Pad pads, Clip min/max...). None when neither is given; raises
    ``LookupError`` when it is an input computed at run time."""
    if attr in node.attrs:
        return np.asarray(node.attrs[attr])
    name = input_at(node, index)
    if not name:
        return None
    data = view.const(name)
    if data is None:
        raise LookupError(name)
    return data
