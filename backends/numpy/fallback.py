"""The long tail of ops: run them with ``onnx.reference`` kernels.

Each fallback node is compiled once into a one-node ``ReferenceEvaluator`` (with the
model's opsets, and the outer-scope names its subgraphs read passed in as extra inputs).
The backend reports which ops used this path.
"""

from __future__ import annotations

import importlib

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from edgeinfer.errors import BackendError, UnsupportedOpError
from edgeinfer.ir import Graph, Node, dtypes
from edgeinfer.ir.onnx_io import attr_to_proto


class ReferenceNode:
    def __init__(self, node: Node, graph: Graph):
        self.node = node
        self.extra_inputs = sorted(set().union(*(s.outer_names() for s in node.subgraphs())) - set(node.inputs))
        self.input_names = [n for n in node.inputs] + self.extra_inputs
        proto_node = helper.make_node(node.op_type, list(node.inputs), list(node.outputs),
                                      domain=node.domain or None, name=node.name or None)
        proto_node.attribute.extend(attr_to_proto(k, v, graph.opset) for k, v in node.attrs.items())
        feeds = [n for n in dict.fromkeys(self.input_names) if n]
        proto_graph = helper.make_graph([proto_node], "fallback",
                                        [_typed_info(graph, n) for n in feeds],
                                        [_typed_info(graph, o) for o in node.outputs if o])
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(graph.opset.items())]
        model = helper.make_model(proto_graph, opset_imports=opsets)
        model.ir_version = onnx.IR_VERSION
        self.feed_names = feeds
        try:
            self.evaluator = ReferenceEvaluator(model)
        except Exception as exc:
            raise UnsupportedOpError(f"{node.label}: no numpy kernel and onnx.reference cannot run it "
                                     f"({type(exc).__name__}: {exc})") from exc

    def __call__(self, values: dict[str, object]) -> list[np.ndarray]:
        feeds = {n: values[n] for n in self.feed_names}
        try:
            return self.evaluator.run(None, feeds)
        except Exception as exc:
            raise BackendError(f"{self.node.label} failed in the onnx.reference fallback: "
                               f"{type(exc).__name__}: {exc}") from exc


def _typed_info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    """The value's type where known: onnx.reference expands context-dependent function ops
    (e.g. Gelu-20) only when their input types are declared."""
    value = graph.values.get(name)
    if value is None or value.dtype is None:
        return helper.make_empty_tensor_value_info(name)
    info = onnx.ValueInfoProto()
    info.name = name
    info.type.CopyFrom(dtypes.type_to_onnx(value.dtype, None))
    return info


# domain -> the onnx.reference module whose load_op serves it
_REFERENCE_LOADERS = {"": "onnx.reference.ops", "ai.onnx.ml": "onnx.reference.ops.aionnxml",
                      "ai.onnx.preview": "onnx.reference.ops.aionnx_preview",
                      "ai.onnx.preview.training": "onnx.reference.ops.aionnx_preview_training"}


def reference_supports(node: Node, opset: dict[str, int]) -> str | None:
    """None if onnx.reference has an implementation for this op at this opset."""
    if node.domain not in _REFERENCE_LOADERS:
        return f"no numpy kernel, and onnx.reference has no ops of domain {node.domain!r}"
    try:
        load_op = importlib.import_module(_REFERENCE_LOADERS[node.domain]).load_op
        load_op(node.domain, node.op_type, opset.get(node.domain, 1))
    except Exception as exc:  # onnx raises RuntimeError / NotImplementedError / ValueError
        return f"no numpy kernel and no onnx.reference kernel ({exc})".split("\n")[0]
    return None
