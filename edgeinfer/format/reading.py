"""Reading an ``.eim`` file: its header, its document (checked against the header's checksum,
decompressed and parsed strictly) and its tensor table. ``eim.load_model`` builds the model from
them; ``lean.read_compiled`` reads a compiled file's plan from them without the graph or the
writer's half (``eim``), so a device's cold start imports only this reading half.
See ``edgeinfer.format.eim`` for the byte layout.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from collections import namedtuple
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeinfer import limits
from edgeinfer.errors import ModelFormatError
from edgeinfer.format.document import DocumentReader, Finding, sha256
from edgeinfer.ir import dtypes
from edgeinfer.log import get_logger

if TYPE_CHECKING:
    import mmap

MAGIC = b"EIM\x00"
FORMAT_VERSION = (3, 0)
INT8_STORAGE_VERSION = (3, 1)  # written instead when a weight is stored as int8 values times a scale
NARROW_STORAGE_VERSION = (3, 2)  # written instead when a tensor is stored narrower than its dtype
COMPILED_VERSION = (3, 3)  # the first to hold a compiled section (compiled.py)
STORED_IR_VERSION = (3, 4)  # written instead: the compiled section records ``ir_sha256`` too
LEAN_VERSION = (3, 5)  # the compiled section copies the graph's inputs and outputs (``io``)
CRC32_VERSION = (3, 6)  # written instead: as 3.5, each artifact checked by its CRC-32 (not its SHA-256)
READABLE_MINOR = {1: 0, 2: 0, 3: 6}  # major version this reader reads -> the newest minor it knows
# dtype -> the narrower dtypes it may be stored as (version 3.2), narrowest first
NARROWINGS = {"float32": ("float16",), "int32": ("int8", "int16"), "int64": ("int8", "int16", "int32")}
FORMAT_NAME = "edgeinfer-model"
ALIGNMENT = 64
FLAG_COMPRESSED_DOCUMENT = 1  # version 2 and 3: the document is stored zlib-compressed
FLAG_XZ_DOCUMENT = 2  # version 3: the document is stored xz-compressed
_KNOWN_FLAGS = {1: 0, 2: FLAG_COMPRESSED_DOCUMENT, 3: FLAG_COMPRESSED_DOCUMENT | FLAG_XZ_DOCUMENT}
HEADER = struct.Struct("<4sHHIIQQQ32s")
HEADER_SIZE = HEADER.size
MAX_JSON_BYTES = limits.MAX_DOCUMENT_BYTES
MAX_RANK = limits.MAX_RANK
_TOP_FIELDS = ("format", "version", "metadata", "tensors", "graph")
_COMPILED_FIELD = "compiled"  # version 3.3, optional: compiled.py
log = get_logger("edgeinfer.format")


def align(offset: int, alignment: int = ALIGNMENT) -> int:
    return -(-offset // alignment) * alignment


def tensor_alignment(nbytes: int, itemsize: int, major: int = FORMAT_VERSION[0]) -> int:
    """Where a tensor may start: 64 for one of 64 bytes or more (and every tensor of version
    1), its element size for a smaller one (numpy reads it aligned; SIMD gains nothing)."""
    return ALIGNMENT if major < 2 or nbytes >= ALIGNMENT else max(itemsize, 1)


class Header(namedtuple("Header", ("major", "minor", "flags", "json_length", "data_offset", "data_length",
                                   "json_sha256"))):
    __slots__ = ()
    major: int
    minor: int
    flags: int
    json_length: int
    data_offset: int
    data_length: int
    json_sha256: bytes


def read_header(mapped: mmap.mmap | bytes, source: str, size: int | None = None) -> Header:
    """The validated fixed header; every field is checked against the file size (``size``, or the
    length of ``mapped`` where that is the whole file)."""
    size = len(mapped) if size is None else size
    if size < len(MAGIC) or mapped[:len(MAGIC)] != MAGIC:
        raise ModelFormatError(f"{source}: not an .eim file: expected magic {MAGIC!r}, found "
                               f"{bytes(mapped[:len(MAGIC)])!r}")
    if size < HEADER_SIZE:
        raise ModelFormatError(f"{source}: truncated header: expected at least {HEADER_SIZE} bytes, "
                               f"found {size}")
    _, major, minor, flags, reserved, json_length, data_offset, data_length, digest = \
        HEADER.unpack_from(mapped, 0)
    if major not in READABLE_MINOR:
        newer = " (written by a newer edgeinfer; upgrade to read it)" if major > FORMAT_VERSION[0] else ""
        raise ModelFormatError(f"{source}: unsupported .eim version {major}.{minor}: expected major "
                               f"version {' or '.join(map(str, sorted(READABLE_MINOR)))}{newer}")
    if flags & ~_KNOWN_FLAGS[major] or reserved:
        raise ModelFormatError(f"{source}: header flags {flags:#x}, reserved {reserved:#x}: expected flags "
                               f"within {_KNOWN_FLAGS[major]:#x} and reserved 0 for version {major}.{minor}")
    if not 0 < json_length <= min(MAX_JSON_BYTES, size - HEADER_SIZE):
        raise ModelFormatError(f"{source}: JSON length {json_length}: expected 1 to "
                               f"{min(MAX_JSON_BYTES, size - HEADER_SIZE)} bytes (file has {size} bytes); "
                               "the file is truncated or corrupt")
    expected_offset = align(HEADER_SIZE + json_length)
    if data_offset != expected_offset:
        raise ModelFormatError(f"{source}: data section offset {data_offset}: expected {expected_offset} "
                               "(JSON end rounded up to 64)")
    multiple = ALIGNMENT if major < 2 else 1
    if data_length % multiple or data_offset + data_length != size:
        raise ModelFormatError(f"{source}: data section of {data_length} bytes at {data_offset}: expected "
                               + (f"a multiple of {ALIGNMENT} " if multiple > 1 else "a length ")
                               + f"ending at the file size {size}; the file is truncated, extended or corrupt")
    return Header(major, minor, flags, json_length, data_offset, data_length, digest)


def read_document(mapped: mmap.mmap | bytes, header: Header, source: str) -> dict[str, Any]:
    """The JSON document, checked against the header's checksum and parsed strictly."""
    return parse_document(document_bytes(mapped, header, source), header, source)


