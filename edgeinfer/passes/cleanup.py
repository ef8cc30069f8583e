"""Cleanup passes: identity removal and dead-node elimination.

``remove_identity``: ``Identity(x)``, ``Dropout(x)`` in inference mode (``y = x``; its mask
output unused) and ``Cast(x, to=dtype(x))`` compute ``y = x``, so every reader of ``y``
reads ``x`` instead. When ``y`` is a graph output its name must survive, so the producer of
``x`` is renamed to produce ``y`` instead (only when ``x`` is neither a graph input, an
initializer nor itself a graph output).

``eliminate_dead_nodes``: a node none of whose outputs reaches a graph output (directly or
through other nodes, subgraph reads included) is removed; so are initializers nothing reads.
ONNX ops have no side effects, so liveness is the only criterion. Graph inputs stay even
when unused: the model's interface does not change.
"""

from __future__ import annotations

from edgeinfer.ir import Graph, Node, dtypes
from edgeinfer.passes.manager import PassResult, graph_pass
from edgeinfer.passes.rules import GraphView, input_at, rebuild, substitute

MAX_SWEEPS = 64


def _is_identity(view: GraphView, node: Node) -> bool:
    if node.domain or not node.inputs or not node.inputs[0]:
        return False
    if node.op_type == "Identity":
        return view.value(node.inputs[0]).dtype is None or dtypes.is_tensor_type(view.dtype(node.inputs[0]))
    if node.op_type == "Dropout":
        mask_used = len(node.outputs) > 1 and node.outputs[1] and (
            view.consumers(node.outputs[1]) or view.is_output(node.outputs[1]))
        training = input_at(node, 2)
        training_off = not training or (view.const(training) is not None and not view.const(training).any())
        return not mask_used and training_off and not node.attrs.get("is_test", 1) == 0
    if node.op_type == "Cast":
        source = view.dtype(node.inputs[0])
        return source is not None and dtypes.to_onnx(source) == node.attrs.get("to")
    return False


def _sweep(graph: Graph) -> tuple[Graph, int] | None:
    view = GraphView(graph)
    alias: dict[str, str] = {}
    rename_def: dict[str, str] = {}
    dropped: set[int] = set()
    for node in graph.nodes:
        if not _is_identity(view, node):
            continue
        x, y = node.inputs[0], node.outputs[0]
        x = alias.get(x, x)
        if not view.is_output(y):
            alias[y] = x
            dropped.add(id(node))
            continue
        producer = graph.producer(x)
        if (rename_def or producer is None or view.is_output(x) or x in alias.values()
                or view.value(x).const is not None):
            continue  # a graph output keeps its name: only rename a plain intermediate, one per sweep
        rename_def[x] = y
        dropped.add(id(node))
    if not dropped:
        return None
    nodes = [n for n in graph.nodes if id(n) not in dropped]
    nodes = substitute(nodes, {**alias, **rename_def})
    if rename_def:
        nodes = [n.with_(outputs=tuple(rename_def.get(o, o) for o in n.outputs))
                 if any(o in rename_def for o in n.outputs) else n for n in nodes]
    return rebuild(graph, nodes, graph.initializers), len(dropped)


@graph_pass("remove_identity", level=1)
def remove_identity(graph: Graph) -> PassResult:
    removed = 0
    for _ in range(MAX_SWEEPS):
        swept = _sweep(graph)
        if swept is None:
            break
        graph, count = swept
        removed += count
    return PassResult(graph, removed > 0, {"identity": removed} if removed else {})


@graph_pass("eliminate_dead_nodes", level=1)
def eliminate_dead_nodes(graph: Graph) -> PassResult:
    live = set(graph.output_names)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if not any(o in live for o in node.outputs if o):
            continue
        kept.append(node)
        live.update(i for i in node.inputs if i)
        for sub in node.subgraphs():
            live |= sub.outer_names()
    kept.reverse()
    inits = {name: array for name, array in graph.initializers.items() if name in live}
    dead_nodes = len(graph.nodes) - len(kept)
    dead_inits = len(graph.initializers) - len(inits)
    if not dead_nodes and not dead_inits:
        return PassResult(graph, False)
    fired = {k: v for k, v in (("nodes", dead_nodes), ("initializers", dead_inits)) if v}
    return PassResult(rebuild(graph, kept, inits), True, fired)
