"""An IR graph into an ``openvino.Model``, through OpenVINO's ONNX frontend, in memory.

The graph is exported with ``graph_to_model`` and handed to the frontend as a stream; nothing
is written to disk. Large initializers are not serialized into the protobuf: each becomes an
external-data entry whose location is ``*/_ORT_MEM_ADDR_/*`` with ``offset`` = the address of
the numpy buffer and ``length`` = its size in bytes, the convention onnxruntime's OpenVINO
execution provider uses to pass weights it already holds. The frontend copies each buffer
once into its own constant (one copy instead of protobuf's two, serialize and parse) and the
2 GiB protobuf limit does not apply. ``memory_external_data_supported()`` checks once per
process, on a small model, that this OpenVINO reads such entries and reads the right bytes;
where it does not, every initializer is serialized instead.

The addresses come from arrays this process owns, for the duration of one ``read_onnx`` call;
a model file from elsewhere never reaches this path.
"""

from __future__ import annotations

import functools
import io
import logging
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from edgeinfer.errors import BackendError, first_line
from edgeinfer.ir import Graph, Node, Value
from edgeinfer.ir.onnx_io import array_to_tensor, external_placeholder, graph_to_model, name_exported_nodes

EXTERNAL_MIN_BYTES = 16 * 1024  # smaller initializers stay in the protobuf (shape tensors, biases)
MEMORY_LOCATION = "*/_ORT_MEM_ADDR_/*"
_SHAREABLE_KINDS = "fiub"  # numpy's own types; ml_dtypes (bfloat16, float8, int4) are serialized
log = logging.getLogger("edgeinfer.backends.openvino")

# How OpenVINO's messages name a node: the frontend quotes the ONNX node, the CPU plugin its
# friendly name (the ONNX output name for most translated nodes).
_NODE_PATTERNS = (
    re.compile(r"<Node\((?P<op>[\w.]+)\): (?P<name>[^>]*)>"),
    re.compile(r"node with name '(?P<name>[^']*)'"),
    re.compile(r"friendly_name '(?P<name>[^']*)'"),
)
_NO_RULE = re.compile(r"No conversion rule found for operations: (?P<ops>[^\n]*)")
_FAILED_OP = re.compile(r"-- (?P<op>[\w.]+)-(?P<version>\d+) with a message:\n(?P<message>.*?)(?=\n-- |\nSummary:|\Z)",
                        re.DOTALL)


def onnx_frontend() -> Any:
    """A fresh ONNX ``FrontEnd`` (cheap: the library is loaded once)."""
    from openvino.frontend import FrontEndManager

    return FrontEndManager().load_by_framework("onnx")


def export(graph: Graph, *, in_memory_weights: bool | None = None) -> tuple[bytes, dict[str, Node], list[np.ndarray]]:
    """The serialized ONNX model for ``graph``, OpenVINO name -> IR node (node names and output
    names), and the arrays whose addresses the model refers to (keep them alive while
    OpenVINO reads it)."""
    if in_memory_weights is None:
        in_memory_weights = memory_external_data_supported()
    model = graph_to_model(graph, include_initializers=False, value_info=False)
    names = _name_nodes(model, graph)
    buffers: list[np.ndarray] = []
    for name, array in graph.initializers.items():
        if in_memory_weights and array.dtype.kind in _SHAREABLE_KINDS and array.nbytes >= EXTERNAL_MIN_BYTES:
            buffer = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
            buffers.append(buffer)
            model.graph.initializer.append(_memory_placeholder(name, buffer))
        else:
            model.graph.initializer.append(array_to_tensor(array, name))
    return model.SerializeToString(), names, buffers


def _name_nodes(model: onnx.ModelProto, graph: Graph) -> dict[str, Node]:
    """Exported node names (unique, so OpenVINO's messages can name a node) and value names ->
    IR node: OpenVINO's errors name either."""
    names = name_exported_nodes(model, graph)
    for node in graph.nodes:
        for output in node.outputs:
            if output:
                names.setdefault(output, node)
    return names


