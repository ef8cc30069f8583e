"""FP16 weight storage: float32 weights stored as float16, cast back to float32 at load.

Halves the weight bytes of a float model (or of the layers an int8 model keeps in float)
while every op still computes in float32: each converted initializer ``W`` becomes ``W_fp16``
(float16) feeding a ``Cast(to=float)`` that produces ``W``. Engines fold that Cast when the
session is built (onnxruntime does), so run time is unchanged. Only weights of at least
``min_elements`` elements are converted, and never the scales of Quantize/DequantizeLinear
nor small constants that shape inference needs as values (Resize scales, Clip bounds).
"""

from __future__ import annotations

import json

import numpy as np
from onnx import TensorProto

from edgeinfer.ir import Graph, Node
from edgeinfer.model import Model

MIN_ELEMENTS = 256
_KEEP_FLOAT32_FOR = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")


def fp16_weights(model: Model | Graph, *, min_elements: int = MIN_ELEMENTS) -> Model:
    """``model`` with its large float32 weights stored as float16."""
    source = model if isinstance(model, Model) else Model(model)
    graph = source.graph
    taken = set(graph.values) | {n.name for n in graph.nodes if n.name}
    casts: list[Node] = []
    inits = graph.initializers
    converted = 0
    for name, array in graph.initializers.items():
        value = graph.values[name]
        if array.dtype != np.float32 or array.size < min_elements or name in graph.output_names:
            continue
        if not value.uses or any(node.op_type in _KEEP_FLOAT32_FOR for node, _ in value.uses):
            continue
        if np.any(np.abs(array) > np.finfo(np.float16).max):
            continue  # would overflow to inf
        stored = f"{name}_fp16"
        while stored in taken:
            stored += "_"
        taken.add(stored)
        del inits[name]
        inits[stored] = array.astype(np.float16)
        casts.append(Node("Cast", [stored], [name], {"to": TensorProto.FLOAT}, name=f"{stored}_Cast"))
        converted += 1
    if not converted:
        return source
    infos = [v.typed_like() for v in graph.value_info()] + [
        graph.values[n.outputs[0]].typed_like() for n in casts]
    result = Graph(casts + list(graph.nodes), list(graph.inputs), list(graph.outputs), inits,
                   value_info=infos, opset=graph.opset, name=graph.name, metadata=graph.metadata)
    result.verify()
    metadata = dict(source.metadata)
    metadata["weights_storage"] = json.dumps({"dtype": "float16", "tensors": converted})
    return Model(result, metadata)
