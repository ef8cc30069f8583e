"""What onnxruntime runs in place of ops it does not know, rewritten before export.

Two layers, applied in this order:

1. engine lowerings registered here, ``fn(node, ctx) -> Lowered`` (the signature of
   ``edgeinfer.ir.lowering``): rewrites specific to onnxruntime, for any domain, e.g. an
   ``edgeinfer::FusedConv`` onto onnxruntime's own fused kernel, or a standard op onto a
   form the engine runs faster. Empty until such a rewrite pays off::

       @lowering("FusedConv", domain="edgeinfer")
       def fused_conv_to_contrib(node: Node, ctx: LoweringContext) -> Lowered: ...

2. ``edgeinfer.ir.lowering.lower_graph``: every remaining ``edgeinfer``-domain op rewritten
   into standard ONNX ops by the definition of the op.

Engine lowerings are keyed by ``(domain, op_type, since)`` like every registry and resolve
against the graph's opset for that domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx

from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, Node
from edgeinfer.ir import lowering as standard
from edgeinfer.ir.lowering import LoweringContext, LoweringFn
from edgeinfer.registry import OpRegistry

LOWERINGS: OpRegistry[LoweringFn] = OpRegistry("onnxruntime lowering")


def lowering(op_type: str | tuple[str, ...], *, domain: str, since: int = 1) -> Callable[[LoweringFn], LoweringFn]:
    """Register an onnxruntime-specific ``fn(node, ctx) -> Lowered`` for ``(domain, op_type)``."""
    return LOWERINGS.decorator(op_type, domain=domain, since=since)


def find_lowering(node: Node, graph: Graph) -> LoweringFn | None:
    """The engine lowering of ``node``, else its standard lowering, else None."""
    version = graph.opset.get(node.domain, 1)
    return LOWERINGS.lookup(node.op_type, domain=node.domain, version=version) or standard.find_lowering(node, graph)


def lower_graph(graph: Graph) -> Graph:
    """``graph`` as onnxruntime should receive it: engine lowerings, then standard ones (also
    inside subgraphs); the graph itself when nothing was lowered."""
    return standard.lower_graph(_apply_engine_lowerings(graph))


def _apply_engine_lowerings(graph: Graph) -> Graph:
    if not len(LOWERINGS):
        return graph
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    context = LoweringContext(graph.opset.get("", onnx.defs.onnx_opset_version()), taken)
    nodes: list[Node] = []
    initializers = graph.initializers
    changed = False
    for node in graph.nodes:
        if node.subgraphs():
            attrs = {k: _lower_attr(v) for k, v in node.attrs.items()}
            if any(attrs[k] is not v for k, v in node.attrs.items()):
                node, changed = node.with_(attrs=attrs), True
        fn = LOWERINGS.lookup(node.op_type, domain=node.domain, version=graph.opset.get(node.domain, 1))
        if fn is None:
            nodes.append(node)
            continue
        lowered = fn(node, context)
        produced = {o for n in lowered.nodes for o in n.outputs if o}
        missing = [o for o in node.outputs if o and o not in produced]
        if missing:
            raise BackendError(f"{node.label}: its onnxruntime lowering does not produce output(s) "
                               f"{missing}; expected every output of the node, found {sorted(produced)}")
        nodes.extend(lowered.nodes)
        initializers.update(lowered.initializers)
        changed = True
    if not changed:
        return graph
    return graph.replace(nodes, initializers=initializers)


def _lower_attr(value: Any) -> Any:
    if isinstance(value, Graph):
        return _apply_engine_lowerings(value)
    if isinstance(value, tuple) and value and isinstance(value[0], Graph):
        lowered = tuple(_apply_engine_lowerings(g) for g in value)
        return value if all(a is b for a, b in zip(lowered, value, strict=True)) else lowered
    return value
