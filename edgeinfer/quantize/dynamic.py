"""Dynamic quantization: int8 weights, activations quantized at run time (no calibration).

For MatMul and Gemm with a constant 2-D weight (the bulk of a transformer), in standard ONNX
ops, the layout onnxruntime fuses into its DynamicQuantizeMatMul kernel::

    A -> DynamicQuantizeLinear -> (A_q uint8, A_scale, A_zp)
    MatMulInteger(A_q, W_q int8 [K, N], A_zp, W_zp int8 [N]) -> int32
    -> Cast(float) -> Mul(., Mul(A_scale, W_scale [N])) [-> Add(beta * C)]

Weights are symmetric int8 per output column (or per tensor). Gemm's ``transB`` is applied
to the stored weight and ``alpha`` folded into ``W_scale``; a Gemm with ``transA`` stays
float. Fused ``edgeinfer`` matmul ops are lowered first (``prepare_graph``).
"""

from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto

from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.infer import infer_types
from edgeinfer.model import Model
from edgeinfer.quantize.qdq import layer_name, quantize_values, weight_params, weight_type, weights_summary
from edgeinfer.quantize.static import _graph_of, prepare_graph

DYNAMIC_OPS = ("MatMul", "Gemm")


def _weight_of(node: Node, graph: Graph) -> np.ndarray | None:
    """The [K, N] float32 weight of a MatMul/Gemm, or None if it cannot be quantized here."""
    if node.domain or node.op_type not in DYNAMIC_OPS or len(node.inputs) < 2:
        return None
    weight = graph.values.get(node.inputs[1])
    a = graph.values.get(node.inputs[0])
    if weight is None or weight.const is None or weight.const.ndim != 2 or weight.const.dtype != np.float32:
        return None
    if a is None or a.dtype != "float32":
        return None
    if node.op_type == "Gemm":
        if int(node.attrs.get("transA", 0)):
            return None
        return weight.const.T if int(node.attrs.get("transB", 0)) else weight.const
    return weight.const


def quantize_dynamic(model, *, per_channel: bool = True, exclude=(), reduce_range: bool = False) -> Model:
    """``model`` with every MatMul/Gemm over a constant weight dynamically quantized;
    ``reduce_range``: 7-bit weights (see ``edgeinfer.quantize.quantize``)."""
    source = model if isinstance(model, Model) else Model(_graph_of(model))
    graph = prepare_graph(_graph_of(model))
    excluded = set(exclude)
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}

    def fresh(base: str) -> str:
        name, index = base, 0
        while name in taken:
            index += 1
            name = f"{base}_{index}"
        taken.add(name)
        return name

    nodes: list[Node] = []
    inits = graph.initializers
    infos: list[Value] = []
    quantized_inputs: dict[str, tuple[str, str, str]] = {}  # one DynamicQuantizeLinear per activation
    layers = []
    for node in graph.nodes:
        weight = None if layer_name(node) in excluded else _weight_of(node, graph)
        if weight is None:
            nodes.append(node)
            continue
        layers.append(layer_name(node))
        a, y = node.inputs[0], node.outputs[0]
        if a not in quantized_inputs:
            names = (fresh(f"{a}_quantized"), fresh(f"{a}_scale"), fresh(f"{a}_zero_point"))
            nodes.append(Node("DynamicQuantizeLinear", [a], list(names), name=fresh(f"{a}_DynamicQuantizeLinear")))
            infos += [Value(names[0], "uint8", graph.values[a].shape), Value(names[1], "float32", ()),
                      Value(names[2], "uint8", ())]
            quantized_inputs[a] = names
        a_q, a_scale, a_zp = quantized_inputs[a]
        params = weight_params(weight, 1 if per_channel else -1, weight_type(reduce_range))
        w_q = fresh(f"{node.inputs[1]}_quantized")
        w_zp = fresh(f"{node.inputs[1]}_zero_point")
        w_scale = fresh(f"{node.inputs[1]}_scale")
        inits[w_q] = quantize_values(weight, params)
        inits[w_zp] = params.zero_point
        alpha = float(node.attrs.get("alpha", 1.0)) if node.op_type == "Gemm" else 1.0
        inits[w_scale] = (params.scale.astype(np.float64) * alpha).astype(np.float32)
        product, as_float, scales = fresh(f"{y}_int32"), fresh(f"{y}_float"), fresh(f"{y}_scale")
        bias = node.inputs[2] if node.op_type == "Gemm" and len(node.inputs) > 2 else ""
        scaled = fresh(f"{y}_unbiased") if bias else y
        nodes += [Node("MatMulInteger", [a_q, w_q, a_zp, w_zp], [product], name=fresh(f"{layer_name(node)}_MatMulInteger")),
                  Node("Cast", [product], [as_float], {"to": TensorProto.FLOAT}),
                  Node("Mul", [a_scale, w_scale], [scales]),
                  Node("Mul", [as_float, scales], [scaled])]
        if bias:
            beta = float(node.attrs.get("beta", 1.0))
            if beta != 1.0:
                constant = graph.values[bias].const
                scaled_bias = fresh(f"{bias}_beta")
                if constant is not None:
                    inits[scaled_bias] = (constant * beta).astype(np.float32)
                else:
                    beta_name = fresh(f"{y}_beta")
                    inits[beta_name] = np.array(beta, np.float32)
                    nodes.append(Node("Mul", [bias, beta_name], [scaled_bias]))
                bias = scaled_bias
            nodes.append(Node("Add", [scaled, bias], [y]))
    used = {i for n in nodes for i in n.inputs if i} | set(graph.output_names)
    inits = {k: v for k, v in inits.items() if k in used}
    produced = {o for n in nodes for o in n.outputs if o}
    summary = {"mode": "dynamic", "weights": weights_summary(per_channel, reduce_range),
               "layers": len(layers), "excluded": sorted(excluded)}
    metadata = {**graph.metadata, "quantization": json.dumps(summary, sort_keys=True)}
    result = Graph(nodes, list(graph.inputs), list(graph.outputs), inits,
                   value_info=[v.typed_like() for v in graph.value_info() if v.name in produced] + infos,
                   opset=graph.opset, name=graph.name, metadata=metadata)
    result = infer_types(result)
    result.verify()
    return Model(result, {**source.metadata, "quantization": metadata["quantization"]})
