"""Shape and dtype inference.

ONNX-domain ops use ONNX's own shape inference (``onnx.shape_inference`` with data
propagation, so shape subgraphs such as ``Shape -> Gather -> Concat -> Reshape`` resolve and
symbolic batch dims such as ``"N"`` survive). Ops of the ``edgeinfer`` domain register a type
rule here with ``@type_rule``; inference alternates between the two until nothing changes.

Large float initializers are handed to ONNX as typed graph inputs rather than copied into the
protobuf: inference needs their shapes, not their bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx

from edgeinfer.ir import dtypes
from edgeinfer.ir.graph import Graph, Node, Value
from edgeinfer.ir.onnx_io import array_to_tensor, graph_to_model
from edgeinfer.registry import OpRegistry

TypeRule = Callable[[Node, Sequence[Value]], Sequence[tuple]]
TYPE_RULES: OpRegistry[TypeRule] = OpRegistry("type rule")
_INLINE_CONST_LIMIT = 4096  # elements; bigger float constants are passed by type only
# integer constants may be shapes, indices or axes whose values data propagation reads: inlined
# up to this many elements (a packed int4/int8 weight, far bigger, is passed by type only)
_INLINE_INT_LIMIT = 1 << 16


def type_rule(op_type: str, domain: str):
    """Register ``fn(node, input_values) -> [(dtype, shape), ...]`` for a non-ONNX op."""
    return TYPE_RULES.decorator(op_type, domain=domain)


def _inference_model(graph: Graph) -> onnx.ModelProto:
    model = graph_to_model(graph, include_initializers=False)
    for opset in model.opset_import:
        # ONNX propagates Shape's data (Shape -> Slice -> Concat -> Reshape) only from Shape-15;
        # without start/end Shape-15 is Shape-13, and no op changed meaning from 13 to 15
        if opset.domain in ("", "ai.onnx") and 13 <= opset.version < 15:
            opset.version = 15
    for info, value in zip(model.graph.output, graph.outputs):
        if not value.is_static:  # ONNX keeps a declared output type as it is; let it infer one
            info.ClearField("type")
    for name, array in graph.initializers.items():
        small = array.size <= (_INLINE_INT_LIMIT if array.dtype.kind in "iub" else _INLINE_CONST_LIMIT)
        if small:
            model.graph.initializer.append(array_to_tensor(array, name))
        else:
            info = model.graph.input.add()
            info.name = name
            info.type.CopyFrom(dtypes.type_to_onnx(dtypes.name_of(array.dtype), array.shape))
    return model


def _merge(value: Value, dtype: str | None, shape) -> bool:
    """Fill what is unknown in ``value`` from an inferred type; True if anything changed."""
    changed = False
    if value.dtype is None and dtype is not None:
        value.dtype, changed = dtype, True
    if shape is None:
        return changed
    if value.shape is None or len(value.shape) != len(shape):
        # a declared rank that the ops do not produce is a stale claim of the exporter (ddddocr
        # declares a rank-2 output its Reshape makes rank 3; onnxruntime warns and runs it)
        value.shape = tuple(shape)
        return True
    merged = tuple(old if isinstance(old, int) or (isinstance(old, str) and not isinstance(new, int))
                   else new if new is not None else old for old, new in zip(value.shape, shape))
    if merged != value.shape:
        value.shape, changed = merged, True
    return changed


def _run_onnx_inference(graph: Graph) -> bool:
    model = _inference_model(graph)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False,
                                                     data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError):
        return False
    changed = False
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        value = graph.values.get(info.name)
        if value is not None and value.const is None:
            changed |= _merge(value, *dtypes.type_from_onnx(info.type))
    return changed


def _run_custom_rules(graph: Graph) -> bool:
    changed = False
    for node in graph.nodes:
        rule = TYPE_RULES.lookup(node.op_type, domain=node.domain)
        if rule is None:
            continue
        inputs = [graph.values[i] if i else Value("") for i in node.inputs]
        if any(v.name and v.dtype is None for v in inputs):
            continue
        for name, (dtype, shape) in zip(node.outputs, rule(node, inputs)):
            if name:
                changed |= _merge(graph.values[name], dtype, shape)
    return changed


def infer_types(graph: Graph, max_rounds: int = 8) -> Graph:
    """Fill in dtype and shape of every value that can be inferred (in place; returns graph)."""
    from edgeinfer.ir import (
        contrib_ops,  # noqa: F401  (registers the com.microsoft type rules)
        lowering,  # noqa: F401  (registers the edgeinfer-domain type rules)
    )

    has_custom = any(node.domain and (node.domain, node.op_type) in TYPE_RULES for node in graph.nodes)
    for _ in range(max_rounds):
        changed = _run_onnx_inference(graph)
        if has_custom:
            changed |= _run_custom_rules(graph)
        if not changed or not has_custom:
            break
    return graph


def static_shape(shape, batch: dict[str, int] | None = None) -> tuple[int, ...] | None:
    """Resolve a symbolic shape with ``batch`` (symbol -> size); None if anything stays unknown."""
    if shape is None:
        return None
    out = []
    for dim in shape:
        if isinstance(dim, (int, np.integer)):
            out.append(int(dim))
        elif isinstance(dim, str) and batch and dim in batch:
            out.append(batch[dim])
        else:
            return None
    return tuple(out)
