"""The ``.eim`` file: one model, its graph as JSON and its weights ready to memory-map.

Layout (all integers little-endian)::

    offset  size  field
    0       4     magic b"EIM\\x00"
    4       2     major version (a reader refuses a newer major)
    6       2     minor version (a newer minor only adds fields; a reader ignores them)
    8       4     flags: bit 0 = the document is zlib-compressed (version 2 and 3), bit 1 = it is
                  xz-compressed (version 3; never both); no other bit is defined
    12      4     reserved (must be 0)
    16      8     stored document length J
    24      8     data section offset D = J + 72 rounded up to a multiple of 64
    32      8     data section length L; the file is exactly D + L bytes
    40      32    SHA-256 of the J stored document bytes
    72      J     JSON document (UTF-8, compressed as the flags say): version, metadata, tensor
                  table, graph (document.py); at most 256 MiB once decompressed
    72+J    ...   zero padding up to D
    D       L     tensor bytes; zero padding between them

Version 3.0 (written now) is version 2.0 plus two things. Its document is xz-compressed up to
``XZ_MAX_JSON`` bytes of JSON (zlib above, where xz would be slow): a third smaller on INT8
graphs, whose many Q/DQ nodes make the document a tenth of a small model's file. And a float32
tensor that is exactly the element-wise product of two others (a quantized bias's scale,
``x_scale * w_scale``, declared by the quantizer in the graph's ``weight_products`` metadata,
``edgeinfer.ir.weights``) may be stored as ``{"dtype": "float32", "shape", "product": [i, j]}``:
the reader multiplies tensors i and j (stored ones, float32, broadcasting to the shape) on load;
the writer stores it so only when the product gives the same bits.

Version 3.1 (written when it is used) lets the first operand of a product be int8: a weight that
is exactly ``q * scale`` (int8 values, one float32 scale per output channel broadcasting to its
shape), declared int8-stored in the graph's ``weight_storage`` metadata (the float weights of the
layers mixed precision keeps float), is stored as those two and multiplied on load. A 3.0 reader
refuses such an entry with a typed error; other files are still written as 3.0.

Version 3.2 (written when it is used) lets a small numeric tensor be stored narrower than its
dtype where that is exact: ``{"dtype": "int32", "shape", "offset", "nbytes", "stored": "int16"}``
holds int16 bytes (``nbytes`` counts them, alignment follows them) that the reader widens to
int32 on load. The writer narrows an integer tensor of at most ``NARROW_MAX_BYTES`` (quantized
biases, shape constants) and a float32 operand of a product or scale of a quantization op
(``SCALE_INPUTS``: the scales of weights, int8-stored or quantized, and of quantized biases,
which the quantizer puts on the float16 grid) when every value survives
the round trip bit for bit and it saves ``NARROW_MIN_SAVING`` bytes or more (``NARROWINGS``
lists the pairs). Other float32 tensors keep 4 bytes (a float16-valued weight is stored so only
when declared, ``weight_storage``), and larger tensors stay views into the map. A 3.1 reader
refuses a narrow entry with a typed error (its byte count).

Version 3.3 (written by ``edgeinfer compile``) adds the compiled section (``compiled.py``): the plan
and each part's engine artifact, bound to the IR by ``digest`` (the canonical JSON of the
metadata, tensor table and graph, encoded again by a reader). Version 3.4 also records
``ir_sha256``, the SHA-256 of those three as this writer stores them, which a reader checks
against the stored bytes themselves (a compiled model's cold start: 2.6 ms of re-encoding
``palm_detection_lite``'s graph saved); a 3.3 reader ignores it (a newer minor only adds fields).
Version 3.5 (written instead now) also copies the graph's name, inputs, outputs and node count
into the section (``io``): a device running the file from its artifacts reads the section alone
and hashes the IR's bytes without parsing them (``format.lean``); a full load checks the copy.
Version 3.6 (written instead now) checks each artifact's bytes by their CRC-32 (``"crc32"``) rather
than their SHA-256 (``"sha256"``, still read; why in ``compiled.py``): SHA-256 at speed meant loading
OpenSSL (3.3 ms of a device's cold start) and hashing megabytes beside the engine's import; the
header's document checksum and ``ir_sha256`` stay SHA-256 (small inputs: CPython's built-in one).
A compiled file's document is zlib-compressed whatever its size (read at every start, it inflates
four times faster than xz, and a device imports no ``lzma``).

Version 2.0 aligns a tensor of 64 bytes or more to 64 and packs a smaller one
(a scale, a zero point, a bias of a few channels) at a multiple of its element size, after
the large ones; it stores the document compressed and byte-identical tensors once. Version
1.0 (still read) aligned every tensor to 64, required L to be a multiple of 64 and stored the
document as plain JSON (flags 0), which made the document and the padding of tiny tensors
most of an INT8 file's overhead. ``benchmarks/eim_sizes.py`` measures INT8/fp32 file sizes
against onnxruntime's; ``edgeinfer inspect`` shows where the bytes of any file go.

Tensor table entries are ``{"dtype", "shape", "offset", "nbytes"}`` (offsets relative to D) for
numeric tensors and ``{"dtype": "str", "shape", "strings"}`` for string tensors, whose
elements live in the JSON (a ``{"t": "bytes"}`` tag marks a non-UTF-8 element).

Loading maps the file read-only and checks every header field, the checksum, the document
schema and every tensor's dtype, size, alignment and bounds before creating anything; numeric
tensors become read-only numpy views into the map (no copy), which keep the map alive; the map
is registered with the file's real path (``edgeinfer.ir.mapped``), so that the onnxruntime
backend can have onnxruntime map the weights from the file itself rather than copy them. The
tensor bytes carry no checksum (reading them all would defeat the mapping): they can hold any
value of their dtype, and the graph that uses them is checked by ``Graph.verify``.

A mapped file must not be truncated in place while a model loaded from it is alive (the OS
would fault on access); ``save_model`` never does that: it writes a new file and renames it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import mmap
import os
import stat
import sys
import zlib
from typing import Any, BinaryIO

import numpy as np

from edgeinfer.errors import ModelFormatError, ModelValidationError
from edgeinfer.format.atomic import atomic_write
from edgeinfer.format.compiled import (
    bound_to_ir,
    check_io,
    core_sha256,
    io_document,
    ir_digest,
    read_section,
    section_document,
)
from edgeinfer.format.document import TensorTable, graph_to_document, metadata_to_document
from edgeinfer.format.reading import (  # noqa: F401 - the reading half, also read from here
    _COMPILED_FIELD,
    ALIGNMENT,
    COMPILED_VERSION,
    CRC32_VERSION,
    FLAG_COMPRESSED_DOCUMENT,
    FLAG_XZ_DOCUMENT,
    FORMAT_NAME,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    INT8_STORAGE_VERSION,
    MAGIC,
    MAX_JSON_BYTES,
    MAX_RANK,
    NARROW_STORAGE_VERSION,
    NARROWINGS,
    READABLE_MINOR,
    Header,
    align,
    checked_document,
    document_bytes,
    parse_document,
    read_document,
    read_header,
    read_tensors,
    source_path,
    stale,
    tensor_alignment,
    tensors_end,
)
from edgeinfer.ir import dtypes
from edgeinfer.ir.mapped import register_mapped_file
from edgeinfer.ir.weights import weight_products
from edgeinfer.log import get_logger
from edgeinfer.model import Model
from edgeinfer.progress import Step, Steps, steps

# the inputs of the quantization ops that are scales: a float32 one may be stored as float16 where exact
SCALE_INPUTS = {"QuantizeLinear": (1,), "DequantizeLinear": (1,), "QLinearConv": (1, 4, 6), "QLinearMatMul": (1, 4, 6)}
NARROW_MAX_BYTES = 64 << 10  # larger tensors are stored as they are: memory-mapped, never copied
NARROW_MIN_SAVING = 8  # bytes; below, the entry's "stored" field costs about what narrowing saves
COMPRESSION_LEVEL = 6  # zlib's default: level 9 saves under 1% more on these documents, slower
COMPILED_LEVEL = 9  # a compiled file's document (zlib: palm_detection_lite's 49 KB, 0.06 ms to inflate, xz 0.26)
XZ_MAX_JSON = 4 << 20  # larger documents are zlib-compressed: xz at preset 9 runs about 1 MB/s
XZ_PRESET = 9

log = get_logger("edgeinfer.format")
WRITE_BLOCK_BYTES = 64 << 20  # a progress step, and the most copied at once for a strided tensor


# -- saving --------------------------------------------------------------------------------------
def save_model(model: Model, path: str | os.PathLike, progress: Steps | None = None) -> None:
    """Write ``model`` to ``path`` atomically: a failure leaves any existing file untouched.
    Tensors are written a block of rows at a time (``WRITE_BLOCK_BYTES``): a strided weight is
    never copied whole. ``progress`` gets one step, in bytes of the file."""
    if not isinstance(model, Model):
        raise ModelFormatError(f"cannot save {type(model).__name__} to {os.fspath(path)}: expected an "
                               "edgeinfer Model")
    table = TensorTable()
    try:
        graph_doc = graph_to_document(model.graph, table)
        products = _products(model.graph, graph_doc, table.arrays, table.int8_products)
        entries, numeric, data_length = _layout(table.arrays, products, _quantization_scales(model.graph, graph_doc))
        metadata = metadata_to_document(model.metadata, "model metadata")
    except ModelFormatError as exc:
        raise ModelFormatError(f"{os.fspath(path)}: {exc}") from None
    version = (NARROW_STORAGE_VERSION if any("stored" in entry for entry in entries)
               else INT8_STORAGE_VERSION if any(i in table.int8_products for i in products) else FORMAT_VERSION)
    document = {"format": FORMAT_NAME, "version": list(version), "metadata": metadata,
                "tensors": entries, "graph": graph_doc}
    artifacts: list[tuple[int, Any]] = []
    section = getattr(model, "compiled", None)
    if section is not None:  # kept only while it is bound to this very IR
        if section.digest == ir_digest(document):
            document[_COMPILED_FIELD], artifacts, data_length = section_document(section, data_length)
            document[_COMPILED_FIELD]["ir_sha256"] = core_sha256(document)
            document[_COMPILED_FIELD]["io"] = io_document(graph_doc)
            version = CRC32_VERSION
            document["version"] = list(version)
        else:
            log.warning("%s: the model's compiled section belongs to another IR; it is not written",
                        os.fspath(path))
    # ASCII with escapes: a lone surrogate in a name still round-trips.
    text = json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
    if len(text) > MAX_JSON_BYTES:
        raise ModelFormatError(f"cannot save {os.fspath(path)}: the graph document is {len(text)} bytes, "
                               f"expected at most {MAX_JSON_BYTES} (store large data as numeric tensors)")
    if len(text) <= XZ_MAX_JSON and _COMPILED_FIELD not in document:
        text, flags = lzma.compress(text, lzma.FORMAT_XZ, lzma.CHECK_NONE, XZ_PRESET), FLAG_XZ_DOCUMENT
    else:  # a compiled file's document is read at every start: zlib inflates 4x faster than xz, no lzma import
        text, flags = zlib.compress(text, COMPILED_LEVEL if _COMPILED_FIELD in document else COMPRESSION_LEVEL), \
            FLAG_COMPRESSED_DOCUMENT
    data_offset = align(HEADER_SIZE + len(text))
    header = HEADER.pack(MAGIC, *version, flags, 0, len(text), data_offset,
                         data_length, hashlib.sha256(text).digest())

    def write(handle: BinaryIO, step: Step) -> None:
        handle.write(header)
        handle.write(text)
        handle.write(bytes(data_offset - HEADER_SIZE - len(text)))
        step.advance(data_offset)
        position = 0
        for offset, array in numeric:
            handle.write(bytes(offset - position))
            written = 0
            for block in _row_blocks(array):
                count = _write_tensor(handle, block)
                written += count
                step.advance(count)
            position = offset + written
            if position != offset + array.nbytes:
                raise ModelFormatError(f"cannot save {os.fspath(path)}: a tensor of {array.nbytes} bytes "
                                       f"wrote {position - offset}")
        for offset, data in artifacts:
            handle.write(bytes(offset - position))
            handle.write(data)
            position = offset + len(data)
            step.advance(len(data))
        handle.write(bytes(data_length - position))

    try:
        with steps(progress).step(f"write {os.path.basename(os.fspath(path))}", data_offset + data_length) as step:
            atomic_write(path, lambda handle: write(handle, step))
    except OSError as exc:
        raise ModelFormatError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from exc


def _products(graph: Any, graph_doc: dict[str, Any], arrays: list[np.ndarray],
              int8: dict[int, tuple[int, int]] | None = None) -> dict[int, tuple[int, int]]:
    """``{table index: (operand index, operand index)}`` of the declared weight products of the
    top graph that give the stored bits exactly, and of the int8-stored weights (``int8``,
    checked by the table); an operand is never itself a product."""
    declared = weight_products(graph.metadata)
    found: dict[int, tuple[int, int]] = dict(int8 or {})
    if not declared:
        return {index: pair for index, pair in found.items() if pair[0] not in found and pair[1] not in found}
    refs = {item["name"]: item["tensor"] for item in graph_doc["initializers"]}
    for name, (a, b) in declared.items():
        if name not in refs or a not in refs or b not in refs or refs[name] in (refs[a], refs[b]):
            continue
        target, x, y = arrays[refs[name]], arrays[refs[a]], arrays[refs[b]]
        if any(t.dtype != np.float32 for t in (target, x, y)):
            continue
        try:
            if np.broadcast_shapes(x.shape, y.shape) != target.shape:
                continue
        except ValueError:
            continue
        with np.errstate(all="ignore"):
            product = np.multiply(x, y, dtype=np.float32)
        if np.array_equal(product.view(np.uint32), np.ascontiguousarray(target).view(np.uint32)):
            found[refs[name]] = (refs[a], refs[b])
    return {index: pair for index, pair in found.items() if pair[0] not in found and pair[1] not in found}


def _quantization_scales(graph: Any, graph_doc: dict[str, Any]) -> set[int]:
    """Table indices of the top graph's initializers that a quantization op reads as a scale
    (``SCALE_INPUTS``). The quantizer puts weight scales on the float16 grid
    (``ir.weights.float16_grid_scale``), so they take 2 bytes whether a bias's scale product reads
    them too or not (a layer without a bias); an activation's scale seldom lies on the grid."""
    refs = {item["name"]: item["tensor"] for item in graph_doc["initializers"]}
    return {refs[node.inputs[i]] for node in graph.nodes if not node.domain
            for i in SCALE_INPUTS.get(node.op_type, ()) if i < len(node.inputs) and node.inputs[i] in refs}


