"""Read (and write) the weights of a binary ``.caffemodel``.

A caffemodel is a serialized ``NetParameter`` whose layers carry their parameter blobs. The
reader memory-maps the file and walks the protobuf wire format itself, reading only each
layer's name, type and blobs; blob data is decoded with ``np.frombuffer`` straight from the
map and copied once, so peak memory is about one copy of the weights (the map is backed by
the page cache), instead of the three a full ``ParseFromString`` plus numpy conversion holds.
Every length and offset is checked against the enclosing message, so a truncated or corrupt
file raises ``ModelFormatError`` naming the file, the layer and the byte offset.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from edgeinfer.errors import ModelFormatError
from edgeinfer.limits import MAX_RANK

# Field numbers (caffe.proto).
_NET_LAYER, _NET_V1_LAYERS = 100, 2
_V2_NAME, _V2_TYPE, _V2_BLOBS = 1, 2, 7
_V1_NAME, _V1_TYPE, _V1_BLOBS, _V1_V0 = 4, 5, 6, 1
_BLOB_NUM, _BLOB_CHANNELS, _BLOB_HEIGHT, _BLOB_WIDTH = 1, 2, 3, 4
_BLOB_DATA, _BLOB_SHAPE, _BLOB_DOUBLE_DATA = 5, 7, 8
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@dataclass
class LayerWeights:
    """The blobs of one layer, and how their shapes were declared (``legacy``: 4-D
    num/channels/height/width fields rather than a ``BlobShape``)."""

    name: str
    type: str
    blobs: list[np.ndarray]
    legacy: list[bool]


class _Reader:
    """Wire-format cursor over ``buf[start:end]`` that reports errors with context."""

    def __init__(self, buf, start: int, end: int, where: str):
        self.buf, self.pos, self.end, self.where = buf, start, end, where

    def fail(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"{self.where}: expected a valid caffemodel (serialized NetParameter), "
                                f"found {what} at byte {self.pos}; the file is truncated or corrupt")

    def varint(self) -> int:
        result = shift = 0
        buf, pos = self.buf, self.pos
        while True:
            if pos >= self.end:
                raise self.fail("a varint running past the end of its message")
            byte = buf[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 63:
                raise self.fail("a varint longer than 10 bytes")

    def tag(self) -> tuple[int, int]:
        key = self.varint()
        field, wire = key >> 3, key & 7
        if field == 0 or wire not in (_VARINT, _FIXED64, _LENGTH, _FIXED32):
            self.pos -= 1
            raise self.fail(f"an invalid field key (field {field}, wire type {wire})")
        return field, wire

    def length_delimited(self) -> tuple[int, int]:
        length = self.varint()
        start = self.pos
        if length > self.end - start:
            raise self.fail(f"a field of {length} bytes with only {self.end - start} bytes left")
        self.pos = start + length
        return start, start + length

    def skip(self, wire: int) -> None:
        if wire == _VARINT:
            self.varint()
        elif wire == _LENGTH:
            self.length_delimited()
        else:
            size = 8 if wire == _FIXED64 else 4
            if self.pos + size > self.end:
                raise self.fail("a fixed-size field running past the end of its message")
            self.pos += size

    def string(self) -> str:
        start, end = self.length_delimited()
        return bytes(self.buf[start:end]).decode("utf-8", errors="replace")

    def sub(self, start: int, end: int) -> _Reader:
        return _Reader(self.buf, start, end, self.where)


def _packed_varints(reader: _Reader) -> list[int]:
    start, end = reader.length_delimited()
    inner = reader.sub(start, end)
    values = []
    while inner.pos < end:
        values.append(inner.varint())
    return values


def _fixed_run(reader: _Reader, tag_byte: int, dtype: str, size: int) -> np.ndarray:
    """Unpacked repeated fixed-size values: consecutive (tag, value) records of 1 + size
    bytes. Decoded in one vectorized step rather than one Python call per value."""
    record = 1 + size
    start = reader.pos - 1  # the tag byte just read
    limit = (reader.end - start) // record
    tags = np.frombuffer(reader.buf, np.uint8, count=limit * record, offset=start)[::record]
    mismatch = np.flatnonzero(tags != tag_byte)
    count = int(mismatch[0]) if mismatch.size else limit
    if count == 0:
        raise reader.fail("an unpacked value running past the end of its message")
    values = np.ndarray((count,), dtype=dtype, buffer=reader.buf, offset=start + 1, strides=(record,)).copy()
    reader.pos = start + count * record
    return values


def _read_blob(reader: _Reader) -> tuple[np.ndarray, bool]:
    chunks: list[np.ndarray] = []
    shape: list[int] | None = None
    legacy = [0, 0, 0, 0]
    has_legacy = False
    while reader.pos < reader.end:
        field, wire = reader.tag()
        if field in (_BLOB_DATA, _BLOB_DOUBLE_DATA) and wire == _LENGTH:
            start, end = reader.length_delimited()
            dtype, size = ("<f4", 4) if field == _BLOB_DATA else ("<f8", 8)
            if (end - start) % size:
                raise reader.fail(f"packed blob data of {end - start} bytes, not a multiple of {size}")
            chunks.append(np.frombuffer(reader.buf, dtype, count=(end - start) // size, offset=start)
                          .astype(np.float32))
        elif field == _BLOB_DATA and wire == _FIXED32:
            chunks.append(_fixed_run(reader, (_BLOB_DATA << 3) | _FIXED32, "<f4", 4))
        elif field == _BLOB_DOUBLE_DATA and wire == _FIXED64:
            chunks.append(_fixed_run(reader, (_BLOB_DOUBLE_DATA << 3) | _FIXED64, "<f8", 8).astype(np.float32))
        elif field == _BLOB_SHAPE and wire == _LENGTH:
            start, end = reader.length_delimited()
            inner = reader.sub(start, end)
            shape = []
            while inner.pos < end:
                dim_field, dim_wire = inner.tag()
                if dim_field == 1 and dim_wire == _LENGTH:
                    shape.extend(_packed_varints(inner))
                elif dim_field == 1 and dim_wire == _VARINT:
                    shape.append(inner.varint())
                else:
                    inner.skip(dim_wire)
        elif field in (_BLOB_NUM, _BLOB_CHANNELS, _BLOB_HEIGHT, _BLOB_WIDTH) and wire == _VARINT:
            legacy[field - 1] = reader.varint()
            has_legacy = True
        else:
            reader.skip(wire)
    data = chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    use_legacy = shape is None and has_legacy
    dims = tuple(shape) if shape is not None else tuple(legacy) if has_legacy else (data.size,)
    if len(dims) > MAX_RANK:
        raise reader.fail(f"a blob shape of {len(dims)} dims (expected at most {MAX_RANK})")
    if math.prod(dims) != data.size:  # Python ints: a product of huge dims cannot wrap around
        raise reader.fail(f"a blob declaring shape {list(dims)} ({math.prod(dims)} values) "
                          f"but holding {data.size} values")
    return data.reshape(dims), use_legacy


def _read_layer(reader: _Reader, v1: bool, index: int, v1_types: dict[int, str]) -> LayerWeights:
    name_field, type_field, blobs_field = (_V1_NAME, _V1_TYPE, _V1_BLOBS) if v1 else (_V2_NAME, _V2_TYPE, _V2_BLOBS)
    name, type_name = f"#{index}", ""
    blobs: list[np.ndarray] = []
    legacy: list[bool] = []
    while reader.pos < reader.end:
        field, wire = reader.tag()
        if field == name_field and wire == _LENGTH:
            name = reader.string()
            reader.where = reader.where.split(": layer ")[0] + f": layer {name!r}"
        elif field == type_field and not v1 and wire == _LENGTH:
            type_name = reader.string()
        elif field == type_field and v1 and wire == _VARINT:
            code = reader.varint()
            type_name = v1_types.get(code, f"V1 type {code}")
        elif field == blobs_field and wire == _LENGTH:
            start, end = reader.length_delimited()
            blob, is_legacy = _read_blob(reader.sub(start, end))
            blobs.append(blob)
            legacy.append(is_legacy)
        elif v1 and field == _V1_V0 and wire == _LENGTH:
            raise ModelFormatError(f"{reader.where}: layer {name!r} uses the V0 layer format (pre-2014); "
                                   "expected V1 or V2 layers: upgrade it with Caffe's upgrade_net_proto_binary")
        else:
            reader.skip(wire)
    return LayerWeights(name, type_name, blobs, legacy)


def read_caffemodel(path: str | os.PathLike) -> dict[str, LayerWeights]:
    """Map each layer name of a binary caffemodel to its blobs (float32 numpy arrays)."""
    from edgeinfer.converters.caffe.prototxt import V1_TYPE_NAMES

    where = os.fspath(path)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise ModelFormatError(f"{where}: expected a caffemodel file, cannot open it ({exc.strerror})") from exc
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise ModelFormatError(f"{where}: expected a caffemodel (serialized NetParameter), found an empty file")
        buf = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _read_net(_Reader(buf, 0, size, where), V1_TYPE_NAMES)
        except ModelFormatError as exc:
            # Drop the frames of the failed read: arrays in them still view the map, and closing
            # it under them raises BufferError instead of this error (found by fuzzing).
            raise exc.with_traceback(None) from None
        finally:
            try:
                buf.close()
            except BufferError:  # a view survives (it closes the map when it dies); results are copies
                pass


def _read_net(reader: _Reader, v1_types: dict[int, str]) -> dict[str, LayerWeights]:
    layers: dict[str, LayerWeights] = {}
    count = 0
    while reader.pos < reader.end:
        field, wire = reader.tag()
        if field in (_NET_LAYER, _NET_V1_LAYERS) and wire == _LENGTH:
            start, end = reader.length_delimited()
            layer = _read_layer(reader.sub(start, end), field == _NET_V1_LAYERS, count, v1_types)
            layers.setdefault(layer.name, layer)  # Caffe copies from the first layer of a name
            count += 1
        else:
            reader.skip(wire)
    if not count:
        raise ModelFormatError(f"{reader.where}: expected a caffemodel with layers, found none "
                               "(not a caffemodel, or a prototxt given as weights)")
    return layers


def write_caffemodel(path: str | os.PathLike, layers: Iterable[tuple[str, str, Sequence[np.ndarray]]], *,
                     v1: bool = False, legacy_shapes: bool = False) -> None:
    """Write ``(name, type, blobs)`` layers as a binary caffemodel (V2 ``layer`` or, with
    ``v1``, V1 ``layers`` whose ``type`` is a V1 enum name such as ``"CONVOLUTION"``).
    ``legacy_shapes`` stores blob shapes in the old 4-D num/channels/height/width fields."""
    from edgeinfer.converters.caffe.schema import NetParameter
    from edgeinfer.format.atomic import atomic_write_bytes

    net = NetParameter()
    for name, type_name, blobs in layers:
        layer = net.layers.add() if v1 else net.layer.add()
        layer.name = name
        layer.type = type_name
        for array in blobs:
            blob = layer.blobs.add()
            array = np.asarray(array, dtype=np.float32)
            if legacy_shapes:
                dims = (1,) * (4 - array.ndim) + array.shape
                if len(dims) != 4:
                    raise ValueError(f"legacy blob shapes are 4-D, got {array.shape} in layer {name!r}")
                blob.num, blob.channels, blob.height, blob.width = dims
            else:
                blob.shape.dim.extend(array.shape)
            blob.data.extend(array.ravel().tolist())
    atomic_write_bytes(path, net.SerializeToString())
