"""GELU fusion, erf and tanh forms.

    erf form:   y = 0.5 * x * (1 + erf(x / sqrt(2)))                   (x / sqrt(2) may be x * 0.7071..)
    tanh form:  y = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))

The outer product is matched as a set of factors through any nesting of ``Mul`` (exporters
write ``(x * 0.5) * t``, ``x * (t * 0.5)``, ``(x * t) * 0.5``...), ``x^3`` as ``Pow(x, 3)`` or
``x * x * x``, and constants within a relative 1e-4 of the exact ones (exporters round
them). The result is ONNX ``Gelu`` (``approximate="none"|"tanh"``) when the graph's opset is
20 or newer, else ``edgeinfer::Gelu`` (same semantics) at optimization level 2.
"""

from __future__ import annotations

import math

from edgeinfer.ir import EDGEINFER_DOMAIN, Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, other_input, rule_pass

STANDARD_SINCE = 20
MAX_DEPTH = 4


def _near(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= 1e-4 * abs(want)


def _factors(view: GraphView, name: str, nodes: list[Node], depth: int = 0) -> list[str]:
    """Leaves of the product tree of single-use ``Mul`` nodes ending in ``name``."""
    node = view.producer(name, "Mul")
    if node is None or depth > MAX_DEPTH or (depth and not view.single_use(name)):
        return [name]
    nodes.append(node)
    return [leaf for i in node.inputs for leaf in _factors(view, i, nodes, depth + 1)]


def _const_operand(view: GraphView, node: Node, want: float) -> str | None:
    """The non-constant operand of a binary node whose other operand is ``want``."""
    for name in node.inputs:
        if _near(view.scalar(other_input(node, name)), want) and view.const(name) is None:
            return name
    return None


def _erf_argument(view: GraphView, gate: Node, nodes: list[Node]) -> str | None:
    inner = view.producer(gate.inputs[0], ("Div", "Mul"))
    if inner is None:
        return None
    if inner.op_type == "Div":
        x = inner.inputs[0] if _near(view.scalar(inner.inputs[1]), math.sqrt(2)) else None
    else:
        x = _const_operand(view, inner, 1 / math.sqrt(2))
    if x is not None:
        nodes.append(inner)
    return x


def _tanh_argument(view: GraphView, gate: Node, nodes: list[Node]) -> str | None:
    scaled = view.producer(gate.inputs[0], "Mul")
    poly_name = _const_operand(view, scaled, math.sqrt(2 / math.pi)) if scaled is not None else None
    poly = view.producer(poly_name, "Add")
    if poly is None:
        return None
    for x in poly.inputs:
        cubic = view.producer(other_input(poly, x), "Mul")
        cube_name = _const_operand(view, cubic, 0.044715) if cubic is not None else None
        if cube_name is None:
            continue
        cube_nodes: list[Node] = []
        pow_node = view.producer(cube_name, "Pow")
        if pow_node is not None and pow_node.inputs[0] == x and _near(view.scalar(pow_node.inputs[1]), 3.0):
            cube_nodes = [pow_node]
        else:
            leaves = _factors(view, cube_name, cube_nodes)
            if leaves != [x, x, x]:
                continue
        nodes.extend([scaled, poly, cubic, *cube_nodes])
        return x
    return None


def _match(view: GraphView, node: Node) -> Match | None:
    tree: list[Node] = []
    leaves = _factors(view, node.outputs[0], tree)
    if len(leaves) != 3:
        return None
    half = [leaf for leaf in leaves if _near(view.scalar(leaf), 0.5)]
    for plus_one_name in leaves:
        plus_one = view.producer(plus_one_name, "Add")
        if plus_one is None or not half or not view.single_use(plus_one_name):
            continue
        gate_name = _const_operand(view, plus_one, 1.0)
        gate = view.producer(gate_name, ("Erf", "Tanh"))
        if gate is None:
            continue
        inner: list[Node] = []
        x = (_erf_argument if gate.op_type == "Erf" else _tanh_argument)(view, gate, inner)
        if x is None or sorted(leaves) != sorted([x, half[0], plus_one_name]):
            continue
        nodes = [*inner, gate, plus_one, *reversed(tree)]
        return Match(tuple(nodes), {"x": x, "approximate": "none" if gate.op_type == "Erf" else "tanh"})
    return None


def _check(view: GraphView, match: Match) -> str | None:
    if view.dtype(match["x"]) not in ("float32", "float64", "float16", "bfloat16"):
        return "the input is not a float tensor"
    if view.opset("") < STANDARD_SINCE and view.level < 2:
        return f"opset {view.opset('')} has no Gelu; the edgeinfer op needs level 2"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    root = match.root
    domain = "" if view.opset("") >= STANDARD_SINCE else EDGEINFER_DOMAIN
    node = Node("Gelu", [match["x"]], root.outputs, {"approximate": match["approximate"]}, domain=domain,
                name=root.name)
    return Rewrite([node])


RULES = (Rule("gelu", ("Mul",), _match, _rewrite, _check),)
fuse_gelu = rule_pass("fuse_gelu", 1, RULES)
