"""The ``edgeinfer`` op domain: what each fused op means, its type rule, and its lowering.

Passes create these ops; every backend must run them. A backend whose engine has no
equivalent calls ``lower_graph`` to rewrite them into standard ONNX ops that compute the same
(the definition below *is* that lowering), and shape inference derives their types the same
way: lower the node, run ONNX shape inference on the result.

Activations (attribute ``activation``, parameters in ``activation_params``), applied
element-wise to the op's result ``y``:

    ""            y                               (no activation)
    "Relu"        max(y, 0)
    "Clip"        min(max(y, lo), hi)             params (lo, hi)
    "LeakyRelu"   y if y >= 0 else alpha * y      params (alpha,)
    "Sigmoid"     1 / (1 + exp(-y))
    "Tanh"        tanh(y)
    "HardSigmoid" max(0, min(1, alpha * y + beta))  params (alpha, beta)
    "HardSwish"   y * max(0, min(1, y / 6 + 1/2))
    "Silu"        y * sigmoid(y)
    "Gelu"        y / 2 * (1 + erf(y / sqrt(2)))
    "GeluTanh"    y / 2 * (1 + tanh(sqrt(2 / pi) * (y + 0.044715 * y^3)))

Ops (inputs in brackets are optional):

- ``FusedConv(X, W, [B])``: ONNX ``Conv`` with all of Conv's attributes, then the activation.
- ``FusedGemm(A, B, [C])``: ONNX ``Gemm`` (alpha, beta, transA, transB), then the activation.
- ``FusedMatMul(A, B, [bias])``: ``MatMul(A, B) + bias`` (bias broadcast numpy-style, in
  practice a vector over the last axis), then the activation.
- ``Gelu(X)``: attribute ``approximate`` ("none" | "tanh"), ONNX-20 ``Gelu`` for older opsets.
- ``LayerNormalization(X, Scale, [B])``: attributes ``axis`` (default -1), ``epsilon``
  (default 1e-5); ONNX-17 ``LayerNormalization`` (first output only) for older opsets:
  ``(X - mean) / sqrt(var + epsilon) * Scale + B`` over the axes from ``axis`` to the last.
- ``Attention(Q, K, V, [mask])``: multi-head scaled dot-product attention of BERT.
  ``Q`` is ``[B, S, H*dk]``, ``K`` ``[B, T, H*dk]``, ``V`` ``[B, T, H*dv]`` (already
  projected), attributes ``num_heads`` = H and ``scale`` (usually ``1/sqrt(dk)``)::

      Qh = Q.reshape(B, S, H, dk).transpose(0, 2, 1, 3)       # [B, H, S, dk]
      Kh = K.reshape(B, T, H, dk).transpose(0, 2, 3, 1)       # [B, H, dk, T]
      Vh = V.reshape(B, T, H, dv).transpose(0, 2, 1, 3)       # [B, H, T, dv]
      P = softmax(Qh @ Kh * scale + mask, axis=-1)            # mask broadcasts to [B, H, S, T]
      Y = (P @ Vh).transpose(0, 2, 1, 3).reshape(B, S, H*dv)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from edgeinfer.errors import BackendError, UnsupportedOpError
from edgeinfer.ir.graph import EDGEINFER_DOMAIN, Graph, Node, Value
from edgeinfer.ir.infer import type_rule
from edgeinfer.ir.names import fresh_name
from edgeinfer.registry import OpRegistry

ACTIVATIONS: dict[str, int] = {  # name -> number of activation_params
    "": 0, "Relu": 0, "Clip": 2, "LeakyRelu": 1, "Sigmoid": 0, "Tanh": 0, "HardSigmoid": 2,
    "HardSwish": 0, "Silu": 0, "Gelu": 0, "GeluTanh": 0,
}
ACTIVATION_ATTRS = ("activation", "activation_params")
_LATEST_OPSET = onnx.defs.onnx_opset_version()


@dataclass
class LoweringContext:
    """What a lowering may use: the graph's default-domain opset and a fresh-name source."""

    opset: int
    taken: set[str] = field(default_factory=set)
    value_types: Mapping[str, str | None] = field(default_factory=dict)  # value name -> dtype name

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)

    def float_type(self, name: str) -> np.dtype:
        """The numpy type of the float value ``name`` (float32 where it is not known), for
        constants that must match it (a scale beside fp16 scores)."""
        from edgeinfer.ir import dtypes

        known = self.value_types.get(name)
        dtype = dtypes.numpy_dtype(known) if known and dtypes.is_tensor_type(known) else np.dtype(np.float32)
        return dtype if dtype.kind == "f" or known == "bfloat16" else np.dtype(np.float32)