def _layout(arrays: list[np.ndarray], products: dict[int, tuple[int, int]] | None = None,
            scales: set[int] | frozenset[int] = frozenset()) -> tuple[list[dict[str, Any]], list[tuple[int, np.ndarray]], int]:
    """Tensor table entries (in table order), (offset, array) of numeric tensors in file order,
    and the data section length. ``products`` (from ``_products``) become product entries; their
    operands and ``scales`` (``_quantization_scales``) may be stored as float16 (``narrowed``).

    Tensors of 64 bytes or more come first, each at a multiple of 64; the small ones follow,
    packed by decreasing element size so that each lands on a multiple of its own without gaps.
    """
    entries: list[dict[str, Any]] = []
    numeric: list[tuple[int, np.ndarray]] = []
    operands = {i for pair in (products or {}).values() for i in pair} | set(scales)
    for index, array in enumerate(arrays):
        shape = [int(d) for d in array.shape]
        if array.dtype == object or array.dtype.kind in "US":
            entries.append({"dtype": "str", "shape": shape, "strings": _string_items(array, index)})
            continue
        if products and index in products:
            entries.append({"dtype": "float32", "shape": shape, "product": list(products[index])})
            continue
        entry = {"dtype": dtypes.name_of(array.dtype), "shape": shape, "offset": 0}
        narrow = narrowed(array, floats=index in operands)
        if narrow is not array:
            entry["stored"] = dtypes.name_of(narrow.dtype)
        entry["nbytes"] = int(narrow.size) * narrow.dtype.itemsize
        entries.append(entry)
        numeric.append((index, narrow))
    def order(item: tuple[int, np.ndarray]) -> tuple[bool, int]:
        small = entries[item[0]]["nbytes"] < ALIGNMENT
        return small, -item[1].dtype.itemsize if small else 0

    small_last = sorted(numeric, key=order)  # stable: table order otherwise
    placed: list[tuple[int, np.ndarray]] = []
    position = 0
    for index, array in small_last:
        entry = entries[index]
        position = align(position, tensor_alignment(entry["nbytes"], array.dtype.itemsize))
        entry["offset"] = position
        placed.append((position, array))
        position += entry["nbytes"]
    return entries, placed, position


