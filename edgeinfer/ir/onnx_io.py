"""Lossless translation between the IR and ONNX protobuf messages.

This is the core of the ONNX bridge: the IR's op semantics *are* ONNX's, so a graph maps to a
``GraphProto`` node for node. File handling (external data, opset upgrades, validation of
what users hand us) lives in ``edgeinfer.converters.onnx``; backends and the CLI's
``export`` use ``graph_to_model`` from here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from edgeinfer import limits
from edgeinfer.errors import ModelFormatError, UnsupportedOpError
from edgeinfer.ir import dtypes
from edgeinfer.ir.graph import EDGEINFER_DOMAIN, Graph, Node, Value

EDGEINFER_OPSET_VERSION = 1
PRODUCER_NAME = "edgeinfer"


# -- ONNX -> IR --------------------------------------------------------------------------------
def tensor_to_array(tensor: onnx.TensorProto, where: str = "") -> np.ndarray:
    """``TensorProto`` -> numpy array (external data must already be loaded)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelFormatError(f"tensor {tensor.name!r}{where}: external data was not loaded")
    _check_int32_data_range(tensor, where)
    try:
        array = numpy_helper.to_array(tensor)
    except Exception as exc:  # onnx raises ValueError/TypeError/KeyError on malformed data
        raise ModelFormatError(f"tensor {tensor.name!r}{where}: cannot decode data ({exc})") from exc
    if array.dtype.kind in "SU":
        array = array.astype(object)
    if array.dtype == object:
        array = np.vectorize(lambda s: s.decode("utf-8") if isinstance(s, bytes) else s,
                             otypes=[object])(array) if array.size else array
    return array


# small integer types that ONNX stores widened in int32_data, where numpy_helper would wrap
# (uint8 300 -> 44) or clip a value out of their range without a word
_NARROW_INTS = {onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8,
                onnx.TensorProto.INT16: np.int16, onnx.TensorProto.UINT16: np.uint16}


def _check_int32_data_range(tensor: onnx.TensorProto, where: str) -> None:
    kind = _NARROW_INTS.get(tensor.data_type)
    if kind is None or not len(tensor.int32_data):
        return
    values = np.asarray(tensor.int32_data, dtype=np.int64)
    info = np.iinfo(kind)
    if values.min() < info.min or values.max() > info.max:
        bad = int(values[(values < info.min) | (values > info.max)][0])
        raise ModelFormatError(f"tensor {tensor.name!r}{where}: expected {np.dtype(kind).name} values in "
                               f"[{info.min}, {info.max}], found {bad}")


def _attr_from_proto(attr: AttributeProto, where: str, opset: Mapping[str, int]) -> Any:
    kind = attr.type
    if kind == AttributeProto.FLOAT:
        return float(attr.f)
    if kind == AttributeProto.INT:
        return int(attr.i)
    if kind == AttributeProto.STRING:
        return _decode(attr.s)
    if kind == AttributeProto.TENSOR:
        return tensor_to_array(attr.t, where)
    if kind == AttributeProto.GRAPH:
        return graph_from_proto(attr.g, opset)
    if kind == AttributeProto.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if kind == AttributeProto.INTS:
        return tuple(int(v) for v in attr.ints)
    if kind == AttributeProto.STRINGS:
        return tuple(_decode(v) for v in attr.strings)
    if kind == AttributeProto.TENSORS:
        return tuple(tensor_to_array(t, where) for t in attr.tensors)
    if kind == AttributeProto.GRAPHS:
        return tuple(graph_from_proto(g, opset) for g in attr.graphs)
    if kind == AttributeProto.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, where)
    if kind == AttributeProto.TYPE_PROTO:
        return dtypes.TypeSpec(*dtypes.type_from_onnx(attr.tp))
    raise UnsupportedOpError(f"attribute {attr.name!r}{where}: attribute type "
                             f"{AttributeProto.AttributeType.Name(kind)} is not supported")