@dataclass
class Lowered:
    nodes: list[Node]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)

    def const(self, ctx: LoweringContext, base: str, array: Any, dtype: Any = np.float32) -> str:
        name = ctx.fresh(base)
        self.initializers[name] = np.asarray(array, dtype=dtype)
        return name


LoweringFn = Callable[[Node, LoweringContext], Lowered]
LOWERINGS: OpRegistry[LoweringFn] = OpRegistry("lowering")


def lowering(op_type: str, *, domain: str = EDGEINFER_DOMAIN, since: int = 1) -> Callable[[LoweringFn], LoweringFn]:
    """Register ``fn(node, ctx) -> Lowered`` for ``(domain, op_type)``; also registers a type
    rule derived from it."""

    def register(fn: LoweringFn) -> LoweringFn:
        LOWERINGS.register(op_type, fn, domain=domain, since=since)
        type_rule(op_type, domain)(_type_rule_from(fn))
        return fn

    return register


def find_lowering(node: Node, graph: Graph) -> LoweringFn | None:
    return LOWERINGS.lookup(node.op_type, domain=node.domain, version=graph.opset.get(node.domain, 1))


def _apply(fn: LoweringFn, node: Node, graph: Graph, taken: set[str]) -> Lowered:
    types = {name: graph.values[name].dtype for name in node.inputs if name and name in graph.values}
    ctx = LoweringContext(graph.opset.get("", _LATEST_OPSET), taken, types)
    lowered = fn(node, ctx)
    produced = {o for n in lowered.nodes for o in n.outputs if o}
    missing = [o for o in node.outputs if o and o not in produced]
    if missing:
        raise BackendError(f"{node.label}: its lowering does not produce output(s) {missing}; expected "
                           f"every output of the node, found {sorted(produced)}")
    return lowered


def lower_node(node: Node, graph: Graph, taken: set[str] | None = None) -> Lowered | None:
    """The standard-op equivalent of ``node`` (None if it has no lowering)."""
    fn = find_lowering(node, graph)
    if fn is None:
        return None
    return _apply(fn, node, graph, taken if taken is not None else set(graph.values))


def lower_graph(graph: Graph, domains: Sequence[str] = (EDGEINFER_DOMAIN,), *,
                registry: OpRegistry[LoweringFn] | None = None) -> Graph:
    """``graph`` with every node of ``domains`` rewritten into standard ONNX ops (subgraphs
    included); the same graph object when nothing needed lowering. Raises
    ``UnsupportedOpError`` for an op of those domains that has no lowering.

    With ``registry`` (an engine's own lowerings, any domain), a node that registry has a
    lowering for is rewritten by it instead; pass ``domains=()`` to apply only those."""
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    nodes: list[Node] = []
    inits = graph.initializers
    changed = False
    for node in graph.nodes:
        if node.subgraphs():
            attrs = {k: _lower_attr(v, domains, registry) for k, v in node.attrs.items()}
            if any(attrs[k] is not v for k, v in node.attrs.items()):
                node, changed = node.with_(attrs=attrs), True
        version = graph.opset.get(node.domain, 1)
        fn = registry.lookup(node.op_type, domain=node.domain, version=version) if registry else None
        if fn is None and node.domain in domains:
            fn = find_lowering(node, graph)
            if fn is None:
                raise UnsupportedOpError(f"{node.label}: no lowering to standard ONNX ops is registered")
        if fn is None:
            nodes.append(node)
            continue
        lowered = _apply(fn, node, graph, taken)
        nodes.extend(lowered.nodes)
        inits.update(lowered.initializers)
        changed = True
    if not changed:
        return graph
    produced = {o for n in nodes for o in n.outputs if o}
    infos = [v for v in graph.value_info() if v.name in produced]
    return Graph(nodes, list(graph.inputs), list(graph.outputs), inits, value_info=infos,
                 opset=graph.opset, name=graph.name, metadata=graph.metadata)