def narrowed(array: np.ndarray, *, floats: bool = True) -> np.ndarray:
    """``array`` in the narrowest dtype of ``NARROWINGS`` that holds every value bit for bit
    (float16 keeps a float32's signed zeros and infinities; a NaN whose payload it drops keeps float32), or
    ``array`` itself: a tensor over ``NARROW_MAX_BYTES``, one where narrowing would save under
    ``NARROW_MIN_SAVING`` bytes, one no narrower dtype holds, or a float one unless ``floats``."""
    if array.nbytes > NARROW_MAX_BYTES or (array.dtype.kind == "f" and not floats):
        return array
    for name in NARROWINGS.get(dtypes.name_of(array.dtype) if array.dtype.kind in "iuf" else "", ()):
        narrow_type = dtypes.numpy_dtype(name)
        if array.nbytes - array.size * narrow_type.itemsize < NARROW_MIN_SAVING:
            continue
        if narrow_type.kind == "i":
            info = np.iinfo(narrow_type)
            if array.min() < info.min or array.max() > info.max:
                continue
            return array.astype(narrow_type)
        with np.errstate(all="ignore"):
            narrow = array.astype(narrow_type)
        if np.array_equal(narrow.astype(array.dtype).view(np.uint32), np.ascontiguousarray(array).view(np.uint32)):
            return narrow
    return array


