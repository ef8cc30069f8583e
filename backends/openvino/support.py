"""Which nodes OpenVINO can run, asked of OpenVINO itself, node by node.

OpenVINO publishes no list of the ONNX ops its frontend converts that a program can read, and
whether a conversion works depends on more than the op: ``Conv`` needs an input of known rank,
``Col2Im`` integer sizes, a ``Reshape`` a shape input of known length. So instead of a table
that would drift from the installed version, ``node_reason`` asks the frontend: the node
alone, with its input types and constant inputs, becomes a one-node ONNX model, and the
frontend converts it. A converted node is supported; otherwise the reason is the frontend's
own ("no conversion rule for Foo-17", or the check that failed). On a device other than the
CPU, ``Core.query_model`` then says whether that device's plugin runs every op of the
result (the CPU plugin runs every op of OpenVINO's opsets, and the query costs tens of
milliseconds, so the CPU skips it).

When the node's input types are unknown (no shape inference ran) the probe can only say
whether a conversion rule exists: a failure other than "no rule" then counts as supported,
and ``compile`` reports the real error, naming the node.

Answers are cached by what they depend on: the device, op, domain, opsets, attributes, input
types (symbolic dims as unknown) and the values of small constant inputs. A model's repeated
layers cost one probe; one probe costs about a millisecond.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from edgeinfer.ir import Graph, Node, Value

from .convert import _NO_RULE, explain, export, read_onnx

SMALL_CONST_BYTES = 4096  # constant inputs up to this size are part of the cache key by value
_CACHE_LIMIT = 20_000
_cache: dict[tuple, str | None] = {}
_cache_lock = threading.Lock()
_SKIPPED_BY_QUERY = ("Parameter", "Result", "Constant")


def node_reason(node: Node, graph: Graph, device_name: str,
                query_model: Callable[[Any, str], dict[str, str]]) -> str | None:
    """None if OpenVINO converts ``node`` of ``graph`` and ``device_name`` runs it, else why not."""
    key = (device_name, _node_key(node, graph))
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    reason = _probe(node, graph, device_name, query_model)
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = reason
    return reason


def _probe(node: Node, graph: Graph, device_name: str,
           query_model: Callable[[Any, str], dict[str, str]]) -> str | None:
    probe, typed = _probe_graph(node, graph)
    model_bytes, _, buffers = export(probe)  # buffers: kept alive until the probe is done
    try:
        model = read_onnx(model_bytes)
    except Exception as exc:  # the frontend's own exception types
        if not typed and not _NO_RULE.search(str(exc)):
            return None
        return f"OpenVINO's ONNX frontend cannot convert it: {explain(exc)}"
    if device_name == "CPU":
        return None
    try:
        placed = query_model(model, device_name)
    except Exception as exc:
        return f"OpenVINO's {device_name} plugin cannot take it: {explain(exc)}"
    missing = sorted({op.get_type_name() for op in model.get_ordered_ops()
                      if op.get_type_name() not in _SKIPPED_BY_QUERY and op.get_friendly_name() not in placed})
    if missing:
        return f"OpenVINO's {device_name} plugin does not run {', '.join(missing)} (what the node converts to)"
    return None


def _reads(node: Node) -> list[str]:
    outer = set().union(*(sub.outer_names() for sub in node.subgraphs()))
    return [name for name in dict.fromkeys([*node.inputs, *sorted(outer)]) if name]


def _probe_graph(node: Node, graph: Graph) -> tuple[Graph, bool]:
    """``node`` alone as a self-contained graph, and whether all its inputs are typed."""
    inputs: list[Value] = []
    constants: dict[str, np.ndarray] = {}
    for name in _reads(node):
        value = graph.values.get(name)
        if value is not None and value.const is not None:
            constants[name] = value.const
        else:
            inputs.append(value.typed_like() if value is not None else Value(name))
    outputs = [graph.values[o].typed_like() if o in graph.values else Value(o) for o in node.outputs if o]
    typed = all(v.dtype is not None and v.shape is not None for v in inputs)
    opset = dict(graph.opset)
    opset.setdefault("", onnx.defs.onnx_opset_version())
    return Graph([node], inputs, outputs, constants, opset=opset, name=f"openvino_probe_{node.op_type}"), typed


def _node_key(node: Node, graph: Graph) -> tuple:
    attrs = tuple(sorted((name, _attr_token(value)) for name, value in node.attrs.items()))
    reads = tuple(_value_token(graph.values.get(name)) for name in _reads(node))
    inputs = tuple(bool(name) for name in node.inputs)
    outputs = tuple(bool(name) for name in node.outputs)
    return (node.domain, node.op_type, tuple(sorted(graph.opset.items())), attrs, reads, inputs, outputs)


def _value_token(value: Value | None) -> tuple | None:
    if value is None:
        return None
    shape = None if value.shape is None else tuple(d if isinstance(d, int) else None for d in value.shape)
    if value.const is None:
        return ("var", value.dtype, shape)
    small = value.const.nbytes <= SMALL_CONST_BYTES
    return ("const", value.dtype, shape, _array_digest(value.const) if small else None)


def _array_digest(array: np.ndarray) -> str:
    if array.dtype == object:
        return hashlib.sha1(repr(array.tolist()).encode()).hexdigest()
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


def _attr_token(value: Any) -> Any:
    if isinstance(value, Graph):
        return ("graph", value.content_hash())
    if isinstance(value, np.ndarray):
        return ("tensor", str(value.dtype), value.shape, _array_digest(value))
    if isinstance(value, tuple):
        return tuple(_attr_token(item) for item in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value

