"""Fuse bias and activation into the op that produces their input (level 2).

``MatMul(A, B) + bias`` (bias constant along the last axis, A of rank >= 3 where ``Gemm``
cannot take it) becomes ``edgeinfer::FusedMatMul(A, B, bias)``. Then an activation reading
the output of ``Conv``, ``Gemm``, ``MatMul`` or a fused op without activation becomes that
op's ``activation`` attribute: ``Conv -> FusedConv``, ``Gemm -> FusedGemm``,
``MatMul -> FusedMatMul`` (semantics in ``edgeinfer.ir.lowering``). Recognised activations:
``Relu``, ``Clip`` (Relu6 and any constant bounds), ``LeakyRelu``, ``Sigmoid``, ``Tanh``,
``HardSigmoid``, ``HardSwish``, ``Gelu`` (ONNX or edgeinfer, erf or tanh form) and SiLU
written as ``y * Sigmoid(y)``. The op's output must be read by the activation alone.
"""

from __future__ import annotations

import numpy as np

from edgeinfer.ir import EDGEINFER_DOMAIN, Node
from edgeinfer.passes.gemm import unidirectional
from edgeinfer.passes.rules import GraphView, Match, Rewrite, Rule, attr_or_input, other_input, rule_pass

FUSED_NAME = {"Conv": "FusedConv", "Gemm": "FusedGemm", "MatMul": "FusedMatMul"}
FUSIBLE = ("Conv", "Gemm", "MatMul")
FUSED = tuple(FUSED_NAME.values())
FLOAT_TYPES = ("float32", "float64", "float16")


def _fusible_producer(view: GraphView, name: str) -> Node | None:
    node = view.producer(name, FUSIBLE)
    if node is None:
        node = view.producer(name, FUSED, EDGEINFER_DOMAIN)
        if node is not None and node.attrs.get("activation", ""):
            return None
    if node is None or view.dtype(name) not in FLOAT_TYPES:
        return None
    return node


def activation_of(view: GraphView, node: Node) -> tuple[str, tuple[float, ...]] | None:
    """(activation name, params) if ``node`` is a supported activation, else None."""
    op = node.op_type
    if node.domain == EDGEINFER_DOMAIN and op == "Gelu" or node.domain == "" and op == "Gelu":
        return ("GeluTanh" if node.attrs.get("approximate", "none") == "tanh" else "Gelu"), ()
    if node.domain:
        return None
    if op in ("Relu", "Sigmoid", "Tanh", "HardSwish"):
        return op, ()
    if op == "LeakyRelu":
        return op, (float(node.attrs.get("alpha", 0.01)),)
    if op == "HardSigmoid":
        return op, (float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5)))
    if op == "Clip":
        try:
            lo, hi = attr_or_input(view, node, "min", 1), attr_or_input(view, node, "max", 2)
        except LookupError:
            return None
        return op, (-np.inf if lo is None else float(lo), np.inf if hi is None else float(hi))
    return None


def _fused_node(view: GraphView, base: Node, outputs, activation: str, params: tuple[float, ...]) -> Node:
    attrs = dict(base.attrs)
    attrs["activation"] = activation
    if params:
        attrs["activation_params"] = tuple(params)
    op = base.op_type if base.domain == EDGEINFER_DOMAIN else FUSED_NAME[base.op_type]
    return Node(op, base.inputs, outputs, attrs, domain=EDGEINFER_DOMAIN, name=base.name)


# -- activation --------------------------------------------------------------------------
def _match_activation(view: GraphView, node: Node) -> Match | None:
    found = activation_of(view, node)
    base = _fusible_producer(view, node.inputs[0]) if node.inputs else None
    if found is None or base is None:
        return None
    return Match((base, node), {"base": base, "activation": found})


def _rewrite_activation(view: GraphView, match: Match) -> Rewrite:
    name, params = match["activation"]
    return Rewrite([_fused_node(view, match["base"], match.root.outputs, name, params)])


def _match_silu(view: GraphView, node: Node) -> Match | None:
    for name in node.inputs:
        sigmoid = view.producer(name, "Sigmoid")
        y = other_input(node, name)
        if sigmoid is not None and sigmoid.inputs[0] == y:
            base = _fusible_producer(view, y)
            if base is not None:
                return Match((base, sigmoid, node), {"base": base, "activation": ("Silu", ())})
    return None


# -- MatMul bias -------------------------------------------------------------------------
def _match_bias(view: GraphView, node: Node) -> Match | None:
    for name in node.inputs:
        matmul = view.producer(name, "MatMul")
        bias = other_input(node, name)
        if matmul is not None and view.const(bias) is not None:
            return Match((matmul, node), {"matmul": matmul, "bias": bias})
    return None


def _check_bias(view: GraphView, match: Match) -> str | None:
    y = view.shape(match["matmul"].outputs[0])
    bias = view.const(match["bias"])
    if y is None or view.dtype(match["matmul"].outputs[0]) not in FLOAT_TYPES:
        return "the MatMul's output type is unknown or not float"
    if any(d != 1 for d in bias.shape[:-1]) or not unidirectional(bias.shape, y):
        return f"the bias of shape {bias.shape} is not a vector over the last axis of {y}"
    return None


def _rewrite_bias(view: GraphView, match: Match) -> Rewrite:
    matmul, node = match["matmul"], match.root
    inputs = [matmul.inputs[0], matmul.inputs[1], match["bias"]]
    return Rewrite([Node("FusedMatMul", inputs, node.outputs, domain=EDGEINFER_DOMAIN, name=matmul.name)])


ACTIVATION_ROOTS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu")
RULES = (
    Rule("matmul_bias", ("Add",), _match_bias, _rewrite_bias, _check_bias),
    Rule("silu", ("Mul",), _match_silu, _rewrite_activation),
    Rule("activation", ACTIVATION_ROOTS, _match_activation, _rewrite_activation),
    Rule("activation", ("Gelu",), _match_activation, _rewrite_activation, domain=EDGEINFER_DOMAIN),
)
fuse_bias_activation = rule_pass("fuse_bias_activation", 2, RULES)

