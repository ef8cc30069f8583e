"""Fold constant per-channel scales and shifts into the weights of the op before them.

For ``y = Conv(x, W, b)`` and a constant ``c`` that varies only along the channel axis
(shape ``[M, 1, ..]`` after aligning to ``y``'s rank, or a scalar)::

    y * c  ->  Conv(x, W * c[m], b * c[m])        y / c  ->  y * (1 / c)
    y + c  ->  Conv(x, W, b + c[m])               y - c  ->  y + (-c)

For ``y = MatMul(x, W)`` with constant 2-D ``W`` and ``c`` varying only along the last
axis: ``y * c -> MatMul(x, W * c)``; for ``Gemm`` (``alpha * A B' + beta * C``)
``y * c`` scales ``B``'s output columns and a constant ``C``, ``y + c`` sets
``C' = C + c / beta``. Chains of constant ``Mul``/``Add`` merge: ``(x * a) * b -> x * (a * b)``,
``(x + a) + b -> x + (a + b)`` (broadcasting is associative, so the result shape is the same).
Folding needs the op's output read by the ``Mul``/``Add`` alone (generic rule check).
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import Node
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, input_at, rule_pass

ELEMENTWISE = ("Mul", "Div", "Add", "Sub")


def _operand(view: GraphView, node: Node, producer_types: tuple[str, ...]) -> tuple[Node, np.ndarray] | None:
    """(producer, constant) when ``node`` combines a ``producer_types`` output with a constant."""
    for index in (0, 1):
        producer = view.producer(node.inputs[index], producer_types)
        const = view.const(node.inputs[1 - index])
        if producer is not None and const is not None and const.dtype.kind == "f":
            if node.op_type in ("Div", "Sub") and index != 0:
                return None  # c / y and c - y are not scale-shifts of y
            return producer, const
    return None


def _normalized(node: Node, const: np.ndarray) -> tuple[str, np.ndarray]:
    """("Mul" | "Add", constant) equivalent of a Mul/Div/Add/Sub by a constant."""
    c = const.astype(np.float64)
    if node.op_type == "Div":
        return "Mul", 1.0 / c
    if node.op_type == "Sub":
        return "Add", -c
    return node.op_type, c


def _along_axis(const: np.ndarray, rank: int, axis: int, size: int) -> np.ndarray | None:
    """``const`` as a vector of ``size`` along ``axis`` of a rank-``rank`` tensor, if it is one."""
    if const.ndim > rank:
        return None
    shape = (1,) * (rank - const.ndim) + const.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis) or shape[axis] not in (1, size):
        return None
    return np.broadcast_to(const.reshape(-1), (size,)) if const.size == 1 else const.reshape(-1)


# -- Conv --------------------------------------------------------------------------------
def _match_conv(view: GraphView, node: Node) -> Match | None:
    found = _operand(view, node, ("Conv",))
    if found is None:
        return None
    conv, const = found
    return Match((conv, node), {"op": conv, "const": const})


def _check_conv(view: GraphView, match: Match) -> str | None:
    conv = match["op"]
    weight = view.const(conv.inputs[1])
    if weight is None or (input_at(conv, 2) and view.const(conv.inputs[2]) is None):
        return "the Conv weights or bias are computed at run time"
    if _along_axis(match["const"], weight.ndim, 1, weight.shape[0]) is None:
        return f"the constant of shape {match['const'].shape} does not vary along the channel axis only"
    return None


def _rewrite_conv(view: GraphView, match: Match) -> Rewrite:
    conv, node = match["op"], match.root
    weight = view.const(conv.inputs[1])
    kind, c = _normalized(node, match["const"])
    vector = _along_axis(c, weight.ndim, 1, weight.shape[0])
    bias = view.const(input_at(conv, 2))
    bias = np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64).reshape(-1)
    inits = {}
    w_name = conv.inputs[1]
    if kind == "Mul":
        w_name = view.fresh(f"{conv.inputs[1]}__scaled")
        inits[w_name] = (weight * vector.reshape((-1,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
        bias = bias * vector
    else:
        bias = bias + vector
    b_name = view.fresh(f"{node.outputs[0]}__bias")
    inits[b_name] = bias.astype(weight.dtype)
    new = Node("Conv", [conv.inputs[0], w_name, b_name], node.outputs, conv.attrs, name=conv.name)
    return Rewrite([new], inits)


# -- MatMul / Gemm ---------------------------------------------------------------------------
def _match_dense(view: GraphView, node: Node) -> Match | None:
    found = _operand(view, node, ("MatMul", "Gemm"))
    if found is None:
        return None
    op, const = found
    return Match((op, node), {"op": op, "const": const})


def _columns(view: GraphView, op: Node) -> int | None:
    weight = view.const(op.inputs[1])
    if weight is None or weight.ndim != 2:
        return None
    return weight.shape[0] if op.op_type == "Gemm" and op.attrs.get("transB", 0) else weight.shape[1]


def _check_dense(view: GraphView, match: Match) -> str | None:
    op, node = match["op"], match.root
    columns = _columns(view, op)
    if columns is None:
        return f"the {op.op_type} weights are not a constant matrix"
    out_shape = view.shape(op.outputs[0])
    if out_shape is None:
        return f"the rank of the {op.op_type} output is unknown"
    if _along_axis(match["const"], len(out_shape), len(out_shape) - 1, columns) is None:
        return f"the constant of shape {match['const'].shape} does not vary along the last axis only"
    kind, _ = _normalized(node, match["const"])
    if op.op_type == "MatMul" and kind == "Add":
        return "a MatMul bias is the job of matmul_add_to_gemm / fuse_bias_activation"
    if op.op_type == "Gemm":
        c_name = input_at(op, 2)
        if c_name and view.const(c_name) is None:
            return "the Gemm's C is computed at run time"
        if kind == "Add" and c_name and float(op.attrs.get("beta", 1.0)) == 0.0:
            return "the Gemm has beta = 0"
    return None


def _rewrite_dense(view: GraphView, match: Match) -> Rewrite:
    op, node = match["op"], match.root
    weight = view.const(op.inputs[1])
    kind, c = _normalized(node, match["const"])
    columns = _columns(view, op)
    vector = _along_axis(c, len(view.shape(op.outputs[0])), len(view.shape(op.outputs[0])) - 1, columns)
    inputs = list(op.inputs)
    attrs = dict(op.attrs)
    inits = {}
    if kind == "Mul":
        transposed = op.op_type == "Gemm" and op.attrs.get("transB", 0)
        scaled = weight * (vector.reshape(-1, 1) if transposed else vector.reshape(1, -1))
        inputs[1] = view.fresh(f"{op.inputs[1]}__scaled")
        inits[inputs[1]] = scaled.astype(weight.dtype)
    c_name = input_at(op, 2)
    if op.op_type == "Gemm" and (c_name or kind == "Add"):
        old = view.const(c_name).astype(np.float64) if c_name else np.zeros(columns)
        beta = float(op.attrs.get("beta", 1.0)) if c_name else 1.0
        new = old * vector if kind == "Mul" else old + vector / beta
        attrs["beta"] = beta
        name = view.fresh(f"{node.outputs[0]}__c")
        inits[name] = new.astype(weight.dtype)
        inputs = inputs[:2] + [name]
    return Rewrite([Node(op.op_type, inputs, node.outputs, attrs, name=op.name)], inits)


# -- constant chains -------------------------------------------------------------------------
def _match_chain(view: GraphView, node: Node) -> Match | None:
    for index in (0, 1):
        inner = view.producer(node.inputs[index], node.op_type)
        outer_const = view.const(node.inputs[1 - index])
        if inner is None or outer_const is None:
            continue
        for inner_index in (0, 1):
            inner_const = view.const(inner.inputs[1 - inner_index])
            if inner_const is not None and view.const(inner.inputs[inner_index]) is None:
                return Match((inner, node), {"x": inner.inputs[inner_index], "a": inner_const, "b": outer_const})
    return None


def _check_chain(view: GraphView, match: Match) -> str | None:
    if match["a"].dtype != match["b"].dtype:
        return "the two constants have different dtypes"
    return None


def _rewrite_chain(view: GraphView, match: Match) -> Rewrite:
    node = match.root
    a, b = match["a"], match["b"]
    merged = (a * b if node.op_type == "Mul" else a + b).astype(a.dtype)
    name = view.fresh(f"{node.outputs[0]}__merged")
    return Rewrite([Node(node.op_type, [match["x"], name], node.outputs, node.attrs, name=node.name)], {name: merged})


RULES = (
    Rule("scale_shift_into_conv", ELEMENTWISE, _match_conv, _rewrite_conv, _check_conv),
    Rule("scale_shift_into_dense", ELEMENTWISE, _match_dense, _rewrite_dense, _check_dense),
    Rule("merge_constant_chain", ("Mul", "Add"), _match_chain, _rewrite_chain, _check_chain),
)
fold_scale_shift = rule_pass("fold_scale_shift", 1, RULES)
