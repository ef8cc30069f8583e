"""onnxruntime's ahead-of-time form of a part: the exported model, weights left where they are.

``make_artifact`` runs at ``edgeinfer compile``: the part's graph as onnxruntime gets it (lowered,
int8 weights rewritten where this CPU's kernels saturate), serialized without the large
initializers that are the IR's own arrays; those are listed by name (``facts["reads"]``: the
IR weights an artifact reads at load, whatever its kind). ``assemble`` runs at load,
with no onnx import: each listed weight becomes an external-data placeholder (a reference into
the mapped ``.eim``, or an ``OrtValue`` handed over in memory, as ``backend._export`` routes
them) encoded here in protobuf's wire format and appended to the stored graph, which protobuf
reads as the same repeated ``initializer`` field.

Wire format (protobuf's encoding guide): a field is a varint key (``number << 3 | wire type``),
then a varint (type 0) or a varint length and that many bytes (type 2). ``ModelProto.graph`` is
field 7, ``GraphProto.initializer`` field 5; ``TensorProto`` fields used: ``dims`` 1,
``data_type`` 2, ``name`` 8, ``external_data`` 13 (``StringStringEntryProto`` key 1, value 2),
``data_location`` 14 (``EXTERNAL`` = 1). A test checks the bytes against onnx's own messages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeinfer.backend import Artifact
from edgeinfer.errors import BackendError
from edgeinfer.ir import Graph, dtypes

from .backend import ARTIFACT_KIND

_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_DIMS, _DATA_TYPE, _NAME, _EXTERNAL_DATA, _DATA_LOCATION = 1, 2, 8, 13, 14
_EXTERNAL = 1


def make_artifact(source: Graph, executable: Any) -> Artifact:
    """The artifact of ``executable`` (an ``OnnxRuntimeExecutable`` compiled from ``source``)."""
    from edgeinfer.ir.onnx_io import array_to_tensor, graph_to_model, name_exported_nodes

    from .backend import _SHAREABLE_KINDS, EXTERNAL_MIN_BYTES

    graph = executable.graph  # as onnxruntime got it
    model = graph_to_model(graph, include_initializers=False, value_info=False)
    labels = {name: node.label for name, node in name_exported_nodes(model, graph).items()}
    external = []
    for name, array in graph.initializers.items():
        own = source.initializers.get(name) is array  # the IR's array, in the file at load
        if own and array.dtype.kind in _SHAREABLE_KINDS and array.nbytes >= EXTERNAL_MIN_BYTES:
            external.append(name)
        else:
            model.graph.initializer.append(array_to_tensor(array, name))
    graph_bytes = model.graph.SerializeToString()
    model.ClearField("graph")
    prefix = model.SerializeToString()
    facts = {"prefix_bytes": len(prefix), "reads": external, "nodes": labels,
             "integer_path": executable.integer_path}
    return Artifact(ARTIFACT_KIND, prefix + graph_bytes, facts)


def assemble(artifact: Artifact, graph: Graph, files: bool | str = True) -> tuple[bytes, Any]:
    """The model bytes to hand to onnxruntime and the ``WeightRoutes`` of the listed weights
    (``files``: True to reference weights in their mapped file, else why not)."""
    from .backend import WeightRoutes, _main_folder, _memory_reason, _raw_span

    facts = artifact.facts
    data = bytes(artifact.data)
    split = facts["prefix_bytes"]
    prefix, graph_bytes = data[:split], data[split:]
    routes = WeightRoutes()
    arrays = {}
    for name in facts["reads"]:
        array = graph.initializers.get(name)
        if array is None:
            raise BackendError(f"the artifact of graph {graph.name!r} reads weight {name!r}, which the graph does "
                               "not hold (an artifact of another part)")
        arrays[name] = array
    spans = {name: span for name, array in arrays.items() if files is True and (span := _raw_span(array)) is not None}
    routes.folder = _main_folder(spans.values())
    extra = []
    for name, array in arrays.items():
        span = spans.get(name)
        if span is not None and os.path.dirname(span.path) == routes.folder:
            extra.append(_placeholder(name, array, {"location": os.path.basename(span.path),
                                                    "offset": str(span.offset), "length": str(span.nbytes)}))
            routes.files.append(span)
            routes.add("file", span.nbytes)
        else:
            extra.append(_placeholder(name, array, {"location": "edgeinfer-in-memory"}))
            routes.names.append(name)
            routes.arrays.append(np.ascontiguousarray(array))
            routes.add("memory", array.nbytes)
            reason = _memory_reason(array, span, files)
            routes.reasons[reason] = routes.reasons.get(reason, 0) + int(array.nbytes)
    graph_bytes += b"".join(_field(_GRAPH_INITIALIZER, tensor) for tensor in extra)
    return prefix + _field(_MODEL_GRAPH, graph_bytes), routes


def _placeholder(name: str, array: np.ndarray, location: Mapping[str, str]) -> bytes:
    """A ``TensorProto`` of ``array``'s type and shape whose data is external (``location``)."""
    out = bytearray()
    for dim in array.shape:
        out += _varint(_DIMS << 3) + _varint(int(dim))
    out += _varint(_DATA_TYPE << 3) + _varint(dtypes.to_onnx(dtypes.name_of(array.dtype)))
    out += _field(_NAME, name.encode("utf-8", "surrogatepass"))
    for key, value in location.items():
        out += _field(_EXTERNAL_DATA, _field(1, key.encode()) + _field(2, value.encode("utf-8", "surrogatepass")))
    out += _varint(_DATA_LOCATION << 3) + _varint(_EXTERNAL)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)