def _sparse_to_dense(sparse: onnx.SparseTensorProto, where: str) -> np.ndarray:
    values = tensor_to_array(sparse.values, where)
    indices = tensor_to_array(sparse.indices, where)
    dims = tuple(int(d) for d in sparse.dims)
    elements = math.prod(dims)
    if any(d < 0 for d in dims) or elements > limits.MAX_TENSOR_ELEMENTS or len(dims) > limits.MAX_RANK:
        raise ModelFormatError(f"sparse tensor {sparse.values.name!r}{where}: expected non-negative dims, at most "
                               f"{limits.MAX_RANK} of them and at most {limits.MAX_TENSOR_ELEMENTS} elements once "
                               f"dense, found dims {list(dims)}")
    dense = np.zeros(dims, dtype=values.dtype)
    try:
        if indices.ndim == 1:
            dense.reshape(-1)[indices] = values
        else:
            dense[tuple(indices.T)] = values
    except (IndexError, ValueError) as exc:
        raise ModelFormatError(f"sparse tensor {sparse.values.name!r}{where}: indices of shape {indices.shape} "
                               f"and values of shape {values.shape} do not fit dims {list(dims)} ({exc})") from None
    return dense


def _decode(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _value_from_info(info: onnx.ValueInfoProto) -> Value:
    dtype, shape = dtypes.type_from_onnx(info.type)
    return Value(info.name, dtype, shape)


def graph_from_proto(proto: onnx.GraphProto, opset: Mapping[str, int]) -> Graph:
    """``GraphProto`` -> ``Graph`` (subgraphs included; external data must be loaded)."""
    inits: dict[str, np.ndarray] = {}
    for tensor in proto.initializer:
        inits[tensor.name] = tensor_to_array(tensor, f" in graph {proto.name!r}")
    for sparse in proto.sparse_initializer:
        inits[sparse.values.name] = _sparse_to_dense(sparse, f" in graph {proto.name!r}")
    # Before IR v4 initializers were also listed as graph inputs; such inputs are constants.
    inputs = [_value_from_info(i) for i in proto.input if i.name not in inits]
    nodes = []
    for index, node in enumerate(proto.node):
        where = f" of node {node.name or index!r} ({node.op_type}) in graph {proto.name!r}"
        attrs = {a.name: _attr_from_proto(a, where, opset) for a in node.attribute}
        nodes.append(Node(node.op_type, list(node.input), list(node.output), attrs,
                          domain=node.domain, name=node.name))
    return Graph(nodes, inputs, [_value_from_info(o) for o in proto.output], inits,
                 value_info=[_value_from_info(v) for v in proto.value_info], opset=opset,
                 name=proto.name or "main")


def opset_of(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain in ("", "ai.onnx") else o.domain): int(o.version) for o in model.opset_import}


def graph_from_model(model: onnx.ModelProto) -> Graph:
    """``ModelProto`` -> ``Graph``; model metadata is kept in ``graph.metadata``."""
    graph = graph_from_proto(model.graph, opset_of(model))
    graph.metadata.update({p.key: p.value for p in model.metadata_props})
    if model.producer_name:
        graph.metadata.setdefault("source_producer", model.producer_name)
    return graph


# -- IR -> ONNX --------------------------------------------------------------------------------
def array_to_tensor(array: np.ndarray, name: str = "") -> onnx.TensorProto:
    if array.dtype == object:
        tensor = helper.make_tensor(name, onnx.TensorProto.STRING, array.shape,
                                    [s.encode("utf-8") if isinstance(s, str) else s for s in array.reshape(-1)])
        return tensor
    return numpy_helper.from_array(np.asarray(array), name)


def attr_to_proto(name: str, value: Any, opset: Mapping[str, int]) -> AttributeProto:
    if isinstance(value, Graph):
        return helper.make_attribute(name, graph_to_proto(value, opset))
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, array_to_tensor(value))
    if isinstance(value, dtypes.TypeSpec):
        return helper.make_attribute(name, dtypes.type_to_onnx(value.dtype, value.shape))
    if isinstance(value, tuple):
        if value and isinstance(value[0], Graph):
            return helper.make_attribute(name, [graph_to_proto(g, opset) for g in value])
        if value and isinstance(value[0], np.ndarray):
            return helper.make_attribute(name, [array_to_tensor(t) for t in value])
        if not value:
            attr = AttributeProto()
            attr.name = name
            attr.type = AttributeProto.INTS  # an empty list; ONNX cannot tell its kind
            return attr
        return helper.make_attribute(name, list(value))
    if isinstance(value, (bool, np.bool_)):
        return helper.make_attribute(name, int(value))
    if isinstance(value, np.generic):
        return helper.make_attribute(name, value.item())
    return helper.make_attribute(name, value)