def _string_items(array: np.ndarray, index: int) -> list[Any]:
    items: list[Any] = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, bytes):
            items.append({"t": "bytes", "b64": _b64(item)})
        else:
            raise ModelFormatError(f"cannot save string tensor #{index} of shape {array.shape}: expected "
                                   f"str or bytes elements, found {type(item).__name__} {item!r:.40}")
    return items


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _little_endian(array: np.ndarray) -> np.ndarray:
    order = array.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return array.astype(array.dtype.newbyteorder("<"))
    return array


def _row_blocks(array: np.ndarray) -> list[np.ndarray]:
    """``array`` as consecutive pieces of about ``WRITE_BLOCK_BYTES`` at most, in C order."""
    limit = WRITE_BLOCK_BYTES
    if array.nbytes <= limit or array.ndim == 0:
        return [array]
    if array.flags.c_contiguous:
        array = array.reshape(-1)
    rows = max(1, limit // max(array.nbytes // array.shape[0], 1))
    return [array[start:start + rows] for start in range(0, array.shape[0], rows)]


def _write_tensor(handle: BinaryIO, array: np.ndarray) -> int:
    """Write one tensor's bytes (C order, little-endian); returns the byte count."""
    if array.size == 0:
        return 0
    data = _little_endian(np.ascontiguousarray(array))  # copies only a strided or big-endian array
    handle.write(data.reshape(-1).view(np.uint8))
    return data.nbytes


# -- loading -------------------------------------------------------------------------------------
def load_model(path: str | os.PathLike) -> Model:
    """Read an ``.eim`` file; numeric weights are read-only views into a memory map."""
    source = source_path(path)
    mapped = map_file(source)
    try:
        model = _load_mapped(mapped, source)
    except RecursionError:
        close_map(mapped)
        raise ModelFormatError(f"{source}: the document nests too deeply to read") from None
    except BaseException:
        close_map(mapped)
        raise
    close_map(mapped)  # a no-op while weights view the map; it then closes when the last view dies
    return model


def close_map(mapped: mmap.mmap) -> None:
    """Close ``mapped`` unless arrays still view it (it then closes with the last of them)."""
    try:
        mapped.close()
    except BufferError:  # views exist: they own the map now
        pass


def map_file(source: str) -> mmap.mmap:
    """The file at ``source`` mapped read-only (``ModelFormatError`` if it cannot be)."""
    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise ModelFormatError(f"{source}: no such file (expected an .eim model file)") from None
    except OSError as exc:
        raise ModelFormatError(f"{source}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ModelFormatError(f"{source}: expected a regular .eim file, found "
                                   f"{'a directory' if stat.S_ISDIR(info.st_mode) else 'a special file'}")
        if info.st_size == 0:
            raise ModelFormatError(f"{source}: the file is empty (expected an .eim model, at least "
                                   f"{HEADER_SIZE} bytes)")
        try:
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ModelFormatError(f"{source}: cannot memory-map the file: {exc}") from None
        register_mapped_file(mapped, source, info)  # backends may point their engine at the file
        return mapped
    finally:
        os.close(fd)


def _load_mapped(mapped: mmap.mmap, source: str) -> Model:
    header = read_header(mapped, source)
    text = document_bytes(mapped, header, source)
    document = parse_document(text, header, source)
    keys = list(document)
    reader, document, compiled = checked_document(document, header, source)
    metadata = reader.str_map(document["metadata"], "document.metadata")
    reader.tensors = read_tensors(mapped, header, document["tensors"], reader)
    graph = reader.graph(document["graph"], "document.graph")
    try:
        graph.verify()
    except ModelValidationError as exc:
        raise ModelValidationError(f"{source}: {exc}") from None
    model = Model(graph, metadata)
    if compiled is not None:
        view = memoryview(mapped)  # the map stays open while the section's artifacts may be read
        section = read_section(compiled, reader, lambda start, nbytes: view[start:start + nbytes].toreadonly(),
                               header.data_offset, header.data_length, tensors_end(document["tensors"]),
                               len(graph.nodes))
        if bound_to_ir(section, text, keys, document, compiled):
            check_io(section, graph.name, graph.inputs, graph.outputs, source)
            model.compiled = section
        else:
            stale(section, source)
    return model


def document_digest(path: str | os.PathLike) -> str:
    """The IR digest of an ``.eim`` file's document (``compiled.ir_digest``)."""
    source = os.fspath(path)
    mapped = map_file(source)
    try:
        header = read_header(mapped, source)
        return ir_digest(read_document(mapped, header, source))
    finally:
        close_map(mapped)