def parse_document(raw: bytes, header: Header, source: str) -> dict[str, Any]:
    """The document object of the JSON text ``raw`` (from ``document_bytes``), parsed strictly."""
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant,
                              object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as exc:
        offset = exc.start if header.flags & FLAG_COMPRESSED_DOCUMENT else HEADER_SIZE + exc.start
        where = "decompressed document byte" if header.flags & FLAG_COMPRESSED_DOCUMENT else "byte"
        raise ModelFormatError(f"{source}: JSON document: expected UTF-8, found an invalid byte at "
                               f"{where} {offset}") from None
    except ValueError as exc:  # JSONDecodeError, the checks below, int too long to convert
        raise ModelFormatError(f"{source}: JSON document: {exc}") from None
    if not isinstance(document, dict):
        raise ModelFormatError(f"{source}: JSON document: expected an object, found "
                               f"{type(document).__name__}")
    return document


def document_bytes(mapped: mmap.mmap | bytes, header: Header, source: str) -> bytes:
    """The document's JSON text, checked against the header's checksum and decompressed."""
    return stored_document(bytes(mapped[HEADER_SIZE:HEADER_SIZE + header.json_length]), header, source)


def stored_document(raw: bytes, header: Header, source: str) -> bytes:
    """The JSON text of the document stored as ``raw`` (the header's ``json_length`` bytes after
    it), checked against the header's checksum and decompressed."""
    digest = sha256(raw).digest()
    if digest != header.json_sha256:
        raise ModelFormatError(f"{source}: JSON checksum mismatch: expected SHA-256 "
                               f"{header.json_sha256.hex()[:16]}..., found {digest.hex()[:16]}...; "
                               "the file is corrupt")
    if header.flags & FLAG_XZ_DOCUMENT:
        if header.flags & FLAG_COMPRESSED_DOCUMENT:
            raise ModelFormatError(f"{source}: header flags {header.flags:#x}: expected one compression "
                                   "of the document (zlib or xz), found both")
        return _decompress_xz(raw, source)
    return _decompress(raw, source) if header.flags & FLAG_COMPRESSED_DOCUMENT else raw