def _lower_attr(value: Any, domains: Sequence[str], registry: OpRegistry[LoweringFn] | None) -> Any:
    if isinstance(value, Graph):
        return lower_graph(value, domains, registry=registry)
    if isinstance(value, tuple) and value and isinstance(value[0], Graph):
        lowered = tuple(lower_graph(g, domains, registry=registry) for g in value)
        return value if all(a is b for a, b in zip(lowered, value, strict=True)) else lowered
    return value


# -- type rules from lowerings ------------------------------------------------------------
def _type_rule_from(fn: LoweringFn):
    def rule(node: Node, inputs: Sequence[Value]) -> list[tuple]:
        from edgeinfer.ir import dtypes
        from edgeinfer.ir.onnx_io import array_to_tensor

        ctx = LoweringContext(_LATEST_OPSET, {v.name for v in inputs if v.name} | set(node.outputs),
                              {v.name: v.dtype for v in inputs if v.name})
        lowered = fn(node, ctx)
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node(n.op_type, list(n.inputs), list(n.outputs),
                                   **{k: (list(v) if isinstance(v, tuple) else v) for k, v in n.attrs.items()})
             for n in lowered.nodes],
            "type_rule",
            [onnx.helper.make_value_info(v.name, dtypes.type_to_onnx(v.dtype, v.shape)) for v in inputs if v.name],
            [onnx.helper.make_empty_tensor_value_info(o) for o in node.outputs if o],
            [array_to_tensor(a, n) for n, a in lowered.initializers.items()])
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", _LATEST_OPSET)])
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except Exception:  # inference gives up: leave the outputs untyped
            return [(None, None)] * len(node.outputs)
        types = {info.name: dtypes.type_from_onnx(info.type)
                 for info in list(inferred.graph.value_info) + list(inferred.graph.output)}
        return [types.get(o, (None, None)) if o else (None, None) for o in node.outputs]

    return rule


# -- activations --------------------------------------------------------------------------
def split_activation(attrs: dict[str, Any]) -> tuple[dict[str, Any], str, tuple[float, ...]]:
    """(base op attributes, activation name, activation params) of a fused node's attrs."""
    base = {k: v for k, v in attrs.items() if k not in ACTIVATION_ATTRS}
    name = attrs.get("activation", "")
    params = tuple(float(p) for p in attrs.get("activation_params", ()))
    if name not in ACTIVATIONS or len(params) != ACTIVATIONS[name]:
        raise UnsupportedOpError(f"activation {name!r} with params {list(params)}: expected one of "
                                 f"{sorted(ACTIVATIONS)} with the documented number of params")
    return base, name, params


def lower_activation(name: str, params: tuple[float, ...], x: str, y: str, ctx: LoweringContext,
                     out: Lowered) -> None:
    """Append standard nodes computing ``y = activation(x)`` to ``out``."""
    tmp = lambda tag: ctx.fresh(f"{y}__{tag}")  # noqa: E731
    nodes = out.nodes
    if name == "":
        nodes.append(Node("Identity", [x], [y]))
    elif name in ("Relu", "Sigmoid", "Tanh"):
        nodes.append(Node(name, [x], [y]))
    elif name == "Clip":
        if ctx.opset < 11:
            nodes.append(Node("Clip", [x], [y], {"min": params[0], "max": params[1]}))
        else:
            lo, hi = out.const(ctx, f"{y}__min", params[0]), out.const(ctx, f"{y}__max", params[1])
            nodes.append(Node("Clip", [x, lo, hi], [y]))
    elif name == "LeakyRelu":
        nodes.append(Node("LeakyRelu", [x], [y], {"alpha": params[0]}))
    elif name == "HardSigmoid":
        nodes.append(Node("HardSigmoid", [x], [y], {"alpha": params[0], "beta": params[1]}))
    elif name == "HardSwish":
        if ctx.opset >= 14:
            nodes.append(Node("HardSwish", [x], [y]))
        else:
            gate = tmp("gate")
            nodes += [Node("HardSigmoid", [x], [gate], {"alpha": 1 / 6, "beta": 0.5}), Node("Mul", [x, gate], [y])]
    elif name == "Silu":
        gate = tmp("sigmoid")
        nodes += [Node("Sigmoid", [x], [gate]), Node("Mul", [x, gate], [y])]
    elif name in ("Gelu", "GeluTanh"):
        approximate = "tanh" if name == "GeluTanh" else "none"
        if ctx.opset >= 20:
            nodes.append(Node("Gelu", [x], [y], {"approximate": approximate}))
        else:
            _lower_gelu_primitive(approximate, x, y, ctx, out)
    else:
        raise UnsupportedOpError(f"activation {name!r}: expected one of {sorted(ACTIVATIONS)}")


