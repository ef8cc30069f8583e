"""Per-node cost estimates (FLOPs, bytes moved) and the graph summary.

Estimates seed the scheduler's planners before profiling replaces them with measurements.
A multiply-add counts as two FLOPs. Symbolic dims count as 1 (batch 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeinfer.ir import dtypes
from edgeinfer.ir.graph import Graph, Node
from edgeinfer.registry import OpRegistry

FLOP_RULES: OpRegistry[Callable[[Node, Graph], float]] = OpRegistry("FLOP estimate")


def flop_rule(*op_types: str, domain: str = ""):
    """Register a FLOP estimate for ops; the function gets (node, graph)."""
    return FLOP_RULES.decorator(op_types, domain=domain)


def _numel(shape) -> int | None:
    if shape is None:
        return None
    return math.prod(d if isinstance(d, int) else 1 for d in shape)


def _shape(graph: Graph, name: str):
    value = graph.values.get(name) if name else None
    return None if value is None else value.shape


@flop_rule("Conv", "ConvTranspose")
@flop_rule("FusedConv", "QLinearConv", domain="edgeinfer")
def _conv_flops(node: Node, graph: Graph) -> float:
    w = _shape(graph, node.inputs[1])
    # Conv: every output element costs (C_in/group * kernel) MACs; ConvTranspose: every
    # input element scatters (C_out/group * kernel) MACs. Both are numel(w[1:]) MACs.
    spread = node.outputs[0] if node.op_type != "ConvTranspose" else node.inputs[0]
    big = _shape(graph, spread)
    if w is None or big is None:
        return 0.0
    return float(2 * _numel(w[1:]) * _numel(big))


@flop_rule("MatMul", "Gemm", "MatMulInteger")
@flop_rule("FusedGemm", "FusedMatMul", domain="edgeinfer")
def _matmul_flops(node: Node, graph: Graph) -> float:
    a, out = _shape(graph, node.inputs[0]), _shape(graph, node.outputs[0])
    if a is None or out is None or not a:
        return 0.0
    k = a[-1] if not node.attrs.get("transA") else a[0]
    k = k if isinstance(k, int) else 1
    return float(2 * k * _numel(out))


def node_flops(node: Node, graph: Graph) -> float:
    rule = FLOP_RULES.lookup(node.op_type, domain=node.domain)
    if rule is not None:
        return rule(node, graph)
    numel = [_numel(_shape(graph, o)) for o in node.outputs if o]
    return float(sum(n for n in numel if n))


def node_bytes(node: Node, graph: Graph) -> int:
    """Bytes read and written by a node (constant inputs included)."""
    total = 0
    for name in [*node.inputs, *node.outputs]:
        value = graph.values.get(name) if name else None
        if value is None or value.shape is None or not dtypes.is_tensor_type(value.dtype) or value.dtype == "str":
            continue
        total += _numel(value.shape) * dtypes.numpy_dtype(value.dtype).itemsize
    return total


def graph_summary(graph: Graph) -> dict[str, Any]:
    inits = graph.initializers
    params = sum(int(a.size) for a in inits.values())
    weight_bytes = sum(int(a.nbytes) for a in inits.values() if a.dtype != object)
    return {
        "name": graph.name,
        "opset": dict(graph.opset),
        "inputs": [(v.name, v.dtype, v.shape) for v in graph.inputs],
        "outputs": [(v.name, v.dtype, v.shape) for v in graph.outputs],
        "nodes": len(graph.nodes),
        "ops": dict(sorted(graph.op_histogram().items(), key=lambda kv: (-kv[1], kv[0]))),
        "parameters": params,
        "weight_bytes": weight_bytes,
        "flops": sum(node_flops(n, graph) for n in graph.nodes),
        "weight_dtypes": _bytes_by_dtype(inits.values()),
    }


def _bytes_by_dtype(arrays) -> dict[str, int]:
    totals: dict[str, int] = {}
    for array in arrays:
        if array.dtype != np.dtype(object):
            totals[str(array.dtype)] = totals.get(str(array.dtype), 0) + int(array.nbytes)
    return dict(sorted(totals.items()))