def _decompress_xz(stored: bytes, source: str) -> bytes:
    """The xz-compressed document's JSON bytes; at most MAX_JSON_BYTES are ever inflated."""
    import lzma  # a compiled file's document is zlib's: a device's load imports no lzma

    inflater = lzma.LZMADecompressor(lzma.FORMAT_XZ)
    return _inflate(inflater, stored, source, "xz", lzma.LZMAError,
                    lambda: not inflater.eof and not inflater.needs_input)


def _decompress(stored: bytes, source: str) -> bytes:
    """The zlib-compressed document's JSON bytes; at most MAX_JSON_BYTES are ever inflated."""
    inflater = zlib.decompressobj()
    return _inflate(inflater, stored, source, "zlib", zlib.error, lambda: bool(inflater.unconsumed_tail))


def _inflate(inflater: Any, stored: bytes, source: str, kind: str, error: type[Exception], more_left) -> bytes:
    """``stored`` through ``inflater`` (one complete stream, at most MAX_JSON_BYTES out)."""
    try:
        raw = inflater.decompress(stored, MAX_JSON_BYTES)
    except error as exc:
        raise ModelFormatError(f"{source}: compressed document: expected a{'n' if kind == 'xz' else ''} {kind} "
                               f"stream, found one that fails to inflate ({exc}); the file is corrupt") from None
    if more_left():
        raise ModelFormatError(f"{source}: compressed document: expected at most {MAX_JSON_BYTES} bytes "
                               "once inflated, found more")
    if not inflater.eof or inflater.unused_data:
        raise ModelFormatError(f"{source}: compressed document: expected one complete {kind} stream filling "
                               f"the {len(stored)} stored bytes, found "
                               + ("a truncated stream" if not inflater.eof else
                                  f"{len(inflater.unused_data)} bytes after its end"))
    return raw


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"expected finite numbers, found {name} (non-finite values are tagged objects)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"expected unique keys in every object, found {duplicate!r} twice")
    return obj


def checked_document(document: Any, header: Header, source: str) -> tuple[DocumentReader, dict[str, Any], Any]:
    """(its reader, the document's checked top level, its compiled section as stored or None)."""
    reader = DocumentReader([], source, strict=header.minor <= READABLE_MINOR[header.major])
    compiled = None
    if isinstance(document, dict) and (header.major, header.minor) >= COMPILED_VERSION:
        compiled = document.pop(_COMPILED_FIELD, None)
    document = reader.fields(document, "document", _TOP_FIELDS)
    if document["format"] != FORMAT_NAME:
        raise reader.fail("document.format", repr(FORMAT_NAME), document["format"])
    if document["version"] != [header.major, header.minor]:
        raise reader.fail("document.version", f"[{header.major}, {header.minor}] as in the header",
                          document["version"])
    return reader, document, compiled


def source_path(path: Any) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise ModelFormatError(f"cannot load {path!r}: expected a file path (str or os.PathLike), found "
                               f"{type(path).__name__}") from None


def tensors_end(entries: list[dict[str, Any]]) -> int:
    """Where the tensors of a checked tensor table end in the data section."""
    return max((entry["offset"] + entry["nbytes"] for entry in entries if "offset" in entry), default=0)


def stale(section: Any, source: str) -> None:
    log.warning("%s: the compiled section was made from another IR (digest %s...); it is ignored and the model "
                "compiles from its IR", source, section.digest[:12])


class _Span(namedtuple("_Span", ("index", "dtype", "shape", "offset", "nbytes", "widen"), defaults=(None,))):
    __slots__ = ()
    index: int
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    widen: np.dtype | None  # the entry's dtype, when it is stored as the narrower ``dtype``


