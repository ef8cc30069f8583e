"""Control flow: ``WHILE`` becomes an ONNX ``Loop``.

TFLite's WHILE carries n tensors through a cond subgraph (n inputs -> bool) and a body
subgraph (n inputs -> n outputs). ONNX's Loop checks its condition after the body, so the
cond subgraph is imported twice: once on the initial values (the Loop's initial condition)
and once at the end of the body on the body's results (the body's condition output). This
is how TensorFlow's converter lowers Keras RNN layers (LSTM, GRU, SimpleRNN).
"""

from __future__ import annotations

from edgeinfer.converters.tflite.importer import OPSET, OpContext, SubgraphImporter, _dims, rule
from edgeinfer.errors import ModelFormatError, UnsupportedOpError
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.limits import MAX_GRAPH_NESTING


def _inline(ctx: OpContext, subgraph_index: int, bound_values: list[str], nodes: list[Node]) -> list[str]:
    """Import a subgraph with its inputs bound to ``bound_values``; return its output names."""
    model = ctx.imp.model
    sub = model.subgraphs[subgraph_index]
    if len(sub.inputs) != len(bound_values):
        raise ModelFormatError(f"{ctx.where}: subgraph {subgraph_index} takes {len(sub.inputs)} inputs, "
                               f"the WHILE carries {len(bound_values)}")
    depth = ctx.imp.depth + 1
    if depth > MAX_GRAPH_NESTING:
        raise ModelFormatError(f"{ctx.where}: control flow nested deeper than {MAX_GRAPH_NESTING} (a cycle?)")
    importer = SubgraphImporter(model, sub, ctx.imp.builder, nodes,
                                dict(zip(sub.inputs, bound_values, strict=True)), depth)
    importer.run()
    return [importer.raw_value(i) for i in sub.outputs]


@rule("WHILE", options="WhileOptions")
def while_(ctx: OpContext) -> None:
    model = ctx.imp.model
    cond_index, body_index = ctx.opt("cond_subgraph_index"), ctx.opt("body_subgraph_index")
    for what, index in (("cond", cond_index), ("body", body_index)):
        if not 0 < index < len(model.subgraphs) or index == ctx.imp.subgraph.index:
            raise ModelFormatError(f"{ctx.where}: {what} subgraph index {index} is out of range "
                                   f"(the model has {len(model.subgraphs)} subgraphs)")
    carried = [ctx.tensor(k) for k in range(ctx.num_inputs)]
    if any(ctx.imp.is_quantized(t) for t in carried):
        raise UnsupportedOpError(f"{ctx.where}: quantized loop-carried tensors are not supported")
    body_sub = model.subgraphs[body_index]
    if len(body_sub.outputs) != len(carried) or len(ctx.op.outputs) != len(carried):
        raise ModelFormatError(f"{ctx.where}: body subgraph {body_index} returns {len(body_sub.outputs)} "
                               f"values, the WHILE carries {len(carried)}")
    initial = [ctx.raw(k) for k in range(ctx.num_inputs)]
    (cond_initial,) = _inline(ctx, cond_index, initial, ctx.imp.nodes)

    builder = ctx.imp.builder
    body_nodes: list[Node] = []
    iteration = Value(builder.fresh("while_iter"), "int64", ())
    cond_in = Value(builder.fresh("while_cond_in"), "bool", ())
    loop_vars = [Value(builder.fresh(f"{t.name}_loop"), t.dtype, _dims(body_sub.tensors[i]))
                 for t, i in zip(carried, body_sub.inputs, strict=True)]
    results = _inline(ctx, body_index, [v.name for v in loop_vars], body_nodes)
    (cond_out,) = _inline(ctx, cond_index, results, body_nodes)
    body_outputs, seen = [], {v.name for v in loop_vars} | {iteration.name, cond_in.name}
    for name, hint in zip([cond_out] + results, ["while_cond"] + [v.name for v in loop_vars], strict=True):
        if name in seen or name in builder.initializers:
            renamed = builder.fresh(f"{hint}_next")
            body_nodes.append(Node("Identity", [name], [renamed], name=builder.fresh(f"{renamed}_node")))
            name = renamed
        seen.add(name)
        body_outputs.append(name)
    out_types = [("bool", ())] + [(t.dtype, _dims(body_sub.tensors[i])) for t, i in zip(carried, body_sub.outputs, strict=True)]
    body = Graph(body_nodes, [iteration, cond_in] + loop_vars,
                 [Value(n, dt, shape) for n, (dt, shape) in zip(body_outputs, out_types, strict=True)],
                 opset={"": OPSET}, name=body_sub.name)
    ctx.emit("Loop", ["", cond_initial] + initial, [ctx.out(k) for k in range(len(carried))], body=body)