def _lower_gelu_primitive(approximate: str, x: str, y: str, ctx: LoweringContext, out: Lowered) -> None:
    tmp = lambda tag: ctx.fresh(f"{y}__{tag}")  # noqa: E731
    one, half = out.const(ctx, f"{y}__one", 1.0), out.const(ctx, f"{y}__half", 0.5)
    inner, gate, plus_one, scaled = tmp("inner"), tmp("gate"), tmp("plus_one"), tmp("half_x")
    if approximate == "tanh":
        cube, cube_c, poly = tmp("cube"), tmp("cube_c"), tmp("poly")
        three = out.const(ctx, f"{y}__three", 3.0)
        c = out.const(ctx, f"{y}__c", 0.044715)
        k = out.const(ctx, f"{y}__k", math.sqrt(2 / math.pi))
        out.nodes += [Node("Pow", [x, three], [cube]), Node("Mul", [cube, c], [cube_c]),
                      Node("Add", [x, cube_c], [poly]), Node("Mul", [poly, k], [inner]),
                      Node("Tanh", [inner], [gate])]
    else:
        r = out.const(ctx, f"{y}__rsqrt2", 1 / math.sqrt(2))
        out.nodes += [Node("Mul", [x, r], [inner]), Node("Erf", [inner], [gate])]
    out.nodes += [Node("Add", [gate, one], [plus_one]), Node("Mul", [x, half], [scaled]),
                  Node("Mul", [scaled, plus_one], [y])]


def _with_activation(base_op: str, node: Node, ctx: LoweringContext, inputs: Sequence[str] | None = None) -> Lowered:
    attrs, name, params = split_activation(dict(node.attrs))
    out = Lowered([])
    y = node.outputs[0]
    pre = y if name == "" else ctx.fresh(f"{y}__{base_op.lower()}")
    out.nodes.append(Node(base_op, list(node.inputs if inputs is None else inputs), [pre], attrs, name=node.name))
    if name:
        lower_activation(name, params, pre, y, ctx, out)
    return out


@lowering("FusedConv")
def lower_fused_conv(node: Node, ctx: LoweringContext) -> Lowered:
    return _with_activation("Conv", node, ctx)


@lowering("FusedGemm")
def lower_fused_gemm(node: Node, ctx: LoweringContext) -> Lowered:
    return _with_activation("Gemm", node, ctx)


@lowering("FusedMatMul")
def lower_fused_matmul(node: Node, ctx: LoweringContext) -> Lowered:
    attrs, name, params = split_activation(dict(node.attrs))
    if attrs:
        raise UnsupportedOpError(f"{node.label}: unexpected attributes {sorted(attrs)}")
    a, b = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    y = node.outputs[0]
    out = Lowered([])
    pre = y if not name and not bias else ctx.fresh(f"{y}__matmul")
    out.nodes.append(Node("MatMul", [a, b], [pre], name=node.name))
    if bias:
        biased = y if not name else ctx.fresh(f"{y}__biased")
        out.nodes.append(Node("Add", [pre, bias], [biased]))
        pre = biased
    if name:
        lower_activation(name, params, pre, y, ctx, out)
    return out


@lowering("Gelu")
def lower_gelu(node: Node, ctx: LoweringContext) -> Lowered:
    approximate = node.attrs.get("approximate", "none")
    out = Lowered([])
    lower_activation("GeluTanh" if approximate == "tanh" else "Gelu", (), node.inputs[0], node.outputs[0], ctx, out)
    return out