def read_tensors(mapped: mmap.mmap | None, header: Header, table: Any, reader: DocumentReader, *,
                 views: bool = True) -> list[np.ndarray]:
    """Validate the whole tensor table first, then create the views (no copies); ``views=False``:
    the table alone (what needs the bytes, a product's operands and a bool's values, is checked
    when they are mapped)."""
    entries = reader.array(table, "document.tensors")
    spans: list[_Span] = []
    strings: dict[int, np.ndarray] = {}
    products: dict[int, tuple[tuple[int, ...], list[int]]] = {}
    for index, entry in enumerate(entries):
        where = f"document.tensors[{index}]"
        if not isinstance(entry, dict):
            raise reader.fail(where, "a tensor entry object", entry)
        name = entry.get("dtype")
        if name == "str":
            strings[index] = _string_tensor(reader.fields(entry, where, ("dtype", "shape", "strings")),
                                            where, reader)
            continue
        if "product" in entry and header.major >= 3:
            entry = reader.fields(entry, where, ("dtype", "shape", "product"))
            if name != "float32":
                raise reader.fail(f"{where}.dtype", "float32 (a product entry)", name)
            pair = reader.array(entry["product"], f"{where}.product")
            if len(pair) != 2:
                raise reader.fail(f"{where}.product", "two tensor indices", Finding(f"{len(pair)} items"))
            operands = [reader.integer(i, f"{where}.product[{k}]", maximum=len(entries) - 1) for k, i in enumerate(pair)]
            products[index] = (_tensor_shape(entry["shape"], f"{where}.shape", reader), operands)
            continue
        narrow = "stored" in entry and (header.major, header.minor) >= NARROW_STORAGE_VERSION
        entry = reader.fields(entry, where, ("dtype", "shape", "offset", "nbytes") + (("stored",) if narrow else ()))
        if name not in dtypes.NUMERIC_DTYPES:
            raise reader.fail(f"{where}.dtype", f"one of {', '.join(dtypes.NUMERIC_DTYPES)} or str", name)
        dtype = widen = _file_dtype(name)
        if narrow:
            allowed = NARROWINGS.get(name, ())
            if entry["stored"] not in allowed:
                raise reader.fail(f"{where}.stored", f"one of {', '.join(allowed)} (a {name} tensor stored narrow)"
                                  if allowed else f"no narrower storage: a {name} tensor is stored as it is",
                                  entry["stored"])
            dtype = _file_dtype(entry["stored"])
        shape = _tensor_shape(entry["shape"], f"{where}.shape", reader)
        offset = reader.integer(entry["offset"], f"{where}.offset", maximum=header.data_length)
        nbytes = reader.integer(entry["nbytes"], f"{where}.nbytes", maximum=header.data_length)
        expected = _product(shape) * dtype.itemsize  # Python ints: no overflow
        if nbytes != expected:
            raise reader.fail(f"{where}.nbytes", f"{expected} (shape {list(shape)} x {dtype.itemsize} bytes)",
                              nbytes)
        alignment = tensor_alignment(nbytes, dtype.itemsize, header.major)
        if offset % alignment:
            raise reader.fail(f"{where}.offset", f"a multiple of {alignment} ({nbytes}-byte {name} tensor, "
                              f"version {header.major})", offset)
        if offset + nbytes > header.data_length:
            raise reader.fail(where, f"bytes within the {header.data_length}-byte data section",
                              Finding(f"{nbytes} bytes at offset {offset}"))
        spans.append(_Span(index, dtype, shape, offset, nbytes, widen if narrow else None))
    _check_disjoint(spans, reader)
    if not views:
        return []
    tensors: list[np.ndarray | None] = [None] * len(entries)
    for index, array in strings.items():
        tensors[index] = array
    for span in spans:
        tensors[span.index] = _view(mapped, header, span, reader)
        if span.widen is not None:
            tensors[span.index] = tensors[span.index].astype(span.widen)
            tensors[span.index].flags.writeable = False
    for index, (shape, operands) in products.items():
        tensors[index] = _product_tensor(index, shape, [tensors[i] for i in operands], reader)
    return tensors  # type: ignore[return-value]


