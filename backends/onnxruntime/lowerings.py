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

from edgeinfer.ir import Graph, Node
from edgeinfer.ir import lowering as standard
from edgeinfer.ir.lowering import LoweringFn
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
    engine_lowered = graph if not len(LOWERINGS) else standard.lower_graph(graph, (), registry=LOWERINGS)
    return standard.lower_graph(engine_lowered)
