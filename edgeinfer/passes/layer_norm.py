"""LayerNormalization fusion from its primitive pattern.

Exporters that predate ONNX's ``LayerNormalization`` (opset 17) write it out as::

    mean = ReduceMean(x, axes)          d = x - mean
    var  = ReduceMean(d * d, axes)      (or Pow(d, 2))
    y    = d / Sqrt(var + eps)

over the trailing ``axes``; that is ``LayerNormalization(x, Scale=1, axis=-k, epsilon=eps)``.
A following ``* gamma`` and ``+ beta`` (constants over the normalized axes) are absorbed:
``Scale' = Scale * gamma``, ``B' = B * gamma`` and ``B' = B + beta``. The result is ONNX's
op when the graph's opset is 17 or newer, else ``edgeinfer::LayerNormalization`` (same
semantics) at optimization level 2.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import EDGEINFER_DOMAIN, Node
from edgeinfer.passes.rules import (
    GraphView,
    Match,
    Rewrite,
    Rule,
    attr_or_input,
    input_at,
    other_input,
    rule_pass,
)

STANDARD_SINCE = 17


def _reduce_axes(view: GraphView, node: Node, rank: int) -> tuple[int, ...] | None:
    try:
        axes = attr_or_input(view, node, "axes", 1)
    except LookupError:
        return None
    if axes is None or not node.attrs.get("keepdims", 1) or node.attrs.get("noop_with_empty_axes", 0):
        return None
    return tuple(sorted(int(a) - rank if a >= 0 else int(a) for a in axes.reshape(-1)))


def _match(view: GraphView, node: Node) -> Match | None:
    sub = view.producer(node.inputs[0], "Sub")
    sqrt = view.producer(node.inputs[1], "Sqrt")
    if sub is None or sqrt is None:
        return None
    mean = view.producer(sub.inputs[1], "ReduceMean")
    add = view.producer(sqrt.inputs[0], "Add")
    if mean is None or add is None or mean.inputs[0] != sub.inputs[0]:
        return None
    for name in add.inputs:
        var = view.producer(name, "ReduceMean")
        if var is None:
            continue
        square = view.producer(var.inputs[0], ("Pow", "Mul"))
        d = sub.outputs[0]
        if square is None or square.inputs[0] != d:
            continue
        if square.op_type == "Mul" and square.inputs[1] != d:
            continue
        if square.op_type == "Pow" and view.scalar(square.inputs[1]) != 2.0:
            continue
        return Match((mean, sub, square, var, add, sqrt, node),
                     {"x": sub.inputs[0], "mean": mean, "var": var, "eps": other_input(add, name)})
    return None


def _standard(view: GraphView) -> bool:
    return view.opset("") >= STANDARD_SINCE


def _check(view: GraphView, match: Match) -> str | None:
    shape = view.shape(match["x"])
    if shape is None or view.dtype(match["x"]) not in ("float32", "float64", "float16"):
        return "the input's rank or float type is unknown"
    rank = len(shape)
    axes = _reduce_axes(view, match["mean"], rank)
    if axes is None or axes != _reduce_axes(view, match["var"], rank) or axes != tuple(range(-len(axes), 0)):
        return f"the two ReduceMeans do not both reduce the same trailing axes (found {axes})"
    if not all(isinstance(d, int) for d in shape[-len(axes):]):
        return f"the normalized dims {shape[-len(axes):]} are not static"
    if view.scalar(match["eps"]) is None:
        return "epsilon is not a constant scalar"
    if not _standard(view) and view.level < 2:
        return f"opset {view.opset('')} has no LayerNormalization; the edgeinfer op needs level 2"
    return None


def _rewrite(view: GraphView, match: Match) -> Rewrite:
    shape = view.shape(match["x"])
    axes = _reduce_axes(view, match["mean"], len(shape))
    dtype = view.value(match["x"]).dtype
    scale = np.ones(shape[len(shape) - len(axes):], dtype=np.dtype(dtype))
    name = view.fresh(f"{match.root.outputs[0]}__scale")
    attrs = {"axis": -len(axes), "epsilon": view.scalar(match["eps"])}
    domain = "" if _standard(view) else EDGEINFER_DOMAIN
    node = Node("LayerNormalization", [match["x"], name], match.root.outputs, attrs, domain=domain,
                name=match.root.name)
    return Rewrite([node], {name: scale})


# -- absorb gamma / beta -------------------------------------------------------------------------
def _match_affine(view: GraphView, node: Node) -> Match | None:
    for name in node.inputs:
        ln = view.producer(name, "LayerNormalization") or view.producer(name, "LayerNormalization", EDGEINFER_DOMAIN)
        const = view.const(other_input(node, name))
        if ln is not None and const is not None:
            return Match((ln, node), {"ln": ln, "const": const})
    return None


def _check_affine(view: GraphView, match: Match) -> str | None:
    ln = match["ln"]
    scale, bias = view.const(ln.inputs[1]), view.const(input_at(ln, 2)) if input_at(ln, 2) else None
    if scale is None or (input_at(ln, 2) and bias is None):
        return "the LayerNormalization's Scale or B is computed at run time"
    if len([o for o in ln.outputs if o]) > 1:
        return "the LayerNormalization's mean / inv-std outputs are produced"
    shape = view.shape(ln.inputs[0])
    axis = int(ln.attrs.get("axis", -1))
    if shape is None:
        return "the input rank is unknown"
    normalized = tuple(shape[axis:])
    const = match["const"]
    if const.ndim > len(normalized) or np.broadcast_shapes(const.shape, normalized) != normalized:
        return f"the constant of shape {const.shape} does not broadcast over the normalized dims {normalized}"
    return None


def _rewrite_affine(view: GraphView, match: Match) -> Rewrite:
    ln, node = match["ln"], match.root
    scale = view.const(ln.inputs[1]).astype(np.float64)
    bias = view.const(input_at(ln, 2)).astype(np.float64) if input_at(ln, 2) else np.zeros_like(scale)
    const = match["const"].astype(np.float64)
    if node.op_type == "Mul":
        scale, bias = scale * const, bias * const
    else:
        bias = bias + const
    dtype = view.const(ln.inputs[1]).dtype
    s_name = view.fresh(f"{node.outputs[0]}__scale")
    b_name = view.fresh(f"{node.outputs[0]}__bias")
    inits = {s_name: np.broadcast_to(scale, np.broadcast_shapes(scale.shape, bias.shape)).astype(dtype),
             b_name: np.broadcast_to(bias, np.broadcast_shapes(scale.shape, bias.shape)).astype(dtype)}
    new = Node(ln.op_type, [ln.inputs[0], s_name, b_name], node.outputs, ln.attrs, domain=ln.domain, name=ln.name)
    return Rewrite([new], inits)


RULES = (
    Rule("layer_norm", ("Div",), _match, _rewrite, _check),
    Rule("layer_norm_affine", ("Mul", "Add"), _match_affine, _rewrite_affine, _check_affine),
)
fuse_layer_norm = rule_pass("fuse_layer_norm", 1, RULES)