@lowering("LayerNormalization")
def lower_layer_norm(node: Node, ctx: LoweringContext) -> Lowered:
    axis = int(node.attrs.get("axis", -1))
    epsilon = float(node.attrs.get("epsilon", 1e-5))
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    y = node.outputs[0]
    if ctx.opset >= 17:
        return Lowered([Node("LayerNormalization", [x, scale] + ([bias] if bias else []), [y],
                             {"axis": axis, "epsilon": epsilon}, name=node.name)])
    if axis >= 0:
        raise UnsupportedOpError(f"{node.label}: lowering below opset 17 needs a negative axis, found {axis}")
    out = Lowered([])
    tmp = lambda tag: ctx.fresh(f"{y}__{tag}")  # noqa: E731
    axes = list(range(axis, 0))
    mean, centered, square, var, var_eps, std, normed = (tmp(t) for t in
                                                         ("mean", "centered", "square", "var", "var_eps", "std", "normed"))
    eps = out.const(ctx, f"{y}__eps", epsilon)

    def reduce_mean(src: str, dst: str) -> Node:
        if ctx.opset >= 18:
            return Node("ReduceMean", [src, out.const(ctx, f"{y}__axes", axes, np.int64)], [dst], {"keepdims": 1})
        return Node("ReduceMean", [src], [dst], {"axes": tuple(axes), "keepdims": 1})

    out.nodes += [reduce_mean(x, mean), Node("Sub", [x, mean], [centered]),
                  Node("Mul", [centered, centered], [square]), reduce_mean(square, var),
                  Node("Add", [var, eps], [var_eps]), Node("Sqrt", [var_eps], [std]),
                  Node("Div", [centered, std], [normed])]
    if bias:
        scaled = tmp("scaled")
        out.nodes += [Node("Mul", [normed, scale], [scaled]), Node("Add", [scaled, bias], [y])]
    else:
        out.nodes.append(Node("Mul", [normed, scale], [y]))
    return out


@lowering("Attention")
def lower_attention(node: Node, ctx: LoweringContext) -> Lowered:
    heads = int(node.attrs["num_heads"])
    scale = float(node.attrs.get("scale", 1.0))
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else ""
    y = node.outputs[0]
    out = Lowered([])
    tmp = lambda tag: ctx.fresh(f"{y}__{tag}")  # noqa: E731
    split = out.const(ctx, f"{y}__split_heads", [0, 0, heads, -1], np.int64)
    merge = out.const(ctx, f"{y}__merge_heads", [0, 0, -1], np.int64)
    scale_c = out.const(ctx, f"{y}__scale", scale, ctx.float_type(q))  # in the scores' own type
    heads_of = {}
    for name, source, perm in (("q", q, (0, 2, 1, 3)), ("k", k, (0, 2, 3, 1)), ("v", v, (0, 2, 1, 3))):
        split_value, heads_value = tmp(f"{name}_split"), tmp(f"{name}_heads")
        out.nodes += [Node("Reshape", [source, split], [split_value]),
                      Node("Transpose", [split_value], [heads_value], {"perm": perm})]
        heads_of[name] = heads_value
    scores, scaled, probs, context, context_t = (tmp(t) for t in ("scores", "scaled", "probs", "context", "context_t"))
    out.nodes += [Node("MatMul", [heads_of["q"], heads_of["k"]], [scores], name=node.name),
                  Node("Mul", [scores, scale_c], [scaled])]
    if mask:
        masked = tmp("masked")
        out.nodes.append(Node("Add", [scaled, mask], [masked]))
        scaled = masked
    out.nodes += [Node("Softmax", [scaled], [probs], {"axis": -1}),
                  Node("MatMul", [probs, heads_of["v"]], [context]),
                  Node("Transpose", [context], [context_t], {"perm": (0, 2, 1, 3)}),
                  Node("Reshape", [context_t, merge], [y])]
    return out


from edgeinfer.ir import lowering_detection  # noqa: E402,F401,I001  (registers edgeinfer::CaffeDetectionOutput)
from edgeinfer.ir import lowering_tflite  # noqa: E402,F401  (registers the edgeinfer::TFLite* lowerings)