def _info(value: Value) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto()
    info.name = value.name
    if value.dtype is not None:
        info.type.CopyFrom(dtypes.type_to_onnx(value.dtype, value.shape))
    return info


def graph_to_proto(graph: Graph, opset: Mapping[str, int] | None = None, *,
                   include_initializers: bool = True, value_info: bool = True) -> onnx.GraphProto:
    proto = onnx.GraphProto()
    proto.name = graph.name
    proto.input.extend(_info(v) for v in graph.inputs)
    proto.output.extend(_info(v) for v in graph.outputs)
    if include_initializers:
        proto.initializer.extend(array_to_tensor(a, n) for n, a in graph.initializers.items())
    if value_info:
        proto.value_info.extend(_info(v) for v in graph.value_info())
    for node in graph.nodes:
        proto.node.append(helper.make_node(
            node.op_type, list(node.inputs), list(node.outputs), name=node.name or None,
            domain=node.domain or None))
        proto.node[-1].attribute.extend(attr_to_proto(k, v, opset or graph.opset)
                                        for k, v in node.attrs.items())
    return proto


def graph_to_model(graph: Graph, *, include_initializers: bool = True,
                   value_info: bool = True) -> onnx.ModelProto:
    """``Graph`` -> ``ModelProto`` with opset imports for every domain the graph uses."""
    opset = dict(graph.opset)
    opset.setdefault("", onnx.defs.onnx_opset_version())
    for node in _all_nodes(graph):
        if node.domain and node.domain not in opset:
            opset[node.domain] = EDGEINFER_OPSET_VERSION if node.domain == EDGEINFER_DOMAIN else 1
    imports = [helper.make_opsetid(domain, version) for domain, version in sorted(opset.items())]
    model = helper.make_model(graph_to_proto(graph, opset, include_initializers=include_initializers,
                                             value_info=value_info),
                              opset_imports=imports, producer_name=PRODUCER_NAME)
    model.ir_version = min(onnx.IR_VERSION, max(helper.find_min_ir_version_for(
        [o for o in imports if o.domain in ("", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training")],
        ignore_unknown=True), 7))
    for key, val in graph.metadata.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, str(val)
    return model


def _all_nodes(graph: Graph):
    for node in graph.nodes:
        yield node
        for sub in node.subgraphs():
            yield from _all_nodes(sub)


def name_exported_nodes(model: onnx.ModelProto, graph: Graph) -> dict[str, Node]:
    """Give every node of ``model`` (exported from ``graph``, node for node) a unique name, so an
    engine's error messages can name it; returns exported name -> IR node."""
    taken = {node.name for node in graph.nodes if node.name}
    names: dict[str, Node] = {}
    for index, (proto, node) in enumerate(zip(model.graph.node, graph.nodes, strict=True)):
        if not node.name or node.name in names:
            candidate = f"{node.op_type}_{index}"
            while candidate in taken:
                candidate += "_"
            taken.add(candidate)
            proto.name = candidate
        names[proto.name] = node
    return names


def schema_reason(node: Node, graph: Graph) -> str | None:
    """None if ONNX defines ``node``'s op at the graph's opset of its domain, else why not."""
    version = graph.opset.get(node.domain, onnx.defs.onnx_opset_version())
    try:
        onnx.defs.get_schema(node.op_type, max_inclusive_version=version, domain=node.domain)
    except onnx.defs.SchemaError:
        return f"op {node.op_type!r} is not defined by ONNX at opset {version} of domain {node.domain or 'ai.onnx'!r}"
    return None


def external_placeholder(name: str, array: np.ndarray, location: Mapping[str, str]) -> onnx.TensorProto:
    """An initializer whose data an engine gets elsewhere (``location``: its external_data
    entries), of ``array``'s type and shape: weights handed over in memory, not serialized."""
    tensor = onnx.TensorProto()
    tensor.name = name
    tensor.data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
    tensor.dims.extend(array.shape)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in location.items():
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor
