"""ONNX external data of any size: read by memory-mapping, written by streaming.

Reading: every external tensor is checked (a relative location inside the model's folder, an
offset and length inside its file) and memory-mapped read-only, so a weight is never held twice
and costs no resident memory until something touches it. Tensors of at least
``MAP_MIN_BYTES`` stay out of the protobuf altogether: the importer checks and translates a
*weightless* model in which they are typed graph inputs (``weightless``), then attaches the
mapped arrays as initializers (``attach``). The ONNX checker therefore never sees, nor
serializes, gigabytes of weights. Smaller external tensors are read into the protobuf.

Writing: ``save_with_external_data`` writes initializers of at least ``EXTERNAL_MIN_BYTES``
to ``<model>.onnx.data`` one by one (64-byte aligned, as onnx's own saver aligns), the
protobuf with references beside it, checks the result with the path-based checker, and moves
both into place only then.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import onnx

from edgeinfer.errors import ModelFormatError, ModelValidationError
from edgeinfer.progress import Steps, steps

MAP_MIN_BYTES = 1 << 20       # external tensors this big are mapped, not read into the protobuf
EXTERNAL_MIN_BYTES = 1 << 10  # when writing with external data, tensors this big go to the data file
ALIGN = 64


def external_tensors(model: onnx.ModelProto) -> Iterable[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors

    for tensor in _get_all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            yield tensor


def locate(tensor: onnx.TensorProto, folder: Path, model_path: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor, refused unless it lies inside ``folder``."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    try:
        target = (folder / location).resolve()
    except (OSError, RuntimeError, ValueError):  # a NUL byte, a symlink loop, a name too long
        target = None
    if not location or os.path.isabs(location) or target is None or not target.is_relative_to(folder):
        raise ModelFormatError(f"{model_path}: tensor {tensor.name!r} external data location {location!r} "
                               f"must be a relative path inside {folder}")
    if not target.is_file():
        raise ModelFormatError(f"{model_path}: tensor {tensor.name!r} external data file {location!r} not found")
    size = target.stat().st_size
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError as exc:
        raise ModelFormatError(f"{model_path}: tensor {tensor.name!r} has a non-integer offset/length") from exc
    if offset < 0 or length < 0 or offset + length > size:
        raise ModelFormatError(f"{model_path}: tensor {tensor.name!r} external data [{offset}, "
                               f"{offset + length}) lies outside {location!r} of {size} bytes")
    return target, offset, length


def _mappable_dtype(tensor: onnx.TensorProto) -> np.dtype | None:
    """The numpy dtype whose bytes are the tensor's raw bytes, or None (strings, sub-byte types)."""
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.kind not in "fiub" or tensor.data_type in (onnx.TensorProto.BFLOAT16,) or dtype.itemsize == 0:
        return None
    return dtype.newbyteorder("<")


def load_external(model: onnx.ModelProto, path: Path, progress: Steps | None = None) -> dict[str, np.ndarray]:
    """Check every external tensor of ``model`` (loaded from ``path``); map the large ones
    (returned by name, and removed from the protobuf's initializers by ``weightless``) and read
    the small ones into the protobuf. ``progress`` gets one step, in bytes of external data."""
    folder = path.parent.resolve()
    mapped: dict[str, np.ndarray] = {}
    maps: dict[Path, mmap.mmap] = {}  # one map per data file, shared by its tensors
    located = [(tensor, *locate(tensor, folder, path)) for tensor in list(external_tensors(model))]
    total = sum(length for *_, length in located)
    with steps(progress).step(f"read {path.name} (external data)", total) as step:
        for tensor, target, offset, length in located:
            _load_one(tensor, target, offset, length, path, maps, mapped)
            step.advance(length)
    return mapped


def _load_one(tensor: onnx.TensorProto, target: Path, offset: int, length: int, path: Path,
              maps: dict[Path, mmap.mmap], mapped: dict[str, np.ndarray]) -> None:
    """Map one external tensor into ``mapped`` (sharing ``maps``) or read it into the protobuf."""
    dtype = _mappable_dtype(tensor)
    shape = tuple(int(d) for d in tensor.dims)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dtype is None or length < MAP_MIN_BYTES:
        read_into_proto(tensor, target, offset, length)
        return
    if count * dtype.itemsize != length:
        raise ModelFormatError(f"{path}: tensor {tensor.name!r} of shape {list(shape)} and type "
                               f"{dtype.name} needs {count * dtype.itemsize} bytes, its external data "
                               f"has {length}")
    if target not in maps:
        maps[target] = map_data_file(target, path)
    mapped[tensor.name] = np.frombuffer(maps[target], dtype=dtype, count=count, offset=offset).reshape(shape)


def map_data_file(target: Path, model_path: Path) -> mmap.mmap:
    """``target`` mapped read-only and registered (``edgeinfer.ir.mapped``), so that a backend
    can point its engine at the file instead of copying the weights."""
    from edgeinfer.ir.mapped import register_mapped_file

    try:
        with open(target, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            register_mapped_file(mapped, target, os.fstat(handle.fileno()))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{model_path}: cannot memory-map external data file {target.name!r}: {exc}") from None
    return mapped


def read_into_proto(tensor: onnx.TensorProto, target: Path, offset: int, length: int) -> None:
    """Make an external tensor an ordinary one holding its bytes."""
    with open(target, "rb") as handle:
        handle.seek(offset)
        tensor.raw_data = handle.read(length)
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def weightless(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """``model`` with the main graph's initializers ``names`` turned into typed graph inputs:
    what the checker and the translation need, without the bytes."""
    names = set(names)
    if not names:
        return model
    kept = [t for t in model.graph.initializer if t.name not in names]
    moved = [t for t in model.graph.initializer if t.name in names]
    nested = names - {t.name for t in moved}
    if nested:
        raise ModelFormatError(f"external tensors {sorted(nested)[:3]} inside subgraphs of at least "
                               f"{MAP_MIN_BYTES} bytes are not supported; store them in the main graph")
    declared = {i.name for i in model.graph.input}
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    for tensor in moved:
        if tensor.name not in declared:  # IR < 4 lists initializers as inputs already
            model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                                        list(tensor.dims)))
    return model


def attach(graph, arrays: Mapping[str, np.ndarray]):
    """The translated ``graph`` with the mapped ``arrays`` back as initializers (not inputs)."""
    if not arrays:
        return graph
    from edgeinfer.ir import Graph

    inits = {**graph.initializers, **arrays}
    inputs = [v for v in graph.inputs if v.name not in arrays]
    return Graph(list(graph.nodes), inputs, list(graph.outputs), inits, value_info=list(graph.value_info()),
                 opset=dict(graph.opset), name=graph.name, metadata=dict(graph.metadata))


def save_with_external_data(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray], path: Path) -> None:
    """Write ``model`` (whose initializers ``arrays`` are not yet in it) as ``path`` plus
    ``path.name + '.data'``, streaming each array; check with the path-based checker; both
    files replace any old ones only once the pair is complete and valid."""
    from edgeinfer.ir.onnx_io import external_placeholder

    path = Path(path)
    data_name = path.name + ".data"
    folder = path.parent if str(path.parent) else Path(".")
    with tempfile.TemporaryDirectory(dir=folder, prefix=f".{path.name}.") as staging:
        data_path = Path(staging) / data_name
        position = 0
        with open(data_path, "wb") as handle:
            for name, array in arrays.items():
                data = np.ascontiguousarray(array)
                if data.dtype.byteorder == ">":
                    data = data.astype(data.dtype.newbyteorder("<"))
                pad = -position % ALIGN
                handle.write(bytes(pad))
                position += pad
                model.graph.initializer.append(external_placeholder(
                    name, data, {"location": data_name, "offset": str(position), "length": str(data.nbytes)}))
                handle.write(data.reshape(-1).view(np.uint8))
                position += data.nbytes
            handle.flush()
            os.fsync(handle.fileno())
        proto_path = Path(staging) / path.name
        with open(proto_path, "wb") as handle:
            handle.write(model.SerializeToString())
            handle.flush()
            os.fsync(handle.fileno())
        try:
            onnx.checker.check_model(os.fspath(proto_path), full_check=False)
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise ModelValidationError(f"exported ONNX model fails the checker: {str(exc).splitlines()[0]}") from exc
        os.replace(data_path, folder / data_name)
        os.replace(proto_path, path)


def split_initializers(graph, min_bytes: int = EXTERNAL_MIN_BYTES) -> dict[str, np.ndarray]:
    """The numeric initializers of ``graph`` of at least ``min_bytes`` (they go to the data file)."""
    return {name: array for name, array in graph.initializers.items()
            if array.dtype.kind in "fiub" and array.nbytes >= min_bytes}
