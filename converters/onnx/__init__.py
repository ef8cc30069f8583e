"""ONNX front end: ``.onnx`` files and ``onnx.ModelProto`` objects into the IR.

What it adds to the core proto translation (``edgeinfer.ir.onnx_io``):
- safe file reading: a clear ``ModelFormatError`` for a missing, empty, truncated or
  non-ONNX file; external data read only from inside the model's own folder, with every
  offset and length checked against the data file;
- model-local functions inlined (``onnx.inliner``), so the IR holds only primitive ops;
- old opsets upgraded with ``onnx.version_converter`` (to ``UPGRADE_TARGET``) so kernels see
  modern semantics; when the converter cannot upgrade a model it is kept as it is, and the
  versioned kernel registry (with its ``onnx.reference`` fallback) runs the old ops;
- ops unknown to ONNX raise ``UnsupportedOpError`` naming the op and node;
- what real files get wrong that onnxruntime runs anyway (dims declared -1 or 0, nodes
  sharing a name, nodes out of order, outputs without a shape, ...) is repaired with an
  ``OnnxLeniencyWarning`` (``lenient.py``); anything else the checker rejects is refused.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from onnx import version_converter

from edgeinfer import limits
from edgeinfer.converters.onnx.external import (
    attach,
    external_tensors,
    load_external,
    locate,
    read_into_proto,
    weightless,
)
from edgeinfer.converters.onnx.lenient import OnnxLeniencyWarning, check_leniently
from edgeinfer.errors import ModelFormatError, ModelValidationError, UnsupportedOpError
from edgeinfer.ir import Graph
from edgeinfer.ir.onnx_io import graph_from_model, opset_of
from edgeinfer.progress import Steps

__all__ = ["OnnxLeniencyWarning", "accepts", "convert", "export", "import_model", "read_model"]

SUFFIXES = (".onnx",)
MIN_OPSET = 7
UPGRADE_TARGET = 13  # opsets below this are upgraded; newer ones are kept as they are
# onnx.version_converter adapters that change results (checked against onnxruntime): Upsample
# and Resize-10 become Resize-13 without coordinate_transformation_mode="asymmetric" (linear
# mode shifts), and Hardmax-11 becomes Hardmax-13 without the flatten-to-2D step. A model
# holding one of these ops below the given opset keeps its opset; versioned kernels run it.
# Scan-8 becomes Scan-9 with its batch axis dropped from the declared inputs and body
# (the original feeds no longer fit); the numpy backend has a Scan-8 kernel.
UPGRADE_UNSAFE_BELOW = {"Upsample": 10_000, "Resize": 11, "Hardmax": 13, "Scan": 9}


def accepts(source: Any) -> bool:
    if isinstance(source, onnx.ModelProto):
        return True
    return isinstance(source, (str, os.PathLike)) and Path(source).suffix.lower() in SUFFIXES


def convert(source: onnx.ModelProto | str | os.PathLike, *, upgrade: bool = True,
            progress: Steps | None = None) -> Graph:
    """Import an ONNX model (path or ``ModelProto``) into a ``Graph`` (``progress``: the read
    step of a file's external data, in bytes)."""
    if isinstance(source, onnx.ModelProto):
        model, where = source, "<ModelProto>"
        if _has_external_data(model):
            raise ModelFormatError("ModelProto with external data: pass the .onnx file path instead, "
                                   "so the data can be read from the model's folder")
        return import_model(model, where, upgrade=upgrade)
    path = Path(source)
    model = _parse(path)
    mapped = load_external(model, path, progress)  # large tensors mapped, small ones read into the protobuf
    return import_model(weightless(model, mapped), os.fspath(source), upgrade=upgrade, external=mapped)


def read_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse an ``.onnx`` file and load its external data from the model's folder only (into
    the protobuf: for tools that need the whole model in memory; ``convert`` maps it instead)."""
    path = Path(path)
    model = _parse(path)
    for tensor in list(external_tensors(model)):
        read_into_proto(tensor, *locate(tensor, path.parent.resolve(), path))
    return model


def _parse(path: Path) -> onnx.ModelProto:
    """The ``.onnx`` file's protobuf, external data not loaded."""
    if not path.is_file():
        raise ModelFormatError(f"{path}: expected an ONNX model file, found no such file")
    size = path.stat().st_size
    if size == 0:
        raise ModelFormatError(f"{path}: expected an ONNX model, found an empty file")
    if size > limits.MAX_PROTOBUF_BYTES:
        raise ModelFormatError(f"{path}: expected an ONNX protobuf of at most {limits.MAX_PROTOBUF_BYTES} bytes "
                               f"(protobuf's limit; larger weights go in external data), found {size} bytes")
    try:
        model = onnx.load_model(os.fspath(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelFormatError(f"{path}: expected an ONNX protobuf, cannot parse it "
                               f"({type(exc).__name__}: {str(exc)[:200]})") from exc
    if not model.HasField("graph") or not model.opset_import:
        raise ModelFormatError(f"{path}: expected an ONNX model with a graph and opset imports, "
                               "found none (truncated, or not an ONNX file)")
    return model


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(True for _ in external_tensors(model))


def _check_ops_known(graph: onnx.GraphProto, opset: dict[str, int], where: str) -> None:
    for index, node in enumerate(graph.node):
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if domain in ("", "ai.onnx.ml") and not onnx.defs.has(node.op_type, domain):
            raise UnsupportedOpError(f"{where}: node {node.name or index!r}: op {node.op_type!r} is not an "
                                     f"ONNX operator (domain {domain or 'ai.onnx'!r}, opset "
                                     f"{opset.get(domain, '?')})")
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _check_ops_known(sub, opset, where)


_NAME_FIELDS = frozenset({"name", "op_type", "domain", "input", "output", "key"})


def check_structure(model: onnx.ModelProto, where: str) -> None:
    """Refuse what the rest of the import cannot handle safely, before it looks at anything.

    Walks every message of the model without recursion: a string field must hold valid UTF-8
    (protobuf hands undecodable proto2 strings over as bytes, which later code would choke on),
    names are at most ``MAX_NAME_CHARS``, shapes at most ``MAX_RANK`` dims and subgraphs nested
    at most ``MAX_GRAPH_NESTING`` deep. Bytes fields (tensor data) are never read here.
    """
    stack: list[tuple[Message, int, str]] = [(model, 0, "model")]
    while stack:
        message, depth, path = stack.pop()
        kind = message.DESCRIPTOR.name
        if kind == "GraphProto":
            depth += 1
            if depth > limits.MAX_GRAPH_NESTING + 1:
                raise ModelFormatError(f"{where}: graph {message.name!r}: expected subgraphs nested at most "
                                       f"{limits.MAX_GRAPH_NESTING} deep, found it at depth {depth - 1} "
                                       f"({_short(path)})")
        elif kind == "TensorShapeProto" and len(message.dim) > limits.MAX_RANK:
            raise ModelFormatError(f"{where}: {_short(path)}: expected a shape of at most {limits.MAX_RANK} dims, "
                                   f"found {len(message.dim)}")
        elif kind == "TensorProto" and len(message.dims) > limits.MAX_RANK:
            raise ModelFormatError(f"{where}: {_short(path)} {message.name!r}: expected at most {limits.MAX_RANK} "
                                   f"dims, found {len(message.dims)}")
        for name, repeated, is_string in _fields_to_walk(message.DESCRIPTOR):
            if is_string:
                for item in getattr(message, name) if repeated else (getattr(message, name),):
                    _check_string(item, name, f"{path}.{name}", where)
            elif repeated:
                stack.extend((child, depth, f"{path}.{name}[{i}]") for i, child in enumerate(getattr(message, name)))
            elif message.HasField(name):
                stack.append((getattr(message, name), depth, f"{path}.{name}"))


@functools.cache
def _fields_to_walk(descriptor: Descriptor) -> tuple[tuple[str, bool, bool], ...]:
    """(name, repeated, is a string) of the string and message fields of a message type."""
    return tuple((field.name, field.is_repeated, field.type == FieldDescriptor.TYPE_STRING)
                 for field in descriptor.fields
                 if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE))


def _short(path: str, keep: int = 120) -> str:
    return path if len(path) <= keep else "..." + path[-keep:]


def _check_string(value: str | bytes, field: str, path: str, where: str) -> None:
    if not isinstance(value, str):
        raise ModelFormatError(f"{where}: {_short(path)}: expected a UTF-8 string, found undecodable bytes "
                               f"{bytes(value)[:40]!r}; the file is corrupt")
    if field in _NAME_FIELDS and len(value) > limits.MAX_NAME_CHARS:
        raise ModelFormatError(f"{where}: {_short(path)}: expected a name of at most {limits.MAX_NAME_CHARS} "
                               f"characters, found {len(value)}")


def import_model(model: onnx.ModelProto, where: str = "<model>", *, upgrade: bool = True,
                 external: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Check and translate ``model``; ``external``: memory-mapped initializers that ``model``
    declares as typed inputs instead (``external.weightless``), attached after translation."""
    check_structure(model, where)
    opset = opset_of(model)
    if not opset:
        raise ModelFormatError(f"{where}: expected opset imports, found none")
    version = opset.get("", onnx.defs.onnx_opset_version())  # e.g. a pure ai.onnx.ml model
    if version < MIN_OPSET:
        model = _upgraded(model)
        if opset_of(model).get("", 0) < MIN_OPSET:
            raise ModelFormatError(f"{where}: opset {version} is older than the oldest supported "
                                   f"({MIN_OPSET}) and onnx.version_converter cannot upgrade it; "
                                   "re-export the model with a newer exporter")
        version = opset_of(model)[""]
    if version > onnx.defs.onnx_opset_version():
        raise ModelFormatError(f"{where}: opset {version} is newer than this onnx package knows "
                               f"({onnx.defs.onnx_opset_version()}); upgrade onnx")
    _check_ops_known(model.graph, opset, where)
    if model.functions:
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    model = check_leniently(model, where)
    if upgrade and version < UPGRADE_TARGET and not _upgrade_unsafe(model.graph, version):
        model = _upgraded(model)
    graph = attach(graph_from_model(model), external or {})
    graph = graph.sorted()  # raises ModelValidationError naming a node on a cycle
    graph.verify()
    return graph


def _upgrade_unsafe(graph: onnx.GraphProto, version: int) -> bool:
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and version < UPGRADE_UNSAFE_BELOW.get(node.op_type, 0):
            return True
        for attr in node.attribute:
            subs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            if any(_upgrade_unsafe(sub, version) for sub in subs):
                return True
    return False


def _upgraded(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        upgraded = version_converter.convert_version(model, UPGRADE_TARGET)
        onnx.checker.check_model(upgraded)
        return upgraded
    except Exception:  # the converter lacks adapters for some ops; keep the original opset
        return model


EXTERNAL_DATA_ABOVE = 1 << 30  # bytes of weights past which export writes them beside the file


def export(graph: Graph, path: str | os.PathLike | None = None, *,
           external_data: bool | None = None) -> onnx.ModelProto:
    """IR -> ONNX model (checked with ``full_check``); written atomically if ``path`` is given.

    The file holds standard ONNX only, so any engine loads it: ``edgeinfer``-domain ops (the
    fused ops of ``optimize=2``) are lowered back to standard ops first, and one without a
    lowering raises ``UnsupportedOpError`` before anything is written. Every graph output
    carries a dtype and shape (the checker requires them): they are inferred where unknown,
    and an output whose rank nothing can infer is refused.

    ``external_data`` (default: when the weights pass ``EXTERNAL_DATA_ABOVE`` bytes, as they
    must past protobuf's 2 GB) writes initializers of 1 KiB and more to ``<file>.data`` beside
    the file, streamed one by one, and returns the protobuf without them."""
    from edgeinfer.converters.onnx.external import save_with_external_data, split_initializers
    from edgeinfer.ir.infer import infer_types
    from edgeinfer.ir.lowering import lower_graph
    from edgeinfer.ir.onnx_io import array_to_tensor, graph_to_model

    lowered = lower_graph(graph)
    if lowered is not graph or any(v.dtype is None or v.shape is None for v in graph.outputs):
        lowered = infer_types(lowered.copy())
    untyped = [v.name for v in lowered.outputs if v.dtype is None or v.shape is None]
    if untyped:
        raise ModelValidationError(f"ONNX export: graph output(s) {untyped} have no inferable dtype or rank; "
                                   "ONNX files declare both for every output (convert with input_shapes=...)")
    weights = sum(a.nbytes for a in lowered.initializers.values() if a.dtype.kind in "fiub")
    if external_data is None:
        external_data = weights > EXTERNAL_DATA_ABOVE
    if external_data and path is None:
        raise ModelValidationError("ONNX export with external data needs a path to write the data beside")
    if external_data:
        big = split_initializers(lowered)
        model = graph_to_model(lowered, include_initializers=False)
        model.graph.initializer.extend(array_to_tensor(a, n) for n, a in lowered.initializers.items() if n not in big)
        save_with_external_data(model, big, Path(path))
        return model
    model = graph_to_model(lowered)
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ModelValidationError(f"exported ONNX model fails the checker: {str(exc).splitlines()[0]}") from exc
    if path is not None:
        from edgeinfer.format.atomic import atomic_write_bytes

        atomic_write_bytes(path, model.SerializeToString())
    return model