def _memory_placeholder(name: str, buffer: np.ndarray) -> onnx.TensorProto:
    return external_placeholder(name, buffer, {"location": MEMORY_LOCATION, "offset": str(buffer.ctypes.data),
                                               "length": str(buffer.nbytes)})


def read_onnx(model_bytes: bytes) -> Any:
    """``openvino.Model`` from serialized ONNX; the frontend's exception propagates."""
    frontend = onnx_frontend()
    return frontend.convert(frontend.load(io.BytesIO(model_bytes)))


@functools.cache
def memory_external_data_supported() -> bool:
    """Whether this OpenVINO reads in-memory external data (see the module docstring), checked
    on a one-node model whose constant must come back bit for bit."""
    values = np.arange(EXTERNAL_MIN_BYTES // 4, dtype=np.float32)
    graph = Graph([Node("Add", ["x", "c"], ["y"])], [Value("x", "float32", values.shape)],
                  [Value("y", "float32", values.shape)],
                  {"c": values}, opset={"": 17}, name="openvino_memory_probe")
    model_bytes, _, buffers = export(graph, in_memory_weights=True)
    try:
        model = read_onnx(model_bytes)
        constants = [op.get_data() for op in model.get_ordered_ops() if op.get_type_name() == "Constant"]
    except Exception as exc:  # an OpenVINO that refuses the convention: serialize instead
        log.info("OpenVINO does not read in-memory external data (%s); initializers are serialized",
                 first_line(exc))
        return False
    found = any(c.shape == values.shape and np.array_equal(c, values) for c in constants)
    if not found:
        log.info("OpenVINO read in-memory external data wrongly; initializers are serialized")
    return found


def explain(exc: BaseException) -> str:
    """The part of an OpenVINO message a user needs: which ops failed and why, else the
    exception's last meaningful line (OpenVINO puts the source location first)."""
    text = str(exc)
    parts = []
    no_rule = _NO_RULE.search(text)
    if no_rule:
        parts.append(f"no conversion rule for {no_rule.group('ops').strip()}")
    for match in _FAILED_OP.finditer(text):
        parts.append(f"{match.group('op')}-{match.group('version')}: {_last_line(match.group('message'))}")
    return "; ".join(parts) if parts else _last_line(text)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not line.strip().startswith(("Check '", "Exception from", "FrontEnd API failed",
                                                              "While validating"))]
    return (lines[-1] if lines else (text.strip().splitlines() or ["unknown error"])[-1])[:600]


def where(exc: BaseException, names: Mapping[str, Node], graph: Graph) -> str:
    """`` at node 'conv1' (Conv)`` when OpenVINO's message names a node, else ``""``."""
    text = str(exc)
    for pattern in _NODE_PATTERNS:
        for match in pattern.finditer(text):
            name = match.group("name")
            node = names.get(name) or names.get(name.split("/")[0])
            if node is not None:  # an IR node, or its label (a compiled model stored ahead of time)
                return f" at {getattr(node, 'label', node)}"
    no_rule = _NO_RULE.search(text)
    if no_rule:  # "Foo-17, Bar-17": every node of those op types
        ops = {item.strip().rsplit("-", 1)[0] for item in no_rule.group("ops").split(",")}
        labels = [n.label for n in graph.nodes if n.op_type in ops or f"{n.domain}.{n.op_type}" in ops]
        if labels:
            return " at " + ", ".join(labels[:5]) + (f" and {len(labels) - 5} more" if len(labels) > 5 else "")
    return ""


def backend_error(action: str, graph: Graph, exc: BaseException, names: Mapping[str, Node],
                  suffix: str = "") -> BackendError:
    return BackendError(f"openvino {action} graph {graph.name!r}{where(exc, names, graph)}{suffix}: "
                        f"{explain(exc)}")