def _product_tensor(index: int, shape: tuple[int, ...], operands: list[np.ndarray | None],
                    reader: DocumentReader) -> np.ndarray:
    """Product entry ``index``: the element-wise product of two stored float32 tensors, or of
    int8 values and their float32 scale (an int8-stored weight, version 3.1)."""
    where = f"document.tensors[{index}].product"
    allowed = ((np.float32, np.int8), (np.float32,))
    for operand, kinds in zip(operands, allowed, strict=True):
        if operand is None or operand.dtype.type not in kinds:
            raise reader.fail(where, "indices of stored tensors (not products, not strings): float32, or int8 "
                              "values then their float32 scale",
                              Finding("another product" if operand is None else f"a {operand.dtype} tensor"))
    try:
        product_shape = np.broadcast_shapes(operands[0].shape, operands[1].shape)
    except ValueError:
        product_shape = None
    if product_shape != shape:
        raise reader.fail(where, f"operands broadcasting to the entry's shape {list(shape)}",
                          Finding(f"shapes {list(operands[0].shape)} and {list(operands[1].shape)}"))
    with np.errstate(all="ignore"):
        array = np.multiply(operands[0], operands[1], dtype=np.float32)
    array.flags.writeable = False
    return array


def _file_dtype(name: str) -> np.dtype:
    dtype = dtypes.numpy_dtype(name)
    if dtype.itemsize > 1 and sys.byteorder == "big":
        dtype = dtype.newbyteorder("<")
    return dtype


def _tensor_shape(obj: Any, where: str, reader: DocumentReader) -> tuple[int, ...]:
    dims = reader.array(obj, where)
    if len(dims) > MAX_RANK:
        raise reader.fail(where, f"at most {MAX_RANK} dims", Finding(f"{len(dims)} dims"))
    return tuple(reader.integer(dim, f"{where}[{axis}]") for axis, dim in enumerate(dims))


def _product(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _check_disjoint(spans: list[_Span], reader: DocumentReader) -> None:
    previous: _Span | None = None
    for span in sorted((s for s in spans if s.nbytes), key=lambda s: s.offset):
        if previous is not None and span.offset < previous.offset + previous.nbytes:
            raise reader.fail(f"document.tensors[{span.index}].offset",
                              f"bytes not shared with tensor {previous.index} "
                              f"(which ends at {previous.offset + previous.nbytes})", span.offset)
        previous = span


def _view(mapped: mmap.mmap, header: Header, span: _Span, reader: DocumentReader) -> np.ndarray:
    if span.nbytes == 0:
        array = np.empty(span.shape, dtype=span.dtype)
        array.flags.writeable = False
        return array
    start = header.data_offset + span.offset
    array = np.frombuffer(mapped, dtype=span.dtype, count=span.nbytes // span.dtype.itemsize, offset=start)
    if span.dtype.kind == "b":  # any byte but 0 and 1 would be an invalid numpy bool
        raw = np.frombuffer(mapped, dtype=np.uint8, count=span.nbytes, offset=start)
        if raw.max() > 1:
            raise reader.fail(f"document.tensors[{span.index}]", "bool bytes of 0 or 1",
                              Finding(f"byte {int(raw.max())}"))
    return array.reshape(span.shape)


def _string_tensor(entry: dict[str, Any], where: str, reader: DocumentReader) -> np.ndarray:
    shape = _tensor_shape(entry["shape"], f"{where}.shape", reader)
    items = reader.array(entry["strings"], f"{where}.strings")
    if len(items) != _product(shape):
        raise reader.fail(f"{where}.strings", f"{_product(shape)} strings (shape {list(shape)})",
                          Finding(f"{len(items)} strings"))
    decoded: list[str | bytes] = []
    for i, item in enumerate(items):
        at = f"{where}.strings[{i}]"
        if isinstance(item, str):
            decoded.append(item)
            continue
        item = reader.fields(item, at, ("t", "b64"))
        if item["t"] != "bytes":
            raise reader.fail(f"{at}.t", "'bytes'", item["t"])
        decoded.append(reader.base64_bytes(item["b64"], f"{at}.b64"))
    array = np.empty(len(decoded), dtype=object)
    array[:] = decoded
    array = array.reshape(shape)
    array.flags.writeable = False
    return array
